//! Loom model of tails carried in doorbell rings (`ringsock_ring::transport::verbs::tail_hint`,
//! verbs `FEATURE_TAIL_IN_IMM`): the sender's slot WRITE_WITH_IMM places
//! the slots and rings the receiver with the tail's low bits, and no tail
//! word is written; whoever reaps the ring raises the receiver copy's
//! `local_tail` with the real `tail_hint::apply`.
//!
//! Modelled as in `loom_standing.rs`, with the doorbell spelled out:
//!
//! - the device places a WRITE's data, then (for WRITE_WITH_IMM) adds a
//!   completion to the receive CQ; if the CQ is armed that also queues
//!   one event on the channel and disarms it. The CQ, the channel and
//!   the arm sit under one mutex: the real `drain` covers the race of a
//!   completion with its arm by polling again after arming, under the
//!   `rq` lock that every reaper holds;
//! - `Doorbell::drain` takes the events, reaps, arms; it counts as rung if
//!   it found events or completions; a sleep (`ppoll`) ends when an event
//!   is queued;
//! - `fetch_tail` reaps without touching events or the arm.
//!
//! The receiver's standing flag has budget to spare, so every tail rings
//! (the budget's end is `loom_standing.rs`'s subject). The tails
//! alternate between the ring's immediate and a tail word WRITE followed
//! by a plain ring, so the two writers of `local_tail` race. The receiver
//! checks that the tail never goes back, that the slots under a tail it
//! sees are there, and that it is not left asleep.
//!
//! The second model is the doorbell shared by both ends of a connection:
//! the receiver's `fetch_tail` may reap the ring meant for the sender
//! end's waiter (space), whose event is still queued; that waiter must
//! still wake. The `should_panic` variant has the drain count only the
//! completions it reaped, and loses the wakeup.
//!
//! Run: `RUSTFLAGS="--cfg loom" cargo test -p ringsock-ring --test loom_tail_hint --release --no-default-features`

#![cfg(loom)]

mod loom_support;

use loom::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use loom::sync::{Arc, Mutex};
use loom::thread;
use loom_support::model;
use ringsock_ring::transport::verbs::tail_hint;

/// The sender publishes tails 1..=LAST, one slot each.
const LAST: u64 = 3;

/// The receive CQ, its channel and its arm.
#[derive(Default)]
struct Cq {
    armed: bool,
    events: u32,
    /// Completions not reaped yet: the tail hint an immediate carries.
    completions: Vec<Option<u32>>,
}

struct Mem {
    /// Receiver copy: slot `t - 1` holds `payload(t)`.
    slots: [AtomicU64; LAST as usize],
    local_tail: AtomicU64,
    cq: Mutex<Cq>,
    /// The sender end's condition (space) in the second model.
    space: AtomicBool,
    done: AtomicBool,
}

fn payload(tail: u64) -> u64 {
    0x5100 + tail
}

fn new_mem() -> Arc<Mem> {
    Arc::new(Mem {
        slots: Default::default(),
        local_tail: AtomicU64::new(0),
        cq: Mutex::new(Cq {
            armed: true,
            ..Cq::default()
        }),
        space: AtomicBool::new(false),
        done: AtomicBool::new(false),
    })
}

/// The device: a ring (WRITE_WITH_IMM) arrives after what it follows.
fn ring_arrives(m: &Mem, hint: Option<u32>) {
    let mut cq = m.cq.lock().unwrap();
    cq.completions.push(hint);
    if cq.armed {
        cq.armed = false;
        cq.events += 1;
    }
}

/// `Shared::poll_recv`: reap, learn the tails. Caller holds the lock.
fn reap(m: &Mem, cq: &mut Cq) -> u32 {
    let n = cq.completions.len() as u32;
    for hint in cq.completions.drain(..) {
        if let Some(h) = hint {
            tail_hint::apply(&m.local_tail, h);
        }
    }
    n
}

/// `Doorbell::drain`; `counts_events`: a drain that found events counts as
/// rung even when `fetch_tail` reaped their completions.
fn drain(m: &Mem, counts_events: bool) -> bool {
    let mut cq = m.cq.lock().unwrap();
    let events = std::mem::take(&mut cq.events);
    let got = reap(m, &mut cq);
    cq.armed = true;
    got > 0 || (counts_events && events > 0)
}

/// `VerbsTransport::fetch_tail` in push mode.
fn fetch_tail(m: &Mem) {
    let mut cq = m.cq.lock().unwrap();
    reap(m, &mut cq);
}

/// `ppoll` on the channel's fd. Returns false if nothing can ever queue
/// an event any more (a lost wakeup).
fn sleep_until_event(m: &Mem) -> bool {
    loop {
        let done = m.done.load(Ordering::SeqCst);
        if m.cq.lock().unwrap().events > 0 {
            return true;
        }
        if done {
            return false;
        }
        thread::yield_now();
    }
}

/// Every tail rings (standing flag); odd tails ride in the ring, even
/// ones are a tail word WRITE followed by a plain ring (early kick).
fn sender(m: &Mem) {
    for tail in 1..=LAST {
        // The slot WRITE is placed before anything after it.
        m.slots[tail as usize - 1].store(payload(tail), Ordering::Relaxed);
        if tail % 2 == 1 {
            ring_arrives(m, Some(tail_hint::encode(tail)));
        } else {
            // The device's placement of the tail word, modelled as a
            // swap: loom orders a plain store from another thread against
            // a read-modify-write only by causality, and would let the
            // reader see this tail and then an older one raised by
            // `apply` (see `place_flag` in `loom_early_kick.rs`).
            m.local_tail.swap(tail, Ordering::Release);
            ring_arrives(m, None);
        }
    }
    m.done.store(true, Ordering::SeqCst);
}

/// Reads up to `LAST`, sleeping on the doorbell. Returns whether it was
/// left asleep.
fn receiver(m: &Mem) -> bool {
    let mut seen = 0;
    loop {
        fetch_tail(m);
        let tail = m.local_tail.load(Ordering::Acquire);
        assert!(tail >= seen, "the tail went back: {tail} < {seen}");
        assert!(tail <= LAST, "a tail nobody published: {tail}");
        for t in seen + 1..=tail {
            assert_eq!(
                m.slots[t as usize - 1].load(Ordering::Relaxed),
                payload(t),
                "tail {tail} seen before its slots"
            );
        }
        seen = tail;
        if seen == LAST {
            return false;
        }
        // `Doorbell::wait`: drain, else sleep, then drain again.
        if drain(m, true) {
            continue;
        }
        if !sleep_until_event(m) {
            return true;
        }
        drain(m, true);
    }
}

/// `other_reaper`: a second thread reaps once meanwhile (the same end
/// used by another thread of the program), so the tail it raises must
/// carry the slots to the reader through `local_tail` alone.
fn tails_in_rings(other_reaper: bool) {
    model(move || {
        let m = new_mem();
        let s = {
            let m = m.clone();
            thread::spawn(move || sender(&m))
        };
        let r = other_reaper.then(|| {
            let m = m.clone();
            thread::spawn(move || fetch_tail(&m))
        });
        let lost = receiver(&m);
        s.join().unwrap();
        if let Some(r) = r {
            r.join().unwrap();
        }
        assert!(!lost, "lost wakeup: the receiver sleeps past the last tail");
    });
}

#[test]
fn tails_in_rings_reach_the_receiver_with_their_slots() {
    tails_in_rings(false);
}

#[test]
fn a_tail_raised_by_another_thread_carries_its_slots() {
    tails_in_rings(true);
}

/// The sender end's waiter: it waits for space on the doorbell both ends
/// share while the receiver end's `fetch_tail` reaps completions.
fn shared_doorbell(counts_events: bool) {
    model(move || {
        let m = new_mem();
        // The peer's receiver makes space, then rings (after the flag
        // it saw; the flag itself is `loom_standing.rs`'s subject).
        let peer = {
            let m = m.clone();
            thread::spawn(move || {
                m.space.store(true, Ordering::Release);
                ring_arrives(&m, None);
                m.done.store(true, Ordering::SeqCst);
            })
        };
        // This end's receiver looks at its tail meanwhile.
        let reader = {
            let m = m.clone();
            thread::spawn(move || fetch_tail(&m))
        };
        let mut lost = false;
        // `Sender::prepare_wait` placed its flag; then this.
        loop {
            if m.space.load(Ordering::Acquire) {
                break;
            }
            if drain(&m, counts_events) {
                continue;
            }
            if !sleep_until_event(&m) {
                // Asleep, and nothing will ring again.
                lost = true;
                break;
            }
            drain(&m, counts_events);
        }
        peer.join().unwrap();
        reader.join().unwrap();
        assert!(!lost, "lost wakeup: the sender end sleeps with space made");
    });
}

#[test]
fn a_ring_reaped_by_the_reader_still_wakes_the_other_waiter() {
    shared_doorbell(true);
}

#[test]
#[should_panic(expected = "lost wakeup")]
fn counting_only_reaped_completions_loses_the_other_waiter() {
    shared_doorbell(false);
}
