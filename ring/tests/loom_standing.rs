//! Loom model of *standing* sleep flags (`ringsock_ring::sleep::flags`, verbs
//! receivers): once a standing flag is placed in the sender's memory the
//! receiver sleeps again and again without announcing, and the sender
//! rings the doorbell with every tail until the flag's budget is spent; the
//! last ring clears the flag and says so (`Ring::EndsStanding`), and a
//! receiver that reaped it announces anew before its next sleep.
//!
//! The memory accesses are modelled as in `loom_early_kick.rs`:
//!
//! - the receiver's flag WRITE is placed in the sender's memory (a swap,
//!   for the reason given there) and it goes on only once it is placed;
//! - the sender's NIC is synchronous here: a tail is placed, then its ring
//!   (if it carries one) arrives, in the sender's thread. The receiver
//!   still interleaves with every step; what a separate NIC thread adds
//!   (the sender going on before its tail is placed) is the early kick's
//!   case, modelled in `loom_early_kick.rs`, and the standing rules do not
//!   change it: every check reads the flag in the sender's own memory;
//! - the doorbell is a counter of rings arrived plus the epoch of the
//!   last ending ring; `Doorbell::drain` arms (notes the count) and reaps
//!   (learns the ending) before `prepare_wait` looks at the tail, and a
//!   sleep ends iff a ring arrives after the arm.
//!
//! The receiver sleeps until it has seen the last tail; a sleep that no
//! ring ends after the sender finished is a lost wakeup. The models start
//! with the budget nearly or fully spent, so the flag ends during the
//! run, and with no flag at all; the `should_panic` variant ignores the
//! ending ring (never announces again) and must lose a wakeup.
//!
//! Run: `RUSTFLAGS="--cfg loom" cargo test -p ringsock-ring --test loom_standing --release --no-default-features`

#![cfg(loom)]

mod loom_support;

use loom::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, Ordering};
use loom::sync::Arc;
use loom::thread;
use loom_support::model;
use ringsock_ring::sleep::flags::{
    announce_standing, next_epoch, take_for_tail, Ring, StandingKicks, STANDING_KICKS,
};

/// The sender publishes tails 1..=LAST.
const LAST: u64 = 2;

struct Mem {
    // Sender copy.
    rx_waiting: AtomicU64,
    // Receiver copy.
    local_tail: AtomicU64,
    // The receiver's doorbell: rings arrived, epoch of the last ending
    // ring arrived (0: none).
    rings: AtomicU64,
    ended: AtomicU32,
    sender_done: AtomicBool,
}

/// A ring arriving at the receiver's doorbell (after what it follows).
fn ring_arrives(m: &Mem, ring: Ring) {
    if let Ring::EndsStanding(e) = ring {
        m.ended.store(e, Ordering::SeqCst);
    }
    m.rings.fetch_add(1, Ordering::SeqCst);
}

/// `Sender::sync_tail` with the early ring, then at the completion
/// `tail_visible`, with the real flag rules (`take_for_tail`).
fn sender(m: &Mem, mut count: StandingKicks) {
    for tail in 1..=LAST {
        let early = take_for_tail(&m.rx_waiting, tail, &mut count);
        m.local_tail.store(tail, Ordering::SeqCst);
        if let Some(ring) = early {
            ring_arrives(m, ring);
            continue;
        }
        // Completed: fence, then the check.
        fence(Ordering::SeqCst);
        if let Some(ring) = take_for_tail(&m.rx_waiting, tail, &mut count) {
            ring_arrives(m, ring);
        }
    }
    m.sender_done.store(true, Ordering::SeqCst);
}

#[derive(Clone, Copy)]
struct Start {
    /// The receiver's standing flag of epoch 1 is placed (else no flag).
    standing: bool,
    /// Rings the sender already gave it.
    spent: u32,
    /// The receiver honours ending rings (the sound rule).
    honours_end: bool,
}

/// Returns whether a wakeup was lost.
fn receiver(m: &Mem, start: Start) -> bool {
    let mut standing = start.standing.then_some(1u32);
    let mut epoch = 1u32;
    loop {
        // `Doorbell::drain`: reap, arm.
        let armed = m.rings.load(Ordering::SeqCst);
        let ended = m.ended.load(Ordering::SeqCst);
        // `prepare_wait`.
        if start.honours_end && standing == Some(ended) {
            standing = None;
        }
        if standing.is_none() {
            // R1, R2: placed before going on.
            epoch = next_epoch(epoch);
            m.rx_waiting
                .swap(announce_standing(epoch), Ordering::SeqCst);
            standing = Some(epoch);
        }
        fence(Ordering::SeqCst);
        if m.local_tail.load(Ordering::SeqCst) == LAST {
            return false;
        }
        // Sleep until a ring arrives after the arm.
        loop {
            if m.rings.load(Ordering::SeqCst) > armed {
                break;
            }
            if m.sender_done.load(Ordering::SeqCst) && m.rings.load(Ordering::SeqCst) == armed {
                // It missed the last tail at its look, and nothing will
                // ever ring again.
                return true;
            }
            thread::yield_now();
        }
    }
}

fn run(start: Start) {
    model(move || {
        let flag = if start.standing {
            announce_standing(1)
        } else {
            0
        };
        let m = Arc::new(Mem {
            rx_waiting: AtomicU64::new(flag),
            local_tail: AtomicU64::new(0),
            rings: AtomicU64::new(0),
            ended: AtomicU32::new(0),
            sender_done: AtomicBool::new(false),
        });
        let s = {
            let m = m.clone();
            let count = StandingKicks::after(1, start.spent);
            thread::spawn(move || sender(&m, count))
        };
        let lost = receiver(&m, start);
        s.join().unwrap();
        assert!(
            !lost,
            "lost wakeup: the receiver sleeps before the last tail and no ring reaches it"
        );
    });
}

const SOUND: Start = Start {
    standing: true,
    spent: 0,
    honours_end: true,
};

#[test]
fn standing_flag_with_budget_to_spare() {
    run(SOUND);
}

#[test]
fn standing_flag_ends_with_the_last_tail() {
    run(Start {
        spent: STANDING_KICKS - 2,
        ..SOUND
    });
}

#[test]
fn standing_flag_ends_with_the_first_tail() {
    run(Start {
        spent: STANDING_KICKS - 1,
        ..SOUND
    });
}

#[test]
fn first_announcement_from_no_flag() {
    run(Start {
        standing: false,
        ..SOUND
    });
}

#[test]
#[should_panic(expected = "lost wakeup")]
fn ignoring_the_ending_ring_loses_wakeups() {
    run(Start {
        spent: STANDING_KICKS - 1,
        honours_end: false,
        ..SOUND
    });
}
