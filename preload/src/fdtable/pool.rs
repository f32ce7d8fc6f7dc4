//! Type-stable storage for `FdState` objects.
//!
//! Objects are carved out of anonymous mmap chunks and recycled through a
//! lock-free free list, never returned to the system. Because the memory of
//! an `FdState` stays an `FdState` forever, a hook that loaded a table slot
//! just before another thread closed that fd can still safely look at the
//! object's atomics (its reference count, its `conn` pointer) and find out
//! that it lost the race (fdtable/mod.rs, `get`). This is the
//! SLAB_TYPESAFE_BY_RCU idea without the RCU.
//!
//! No lock is involved, so a fork in the middle of an allocation on another
//! thread cannot leave the child with a held lock; at worst the child leaks
//! the chunk being carved.

use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};

use super::state::FdState;

/// Objects per mmap chunk.
const CHUNK: usize = 64;
/// Pointer bits of the free-list head; the rest is an ABA tag. User-space
/// addresses on x86-64 and AArch64 Linux fit in 48 bits unless a program
/// asks mmap for more with an explicit hint, which we never do.
const PTR_BITS: u32 = 48;
const PTR_MASK: u64 = (1 << PTR_BITS) - 1;

/// Free list head: tag << 48 | pointer.
static FREE: AtomicU64 = AtomicU64::new(0);

/// Takes a free object (its `refs` is 0) or carves a new chunk. None only if
/// the system is out of memory.
pub fn alloc() -> Option<&'static FdState> {
    loop {
        let head = FREE.load(Ordering::Acquire);
        let p = (head & PTR_MASK) as *const FdState;
        if p.is_null() {
            return carve();
        }
        // SAFETY: every pointer ever pushed points into a chunk that is never
        // unmapped and holds an initialised FdState, so reading its link is
        // fine even if another thread popped it meanwhile (the CAS below then
        // fails thanks to the tag).
        let next = unsafe { &*p }.next_free() as u64;
        let new = (head >> PTR_BITS).wrapping_add(1) << PTR_BITS | next;
        if FREE
            .compare_exchange_weak(head, new, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            // SAFETY: as above; we now own the object.
            return Some(unsafe { &*p });
        }
    }
}

/// Returns an object whose `refs` dropped to 0 and whose contents were reset.
pub fn free(obj: &'static FdState) {
    let p = obj as *const FdState as u64;
    loop {
        let head = FREE.load(Ordering::Acquire);
        obj.set_next_free((head & PTR_MASK) as *const FdState);
        let new = (head >> PTR_BITS).wrapping_add(1) << PTR_BITS | p;
        if FREE
            .compare_exchange_weak(head, new, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            return;
        }
    }
}

#[cold]
fn carve() -> Option<&'static FdState> {
    let bytes = CHUNK * std::mem::size_of::<FdState>();
    // SAFETY: anonymous private mapping; no file, no fixed address.
    let base = unsafe {
        libc::mmap(
            ptr::null_mut(),
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return None;
    }
    let base = base.cast::<FdState>();
    if (base as u64 + bytes as u64) > PTR_MASK {
        // Cannot be tagged; give it back rather than corrupt the list.
        // SAFETY: unmapping exactly what we just mapped.
        unsafe { libc::munmap(base.cast(), bytes) };
        return None;
    }
    for i in 0..CHUNK {
        // SAFETY: i < CHUNK, inside the fresh mapping, suitably aligned
        // (mmap returns page-aligned memory and size_of is a multiple of
        // the alignment).
        unsafe { base.add(i).write(FdState::new_free()) };
    }
    for i in 1..CHUNK {
        // SAFETY: objects 1.. are initialised and never unmapped.
        free(unsafe { &*base.add(i) });
    }
    // SAFETY: object 0 is initialised, never unmapped, and ours.
    Some(unsafe { &*base })
}
