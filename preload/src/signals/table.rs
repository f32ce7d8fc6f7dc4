//! The program's signal handlers, for the signals whose kernel action is
//! the shim's trampoline (`interpose::defer`).
//!
//! One atomic word per signal holds the handler's address and the two flags
//! the trampoline acts on itself (SA_SIGINFO: how to call the handler;
//! SA_RESETHAND: it resets the action when it runs the handler, not when
//! it defers it). User-space addresses never have the top two bits set on
//! x86-64 or AArch64, so the flags live there and one load reads a
//! consistent handler and flags, from any context, a signal handler's
//! included. A word of 0 means no handler is recorded.
//!
//! Installs of one signal are serialised by a per-signal spin flag, taken
//! only with every signal blocked on the taking thread (`mask::block_all`),
//! so a handler can never interrupt its holder and spin on it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use libc::c_int;

/// Signals 1..=64 (index = signal number - 1).
const SIGNALS: usize = 64;

const SIGINFO_BIT: u64 = 1 << 63;
const RESETHAND_BIT: u64 = 1 << 62;
const ADDRESS: u64 = RESETHAND_BIT - 1;

static WORDS: [AtomicU64; SIGNALS] = [const { AtomicU64::new(0) }; SIGNALS];
static LOCKS: [AtomicBool; SIGNALS] = [const { AtomicBool::new(false) }; SIGNALS];

/// A program handler with the flags the trampoline honours itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Handler {
    /// The address the program gave as sa_handler / sa_sigaction.
    pub address: usize,
    /// Called with (sig, siginfo, ucontext).
    pub siginfo: bool,
    /// Reset to SIG_DFL when the handler is run.
    pub resethand: bool,
}

impl Handler {
    fn word(self) -> u64 {
        let mut w = self.address as u64 & ADDRESS;
        if self.siginfo {
            w |= SIGINFO_BIT;
        }
        if self.resethand {
            w |= RESETHAND_BIT;
        }
        w
    }

    fn from_word(w: u64) -> Option<Handler> {
        (w != 0).then_some(Handler {
            address: (w & ADDRESS) as usize,
            siginfo: w & SIGINFO_BIT != 0,
            resethand: w & RESETHAND_BIT != 0,
        })
    }
}

/// Whether `sig` may be deferred (its handler run through the trampoline).
/// Synchronous faults are handled where they happen (the faulting instruction
/// would fault again); SIGSYS comes from a seccomp filter's trap; 32 and 33
/// are glibc's own (thread cancellation, setxid), never the program's.
pub fn deferrable(sig: c_int) -> bool {
    (1..=SIGNALS as c_int).contains(&sig)
        && !matches!(
            sig,
            libc::SIGSEGV
                | libc::SIGBUS
                | libc::SIGILL
                | libc::SIGFPE
                | libc::SIGTRAP
                | libc::SIGSYS
                | libc::SIGKILL
                | libc::SIGSTOP
                | 32
                | 33
        )
}

fn slot(sig: c_int) -> Option<usize> {
    (1..=SIGNALS as c_int)
        .contains(&sig)
        .then(|| sig as usize - 1)
}

/// The handler recorded for `sig`.
pub fn get(sig: c_int) -> Option<Handler> {
    slot(sig).and_then(|i| Handler::from_word(WORDS[i].load(Ordering::Acquire)))
}

/// Records `h` for `sig`; returns the previous record.
pub fn set(sig: c_int, h: Option<Handler>) -> Option<Handler> {
    let i = slot(sig)?;
    let w = h.map_or(0, Handler::word);
    Handler::from_word(WORDS[i].swap(w, Ordering::AcqRel))
}

/// For SA_RESETHAND: clears the record if it still is `h`. True for the
/// one caller that cleared it (the one that runs the handler).
pub fn take_once(sig: c_int, h: Handler) -> bool {
    slot(sig).is_some_and(|i| {
        WORDS[i]
            .compare_exchange(h.word(), 0, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    })
}

/// Holds the install lock of one signal until dropped.
pub struct Locked(usize);

/// Takes `sig`'s install lock. The caller must have every signal blocked
/// (`mask::block_all`): the holder is then never interrupted on its thread,
/// and other threads wait for one system call at most.
pub fn lock(sig: c_int) -> Option<Locked> {
    let i = slot(sig)?;
    while LOCKS[i]
        .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        std::hint::spin_loop();
    }
    Some(Locked(i))
}

impl Drop for Locked {
    fn drop(&mut self) {
        LOCKS[self.0].store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_round_trip() {
        let h = Handler {
            address: 0x5555_1234_5678,
            siginfo: true,
            resethand: false,
        };
        assert_eq!(Handler::from_word(h.word()), Some(h));
        let g = Handler {
            address: 0x7fff_ffff_fff1,
            siginfo: false,
            resethand: true,
        };
        assert_eq!(Handler::from_word(g.word()), Some(g));
    }

    #[test]
    fn take_once_clears_only_the_same_handler() {
        let sig = libc::SIGRTMIN() + 3;
        let h = Handler {
            address: 0x1000,
            siginfo: false,
            resethand: true,
        };
        set(sig, Some(h));
        let other = Handler {
            address: 0x2000,
            ..h
        };
        assert!(!take_once(sig, other));
        assert!(take_once(sig, h));
        assert!(!take_once(sig, h));
        assert_eq!(get(sig), None);
    }

    #[test]
    fn faults_are_never_deferred() {
        for s in [
            libc::SIGSEGV,
            libc::SIGBUS,
            libc::SIGILL,
            libc::SIGFPE,
            libc::SIGSYS,
        ] {
            assert!(!deferrable(s));
        }
        assert!(deferrable(libc::SIGTERM));
        assert!(deferrable(libc::SIGRTMAX()));
        assert!(!deferrable(0) && !deferrable(65));
    }
}
