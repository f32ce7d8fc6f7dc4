//! Pull mode (the remote-fetching paradigm of RFP / RF-RPC, Su et al.,
//! EuroSys 2017): the receiver of a ring fetches the data with one-sided
//! RDMA READs instead of the sender pushing it with WRITEs, so a busy
//! sender (a server answering many clients) posts almost nothing for its
//! replies and its NIC serves the READs without its CPU.
//!
//! This file holds the parts that need no device: the knobs, the
//! process-wide load meter, the sender's mode decision, the mode word and
//! where the pull words sit in a control page. The verbs glue (READ posts,
//! the switch sequences) is `conn`'s child `pull_io`. The protocol
//! and why it loses no byte and no wakeup: the module documentation of
//! `transport::verbs` ("Pull mode").

use crate::layout::{RingControl, CONTROL_BYTES};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Offset of the pull words inside a ring's control page, past the
/// `RingControl` block (both copies have the same layout; each side uses
/// its own words).
pub const PULL_WORDS: usize = 2048;
/// Sender copy: the published tail ("pub_tail"), stored by the sender
/// after the slots are in its copy. The receiver READs it in pull mode.
pub const PUB_TAIL: usize = PULL_WORDS;
/// Receiver copy: the mode word, WRITten by the sender (`mode_word`).
pub const MODE_WORD: usize = PULL_WORDS + 64;
/// Receiver copy: where the receiver's READ of `PUB_TAIL` lands.
pub const SCRATCH: usize = PULL_WORDS + 128;
const _: () = {
    assert!(std::mem::size_of::<RingControl>() <= PULL_WORDS);
    assert!(SCRATCH + 8 <= CONTROL_BYTES);
};

/// Offset of `PullCounters` in a region's header page (outside the memory
/// registration, like the other counters), past the `VerbsHeader`.
pub const COUNTERS_IN_HEADER: usize = 2048;
const _: () = assert!(std::mem::size_of::<super::stats::VerbsHeader>() <= COUNTERS_IN_HEADER);

/// The mode word the sender WRITEs into the receiver's copy: 0 = never
/// switched (push), else `switch sequence << 1 | pull`. The sequence makes
/// every switch a new value, so a receiver that read a word once never
/// mistakes a later one for it.
pub fn mode_word(seq: u64, pull: bool) -> u64 {
    (seq << 1) | u64::from(pull)
}

/// Whether a mode word says "pull".
pub fn word_is_pull(w: u64) -> bool {
    w & 1 == 1
}

/// When a sender pulls (`PullKnobs::mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModeKnob {
    /// Always push (the sender WRITEs slots and tail): the default.
    Push,
    /// Always pull, from the first publish on.
    Pull,
    /// Pull while this process publishes more than `high` tails per
    /// second, push again below `low` (hysteresis, `dwell` between
    /// switches).
    Adaptive,
}

/// The pull-mode knobs a connection end's sender follows, given to
/// `VerbsConn::new`. The default always pushes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PullKnobs {
    pub mode: ModeKnob,
    /// Publishes per second (all verbs rings of the process) at or above
    /// which an adaptive sender switches to pull.
    pub high: u64,
    /// At or below which it switches back to push.
    pub low: u64,
    /// The rate's measuring window.
    pub window: Duration,
    /// Least time between two switches of a ring (also from the ring's
    /// creation to its first switch).
    pub dwell: Duration,
}

impl Default for PullKnobs {
    fn default() -> Self {
        PullKnobs {
            mode: ModeKnob::Push,
            high: 100_000,
            low: 50_000,
            window: Duration::from_millis(1),
            dwell: Duration::from_millis(10),
        }
    }
}

/// Nanoseconds on a process-wide monotonic clock.
pub fn now_ns() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// The responder's load as RFP sees it: how fast this process publishes
/// (tails, i.e. messages, over all its verbs rings). Publishes rather than
/// posted work requests: a sender in pull mode posts (almost) none, so a
/// rate of posts would drop as soon as it switched and flip it back (an
/// oscillation); a publish happens in both modes alike.
pub struct LoadMeter {
    publishes: AtomicU64,
    window_start: AtomicU64,
    window_base: AtomicU64,
    rate: AtomicU64,
}

impl Default for LoadMeter {
    fn default() -> Self {
        LoadMeter::new()
    }
}

impl LoadMeter {
    pub const fn new() -> LoadMeter {
        LoadMeter {
            publishes: AtomicU64::new(0),
            window_start: AtomicU64::new(0),
            window_base: AtomicU64::new(0),
            rate: AtomicU64::new(0),
        }
    }

    /// The process's meter.
    pub fn global() -> &'static LoadMeter {
        static M: LoadMeter = LoadMeter::new();
        &M
    }

    /// Counts one publish at `now` (ns); returns the rate (per second) of
    /// the last completed window. The thread that closes a window computes
    /// its rate; a window closed after idleness averages over the idle
    /// time too, so a quiet process reads as unloaded at once.
    pub fn note(&self, now: u64, window: Duration) -> u64 {
        let n = self.publishes.fetch_add(1, Ordering::Relaxed) + 1;
        let start = self.window_start.load(Ordering::Relaxed);
        let span = now.saturating_sub(start);
        if span >= window.as_nanos() as u64
            && self
                .window_start
                .compare_exchange(start, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            let base = self.window_base.swap(n, Ordering::Relaxed);
            let rate = (n.saturating_sub(base) as u128 * 1_000_000_000 / span.max(1) as u128)
                .min(u64::MAX as u128) as u64;
            self.rate.store(rate, Ordering::Relaxed);
        }
        self.rate.load(Ordering::Relaxed)
    }
}

/// One sender's mode and when it last switched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TxMode {
    pub pull: bool,
    /// Switches so far (the mode word carries it).
    pub seq: u64,
    pub last_switch: u64,
}

impl TxMode {
    /// A ring created at `now` starts in push.
    pub fn new(now: u64) -> TxMode {
        TxMode {
            pull: false,
            seq: 0,
            last_switch: now,
        }
    }

    /// Whether to switch now (`Some(true)`: to pull, `Some(false)`: to
    /// push), given the knobs, the process's publish rate and whether a
    /// switch to pull may happen now (`pull_ok`: the previous switch back
    /// to push has fully landed, see `conn::pull_io`).
    pub fn decide(&self, k: &PullKnobs, rate: u64, now: u64, pull_ok: bool) -> Option<bool> {
        let want = match k.mode {
            ModeKnob::Push => false,
            ModeKnob::Pull => true,
            ModeKnob::Adaptive => {
                if now.saturating_sub(self.last_switch) < k.dwell.as_nanos() as u64 {
                    return None;
                }
                if self.pull {
                    rate > k.low
                } else {
                    rate >= k.high
                }
            }
        };
        (want != self.pull && (!want || pull_ok)).then_some(want)
    }

    /// Records a switch; returns the mode word to send.
    pub fn switch(&mut self, pull: bool, now: u64) -> u64 {
        self.pull = pull;
        self.seq += 1;
        self.last_switch = now;
        mode_word(self.seq, pull)
    }
}

/// Pull-mode counters of one connection end, in its region's header page
/// at `COUNTERS_IN_HEADER`. `ringsock-ctl status` reads them at
/// `stats::offsets::PULL_*` (checked against this struct below).
#[repr(C)]
#[derive(Default)]
pub struct PullCounters {
    /// Switches of our outgoing ring (written by its sender).
    pub tx_to_pull: AtomicU64,
    pub tx_to_push: AtomicU64,
    /// Mode words seen by the receiver of our incoming ring.
    pub rx_to_pull: AtomicU64,
    pub rx_to_push: AtomicU64,
    /// READs posted by the receiver (tail READs, slot READs) and the slot
    /// bytes they fetched.
    pub tail_reads: AtomicU64,
    pub slot_reads: AtomicU64,
    pub read_bytes: AtomicU64,
    /// Slot WRITEs a switch back to push re-sent (the catch-up).
    pub catchup_writes: AtomicU64,
}

// The reader's offsets (`stats`, built without this module) are
// those of this struct at `COUNTERS_IN_HEADER`.
const _: () = {
    use super::stats::{offsets as o, PULL_COUNTERS_AT};
    use std::mem::offset_of;
    const AT: usize = COUNTERS_IN_HEADER;
    assert!(AT == PULL_COUNTERS_AT);
    assert!(o::PULL_TX_TO_PULL == AT + offset_of!(PullCounters, tx_to_pull));
    assert!(o::PULL_TX_TO_PUSH == AT + offset_of!(PullCounters, tx_to_push));
    assert!(o::PULL_RX_TO_PULL == AT + offset_of!(PullCounters, rx_to_pull));
    assert!(o::PULL_RX_TO_PUSH == AT + offset_of!(PullCounters, rx_to_push));
    assert!(o::PULL_TAIL_READS == AT + offset_of!(PullCounters, tail_reads));
    assert!(o::PULL_SLOT_READS == AT + offset_of!(PullCounters, slot_reads));
    assert!(o::PULL_READ_BYTES == AT + offset_of!(PullCounters, read_bytes));
    assert!(o::PULL_CATCHUP_WRITES == AT + offset_of!(PullCounters, catchup_writes));
    assert!(std::mem::size_of::<PullCounters>() == 64);
};

/// A plain copy of `PullCounters`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PullStats {
    pub tx_to_pull: u64,
    pub tx_to_push: u64,
    pub rx_to_pull: u64,
    pub rx_to_push: u64,
    pub tail_reads: u64,
    pub slot_reads: u64,
    pub read_bytes: u64,
    pub catchup_writes: u64,
}

impl PullCounters {
    pub fn snapshot(&self) -> PullStats {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        PullStats {
            tx_to_pull: l(&self.tx_to_pull),
            tx_to_push: l(&self.tx_to_push),
            rx_to_pull: l(&self.rx_to_pull),
            rx_to_push: l(&self.rx_to_push),
            tail_reads: l(&self.tail_reads),
            slot_reads: l(&self.slot_reads),
            read_bytes: l(&self.read_bytes),
            catchup_writes: l(&self.catchup_writes),
        }
    }
}

/// The slot ranges (ring-relative first, count) covering absolute slots
/// `[from, to)` of a ring of `slots`, split where it wraps. `to - from`
/// must be at most `slots`.
pub fn ranges(from: u64, to: u64, slots: u64) -> impl Iterator<Item = (u64, u64)> {
    let mut pos = from;
    std::iter::from_fn(move || {
        if pos >= to {
            return None;
        }
        let first = pos % slots;
        let count = (to - pos).min(slots - first);
        pos += count;
        Some((first, count))
    })
}

/// Where a switch back to push starts re-sending: the receiver may not
/// have fetched anything past its pushed head (`head`, untrusted: clamped
/// into the window the ring can hold), and every slot of
/// `[start, esc)` still holds the data of that absolute slot.
pub fn catchup_start(head: u64, esc: u64, slots: u64) -> u64 {
    head.clamp(esc.saturating_sub(slots), esc)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mode_words_are_distinct_per_switch() {
        assert!(!word_is_pull(0));
        let mut m = TxMode::new(0);
        let mut seen = vec![0];
        for i in 0..6 {
            let w = m.switch(i % 2 == 0, i);
            assert_eq!(word_is_pull(w), i % 2 == 0);
            assert!(!seen.contains(&w));
            seen.push(w);
        }
    }

    fn knobs(mode: ModeKnob) -> PullKnobs {
        PullKnobs {
            mode,
            high: 100,
            low: 50,
            window: Duration::from_millis(1),
            dwell: Duration::from_millis(10),
        }
    }

    #[test]
    fn forced_modes() {
        let m = TxMode::new(0);
        assert_eq!(m.decide(&knobs(ModeKnob::Push), 1 << 30, 0, true), None);
        assert_eq!(m.decide(&knobs(ModeKnob::Pull), 0, 0, true), Some(true));
        // Not before the previous switch back landed.
        assert_eq!(m.decide(&knobs(ModeKnob::Pull), 0, 0, false), None);
        let mut p = m;
        p.switch(true, 0);
        assert_eq!(p.decide(&knobs(ModeKnob::Pull), 0, 0, true), None);
        assert_eq!(p.decide(&knobs(ModeKnob::Push), 0, 0, true), Some(false));
    }

    #[test]
    fn adaptive_hysteresis_and_dwell() {
        let k = knobs(ModeKnob::Adaptive);
        let ms = 1_000_000;
        let mut m = TxMode::new(0);
        // Dwell from creation.
        assert_eq!(m.decide(&k, 1000, 5 * ms, true), None);
        assert_eq!(m.decide(&k, 99, 20 * ms, true), None);
        assert_eq!(m.decide(&k, 100, 20 * ms, true), Some(true));
        m.switch(true, 20 * ms);
        // Between the thresholds: stay.
        assert_eq!(m.decide(&k, 51, 40 * ms, true), None);
        // Below low, but within the dwell: stay.
        assert_eq!(m.decide(&k, 10, 25 * ms, true), None);
        assert_eq!(m.decide(&k, 50, 40 * ms, true), Some(false));
        m.switch(false, 40 * ms);
        assert_eq!(m.decide(&k, 60, 60 * ms, true), None);
        assert_eq!(m.decide(&k, 500, 60 * ms, false), None);
        assert_eq!(m.decide(&k, 500, 60 * ms, true), Some(true));
    }

    #[test]
    fn meter_measures_a_window() {
        let m = LoadMeter::new();
        let w = Duration::from_millis(1);
        // 100 publishes in the first millisecond.
        for i in 0..100u64 {
            m.note(i * 10_000, w);
        }
        // Window closes at 1 ms: 101 publishes over 1 ms.
        let r = m.note(1_000_000, w);
        assert_eq!(r, 101_000);
        // Quiet for a second: the next publish reads as unloaded.
        let r = m.note(1_001_000_000, w);
        assert!(r <= 1, "{r}");
    }

    #[test]
    fn ranges_split_at_the_wrap() {
        let v: Vec<_> = ranges(6, 11, 8).collect();
        assert_eq!(v, vec![(6, 2), (0, 3)]);
        assert_eq!(ranges(5, 5, 8).count(), 0);
        let v: Vec<_> = ranges(16, 24, 8).collect();
        assert_eq!(v, vec![(0, 8)]);
    }

    #[test]
    fn catchup_start_is_clamped_to_the_ring() {
        assert_eq!(catchup_start(10, 12, 8), 10);
        // A head past what was sent (hostile): nothing to resend.
        assert_eq!(catchup_start(99, 12, 8), 12);
        // A head too far behind (hostile or stale): one ring at most.
        assert_eq!(catchup_start(0, 20, 8), 12);
    }

    proptest::proptest! {
        /// Whatever the rates and times, a decision only ever flips the
        /// mode, never to pull when that is not allowed, and adaptive
        /// switches never come closer than the dwell.
        #[test]
        fn decisions_respect_dwell(steps in proptest::collection::vec((0u64..300, 0u64..5_000_000, proptest::bool::ANY), 1..60)) {
            let k = knobs(ModeKnob::Adaptive);
            let mut m = TxMode::new(0);
            let mut now = 0;
            for (rate, dt, ok) in steps {
                now += dt;
                let before = m;
                if let Some(p) = m.decide(&k, rate, now, ok) {
                    proptest::prop_assert_ne!(p, before.pull);
                    proptest::prop_assert!(!p || ok);
                    proptest::prop_assert!(now - before.last_switch >= k.dwell.as_nanos() as u64);
                    let crossed = if p { rate >= k.high } else { rate <= k.low };
                    proptest::prop_assert!(crossed);
                    m.switch(p, now);
                }
            }
        }
    }
}
