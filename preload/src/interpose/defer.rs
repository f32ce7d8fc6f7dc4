//! Signal deferral: a program's handler never runs inside the shim's code.
//!
//! For every caught signal that may be deferred, the kernel's action is
//! `trampoline`, with the program's flags and mask (hooks/signal.rs); the
//! program's handler is in `signals::table`. When the signal arrives while
//! its thread is inside a shim scope (`guard::active`), the handler could
//! find a connection lock held by the code it interrupted, or write past
//! the ring straight to the kernel socket, or longjmp out and leave the
//! lock held. So the trampoline saves the siginfo, marks the signal pending
//! for the thread, and blocks it in the context it returns to, so that
//! further instances wait in the kernel's queue (real-time ones keep their
//! count). When the exported entry point that entered the scope ends
//! (`flush`) or the thread goes to sleep in a scope (`guard::Sleep`), the saved signals are queued to
//! the thread again and unblocked: the handler runs in a real signal
//! context, with its sa_mask, before the program's next instruction. A
//! shim call thus behaves as if the deferrable signals were blocked during
//! it, which is a delivery order the kernel allows.
//!
//! The thread-local state is `const`-initialised and without destructor:
//! static TLS of the preloaded library, safe to touch in a handler.

use std::cell::{Cell, UnsafeCell};
use std::sync::atomic::{AtomicU32, Ordering};

use libc::{c_int, c_void, siginfo_t};

use super::guard;
use crate::process;
use crate::signals::{action, mask, table};

/// A siginfo_t's bytes (128 on Linux).
type Info = [u64; 16];
const _: () = assert!(std::mem::size_of::<siginfo_t>() == std::mem::size_of::<Info>());

thread_local! {
    /// Signals deferred on this thread (bit sig-1), each blocked by us.
    static PENDING: Cell<u64> = const { Cell::new(0) };
    /// The siginfo each pending signal arrived with.
    static SAVED: UnsafeCell<[Info; 64]> = const { UnsafeCell::new([[0; 16]; 64]) };
}

/// Threads whose PENDING is not empty: while none is, `flush` needs no
/// thread-local look-up (a hook's epilogue is one relaxed load). A thread
/// counts itself in (`defer`, in a handler that interrupted it) before
/// its own `flush` can look, since a signal is deferred only inside a
/// scope, which ends before the flush; it counts itself out when it
/// empties its PENDING (`redeliver`). A count too high (a forked child's
/// copy counts threads it does not have) only costs that look-up.
static DEFERRING: AtomicU32 = AtomicU32::new(0);

/// The kernel action's handler for every deferrable caught signal.
///
/// # Safety
/// Called by the kernel as an SA_SIGINFO handler: `info` and `uctx` point
/// to the frame's siginfo_t and ucontext_t.
pub unsafe extern "C" fn trampoline(sig: c_int, info: *mut siginfo_t, uctx: *mut c_void) {
    if guard::active() && !process::sandboxed() {
        // SAFETY: the kernel's frame pointers, per the contract above.
        unsafe { defer(sig, info, uctx) };
        return;
    }
    // SAFETY: as above.
    unsafe { run(sig, info, uctx) };
}

/// Saves the signal, and blocks it for the context the trampoline returns
/// to (rt_sigreturn restores `uc_sigmask`).
///
/// # Safety
/// As for `trampoline`.
unsafe fn defer(sig: c_int, info: *mut siginfo_t, uctx: *mut c_void) {
    let i = sig as usize - 1;
    SAVED.with(|s| {
        // SAFETY: only this thread touches its SAVED, and an instance of
        // `sig` cannot interrupt this write (it is in the frame's mask
        // unless SA_NODEFER, and then its pending bit is already set
        // only after the copy): `info` is the kernel's 128-byte siginfo.
        unsafe { std::ptr::copy_nonoverlapping(info.cast::<Info>(), &mut (*s.get())[i], 1) };
    });
    PENDING.with(|p| {
        if p.get() == 0 {
            DEFERRING.fetch_add(1, Ordering::Relaxed);
        }
        p.set(p.get() | mask::bit(sig))
    });
    // SAFETY: `uctx` is the frame's ucontext_t; the kernel reads the first
    // 64 bits of uc_sigmask back on return.
    unsafe {
        let uc = uctx.cast::<libc::ucontext_t>();
        let set = std::ptr::addr_of_mut!((*uc).uc_sigmask).cast::<u64>();
        *set |= mask::bit(sig);
    }
}

/// Runs the program's handler as the kernel would have.
///
/// # Safety
/// As for `trampoline`.
unsafe fn run(sig: c_int, info: *mut siginfo_t, uctx: *mut c_void) {
    let h = loop {
        let Some(h) = table::get(sig) else {
            // An SA_RESETHAND handler already ran for an earlier instance
            // (SA_NODEFER lets them overlap): this one gets what the kernel
            // would give it, the default action.
            reset_to_default(sig, None);
            // SAFETY: the kernel's siginfo for this delivery.
            unsafe { mask::requeue(sig, info) };
            return;
        };
        // One-shot: only the instance that clears the record runs it; a
        // record replaced meanwhile by the program is read again.
        if !h.resethand || table::take_once(sig, h) {
            break h;
        }
    };
    if h.resethand {
        reset_to_default(sig, Some(h));
    }
    if h.siginfo {
        // SAFETY: the program installed this address as an SA_SIGINFO
        // handler for `sig`; the arguments are the kernel's.
        let f: extern "C" fn(c_int, *mut siginfo_t, *mut c_void) =
            unsafe { std::mem::transmute(h.address) };
        f(sig, info, uctx);
    } else {
        // SAFETY: the program installed this address as a sa_handler.
        let f: extern "C" fn(c_int) = unsafe { std::mem::transmute(h.address) };
        f(sig);
    }
    // After the handler: a sleep inside it (a blocking call of its own)
    // starts its own record, which must not erase this one.
    crate::signals::note_ran(sig);
}

/// The kernel's SA_RESETHAND, carried out when the handler is run:
/// SIG_DFL, with the program's flags (as `h` records them) and mask.
fn reset_to_default(sig: c_int, h: Option<table::Handler>) {
    action::reset_if(sig, trampoline_address(), |held| match h {
        Some(h) => program_flags(held as c_int, h) as u32 as libc::c_ulong,
        None => held,
    });
}

/// An exported entry point of the shim ends (hooks!, caller_hooks!,
/// syscall, the atexit handler): the signals deferred in its scopes run
/// now, once nothing of the call is left to drop. One relaxed load while
/// no thread has any (`DEFERRING`).
#[inline]
pub fn flush() {
    if DEFERRING.load(Ordering::Relaxed) == 0 {
        return;
    }
    let bits = PENDING.with(Cell::get);
    if bits != 0 {
        redeliver(bits, true);
    }
}

/// The thread is about to sleep inside a shim call: the record of handlers
/// run starts afresh, and the signals deferred
/// so far are queued again, still blocked. Returns them; the sleep unblocks
/// them in its wait's mask (`guard::Sleep`), so they interrupt it as they
/// would a kernel wait.
pub fn requeue_for_sleep() -> u64 {
    crate::signals::forget_ran();
    let bits = PENDING.with(Cell::get);
    if bits != 0 {
        redeliver(bits, false);
    }
    bits
}

#[cold]
fn redeliver(bits: u64, unblock: bool) {
    PENDING.with(|p| p.set(0));
    DEFERRING.fetch_sub(1, Ordering::Relaxed);
    for sig in 1..=64 {
        if bits & mask::bit(sig) != 0 {
            let info = SAVED.with(|s| {
                // SAFETY: this thread's own array; read before any signal
                // is unblocked, so no trampoline writes it meanwhile.
                unsafe { (*s.get())[sig as usize - 1] }
            });
            // SAFETY: `info` is a siginfo the kernel gave this thread.
            unsafe { mask::requeue(sig, (&info as *const Info).cast()) };
        }
    }
    if unblock {
        mask::unblock(bits);
    }
}

/// The flags the program installed, from those the kernel holds for the
/// trampoline (which always has SA_SIGINFO and never SA_RESETHAND).
pub fn program_flags(kernel: c_int, h: table::Handler) -> c_int {
    let mut f = kernel & !(libc::SA_SIGINFO | libc::SA_RESETHAND);
    if h.siginfo {
        f |= libc::SA_SIGINFO;
    }
    if h.resethand {
        f |= libc::SA_RESETHAND;
    }
    f
}

/// The flags the kernel gets for the trampoline standing in for a handler
/// installed with `program` flags.
pub fn trampoline_flags(program: c_int) -> c_int {
    (program | libc::SA_SIGINFO) & !libc::SA_RESETHAND
}

/// The trampoline's address, as a sigaction's handler field.
pub fn trampoline_address() -> usize {
    trampoline as *const () as usize
}
