//! Trimmed slot writes (`Transport::write_slots`'s `last_bytes`): a
//! transmitted range's last slot goes out only as far as its record's
//! bytes, so the rest of that slot must never be read. The probe
//! transport overwrites that rest with garbage at every transmission; a
//! reader that looked past the record's end would return it, or fail on
//! a corrupt header, and these byte-for-byte comparisons would catch it.

#![cfg(not(loom))]

mod shm_probe;

use ringsock_ring::{Receiver, RingConfig, RingError, Sender, ShmTransport};
use shm_probe::{Probed, Probes};

struct Pair {
    tx: Sender<Probed>,
    rx: Receiver<ShmTransport>,
    probes: Probes,
}

fn pair(cfg: RingConfig, streams: bool) -> Pair {
    let (tx, rx, probes) = shm_probe::probed_sender(cfg, streams, true);
    Pair { tx, rx, probes }
}

/// Everything the receiver can read now.
fn drain(rx: &mut Receiver<ShmTransport>, out: &mut Vec<u8>) {
    let mut buf = vec![0u8; 7000];
    loop {
        match rx.read(&mut buf) {
            Ok(n) if n > 0 => out.extend_from_slice(&buf[..n]),
            Ok(_) => panic!("end of stream that was never sent"),
            Err(RingError::WouldBlock) => return,
            Err(e) => panic!("read: {e}"),
        }
    }
}

/// Small deterministic generator (xorshift64*), so a failure replays.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[test]
fn a_small_message_sends_only_its_bytes() {
    let mut p = pair(RingConfig::default(), true);
    let mut got = Vec::new();
    p.tx.write(&[7u8; 64]).unwrap();
    p.tx.flush().unwrap();
    p.tx.write(&[9u8; 300]).unwrap();
    p.tx.flush().unwrap();
    let writes = p.probes.slot_writes.lock().unwrap().clone();
    // 8-byte header + 64 B in slot 0; header + 300 B over slots 1 and 2,
    // 52 B of them in slot 2.
    assert_eq!(writes, vec![(0, 1, 72), (1, 2, 52)]);
    drain(&mut p.rx, &mut got);
    let mut want = vec![7u8; 64];
    want.extend_from_slice(&[9u8; 300]);
    assert_eq!(got, want);
}

/// Random write sizes, flushes and reads over a small ring that wraps
/// hundreds of times: the stream arrives intact although every
/// transmission's unused slot end was overwritten.
fn random_stream(cfg: RingConfig, streams: bool, seed: u64) {
    let mut p = pair(cfg, streams);
    let mut rng = Rng(seed);
    let mut sent = Vec::new();
    let mut got = Vec::new();
    let mut counter = 0u8;
    for _ in 0..3000 {
        let len = match rng.below(4) {
            0 => 1 + rng.below(16),
            1 => 1 + rng.below(300),
            2 => 1 + rng.below(3000),
            _ => cfg.slot_size as u64 * (1 + rng.below(4)) - 8,
        } as usize;
        let chunk: Vec<u8> = (0..len)
            .map(|_| {
                counter = counter.wrapping_add(1);
                counter
            })
            .collect();
        let mut off = 0;
        while off < chunk.len() {
            match p.tx.write(&chunk[off..]) {
                Ok(n) => off += n,
                Err(RingError::WouldBlock) => drain(&mut p.rx, &mut got),
                Err(e) => panic!("write: {e}"),
            }
        }
        sent.extend_from_slice(&chunk);
        if rng.below(3) == 0 {
            p.tx.flush().unwrap();
        }
        if rng.below(2) == 0 {
            drain(&mut p.rx, &mut got);
        }
    }
    p.tx.flush().unwrap();
    drain(&mut p.rx, &mut got);
    assert_eq!(got.len(), sent.len());
    assert!(got == sent, "stream differs (seed {seed})");
    let writes = p.probes.slot_writes.lock().unwrap();
    let trimmed = writes.iter().filter(|w| w.2 < cfg.slot_size).count();
    assert!(
        trimmed > writes.len() / 4,
        "{trimmed} of {} trimmed",
        writes.len()
    );
}

#[test]
fn scribbled_slot_ends_never_reach_the_reader() {
    let small = RingConfig {
        slots: 64,
        slot_size: 64,
        alpha: 4,
        beta: 2,
        gamma: 4,
        max_record_slots: 16,
        ..RingConfig::default()
    };
    for seed in 1..=4 {
        random_stream(small, false, seed);
        random_stream(small, true, seed);
    }
    // The default slot size and batching, in a ring small enough to wrap.
    let default_geometry = RingConfig {
        slots: 256,
        max_record_slots: 64,
        ..RingConfig::default()
    };
    random_stream(default_geometry, true, 5);
    random_stream(default_geometry, false, 6);
}
