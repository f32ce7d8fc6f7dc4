//! The header page of a verbs connection end's region: what
//! `ringsock-ctl status` needs to read that end's counters from the memfd
//! the shim hands it (`VerbsConn::share_fd`).
//!
//! Not behind the `verbs` feature: the daemon decodes this layout without
//! linking rdma-core. The region is `[header page | out ctrl | out slots |
//! in ctrl | in slots | staging]`; the header page is outside the memory
//! registration, so the peer's rkey cannot reach it. A reader outside the
//! process must still treat every field as untrusted (the owning process
//! writes it, and that process may be hostile): check `magic`, `version`
//! and `header_len`, bounds-check every offset, and read only with 8-byte
//! atomic loads at 8-aligned offsets (the fixed fields are laid out so that
//! each u32 pair shares one little-endian word, as in the shm segment
//! header).

// std atomics even under loom: the header is statistics, never part of
// the modelled protocol, and its layout must be the real one.
use std::sync::atomic::{AtomicU64, Ordering};

/// `magic` of a verbs region header: "RSVERBS1" as little-endian bytes.
pub const VERBS_MAGIC: u64 = u64::from_le_bytes(*b"RSVERBS1");
/// Version of the header layout; a reader refuses any other.
pub const VERBS_VERSION: u32 = 1;
/// Bytes the header page occupies at the start of the region (the ring
/// parts follow it, page-aligned).
pub const VERBS_HEADER_PAGE: usize = 4096;

/// The fixed part of the header, written once before the memfd is shared,
/// then only read. Offsets are from the start of the region (= the memfd).
#[repr(C)]
pub struct VerbsHeader {
    pub magic: u64,
    /// `VERBS_VERSION` (low half) and `size_of::<VerbsHeader>()` (high half).
    pub version: u32,
    pub header_len: u32,
    /// Length of the region (the memfd's size).
    pub region_len: u64,
    /// Offsets of this end's sender copy of its outgoing ring.
    pub out_ctrl: u64,
    pub out_slots: u64,
    /// Offsets of this end's receiver copy of its incoming ring.
    pub in_ctrl: u64,
    pub in_slots: u64,
    /// Geometry of both rings: slots (low) and slot size (high).
    pub out_slot_count: u32,
    pub out_slot_size: u32,
    pub in_slot_count: u32,
    pub in_slot_size: u32,
    /// RDMA device name, NUL-padded (truncated to 16 bytes).
    pub device: [u8; 16],
    /// Port (low) and GID index (high).
    pub port: u32,
    pub gid_index: u32,
    /// Bit 0: the region is on huge pages.
    pub flags: u64,
    /// Send-queue counters: written under the connection's send-queue lock.
    pub sq: SqCounters,
    /// Receive-side counters: written under the receive-queue lock (except
    /// `cq_errors`, which both sides bump).
    pub rq: RqCounters,
    /// Words of the layer above: the processes that hold this end after a
    /// fork coordinate through them (the region is mapped shared).
    pub user: [AtomicU64; 8],
}

/// `VerbsHeader::flags` bit: the region is on huge pages.
pub const VERBS_FLAG_HUGE: u64 = 1;

/// Counters of the send queue, one cache line (only the thread holding the
/// send-queue lock writes them, so the doorbell thread's line is apart).
#[repr(C, align(64))]
#[derive(Default)]
pub struct SqCounters {
    /// Work requests posted (slot WRITEs + word WRITEs + doorbell kicks).
    pub wr_posted: AtomicU64,
    /// Of those, signaled (every word write, and every `sq_depth/2`th).
    pub wr_signaled: AtomicU64,
    /// Of those, inline (word writes on a device that can inline).
    pub wr_inline: AtomicU64,
    /// Slot range WRITEs and the bytes they carried.
    pub slot_writes: AtomicU64,
    pub slot_bytes: AtomicU64,
    /// Control-word WRITEs (tail, head, sleeping flags, close).
    pub word_writes: AtomicU64,
    /// Doorbell kicks sent (zero-length WRITE_WITH_IMM).
    pub kicks_sent: AtomicU64,
    /// Send completions reaped.
    pub completions: AtomicU64,
}

/// Counters of the receive side (the doorbell).
#[repr(C, align(64))]
#[derive(Default)]
pub struct RqCounters {
    /// Doorbell rings received (receive completions reaped).
    pub rings_received: AtomicU64,
    /// Completions with an error status, send or receive: the connection
    /// is dead after the first.
    pub cq_errors: AtomicU64,
    /// Zero-copy payload WRITEs (straight from the program's registered
    /// buffer) and their payload bytes. Written under the send-queue lock
    /// (one per record of up to max_record_slots, so rare next to the
    /// doorbell's counters). They live in this line so the header keeps
    /// its size (and version). They are ALSO folded into
    /// `slot_writes`/`slot_bytes` (status from before it showed these two
    /// saw them there); `VerbsCounters` and `ringsock-ctl status` have
    /// them apart as well (`zc_writes`, `zc_bytes`).
    pub zc_writes: AtomicU64,
    pub zc_bytes: AtomicU64,
    /// Records WRITTEN without their header (`FEATURE_HEADERLESS`) and
    /// headers re-sent before a tail word. Written under the send-queue
    /// lock; here for the same reason as the two above. The WRITEs are
    /// also in `slot_writes`/`slot_bytes`, the header-less ones at their
    /// payload's length, each re-sent header as an 8-byte slot write.
    pub headerless_writes: AtomicU64,
    pub headers_resent: AtomicU64,
}

impl SqCounters {
    pub fn snapshot(&self) -> VerbsCounters {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        VerbsCounters {
            wr_posted: l(&self.wr_posted),
            wr_signaled: l(&self.wr_signaled),
            wr_inline: l(&self.wr_inline),
            slot_writes: l(&self.slot_writes),
            slot_bytes: l(&self.slot_bytes),
            word_writes: l(&self.word_writes),
            kicks_sent: l(&self.kicks_sent),
            completions: l(&self.completions),
            rings_received: 0,
            cq_errors: 0,
            zc_writes: 0,
            zc_bytes: 0,
            headerless_writes: 0,
            headers_resent: 0,
        }
    }
}

/// A plain copy of a header's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VerbsCounters {
    pub wr_posted: u64,
    pub wr_signaled: u64,
    pub wr_inline: u64,
    pub slot_writes: u64,
    pub slot_bytes: u64,
    pub word_writes: u64,
    pub kicks_sent: u64,
    pub completions: u64,
    pub rings_received: u64,
    pub cq_errors: u64,
    /// Zero-copy payload WRITEs and bytes (also counted in `slot_writes`
    /// and `slot_bytes`).
    pub zc_writes: u64,
    pub zc_bytes: u64,
    /// Records sent without their header, and headers re-sent.
    pub headerless_writes: u64,
    pub headers_resent: u64,
}

impl VerbsHeader {
    /// Reads every counter (each one atomically; the set is not a
    /// snapshot across counters).
    pub fn counters(&self) -> VerbsCounters {
        VerbsCounters {
            rings_received: self.rq.rings_received.load(Ordering::Relaxed),
            cq_errors: self.rq.cq_errors.load(Ordering::Relaxed),
            zc_writes: self.rq.zc_writes.load(Ordering::Relaxed),
            zc_bytes: self.rq.zc_bytes.load(Ordering::Relaxed),
            headerless_writes: self.rq.headerless_writes.load(Ordering::Relaxed),
            headers_resent: self.rq.headers_resent.load(Ordering::Relaxed),
            ..self.sq.snapshot()
        }
    }

    /// The device name as text (up to the first NUL).
    pub fn device_name(&self) -> String {
        let n = self.device.iter().position(|&b| b == 0).unwrap_or(16);
        String::from_utf8_lossy(&self.device[..n]).into_owned()
    }
}

/// Where the pull-mode counters (`verbs::pull::PullCounters`) start in the
/// header page: `verbs::pull::COUNTERS_IN_HEADER`, restated here because a
/// reader (the daemon) builds without the `verbs` feature. `pull.rs`
/// asserts at compile time that this and every `offsets::PULL_*` match the
/// struct the transport writes.
pub const PULL_COUNTERS_AT: usize = 2048;

/// The field order of `verbs::pull::PullCounters` (eight `AtomicU64`, in
/// `#[repr(C)]`), for the offsets only: never instantiated.
#[repr(C)]
#[allow(dead_code)]
struct PullCountersLayout {
    tx_to_pull: AtomicU64,
    tx_to_push: AtomicU64,
    rx_to_pull: AtomicU64,
    rx_to_push: AtomicU64,
    tail_reads: AtomicU64,
    slot_reads: AtomicU64,
    read_bytes: AtomicU64,
    catchup_writes: AtomicU64,
}

/// Offsets of the fields a reader needs, from the start of the region.
pub mod offsets {
    use super::{PullCountersLayout, RqCounters, SqCounters, VerbsHeader, PULL_COUNTERS_AT};
    use std::mem::offset_of;

    pub const MAGIC: usize = offset_of!(VerbsHeader, magic);
    /// `version | header_len << 32`.
    pub const VERSION_LEN: usize = offset_of!(VerbsHeader, version);
    pub const REGION_LEN: usize = offset_of!(VerbsHeader, region_len);
    pub const OUT_CTRL: usize = offset_of!(VerbsHeader, out_ctrl);
    pub const OUT_SLOTS: usize = offset_of!(VerbsHeader, out_slots);
    pub const IN_CTRL: usize = offset_of!(VerbsHeader, in_ctrl);
    pub const IN_SLOTS: usize = offset_of!(VerbsHeader, in_slots);
    /// `out_slot_count | out_slot_size << 32`.
    pub const OUT_GEOMETRY: usize = offset_of!(VerbsHeader, out_slot_count);
    /// `in_slot_count | in_slot_size << 32`.
    pub const IN_GEOMETRY: usize = offset_of!(VerbsHeader, in_slot_count);
    pub const DEVICE: usize = offset_of!(VerbsHeader, device);
    /// `port | gid_index << 32`.
    pub const PORT_GID: usize = offset_of!(VerbsHeader, port);
    pub const FLAGS: usize = offset_of!(VerbsHeader, flags);
    const SQ: usize = offset_of!(VerbsHeader, sq);
    const RQ: usize = offset_of!(VerbsHeader, rq);
    pub const WR_POSTED: usize = SQ + offset_of!(SqCounters, wr_posted);
    pub const WR_SIGNALED: usize = SQ + offset_of!(SqCounters, wr_signaled);
    pub const WR_INLINE: usize = SQ + offset_of!(SqCounters, wr_inline);
    pub const SLOT_WRITES: usize = SQ + offset_of!(SqCounters, slot_writes);
    pub const SLOT_BYTES: usize = SQ + offset_of!(SqCounters, slot_bytes);
    pub const WORD_WRITES: usize = SQ + offset_of!(SqCounters, word_writes);
    pub const KICKS_SENT: usize = SQ + offset_of!(SqCounters, kicks_sent);
    pub const COMPLETIONS: usize = SQ + offset_of!(SqCounters, completions);
    pub const RINGS_RECEIVED: usize = RQ + offset_of!(RqCounters, rings_received);
    pub const CQ_ERRORS: usize = RQ + offset_of!(RqCounters, cq_errors);
    pub const ZC_WRITES: usize = RQ + offset_of!(RqCounters, zc_writes);
    pub const ZC_BYTES: usize = RQ + offset_of!(RqCounters, zc_bytes);
    pub const HEADERLESS_WRITES: usize = RQ + offset_of!(RqCounters, headerless_writes);
    pub const HEADERS_RESENT: usize = RQ + offset_of!(RqCounters, headers_resent);
    const PULL: usize = PULL_COUNTERS_AT;
    pub const PULL_TX_TO_PULL: usize = PULL + offset_of!(PullCountersLayout, tx_to_pull);
    pub const PULL_TX_TO_PUSH: usize = PULL + offset_of!(PullCountersLayout, tx_to_push);
    pub const PULL_RX_TO_PULL: usize = PULL + offset_of!(PullCountersLayout, rx_to_pull);
    pub const PULL_RX_TO_PUSH: usize = PULL + offset_of!(PullCountersLayout, rx_to_push);
    pub const PULL_TAIL_READS: usize = PULL + offset_of!(PullCountersLayout, tail_reads);
    pub const PULL_SLOT_READS: usize = PULL + offset_of!(PullCountersLayout, slot_reads);
    pub const PULL_READ_BYTES: usize = PULL + offset_of!(PullCountersLayout, read_bytes);
    pub const PULL_CATCHUP_WRITES: usize = PULL + offset_of!(PullCountersLayout, catchup_writes);
}

const _: () = {
    assert!(std::mem::size_of::<VerbsHeader>() <= VERBS_HEADER_PAGE);
    // The pairs a reader decodes from one little-endian word.
    assert!(offsets::VERSION_LEN.is_multiple_of(8));
    assert!(std::mem::offset_of!(VerbsHeader, header_len) == offsets::VERSION_LEN + 4);
    assert!(offsets::OUT_GEOMETRY.is_multiple_of(8));
    assert!(std::mem::offset_of!(VerbsHeader, out_slot_size) == offsets::OUT_GEOMETRY + 4);
    assert!(offsets::IN_GEOMETRY.is_multiple_of(8));
    assert!(std::mem::offset_of!(VerbsHeader, in_slot_size) == offsets::IN_GEOMETRY + 4);
    assert!(offsets::PORT_GID.is_multiple_of(8));
    assert!(std::mem::offset_of!(VerbsHeader, gid_index) == offsets::PORT_GID + 4);
    assert!(offsets::DEVICE.is_multiple_of(8));
    // The doorbell thread's counters never share a line with the
    // send-queue ones.
    assert!(offsets::RINGS_RECEIVED / 64 != offsets::COMPLETIONS / 64);
    assert!(offsets::WR_POSTED.is_multiple_of(64));
    // The zero-copy counters did not grow the header (same line as rq).
    assert!(std::mem::size_of::<RqCounters>() == 64);
    // The pull counters lie past the header, inside the header page, and
    // are 8-aligned (atomic loads).
    assert!(std::mem::size_of::<VerbsHeader>() <= PULL_COUNTERS_AT);
    assert!(PULL_COUNTERS_AT.is_multiple_of(8));
    assert!(PULL_COUNTERS_AT + std::mem::size_of::<PullCountersLayout>() <= VERBS_HEADER_PAGE);
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn magic_spells_its_name() {
        assert_eq!(&VERBS_MAGIC.to_le_bytes(), b"RSVERBS1");
    }
}
