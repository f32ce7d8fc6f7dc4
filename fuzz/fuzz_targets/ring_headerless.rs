//! Feeds a receiver records placed from arbitrary headerless-record
//! immediates (`ringbuf::headerless`, verbs `FEATURE_HEADERLESS`), mixed
//! with arbitrary tail words, over arbitrary ring bytes: every placement
//! must lie inside the ring and only raise the tail by at most a ring, and
//! the receiver must return data, WouldBlock, EOF or a Corrupt error,
//! never panic, hang or touch memory outside the ring.

#![no_main]

use libfuzzer_sys::fuzz_target;
use ringbuf::headerless::{self, Hint};
use ringbuf::record;
use ringbuf::{Receiver, RingConfig, RingError, RingMem, ShmTransport};
use std::sync::atomic::Ordering;

fuzz_target!(|data: &[u8]| {
    if data.len() < 4 {
        return;
    }
    let slot_size = 64u32 << (data[0] % 3);
    let slots = 4u32 << (data[1] % 4);
    let cfg = RingConfig {
        slots,
        slot_size,
        alpha: 1,
        beta: 1,
        gamma: 1 + (data[2] as u32 % (slots / 2)),
        max_record_slots: slots / 2,
        ..RingConfig::default()
    };
    let mem = RingMem::heap(&cfg);
    let ring_len = mem.slots().len();
    // A script of 6-byte steps (a 32-bit immediate field, a kind byte, a
    // read size), then raw ring bytes.
    let (script, bytes) = data[4..].split_at((data[3] as usize % 24 * 6).min(data.len() - 4));
    for (i, w) in bytes.chunks(8).enumerate() {
        let mut word = [0u8; 8];
        word[..w.len()].copy_from_slice(w);
        mem.slots().write_word((i * 8) % ring_len, u64::from_le_bytes(word));
    }
    let mut rx = Receiver::new(mem.clone(), ShmTransport::new(mem.clone(), None), cfg).unwrap();
    let mut buf = vec![0u8; 8192];
    let tail_word = &mem.ctrl().local_tail.value;
    for step in script.chunks(6) {
        if step.len() < 6 {
            break;
        }
        let raw = u32::from_le_bytes(step[..4].try_into().unwrap());
        let cur = tail_word.load(Ordering::Acquire);
        if step[4] & 1 == 0 {
            // A headerless record's immediate, as `Shared::place_headerless`
            // handles it (its field is the low 29 bits).
            let field = raw & ((1 << headerless::FIELD_BITS) - 1);
            match headerless::place(cur, field, slots as u64, slot_size as usize) {
                Hint::Stale | Hint::Bad { .. } => {}
                Hint::Place(p) => {
                    let h = record::Header::decode(p.header).expect("a valid header");
                    let count = record::slots_for(h.len as usize, slot_size as usize) as u64;
                    assert!(p.tail > cur && p.tail - cur <= slots as u64);
                    assert!(p.tail - count >= cur && p.slot + count <= slots as u64);
                    mem.slots()
                        .write_word(p.slot as usize * slot_size as usize, p.header);
                    tail_word.store(p.tail, Ordering::Release);
                }
            }
        } else {
            // A tail word from the device: near the current one, or not.
            let t = u64::from(raw);
            let t = if step[4] & 2 == 0 { cur + t % (2 * slots as u64 + 1) } else { t };
            tail_word.store(t, Ordering::Release);
        }
        let n = 1 + (step[5] as usize & 0x7f) * 64;
        for r in [rx.peek(&mut buf[..n]), rx.read(&mut buf[..n]), rx.available()] {
            match r {
                Ok(_) | Err(RingError::WouldBlock) | Err(RingError::Corrupt(_)) => {}
                Err(e) => panic!("unexpected error: {e}"),
            }
        }
    }
});
