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
//! the kernel's fd table for nothing). When that range is full, a ring's
//! descriptors are refused (the connection stays TCP) rather than taken
//! from the numbers the program would get: a program at its limit sees
//! EMFILE no earlier than without the shim, give or take that quarter. The
//! few per-process ones (ctl session, background wake-up, epoll sets)
//! stay where they are instead.
//!
//! Every descriptor placed here is recorded as the shim's (owned.rs), and
//! the shim's raw closes go through `close`, which forgets it first.

mod owned;

use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicI32, Ordering};

pub use owned::{disown, is_own, mover, next_own, own, set_mover, Mover};

/// Highest base we use, whatever the limit.
const MAX_BASE: u64 = 1 << 16;

/// The start of the shim's range, from the current soft limit: read each
/// time (one system call per ring descriptor), since programs change it
/// after they start (nginx's worker_rlimit_nofile, redis' maxclients).
fn base() -> i32 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one struct.
    let r = unsafe {
        crate::sys::sys_call!(
            libc::SYS_getrlimit,
            libc::RLIMIT_NOFILE,
            &mut lim as *mut libc::rlimit,
        )
    };
    let soft = if r == 0 { lim.rlim_cur } else { 1024 };
    (soft.min(MAX_BASE * 4) * 3 / 4).clamp(3, MAX_BASE) as i32
}

/// Moves `fd` (close-on-exec) to the shim's range; returns the new number,
/// or `fd` itself if the range is full.
pub fn high(fd: RawFd) -> RawFd {
    // SAFETY: fcntl on a descriptor the caller owns.
    let n = unsafe { crate::sys::sys_call!(libc::SYS_fcntl, fd, libc::F_DUPFD_CLOEXEC, base()) };
    if n < 0 {
        own(fd);
        return fd;
    }
    crate::sys::close(fd);
    own(n as RawFd);
    n as RawFd
}

/// `high` for an owned descriptor.
pub fn high_owned(fd: OwnedFd) -> OwnedFd {
    let raw = high(fd.into_raw_fd());
    // SAFETY: `high` returned a descriptor we own (moved or unchanged).
    unsafe { OwnedFd::from_raw_fd(raw) }
}

/// `high` for a ring's descriptor: when the range is full, closes `fd`
/// and fails with EMFILE instead of leaving it at a low number.
pub fn high_or_emfile(fd: OwnedFd) -> Result<OwnedFd, i32> {
    let raw = fd.as_raw_fd();
    // SAFETY: fcntl on a descriptor we own.
    let n = unsafe { crate::sys::sys_call!(libc::SYS_fcntl, raw, libc::F_DUPFD_CLOEXEC, base()) };
    if n < 0 {
        return Err(libc::EMFILE);
    }
    drop(fd);
    own(n as RawFd);
    // SAFETY: fcntl just gave us this new descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(n as RawFd) })
}

/// The pid of the process whose descriptor table covers the shim's range
/// (0: none yet; a fork child inherits the table and finds its parent's).
static RESERVED_BY: AtomicI32 = AtomicI32::new(0);

/// Grows the kernel's descriptor table over the shim's range, once per
/// process, from its first TCP socket (`fd`). The kernel grows a table
/// that several threads share only after an RCU grace period
/// (`expand_fdtable`: about 10 ms), so the growth is taken now, while most
/// programs run one thread, rather than by the first connection that needs
/// a descriptor of ours in a threaded server, or by the program's own
/// descriptors once the shim's thread shares the table.
pub fn reserve(fd: RawFd) {
    let me = crate::process::pid();
    if RESERVED_BY.load(Ordering::Relaxed) == me {
        return;
    }
    RESERVED_BY.store(me, Ordering::Relaxed);
    let saved = crate::sys::errno();
    // SAFETY: fcntl on a descriptor the caller holds; the duplicate is
    // ours alone and closed at once.
    let n = unsafe { crate::sys::sys_call!(libc::SYS_fcntl, fd, libc::F_DUPFD_CLOEXEC, base()) };
    if n >= 0 {
        crate::sys::close(n as RawFd);
    }
    crate::sys::set_errno(saved);
}

/// A close-on-exec duplicate of `fd` in the shim's range (for a ring);
/// EMFILE when the range is full.
pub fn dup_high(fd: RawFd) -> Result<RawFd, i32> {
    // SAFETY: fcntl on a descriptor the caller holds.
    let n = unsafe { crate::sys::sys_call!(libc::SYS_fcntl, fd, libc::F_DUPFD_CLOEXEC, base()) };
    if n >= 0 {
        own(n as RawFd);
        Ok(n as RawFd)
    } else {
        Err(libc::EMFILE)
    }
}

/// An empty epoll set, per process image: the inert file `retire` puts
/// at a number (never ready, not a socket). -1: not made yet.
static TOMB: AtomicI32 = AtomicI32::new(-1);

fn tomb() -> Option<RawFd> {
    let t = TOMB.load(Ordering::Acquire);
    if t >= 0 {
        return Some(t);
    }
    // SAFETY: plain epoll creation.
    let fd = unsafe { crate::sys::sys_call!(libc::SYS_epoll_create1, libc::EPOLL_CLOEXEC) };
    if fd < 0 {
        return None;
    }
    let fd = high(fd as RawFd);
    match TOMB.compare_exchange(-1, fd, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => Some(fd),
        Err(won) => {
            close(fd);
            Some(won)
        }
    }
}

/// Lets go of the file at `fd`, one of ours, while keeping the number:
/// an inert file takes its place in one step (dup3), so a thread that
/// read the number a moment before and uses it now acts on nothing,
/// never on the file the next descriptor would get at a freed number
/// (numbers are handed out lowest first). The holder frees the number
/// with `close` once no thread can still have read it. False (nothing
/// done) where no inert file can be had: the caller closes instead.
pub fn retire(fd: RawFd) -> bool {
    // A vfork child's descriptor table is not the one this memory's
    // statics describe.
    if fd < 0 || !crate::process::owns_memory() {
        return false;
    }
    let Some(t) = tomb() else {
        return false;
    };
    // SAFETY: dup3 onto a descriptor of ours; the file it held is released.
    let r = unsafe { crate::sys::sys_call!(libc::SYS_dup3, t, fd, libc::O_CLOEXEC) };
    r == fd as libc::c_long
}

/// Closes a descriptor of the shim's without going through libc's (hooked)
/// `close`, forgetting it as ours first (so that the number, once free, is
/// the program's to close).
pub fn close(fd: RawFd) {
    disown(fd);
    crate::sys::close(fd);
}
