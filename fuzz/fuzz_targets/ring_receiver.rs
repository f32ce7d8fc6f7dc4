//! Feeds arbitrary slot contents and published pointers to a receiver; it
//! must return data, WouldBlock, EOF or a Corrupt error, never panic, hang
//! or touch memory outside the ring.

#![no_main]

mod ring_input;

use libfuzzer_sys::fuzz_target;
use ring_input::{read_every_way, ring_from};
use std::sync::atomic::Ordering;

fuzz_target!(|data: &[u8]| {
    // Steps of (tail update, read size), at most 15, then raw ring bytes.
    let Some(mut f) = ring_from(data, 9, 16, |_| 1) else {
        return;
    };
    let slots = u64::from(f.cfg.slots);
    let mut buf = vec![0u8; 8192];
    for step in f.script.chunks(9) {
        if step.len() < 9 {
            break;
        }
        let tail = u64::from_le_bytes(step[..8].try_into().unwrap());
        // Small tails exercise the parser; huge ones the pointer checks.
        let tail = if step[8] & 0x80 == 0 {
            tail % (2 * slots + 1)
        } else {
            tail
        };
        f.mem.ctrl().local_tail.value.store(tail, Ordering::Release);
        let n = 1 + (step[8] as usize & 0x7f) * 64;
        read_every_way(&mut f.rx, &mut buf, n);
    }
});
