//! Feeds a receiver records placed from arbitrary headerless-record
//! immediates (`ringsock_ring::transport::verbs::headerless`, verbs `FEATURE_HEADERLESS`), mixed
//! with arbitrary tail words, over arbitrary ring bytes: every placement
//! must lie inside the ring and only raise the tail by at most a ring, and
//! the receiver must return data, WouldBlock, EOF or a Corrupt error,
//! never panic, hang or touch memory outside the ring.

#![no_main]

mod ring_input;

use libfuzzer_sys::fuzz_target;
use ring_input::{read_every_way, ring_from};
use ringsock_ring::transport::verbs::headerless::{self, Hint};
use ringsock_ring::record;
use std::sync::atomic::Ordering;

fuzz_target!(|data: &[u8]| {
    // Steps of (a 32-bit immediate field, a kind byte, a read size), at
    // most 23, then raw ring bytes.
    let Some(mut f) = ring_from(data, 6, 24, |slots| slots / 2) else {
        return;
    };
    let slots = u64::from(f.cfg.slots);
    let slot_size = f.cfg.slot_size as usize;
    let mut buf = vec![0u8; 8192];
    let tail_word = &f.mem.ctrl().local_tail.value;
    for step in f.script.chunks(6) {
        if step.len() < 6 {
            break;
        }
        let raw = u32::from_le_bytes(step[..4].try_into().unwrap());
        let cur = tail_word.load(Ordering::Acquire);
        if step[4] & 1 == 0 {
            // A headerless record's immediate, as `Shared::place_headerless`
            // handles it (its field is the low 29 bits).
            let field = raw & ((1 << headerless::FIELD_BITS) - 1);
            match headerless::place(cur, field, slots, slot_size) {
                Hint::Stale | Hint::Bad { .. } => {}
                Hint::Place(p) => {
                    let h = record::Header::decode(p.header).expect("a valid header");
                    let count = record::slots_for(h.len as usize, slot_size) as u64;
                    assert!(p.tail > cur && p.tail - cur <= slots);
                    assert!(p.tail - count >= cur && p.slot + count <= slots);
                    f.mem
                        .slots()
                        .write_word(p.slot as usize * slot_size, p.header);
                    tail_word.store(p.tail, Ordering::Release);
                }
            }
        } else {
            // A tail word from the device: near the current one, or not.
            let t = u64::from(raw);
            let t = if step[4] & 2 == 0 {
                cur + t % (2 * slots + 1)
            } else {
                t
            };
            tail_word.store(t, Ordering::Release);
        }
        let n = 1 + (step[5] as usize & 0x7f) * 64;
        read_every_way(&mut f.rx, &mut buf, n);
    }
});
