//! Byte-stream behaviour of a ring end to end, in one process.

#![cfg(not(loom))]

use ringsock_ring::{heap_pair, EventFd, RingConfig, RingError, SpinBudget};
use std::time::Duration;

fn small() -> RingConfig {
    RingConfig {
        slots: 16,
        slot_size: 64,
        alpha: 2,
        beta: 2,
        gamma: 4,
        max_record_slots: 4,
        ..RingConfig::default()
    }
}

fn drain(rx: &mut ringsock_ring::Receiver<ringsock_ring::ShmTransport>, out: &mut Vec<u8>) {
    let mut buf = [0u8; 97];
    loop {
        match rx.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(RingError::WouldBlock) => break,
            Err(e) => panic!("{e}"),
        }
    }
}

#[test]
fn small_writes_coalesce_and_arrive_in_order() {
    let (mut tx, mut rx) = heap_pair(RingConfig::default(), None, None).unwrap();
    let mut sent = Vec::new();
    for i in 0..1000u32 {
        let msg = i.to_le_bytes();
        assert_eq!(tx.write(&msg).unwrap(), 4);
        sent.extend_from_slice(&msg);
    }
    tx.flush().unwrap();
    let mut got = Vec::new();
    drain(&mut rx, &mut got);
    assert_eq!(got, sent);
    let _ = &rx;
    assert!(
        tx.records_written() < 100,
        "4000 bytes should need few records, got {}",
        tx.records_written()
    );
}

#[test]
fn unflushed_bytes_are_invisible_until_flush() {
    let (mut tx, mut rx) = heap_pair(RingConfig::default(), None, None).unwrap();
    tx.write(b"hello").unwrap();
    assert!(tx.has_unflushed());
    let mut buf = [0u8; 16];
    assert_eq!(rx.read(&mut buf), Err(RingError::WouldBlock));
    tx.flush().unwrap();
    assert_eq!(rx.read(&mut buf).unwrap(), 5);
    assert_eq!(&buf[..5], b"hello");
}

#[test]
fn full_ring_blocks_then_drains_with_wraparound() {
    let (mut tx, mut rx) = heap_pair(small(), None, None).unwrap();
    let data: Vec<u8> = (0..20_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let (mut off, mut got) = (0, Vec::new());
    let mut blocked = 0;
    while off < data.len() || got.len() < data.len() {
        match tx.write(&data[off..]) {
            Ok(n) => {
                blocked += usize::from(off + n < data.len());
                off += n
            }
            Err(RingError::WouldBlock) => blocked += 1,
            Err(e) => panic!("{e}"),
        }
        tx.flush().unwrap();
        drain(&mut rx, &mut got);
    }
    assert_eq!(got, data);
    assert!(blocked > 0, "a 1 KiB ring must fill up (short writes)");
}

#[test]
fn end_of_stream_after_data() {
    let (mut tx, mut rx) = heap_pair(small(), None, None).unwrap();
    tx.write(b"last words").unwrap();
    tx.close().unwrap();
    assert_eq!(tx.write(b"x"), Err(RingError::Closed));
    let mut buf = [0u8; 64];
    assert_eq!(rx.read(&mut buf).unwrap(), 10);
    assert_eq!(rx.read(&mut buf).unwrap(), 0);
    assert_eq!(rx.read(&mut buf).unwrap(), 0, "EOF is sticky");
    assert!(rx.at_eof());
}

#[test]
fn peek_and_available_do_not_consume() {
    let (mut tx, mut rx) = heap_pair(small(), None, None).unwrap();
    tx.write(b"abc").unwrap();
    tx.flush().unwrap();
    tx.write(b"defgh").unwrap();
    tx.flush().unwrap();
    assert_eq!(rx.available().unwrap(), 8);
    let mut buf = [0u8; 6];
    assert_eq!(rx.peek(&mut buf).unwrap(), 6);
    assert_eq!(&buf, b"abcdef");
    let mut one = [0u8; 2];
    assert_eq!(rx.read(&mut one).unwrap(), 2);
    assert_eq!(rx.available().unwrap(), 6);
    let mut rest = [0u8; 16];
    assert_eq!(rx.read(&mut rest).unwrap(), 6);
    assert_eq!(&rest[..6], b"cdefgh");
}

#[test]
fn reader_close_gives_writer_epipe() {
    let (mut tx, mut rx) = heap_pair(small(), None, None).unwrap();
    rx.close().unwrap();
    let e = tx.write(b"x").unwrap_err();
    assert_eq!(e, RingError::PeerClosed);
    assert_eq!(e.errno(), libc::EPIPE);
}

#[test]
fn unconsumed_bytes_can_be_taken_back_in_order() {
    let (mut tx, _rx) = heap_pair(small(), None, None).unwrap();
    tx.write(b"early ").unwrap();
    tx.flush().unwrap();
    tx.write(b"bytes").unwrap();
    assert_eq!(tx.take_unconsumed().unwrap(), b"early bytes");
}

#[test]
fn unbatched_config_publishes_every_write() {
    let cfg = RingConfig::default().unbatched();
    let (mut tx, mut rx) = heap_pair(cfg, None, None).unwrap();
    tx.write(b"now").unwrap();
    let mut buf = [0u8; 8];
    assert_eq!(
        rx.read(&mut buf).unwrap(),
        3,
        "no flush needed without batching"
    );
}

#[test]
fn invalid_configs_are_refused() {
    for cfg in [
        RingConfig {
            slots: 1000,
            ..RingConfig::default()
        },
        RingConfig {
            slot_size: 100,
            ..RingConfig::default()
        },
        RingConfig {
            alpha: 0,
            ..RingConfig::default()
        },
        RingConfig {
            beta: 64,
            alpha: 8,
            ..RingConfig::default()
        },
        RingConfig {
            gamma: 1 << 20,
            ..RingConfig::default()
        },
        RingConfig {
            slots: 1 << 20,
            slot_size: 65536,
            ..RingConfig::default()
        },
    ] {
        assert!(
            matches!(cfg.validate(), Err(RingError::Config(_))),
            "{cfg:?}"
        );
    }
}

#[test]
fn two_threads_stream_with_sleeping_ends() {
    // Tiny ring and zero spin budget: both ends sleep on their doorbells
    // constantly, so a lost wakeup would hang this test.
    let rx_bell = EventFd::new().unwrap();
    let tx_bell = EventFd::new().unwrap();
    let (mut tx, mut rx) = heap_pair(
        small(),
        Some(Box::new(rx_bell.try_clone().unwrap())),
        Some(Box::new(tx_bell.try_clone().unwrap())),
    )
    .unwrap();
    let data: Vec<u8> = (0..2_000_000u32).map(|i| (i % 253) as u8).collect();
    let expect = data.clone();
    let writer = std::thread::spawn(move || {
        let mut spin = SpinBudget::new(Duration::ZERO);
        for chunk in data.chunks(777) {
            ringsock_ring::sleep::spin::send_all_blocking(&mut tx, &tx_bell, &mut spin, chunk)
                .unwrap();
        }
        loop {
            match tx.close() {
                Ok(()) => break,
                Err(RingError::WouldBlock) => std::thread::yield_now(),
                Err(e) => panic!("{e}"),
            }
        }
    });
    let mut spin = SpinBudget::new(Duration::ZERO);
    let mut got = Vec::with_capacity(expect.len());
    let mut buf = vec![0u8; 4096];
    loop {
        let n = ringsock_ring::sleep::spin::recv_blocking(&mut rx, &rx_bell, &mut spin, &mut buf)
            .unwrap();
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
    }
    writer.join().unwrap();
    assert_eq!(got.len(), expect.len());
    assert!(got == expect, "stream differs");
}
