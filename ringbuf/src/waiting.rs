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

use crate::sync::{AtomicU64, Ordering};

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
        if v == 0 || v > published {
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
    fn garbage_flags_cannot_panic() {
        let f = AtomicU64::new(u64::MAX);
        assert!(!take_if_unseen(&f, u64::MAX - 1));
        assert!(take_if_unseen(&f, u64::MAX));
        assert_eq!(announce(u64::MAX), u64::MAX);
    }
}
