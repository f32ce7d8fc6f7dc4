//! Leaving a ring mid-stream: the sender takes back exactly what the
//! receiver did not consume, the receiver drains exactly to the sender's
//! last ring byte, and a published end-of-stream mark is seen before it is
//! read. Property tests over random write and read sizes.

#![cfg(not(loom))]

use proptest::prelude::*;
use ringsock_ring::{heap_pair, Corruption, RingConfig, RingError};

fn small() -> RingConfig {
    RingConfig {
        slots: 64,
        slot_size: 64,
        alpha: 4,
        beta: 2,
        gamma: 8,
        max_record_slots: 8,
        ..RingConfig::default()
    }
}

fn stream(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

proptest! {
    #[test]
    fn taken_back_bytes_are_exactly_the_unconsumed_ones(
        writes in prop::collection::vec(1usize..300, 1..40),
        reads in prop::collection::vec(1usize..200, 0..40),
        flush_every in 1usize..5,
    ) {
        let (mut tx, mut rx) = heap_pair(small(), None, None).unwrap();
        let total: usize = writes.iter().sum();
        let data = stream(total, 7);
        let mut sent = 0;
        let mut got = Vec::new();
        let mut reads = reads.into_iter();
        for (i, w) in writes.iter().enumerate() {
            let mut off = 0;
            while off < *w {
                match tx.write(&data[sent + off..sent + w]) {
                    Ok(n) => off += n,
                    Err(RingError::WouldBlock) => {
                        // Full: the reader takes some, as a program would.
                        tx.flush().unwrap();
                        let mut b = vec![0u8; 256];
                        let n = rx.read(&mut b).unwrap();
                        got.extend_from_slice(&b[..n]);
                    }
                    Err(e) => panic!("{e}"),
                }
            }
            sent += w;
            if i % flush_every == 0 {
                tx.flush().unwrap();
            }
            if let Some(r) = reads.next() {
                let mut b = vec![0u8; r];
                match rx.read(&mut b) {
                    Ok(n) => got.extend_from_slice(&b[..n]),
                    Err(RingError::WouldBlock) => {}
                    Err(e) => panic!("{e}"),
                }
            }
        }
        prop_assert_eq!(tx.bytes_written(), total as u64);
        prop_assert_eq!(rx.bytes_consumed(), got.len() as u64);
        let taken = tx.take_after(rx.bytes_consumed()).unwrap();
        prop_assert!(!taken.eos);
        got.extend_from_slice(&taken.bytes);
        prop_assert_eq!(got, data);
        prop_assert_eq!(tx.write(b"x"), Err(RingError::Closed));
    }

    #[test]
    fn drain_stops_exactly_at_the_senders_last_ring_byte(
        writes in prop::collection::vec(1usize..200, 1..20),
        first_read in 0usize..300,
    ) {
        let (mut tx, mut rx) = heap_pair(RingConfig::default(), None, None).unwrap();
        let total: usize = writes.iter().sum();
        let data = stream(total, 3);
        let mut off = 0;
        for w in &writes {
            prop_assert_eq!(tx.write(&data[off..off + w]).unwrap(), *w);
            off += w;
        }
        tx.flush().unwrap();
        let end = tx.bytes_written();
        // Bytes written after the sender's last ring byte must never be read.
        let mut got = vec![0u8; first_read.min(total)];
        if !got.is_empty() {
            let n = rx.read(&mut got).unwrap();
            got.truncate(n);
        }
        tx.write(b"after the switch").unwrap();
        tx.flush().unwrap();
        prop_assert!(rx.drain_to(end, &mut got).unwrap());
        prop_assert_eq!(&got, &data);
        prop_assert_eq!(rx.bytes_consumed(), end);
        prop_assert!(rx.drain_to(end, &mut got).unwrap());
        prop_assert_eq!(got.len(), total);
    }
}

#[test]
fn drain_waits_for_unpublished_bytes() {
    let (mut tx, mut rx) = heap_pair(RingConfig::default(), None, None).unwrap();
    tx.write(b"hello").unwrap();
    let mut out = Vec::new();
    assert_eq!(rx.drain_to(5, &mut out), Ok(false));
    tx.flush().unwrap();
    assert_eq!(rx.drain_to(5, &mut out), Ok(true));
    assert_eq!(out, b"hello");
}

#[test]
fn a_position_outside_the_unconsumed_range_is_refused() {
    let (mut tx, mut rx) = heap_pair(RingConfig::default(), None, None).unwrap();
    tx.write(b"0123456789").unwrap();
    tx.flush().unwrap();
    let mut b = [0u8; 10];
    assert_eq!(rx.read(&mut b).unwrap(), 10);
    assert!(matches!(
        tx.take_after(11),
        Err(RingError::Corrupt(Corruption::Position { pos: 11, .. }))
    ));
    let (mut tx, mut rx) = heap_pair(RingConfig::default(), None, None).unwrap();
    tx.write(b"abc").unwrap();
    tx.flush().unwrap();
    let mut out = Vec::new();
    assert!(rx.drain_to(3, &mut out).unwrap());
    assert!(rx.drain_to(2, &mut out).is_err());
}

#[test]
fn end_of_stream_is_seen_once_published_and_taken_back_with_the_bytes() {
    let (mut tx, mut rx) = heap_pair(RingConfig::default(), None, None).unwrap();
    tx.write(b"data").unwrap();
    tx.flush().unwrap();
    assert_eq!(rx.eos_published(), Ok(false));
    tx.close().unwrap();
    assert_eq!(rx.eos_published(), Ok(true));
    assert!(!rx.at_eof(), "the data before it is unread");
    let taken = tx.take_after(0).unwrap();
    assert_eq!(taken.bytes, b"data");
    assert!(taken.eos);
}

/// The open record is handed back, never sent: a wire that failed cannot
/// carry it, and the receiver must not see bytes that also go by TCP.
#[test]
fn an_open_record_taken_back_is_not_published() {
    let (mut tx, mut rx) = heap_pair(small(), None, None).unwrap();
    tx.write(b"published").unwrap();
    tx.flush().unwrap();
    let mut b = [0u8; 64];
    assert_eq!(rx.read(&mut b), Ok(9));
    tx.write(b"still open").unwrap();
    let taken = tx.take_after(rx.bytes_consumed()).unwrap();
    assert_eq!(taken.bytes, b"still open");
    assert!(!taken.eos);
    assert_eq!(rx.read(&mut b), Err(RingError::WouldBlock));
}
