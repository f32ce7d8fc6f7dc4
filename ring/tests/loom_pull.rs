//! Loom models of the verbs pull mode's wakeup protocol (`transport::verbs`
//! module documentation, "Pull mode"). The verbs transport itself does not
//! build under loom (no device), so these model its memory accesses:
//!
//! - the receiver's `rx_waiting` WRITE is a store into the *sender's*
//!   memory, done by the receiver's NIC; "R2: wait for its completion" is
//!   the receiver going on only once that store is done;
//! - the receiver's READ of `pub_tail` is a load of the sender's memory
//!   (served by the sender's NIC after the READ request arrived, i.e.
//!   after the flag store it waited for);
//! - the sender stores `pub_tail` (SeqCst), fences (SeqCst) and loads
//!   `rx_waiting` (`Sender::tail_visible`).
//!
//! Each model asserts "the receiver saw the tail, or the sender saw the
//! flag (and kicks)". The `should_panic` variants drop one ingredient (the
//! sender's fence, the receiver's R2 wait, the wait for the mode word's
//! completion) and must produce a lost wakeup, which shows the models can
//! fail.
//!
//! Run: `RUSTFLAGS="--cfg loom" cargo test -p ringsock-ring --test loom_pull --release --no-default-features`

#![cfg(loom)]

mod loom_support;

use loom::sync::atomic::{fence, AtomicU64, Ordering};
use loom::sync::Arc;
use loom::thread;
use loom_support::model;

#[derive(Clone, Copy)]
struct Variant {
    /// The sender's SeqCst fence between its tail store and flag load.
    sender_fence: bool,
    /// The receiver waits for its flag WRITE to complete before it READs.
    r2_wait: bool,
    /// At a switch to pull, the sender's check waits for the mode word's
    /// completion (the `AtCompletion` answer of the switch).
    check_at_mode_completion: bool,
}

const SOUND: Variant = Variant {
    sender_fence: true,
    r2_wait: true,
    check_at_mode_completion: true,
};

/// The sender's memory (its own ring copy) and the receiver's.
struct Mem {
    // Sender copy.
    pub_tail: AtomicU64,
    rx_waiting: AtomicU64,
    // Receiver copy.
    local_tail: AtomicU64,
    mode_word: AtomicU64,
    // Completion of the mode word WRITE (the sender's send CQ).
    mode_done: AtomicU64,
    // Outcomes.
    saw: AtomicU64,
    kicked: AtomicU64,
}

impl Mem {
    fn new(pulling: bool) -> Arc<Mem> {
        Arc::new(Mem {
            pub_tail: AtomicU64::new(0),
            rx_waiting: AtomicU64::new(0),
            local_tail: AtomicU64::new(0),
            mode_word: AtomicU64::new(u64::from(pulling)),
            mode_done: AtomicU64::new(0),
            saw: AtomicU64::new(0),
            kicked: AtomicU64::new(0),
        })
    }
}

/// The receiver's `prepare_wait`: R1 flag WRITE (with or without R2), R3
/// fence and fetch (`fetch_tail`: the mode word decides between a READ of
/// `pub_tail` and the local `local_tail`). Returns the NIC thread that
/// places the flag when the receiver does not wait for it.
fn receiver(m: &Arc<Mem>, v: Variant) -> Option<thread::JoinHandle<()>> {
    let nic = if v.r2_wait {
        m.rx_waiting.store(1, Ordering::SeqCst);
        None
    } else {
        let m2 = m.clone();
        Some(thread::spawn(move || {
            m2.rx_waiting.store(1, Ordering::SeqCst)
        }))
    };
    fence(Ordering::SeqCst);
    let tail = if m.mode_word.load(Ordering::Acquire) == 1 {
        m.pub_tail.load(Ordering::SeqCst)
    } else {
        m.local_tail.load(Ordering::Acquire)
    };
    m.saw.store(u64::from(tail != 0), Ordering::SeqCst);
    nic
}

/// `Sender::tail_visible` after the tail store.
fn sender_check(m: &Mem, v: Variant) {
    if v.sender_fence {
        fence(Ordering::SeqCst);
    }
    if m.rx_waiting.load(Ordering::Relaxed) != 0 {
        m.kicked.store(1, Ordering::SeqCst);
    }
}

fn verdict(m: &Mem) {
    assert!(
        m.saw.load(Ordering::SeqCst) == 1 || m.kicked.load(Ordering::SeqCst) == 1,
        "lost wakeup: the receiver sleeps on an empty ring and nobody kicks"
    );
}

/// Steady pull: the sender publishes by a store in its own memory.
fn steady(v: Variant) {
    model(move || {
        let m = Mem::new(true);
        let s = {
            let m = m.clone();
            thread::spawn(move || {
                m.pub_tail.store(1, Ordering::SeqCst);
                sender_check(&m, v);
            })
        };
        let nic = receiver(&m, v);
        s.join().unwrap();
        if let Some(n) = nic {
            n.join().unwrap();
        }
        verdict(&m);
    });
}

/// PUSH -> PULL: the sender stores `pub_tail` and posts the mode word
/// (a NIC thread places it, then reports its completion); the receiver
/// still believes push until it sees the word.
fn switch_to_pull(v: Variant) {
    model(move || {
        let m = Mem::new(false);
        let nic = {
            let m = m.clone();
            thread::spawn(move || {
                m.mode_word.store(1, Ordering::Release);
                m.mode_done.store(1, Ordering::Release);
            })
        };
        let s = {
            let m = m.clone();
            thread::spawn(move || {
                m.pub_tail.store(1, Ordering::SeqCst);
                if v.check_at_mode_completion {
                    while m.mode_done.load(Ordering::Acquire) == 0 {
                        thread::yield_now();
                    }
                }
                sender_check(&m, v);
            })
        };
        let flag = receiver(&m, v);
        s.join().unwrap();
        nic.join().unwrap();
        if let Some(f) = flag {
            f.join().unwrap();
        }
        verdict(&m);
    });
}

#[test]
fn pull_receiver_sees_tail_or_is_kicked() {
    steady(SOUND);
}

#[test]
#[should_panic(expected = "lost wakeup")]
fn pull_without_sender_fence_loses_wakeups() {
    steady(Variant {
        sender_fence: false,
        ..SOUND
    });
}

#[test]
#[should_panic(expected = "lost wakeup")]
fn pull_without_r2_wait_loses_wakeups() {
    steady(Variant {
        r2_wait: false,
        ..SOUND
    });
}

#[test]
fn switch_to_pull_receiver_sees_tail_or_is_kicked() {
    switch_to_pull(SOUND);
}

#[test]
#[should_panic(expected = "lost wakeup")]
fn switch_to_pull_checking_before_the_mode_word_lands_loses_wakeups() {
    switch_to_pull(Variant {
        check_at_mode_completion: false,
        ..SOUND
    });
}
