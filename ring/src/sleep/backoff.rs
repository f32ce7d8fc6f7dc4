//! Polling for a transport completion without starving whoever makes it.
//!
//! An RDMA NIC completes a WRITE in microseconds on its own. A software
//! provider (Soft-RoCE, the CI guest's only device) builds, sends,
//! receives and acknowledges the packets on this machine's CPUs: partly
//! in the poster's system call, partly in softirq, ksoftirqd and kworker
//! context. A waiter that spins without ever giving up its CPU can hold
//! that very work off until the scheduler preempts it, milliseconds
//! later. So a completion wait spins for a few microseconds (all a NIC
//! needs), then yields the CPU on every further turn.

/// Busy turns before the wait starts yielding (about 5-20 µs of
/// `spin_loop` hints on current x86 cores).
pub const SPIN_TURNS: u32 = 256;

/// Longest a sleeper waits for the report of its sleeping flag's WRITE
/// (a round trip: microseconds on a NIC, milliseconds under emulation)
/// before it gives up on having it confirmed (`Receiver::prepare_wait`).
pub const WORD_LIMIT: std::time::Duration = std::time::Duration::from_millis(100);

/// Longest a request of the verbs transport may go unanswered (its send
/// queue full, a zero-copy WRITE of the program's buffer) before the
/// connection is failed.
pub const REQUEST_LIMIT: std::time::Duration = std::time::Duration::from_secs(10);

/// The state of one completion wait: call `relax` (or `relax_within`)
/// once per poll that found nothing.
#[derive(Debug)]
pub struct CompletionWait {
    turns: u32,
    /// Busy turns before the yields start.
    spin_turns: u32,
    /// When the first yield came (`relax_within` measures from it).
    yielding_since: Option<std::time::Instant>,
}

impl Default for CompletionWait {
    fn default() -> Self {
        Self::new()
    }
}

impl CompletionWait {
    pub fn new() -> Self {
        Self::with_spin_turns(SPIN_TURNS)
    }

    /// A wait that starts yielding after `spin_turns` busy turns: for a
    /// poll that is itself expensive enough that `SPIN_TURNS` of them
    /// would hold the CPU far longer than a NIC needs.
    pub fn with_spin_turns(spin_turns: u32) -> Self {
        CompletionWait {
            turns: 0,
            spin_turns,
            yielding_since: None,
        }
    }

    /// `relax`, for a wait that gives up: false once `limit` has passed
    /// since the wait began yielding (the spin turns are not timed, so a
    /// completion a NIC reports at once costs no clock read). A device
    /// completes or fails every request in time, except where the peer's
    /// queue pair is gone and the device raises no error for it
    /// (Soft-RoCE): then only such a bound ends the wait.
    pub fn relax_within(&mut self, limit: std::time::Duration) -> bool {
        if self.turns >= self.spin_turns {
            let since = *self
                .yielding_since
                .get_or_insert_with(std::time::Instant::now);
            if since.elapsed() >= limit {
                return false;
            }
        }
        self.relax();
        true
    }

    /// Between two polls: a spin hint at first, then a yield of the CPU.
    /// Async-signal-safe (a system call at most).
    pub fn relax(&mut self) {
        if self.turns < self.spin_turns {
            self.turns += 1;
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn spins_then_yields() {
        let mut w = CompletionWait::new();
        for _ in 0..SPIN_TURNS {
            w.relax();
        }
        assert_eq!(w.turns, SPIN_TURNS);
        // Past the spin turns it only yields (the count stays put).
        w.relax();
        w.relax();
        assert_eq!(w.turns, SPIN_TURNS);
    }

    #[test]
    fn a_bounded_wait_gives_up_after_its_limit() {
        let mut w = CompletionWait::with_spin_turns(4);
        let limit = std::time::Duration::from_millis(20);
        let start = std::time::Instant::now();
        let mut turns = 0u64;
        while w.relax_within(limit) {
            turns += 1;
        }
        assert!(
            start.elapsed() >= limit,
            "gave up after {:?}",
            start.elapsed()
        );
        assert!(turns > 4, "only {turns} turns before giving up");
        // Once given up it stays given up.
        assert!(!w.relax_within(limit));
    }

    #[test]
    fn fewer_spin_turns_start_yielding_sooner() {
        let mut w = CompletionWait::with_spin_turns(16);
        for _ in 0..40 {
            w.relax();
        }
        assert_eq!(w.turns, 16);
    }
}
