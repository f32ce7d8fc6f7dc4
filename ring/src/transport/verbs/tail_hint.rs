//! A tail carried in a doorbell ring (verbs): the low bits of the sender's
//! new tail in the immediate of the WRITE_WITH_IMM that transmits its
//! slots, instead of a second WRITE of the tail word.
//!
//! Why: a receiver that sleeps is rung with every tail (a standing flag,
//! `crate::sleep::flags`); riding on a tail WRITE, the ring would follow a
//! separate slot WRITE. Each WRITE is a packet and an acknowledgement; for
//! a small message the slots' own WRITE_WITH_IMM carries both the data
//! and the ring, so the message is one packet, as in rsocket.
//!
//! The receiver's end learns that tail when it reaps the ring's receive
//! completion (its doorbell's `drain`, or the check before it looks at the
//! tail) and raises its copy's `local_tail` to it (`apply`). The receiver
//! then loads the tail from its copy as ever, and validates it as ever.
//!
//! Ordering: the device places the WRITE's data before it completes the
//! receive, so the slots are in the copy when the hint is reaped; `apply`
//! is a release read-modify-write of `local_tail` and the receiver's load
//! is an acquire, so a receiver that sees the raised tail sees the slots.
//! The tail word is also written by the peer's device (tails that did not
//! ride a ring): both only ever raise it, a tail is placed before the
//! completion of any later ring, and a compare-exchange never lowers a
//! value the device placed meanwhile. Loom: `tests/loom_tail_hint.rs`.

use crate::sync::{AtomicU64, Ordering};

/// Bits of the tail an immediate carries. Two bits of the 32 are the
/// ring's kind (`IMM_ENDS_STANDING`, and the one that says a tail is
/// carried).
pub const HINT_BITS: u32 = 30;

/// The immediate's field for `tail`.
pub fn encode(tail: u64) -> u32 {
    (tail & mask()) as u32
}

/// The tail `hint` stands for, given `current`, a tail already in the
/// copy: the nearest one at or ahead of it with those low bits, or
/// `current` itself when the hint lies behind it (a ring reaped after a
/// later tail WRITE was placed). The two are never more than a few rings
/// apart (at most 2^20 slots each), far within the 2^29 forward window;
/// a hostile hint gives a tail the receiver's validation rejects.
pub fn decode(current: u64, hint: u32) -> u64 {
    let ahead = (u64::from(hint).wrapping_sub(current)) & mask();
    if ahead < 1 << (HINT_BITS - 1) {
        current + ahead
    } else {
        current
    }
}

/// Raises `local_tail` to the tail `hint` stands for; never lowers it.
/// Returns the tail it holds afterwards.
pub fn apply(local_tail: &AtomicU64, hint: u32) -> u64 {
    let mut cur = local_tail.load(Ordering::Acquire);
    loop {
        let next = decode(cur, hint);
        if next <= cur {
            return cur;
        }
        match local_tail.compare_exchange(cur, next, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return next,
            Err(now) => cur = now,
        }
    }
}

fn mask() -> u64 {
    (1 << HINT_BITS) - 1
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn round_trips_ahead_of_current() {
        for (cur, tail) in [(0, 0), (0, 5), (7, 4096), (1 << 30, (1 << 30) + 3)] {
            assert_eq!(decode(cur, encode(tail)), tail, "{cur} -> {tail}");
        }
        // Across the wrap of the low bits.
        let cur = (3 << 30) - 2;
        assert_eq!(decode(cur, encode(cur + 10)), cur + 10);
    }

    #[test]
    fn hints_behind_current_change_nothing() {
        let cur = 5 << 30;
        assert_eq!(decode(cur, encode(cur - 1)), cur);
        assert_eq!(decode(cur, encode(cur - (1 << 20))), cur);
    }

    #[test]
    fn apply_only_raises() {
        let t = AtomicU64::new(100);
        assert_eq!(apply(&t, encode(90)), 100);
        assert_eq!(t.load(Ordering::Relaxed), 100);
        assert_eq!(apply(&t, encode(164)), 164);
        assert_eq!(t.load(Ordering::Relaxed), 164);
    }

    #[test]
    fn garbage_hints_stay_within_the_window() {
        // Whatever the peer sends, the result is at most 2^29 ahead: the
        // receiver's own check (tail - head <= slots) rejects the rest.
        for hint in [0u32, 1, u32::MAX, 0x3fff_ffff, 0x2000_0000, 0x1fff_ffff] {
            let d = decode(12345, hint);
            assert!(d >= 12345 && d - 12345 < 1 << 29, "{hint:#x} -> {d}");
        }
    }
}
