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
//! `vfork` and `clone` mark the child that shares this memory
//! (`process::owns_memory`, which hooks that change the shim's tables ask
//! first). `vfork` is a naked stub that marks the calling thread and jumps
//! to libc's vfork, which returns straight to our caller: a Rust wrapper
//! that called vfork and then returned would let the child clobber the
//! wrapper's frame, which the parent later returns through.

use std::ffi::c_void;

use libc::{c_int, pid_t};

use super::define::hooks;
use crate::interpose::Symbol;
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

    /// clone(2) through glibc. Variadic in C (`parent_tid, tls, child_tid`
    /// follow `arg`): read as fixed arguments, which is sound on the
    /// x86-64 and AArch64 Linux ABIs for the reason hooks/syscall.rs gives,
    /// and passed on unchanged. The child runs `f` on its own stack, so the
    /// parent returns through this frame untouched.
    fn clone(f: *mut c_void, stack: *mut c_void, flags: c_int, arg: *mut c_void, ptid: *mut pid_t, tls: *mut c_void, ctid: *mut pid_t) -> c_int;
        fallback({
            crate::sys::set_errno(libc::ENOSYS);
            -1
        })
    |next| {
        if process::clone_makes_process(flags as u32 as u64) {
            process::before_shared_child();
        }
        next()
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

/// libc's vfork.
static VFORK: Symbol = Symbol::new("vfork\0");

/// Resolves libc's vfork (the constructor calls it with the hooks' own).
pub fn resolve_vfork() {
    let _ = VFORK.get();
}

/// Marks the calling thread as vforking (outside a sandbox, where the shim
/// keeps no state to protect) and returns the vfork to jump to: libc's, or
/// our fork hook, a vfork POSIX allows, should libc have none.
extern "C" fn vfork_target() -> usize {
    if !process::sandboxed() {
        process::before_vfork();
    }
    match VFORK.get() {
        Some(f) => f as usize,
        None => fork as unsafe extern "C" fn() -> pid_t as usize,
    }
}

/// vfork(2): see the module docs. The stub keeps the stack as the caller
/// left it, so libc's vfork sees its caller's return address on top.
///
/// # Safety
/// Called by C code with vfork's contract.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn vfork() -> pid_t {
    core::arch::naked_asm!(
        "sub rsp, 8",
        "call {target}",
        "add rsp, 8",
        "jmp rax",
        target = sym vfork_target,
    )
}

/// vfork(2): see the module docs (AArch64: the link register is restored
/// before the jump, so libc's vfork returns to our caller).
///
/// # Safety
/// Called by C code with vfork's contract.
#[cfg(target_arch = "aarch64")]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn vfork() -> pid_t {
    core::arch::naked_asm!(
        "stp x29, x30, [sp, #-16]!",
        "mov x29, sp",
        "bl {target}",
        "ldp x29, x30, [sp], #16",
        "mov x16, x0",
        "br x16",
        target = sym vfork_target,
    )
}
