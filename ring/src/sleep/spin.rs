//! Spin-then-sleep: polling wins latency, sleeping wins CPU. A waiter spins
//! for an adaptive budget, then announces it sleeps and blocks on its
//! doorbell.

use crate::error::RingError;
use crate::receiver::Receiver;
use crate::sender::Sender;
use crate::sleep::notify::EventFd;
use crate::transport::Transport;
use std::time::{Duration, Instant};

/// Adaptive spin budget: doubles (up to the configured maximum) when a spin
/// found what it waited for, halves when the wait had to sleep anyway, and
/// drops to zero once halving would take it below an eighth of the
/// maximum: a peer that keeps missing the spin is idle, or not running.
/// A spin that found the waiter descheduled (`late`) drops it to zero at
/// once: the CPU is oversubscribed, and spinning takes it from the very
/// peer, or other work, that the kernel would run while we sleep.
///
/// At zero, every `PROBE_EVERY`-th wait spins the full maximum (`limit`),
/// and a probe that hits restores the maximum: so a stream recovers even
/// when both ends sleep, each end's probe catching the other's answer
/// through its wake-up, until both spin again.
#[derive(Clone, Copy, Debug)]
pub struct SpinBudget {
    max: Duration,
    now: Duration,
    /// Waits at a zero budget since the last probe.
    quiet: u32,
}

/// Waits at a zero budget between two probes.
pub const PROBE_EVERY: u32 = 32;

impl SpinBudget {
    pub fn new(max: Duration) -> Self {
        SpinBudget {
            max,
            now: max,
            quiet: 0,
        }
    }

    pub fn current(&self) -> Duration {
        self.now
    }

    fn floor(&self) -> Duration {
        self.max / 8
    }

    /// How long the next wait may spin: the budget, or at a zero budget
    /// the maximum once every `PROBE_EVERY` waits.
    pub fn limit(&mut self) -> Duration {
        if !self.now.is_zero() {
            return self.now;
        }
        self.quiet += 1;
        if self.quiet >= PROBE_EVERY {
            self.quiet = 0;
            return self.max;
        }
        Duration::ZERO
    }

    /// Whether the next `limit` is more than zero (a budget, or a probe),
    /// without counting a wait.
    pub fn due(&self) -> bool {
        !self.now.is_zero() || self.quiet + 1 >= PROBE_EVERY
    }

    /// A spin found what it waited for, without losing its CPU.
    pub fn hit(&mut self) {
        self.now = if self.now.is_zero() {
            self.max
        } else {
            (self.now * 2).min(self.max)
        };
    }

    /// The wait had to sleep after all.
    pub fn miss(&mut self) {
        let half = self.now / 2;
        self.now = if half < self.floor() {
            Duration::ZERO
        } else {
            half
        };
    }

    /// The spinner lost its CPU while it spun: someone else needed it.
    pub fn late(&mut self) {
        self.now = Duration::ZERO;
        self.quiet = 0;
    }

    /// Spins until `ready()` or the budget runs out. Returns whether ready
    /// and the number of spin iterations.
    pub fn spin(
        &mut self,
        mut ready: impl FnMut() -> Result<bool, RingError>,
    ) -> Result<(bool, u64), RingError> {
        let limit = self.limit();
        if limit.is_zero() {
            return Ok((ready()?, 0));
        }
        let start = Instant::now();
        let mut iters = 0u64;
        loop {
            if ready()? {
                self.hit();
                return Ok((true, iters));
            }
            iters += 1;
            // Reading the clock costs ~20 ns; look at it every 64 turns.
            if iters.is_multiple_of(64) && start.elapsed() >= limit {
                self.miss();
                return Ok((false, iters));
            }
            std::hint::spin_loop();
        }
    }
}

/// How long a blocking helper sleeps when its sleeping flag's placement
/// went unconfirmed (`Receiver::prepare_wait`'s `WouldBlock`) before it
/// looks again: the peer may not know it sleeps, so it may ring no bell.
const UNCONFIRMED_NAP: Duration = Duration::from_millis(10);

/// Reads at least one byte, spinning then sleeping on `bell` (this end's
/// doorbell, the one the sender rings). `Ok(0)` means end of stream.
pub fn recv_blocking<T: Transport>(
    rx: &mut Receiver<T>,
    bell: &EventFd,
    spin: &mut SpinBudget,
    buf: &mut [u8],
) -> Result<usize, RingError> {
    loop {
        match rx.read(buf) {
            Err(RingError::WouldBlock) => {}
            other => return other,
        }
        let (ready, iters) = spin.spin(|| rx.readable())?;
        rx.note_spins(iters);
        if ready {
            continue;
        }
        match rx.prepare_wait() {
            Ok(true) => {
                let woken = bell.wait(None)?;
                rx.finish_wait(woken)?;
            }
            Ok(false) => {}
            Err(RingError::WouldBlock) => {
                let woken = bell.wait(Some(UNCONFIRMED_NAP))?;
                rx.finish_wait(woken)?;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Writes all of `buf`, spinning then sleeping on `bell` while the ring is
/// full, and flushes at the end.
pub fn send_all_blocking<T: Transport>(
    tx: &mut Sender<T>,
    bell: &EventFd,
    spin: &mut SpinBudget,
    mut buf: &[u8],
) -> Result<(), RingError> {
    while !buf.is_empty() {
        match tx.write(buf) {
            Ok(n) => buf = &buf[n..],
            Err(RingError::WouldBlock) => {
                let (ready, iters) = spin.spin(|| tx.write_space())?;
                tx.note_spins(iters);
                if !ready {
                    match tx.prepare_wait() {
                        Ok(true) => {
                            let woken = bell.wait(None)?;
                            tx.finish_wait(woken)?;
                        }
                        Ok(false) => {}
                        Err(RingError::WouldBlock) => {
                            let woken = bell.wait(Some(UNCONFIRMED_NAP))?;
                            tx.finish_wait(woken)?;
                        }
                        Err(e) => return Err(e),
                    }
                }
            }
            Err(e) => return Err(e),
        }
    }
    tx.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn misses_halve_the_budget_to_zero_past_the_floor() {
        let mut b = SpinBudget::new(Duration::from_micros(64));
        for want in [32, 16, 8, 0, 0] {
            b.miss();
            assert_eq!(b.current(), Duration::from_micros(want));
        }
        let mut b = SpinBudget::new(Duration::from_micros(64));
        b.miss();
        b.miss();
        b.hit();
        assert_eq!(b.current(), Duration::from_micros(32));
        for _ in 0..10 {
            b.hit();
        }
        assert_eq!(b.current(), Duration::from_micros(64));
    }

    #[test]
    fn a_zero_budget_probes_and_a_hit_restores_the_maximum() {
        let max = Duration::from_micros(64);
        let mut b = SpinBudget::new(max);
        b.late();
        assert_eq!(b.current(), Duration::ZERO);
        for _ in 1..PROBE_EVERY {
            assert_eq!(b.limit(), Duration::ZERO);
        }
        assert_eq!(b.limit(), max, "every PROBE_EVERY-th wait probes");
        b.miss();
        assert_eq!(b.current(), Duration::ZERO, "a failed probe stays at zero");
        for _ in 1..PROBE_EVERY {
            assert_eq!(b.limit(), Duration::ZERO);
        }
        assert_eq!(b.limit(), max);
        b.hit();
        assert_eq!(b.current(), max, "a probe that hits restores the maximum");
        assert_eq!(b.limit(), max);
    }

    #[test]
    fn due_foretells_the_next_limit_without_counting_a_wait() {
        let max = Duration::from_micros(64);
        let mut b = SpinBudget::new(max);
        assert!(b.due());
        b.late();
        for _ in 0..3 * PROBE_EVERY {
            let due = b.due();
            assert_eq!(due, b.due(), "due counts nothing");
            assert_eq!(due, !b.limit().is_zero());
        }
        b.hit();
        assert!(b.due());
        assert_eq!(b.limit(), max);
    }

    #[test]
    fn zero_budget_never_spins() {
        let mut b = SpinBudget::new(Duration::ZERO);
        let mut calls = 0;
        let (ready, iters) = b
            .spin(|| {
                calls += 1;
                Ok(false)
            })
            .unwrap();
        assert!(!ready);
        assert_eq!((iters, calls), (0, 1));
    }
}
