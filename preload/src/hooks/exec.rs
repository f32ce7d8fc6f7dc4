//! exec hooks: execve, execv, execvp, execvpe, execveat, fexecve,
//! posix_spawn, posix_spawnp, system, popen, and the variadic execl,
//! execlp and execle.
//!
//! A ring connection whose descriptor survives the exec (no FD_CLOEXEC)
//! leaves the ring first (`lifecycle::leave_before_exec`): the new image
//! finds a plain kernel socket, which then carries the stream from the
//! exact byte on. glibc's own exec functions call its internal execve,
//! which no interposer sees, so each of them is hooked itself.
//!
//! # Variadic functions
//! `execl(path, arg, ...)` takes its arguments up to a null pointer (and
//! execle an environment after it). Stable Rust cannot define a variadic
//! function, so each is a naked function that stores the argument
//! registers next to where the caller left the stack arguments, and hands
//! both to `collect` (x86-64 System V: `rsi, rdx, rcx, r8, r9`, then the
//! stack above the return address; AArch64 Linux: `x1`-`x7`, then the
//! stack at entry: variadic arguments travel as fixed ones on both).

use std::ffi::c_char;

use libc::{c_int, pid_t};

use super::define::hooks;
use crate::lifecycle;

type Argv = *const *const c_char;

extern "C" {
    static environ: *const *const c_char;
}

hooks! {
    /// execve(2).
    fn execve(path: *const c_char, argv: Argv, envp: Argv) -> c_int;
        fallback(crate::sys::sys_call!(libc::SYS_execve, path, argv, envp) as c_int)
    {
        lifecycle::leave_before_exec();
        // SAFETY: our C caller's arguments, unchanged, under its contract.
        unsafe { execve::next(path, argv, envp) }
    }

    /// execv(3).
    fn execv(path: *const c_char, argv: Argv) -> c_int;
        fallback(crate::sys::sys_call!(libc::SYS_execve, path, argv, environ) as c_int)
    {
        lifecycle::leave_before_exec();
        // SAFETY: our C caller's arguments, unchanged, under its contract.
        unsafe { execv::next(path, argv) }
    }

    /// execvp(3).
    fn execvp(file: *const c_char, argv: Argv) -> c_int;
        fallback(crate::sys::sys_call!(libc::SYS_execve, file, argv, environ) as c_int)
    {
        lifecycle::leave_before_exec();
        // SAFETY: our C caller's arguments, unchanged, under its contract.
        unsafe { execvp::next(file, argv) }
    }

    /// execvpe(3).
    fn execvpe(file: *const c_char, argv: Argv, envp: Argv) -> c_int;
        fallback(crate::sys::sys_call!(libc::SYS_execve, file, argv, envp) as c_int)
    {
        lifecycle::leave_before_exec();
        // SAFETY: our C caller's arguments, unchanged, under its contract.
        unsafe { execvpe::next(file, argv, envp) }
    }

    /// execveat(2).
    fn execveat(dirfd: c_int, path: *const c_char, argv: Argv, envp: Argv, flags: c_int) -> c_int;
        fallback(crate::sys::sys_call!(libc::SYS_execveat, dirfd, path, argv, envp, flags) as c_int)
    {
        lifecycle::leave_before_exec();
        // SAFETY: our C caller's arguments, unchanged, under its contract.
        unsafe { execveat::next(dirfd, path, argv, envp, flags) }
    }

    /// fexecve(3).
    fn fexecve(fd: c_int, argv: Argv, envp: Argv) -> c_int;
        fallback(crate::sys::sys_call!(libc::SYS_execveat, fd, c"".as_ptr(), argv, envp, libc::AT_EMPTY_PATH) as c_int)
    {
        lifecycle::leave_before_exec();
        // SAFETY: our C caller's arguments, unchanged, under its contract.
        unsafe { fexecve::next(fd, argv, envp) }
    }

    /// posix_spawn(3): the child inherits what has no FD_CLOEXEC, as after
    /// a fork and an exec, and runs no hook of ours before its exec.
    fn posix_spawn(pid: *mut pid_t, path: *const c_char, actions: *const libc::posix_spawn_file_actions_t, attr: *const libc::posix_spawnattr_t, argv: Argv, envp: Argv) -> c_int;
        fallback(libc::ENOSYS)
    {
        // SAFETY: the caller's file actions, as posix_spawn requires.
        unsafe { lifecycle::leave_before_spawn(actions) };
        // SAFETY: our C caller's arguments, unchanged, under its contract.
        unsafe { posix_spawn::next(pid, path, actions, attr, argv, envp) }
    }

    /// posix_spawnp(3).
    fn posix_spawnp(pid: *mut pid_t, file: *const c_char, actions: *const libc::posix_spawn_file_actions_t, attr: *const libc::posix_spawnattr_t, argv: Argv, envp: Argv) -> c_int;
        fallback(libc::ENOSYS)
    {
        // SAFETY: the caller's file actions, as posix_spawn requires.
        unsafe { lifecycle::leave_before_spawn(actions) };
        // SAFETY: our C caller's arguments, unchanged, under its contract.
        unsafe { posix_spawnp::next(pid, file, actions, attr, argv, envp) }
    }

    /// system(3): glibc runs the shell through its internal posix_spawn,
    /// which no interposer sees; the shell inherits what has no
    /// FD_CLOEXEC. A null command only asks whether a shell exists.
    fn system(command: *const c_char) -> c_int;
        fallback(-1)
    {
        if !command.is_null() {
            lifecycle::leave_before_exec();
        }
        // SAFETY: our C caller's argument, unchanged, under its contract.
        unsafe { system::next(command) }
    }

    /// popen(3): as system (its file actions only place the pipe).
    fn popen(command: *const c_char, mode: *const c_char) -> *mut libc::FILE;
        fallback(std::ptr::null_mut())
    {
        lifecycle::leave_before_exec();
        // SAFETY: our C caller's arguments, unchanged, under its contract.
        unsafe { popen::next(command, mode) }
    }
}

const EXECL: c_int = 0;
const EXECLP: c_int = 1;
const EXECLE: c_int = 2;

/// Argument registers the naked stubs save (after `path`).
#[cfg(target_arch = "x86_64")]
const REGS: usize = 5;
#[cfg(target_arch = "aarch64")]
const REGS: usize = 7;

/// The list `execl`-style callers pass, rebuilt as an argv (and execle's
/// environment), then the matching v-function.
///
/// # Safety
/// `regs` holds `REGS` saved argument registers and `stack` points at the
/// caller's stack arguments, together the null-terminated list (execle:
/// followed by the environment) of a C caller of `kind`.
unsafe extern "C" fn collect(path: *const c_char, regs: Argv, stack: Argv, kind: c_int) -> c_int {
    // SAFETY: per the caller, every index up to and including the list's
    // terminator (and execle's environment after it) is readable.
    let arg = |i: usize| unsafe {
        if i < REGS {
            *regs.add(i)
        } else {
            *stack.add(i - REGS)
        }
    };
    let mut argv = Vec::new();
    loop {
        let a = arg(argv.len());
        argv.push(a);
        if a.is_null() {
            break;
        }
    }
    // SAFETY: the v-functions get what the caller's list said.
    unsafe {
        match kind {
            EXECLP => execvp(path, argv.as_ptr()),
            EXECLE => execve(path, argv.as_ptr(), arg(argv.len()).cast()),
            _ => execve(path, argv.as_ptr(), environ),
        }
    }
}

macro_rules! variadic_exec {
    ($name:ident, $kind:expr) => {
        /// See the module docs ("Variadic functions").
        ///
        /// # Safety
        /// Called by C code with the C function's contract.
        #[cfg(target_arch = "x86_64")]
        #[unsafe(naked)]
        #[no_mangle]
        pub unsafe extern "C" fn $name(path: *const c_char, arg: *const c_char) -> c_int {
            core::arch::naked_asm!(
                "push rbp",
                "mov rbp, rsp",
                "sub rsp, 48",
                "mov [rsp], rsi",
                "mov [rsp + 8], rdx",
                "mov [rsp + 16], rcx",
                "mov [rsp + 24], r8",
                "mov [rsp + 32], r9",
                "mov rsi, rsp",
                "lea rdx, [rbp + 16]",
                "mov ecx, {kind}",
                "call {collect}",
                "leave",
                "ret",
                kind = const $kind,
                collect = sym collect,
            )
        }

        /// See the module docs ("Variadic functions").
        ///
        /// # Safety
        /// Called by C code with the C function's contract.
        #[cfg(target_arch = "aarch64")]
        #[unsafe(naked)]
        #[no_mangle]
        pub unsafe extern "C" fn $name(path: *const c_char, arg: *const c_char) -> c_int {
            core::arch::naked_asm!(
                "stp x29, x30, [sp, #-80]!",
                "mov x29, sp",
                "stp x1, x2, [sp, #16]",
                "stp x3, x4, [sp, #32]",
                "stp x5, x6, [sp, #48]",
                "str x7, [sp, #64]",
                "add x1, sp, #16",
                "add x2, sp, #80",
                "mov w3, #{kind}",
                "bl {collect}",
                "ldp x29, x30, [sp], #80",
                "ret",
                kind = const $kind,
                collect = sym collect,
            )
        }
    };
}

variadic_exec!(execl, EXECL);
variadic_exec!(execlp, EXECLP);
variadic_exec!(execle, EXECLE);
