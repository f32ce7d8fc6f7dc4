//! Loom model of the offer table's reader (`offers` module docs): a server
//! that accepts a connection finds the offer the daemon entered before
//! answering the offerer, whatever the daemon writes in the same window
//! meanwhile, although the reader reads only the ports word of entries
//! that are not its own.
//!
//! RUSTFLAGS="--cfg loom" cargo test -p ringsock-proto --test loom_offers --release

#![cfg(loom)]

use std::net::SocketAddr;

use loom::sync::atomic::{AtomicU64, Ordering};
use loom::sync::Arc;
use loom::thread;
use ringsock_proto::offers::{key, words_for, Key, Table};

/// Two entries: every key's window is the whole table, so the daemon's
/// other writes land in the reader's window.
const SLOTS: usize = 2;

fn words() -> Arc<Vec<AtomicU64>> {
    Arc::new((0..words_for(SLOTS)).map(|_| AtomicU64::new(0)).collect())
}

fn k(client_port: u16) -> Key {
    let c: SocketAddr = format!("127.0.0.1:{client_port}").parse().unwrap();
    key(&c, &"127.0.0.1:6379".parse().unwrap())
}

/// The daemon enters `ours` and answers (the release store stands for the
/// answer, the connect and the accept), then removes one other offer and
/// enters another in the same slots; the server, once its connection is
/// accepted, must be told "maybe" for `ours`.
#[test]
fn an_offer_entered_before_the_accept_is_found() {
    accept_after(true);
}

/// The model catches a daemon that answers before it enters the offer.
#[test]
#[should_panic(expected = "missed")]
fn an_offer_entered_after_the_answer_can_be_missed() {
    accept_after(false);
}

fn accept_after(entered_first: bool) {
    loom::model(move || {
        let w = words();
        let t = Table::with_slots(&w, SLOTS).unwrap();
        t.init();
        let (ours, before, after) = (k(40000), k(40001), k(40002));
        assert!(t.insert(&before));
        let accepted = Arc::new(AtomicU64::new(0));
        let daemon = {
            let (w, accepted) = (w.clone(), accepted.clone());
            thread::spawn(move || {
                let t = Table::with_slots(&w, SLOTS).unwrap();
                if entered_first {
                    assert!(t.insert(&ours));
                    accepted.store(1, Ordering::Release);
                } else {
                    accepted.store(1, Ordering::Release);
                    assert!(t.insert(&ours));
                }
                t.remove(&before, true);
                assert!(t.insert(&after));
            })
        };
        if accepted.load(Ordering::Acquire) == 1 {
            assert!(
                t.may_have(&ours),
                "the accepted connection's offer was missed"
            );
        }
        daemon.join().unwrap();
        assert!(t.may_have(&ours));
    });
}

/// The daemon removes the offer (it expired or was claimed) while the
/// server looks: any answer is right then, and the look ends.
#[test]
fn a_look_during_a_removal_ends() {
    loom::model(|| {
        let w = words();
        let t = Table::with_slots(&w, SLOTS).unwrap();
        t.init();
        let ours = k(40000);
        assert!(t.insert(&ours));
        let daemon = {
            let w = w.clone();
            thread::spawn(move || {
                Table::with_slots(&w, SLOTS).unwrap().remove(&ours, true);
            })
        };
        let _ = t.may_have(&ours);
        daemon.join().unwrap();
        assert!(
            !t.may_have(&ours),
            "a removed offer is gone once seen removed"
        );
    });
}
