//! How a program installs signal handlers: sigaction (and glibc's alias
//! __sigaction), the signal(3) family and sigset, and rt_sigaction made
//! through syscall(2) (hooks/syscall.rs).
//!
//! For a caught signal that may be deferred (`signals::table::deferrable`)
//! the kernel gets the trampoline of interpose/defer.rs, with the program's
//! mask and flags (plus SA_SIGINFO, less SA_RESETHAND, which the trampoline
//! carries out itself); the program's handler goes to `signals::table`.
//! SIG_DFL, SIG_IGN and the signals that are never deferred go to the
//! kernel unchanged. Every query answers what the program installed: where
//! the kernel holds the trampoline, the recorded handler and flags replace
//! it in the answer.
//!
//! The signal(3) family and sigset keep glibc's own semantics (siginterrupt
//! state, SIG_HOLD): libc's function installs the handler, and the hook
//! then puts the trampoline in its place. A signal that reaches another
//! thread between the two runs its handler at once, as without the shim.
//!
//! A vfork child shares the table with its parent but has its own kernel
//! actions: its installs go to the kernel unchanged, and the table, still
//! the parent's, keeps describing the actions the child inherited.

use libc::{c_int, c_ulong, sighandler_t};

use super::define::hooks;
use crate::interpose::defer::{program_flags, trampoline_address, trampoline_flags};
use crate::process;
use crate::real;
use crate::signals::action::KernelAction;
use crate::signals::mask::block_all;
use crate::signals::table::{self, Handler};

hooks! {
    /// sigaction(2).
    fn sigaction(sig: c_int, act: *const libc::sigaction, old: *mut libc::sigaction) -> c_int; {
        // SAFETY: the program's pointers, under sigaction's contract.
        unsafe { exchange(sig, act, old) }
    }

    /// glibc's exported alias of sigaction.
    fn __sigaction(sig: c_int, act: *const libc::sigaction, old: *mut libc::sigaction) -> c_int;
        fallback(real::sigaction(sig, act, old))
    {
        // SAFETY: as for `sigaction`.
        unsafe { exchange(sig, act, old) }
    }

    /// signal(3) (BSD semantics in glibc).
    fn signal(sig: c_int, handler: sighandler_t) -> sighandler_t;
        fallback(emulated(sig, handler, libc::SA_RESTART, true))
    |next| { adopt(sig, next) }

    /// bsd_signal(3), the same function in glibc.
    fn bsd_signal(sig: c_int, handler: sighandler_t) -> sighandler_t;
        fallback(emulated(sig, handler, libc::SA_RESTART, true))
    |next| { adopt(sig, next) }

    /// ssignal(3), the same function in glibc.
    fn ssignal(sig: c_int, handler: sighandler_t) -> sighandler_t;
        fallback(emulated(sig, handler, libc::SA_RESTART, true))
    |next| { adopt(sig, next) }

    /// sysv_signal(3): one-shot, not masked, not restarted.
    fn sysv_signal(sig: c_int, handler: sighandler_t) -> sighandler_t;
        fallback(emulated(sig, handler, libc::SA_RESETHAND | libc::SA_NODEFER, false))
    |next| { adopt(sig, next) }

    /// What <signal.h> maps sysv_signal to.
    fn __sysv_signal(sig: c_int, handler: sighandler_t) -> sighandler_t;
        fallback(emulated(sig, handler, libc::SA_RESETHAND | libc::SA_NODEFER, false))
    |next| { adopt(sig, next) }

    /// sigset(3) (System V; SIG_HOLD blocks instead).
    fn sigset(sig: c_int, handler: sighandler_t) -> sighandler_t;
        fallback({
            // glibc, which the shim requires, always defines sigset.
            let _ = handler;
            crate::sys::set_errno(libc::ENOSYS);
            libc::SIG_ERR
        })
    |next| { adopt(sig, next) }
}

/// sigaction(`sig`, `act`, `old`) as the program sees it (module docs).
///
/// # Safety
/// sigaction's contract: `act` null or readable, `old` null or writable.
pub unsafe fn exchange(
    sig: c_int,
    act: *const libc::sigaction,
    old: *mut libc::sigaction,
) -> c_int {
    if act.is_null() || !table::deferrable(sig) || !process::owns_memory() {
        let prev = table::get(sig);
        // SAFETY: the program's call, unchanged.
        let r = unsafe { real::sigaction(sig, act, old) };
        if r == 0 {
            // SAFETY: `old` is null or writable, and filled by the call.
            unsafe { present(old, prev) };
        }
        return r;
    }
    // SAFETY: `act` is readable (sigaction's contract); copied before
    // `old`, which may be the same struct, is written.
    let mut k = unsafe { *act };
    let caught = k.sa_sigaction != libc::SIG_DFL && k.sa_sigaction != libc::SIG_IGN;
    let _blocked = block_all();
    let _locked = table::lock(sig);
    let prev = table::get(sig);
    if caught {
        table::set(sig, Some(handler_of(&k)));
        k.sa_sigaction = trampoline_address();
        k.sa_flags = trampoline_flags(k.sa_flags);
    }
    // SAFETY: `k` is a valid sigaction; `old` is the program's.
    let r = unsafe { real::sigaction(sig, &k, old) };
    if r != 0 {
        if caught {
            table::set(sig, prev);
        }
        return r;
    }
    // SAFETY: as above.
    unsafe { present(old, prev) };
    r
}

/// The record of the handler `act` installs.
fn handler_of(act: &libc::sigaction) -> Handler {
    Handler {
        address: act.sa_sigaction,
        siginfo: act.sa_flags & libc::SA_SIGINFO != 0,
        resethand: act.sa_flags & libc::SA_RESETHAND != 0,
    }
}

/// Rewrites a kernel answer that names the trampoline into the program's
/// handler (`prev`, the record that stood for it).
///
/// # Safety
/// `old` is null or a valid sigaction.
unsafe fn present(old: *mut libc::sigaction, prev: Option<Handler>) {
    // SAFETY: the caller's contract.
    let Some(o) = (unsafe { old.as_mut() }) else {
        return;
    };
    if o.sa_sigaction != trampoline_address() {
        return;
    }
    match prev {
        Some(p) => {
            o.sa_sigaction = p.address;
            o.sa_flags = program_flags(o.sa_flags, p);
        }
        // Only while an SA_RESETHAND handler is being run: the action is
        // then already the default one.
        None => o.sa_sigaction = libc::SIG_DFL,
    }
}

/// For the signal(3) family: libc's function (`install`) sets the action,
/// then the trampoline takes the handler's place. The old handler returned
/// is the program's.
fn adopt(sig: c_int, install: impl FnOnce() -> sighandler_t) -> sighandler_t {
    let prev = table::get(sig);
    let r = install();
    if r == libc::SIG_ERR {
        return r;
    }
    if table::deferrable(sig) && process::owns_memory() {
        take_over(sig);
    }
    if r == trampoline_address() {
        prev.map_or(libc::SIG_DFL, |p| p.address)
    } else {
        r
    }
}

/// Puts the trampoline in place of the program handler the kernel holds
/// for `sig`, if it holds one.
fn take_over(sig: c_int) {
    let _blocked = block_all();
    let _locked = table::lock(sig);
    // SAFETY: a zeroed sigaction is a valid out-parameter; querying.
    let mut k: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: `k` is writable.
    if unsafe { real::sigaction(sig, std::ptr::null(), &mut k) } != 0 {
        return;
    }
    let h = k.sa_sigaction;
    if h == libc::SIG_DFL || h == libc::SIG_IGN || h == trampoline_address() {
        return;
    }
    let prev = table::set(sig, Some(handler_of(&k)));
    k.sa_sigaction = trampoline_address();
    k.sa_flags = trampoline_flags(k.sa_flags);
    // SAFETY: `k` is a valid sigaction.
    if unsafe { real::sigaction(sig, &k, std::ptr::null_mut()) } != 0 {
        table::set(sig, prev);
    }
}

/// signal(3) from sigaction, where libc has no such function: `flags`,
/// and the signal itself masked in its handler if `self_masked`.
fn emulated(sig: c_int, handler: sighandler_t, flags: c_int, self_masked: bool) -> sighandler_t {
    // SAFETY: zeroed sigactions are valid (empty mask).
    let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    act.sa_sigaction = handler;
    act.sa_flags = flags;
    if self_masked && (1..=64).contains(&sig) {
        // SAFETY: `act.sa_mask` is a valid sigset and `sig` in range.
        unsafe { libc::sigaddset(&mut act.sa_mask, sig) };
    }
    // SAFETY: both structs are valid for the call.
    if unsafe { exchange(sig, &act, &mut old) } != 0 {
        return libc::SIG_ERR;
    }
    old.sa_sigaction
}

/// rt_sigaction(2) made through syscall(2): the same exchange, through
/// libc's layout. libc supplies its own restorer, so a restorer the program
/// gave is not used (and a query answers libc's).
///
/// # Safety
/// rt_sigaction's contract for `act` and `old` (kernel layout).
pub unsafe fn rt_sigaction(sig: c_int, act: usize, old: usize, setsize: usize) -> Option<i64> {
    if setsize != 8 {
        // The kernel's EINVAL.
        return None;
    }
    let act = act as *const KernelAction;
    let old = old as *mut KernelAction;
    // SAFETY: zeroed sigactions are valid.
    let mut a: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let mut o: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: `act` is null or readable (the contract).
    let ap = match unsafe { act.as_ref() } {
        None => std::ptr::null(),
        Some(k) => {
            a.sa_sigaction = k.handler;
            a.sa_flags = k.flags as c_int;
            a.sa_restorer = (k.restorer != 0).then(|| {
                // SAFETY: the program's restorer address, a function.
                unsafe { std::mem::transmute::<usize, extern "C" fn()>(k.restorer) }
            });
            // SAFETY: a sigset_t starts with the kernel's 64 bits.
            unsafe { *(&mut a.sa_mask as *mut libc::sigset_t).cast::<u64>() = k.mask };
            &a as *const libc::sigaction
        }
    };
    let op = if old.is_null() {
        std::ptr::null_mut()
    } else {
        &mut o as *mut libc::sigaction
    };
    // SAFETY: `ap` and `op` are null or our own structs.
    let r = unsafe { exchange(sig, ap, op) };
    if r != 0 {
        return Some(-1);
    }
    // SAFETY: `old` is null or writable (the contract).
    if let Some(k) = unsafe { old.as_mut() } {
        k.handler = o.sa_sigaction;
        k.flags = o.sa_flags as u32 as c_ulong;
        k.restorer = o.sa_restorer.map_or(0, |f| f as usize);
        // SAFETY: as above.
        k.mask = unsafe { *(&o.sa_mask as *const libc::sigset_t).cast::<u64>() };
    }
    Some(0)
}
