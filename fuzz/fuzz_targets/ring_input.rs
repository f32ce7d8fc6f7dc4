//! What the ring fuzz targets share: a small ring whose geometry, raw slot
//! bytes and step script come from the input, a receiver on it, and the
//! answers a receiver may give.

use ringsock_ring::{Receiver, RingConfig, RingError, RingMem, ShmTransport};

/// A ring built from the input's first four bytes (slot size, slot count,
/// gamma, script length), then the script (`step_len`-byte steps, at most
/// `max_steps`) and the ring's raw bytes.
pub struct FuzzRing<'a> {
    pub cfg: RingConfig,
    pub mem: RingMem,
    pub rx: Receiver<ShmTransport>,
    pub script: &'a [u8],
}

/// `None` for inputs too short to describe a ring. `record_slots` gives
/// the ring's `max_record_slots` from its slot count.
pub fn ring_from(
    data: &[u8],
    step_len: usize,
    max_steps: usize,
    record_slots: fn(u32) -> u32,
) -> Option<FuzzRing<'_>> {
    if data.len() < 4 {
        return None;
    }
    let slot_size = 64u32 << (data[0] % 3);
    let slots = 4u32 << (data[1] % 4);
    let cfg = RingConfig {
        slots,
        slot_size,
        alpha: 1,
        beta: 1,
        gamma: 1 + (data[2] as u32 % (slots / 2)),
        max_record_slots: record_slots(slots),
        ..RingConfig::default()
    };
    let mem = RingMem::heap(&cfg);
    let ring_len = mem.slots().len();
    let script_len = data[3] as usize % max_steps * step_len;
    let (script, bytes) = data[4..].split_at(script_len.min(data.len() - 4));
    for (i, w) in bytes.chunks(8).enumerate() {
        let mut word = [0u8; 8];
        word[..w.len()].copy_from_slice(w);
        mem.slots()
            .write_word((i * 8) % ring_len, u64::from_le_bytes(word));
    }
    let rx = Receiver::new(mem.clone(), ShmTransport::new(mem.clone(), None), cfg)
        .expect("every geometry built here is valid");
    Some(FuzzRing {
        cfg,
        mem,
        rx,
        script,
    })
}

/// Peeks, reads and asks what is available, `n` bytes at most: data,
/// WouldBlock, EOF or a Corrupt error are fine, anything else fails.
pub fn read_every_way(rx: &mut Receiver<ShmTransport>, buf: &mut [u8], n: usize) {
    for r in [
        rx.peek(&mut buf[..n]),
        rx.read(&mut buf[..n]),
        rx.available(),
    ] {
        match r {
            Ok(_) | Err(RingError::WouldBlock) | Err(RingError::Corrupt(_)) => {}
            Err(e) => panic!("unexpected error: {e}"),
        }
    }
}
