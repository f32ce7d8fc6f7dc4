//! Which process we are: a cached pid, the pid we were forked from, and a
//! fork generation.
//!
//! glibc stopped caching getpid() long ago, so the shim keeps its own copy,
//! refreshed in every child that goes through `fork`, `_Fork` or an internal
//! glibc fork (`daemon(3)` and friends reach us through the pthread_atfork
//! child handler registered by `init`). The child also keeps the pid it was
//! forked from, read from memory rather than asked of the kernel: a child
//! that sandboxes itself (sshd's pre-authentication child) may be killed for
//! a getppid, and a child whose parent died would be told init's pid. The
//! fork generation is bumped around
//! every fork, in parent and child alike: a connection claimed before a fork
//! must be claimed again afterwards (docs/design.md, "fork, exec, dup").
//!
//! A child that shares this process's memory (vfork, clone(CLONE_VM))
//! has its own kernel fd table, so hooks that change the shim's tables ask
//! `owns_memory()` first, and such a child leaves them alone. Every way a
//! program makes such a child through libc passes a hook of ours first,
//! which marks it (hooks/process.rs: vfork, clone; hooks/syscall.rs: raw
//! clone, clone3, fork and vfork): `owns_memory()` makes no system call
//! until one did. posix_spawn's internal clone needs no mark, since its
//! child runs only glibc's internal functions, never a hook. A child made
//! by a `syscall` instruction of the program's own, outside libc, is not
//! seen (docs/limits.md).

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, AtomicU8, Ordering};

use libc::pid_t;

use crate::sys;

/// 0 until first use; then the pid of the process that owns this memory.
static PID: AtomicI32 = AtomicI32::new(0);
/// The pid of the process this one was forked from; 0 in a process that
/// has not been forked under the shim (the image it started with).
static PARENT: AtomicI32 = AtomicI32::new(0);
/// Bumped before every fork; see `claim` in fdtable/state.rs.
static FORK_EPOCH: AtomicU64 = AtomicU64::new(1);

/// The pid of the process that owns this memory image (cheap: no syscall
/// after the first call).
pub fn pid() -> pid_t {
    let p = PID.load(Ordering::Relaxed);
    if p != 0 {
        return p;
    }
    let real = sys::getpid();
    PID.store(real, Ordering::Relaxed);
    real
}

/// The pid of the process this one was forked from, as it was at the fork
/// (no system call once forked); the kernel's parent in the image the
/// process started with, which inherited nothing from a shimmed parent's
/// memory.
pub fn parent_pid() -> pid_t {
    match PARENT.load(Ordering::Relaxed) {
        // SAFETY: getppid takes no arguments and cannot fail.
        0 => unsafe { crate::sys::sys_call!(libc::SYS_getppid) as pid_t },
        p => p,
    }
}

/// Where the process stands with a seccomp sandbox (see `lifecycle::enter_sandbox`).
static SANDBOX: AtomicU8 = AtomicU8::new(NOT_SANDBOXED);
const NOT_SANDBOXED: u8 = 0;
const ENTERING: u8 = 1;
const SANDBOXED: u8 = 2;

/// The process is about to put itself under a seccomp filter: nothing new
/// is tracked from now on (the rings it has are being left). Returns false
/// if it already began.
pub fn begin_sandbox() -> bool {
    SANDBOX
        .compare_exchange(NOT_SANDBOXED, ENTERING, Ordering::AcqRel, Ordering::Acquire)
        .is_ok()
}

/// The rings are left and the fds forgotten: from now on the shim makes no
/// system call of its own, and every hook passes straight through.
pub fn finish_sandbox() {
    SANDBOX.store(SANDBOXED, Ordering::Release);
}

/// True once `begin_sandbox` ran: nothing new may be tracked.
#[inline]
pub fn sandbox_begun() -> bool {
    SANDBOX.load(Ordering::Acquire) != NOT_SANDBOXED
}

/// True once the process is sandboxed (one relaxed load: every hook asks).
#[inline]
pub fn sandboxed() -> bool {
    SANDBOX.load(Ordering::Relaxed) == SANDBOXED
}

/// The current fork generation.
pub fn fork_epoch() -> u64 {
    FORK_EPOCH.load(Ordering::Acquire)
}

/// Set, for good, once this process made a child that may share its
/// memory for as long as it lives (clone(CLONE_VM) without CLONE_THREAD),
/// or a fork child that none of our fork bookkeeping reached (it keeps a
/// stale cached pid, so must not take the tables for its own): from then
/// on `owns_memory` asks the kernel.
static SHARED_VM: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// This thread called vfork and has not yet seen, as the parent, that
    /// it owns the memory again. The vfork child runs on this thread's TLS
    /// while the parent thread is suspended, so the child sees the mark;
    /// other threads have their own, unmarked.
    static VFORKED: Cell<bool> = const { Cell::new(false) };
}

/// Threads with VFORKED set: while there are none (and no SHARED_VM),
/// `owns_memory` needs no thread-local look-up. Counted in before the
/// vfork, so the child, which runs on that thread, sees it; counted out
/// when the parent thread clears its mark. A count too high (a forked
/// child's copy) only costs the look-up.
static VFORKING: AtomicU32 = AtomicU32::new(0);

/// True when the calling process owns this memory image, false in a child
/// that shares it (vfork, clone(CLONE_VM)) and must not change shim state.
/// No system call unless a hook marked such a child (module docs); then
/// one getpid.
#[inline]
pub fn owns_memory() -> bool {
    if VFORKING.load(Ordering::Acquire) == 0 && !SHARED_VM.load(Ordering::Acquire) {
        return true;
    }
    owns_memory_slow()
}

#[cold]
fn owns_memory_slow() -> bool {
    let vforked = VFORKED.with(Cell::get);
    if !vforked && !SHARED_VM.load(Ordering::Acquire) {
        return true;
    }
    let owns = sys::getpid() == pid();
    if owns && vforked {
        // The parent after vfork returned: the child exec'd or exited.
        VFORKED.with(|v| v.set(false));
        VFORKING.fetch_sub(1, Ordering::AcqRel);
    }
    owns
}

/// The calling thread is about to vfork: the child runs on this thread's
/// memory until it execs or exits (hooks/process.rs, `vfork`).
pub fn before_vfork() {
    pid();
    VFORKED.with(|v| {
        if !v.replace(true) {
            VFORKING.fetch_add(1, Ordering::AcqRel);
        }
    });
}

/// A child that may share this memory (or that keeps a stale cached pid)
/// is about to be made: `owns_memory` asks the kernel from now on.
pub fn before_shared_child() {
    pid();
    SHARED_VM.store(true, Ordering::Release);
}

/// Whether a clone with these flags makes another process (no
/// CLONE_THREAD): with CLONE_VM it shares our memory, without it it is a
/// fork child that none of our fork bookkeeping reached.
pub fn clone_makes_process(flags: u64) -> bool {
    flags & libc::CLONE_THREAD as u64 == 0
}

/// Called just before the real fork in the parent: connections claimed so far
/// must be claimed again after the fork, by whichever process uses them.
pub fn before_fork() {
    // The child reads its parent's pid from the cache: fill it now.
    pid();
    FORK_EPOCH.fetch_add(1, Ordering::AcqRel);
}

/// Called in the child right after a fork that gave it its own memory (by
/// our fork hook and by the atfork handler: the second call finds the pid
/// already ours and keeps the parent). Async-signal-safe: one syscall and
/// atomics.
pub fn after_fork_child() {
    let me = sys::getpid();
    let was = PID.swap(me, Ordering::Relaxed);
    if was != me && was != 0 {
        PARENT.store(was, Ordering::Relaxed);
    }
}

extern "C" fn atfork_prepare() {
    if !sandboxed() {
        before_fork();
    }
}

extern "C" fn atfork_child() {
    // A sandboxed child makes no system call of ours (getpid may be
    // forbidden); nothing of the shim's uses the pid there.
    if !sandboxed() {
        after_fork_child();
    }
}

/// Registers the fork handlers that cover forks we do not see as calls to
/// our `fork` hook (glibc-internal forks such as daemon(3)). Both handlers
/// are idempotent with the work our `fork` hook does itself.
pub fn register_atfork() {
    // SAFETY: the handlers are plain extern "C" functions that only touch
    // atomics and make raw syscalls, which is allowed in atfork handlers.
    let rc = unsafe { libc::pthread_atfork(Some(atfork_prepare), None, Some(atfork_child)) };
    if rc != 0 {
        log::warn!("pthread_atfork failed ({rc}); forks through daemon(3) keep a stale pid");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A child learns its parent's pid at the fork, keeps it when the
    /// atfork handler runs after our fork hook, and needs no system call
    /// to tell it.
    #[test]
    fn the_child_knows_its_parent_from_the_fork() {
        let me = pid();
        assert_eq!(me, sys::getpid());
        before_fork();
        // SAFETY: the child only touches atomics, makes raw syscalls and
        // leaves with _exit (no allocation, no locks).
        let child = unsafe { libc::fork() };
        assert!(child >= 0, "fork failed");
        if child == 0 {
            after_fork_child();
            after_fork_child();
            let ok = parent_pid() == me && pid() == sys::getpid() && pid() != me;
            // SAFETY: leaving the forked test process without unwinding.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        let mut status = 0;
        // SAFETY: waiting for our own child.
        let r = unsafe { libc::waitpid(child, &mut status, 0) };
        assert_eq!(r, child);
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "child status {status:#x}"
        );
    }
}
