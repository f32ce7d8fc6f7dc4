//! Entering a seccomp sandbox (lifecycle::enter_sandbox), in a forked
//! child: the flag is process-wide, and every other test needs the shim.

use super::mock::pair;
use super::{epoll_add, epoll_wait, ring_fd, write};
use crate::fdtable;
use crate::hooks::epoll as ep;

/// Runs `check` in a forked child; its panics (or a false result) fail
/// the test through the child's exit status.
fn in_child(check: fn() -> bool) {
    // SAFETY: the child runs `check` and leaves with _exit, without
    // returning into the test harness.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let ok = std::panic::catch_unwind(check).unwrap_or(false);
        // SAFETY: leaving the forked test process without unwinding.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "child status {status:#x}"
    );
}

/// After entering, nothing is tracked, a write goes to the kernel socket
/// (unconnected here: EPIPE, not the ring), and the epoll instance holds
/// the ring fd as a kernel registration with the program's data (an
/// unconnected socket reports EPOLLHUP).
#[test]
fn entering_forgets_every_fd_and_hands_epoll_to_the_kernel() {
    in_child(|| {
        let (a, _b) = pair(64);
        let fa = ring_fd(a);
        // SAFETY: plain epoll_create1 through the hook.
        let epfd = unsafe { ep::epoll_create1(libc::EPOLL_CLOEXEC) };
        assert!(epfd >= 0);
        epoll_add(epfd, fa, libc::EPOLLIN, 77);
        assert!(fdtable::is_tracked(fa) && fdtable::is_tracked(epfd));
        crate::lifecycle::enter_sandbox();
        assert!(crate::process::sandboxed());
        assert!(!fdtable::is_tracked(fa) && !fdtable::is_tracked(epfd));
        assert_eq!(write(fa, b"x"), -1);
        assert_eq!(crate::sys::errno(), libc::EPIPE);
        let mut ev = libc::epoll_event { events: 0, u64: 0 };
        // SAFETY: ev is valid; the kernel refuses a second registration.
        let again = unsafe { crate::real::epoll_ctl(epfd, libc::EPOLL_CTL_ADD, fa, &mut ev) };
        assert_eq!((again, crate::sys::errno()), (-1, libc::EEXIST));
        epoll_wait(epfd, 4, 0) == vec![(libc::EPOLLHUP as u32, 77)]
    });
}
