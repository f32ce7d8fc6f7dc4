//! A receiver whose transport fails without corrupting anything (verbs: its
//! receive queue flushed in error once the peer's queue pair went away)
//! still delivers every byte the peer placed in its copy before the
//! failure, and reports the error only once nothing more is there.
//!
//! The failure is injected into `fetch_tail` of a shared-memory transport:
//! that is where the verbs transport reaps its receive completions, and
//! where a peer that exited right after its last send made the reader see
//! the error while the last bytes sat unread in its ring.

#![cfg(not(loom))]

mod shm_probe;

use ringsock_ring::{Receiver, Sender, ShmTransport};
use shm_probe::{probed_receiver, small_cfg, Probed, Probes, FLUSHED};

fn pair() -> (Sender<ShmTransport>, Receiver<Probed>, Probes) {
    probed_receiver(small_cfg())
}

fn send_all(tx: &mut Sender<ShmTransport>, data: &[u8]) {
    let mut off = 0;
    while off < data.len() {
        off += tx.write(&data[off..]).unwrap();
    }
    tx.flush().unwrap();
}

fn message(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

#[test]
fn bytes_published_before_the_failure_are_delivered_then_the_error() {
    let (mut tx, mut rx, probes) = pair();
    let data = message(1500, 7);
    send_all(&mut tx, &data);
    probes.break_fetch();

    let mut got = Vec::new();
    let mut buf = [0u8; 256];
    let err = loop {
        match rx.read(&mut buf) {
            Ok(0) => panic!("end of stream that was never sent"),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) => break e,
        }
    };
    assert_eq!(got, data, "every published byte arrives before the error");
    assert_eq!(err, FLUSHED);
    // And it stays an error, not a silent "nothing yet".
    assert_eq!(rx.read(&mut buf), Err(FLUSHED));
}

#[test]
fn a_reader_midway_keeps_what_it_had_and_what_followed() {
    let (mut tx, mut rx, probes) = pair();
    let first = message(600, 1);
    send_all(&mut tx, &first);
    let mut buf = vec![0u8; 600];
    let mut got = 0;
    while got < 600 {
        got += rx.read(&mut buf[got..]).unwrap();
    }
    assert_eq!(buf, first);

    // More arrives, then the transport breaks before the reader looks.
    let second = message(900, 2);
    send_all(&mut tx, &second);
    probes.break_fetch();
    // One call larger than what is there: the bytes it copied come back
    // with it rather than being lost to the error of its second look.
    let mut big = vec![0u8; 4096];
    let n = rx.read(&mut big).unwrap();
    assert_eq!(&big[..n], &second[..n]);
    let mut rest = big[..n].to_vec();
    loop {
        match rx.read(&mut big) {
            Ok(m) if m > 0 => rest.extend_from_slice(&big[..m]),
            Ok(_) => panic!("end of stream that was never sent"),
            Err(e) => {
                assert_eq!(e, FLUSHED);
                break;
            }
        }
    }
    assert_eq!(rest, second);
}

#[test]
fn nothing_published_means_the_error_at_once() {
    let (_tx, mut rx, probes) = pair();
    probes.break_fetch();
    let mut buf = [0u8; 64];
    assert_eq!(rx.read(&mut buf), Err(FLUSHED));
    assert_eq!(rx.readable(), Err(FLUSHED));
}

/// A sender whose wire failed still hands back, exactly, every byte the
/// receiver did not consume, the open record included: the shim resends
/// them over TCP (`take_after` must not need the wire).
#[test]
fn a_sender_whose_wire_failed_takes_back_the_unconsumed_bytes() {
    let (mut tx, mut rx, probes) = shm_probe::probed_sender(small_cfg(), true, false);
    let data = message(3000, 3);
    send_all_probed(&mut tx, &data[..1000]);
    let mut got = vec![0u8; 600];
    let mut n = 0;
    while n < 600 {
        n += rx.read(&mut got[n..]).unwrap();
    }
    probes.break_writes();
    // Written after the failure: stays in our copy as an open record.
    let mut off = 1000;
    while off < data.len() {
        match tx.write(&data[off..]) {
            Ok(k) => off += k,
            Err(e) => {
                assert_eq!(e, FLUSHED);
                break;
            }
        }
    }
    assert!(tx.flush().is_err(), "the failed wire shows on a flush");
    let taken = tx.take_after(rx.bytes_consumed()).unwrap();
    let mut all = got;
    all.extend_from_slice(&taken.bytes);
    assert_eq!(
        all,
        data[..off],
        "consumed + taken back = written, in order"
    );
}

fn send_all_probed(tx: &mut Sender<Probed>, data: &[u8]) {
    let mut off = 0;
    while off < data.len() {
        off += tx.write(&data[off..]).unwrap();
    }
    tx.flush().unwrap();
}
