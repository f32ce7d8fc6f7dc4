//! A shared-memory transport with probes, for tests of the sender and
//! receiver logic that depends on what the transport says or does:
//! whether it batches streams (as verbs does), a count of the tail writes
//! it carried, a switch that makes `fetch_tail` fail the way a verbs
//! receive queue flushed in error does, and a scribbler that overwrites
//! the part of each transmitted range's last slot that the sender said
//! holds no record bytes (a copying transport leaves it out), and a
//! switch that makes sleeping-flag writes complete later and never report
//! (verbs to a peer whose queue pair is gone, on Soft-RoCE).

// Each test file that includes this module uses a part of it.
#![allow(dead_code)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use ringsock_ring::{
    PeerWord, Receiver, Ring, RingConfig, RingError, RingMem, Sender, ShmTransport, Transport,
    VerbsError, Visibility,
};

/// What `fetch_tail` returns once `Probes::broken` is set.
pub const FLUSHED: RingError = RingError::Verbs(VerbsError::Completion {
    status: 5,
    what: "work request flushed (test)",
});

/// Shared with the test while the transport is owned by a ring end.
#[derive(Clone, Default)]
pub struct Probes {
    /// Tail writes carried (`PeerWord::LocalTail`).
    pub tails: Arc<AtomicU64>,
    /// From now on `fetch_tail` fails with `FLUSHED`.
    pub broken: Arc<AtomicBool>,
    /// Every `write_slots` call: (first, count, last_bytes).
    pub slot_writes: Arc<Mutex<Vec<(u32, u32, u32)>>>,
    /// From now on sleeping-flag writes say `AtCompletion` and
    /// `poll_completions` reports nothing.
    pub unreported: Arc<AtomicBool>,
    /// From now on every write to the peer fails with `FLUSHED` (a verbs
    /// queue pair in error).
    pub writes_broken: Arc<AtomicBool>,
}

impl Probes {
    pub fn tails(&self) -> u64 {
        self.tails.load(Ordering::Relaxed)
    }

    pub fn break_fetch(&self) {
        self.broken.store(true, Ordering::Relaxed);
    }

    pub fn break_writes(&self) {
        self.writes_broken.store(true, Ordering::Relaxed);
    }

    pub fn stop_reports(&self) {
        self.unreported.store(true, Ordering::Relaxed);
    }
}

pub struct Probed {
    pub inner: ShmTransport,
    /// `Transport::batches_streams`.
    pub streams: bool,
    pub probes: Probes,
    /// The ring and its slot size: each `write_slots` overwrites the
    /// bytes past `last_bytes` in the range's last slot with garbage.
    pub scribble: Option<(RingMem, usize)>,
}

/// What the scribbler writes.
pub const GARBAGE: u8 = 0xA5;

/// A sender on a probed transport and a plain receiver over one heap
/// ring; `scribble` turns the scribbler on.
pub fn probed_sender(
    cfg: RingConfig,
    streams: bool,
    scribble: bool,
) -> (Sender<Probed>, Receiver<ShmTransport>, Probes) {
    let mem = RingMem::heap(&cfg);
    let probes = Probes::default();
    let tx = Sender::new(
        mem.clone(),
        Probed {
            inner: ShmTransport::new(mem.clone(), None),
            streams,
            probes: probes.clone(),
            scribble: scribble.then(|| (mem.clone(), cfg.slot_size as usize)),
        },
        cfg,
    )
    .unwrap();
    let rx = Receiver::new(mem.clone(), ShmTransport::new(mem, None), cfg).unwrap();
    (tx, rx, probes)
}

/// A small ring (64 slots of 64 B) that publishes and pushes every
/// record at once (alpha, beta and gamma of 1).
pub fn small_cfg() -> RingConfig {
    RingConfig {
        slots: 64,
        slot_size: 64,
        alpha: 1,
        beta: 1,
        gamma: 1,
        max_record_slots: 16,
        ..RingConfig::default()
    }
}

/// A plain sender and a receiver on a probed transport over one heap
/// ring.
pub fn probed_receiver(cfg: RingConfig) -> (Sender<ShmTransport>, Receiver<Probed>, Probes) {
    let mem = RingMem::heap(&cfg);
    let tx = Sender::new(mem.clone(), ShmTransport::new(mem.clone(), None), cfg).unwrap();
    let probes = Probes::default();
    let rx = Receiver::new(
        mem.clone(),
        Probed {
            inner: ShmTransport::new(mem, None),
            streams: false,
            probes: probes.clone(),
            scribble: None,
        },
        cfg,
    )
    .unwrap();
    (tx, rx, probes)
}

impl Transport for Probed {
    fn write_slots(&mut self, first: u32, count: u32, last_bytes: u32) -> Result<(), RingError> {
        if self.probes.writes_broken.load(Ordering::Relaxed) {
            return Err(FLUSHED);
        }
        self.probes
            .slot_writes
            .lock()
            .unwrap()
            .push((first, count, last_bytes));
        if let Some((mem, ss)) = &self.scribble {
            assert!(count > 0 && (1..=*ss as u32).contains(&last_bytes));
            let end = (first + count) as usize * ss;
            let unused = ss - last_bytes as usize;
            mem.slots().write(end - unused, &vec![GARBAGE; unused]);
        }
        self.inner.write_slots(first, count, last_bytes)
    }

    fn write_word(
        &mut self,
        word: PeerWord,
        value: u64,
        signaled: bool,
    ) -> Result<Visibility, RingError> {
        if self.probes.writes_broken.load(Ordering::Relaxed) {
            return Err(FLUSHED);
        }
        if word == PeerWord::LocalTail {
            self.probes.tails.fetch_add(1, Ordering::Relaxed);
        }
        let vis = self.inner.write_word(word, value, signaled)?;
        let flag = matches!(word, PeerWord::RxWaiting | PeerWord::TxWaiting);
        if flag && self.probes.unreported.load(Ordering::Relaxed) {
            return Ok(Visibility::AtCompletion);
        }
        Ok(vis)
    }

    fn poll_completions(&mut self) -> Result<u32, RingError> {
        if self.probes.unreported.load(Ordering::Relaxed) {
            return Ok(0);
        }
        self.inner.poll_completions()
    }

    fn kick_peer(&mut self, ring: Ring) -> Result<(), RingError> {
        self.inner.kick_peer(ring)
    }

    fn batches_streams(&self) -> bool {
        self.streams
    }

    fn fetch_tail(&mut self, head: u64, known: u64) -> Result<Option<u64>, RingError> {
        if self.probes.broken.load(Ordering::Relaxed) {
            return Err(FLUSHED);
        }
        self.inner.fetch_tail(head, known)
    }
}
