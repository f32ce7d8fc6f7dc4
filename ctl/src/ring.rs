//! Ring memfds passed with connection reports: mapped read-only so status
//! can show live counters, plus the hook that turns a ring into counters.
//!
//! The ring crate will define the counter layout; until then the provider
//! reports what the daemon can see for itself. A hostile process must not
//! be able to crash the daemon through the mapping: the memfd is mapped
//! only if it is sealed against shrinking (F_SEAL_SHRINK), because reading
//! a page past the end of a shrunk file raises SIGBUS.

use std::os::fd::{AsRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use ringsock_proto::RingStat;

/// At most this much of a ring is mapped: counters live in its header.
pub const RING_MAP_MAX: usize = 1 << 20;

/// A read-only shared mapping, unmapped on drop.
struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: ptr/len are exactly what mmap returned; nothing borrows
        // the mapping beyond the RingMap that owns it.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

/// A ring memfd held for status, with its mapping when it was safe to map.
pub struct RingMap {
    _fd: OwnedFd,
    size: u64,
    sealed: bool,
    map: Option<Mapping>,
}

impl RingMap {
    /// Never fails: a descriptor that cannot be mapped is still shown (with
    /// what fstat says), it just has no counters.
    pub fn open(fd: OwnedFd) -> RingMap {
        let raw = fd.as_raw_fd();
        // SAFETY: stat is plain old data; fstat fills it.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: st is a writable stat buffer.
        let is_file = unsafe { libc::fstat(raw, &mut st) } == 0
            && (st.st_mode & libc::S_IFMT) == libc::S_IFREG;
        let size = if is_file { st.st_size.max(0) as u64 } else { 0 };
        // SAFETY: F_GET_SEALS only queries the file.
        let seals = unsafe { libc::fcntl(raw, libc::F_GET_SEALS) };
        let sealed = seals >= 0 && seals & libc::F_SEAL_SHRINK != 0;
        let len = (size.min(RING_MAP_MAX as u64)) as usize;
        let map = if is_file && sealed && len > 0 {
            // SAFETY: a fresh read-only shared mapping of `len` bytes of a
            // regular file at least that long that can no longer shrink.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ,
                    libc::MAP_SHARED,
                    raw,
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                None
            } else {
                NonNull::new(p.cast::<u8>()).map(|ptr| Mapping { ptr, len })
            }
        } else {
            None
        };
        RingMap {
            _fd: fd,
            size,
            sealed,
            map,
        }
    }

    pub fn view(&self) -> RingView<'_> {
        RingView { ring: self }
    }
}

/// What a stats provider may look at.
pub struct RingView<'a> {
    ring: &'a RingMap,
}

impl RingView<'_> {
    /// File size of the memfd.
    pub fn size(&self) -> u64 {
        self.ring.size
    }

    pub fn is_mapped(&self) -> bool {
        self.ring.map.is_some()
    }

    pub fn is_sealed(&self) -> bool {
        self.ring.sealed
    }

    /// Atomically reads the 8-byte counter at `offset` (which must be
    /// 8-aligned and inside the mapping). The owning process updates the
    /// counters concurrently, hence atomic loads, never plain reads.
    pub fn load_u64(&self, offset: usize) -> Option<u64> {
        let m = self.ring.map.as_ref()?;
        if !offset.is_multiple_of(8) || offset.checked_add(8)? > m.len {
            return None;
        }
        // SAFETY: the mapping is page-aligned, so ptr+offset is 8-aligned,
        // and offset+8 <= len keeps the read inside it; the file cannot
        // shrink (sealed), so the page is always backed. AtomicU64 has the
        // layout of u64 and shared memory written by another process is
        // exactly what atomics are for.
        let v = unsafe { &*(m.ptr.as_ptr().add(offset) as *const AtomicU64) };
        Some(v.load(Ordering::Relaxed))
    }
}

/// Turns a ring into status counters. The ring crate will provide one that
/// knows its layout; the daemon picks the provider at start.
pub trait RingStats {
    fn stats(&self, ring: &RingView<'_>) -> Vec<RingStat>;
}

/// The layout-agnostic provider: what the daemon knows without reading.
pub struct MemfdStats;

impl RingStats for MemfdStats {
    fn stats(&self, ring: &RingView<'_>) -> Vec<RingStat> {
        vec![
            RingStat {
                name: "memfd_size".into(),
                value: ring.size(),
            },
            RingStat {
                name: "mapped".into(),
                value: u64::from(ring.is_mapped()),
            },
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::FromRawFd;

    fn memfd(size: i64, seal: bool) -> OwnedFd {
        // SAFETY: plain memfd_create/ftruncate/fcntl on a fresh fd that the
        // OwnedFd then owns.
        unsafe {
            let fd = libc::memfd_create(
                c"ring-test".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            );
            assert!(fd >= 0);
            assert_eq!(libc::ftruncate(fd, size), 0);
            if seal {
                assert_eq!(libc::fcntl(fd, libc::F_ADD_SEALS, libc::F_SEAL_SHRINK), 0);
            }
            OwnedFd::from_raw_fd(fd)
        }
    }

    fn write_at(fd: &OwnedFd, off: i64, v: u64) {
        let b = v.to_ne_bytes();
        // SAFETY: b is a readable 8-byte buffer.
        let n = unsafe { libc::pwrite(fd.as_raw_fd(), b.as_ptr().cast(), 8, off) };
        assert_eq!(n, 8);
    }

    #[test]
    fn sealed_memfd_is_mapped_and_readable() {
        let fd = memfd(4096, true);
        let dup = fd.try_clone().unwrap();
        let r = RingMap::open(fd);
        let v = r.view();
        assert!(v.is_mapped() && v.is_sealed());
        assert_eq!(v.size(), 4096);
        write_at(&dup, 16, 0xabcdef);
        assert_eq!(v.load_u64(16), Some(0xabcdef));
        assert_eq!(v.load_u64(17), None);
        assert_eq!(v.load_u64(4096), None);
        assert_eq!(v.load_u64(usize::MAX - 3), None);
        let s = MemfdStats.stats(&v);
        assert_eq!(s[0].value, 4096);
        assert_eq!(s[1].value, 1);
    }

    #[test]
    fn unsealed_memfd_is_not_mapped() {
        let r = RingMap::open(memfd(4096, false));
        assert!(!r.view().is_mapped());
        assert_eq!(r.view().size(), 4096);
        assert_eq!(r.view().load_u64(0), None);
    }

    #[test]
    fn non_files_are_harmless() {
        let mut p = [0; 2];
        // SAFETY: p is a writable array of two ints.
        assert_eq!(unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: both ends are fresh and owned here only.
        let (a, _b) = unsafe { (OwnedFd::from_raw_fd(p[0]), OwnedFd::from_raw_fd(p[1])) };
        let r = RingMap::open(a);
        assert!(!r.view().is_mapped());
        assert_eq!(r.view().size(), 0);
    }
}
