//! Feeds arbitrary slot contents and published pointers to a receiver; it
//! must return data, WouldBlock, EOF or a Corrupt error, never panic, hang
//! or touch memory outside the ring.

#![no_main]

use libfuzzer_sys::fuzz_target;
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
        max_record_slots: 1,
        ..RingConfig::default()
    };
    let mem = RingMem::heap(&cfg);
    let ring_len = mem.slots().len();
    // The rest of the input: a script of (tail update, read size) steps
    // followed by raw ring bytes.
    let (script, bytes) = data[4..].split_at((data[3] as usize % 16 * 9).min(data.len() - 4));
    for (i, w) in bytes.chunks(8).enumerate() {
        let mut word = [0u8; 8];
        word[..w.len()].copy_from_slice(w);
        mem.slots().write_word((i * 8) % ring_len, u64::from_le_bytes(word));
    }
    let mut rx = Receiver::new(mem.clone(), ShmTransport::new(mem.clone(), None), cfg).unwrap();
    let mut buf = vec![0u8; 8192];
    for step in script.chunks(9) {
        if step.len() < 9 {
            break;
        }
        let tail = u64::from_le_bytes(step[..8].try_into().unwrap());
        // Small tails exercise the parser; huge ones the pointer checks.
        let tail = if step[8] & 0x80 == 0 { tail % (2 * slots as u64 + 1) } else { tail };
        mem.ctrl().local_tail.value.store(tail, Ordering::Release);
        let n = 1 + (step[8] as usize & 0x7f) * 64;
        for r in [rx.peek(&mut buf[..n]), rx.read(&mut buf[..n]), rx.available()] {
            match r {
                Ok(_) | Err(RingError::WouldBlock) | Err(RingError::Corrupt(_)) => {}
                Err(e) => panic!("unexpected error: {e}"),
            }
        }
    }
});
