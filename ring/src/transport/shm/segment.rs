//! Shared-memory segments: a sealed memfd holding a header page and one or
//! more rings, created by one process and attached by another from the fd
//! (passed over a unix socket).
//!
//! Layout: `[header page][ring 0: control page, slots][ring 1: ...]...`,
//! every part page-aligned. The memfd is sealed against shrinking and
//! growing before anyone else sees it: a peer that could truncate it would
//! turn our next access into SIGBUS.

#![cfg(not(loom))]

use crate::config::RingConfig;
use crate::error::{ConfigError, Corruption, RingError};
use crate::layout::CONTROL_BYTES;
use crate::memory::RingMem;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering as AtomicOrdering};
use std::sync::Arc;

pub const SEGMENT_MAGIC: u64 = u64::from_le_bytes(*b"RINGSOCK");
pub const SEGMENT_VERSION: u32 = 1;
const PAGE: usize = 4096;
const HUGE_PAGE: usize = 2 << 20;
const MAX_RINGS: u32 = 8;
const HUGE_RETRY: u64 = 256;
static HUGE_FAILED: AtomicBool = AtomicBool::new(false);
static CREATED: AtomicU64 = AtomicU64::new(0);

/// The first bytes of a segment. `user` words belong to the layer above
/// (the shim keeps its handshake state there, and what the processes
/// that share one side of the connection coordinate through).
#[repr(C)]
pub struct SegmentHeader {
    pub magic: u64,
    pub version: u32,
    pub rings: u32,
    pub slots: u32,
    pub slot_size: u32,
    pub huge: u32,
    _pad: u32,
    pub user: [AtomicU64; 32],
}
const _: () = assert!(std::mem::size_of::<SegmentHeader>() <= PAGE);

/// A mapped segment.
pub struct Segment {
    map: Arc<Mapping>,
    /// None after `close_fd`: the mapping outlives the descriptor.
    fd: Option<OwnedFd>,
    rings: u32,
    slots: u32,
    slot_size: u32,
}

struct Mapping {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain shared memory; all access goes through
// RingMem's atomics and bounds-checked copies.
unsafe impl Send for Mapping {}
// SAFETY: `&Mapping` only reads `ptr` and `len`, which never change; what
// the pointer reaches is accessed through RingMem (atomics, bounds-checked
// copies) and the header's atomic user words.
unsafe impl Sync for Mapping {}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: we mapped exactly this range and nobody uses it any more
        // (every RingMem holds an Arc to us).
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

fn ring_stride(slots: u32, slot_size: u32) -> usize {
    CONTROL_BYTES + (slots as usize * slot_size as usize).next_multiple_of(PAGE)
}

/// Byte offset of ring `i`'s control block in a segment of this geometry
/// (for readers that map the segment themselves, like `ringsock-ctl`).
/// None if a hostile geometry makes it overflow.
pub fn control_offset(i: u32, slots: u32, slot_size: u32) -> Option<usize> {
    let data = (slots as usize)
        .checked_mul(slot_size as usize)?
        .checked_next_multiple_of(PAGE)?;
    let stride = CONTROL_BYTES.checked_add(data)?;
    PAGE.checked_add((i as usize).checked_mul(stride)?)
}

fn segment_len(rings: u32, slots: u32, slot_size: u32) -> usize {
    PAGE + rings as usize * ring_stride(slots, slot_size)
}

fn sys(ret: libc::c_long) -> Result<libc::c_long, RingError> {
    if ret < 0 {
        Err(RingError::last_os())
    } else {
        Ok(ret)
    }
}

impl Segment {
    /// A new segment with `rings` rings of `cfg`'s geometry, on huge pages
    /// when the system has them free, on 4 KiB pages otherwise.
    pub fn create(cfg: &RingConfig, rings: u32) -> Result<Segment, RingError> {
        cfg.validate()?;
        if rings == 0 || rings > MAX_RINGS {
            return Err(ConfigError::SegmentRings {
                rings,
                max: MAX_RINGS,
            }
            .into());
        }
        let len = segment_len(rings, cfg.slots, cfg.slot_size);
        // A failed huge-page attempt costs four system calls: after one,
        // only every HUGE_RETRY-th segment tries again (pages may be freed).
        let n = CREATED.fetch_add(1, AtomicOrdering::Relaxed);
        let try_huge = !HUGE_FAILED.load(AtomicOrdering::Relaxed) || n.is_multiple_of(HUGE_RETRY);
        let huge_attempt = if try_huge {
            let r = Self::make(len.next_multiple_of(HUGE_PAGE), true);
            HUGE_FAILED.store(r.is_err(), AtomicOrdering::Relaxed);
            r.ok()
        } else {
            None
        };
        let (fd, map, huge) = match huge_attempt {
            Some((fd, map)) => (fd, map, true),
            None => {
                let (fd, map) = Self::make(len, false)?;
                (fd, map, false)
            }
        };
        let seg = Segment {
            map: Arc::new(map),
            fd: Some(fd),
            rings,
            slots: cfg.slots,
            slot_size: cfg.slot_size,
        };
        // SAFETY: the mapping is at least a page long, page-aligned, zeroed,
        // and nobody else has the fd yet.
        let h = unsafe { &mut *seg.map.ptr.cast::<SegmentHeader>() };
        h.version = SEGMENT_VERSION;
        h.rings = rings;
        h.slots = cfg.slots;
        h.slot_size = cfg.slot_size;
        h.huge = huge as u32;
        h.magic = SEGMENT_MAGIC;
        Ok(seg)
    }

    fn make(len: usize, huge: bool) -> Result<(OwnedFd, Mapping), RingError> {
        let flags =
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING | if huge { libc::MFD_HUGETLB } else { 0 };
        // SAFETY: the name is a NUL-terminated literal the kernel only
        // reads; the result is checked by `sys`.
        let raw =
            sys(unsafe { libc::syscall(libc::SYS_memfd_create, c"ringsock".as_ptr(), flags) })?;
        // SAFETY: `raw` is the descriptor memfd_create just returned
        // (non-negative, `sys`), owned by nothing else yet.
        let fd = unsafe { OwnedFd::from_raw_fd(raw as i32) };
        // SAFETY: ftruncate of a descriptor we own, integer arguments.
        sys(unsafe { libc::syscall(libc::SYS_ftruncate, fd.as_raw_fd(), len as libc::off_t) })?;
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        // SAFETY: F_ADD_SEALS on a descriptor we own, integer arguments.
        sys(unsafe { libc::syscall(libc::SYS_fcntl, fd.as_raw_fd(), libc::F_ADD_SEALS, seals) })?;
        let map = Self::map(&fd, len)?;
        if huge {
            // Touch the first page: a hugetlb mapping without reserved pages
            // can still fail at fault time on some kernels; fail here instead.
            // SAFETY: `map` is a fresh writable mapping of at least one
            // (huge) page that nothing else references yet; its first
            // byte is in bounds.
            unsafe { std::ptr::write_volatile(map.ptr, 0) };
        }
        Ok((fd, map))
    }

    fn map(fd: &OwnedFd, len: usize) -> Result<Mapping, RingError> {
        // SAFETY: a shared mapping of `len` bytes of a descriptor we hold,
        // with no address hint, so no existing memory is replaced;
        // MAP_FAILED is handled below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(RingError::last_os());
        }
        Ok(Mapping {
            ptr: ptr.cast(),
            len,
        })
    }

    /// Maps a segment another process created. Nothing in it is trusted:
    /// the fd must be sealed against shrinking, and the header must describe
    /// a valid geometry that fits in the file.
    pub fn attach(fd: OwnedFd) -> Result<Segment, RingError> {
        let bad = |what| Err(RingError::Corrupt(Corruption::Segment(what)));
        // SAFETY: F_GET_SEALS on a descriptor we own, integer arguments.
        let seals = unsafe { libc::syscall(libc::SYS_fcntl, fd.as_raw_fd(), libc::F_GET_SEALS) };
        if seals < 0 || seals as i32 & libc::F_SEAL_SHRINK == 0 {
            return bad("not a memfd sealed against shrinking");
        }
        // SAFETY: `stat` is plain integers, for which all-zero is valid.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fstat of a descriptor we own writes one `struct stat`
        // into `st`, a live local of that type.
        sys(unsafe { libc::syscall(libc::SYS_fstat, fd.as_raw_fd(), &mut st as *mut libc::stat) })?;
        let file_len = st.st_size as usize;
        if file_len < PAGE {
            return bad("shorter than its header");
        }
        let head_map = Self::map(&fd, PAGE)?;
        // SAFETY: a page-long mapping; plain integer fields, read by value.
        let h = unsafe { &*head_map.ptr.cast::<SegmentHeader>() };
        let (magic, version, rings, slots, slot_size) =
            (h.magic, h.version, h.rings, h.slots, h.slot_size);
        drop(head_map);
        if magic != SEGMENT_MAGIC || version != SEGMENT_VERSION {
            return bad("wrong magic or version");
        }
        if rings == 0 || rings > MAX_RINGS {
            return bad("ring count out of range");
        }
        let cfg = RingConfig {
            slots,
            slot_size,
            ..RingConfig::default()
        };
        let geometry_ok = RingConfig {
            alpha: 1,
            beta: 1,
            gamma: 1,
            max_record_slots: 1,
            ..cfg
        }
        .validate();
        if geometry_ok.is_err() {
            return bad("ring geometry out of range");
        }
        let len = segment_len(rings, slots, slot_size);
        if len > file_len {
            return bad("geometry larger than the file");
        }
        let map = Self::map(&fd, len)?;
        Ok(Segment {
            map: Arc::new(map),
            fd: Some(fd),
            rings,
            slots,
            slot_size,
        })
    }

    /// Ring `i` of the segment.
    pub fn ring(&self, i: u32) -> RingMem {
        assert!(i < self.rings, "ring index out of range");
        let off = PAGE + i as usize * ring_stride(self.slots, self.slot_size);
        // SAFETY: off + CONTROL_BYTES + slots*slot_size <= len by
        // construction (segment_len); the mapping stays alive through the
        // Arc in the owner box.
        unsafe {
            let ctrl = self.map.ptr.add(off);
            RingMem::from_raw(
                ctrl,
                ctrl.add(CONTROL_BYTES),
                self.slots as usize * self.slot_size as usize,
                Box::new(self.map.clone()),
            )
        }
    }

    pub fn header(&self) -> &SegmentHeader {
        // SAFETY: page 0 of a live mapping; fields are read-only after
        // create except the atomic user words.
        unsafe { &*self.map.ptr.cast::<SegmentHeader>() }
    }

    pub fn rings(&self) -> u32 {
        self.rings
    }

    /// Geometry: (slots, slot_size).
    pub fn geometry(&self) -> (u32, u32) {
        (self.slots, self.slot_size)
    }

    /// Whether the segment sits on huge pages.
    pub fn huge_pages(&self) -> bool {
        self.header().huge != 0
    }

    pub fn len(&self) -> usize {
        self.map.len
    }

    pub fn is_empty(&self) -> bool {
        self.map.len == 0
    }

    /// The segment's memfd; None after `close_fd`.
    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.fd.as_ref().map(|f| f.as_fd())
    }

    /// A new fd for the same segment, to pass to another process.
    pub fn share_fd(&self) -> Result<OwnedFd, RingError> {
        let fd = self.fd.as_ref().ok_or(RingError::Closed)?;
        fd.try_clone()
            .map_err(|e| RingError::Os(e.raw_os_error().unwrap_or(libc::EIO)))
    }

    /// Closes the memfd once nobody needs to share the segment any more;
    /// the mapping stays valid (a process with many rings then holds no
    /// descriptor per segment).
    pub fn close_fd(&mut self) {
        self.fd = None;
    }
}
