//! Loom model of records sent without their header (`ringsock_ring::transport::verbs::headerless`,
//! verbs `FEATURE_HEADERLESS`): the sender's WRITE_WITH_IMM places only the
//! record's payload; whoever reaps its completion writes the header into
//! the receiver copy and raises `local_tail` with the real
//! `headerless::place`. Before its next tail *word* the sender re-sends the
//! header (`Shared::resend_headers`).
//!
//! Three threads over one slot of the receiver copy:
//!
//! - the device (the sender and its NIC): places the payload and queues
//!   the completion; re-sends the header and places a tail word covering
//!   the record; and, once the receiver's pushed head says the record was
//!   read, reuses the slot for the next lap's record;
//! - a reaper: another thread of the program draining the doorbell
//!   (`Doorbell::drain`), under the `rq` lock;
//! - the receiver: reaps and loads the tail under the same lock
//!   (`VerbsTransport::fetch_tail`), reads the record and pushes its head.
//!
//! Checked: a receiver that sees the tail finds the record's header and
//! payload, and no header is written over the slot after its reuse. The
//! completion is queued either before the tail word is placed or after it
//! (verbs does not promise when a completion becomes visible against a
//! later WRITE's data). The `should_panic` variants show each rule is
//! needed: without the re-send a receiver that learns the tail from the
//! word reads a missing header; with the receiver loading its tail outside
//! the lock a late reaper writes a stale header over the next lap's
//! record.
//!
//! Run: `RUSTFLAGS="--cfg loom" cargo test -p ringsock-ring --test loom_headerless --release --no-default-features`

#![cfg(loom)]

mod loom_support;

use loom::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use loom::sync::{Arc, Mutex};
use loom::thread;
use loom_support::model;
use ringsock_ring::record::Header;
use ringsock_ring::transport::verbs::headerless::{self, Hint};

const SLOTS: u64 = 4;
const SLOT_SIZE: usize = 64;
/// The record: 8 payload bytes in slot 0, tail 1.
const LEN: u32 = 8;
const PAYLOAD: u64 = 0x5151;
/// The next lap's record in the same slot.
const NEXT_HEADER: u64 = 0xa11a;
const NEXT_PAYLOAD: u64 = 0x5252;

#[derive(Clone, Copy)]
struct Rules {
    /// The sender re-sends the header before its tail word.
    resend: bool,
    /// The receiver loads its tail under the reapers' lock.
    rx_locked: bool,
    /// The completion is queued after the tail word is placed.
    completion_last: bool,
}

struct Mem {
    /// Receiver copy of slot 0: header word, payload word. Zero is what
    /// an earlier lap left: no valid header.
    header: AtomicU64,
    payload: AtomicU64,
    local_tail: AtomicU64,
    /// The receiver's head, as pushed into the sender's copy.
    pushed_head: AtomicU64,
    /// The receive CQ (immediates not reaped yet), under the `rq` lock.
    cq: Mutex<Vec<u32>>,
    reused: AtomicBool,
}

fn header() -> u64 {
    Header { flags: 0, len: LEN }.encode()
}

/// `Shared::place_headerless`.
fn place(m: &Mem, field: u32) {
    let mut cur = m.local_tail.load(Ordering::Acquire);
    loop {
        match headerless::place(cur, field, SLOTS, SLOT_SIZE) {
            Hint::Stale => return,
            Hint::Bad { len } => panic!("an honest field judged bad (len {len})"),
            Hint::Place(p) => {
                assert_eq!(p.slot, 0);
                m.header.store(p.header, Ordering::Relaxed);
                match m.local_tail.compare_exchange(
                    cur,
                    p.tail,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => return,
                    Err(now) => cur = now,
                }
            }
        }
    }
}

/// `Shared::poll_recv`. Caller holds the lock.
fn reap(m: &Mem, cq: &mut Vec<u32>) {
    for field in cq.drain(..) {
        place(m, field);
    }
}

fn device(m: &Mem, rules: Rules) {
    let field = headerless::encode(LEN, 1).unwrap();
    m.payload.store(PAYLOAD, Ordering::Relaxed);
    if !rules.completion_last {
        m.cq.lock().unwrap().push(field);
    }
    if rules.resend {
        m.header.store(header(), Ordering::Relaxed);
    }
    // The tail word's placement, modelled as a swap (see `sender` in
    // `loom_tail_hint.rs`: loom orders a plain store against another
    // thread's read-modify-write only by causality).
    m.local_tail.swap(1, Ordering::Release);
    if rules.completion_last {
        m.cq.lock().unwrap().push(field);
    }
    // The sender rewrites the slot only once the receiver's head passed
    // the record.
    if m.pushed_head.load(Ordering::Acquire) >= 1 {
        m.header.store(NEXT_HEADER, Ordering::Relaxed);
        m.payload.store(NEXT_PAYLOAD, Ordering::Relaxed);
        m.reused.store(true, Ordering::Relaxed);
    }
}

fn reaper(m: &Mem) {
    let mut cq = m.cq.lock().unwrap();
    reap(m, &mut cq);
}

fn receiver(m: &Mem, rules: Rules) {
    let tail = {
        let mut cq = m.cq.lock().unwrap();
        reap(m, &mut cq);
        if rules.rx_locked {
            m.local_tail.load(Ordering::Acquire)
        } else {
            drop(cq);
            m.local_tail.load(Ordering::Acquire)
        }
    };
    if tail >= 1 {
        assert_eq!(
            m.header.load(Ordering::Relaxed),
            header(),
            "the tail was seen before the record's header"
        );
        assert_eq!(m.payload.load(Ordering::Relaxed), PAYLOAD);
        m.pushed_head.store(1, Ordering::Release);
    }
}

fn run(rules: Rules) {
    model(move || {
        let m = Arc::new(Mem {
            header: AtomicU64::new(0),
            payload: AtomicU64::new(0),
            local_tail: AtomicU64::new(0),
            pushed_head: AtomicU64::new(0),
            cq: Mutex::new(Vec::new()),
            reused: AtomicBool::new(false),
        });
        let threads = [
            {
                let m = m.clone();
                thread::spawn(move || device(&m, rules))
            },
            {
                let m = m.clone();
                thread::spawn(move || reaper(&m))
            },
            {
                let m = m.clone();
                thread::spawn(move || receiver(&m, rules))
            },
        ];
        for t in threads {
            t.join().unwrap();
        }
        if m.reused.load(Ordering::Relaxed) {
            assert_eq!(
                m.header.load(Ordering::Relaxed),
                NEXT_HEADER,
                "a late reaper wrote a stale header over the next lap's record"
            );
        }
    });
}

#[test]
fn completion_before_the_tail_word() {
    run(Rules {
        resend: true,
        rx_locked: true,
        completion_last: false,
    });
}

#[test]
fn completion_after_the_tail_word() {
    run(Rules {
        resend: true,
        rx_locked: true,
        completion_last: true,
    });
}

#[test]
#[should_panic(expected = "before the record's header")]
fn without_the_resend_a_tail_word_outruns_the_header() {
    run(Rules {
        resend: false,
        rx_locked: true,
        completion_last: true,
    });
}

#[test]
#[should_panic(expected = "stale header")]
fn a_tail_loaded_outside_the_lock_lets_a_late_reaper_clobber_the_slot() {
    run(Rules {
        resend: true,
        rx_locked: false,
        completion_last: false,
    });
}
