//! Where a ring lives: its control block and its slot array.
//!
//! A `RingMem` is a cheap, clonable handle (both the protocol end and its
//! transport hold one) over memory that either a shared mapping (shm), a
//! heap allocation (in-process tests, benchmarks) or, under loom, loom-aware
//! cells provide. Every access to slot bytes goes through the bounds-checked
//! methods here; all `unsafe` for ring memory is confined to this module and
//! `transport::shm`.

use crate::config::RingConfig;
use crate::error::{ConfigError, RingError};
use crate::layout::RingControl;
use std::sync::Arc;

#[cfg(loom)]
pub use modeled::SlotMemory;
#[cfg(not(loom))]
pub use plain::SlotMemory;

/// Handle to one ring direction's memory.
#[derive(Clone)]
pub struct RingMem {
    inner: Arc<Inner>,
}

struct Inner {
    #[cfg(not(loom))]
    ctrl: std::ptr::NonNull<RingControl>,
    #[cfg(loom)]
    ctrl: RingControl,
    slots: SlotMemory,
    /// Keeps the backing memory (mapping or allocation) alive.
    _owner: Box<dyn Send + Sync>,
}

// SAFETY: the control block holds only atomics and the slot memory is only
// touched through bounds-checked copies whose ordering the protocol
// establishes with acquire/release on the control block; the backing owner
// is Send + Sync.
unsafe impl Send for Inner {}
// SAFETY: `&Inner` gives only atomic loads and stores on the control
// block and the bounds-checked slot copies, which are sound from any
// number of threads at once (the protocol orders who writes which byte);
// `ctrl` and the slots point into memory `_owner` keeps alive.
unsafe impl Sync for Inner {}

impl RingMem {
    /// A ring over raw memory the caller keeps alive through `owner`.
    ///
    /// # Safety
    /// `ctrl` must point to `CONTROL_BYTES` of 64-byte-aligned memory that is
    /// zeroed or holds a valid control block, and `slots` to `slots_len`
    /// bytes, both valid for reads and writes for as long as `owner` lives,
    /// and not accessed other than through ring handles (in this or another
    /// process).
    #[cfg(not(loom))]
    pub(crate) unsafe fn from_raw(
        ctrl: *mut u8,
        slots: *mut u8,
        slots_len: usize,
        owner: Box<dyn Send + Sync>,
    ) -> RingMem {
        RingMem {
            inner: Arc::new(Inner {
                ctrl: std::ptr::NonNull::new(ctrl.cast()).expect("null ring control block"),
                slots: SlotMemory::from_raw(slots, slots_len),
                _owner: owner,
            }),
        }
    }

    /// A ring in private heap memory, for two threads of one process.
    pub fn heap(cfg: &RingConfig) -> RingMem {
        #[cfg(not(loom))]
        {
            let region =
                plain::HeapRegion::zeroed(crate::layout::CONTROL_BYTES + cfg.ring_bytes() as usize);
            let base = region.ptr();
            // SAFETY: the region is zeroed, page-aligned, CONTROL_BYTES +
            // ring bytes long, and owned by the handle we return.
            unsafe {
                RingMem::from_raw(
                    base,
                    base.add(crate::layout::CONTROL_BYTES),
                    cfg.ring_bytes() as usize,
                    Box::new(region),
                )
            }
        }
        #[cfg(loom)]
        {
            RingMem {
                inner: Arc::new(Inner {
                    ctrl: RingControl::new(),
                    slots: SlotMemory::new(cfg.slots as usize, cfg.slot_size as usize),
                    _owner: Box::new(()),
                }),
            }
        }
    }

    pub fn ctrl(&self) -> &RingControl {
        #[cfg(not(loom))]
        {
            // SAFETY: from_raw's contract: valid, aligned, alive while self is.
            unsafe { self.inner.ctrl.as_ref() }
        }
        #[cfg(loom)]
        {
            &self.inner.ctrl
        }
    }

    pub fn slots(&self) -> &SlotMemory {
        &self.inner.slots
    }

    /// Checks `cfg` (`RingConfig::validate`) and that this memory holds
    /// exactly its slots: what a ring end needs before it touches them.
    pub(crate) fn check(&self, cfg: &RingConfig) -> Result<(), RingError> {
        cfg.validate()?;
        let have = self.slots().len();
        if have as u64 != cfg.ring_bytes() {
            return Err(ConfigError::Memory {
                have,
                want: cfg.ring_bytes(),
            }
            .into());
        }
        Ok(())
    }
}

#[cfg(not(loom))]
mod plain {
    use std::alloc::{alloc_zeroed, dealloc, Layout};
    use std::ptr::NonNull;

    /// Slot bytes at a fixed address. Accesses are bounds-checked against
    /// the length; a violation is a bug in this crate (peer-supplied values
    /// are validated before they become offsets), so it panics.
    pub struct SlotMemory {
        base: NonNull<u8>,
        len: usize,
    }

    impl SlotMemory {
        pub(super) fn from_raw(base: *mut u8, len: usize) -> Self {
            SlotMemory {
                base: NonNull::new(base).expect("null slot memory"),
                len,
            }
        }

        pub fn len(&self) -> usize {
            self.len
        }

        pub fn is_empty(&self) -> bool {
            self.len == 0
        }

        #[inline]
        fn check(&self, off: usize, n: usize) {
            assert!(
                off <= self.len && n <= self.len - off,
                "slot access out of bounds"
            );
        }

        /// Copies `src` into the slots at byte offset `off`.
        #[inline]
        pub fn write(&self, off: usize, src: &[u8]) {
            self.check(off, src.len());
            // SAFETY: bounds checked above; the protocol gives this end
            // exclusive use of the range (the receiver does not read past
            // the published tail).
            unsafe {
                std::ptr::copy_nonoverlapping(src.as_ptr(), self.base.as_ptr().add(off), src.len())
            }
        }

        /// Copies slot bytes at `off` into `dst`.
        #[inline]
        pub fn read(&self, off: usize, dst: &mut [u8]) {
            self.check(off, dst.len());
            // SAFETY: bounds checked above. A hostile peer may change these
            // bytes concurrently; that only changes the data it sends us,
            // never which memory we touch.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    self.base.as_ptr().add(off),
                    dst.as_mut_ptr(),
                    dst.len(),
                )
            }
        }

        /// Reads one 8-byte word exactly once (volatile), so that a header
        /// is validated and used as the same value even if the peer
        /// rewrites it meanwhile.
        #[inline]
        pub fn read_word(&self, off: usize) -> u64 {
            self.check(off, 8);
            assert!(off.is_multiple_of(8), "unaligned slot word");
            // SAFETY: `check` keeps `off..off + 8` inside the slots, and
            // `off` is a multiple of 8 on a 64-aligned base, so the read is
            // in bounds and aligned for a u64; any bit pattern is a u64.
            unsafe { std::ptr::read_volatile(self.base.as_ptr().add(off).cast::<u64>()) }
        }

        #[inline]
        pub fn write_word(&self, off: usize, value: u64) {
            self.check(off, 8);
            assert!(off.is_multiple_of(8), "unaligned slot word");
            // SAFETY: in bounds and aligned, as for `read_word`; the
            // protocol gives this end the slot it writes (the receiver
            // places only headers it owns, the sender only its own slots).
            unsafe { std::ptr::write_volatile(self.base.as_ptr().add(off).cast::<u64>(), value) }
        }
    }

    /// A zeroed, page-aligned heap allocation.
    pub(super) struct HeapRegion {
        ptr: NonNull<u8>,
        layout: Layout,
    }

    // SAFETY: the region owns its allocation alone (no aliasing handle
    // escapes but the raw pointer `ptr()` hands to `RingMem::from_raw`,
    // whose accesses carry their own argument); freeing it from another
    // thread is fine for the global allocator.
    unsafe impl Send for HeapRegion {}
    // SAFETY: `&HeapRegion` only reads `ptr` and `layout`, both immutable.
    unsafe impl Sync for HeapRegion {}

    impl HeapRegion {
        pub(super) fn zeroed(len: usize) -> Self {
            let layout = Layout::from_size_align(len.max(1), 4096).expect("ring layout");
            // SAFETY: `layout` has a non-zero size (`len.max(1)`), as
            // `alloc_zeroed` requires; a null result is handled below.
            let ptr = unsafe { alloc_zeroed(layout) };
            let ptr = NonNull::new(ptr).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
            HeapRegion { ptr, layout }
        }

        pub(super) fn ptr(&self) -> *mut u8 {
            self.ptr.as_ptr()
        }
    }

    impl Drop for HeapRegion {
        fn drop(&mut self) {
            // SAFETY: `ptr` came from `alloc_zeroed` with this very
            // `layout` (`zeroed`) and is freed only here, once.
            unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
        }
    }
}

#[cfg(loom)]
mod modeled {
    use loom::cell::UnsafeCell;

    /// Under loom every slot is a loom cell, so the model checker reports
    /// any slot read that is not ordered after the write it observes.
    pub struct SlotMemory {
        slot_size: usize,
        slots: Vec<UnsafeCell<Vec<u8>>>,
    }

    impl SlotMemory {
        pub(super) fn new(n: usize, slot_size: usize) -> Self {
            SlotMemory {
                slot_size,
                slots: (0..n)
                    .map(|_| UnsafeCell::new(vec![0; slot_size]))
                    .collect(),
            }
        }

        pub fn len(&self) -> usize {
            self.slots.len() * self.slot_size
        }

        pub fn is_empty(&self) -> bool {
            self.slots.is_empty()
        }

        fn each(
            &self,
            mut off: usize,
            mut n: usize,
            mut f: impl FnMut(&UnsafeCell<Vec<u8>>, usize, usize),
        ) {
            assert!(off + n <= self.len(), "slot access out of bounds");
            while n > 0 {
                let (slot, within) = (off / self.slot_size, off % self.slot_size);
                let take = n.min(self.slot_size - within);
                f(&self.slots[slot], within, take);
                off += take;
                n -= take;
            }
        }

        pub fn write(&self, off: usize, src: &[u8]) {
            let mut done = 0;
            self.each(off, src.len(), |cell, within, take| {
                cell.with_mut(|v| {
                    // SAFETY: `v` points to this slot's Vec for the
                    // closure's length; loom's cell reports any access to
                    // it that is not exclusive, which fails the model.
                    unsafe {
                        (&mut *v)[within..within + take].copy_from_slice(&src[done..done + take])
                    }
                });
                done += take;
            });
        }

        pub fn read(&self, off: usize, dst: &mut [u8]) {
            let mut done = 0;
            self.each(off, dst.len(), |cell, within, take| {
                cell.with(|v| {
                    // SAFETY: `v` points to this slot's Vec for the
                    // closure's length; loom's cell reports a read that
                    // races a write, which fails the model.
                    dst[done..done + take].copy_from_slice(unsafe { &(&*v)[within..within + take] })
                });
                done += take;
            });
        }

        pub fn read_word(&self, off: usize) -> u64 {
            let mut b = [0u8; 8];
            self.read(off, &mut b);
            u64::from_le_bytes(b)
        }

        pub fn write_word(&self, off: usize, value: u64) {
            self.write(off, &value.to_le_bytes());
        }
    }
}
