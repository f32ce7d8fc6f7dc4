//! A sleeping flag whose WRITE never reports (verbs to a peer whose queue
//! pair is gone: Soft-RoCE raises no error for it) must not hold its end
//! in `prepare_wait`: after `WORD_LIMIT` it answers `WouldBlock` ("look
//! again after a bounded sleep") and the ring stays usable.

#![cfg(not(loom))]

mod shm_probe;

use std::sync::mpsc;
use std::time::{Duration, Instant};

use ringsock_ring::sleep::backoff::WORD_LIMIT;
use ringsock_ring::RingError;
use shm_probe::{probed_receiver, probed_sender, small_cfg};

/// Far beyond `WORD_LIMIT` on any machine: only a wait without a bound
/// takes this long.
const HANG: Duration = Duration::from_secs(60);

/// Runs `f` on a thread; fails the test if it has not returned by `HANG`.
fn bounded<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (done, got) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(f());
    });
    got.recv_timeout(HANG)
        .expect("prepare_wait did not return: an unbounded wait")
}

#[test]
fn a_receiver_gives_up_on_an_unreported_flag_and_goes_on() {
    let (mut tx, mut rx, probes) = probed_receiver(small_cfg());
    probes.stop_reports();
    let (r, waited, mut rx) = bounded(move || {
        let start = Instant::now();
        let r = rx.prepare_wait();
        (r, start.elapsed(), rx)
    });
    assert_eq!(r, Err(RingError::WouldBlock));
    assert!(waited >= WORD_LIMIT, "gave up after {waited:?}");
    rx.finish_wait(false).unwrap();

    // Not failed: what the sender writes next is read.
    assert_eq!(tx.write(b"after").unwrap(), 5);
    tx.flush().unwrap();
    let mut buf = [0u8; 16];
    assert_eq!(rx.read(&mut buf).unwrap(), 5);
    assert_eq!(&buf[..5], b"after");
}

#[test]
fn a_sender_gives_up_on_an_unreported_flag_and_goes_on() {
    let (mut tx, mut rx, probes) = probed_sender(small_cfg(), false, false);
    let chunk = [7u8; 512];
    let mut sent = 0usize;
    loop {
        match tx.write(&chunk) {
            Ok(n) => sent += n,
            Err(RingError::WouldBlock) => break,
            Err(e) => panic!("write: {e}"),
        }
    }
    tx.flush().unwrap();
    probes.stop_reports();
    let (r, waited, mut tx) = bounded(move || {
        let start = Instant::now();
        let r = tx.prepare_wait();
        (r, start.elapsed(), tx)
    });
    assert_eq!(r, Err(RingError::WouldBlock));
    assert!(waited >= WORD_LIMIT, "gave up after {waited:?}");
    tx.finish_wait(false).unwrap();

    // Not failed: once the receiver drains, the sender writes again.
    let mut buf = vec![0u8; sent];
    let mut got = 0;
    while got < sent {
        got += rx.read(&mut buf[got..]).unwrap();
    }
    assert!(buf.iter().all(|&b| b == 7));
    assert!(tx.write(b"more").unwrap() > 0);
}
