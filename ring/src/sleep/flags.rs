//! The "I sleep" flags: `rx_waiting` (a receiver waits for data) and
//! `tx_waiting` (a sender waits for space).
//!
//! A waiter announces its sleep with the position it last saw, plus one
//! (0 means "not waiting"): the receiver the tail, the sender the head.
//! The other end, after it made a new position visible, kicks only a
//! waiter that has not seen that position. Without the position a flag
//! written *after* the waiter consumed a tail (it then sleeps for the next
//! one) looks the same as one written before, and the check that runs
//! when the tail's WRITE completes (verbs) would wake it for nothing:
//! in a ping-pong that doubled every wakeup. The no-lost-wakeup argument
//! is unchanged: a waiter that missed position P saw less than P, so its
//! flag says so and it is kicked.
//!
//! The flag lives in the checking end's copy and the waiter may rewrite
//! it at any time (a new sleep), so it is cleared with a compare-exchange
//! on the value that was judged.
//!
//! # Standing flags (verbs receivers)
//!
//! On verbs every announcement costs the receiver a WRITE and a wait for
//! its acknowledgement (a network round trip) before it may sleep, and a
//! second WRITE to clear it on waking. A receiver whose peer supports it
//! announces a *standing* flag instead (`announce_standing`: the top bit
//! and an epoch): the sender then rings the doorbell with every tail it
//! publishes and leaves the flag set, so later sleeps of the receiver
//! need no WRITE at all (a tail that misses its look at the ring is
//! followed by its own ring). Every ring consumes one of the receiver's
//! posted receives, so a standing flag is good for `STANDING_KICKS` rings
//! only: the sender clears it with the last one and says so in that
//! ring (`Ring::EndsStanding(epoch)`, carried in the immediate). A
//! receiver that reaped that ring announces anew before its next sleep;
//! one that has not reaped it yet will be woken by it.

use crate::sync::{AtomicU64, Ordering};

/// Top bit of a standing flag; the low 31 bits carry its epoch.
pub const STANDING: u64 = 1 << 63;

/// Rings a sender gives one standing flag (the last clears it). Small
/// next to the receive queue (64 receives) that these rings consume.
pub const STANDING_KICKS: u32 = 16;

/// Epochs are 31-bit and never 0.
const EPOCH_MASK: u32 = 0x7fff_ffff;

/// What a doorbell ring tells the woken end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ring {
    /// Something it waits for is there.
    Plain,
    /// As `Plain`, and the standing flag of this epoch is cleared: the
    /// receiver must announce again before it sleeps.
    EndsStanding(u32),
}

/// The flag value of a standing announcement.
pub fn announce_standing(epoch: u32) -> u64 {
    STANDING | u64::from(epoch & EPOCH_MASK)
}

/// The epoch after `epoch` (31 bits, never 0).
pub fn next_epoch(epoch: u32) -> u32 {
    (epoch & EPOCH_MASK) % EPOCH_MASK + 1
}

/// A sender's count of the rings it gave the current standing flag.
#[derive(Clone, Copy, Debug, Default)]
pub struct StandingKicks {
    epoch: u32,
    rings: u32,
}

impl StandingKicks {
    /// A count that already gave `rings` rings to the flag of `epoch`
    /// (for the models: the budget is spent without the rings).
    #[cfg(loom)]
    pub fn after(epoch: u32, rings: u32) -> Self {
        StandingKicks {
            epoch: epoch & EPOCH_MASK,
            rings,
        }
    }
}

/// After `published` is visible to the receiver (or carried by the ring
/// itself): the ring it is owed, if any. A one-shot flag is judged and
/// cleared as `take_if_unseen` does; a standing flag is owed a ring for
/// every tail, and its `STANDING_KICKS`-th ring clears it and ends it.
pub fn take_for_tail(flag: &AtomicU64, published: u64, count: &mut StandingKicks) -> Option<Ring> {
    let mut v = flag.load(Ordering::Relaxed);
    loop {
        if v & STANDING == 0 {
            return take_if_unseen(flag, published).then_some(Ring::Plain);
        }
        let epoch = (v as u32) & EPOCH_MASK;
        if count.epoch != epoch {
            *count = StandingKicks { epoch, rings: 0 };
        }
        if count.rings + 1 < STANDING_KICKS {
            count.rings += 1;
            return Some(Ring::Plain);
        }
        match flag.compare_exchange(v, 0, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => {
                count.rings = STANDING_KICKS;
                return Some(Ring::EndsStanding(epoch));
            }
            Err(now) => v = now,
        }
    }
}

/// A wakeup check with no budget to spend (the transport's own, after a
/// switch back from pull): rings a standing flag without clearing or
/// counting it, else as `take_if_unseen`. One ring beyond the budget is
/// within the receive queue's margin.
#[cfg(any(feature = "verbs", test))]
pub fn take_or_ring_standing(flag: &AtomicU64, published: u64) -> bool {
    if flag.load(Ordering::Relaxed) & STANDING != 0 {
        return true;
    }
    take_if_unseen(flag, published)
}

/// The flag value announcing a sleep after seeing position `seen`.
pub fn announce(seen: u64) -> u64 {
    seen.saturating_add(1)
}

/// After `published` is visible to the waiter: clears the flag and
/// returns true if the waiter sleeps without having seen `published` (it
/// must be kicked). A peer-written value is only compared, never trusted
/// further: garbage can only cost that peer its own wakeup.
pub fn take_if_unseen(flag: &AtomicU64, published: u64) -> bool {
    let mut v = flag.load(Ordering::Relaxed);
    loop {
        // A standing value is never taken here (`take_for_tail`).
        if v == 0 || v & STANDING != 0 || v > published {
            return false;
        }
        match flag.compare_exchange(v, 0, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return true,
            Err(now) => v = now,
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn kicks_only_a_waiter_that_missed_the_position() {
        let f = AtomicU64::new(0);
        assert!(!take_if_unseen(&f, 5), "nobody waits");
        f.store(announce(4), Ordering::Relaxed);
        assert!(!take_if_unseen(&f, 4), "it saw 4 already");
        assert_eq!(f.load(Ordering::Relaxed), 5, "a flag not taken stays");
        assert!(take_if_unseen(&f, 5), "it saw 4, 5 is new");
        assert_eq!(f.load(Ordering::Relaxed), 0, "taken flags are cleared");
        assert!(!take_if_unseen(&f, 6), "one kick per sleep");
    }

    #[test]
    fn old_style_flag_one_means_saw_nothing() {
        let f = AtomicU64::new(1);
        assert!(take_if_unseen(&f, 1));
    }

    #[test]
    fn standing_flag_rings_every_tail_until_its_budget_ends() {
        let f = AtomicU64::new(announce_standing(7));
        let mut c = StandingKicks::default();
        for tail in 1..STANDING_KICKS as u64 {
            assert_eq!(take_for_tail(&f, tail, &mut c), Some(Ring::Plain));
            assert_eq!(f.load(Ordering::Relaxed), announce_standing(7), "stays");
        }
        assert_eq!(
            take_for_tail(&f, 99, &mut c),
            Some(Ring::EndsStanding(7)),
            "the last ring of the budget ends it"
        );
        assert_eq!(f.load(Ordering::Relaxed), 0);
        assert_eq!(take_for_tail(&f, 100, &mut c), None);
        // A new epoch gets a new budget.
        f.store(announce_standing(next_epoch(7)), Ordering::Relaxed);
        assert_eq!(take_for_tail(&f, 101, &mut c), Some(Ring::Plain));
    }

    #[test]
    fn one_shot_flags_keep_their_rules_under_take_for_tail() {
        let f = AtomicU64::new(announce(4));
        let mut c = StandingKicks::default();
        assert_eq!(take_for_tail(&f, 4, &mut c), None);
        assert_eq!(take_for_tail(&f, 5, &mut c), Some(Ring::Plain));
        assert_eq!(f.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn standing_flags_are_never_taken_by_the_one_shot_check() {
        let f = AtomicU64::new(announce_standing(1));
        assert!(!take_if_unseen(&f, u64::MAX - 1));
        assert!(take_or_ring_standing(&f, 3));
        assert_eq!(
            f.load(Ordering::Relaxed),
            announce_standing(1),
            "not cleared"
        );
    }

    #[test]
    fn epochs_wrap_within_31_bits_and_skip_zero() {
        assert_eq!(next_epoch(1), 2);
        assert_eq!(next_epoch(0x7fff_fffe), 0x7fff_ffff);
        assert_eq!(next_epoch(0x7fff_ffff), 1);
        assert_eq!(next_epoch(u32::MAX), 1);
        assert_eq!(announce_standing(u32::MAX), STANDING | 0x7fff_ffff);
    }

    #[test]
    fn garbage_flags_cannot_panic() {
        let f = AtomicU64::new(STANDING - 1);
        assert!(!take_if_unseen(&f, STANDING - 2));
        assert!(take_if_unseen(&f, STANDING - 1));
        let f = AtomicU64::new(u64::MAX);
        assert!(!take_if_unseen(&f, u64::MAX));
        let mut c = StandingKicks::default();
        assert_eq!(take_for_tail(&f, 1, &mut c), Some(Ring::Plain));
        assert_eq!(announce(u64::MAX), u64::MAX);
    }
}
