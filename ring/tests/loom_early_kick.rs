//! Loom model of the verbs *early kick* (`Sender::sync_tail`): a sender
//! that already sees the receiver's "I sleep" flag when it publishes a
//! tail clears the flag and sends the doorbell with the tail itself (one
//! WRITE_WITH_IMM: the receiver's receive completes only after the tail is
//! placed), instead of waiting for the tail's completion. The check at the
//! completion (`tail_visible`) still runs. The verbs transport does not
//! build under loom (no device), so this models its memory accesses as
//! `loom_pull.rs` does:
//!
//! - the receiver's flag WRITE is a store into the *sender's* memory, and
//!   the receiver goes on only once it is placed (R2);
//! - a NIC thread places the sender's tail WRITE in the receiver's memory,
//!   then (early kick) rings the doorbell, then completes the request;
//! - the doorbell is a counter; the receiver arms it (notes the count)
//!   before it announces its sleep, and its sleep ends iff the count grows
//!   past what it noted (`Doorbell::drain` arms before its last poll).
//!
//! The flag the sender clears may be stale (left by an earlier sleep), and
//! the receiver may clear it itself on waking (`finish_wait`) before it
//! sleeps again: the models start from each of those states. Each asserts
//! "the receiver saw the tail, or a ring reached it after it armed". The
//! `should_panic` variant clears the flag early without carrying the kick
//! and must lose the wakeup. (A ring that overtook its tail would only
//! wake the receiver early: it looks again, sleeps again with a new flag,
//! and the check at the completion rings it; RC ordering rules that out
//! anyway, so it is not modelled.)
//!
//! Run: `RUSTFLAGS="--cfg loom" cargo test -p ringsock-ring --test loom_early_kick --release --no-default-features`

#![cfg(loom)]

mod loom_support;

use loom::sync::atomic::{fence, AtomicU64, Ordering};
use loom::sync::Arc;
use loom::thread;
use loom_support::model;
use ringsock_ring::sleep::flags::{announce, take_if_unseen};

/// The tail the sender publishes.
const TAIL: u64 = 1;

#[derive(Clone, Copy)]
struct Variant {
    /// The early path sends the kick with the tail (else it only clears).
    carry_kick: bool,
}

const SOUND: Variant = Variant { carry_kick: true };

/// Where the receiver's flag stands when the sender publishes.
#[derive(Clone, Copy)]
enum Start {
    /// Not set: the receiver may set it at any point.
    Clear,
    /// Left set by an earlier sleep that already ended.
    Stale,
    /// Set by an earlier sleep; the receiver clears it on waking
    /// (`finish_wait`), then announces its next sleep.
    ClearedOnWaking,
}

struct Mem {
    // Sender copy.
    rx_waiting: AtomicU64,
    // Receiver copy.
    local_tail: AtomicU64,
    // The receiver's doorbell (rings received) and the send queue's
    // completion of the tail WRITE.
    rings: AtomicU64,
    tail_done: AtomicU64,
    // Outcomes.
    armed_at: AtomicU64,
    saw: AtomicU64,
}

/// The sender's NIC: places the tail, rings if the WRITE carries the
/// kick, completes.
fn nic(m: &Mem, kick: bool) {
    m.local_tail.store(TAIL, Ordering::SeqCst);
    if kick {
        m.rings.fetch_add(1, Ordering::SeqCst);
    }
    m.tail_done.store(1, Ordering::Release);
}

/// `Sender::sync_tail` then, at the completion, `tail_visible`, with the
/// real flag check (`ringsock_ring::sleep::flags`).
fn sender(m: Arc<Mem>, v: Variant) {
    let early = take_if_unseen(&m.rx_waiting, TAIL);
    let kick = early && v.carry_kick;
    let card = {
        let m = m.clone();
        thread::spawn(move || nic(&m, kick))
    };
    while m.tail_done.load(Ordering::Acquire) == 0 {
        thread::yield_now();
    }
    // `tail_visible` skips a tail that carried its kick.
    fence(Ordering::SeqCst);
    if !kick && take_if_unseen(&m.rx_waiting, TAIL) {
        // A kick posted after the completion lands after the tail.
        m.rings.fetch_add(1, Ordering::SeqCst);
    }
    card.join().unwrap();
}

/// The receiver's NIC placing a flag WRITE in the sender's memory. A DMA
/// write lands in that word's single modification order after whatever
/// is there, the sender's clear included; it is modelled as a swap
/// because loom orders a plain store from another thread only by
/// causality, and would let the sender's later load return its own
/// earlier clear instead of this write (a false alarm).
fn place_flag(m: &Mem, v: u64) {
    m.rx_waiting.swap(v, Ordering::SeqCst);
}

/// The receiver's arm (`Doorbell::drain`) and `prepare_wait`: R1 flag
/// WRITE, R2 wait for its placement (synchronous here), R3 fence and load
/// the tail.
fn receiver(m: &Mem, start: Start) {
    if let Start::ClearedOnWaking = start {
        place_flag(m, 0);
    }
    m.armed_at
        .store(m.rings.load(Ordering::SeqCst), Ordering::SeqCst);
    // It has seen nothing of the new tail (the ring held 0 before).
    place_flag(m, announce(0));
    fence(Ordering::SeqCst);
    let seen = m.local_tail.load(Ordering::SeqCst);
    m.saw.store(u64::from(seen == TAIL), Ordering::SeqCst);
}

fn run(start: Start, v: Variant) {
    model(move || {
        let flag = match start {
            Start::Clear => 0,
            Start::Stale | Start::ClearedOnWaking => announce(0),
        };
        let m = Arc::new(Mem {
            rx_waiting: AtomicU64::new(flag),
            local_tail: AtomicU64::new(0),
            rings: AtomicU64::new(0),
            tail_done: AtomicU64::new(0),
            armed_at: AtomicU64::new(0),
            saw: AtomicU64::new(0),
        });
        let s = {
            let m = m.clone();
            thread::spawn(move || sender(m, v))
        };
        receiver(&m, start);
        s.join().unwrap();
        let woken = m.rings.load(Ordering::SeqCst) > m.armed_at.load(Ordering::SeqCst);
        assert!(
            m.saw.load(Ordering::SeqCst) == 1 || woken,
            "lost wakeup: the receiver sleeps on an empty ring and no ring reaches it"
        );
    });
}

#[test]
fn early_kick_from_clear_flag() {
    run(Start::Clear, SOUND);
}

#[test]
fn early_kick_consuming_stale_flag() {
    run(Start::Stale, SOUND);
}

#[test]
fn early_kick_with_flag_cleared_on_waking() {
    run(Start::ClearedOnWaking, SOUND);
}

#[test]
#[should_panic(expected = "lost wakeup")]
fn clearing_early_without_the_kick_loses_wakeups() {
    run(
        Start::Stale,
        Variant {
            carry_kick: false,
            ..SOUND
        },
    );
}
