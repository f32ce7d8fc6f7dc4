//! Whether a blocking call interrupted by a signal should be restarted.
//!
//! The kernel restarts an interrupted blocking recv/send (without a timeout)
//! when the handler was installed with SA_RESTART, and returns EINTR
//! otherwise. A ring wait sleeps in ppoll, which is never restarted, and
//! does not learn which signal arrived. So, after an EINTR, the dispatcher
//! asks the kernel about every caught signal: if all of their handlers have
//! SA_RESTART, restarting is what the kernel would have done; if any lacks
//! it, EINTR is the safe answer (the program may be waiting for exactly that
//! interruption). Runs only after an EINTR, so its ~64 syscalls are rare.
//!
//! Below it: the program's handlers as the trampoline sees them (`table`)
//! the thread's mask (`mask`) and the kernel's action (`action`), for signal deferral (interpose/defer.rs).

pub mod action;
pub mod mask;
pub mod table;

/// True if a blocking socket call interrupted by a signal should restart.
/// Calls with SO_RCVTIMEO/SO_SNDTIMEO never restart (signal(7)).
pub fn restart_allowed(has_timeout: bool) -> bool {
    if has_timeout {
        return false;
    }
    for sig in 1..=libc::SIGRTMAX() {
        if sig == libc::SIGKILL || sig == libc::SIGSTOP {
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
