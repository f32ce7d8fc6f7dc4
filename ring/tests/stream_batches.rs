//! Streaming batches (`Sender` module docs): on a transport that asks for
//! them, the first write after the program waited goes out at the small
//! thresholds, and writes that follow without a wait coalesce into large
//! batches, published by the next flush or once a batch is full. Counted
//! here on a shared-memory ring whose transport claims the verbs
//! behaviour and counts the tail writes.

#![cfg(not(loom))]

mod shm_probe;

use ringsock_ring::{Receiver, RingConfig, RingError, Sender, ShmTransport};
use shm_probe::{Probed, Probes};

struct Pair {
    tx: Sender<Probed>,
    rx: Receiver<ShmTransport>,
    probes: Probes,
}

fn pair(streams: bool) -> Pair {
    let (tx, rx, probes) = shm_probe::probed_sender(RingConfig::default(), streams, false);
    Pair { tx, rx, probes }
}

fn chunk(i: usize) -> Vec<u8> {
    (0..4096).map(|j| (i * 7 + j) as u8).collect()
}

fn write_all(tx: &mut Sender<Probed>, data: &[u8]) {
    let mut off = 0;
    while off < data.len() {
        off += tx.write(&data[off..]).unwrap();
    }
}

/// Everything the receiver can read now.
fn drain(rx: &mut Receiver<ShmTransport>) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 65536];
    loop {
        match rx.read(&mut buf) {
            Ok(n) if n > 0 => out.extend_from_slice(&buf[..n]),
            Ok(_) => panic!("end of stream that was never sent"),
            Err(RingError::WouldBlock) => return out,
            Err(e) => panic!("read: {e}"),
        }
    }
}

#[test]
fn a_stream_goes_out_in_large_batches() {
    let mut p = pair(true);
    let mut sent = Vec::new();
    for i in 0..32 {
        let c = chunk(i);
        write_all(&mut p.tx, &c);
        sent.extend_from_slice(&c);
    }
    // The first 4 KiB write went out alone (the small thresholds); the 31
    // after it coalesced into batches of max_record_slots (257 slots, 64
    // KiB with the headers): 2 more tails, not 31.
    let tails = p.probes.tails();
    assert!(tails <= 3, "{tails} tail writes for 32 streamed writes");
    let early = drain(&mut p.rx);
    assert!(
        early.len() < sent.len(),
        "the last batch waits for the flush"
    );
    p.tx.flush().unwrap();
    let mut got = early;
    got.extend(drain(&mut p.rx));
    assert_eq!(got, sent);
}

#[test]
fn writes_between_waits_go_out_at_once() {
    let mut p = pair(true);
    for i in 0..8 {
        let c = chunk(i);
        write_all(&mut p.tx, &c);
        // Visible without a flush: the first write after a wait is not
        // held for a batch.
        assert_eq!(drain(&mut p.rx), c);
        // The program waits (the shim: a block moved its count).
        p.tx.end_stream();
    }
    assert_eq!(p.probes.tails(), 8);
}

#[test]
fn a_flush_ends_the_stream() {
    let mut p = pair(true);
    for i in 0..4 {
        write_all(&mut p.tx, &chunk(i));
    }
    p.tx.flush().unwrap();
    drain(&mut p.rx);
    let c = chunk(99);
    write_all(&mut p.tx, &c);
    assert_eq!(drain(&mut p.rx), c);
}

#[test]
fn shared_memory_keeps_the_small_thresholds() {
    let mut p = pair(false);
    for i in 0..16 {
        let c = chunk(i);
        write_all(&mut p.tx, &c);
        assert_eq!(drain(&mut p.rx), c);
    }
    assert_eq!(p.probes.tails(), 16);
}

#[test]
fn a_64_kib_write_goes_out_whole() {
    // The default record holds 64 KiB of payload: such a write is one
    // record, one tail, visible at once. A cap 8 bytes short left the last
    // 8 bytes in a record of their own, held until the next flush.
    let mut p = pair(true);
    let msg: Vec<u8> = (0..65536).map(|j| (j * 13 + 5) as u8).collect();
    assert_eq!(p.tx.write(&msg).unwrap(), msg.len());
    assert_eq!(drain(&mut p.rx), msg);
    assert_eq!(p.tx.records_written(), 1);
    assert_eq!(p.probes.tails(), 1);
}
