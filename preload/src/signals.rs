//! Whether a blocking call interrupted by a signal should be restarted.
//!
//! The kernel restarts an interrupted blocking recv/send (without a timeout)
//! when the handler was installed with SA_RESTART, and returns EINTR
//! otherwise. A ring wait sleeps in ppoll, which is never restarted. The
//! handlers that interrupted it ran through the shim's trampoline, which
//! records them per thread (`note_ran`): after an EINTR the call
//! restarts if each of those has SA_RESTART, as the kernel decides per
//! handler. A handler the trampoline did not run (installed with a raw
//! system call) leaves no record; then every caught signal is asked, and
//! one without SA_RESTART makes the answer EINTR, the safe one (the
//! program may be waiting for exactly that interruption).
//!
//! Below it: the program's handlers as the trampoline sees them (`table`)
//! the thread's mask (`mask`) and the kernel's action (`action`), for signal deferral (interpose/defer.rs).

pub mod action;
pub mod mask;
pub mod table;

use std::cell::Cell;

thread_local! {
    /// Signals whose program handler ran on this thread since its latest
    /// sleep in a shim call began (bit sig-1): what interrupted that sleep.
    static RAN: Cell<u64> = const { Cell::new(0) };
}

/// The trampoline ran the program's handler for `sig` on this thread.
pub fn note_ran(sig: libc::c_int) {
    RAN.with(|r| r.set(r.get() | mask::bit(sig)));
}

/// This thread is about to sleep in a shim call: what interrupts the sleep
/// is recorded afresh.
pub fn forget_ran() {
    RAN.with(|r| r.set(0));
}

/// True if a blocking socket call interrupted by a signal should restart.
/// Calls with SO_RCVTIMEO/SO_SNDTIMEO never restart (signal(7)).
pub fn restart_allowed(has_timeout: bool) -> bool {
    if has_timeout {
        return false;
    }
    let ran = RAN.with(Cell::get);
    for sig in 1..=libc::SIGRTMAX() {
        if sig == libc::SIGKILL || sig == libc::SIGSTOP {
            continue;
        }
        if ran != 0 && ran & mask::bit(sig) == 0 {
            continue;
        }
        // SAFETY: zeroed sigaction is a valid out-parameter.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: querying only (act = NULL); glibc's sigaction is not
        // interposed and converts from the kernel's layout for us.
        let rc = unsafe { libc::sigaction(sig, std::ptr::null(), &mut old) };
        if rc != 0 {
            continue;
        }
        let h = old.sa_sigaction;
        let caught = h != libc::SIG_DFL && h != libc::SIG_IGN;
        if caught && old.sa_flags & libc::SA_RESTART == 0 {
            return false;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_never_restart() {
        assert!(!restart_allowed(true));
    }
}
