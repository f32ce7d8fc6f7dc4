//! Ring geometry and batching parameters.

use crate::error::{ConfigError, RingError};

/// Parameters of one ring direction. Both ends of a ring must use the same
/// geometry (`slots`, `slot_size`); the batching knobs are sender- or
/// receiver-local and may differ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingConfig {
    /// Number of slots N (power of two).
    pub slots: u32,
    /// Bytes per slot (multiple of the 64 B cache line).
    pub slot_size: u32,
    /// Pointer advancement: publish the tail every `alpha` transmitted slots.
    pub alpha: u32,
    /// Slot transmission: transmit (and close a coalescing record) every
    /// `beta` slots.
    pub beta: u32,
    /// Lazy push: publish the head every `gamma` consumed slots.
    pub gamma: u32,
    /// Largest record in slots; a big write is cut into records of at most
    /// this size so the receiver can start copying before the sender is done.
    pub max_record_slots: u32,
    /// Coalesce consecutive small writes into one record.
    pub coalesce: bool,
    /// Elastic threshold: defer a tail write while the previous one is still
    /// unacknowledged by the transport.
    pub elastic: bool,
    /// Sync-ahead transmission: transmit slots every `beta` slots, ahead of
    /// the tail write; off means slots go out only together with the tail.
    pub sync_ahead: bool,
}

impl Default for RingConfig {
    /// Defaults chosen by the sweep in docs/design.md, "Choosing the
    /// defaults".
    fn default() -> Self {
        RingConfig {
            slots: 4096,
            slot_size: 256,
            alpha: 16,
            beta: 8,
            gamma: 64,
            max_record_slots: record_slots(256),
            coalesce: true,
            elastic: true,
            sync_ahead: true,
        }
    }
}

/// Payload bytes the default record cap holds: a 64 KiB write, the
/// largest most programs make (sockperf's and our benchmarks' large
/// messages, half of iperf3's block), is one record, so one slot WRITE
/// and one tail. A cap of 256 slots of 256 B held 8 bytes less (the
/// header) and cut every 64 KiB write into a record and an 8-byte
/// straggler with its own WRITE, tail and doorbell: under Soft-RoCE the
/// receiver slept once more per message for those 8 bytes.
pub const RECORD_PAYLOAD: usize = 64 * 1024;

/// The default record cap, in slots of `slot_size` bytes: `RECORD_PAYLOAD`
/// and its header (257 slots of 256 B). Callers clamp it to `slots / 2`.
pub fn record_slots(slot_size: u32) -> u32 {
    let slots = crate::record::slots_for(RECORD_PAYLOAD, slot_size.max(1) as usize);
    u32::try_from(slots).unwrap_or(u32::MAX)
}

/// Cache line size the layout is built around.
pub const CACHE_LINE: u32 = 64;
/// Bounds on the geometry: small enough that `slots * slot_size` fits in a
/// u32-indexed mapping comfortably, large enough to hold a record header.
pub const MIN_SLOTS: u32 = 4;
pub const MAX_SLOTS: u32 = 1 << 20;
pub const MAX_SLOT_SIZE: u32 = 64 * 1024;
pub const MAX_RING_BYTES: u64 = 1 << 30;

impl RingConfig {
    /// All batching off: every write is its own record, sent and published at
    /// once, and every consumed slot is pushed back.
    pub fn unbatched(self) -> Self {
        RingConfig {
            alpha: 1,
            beta: 1,
            gamma: 1,
            coalesce: false,
            elastic: false,
            sync_ahead: true,
            ..self
        }
    }

    /// Bytes of slot memory of one ring.
    pub fn ring_bytes(&self) -> u64 {
        self.slots as u64 * self.slot_size as u64
    }

    /// Checks every field; the error names the first bad one.
    pub fn validate(&self) -> Result<(), RingError> {
        let bad = |what| Err(RingError::Config(ConfigError::Field(what)));
        if !self.slots.is_power_of_two() || self.slots < MIN_SLOTS || self.slots > MAX_SLOTS {
            return bad("slots must be a power of two in 4..=1048576");
        }
        if self.slot_size < CACHE_LINE
            || !self.slot_size.is_multiple_of(CACHE_LINE)
            || self.slot_size > MAX_SLOT_SIZE
        {
            return bad("slot_size must be a multiple of 64 in 64..=65536");
        }
        if self.ring_bytes() > MAX_RING_BYTES {
            return bad("slots * slot_size must not exceed 1 GiB");
        }
        let half = self.slots / 2;
        if self.alpha == 0 || self.alpha > half {
            return bad("alpha must be in 1..=slots/2");
        }
        if self.beta == 0 || self.beta > self.alpha {
            return bad("beta must be in 1..=alpha");
        }
        if self.gamma == 0 || self.gamma > half {
            return bad("gamma must be in 1..=slots/2");
        }
        if self.max_record_slots == 0 || self.max_record_slots > half {
            return bad("max_record_slots must be in 1..=slots/2");
        }
        Ok(())
    }
}
