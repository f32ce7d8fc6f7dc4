//! Process hooks: fork and _Fork; _exit and _Exit.
//!
//! Both bump the fork generation before forking (a connection claimed before
//! the fork must be claimed again by whichever process uses it afterwards)
//! and refresh the cached pid in the child. The child's fd table is a copy of
//! the parent's, like its kernel fd table: listeners keep working in every
//! process (nginx workers accept on the master's socket), connections are
//! released without end-of-stream by a process that closes them without
//! having used them (docs/design.md, "fork, exec, dup").
//!
//! `vfork` is deliberately NOT interposed. A vfork child borrows the
//! parent's stack and memory until it calls exec or _exit; a Rust wrapper
//! that called the real vfork and then returned would let the child clobber
//! the wrapper's own stack frame, which the parent later returns through.
//! Forwarding it with a tail jump would add nothing. Left alone, vfork keeps
//! its exact semantics, and the shim copes with a child that shares its
//! memory: every hook that changes the fd table first checks
//! `process::owns_memory()` (real pid == cached pid) and leaves the shared
//! table alone in such a child.

use libc::{c_int, pid_t};

use super::define::hooks;
use crate::{lifecycle, process};

hooks! {
    /// fork(2) through glibc (atfork handlers run as usual).
    fn fork() -> pid_t;
        fallback(crate::sys::sys_call!(libc::SYS_fork) as pid_t)
    |next| {
        process::before_fork();
        let pid = next();
        if pid == 0 {
            process::after_fork_child();
        }
        pid
    }

    /// _Fork(3) (glibc >= 2.34): fork without atfork handlers, async-signal-
    /// safe; our additions are atomics and one raw syscall.
    fn _Fork() -> pid_t;
        fallback(crate::sys::sys_call!(libc::SYS_fork) as pid_t)
    |next| {
        process::before_fork();
        // _Fork runs no atfork handler: hold the rings here.
        lifecycle::fork_prepare();
        let pid = next();
        if pid == 0 {
            process::after_fork_child();
        }
        lifecycle::fork_finish();
        pid
    }

    /// _exit(2) skips atexit handlers (the constructor's drain for `exit`),
    /// but the kernel still delivers what a socket left open was given:
    /// so must the rings (`lifecycle::drain_at_exit`, which takes no lock
    /// that may be held, since _exit is async-signal-safe and called from
    /// signal handlers). Declared returning `()`: `!` cannot be spelled in
    /// the macro's closure, and no C caller looks at the return.
    fn _exit(status: c_int) -> ();
        fallback({
            crate::sys::sys_call!(libc::SYS_exit_group, status);
        })
    |next| {
        lifecycle::drain_at_exit();
        next()
    }

    /// _Exit(3): the same as _exit.
    fn _Exit(status: c_int) -> ();
        fallback({
            crate::sys::sys_call!(libc::SYS_exit_group, status);
        })
    |next| {
        lifecycle::drain_at_exit();
        next()
    }
}
