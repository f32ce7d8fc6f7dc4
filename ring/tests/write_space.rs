//! A sender waiting for space is woken, and reports room to poll, only once
//! a third of the ring is free (TCP's `sk_stream_is_writeable` rule), not
//! for every record the receiver frees.

#![cfg(not(loom))]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use ringsock_ring::{heap_pair, Notify, RingConfig, RingError};

#[derive(Clone, Default)]
struct Kicks(Arc<AtomicUsize>);

impl Notify for Kicks {
    fn notify(&self) -> Result<(), RingError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

impl Kicks {
    fn count(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

/// 32 slots of 64 bytes, one slot per record; lazy pushes every 16.
fn cfg() -> RingConfig {
    RingConfig {
        slots: 32,
        slot_size: 64,
        alpha: 1,
        beta: 1,
        gamma: 16,
        max_record_slots: 1,
        ..RingConfig::default()
    }
}

/// Payload bytes of a one-slot record (the slot less its header).
fn record_bytes() -> usize {
    (1..=64)
        .rev()
        .find(|&len| {
            let (mut tx, _rx) = heap_pair(cfg(), None, None).unwrap();
            assert_eq!(tx.write(&vec![1u8; len]).unwrap(), len);
            tx.flush().unwrap();
            tx.occupancy() == 1
        })
        .unwrap()
}

#[test]
fn a_waiting_sender_is_woken_once_a_third_is_free() {
    let per = record_bytes();
    let tx_bell = Kicks::default();
    let (mut tx, mut rx) = heap_pair(cfg(), None, Some(Box::new(tx_bell.clone()))).unwrap();
    let mut records = 0;
    loop {
        match tx.write(&vec![9u8; per]) {
            Ok(n) => {
                assert_eq!(n, per);
                tx.flush().unwrap();
                records += 1;
            }
            Err(RingError::WouldBlock) => break,
            Err(e) => panic!("write: {e}"),
        }
    }
    assert_eq!(records, 32, "one record per slot");
    assert!(!tx.write_space().unwrap());
    assert!(tx.prepare_wait().unwrap(), "a full ring: the sender sleeps");

    // The receiver frees records one at a time; the sender is owed its
    // ring only when the eleventh (a third of 32 slots) is handed back.
    let mut buf = vec![0u8; per];
    for freed in 1..=10 {
        assert_eq!(rx.read(&mut buf).unwrap(), per);
        assert_eq!(tx_bell.count(), 0, "kicked after {freed} records");
    }
    assert!(!tx.write_space().unwrap(), "ten free slots are not a third");
    assert_eq!(rx.read(&mut buf).unwrap(), per);
    assert_eq!(tx_bell.count(), 1, "the eleventh record frees a third");
    tx.finish_wait(true).unwrap();
    assert!(tx.write_space().unwrap());

    // Every byte still arrives in order, and the room is all usable.
    for _ in 0..11 {
        assert_eq!(tx.write(&vec![7u8; per]).unwrap(), per);
    }
    tx.flush().unwrap();
    for i in 0..32 {
        assert_eq!(rx.read(&mut buf).unwrap(), per);
        let want = if i < 21 { 9 } else { 7 };
        assert!(buf.iter().all(|b| *b == want), "record {i}");
    }
}

#[test]
fn a_sender_with_a_third_free_does_not_sleep() {
    let per = record_bytes();
    let (mut tx, mut rx) = heap_pair(cfg(), None, None).unwrap();
    for _ in 0..21 {
        assert_eq!(tx.write(&vec![3u8; per]).unwrap(), per);
    }
    tx.flush().unwrap();
    assert!(tx.write_space().unwrap(), "eleven of 32 slots free");
    assert!(!tx.prepare_wait().unwrap());
    assert_eq!(tx.write(&vec![3u8; per]).unwrap(), per);
    tx.flush().unwrap();
    assert!(!tx.write_space().unwrap(), "ten free");
    // Room for a byte is still room for a write: only waking waits for a third.
    assert_eq!(tx.write(&vec![3u8; per]).unwrap(), per);
    let mut buf = vec![0u8; per];
    assert_eq!(rx.read(&mut buf).unwrap(), per);
}
