//! Where the shim's own descriptors live.
//!
//! Programs size tables by the fd numbers they expect: redis' and wrk's
//! event loops refuse an fd at or above the size they chose, `select` stops
//! at 1024. A ring connection needs a few descriptors of ours (doorbells, a
//! duplicate of the socket, the ctl session, a private epoll set); taking
//! them from the bottom of the fd space, as the kernel does by default,
//! would push the program's own sockets to numbers it never sees without
//! the shim. So every descriptor the shim keeps is moved to the top quarter
//! of the soft RLIMIT_NOFILE range (capped, so a huge limit does not grow
//! the kernel's fd table for nothing); when that range is full it stays
//! where it is.

use std::os::fd::{FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicI32, Ordering};

/// Highest base we use, whatever the limit.
const MAX_BASE: u64 = 1 << 16;

/// Cached base; 0 = not computed yet.
static BASE: AtomicI32 = AtomicI32::new(0);

fn base() -> i32 {
    let b = BASE.load(Ordering::Relaxed);
    if b != 0 {
        return b;
    }
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one struct.
    let r = unsafe {
        libc::syscall(
            libc::SYS_getrlimit,
            libc::RLIMIT_NOFILE,
            &mut lim as *mut libc::rlimit,
        )
    };
    let soft = if r == 0 { lim.rlim_cur } else { 1024 };
    let b = (soft.min(MAX_BASE * 4) * 3 / 4).clamp(3, MAX_BASE) as i32;
    BASE.store(b, Ordering::Relaxed);
    b
}

/// Moves `fd` (close-on-exec) to the shim's range; returns the new number,
/// or `fd` itself if the range is full.
pub fn high(fd: RawFd) -> RawFd {
    // SAFETY: fcntl on a descriptor the caller owns.
    let n = unsafe { libc::syscall(libc::SYS_fcntl, fd, libc::F_DUPFD_CLOEXEC, base()) };
    if n < 0 {
        return fd;
    }
    crate::sys::close(fd);
    n as RawFd
}

/// `high` for an owned descriptor.
pub fn high_owned(fd: OwnedFd) -> OwnedFd {
    let raw = high(fd.into_raw_fd());
    // SAFETY: `high` returned a descriptor we own (moved or unchanged).
    unsafe { OwnedFd::from_raw_fd(raw) }
}

/// A close-on-exec duplicate of `fd` in the shim's range.
pub fn dup_high(fd: RawFd) -> Result<RawFd, i32> {
    // SAFETY: fcntl on a descriptor the caller holds.
    let n = unsafe { libc::syscall(libc::SYS_fcntl, fd, libc::F_DUPFD_CLOEXEC, base()) };
    if n >= 0 {
        return Ok(n as RawFd);
    }
    crate::sys::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0)
}
