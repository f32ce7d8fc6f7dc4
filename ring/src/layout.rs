//! The shared control block of one ring: the RB2 pointers, each on its own
//! cache line, and the counters, kept in the shared mapping so that
//! `ringsock-ctl status` can read them from outside the process.
//!
//! Who writes what (the single-writer rule every ordering argument rests on):
//!
//! | line          | copy     | written by                     |
//! |---------------|----------|--------------------------------|
//! | `tail`, `synced_tail`, `esc_tail` | sender | sender (mirrors, for status) |
//! | `local_head`  | sender   | receiver (lazy head push)       |
//! | `rx_waiting`  | sender   | receiver sets, sender clears    |
//! | `rx_closed`   | sender   | receiver                        |
//! | `head`, `synced_head` | receiver | receiver (mirrors)        |
//! | `local_tail`  | receiver | sender (tail sync)              |
//! | `tx_waiting`  | receiver | sender sets, receiver clears    |
//!
//! On shm both copies are this one block; on verbs each side has its own
//! block and the transport WRITEs the cross lines.

use crate::sync::AtomicU64;

/// One 64-bit word alone on a cache line, so that the two sides never
/// false-share.
#[repr(C, align(64))]
pub struct Line {
    pub value: AtomicU64,
}

impl Line {
    #[cfg(loom)]
    fn new() -> Self {
        Line {
            value: AtomicU64::new(0),
        }
    }
}

/// Sender-side counters; only the sender writes them.
#[repr(C, align(64))]
pub struct SenderCounters {
    pub slots: AtomicU64,
    pub bytes: AtomicU64,
    pub records: AtomicU64,
    pub batches: AtomicU64,
    pub tail_writes: AtomicU64,
    pub flushes: AtomicU64,
    pub elastic_deferrals: AtomicU64,
    pub full: AtomicU64,
    pub spins: AtomicU64,
    pub sleeps: AtomicU64,
    pub wakeups: AtomicU64,
    pub kicks: AtomicU64,
}

/// Receiver-side counters; only the receiver writes them.
#[repr(C, align(64))]
pub struct ReceiverCounters {
    pub slots: AtomicU64,
    pub bytes: AtomicU64,
    pub records: AtomicU64,
    pub head_pushes: AtomicU64,
    pub empty: AtomicU64,
    pub spins: AtomicU64,
    pub sleeps: AtomicU64,
    pub wakeups: AtomicU64,
    pub kicks: AtomicU64,
}

/// The control block of one ring direction. All-zero bytes are its valid
/// initial state, which is what a fresh memfd or `alloc_zeroed` gives.
#[repr(C)]
pub struct RingControl {
    // Sender copy.
    pub tail: Line,
    pub synced_tail: Line,
    pub esc_tail: Line,
    pub local_head: Line,
    pub rx_waiting: Line,
    pub rx_closed: Line,
    // Receiver copy.
    pub head: Line,
    pub synced_head: Line,
    pub local_tail: Line,
    pub tx_waiting: Line,
    pub tx_stats: SenderCounters,
    pub rx_stats: ReceiverCounters,
}

/// Bytes reserved for a control block in a segment: a whole page, so the
/// slots that follow start page-aligned.
pub const CONTROL_BYTES: usize = 4096;
const _: () = assert!(std::mem::size_of::<RingControl>() <= CONTROL_BYTES);

#[cfg(loom)]
impl SenderCounters {
    fn new() -> Self {
        let z = || AtomicU64::new(0);
        SenderCounters {
            slots: z(),
            bytes: z(),
            records: z(),
            batches: z(),
            tail_writes: z(),
            flushes: z(),
            elastic_deferrals: z(),
            full: z(),
            spins: z(),
            sleeps: z(),
            wakeups: z(),
            kicks: z(),
        }
    }
}

#[cfg(loom)]
impl ReceiverCounters {
    fn new() -> Self {
        let z = || AtomicU64::new(0);
        ReceiverCounters {
            slots: z(),
            bytes: z(),
            records: z(),
            head_pushes: z(),
            empty: z(),
            spins: z(),
            sleeps: z(),
            wakeups: z(),
            kicks: z(),
        }
    }
}

#[cfg(loom)]
impl RingControl {
    /// Loom's atomics are not plain integers, so under loom the block is
    /// built as a value instead of being cast from zeroed memory.
    pub(crate) fn new() -> Self {
        RingControl {
            tail: Line::new(),
            synced_tail: Line::new(),
            esc_tail: Line::new(),
            local_head: Line::new(),
            rx_waiting: Line::new(),
            rx_closed: Line::new(),
            head: Line::new(),
            synced_head: Line::new(),
            local_tail: Line::new(),
            tx_waiting: Line::new(),
            tx_stats: SenderCounters::new(),
            rx_stats: ReceiverCounters::new(),
        }
    }
}

/// Bumps a single-writer counter without a locked instruction: one writer
/// at a time (one thread, or whoever holds the lock that serializes the
/// counter's writers), readers tolerate a stale value and, in other
/// processes too, see each value whole (an aligned 8-byte store).
///
/// Counters are statistics, not part of any ordering argument, so the loom
/// models leave them out to keep the state space small.
#[inline]
pub(crate) fn bump(counter: &AtomicU64, by: u64) {
    #[cfg(not(loom))]
    {
        use crate::sync::Ordering::Relaxed;
        counter.store(counter.load(Relaxed).wrapping_add(by), Relaxed);
    }
    #[cfg(loom)]
    let _ = (counter, by);
}

/// A point-in-time copy of a ring's counters and pointers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RingStats {
    pub tail: u64,
    pub head: u64,
    pub tx_slots: u64,
    pub tx_bytes: u64,
    pub tx_records: u64,
    pub tx_batches: u64,
    pub tx_tail_writes: u64,
    pub tx_flushes: u64,
    pub tx_elastic_deferrals: u64,
    pub tx_full: u64,
    pub tx_spins: u64,
    pub tx_sleeps: u64,
    pub tx_wakeups: u64,
    pub tx_kicks: u64,
    pub rx_slots: u64,
    pub rx_bytes: u64,
    pub rx_records: u64,
    pub rx_head_pushes: u64,
    pub rx_empty: u64,
    pub rx_spins: u64,
    pub rx_sleeps: u64,
    pub rx_wakeups: u64,
    pub rx_kicks: u64,
}

impl RingControl {
    /// Reads every counter (relaxed: statistics only).
    pub fn stats(&self) -> RingStats {
        use crate::sync::Ordering::Relaxed;
        let t = &self.tx_stats;
        let r = &self.rx_stats;
        RingStats {
            tail: self.tail.value.load(Relaxed),
            head: self.head.value.load(Relaxed),
            tx_slots: t.slots.load(Relaxed),
            tx_bytes: t.bytes.load(Relaxed),
            tx_records: t.records.load(Relaxed),
            tx_batches: t.batches.load(Relaxed),
            tx_tail_writes: t.tail_writes.load(Relaxed),
            tx_flushes: t.flushes.load(Relaxed),
            tx_elastic_deferrals: t.elastic_deferrals.load(Relaxed),
            tx_full: t.full.load(Relaxed),
            tx_spins: t.spins.load(Relaxed),
            tx_sleeps: t.sleeps.load(Relaxed),
            tx_wakeups: t.wakeups.load(Relaxed),
            tx_kicks: t.kicks.load(Relaxed),
            rx_slots: r.slots.load(Relaxed),
            rx_bytes: r.bytes.load(Relaxed),
            rx_records: r.records.load(Relaxed),
            rx_head_pushes: r.head_pushes.load(Relaxed),
            rx_empty: r.empty.load(Relaxed),
            rx_spins: r.spins.load(Relaxed),
            rx_sleeps: r.sleeps.load(Relaxed),
            rx_wakeups: r.wakeups.load(Relaxed),
            rx_kicks: r.kicks.load(Relaxed),
        }
    }
}
