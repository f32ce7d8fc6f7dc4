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
/// found what it waited for, halves when the wait had to sleep anyway, but
/// never below an eighth of the maximum: a budget allowed to reach zero can
/// only recover through a hit within a few dozen iterations, so a short
/// hiccup (the peer descheduled once) would lock a busy stream into
/// sleep/wake mode for good. An idle end still sleeps after the floor.
#[derive(Clone, Copy, Debug)]
pub struct SpinBudget {
    max: Duration,
    now: Duration,
}

impl SpinBudget {
    pub fn new(max: Duration) -> Self {
        SpinBudget { max, now: max }
    }

    pub fn current(&self) -> Duration {
        self.now
    }

    fn floor(&self) -> Duration {
        self.max / 8
    }

    /// A spin found what it waited for.
    pub fn hit(&mut self) {
        self.now = (self.now * 2).min(self.max);
    }

    /// The wait had to sleep after all.
    pub fn miss(&mut self) {
        self.now = (self.now / 2).max(self.floor());
    }

    /// Spins until `ready()` or the budget runs out. Returns whether ready
    /// and the number of spin iterations.
    pub fn spin(
        &mut self,
        mut ready: impl FnMut() -> Result<bool, RingError>,
    ) -> Result<(bool, u64), RingError> {
        if self.max.is_zero() {
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
            if iters.is_multiple_of(64) && start.elapsed() >= self.now {
                self.miss();
                return Ok((false, iters));
            }
            std::hint::spin_loop();
        }
    }
}

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
        if rx.prepare_wait()? {
            let woken = bell.wait(None)?;
            rx.finish_wait(woken)?;
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
                let (ready, iters) = spin.spin(|| tx.writable())?;
                tx.note_spins(iters);
                if !ready && tx.prepare_wait()? {
                    let woken = bell.wait(None)?;
                    tx.finish_wait(woken)?;
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
    fn budget_halves_to_a_floor_and_recovers() {
        let mut b = SpinBudget::new(Duration::from_micros(64));
        for _ in 0..40 {
            b.miss();
        }
        assert_eq!(b.current(), Duration::from_micros(8));
        b.hit();
        assert_eq!(b.current(), Duration::from_micros(16));
        for _ in 0..10 {
            b.hit();
        }
        assert_eq!(b.current(), Duration::from_micros(64));
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
