//! Property tests: the ring is a byte stream (against a VecDeque model),
//! and the receiver survives arbitrary ring contents.

#![cfg(not(loom))]

use proptest::prelude::*;
use ringsock_ring::{heap_pair, Receiver, RingConfig, RingError, RingMem, Sender, ShmTransport};
use std::collections::VecDeque;
use std::sync::atomic::Ordering;

#[derive(Clone, Debug)]
enum Op {
    Write(usize),
    Read(usize),
    Peek(usize),
    Flush,
    Available,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1usize..3000).prop_map(Op::Write),
        1 => (1usize..20).prop_map(Op::Write),
        4 => (1usize..4000).prop_map(Op::Read),
        1 => (1usize..100).prop_map(Op::Peek),
        2 => Just(Op::Flush),
        1 => Just(Op::Available),
    ]
}

fn config() -> impl Strategy<Value = RingConfig> {
    (
        2u32..=8,
        prop_oneof![Just(64u32), Just(128), Just(256)],
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_flat_map(|(log_slots, slot_size, coalesce, elastic, sync_ahead)| {
            let slots = 1u32 << log_slots;
            let half = slots / 2;
            (1..=half, 1..=half, 1..=half).prop_flat_map(move |(alpha, gamma, max_rec)| {
                (1..=alpha).prop_map(move |beta| RingConfig {
                    slots,
                    slot_size,
                    alpha,
                    beta,
                    gamma,
                    max_record_slots: max_rec,
                    coalesce,
                    elastic,
                    sync_ahead,
                })
            })
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Any interleaving of writes, reads, peeks and flushes over any valid
    /// configuration delivers exactly the written bytes, in order; after a
    /// flush every accepted byte is readable.
    #[test]
    fn ring_is_a_byte_stream(cfg in config(), ops in prop::collection::vec(op(), 1..200)) {
        let (mut tx, mut rx) = heap_pair(cfg, None, None).unwrap();
        let mut model: VecDeque<u8> = VecDeque::new(); // accepted, not yet read
        let mut flushed = 0usize; // bytes of `model` guaranteed visible
        let mut counter = 0u8;
        for op in ops {
            match op {
                Op::Write(n) => {
                    let data: Vec<u8> = (0..n).map(|_| { counter = counter.wrapping_add(1); counter }).collect();
                    match tx.write(&data) {
                        Ok(k) => {
                            prop_assert!(k >= 1 && k <= n);
                            model.extend(&data[..k]);
                            counter = counter.wrapping_sub((n - k) as u8);
                        }
                        Err(RingError::WouldBlock) => { counter = counter.wrapping_sub(n as u8); }
                        Err(e) => prop_assert!(false, "write: {e}"),
                    }
                }
                Op::Flush => { tx.flush().unwrap(); flushed = model.len(); }
                Op::Read(n) | Op::Peek(n) => {
                    let peek = matches!(op, Op::Peek(_));
                    let mut buf = vec![0u8; n];
                    let r = if peek { rx.peek(&mut buf) } else { rx.read(&mut buf) };
                    match r {
                        Ok(k) => {
                            prop_assert!(k > 0 && k <= model.len());
                            for (i, b) in buf[..k].iter().enumerate() { prop_assert_eq!(*b, model[i]); }
                            if !peek { model.drain(..k); flushed = flushed.saturating_sub(k); }
                        }
                        Err(RingError::WouldBlock) => prop_assert!(flushed == 0, "flushed bytes unreadable"),
                        Err(e) => prop_assert!(false, "read: {e}"),
                    }
                }
                Op::Available => {
                    let a = rx.available().unwrap();
                    prop_assert!(a >= flushed && a <= model.len());
                }
            }
        }
        tx.flush().unwrap();
        let mut rest = Vec::new();
        let mut buf = vec![0u8; 5000];
        loop {
            match rx.read(&mut buf) {
                Ok(k) => rest.extend_from_slice(&buf[..k]),
                Err(RingError::WouldBlock) => break,
                Err(e) => prop_assert!(false, "drain: {e}"),
            }
        }
        prop_assert_eq!(rest, model.into_iter().collect::<Vec<_>>());
    }

    /// Arbitrary slot bytes and an arbitrary published tail: every receiver
    /// call returns (data, WouldBlock, EOF or a Corrupt error), never panics,
    /// never hangs, and once corrupt stays corrupt.
    #[test]
    fn receiver_survives_arbitrary_ring_contents(
        words in prop::collection::vec(any::<u64>(), 0..64),
        plant_headers in prop::collection::vec((0usize..16, 0u32..2000, 0u16..3), 0..8),
        tails in prop::collection::vec(any::<u64>(), 1..6),
        small_tails in prop::collection::vec(0u64..40, 1..6),
        reads in prop::collection::vec(1usize..3000, 1..12),
    ) {
        let cfg = RingConfig { slots: 16, slot_size: 64, alpha: 1, beta: 1, gamma: 1, max_record_slots: 8, ..RingConfig::default() };
        let mem = RingMem::heap(&cfg);
        for (i, w) in words.iter().enumerate() {
            mem.slots().write_word((i * 8) % mem.slots().len(), *w);
        }
        for (slot, len, flags) in plant_headers {
            let raw = 0x5253u64 | (flags as u64) << 16 | (len as u64) << 32;
            mem.slots().write_word(slot * 64, raw);
        }
        let mut rx = Receiver::new(mem.clone(), ShmTransport::new(mem.clone(), None), cfg).unwrap();
        let mut corrupt = false;
        for (i, n) in reads.iter().enumerate() {
            let tail = if i % 2 == 0 { small_tails[i % small_tails.len()] } else { tails[i % tails.len()] };
            mem.ctrl().local_tail.value.store(tail, Ordering::Release);
            let mut buf = vec![0u8; *n];
            let results = [rx.read(&mut buf).err(), rx.peek(&mut buf).err(), rx.available().err(), rx.readable().err()];
            for r in results.into_iter().flatten() {
                match r {
                    RingError::WouldBlock => prop_assert!(!corrupt),
                    RingError::Corrupt(_) => corrupt = true,
                    other => prop_assert!(false, "unexpected error {other}"),
                }
            }
            if corrupt {
                prop_assert!(matches!(rx.read(&mut buf), Err(RingError::Corrupt(_))), "corruption must be sticky");
            }
        }
    }

    /// Arbitrary words where the receiver writes (the head it hands back,
    /// its closed flag): the sender takes a close only from the flag the
    /// receiver writes (1), and reports anything impossible as corruption,
    /// which stays; never a panic, never a write dropped as after a close.
    #[test]
    fn sender_survives_arbitrary_receiver_words(
        words in prop::collection::vec((any::<u64>(), prop_oneof![Just(0u64), Just(1), any::<u64>()]), 1..12),
        writes in prop::collection::vec(1usize..3000, 1..12),
    ) {
        let cfg = RingConfig { slots: 16, slot_size: 64, alpha: 1, beta: 1, gamma: 1, max_record_slots: 8, ..RingConfig::default() };
        let mem = RingMem::heap(&cfg);
        let mut tx = Sender::new(mem.clone(), ShmTransport::new(mem.clone(), None), cfg).unwrap();
        let mut corrupt = false;
        for (i, n) in writes.iter().enumerate() {
            let (head, closed) = words[i % words.len()];
            mem.ctrl().local_head.value.store(head % 64, Ordering::Release);
            mem.ctrl().rx_closed.value.store(closed, Ordering::Release);
            let data = vec![7u8; *n];
            let results = [tx.write(&data).err(), tx.writable().err(), tx.flush().err()];
            for r in results.into_iter().flatten() {
                match r {
                    RingError::WouldBlock => prop_assert!(!corrupt),
                    RingError::PeerClosed => prop_assert!(!corrupt && closed == 1, "a close from flag {closed:#x}"),
                    RingError::Corrupt(_) => corrupt = true,
                    other => prop_assert!(false, "unexpected error {other}"),
                }
            }
            if closed > 1 {
                prop_assert!(corrupt, "flag {closed:#x} taken for no corruption");
            }
            if corrupt {
                prop_assert!(matches!(tx.write(&data), Err(RingError::Corrupt(_))), "corruption must be sticky");
            }
        }
    }
}
