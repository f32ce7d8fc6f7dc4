//! Ring memfds passed with connection reports: mapped read-only so status
//! can show live counters, plus the hook that turns a ring into counters.
//!
//! `SegmentStats` reads the counters of the shim's segments and
//! `VerbsStats` those of a verbs connection end's region (layouts from the
//! ring crate; `AnyRingStats` picks one by magic); `MemfdStats` is what
//! the daemon can see for itself. A
//! hostile process must not be able to crash the daemon through the
//! mapping: the memfd is mapped
//! only if it is sealed against shrinking (F_SEAL_SHRINK), because reading
//! a page past the end of a shrunk file raises SIGBUS.

use std::os::fd::{AsRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use ringsock_proto::RingStat;

/// At most this much of a segment is mapped (virtual memory only: the
/// daemon touches the header and control pages, nothing else). Covers the
/// default 2 MiB segments with room for larger ring knobs; the rings of a
/// bigger segment that lie beyond it show no counters.
pub const RING_MAP_MAX: usize = 16 << 20;

/// A read-only shared mapping, unmapped on drop.
struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: ptr/len are exactly what mmap returned; nothing borrows
        // the mapping beyond the RingMap that owns it.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

/// A ring memfd held for status, with its mapping when it was safe to map.
pub struct RingMap {
    _fd: OwnedFd,
    size: u64,
    sealed: bool,
    map: Option<Mapping>,
}

impl RingMap {
    /// Never fails: a descriptor that cannot be mapped is still shown (with
    /// what fstat says), it just has no counters.
    pub fn open(fd: OwnedFd) -> RingMap {
        let raw = fd.as_raw_fd();
        // SAFETY: stat is plain old data; fstat fills it.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: st is a writable stat buffer.
        let is_file = unsafe { libc::fstat(raw, &mut st) } == 0
            && (st.st_mode & libc::S_IFMT) == libc::S_IFREG;
        let size = if is_file { st.st_size.max(0) as u64 } else { 0 };
        // SAFETY: F_GET_SEALS only queries the file.
        let seals = unsafe { libc::fcntl(raw, libc::F_GET_SEALS) };
        let sealed = seals >= 0 && seals & libc::F_SEAL_SHRINK != 0;
        let len = (size.min(RING_MAP_MAX as u64)) as usize;
        let map = if is_file && sealed && len > 0 {
            // SAFETY: a fresh read-only shared mapping of `len` bytes of a
            // regular file at least that long that can no longer shrink.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ,
                    libc::MAP_SHARED,
                    raw,
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                None
            } else {
                NonNull::new(p.cast::<u8>()).map(|ptr| Mapping { ptr, len })
            }
        } else {
            None
        };
        RingMap {
            _fd: fd,
            size,
            sealed,
            map,
        }
    }

    pub fn view(&self) -> RingView<'_> {
        RingView { ring: self }
    }
}

/// What a stats provider may look at.
pub struct RingView<'a> {
    ring: &'a RingMap,
}

impl RingView<'_> {
    /// File size of the memfd.
    pub fn size(&self) -> u64 {
        self.ring.size
    }

    pub fn is_mapped(&self) -> bool {
        self.ring.map.is_some()
    }

    pub fn is_sealed(&self) -> bool {
        self.ring.sealed
    }

    /// Atomically reads the 8-byte counter at `offset` (which must be
    /// 8-aligned and inside the mapping). The owning process updates the
    /// counters concurrently, hence atomic loads, never plain reads.
    pub fn load_u64(&self, offset: usize) -> Option<u64> {
        let m = self.ring.map.as_ref()?;
        if !offset.is_multiple_of(8) || offset.checked_add(8)? > m.len {
            return None;
        }
        // SAFETY: the mapping is page-aligned, so ptr+offset is 8-aligned,
        // and offset+8 <= len keeps the read inside it; the file cannot
        // shrink (sealed), so the page is always backed. AtomicU64 has the
        // layout of u64 and shared memory written by another process is
        // exactly what atomics are for.
        let v = unsafe { &*(m.ptr.as_ptr().add(offset) as *const AtomicU64) };
        Some(v.load(Ordering::Relaxed))
    }
}

/// Turns a ring into status counters; the daemon uses `AnyRingStats`,
/// which picks `SegmentStats` (shm segments) or `VerbsStats` (verbs
/// regions) by the memfd's magic.
pub trait RingStats {
    fn stats(&self, ring: &RingView<'_>) -> Vec<RingStat>;
}

/// The layout-agnostic provider: what the daemon knows without reading.
pub struct MemfdStats;

impl RingStats for MemfdStats {
    fn stats(&self, ring: &RingView<'_>) -> Vec<RingStat> {
        vec![
            RingStat {
                name: "memfd_size".into(),
                value: ring.size(),
            },
            RingStat {
                name: "mapped".into(),
                value: u64::from(ring.is_mapped()),
            },
        ]
    }
}

/// The shim's segments (`ringsock_ring::Segment`): header, then per ring a
/// `RingControl` block with the RB2 pointers and counters. Every value read
/// comes from a process the daemon does not trust: the header is checked
/// (magic, version, geometry) and every offset bounds-checked by
/// `load_u64`, so a garbage segment yields fewer counters, never a crash.
pub struct SegmentStats;

/// Which way each ring of a shim segment carries bytes.
const DIRECTIONS: [&str; 2] = ["c2s", "s2c"];

mod layout {
    use ringsock_ring::layout::{ReceiverCounters, RingControl, SenderCounters};
    use ringsock_ring::transport::shm::SegmentHeader;
    use std::mem::offset_of;

    pub const MAGIC: usize = offset_of!(SegmentHeader, magic);
    pub const VERSION_RINGS: usize = offset_of!(SegmentHeader, version);
    pub const SLOTS_SIZE: usize = offset_of!(SegmentHeader, slots);
    pub const TAIL: usize = offset_of!(RingControl, tail);
    pub const HEAD: usize = offset_of!(RingControl, head);
    const TX: usize = offset_of!(RingControl, tx_stats);
    const RX: usize = offset_of!(RingControl, rx_stats);
    pub const TX_BYTES: usize = TX + offset_of!(SenderCounters, bytes);
    pub const TX_RECORDS: usize = TX + offset_of!(SenderCounters, records);
    pub const TX_SLOTS: usize = TX + offset_of!(SenderCounters, slots);
    pub const TX_TAIL_WRITES: usize = TX + offset_of!(SenderCounters, tail_writes);
    pub const TX_SPINS: usize = TX + offset_of!(SenderCounters, spins);
    pub const RX_SPINS: usize = RX + offset_of!(ReceiverCounters, spins);
    pub const TX_SLEEPS: usize = TX + offset_of!(SenderCounters, sleeps);
    pub const RX_SLEEPS: usize = RX + offset_of!(ReceiverCounters, sleeps);
    pub const TX_WAKEUPS: usize = TX + offset_of!(SenderCounters, wakeups);
    pub const RX_WAKEUPS: usize = RX + offset_of!(ReceiverCounters, wakeups);
}

impl SegmentStats {
    /// (rings, slots, slot_size) if the header describes a segment.
    fn geometry(ring: &RingView<'_>) -> Option<(u32, u32, u32)> {
        if ring.load_u64(layout::MAGIC)? != ringsock_ring::transport::shm::SEGMENT_MAGIC {
            return None;
        }
        // Two u32 fields per word, little-endian layout of a repr(C) struct.
        let vr = ring.load_u64(layout::VERSION_RINGS)?;
        let ss = ring.load_u64(layout::SLOTS_SIZE)?;
        let (version, rings) = (vr as u32, (vr >> 32) as u32);
        let (slots, slot_size) = (ss as u32, (ss >> 32) as u32);
        if version != ringsock_ring::transport::shm::SEGMENT_VERSION
            || rings == 0
            || rings > 8
            || slots == 0
            || slot_size == 0
        {
            return None;
        }
        Some((rings, slots, slot_size))
    }
}

impl RingStats for SegmentStats {
    fn stats(&self, ring: &RingView<'_>) -> Vec<RingStat> {
        let Some((rings, slots, slot_size)) = Self::geometry(ring) else {
            return MemfdStats.stats(ring);
        };
        let mut out = Vec::new();
        for (i, dir) in DIRECTIONS.iter().enumerate().take(rings as usize) {
            let Some(base) =
                ringsock_ring::transport::shm::control_offset(i as u32, slots, slot_size)
            else {
                break;
            };
            let at = |off: usize| base.checked_add(off).and_then(|o| ring.load_u64(o));
            let mut put = |name: &str, v: Option<u64>| {
                if let Some(value) = v {
                    out.push(RingStat {
                        name: format!("{dir}_{name}"),
                        value,
                    });
                }
            };
            let sum = |a: Option<u64>, b: Option<u64>| Some(a?.wrapping_add(b?));
            put("bytes", at(layout::TX_BYTES));
            put("records", at(layout::TX_RECORDS));
            put("slots", at(layout::TX_SLOTS));
            put("batches", at(layout::TX_TAIL_WRITES));
            // Mirrors of the two pointers, so at most a batch stale.
            let occ = at(layout::TAIL)
                .zip(at(layout::HEAD))
                .map(|(t, h)| t.saturating_sub(h));
            put("occupancy", occ);
            put("spins", sum(at(layout::TX_SPINS), at(layout::RX_SPINS)));
            put("sleeps", sum(at(layout::TX_SLEEPS), at(layout::RX_SLEEPS)));
            put(
                "wakeups",
                sum(at(layout::TX_WAKEUPS), at(layout::RX_WAKEUPS)),
            );
        }
        out
    }
}

/// One end of a verbs connection (`ringsock_ring::transport::verbs`): the memfd
/// starts with a `VerbsHeader` page (magic "RSVERBS1", version, offsets of
/// the end's two control blocks, geometry, device, and the transport's
/// verbs counters). As with segments, every field is untrusted: magic,
/// version and header length are checked, every control-block offset is
/// bounds-checked by `load_u64`, and a header that fails a check yields
/// fewer counters, never a crash.
///
/// Directions are the reporting end's view: `out_*` come from the sender
/// counters of its outgoing ring's control block, `in_*` from the receiver
/// counters of its incoming ring's. The list: six ring counters, the ten
/// verbs counters (`VERBS_COUNTERS`), then the zero-copy and pull-mode
/// ones (`VERBS_EXTRA_COUNTERS`), 26 of the `MAX_RING_STATS` (32) an entry
/// may carry. The first 16 are the ones status showed before the limit
/// was raised; a reply to the old `Status` request is cut to those.
pub struct VerbsStats;

/// The verbs counters a header carries, in report order.
pub const VERBS_COUNTERS: [(&str, usize); 10] = {
    use ringsock_ring::transport::verbs::stats::offsets as o;
    [
        ("wr_posted", o::WR_POSTED),
        ("wr_signaled", o::WR_SIGNALED),
        ("wr_inline", o::WR_INLINE),
        ("slot_writes", o::SLOT_WRITES),
        ("slot_bytes", o::SLOT_BYTES),
        ("word_writes", o::WORD_WRITES),
        ("kicks_sent", o::KICKS_SENT),
        ("rings_received", o::RINGS_RECEIVED),
        ("completions", o::COMPLETIONS),
        ("cq_errors", o::CQ_ERRORS),
    ]
};

/// After `VERBS_COUNTERS`: zero-copy WRITEs and their bytes (also counted
/// in `slot_writes`/`slot_bytes`), records sent without their header and
/// headers re-sent (`ringsock_ring::transport::verbs::headerless`), then
/// the pull-mode counters of the header page (`verbs::pull::PullCounters`):
/// switches of the outgoing ring (`tx_*`) and mode words seen on the
/// incoming one (`rx_*`), READs this end posted and their bytes, catch-up
/// WRITEs. Named as the fields
/// of `PullCounters`/`PullStats`.
pub const VERBS_EXTRA_COUNTERS: [(&str, usize); 12] = {
    use ringsock_ring::transport::verbs::stats::offsets as o;
    [
        ("zc_writes", o::ZC_WRITES),
        ("zc_bytes", o::ZC_BYTES),
        ("headerless_writes", o::HEADERLESS_WRITES),
        ("headers_resent", o::HEADERS_RESENT),
        ("tx_to_pull", o::PULL_TX_TO_PULL),
        ("tx_to_push", o::PULL_TX_TO_PUSH),
        ("rx_to_pull", o::PULL_RX_TO_PULL),
        ("rx_to_push", o::PULL_RX_TO_PUSH),
        ("tail_reads", o::PULL_TAIL_READS),
        ("slot_reads", o::PULL_SLOT_READS),
        ("read_bytes", o::PULL_READ_BYTES),
        ("catchup_writes", o::PULL_CATCHUP_WRITES),
    ]
};

// Everything a verbs entry lists fits in one entry.
const _: () = assert!(
    6 + VERBS_COUNTERS.len() + VERBS_EXTRA_COUNTERS.len() <= ringsock_proto::MAX_RING_STATS
);

mod vlayout {
    use ringsock_ring::layout::{ReceiverCounters, RingControl, SenderCounters};
    use std::mem::offset_of;

    pub const TAIL: usize = offset_of!(RingControl, tail);
    /// In a verbs sender copy the peer's receiver WRITEs its head here.
    pub const LOCAL_HEAD: usize = offset_of!(RingControl, local_head);
    const TX: usize = offset_of!(RingControl, tx_stats);
    const RX: usize = offset_of!(RingControl, rx_stats);
    pub const TX_BYTES: usize = TX + offset_of!(SenderCounters, bytes);
    pub const TX_RECORDS: usize = TX + offset_of!(SenderCounters, records);
    pub const TX_SLEEPS: usize = TX + offset_of!(SenderCounters, sleeps);
    pub const RX_BYTES: usize = RX + offset_of!(ReceiverCounters, bytes);
    pub const RX_SLEEPS: usize = RX + offset_of!(ReceiverCounters, sleeps);
}

impl VerbsStats {
    /// Whether the memfd starts with a verbs header this daemon can read.
    fn recognizes(ring: &RingView<'_>) -> bool {
        use ringsock_ring::transport::verbs::stats::{
            offsets, VerbsHeader, VERBS_MAGIC, VERBS_VERSION,
        };
        let Some(vl) = ring.load_u64(offsets::VERSION_LEN) else {
            return false;
        };
        let (version, len) = (vl as u32, (vl >> 32) as usize);
        ring.load_u64(offsets::MAGIC) == Some(VERBS_MAGIC)
            && version == VERBS_VERSION
            && (std::mem::size_of::<VerbsHeader>()..=4096).contains(&len)
    }
}

impl RingStats for VerbsStats {
    fn stats(&self, ring: &RingView<'_>) -> Vec<RingStat> {
        use ringsock_ring::transport::verbs::stats::offsets;
        if !Self::recognizes(ring) {
            return MemfdStats.stats(ring);
        }
        let mut out = Vec::new();
        let mut put = |name: &str, v: Option<u64>| {
            if let Some(value) = v {
                out.push(RingStat {
                    name: name.to_owned(),
                    value,
                });
            }
        };
        // A control block's counter: its offset comes from the header, so
        // it is added with overflow checks and read only inside the map.
        let at = |base: Option<u64>, off: usize| {
            let base = usize::try_from(base?).ok()?;
            ring.load_u64(base.checked_add(off)?)
        };
        let out_ctrl = ring.load_u64(offsets::OUT_CTRL);
        let in_ctrl = ring.load_u64(offsets::IN_CTRL);
        put("out_bytes", at(out_ctrl, vlayout::TX_BYTES));
        put("out_records", at(out_ctrl, vlayout::TX_RECORDS));
        let occ = at(out_ctrl, vlayout::TAIL)
            .zip(at(out_ctrl, vlayout::LOCAL_HEAD))
            .map(|(t, h)| t.saturating_sub(h));
        put("out_occupancy", occ);
        put("out_sleeps", at(out_ctrl, vlayout::TX_SLEEPS));
        put("in_bytes", at(in_ctrl, vlayout::RX_BYTES));
        put("in_sleeps", at(in_ctrl, vlayout::RX_SLEEPS));
        for (name, off) in VERBS_COUNTERS.into_iter().chain(VERBS_EXTRA_COUNTERS) {
            put(name, ring.load_u64(off));
        }
        out
    }
}

/// What the daemon uses: picks the provider by the memfd's magic (a shim
/// segment or a verbs region), else what it knows without reading.
pub struct AnyRingStats;

impl RingStats for AnyRingStats {
    fn stats(&self, ring: &RingView<'_>) -> Vec<RingStat> {
        if SegmentStats::geometry(ring).is_some() {
            SegmentStats.stats(ring)
        } else if VerbsStats::recognizes(ring) {
            VerbsStats.stats(ring)
        } else {
            MemfdStats.stats(ring)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::FromRawFd;

    fn memfd(size: i64, seal: bool) -> OwnedFd {
        // SAFETY: plain memfd_create/ftruncate/fcntl on a fresh fd that the
        // OwnedFd then owns.
        unsafe {
            let fd = libc::memfd_create(
                c"ring-test".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            );
            assert!(fd >= 0);
            assert_eq!(libc::ftruncate(fd, size), 0);
            if seal {
                assert_eq!(libc::fcntl(fd, libc::F_ADD_SEALS, libc::F_SEAL_SHRINK), 0);
            }
            OwnedFd::from_raw_fd(fd)
        }
    }

    fn write_at(fd: &OwnedFd, off: i64, v: u64) {
        let b = v.to_ne_bytes();
        // SAFETY: b is a readable 8-byte buffer.
        let n = unsafe { libc::pwrite(fd.as_raw_fd(), b.as_ptr().cast(), 8, off) };
        assert_eq!(n, 8);
    }

    #[test]
    fn sealed_memfd_is_mapped_and_readable() {
        let fd = memfd(4096, true);
        let dup = fd.try_clone().unwrap();
        let r = RingMap::open(fd);
        let v = r.view();
        assert!(v.is_mapped() && v.is_sealed());
        assert_eq!(v.size(), 4096);
        write_at(&dup, 16, 0xabcdef);
        assert_eq!(v.load_u64(16), Some(0xabcdef));
        assert_eq!(v.load_u64(17), None);
        assert_eq!(v.load_u64(4096), None);
        assert_eq!(v.load_u64(usize::MAX - 3), None);
        let s = MemfdStats.stats(&v);
        assert_eq!(s[0].value, 4096);
        assert_eq!(s[1].value, 1);
    }

    #[test]
    fn segment_counters_are_read_from_a_live_ring() {
        use ringsock_ring::{Receiver, RingConfig, Segment, Sender, ShmTransport};
        let cfg = RingConfig::default();
        let seg = Segment::create(&cfg, 2).unwrap();
        let mut tx = Sender::new(seg.ring(1), ShmTransport::new(seg.ring(1), None), cfg).unwrap();
        let mut rx = Receiver::new(seg.ring(1), ShmTransport::new(seg.ring(1), None), cfg).unwrap();
        tx.write(&[7u8; 1000]).unwrap();
        tx.flush().unwrap();
        let mut buf = [0u8; 400];
        assert_eq!(rx.read(&mut buf).unwrap(), 400);
        let map = RingMap::open(seg.share_fd().unwrap());
        let stats = SegmentStats.stats(&map.view());
        let get = |n: &str| stats.iter().find(|s| s.name == n).map(|s| s.value);
        assert_eq!(get("s2c_bytes"), Some(1000));
        assert_eq!(get("c2s_bytes"), Some(0));
        assert!(get("s2c_batches").unwrap() >= 1);
        assert!(stats.len() <= ringsock_proto::MAX_RING_STATS);
    }

    #[test]
    fn garbage_segments_give_fewer_counters_not_a_crash() {
        // Sealed, right size, but the header is garbage.
        let fd = memfd(3 << 20, true);
        let dup = fd.try_clone().unwrap();
        write_at(&dup, 0, ringsock_ring::transport::shm::SEGMENT_MAGIC);
        write_at(
            &dup,
            8,
            u64::from(ringsock_ring::transport::shm::SEGMENT_VERSION) | 2 << 32,
        );
        // A geometry that points far past the mapping.
        write_at(&dup, 16, u64::from(u32::MAX) | u64::from(u32::MAX) << 32);
        let map = RingMap::open(fd);
        let stats = SegmentStats.stats(&map.view());
        // Ring 0's control block is at a fixed offset and readable; ring 1's
        // lies beyond the mapping and is skipped.
        assert!(stats.iter().all(|s| s.name.starts_with("c2s_")));
        // Wrong magic: only what the daemon knows by itself.
        let map = RingMap::open(memfd(8192, true));
        let stats = SegmentStats.stats(&map.view());
        assert_eq!(stats[0].name, "memfd_size");
    }

    #[test]
    fn truncated_segments_give_what_fits() {
        // A valid header for two default rings, but the file ends 64 bytes
        // into ring 0's control block: only what lies inside is read (the
        // page holding the end of the file is mapped, nothing past it).
        let cfg = ringsock_ring::RingConfig::default();
        let fd = memfd(4096 + 64, true);
        let dup = fd.try_clone().unwrap();
        write_at(&dup, 0, ringsock_ring::transport::shm::SEGMENT_MAGIC);
        write_at(
            &dup,
            8,
            u64::from(ringsock_ring::transport::shm::SEGMENT_VERSION) | 2 << 32,
        );
        write_at(
            &dup,
            16,
            u64::from(cfg.slots) | u64::from(cfg.slot_size) << 32,
        );
        write_at(&dup, 4096, 5); // ring 0's tail
        let map = RingMap::open(fd);
        assert!(map.view().is_mapped());
        assert_eq!(map.view().load_u64(4096), Some(5));
        assert_eq!(map.view().load_u64(4096 + 64), None);
        let stats = SegmentStats.stats(&map.view());
        assert!(
            stats.iter().all(|s| s.name.starts_with("c2s_")),
            "{stats:?}"
        );
        // Every counter lies past the end of the file: none is invented.
        assert!(stats.is_empty(), "{stats:?}");
    }

    #[test]
    fn unsealed_memfd_is_not_mapped() {
        let r = RingMap::open(memfd(4096, false));
        assert!(!r.view().is_mapped());
        assert_eq!(r.view().size(), 4096);
        assert_eq!(r.view().load_u64(0), None);
    }

    #[test]
    fn non_files_are_harmless() {
        let mut p = [0; 2];
        // SAFETY: p is a writable array of two ints.
        assert_eq!(unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: both ends are fresh and owned here only.
        let (a, _b) = unsafe { (OwnedFd::from_raw_fd(p[0]), OwnedFd::from_raw_fd(p[1])) };
        let r = RingMap::open(a);
        assert!(!r.view().is_mapped());
        assert_eq!(r.view().size(), 0);
    }

    mod verbs {
        use super::*;
        use ringsock_ring::transport::verbs::stats::{
            offsets, VerbsHeader, VERBS_MAGIC, VERBS_VERSION,
        };

        const OUT: u64 = 4096;
        const IN: u64 = 8192;

        /// A sealed memfd with a valid verbs header, both control blocks
        /// and counter values that name their counter.
        fn region(size: i64) -> (OwnedFd, OwnedFd) {
            let fd = memfd(size, true);
            let dup = fd.try_clone().unwrap();
            let hl = std::mem::size_of::<VerbsHeader>() as u64;
            write_at(&dup, offsets::MAGIC as i64, VERBS_MAGIC);
            write_at(
                &dup,
                offsets::VERSION_LEN as i64,
                u64::from(VERBS_VERSION) | hl << 32,
            );
            write_at(&dup, offsets::OUT_CTRL as i64, OUT);
            write_at(&dup, offsets::IN_CTRL as i64, IN);
            for (i, (_, off)) in VERBS_COUNTERS.iter().enumerate() {
                write_at(&dup, *off as i64, 100 + i as u64);
            }
            // Only what lies inside the file (writing past it would grow it).
            for (i, (_, off)) in VERBS_EXTRA_COUNTERS.iter().enumerate() {
                if *off as i64 + 8 <= size {
                    write_at(&dup, *off as i64, extra_value(i));
                }
            }
            (fd, dup)
        }

        /// A value per extra counter that no other counter (nor a
        /// neighbour's offset read by mistake) has.
        fn extra_value(i: usize) -> u64 {
            0x5000 + 17 * i as u64
        }

        /// Every counter a verbs entry lists, in report order.
        fn all_names() -> Vec<&'static str> {
            let ring = [
                "out_bytes",
                "out_records",
                "out_occupancy",
                "out_sleeps",
                "in_bytes",
                "in_sleeps",
            ];
            ring.into_iter()
                .chain(VERBS_COUNTERS.iter().map(|c| c.0))
                .chain(VERBS_EXTRA_COUNTERS.iter().map(|c| c.0))
                .collect()
        }

        fn write_ctrl(dup: &OwnedFd) {
            write_at(dup, (OUT as usize + vlayout::TX_BYTES) as i64, 5000);
            write_at(dup, (OUT as usize + vlayout::TX_RECORDS) as i64, 50);
            write_at(dup, (OUT as usize + vlayout::TAIL) as i64, 9);
            write_at(dup, (OUT as usize + vlayout::LOCAL_HEAD) as i64, 7);
            write_at(dup, (OUT as usize + vlayout::TX_SLEEPS) as i64, 3);
            write_at(dup, (IN as usize + vlayout::RX_BYTES) as i64, 6000);
            write_at(dup, (IN as usize + vlayout::RX_SLEEPS) as i64, 4);
        }

        fn get(stats: &[RingStat], n: &str) -> Option<u64> {
            stats.iter().find(|s| s.name == n).map(|s| s.value)
        }

        #[test]
        fn a_valid_header_gives_ring_and_verbs_counters() {
            let (fd, dup) = region(3 * 4096);
            write_ctrl(&dup);
            let map = RingMap::open(fd);
            let stats = AnyRingStats.stats(&map.view());
            let names: Vec<&str> = stats.iter().map(|s| s.name.as_str()).collect();
            assert_eq!(names, all_names());
            assert_eq!(stats.len(), 28);
            assert!(stats.len() <= ringsock_proto::MAX_RING_STATS);
            // The first 16 are the ones status listed before the limit was
            // raised (a reply to the old `Status` request keeps only them).
            assert_eq!(names[ringsock_proto::MAX_RING_STATS_V1 - 1], "cq_errors");
            assert_eq!(get(&stats, "out_bytes"), Some(5000));
            assert_eq!(get(&stats, "out_records"), Some(50));
            assert_eq!(get(&stats, "out_occupancy"), Some(2));
            assert_eq!(get(&stats, "out_sleeps"), Some(3));
            assert_eq!(get(&stats, "in_bytes"), Some(6000));
            assert_eq!(get(&stats, "in_sleeps"), Some(4));
            for (i, (name, _)) in VERBS_COUNTERS.iter().enumerate() {
                assert_eq!(get(&stats, name), Some(100 + i as u64), "{name}");
            }
            for (i, (name, _)) in VERBS_EXTRA_COUNTERS.iter().enumerate() {
                assert_eq!(get(&stats, name), Some(extra_value(i)), "{name}");
            }
            assert!(stats
                .iter()
                .all(|s| s.name.len() <= ringsock_proto::MAX_STAT_NAME));
            // Counters move while the map is held: they are read live.
            write_at(&dup, offsets::CQ_ERRORS as i64, 1);
            assert_eq!(get(&VerbsStats.stats(&map.view()), "cq_errors"), Some(1));
            write_at(&dup, offsets::PULL_SLOT_READS as i64, 77);
            write_at(&dup, offsets::ZC_BYTES as i64, 1 << 40);
            let stats = VerbsStats.stats(&map.view());
            assert_eq!(get(&stats, "slot_reads"), Some(77));
            assert_eq!(get(&stats, "zc_bytes"), Some(1 << 40));
        }

        /// The pull counters are where the transport writes them: through
        /// `PullCounters` itself at `COUNTERS_IN_HEADER` (the static
        /// assertions in pull.rs tie the offsets to it; this is the same
        /// check from the reader's side, on an independently built value).
        #[test]
        fn pull_counters_follow_the_header_page_layout() {
            let names = ["tx_to_pull", "tx_to_push", "rx_to_pull", "rx_to_push"]
                .into_iter()
                .chain(["tail_reads", "slot_reads", "read_bytes", "catchup_writes"]);
            for (i, name) in names.enumerate() {
                let off = VERBS_EXTRA_COUNTERS
                    .iter()
                    .find(|c| c.0 == name)
                    .unwrap_or_else(|| panic!("{name} is not listed"))
                    .1;
                assert_eq!(off, 2048 + 8 * i, "{name}");
            }
            assert_eq!(VERBS_EXTRA_COUNTERS[0], ("zc_writes", offsets::ZC_WRITES));
            assert_eq!(VERBS_EXTRA_COUNTERS[1], ("zc_bytes", offsets::ZC_BYTES));
        }

        #[test]
        fn wrong_magic_version_or_length_is_not_a_verbs_region() {
            for (off, v) in [
                (offsets::MAGIC, 0x4141_4141_4141_4141u64),
                (offsets::VERSION_LEN, 2 | 400 << 32),
                (offsets::VERSION_LEN, u64::from(VERBS_VERSION) | 8 << 32),
                (offsets::VERSION_LEN, u64::from(VERBS_VERSION) | 5000 << 32),
            ] {
                let (fd, dup) = region(3 * 4096);
                write_ctrl(&dup);
                write_at(&dup, off as i64, v);
                let stats = AnyRingStats.stats(&RingMap::open(fd).view());
                assert_eq!(stats[0].name, "memfd_size", "{off} {v:#x}");
                assert_eq!(stats.len(), 2);
            }
        }

        #[test]
        fn garbage_offsets_give_fewer_counters_not_a_crash() {
            let hostile = [
                u64::MAX,
                u64::MAX - 7,
                usize::MAX as u64 - 64,
                3 * 4096 - 8,
                3 * 4096,
                1 << 40,
                4095,
                4097,
                0,
            ];
            for &o in &hostile {
                for &i in &hostile {
                    let (fd, dup) = region(3 * 4096);
                    write_at(&dup, offsets::OUT_CTRL as i64, o);
                    write_at(&dup, offsets::IN_CTRL as i64, i);
                    let stats = AnyRingStats.stats(&RingMap::open(fd).view());
                    // The header's own counters are always there.
                    for (name, _) in VERBS_COUNTERS.into_iter().chain(VERBS_EXTRA_COUNTERS) {
                        assert!(get(&stats, name).is_some(), "{o:#x} {i:#x}: {name}");
                    }
                    assert!(stats.len() <= ringsock_proto::MAX_RING_STATS);
                    if o >= 3 * 4096 {
                        assert!(
                            stats.iter().all(|s| !s.name.starts_with("out_")),
                            "{o:#x}: {stats:?}"
                        );
                    }
                }
            }
        }

        #[test]
        fn random_header_bytes_never_crash() {
            let mut x = 0x9e37_79b9_7f4a_7c15u64;
            for round in 0..200 {
                let (fd, dup) = region(3 * 4096);
                // Keep magic/version valid in half the rounds so the
                // offsets and counters behind them are garbage too.
                let from = if round % 2 == 0 { 16 } else { 0 };
                for off in (from..512).step_by(8) {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    write_at(&dup, off, x);
                }
                let stats = AnyRingStats.stats(&RingMap::open(fd).view());
                assert!(stats.len() <= ringsock_proto::MAX_RING_STATS);
            }
        }

        #[test]
        fn truncated_regions_give_what_fits() {
            // Header page only: the control blocks lie past the end.
            let (fd, _dup) = region(4096);
            let stats = AnyRingStats.stats(&RingMap::open(fd).view());
            assert!(stats.iter().all(|s| !s.name.starts_with("out_")));
            assert!(stats.iter().all(|s| !s.name.starts_with("in_")));
            assert_eq!(
                stats.len(),
                VERBS_COUNTERS.len() + VERBS_EXTRA_COUNTERS.len(),
                "{stats:?}"
            );
            assert_eq!(get(&stats, "catchup_writes"), Some(extra_value(11)));
            // Ends three words into the pull counters: those three are
            // read, the five past the end of the file are not.
            let (fd, _dup) = region(2048 + 24);
            let stats = AnyRingStats.stats(&RingMap::open(fd).view());
            let names: Vec<&str> = stats.iter().map(|s| s.name.as_str()).collect();
            assert_eq!(names.last(), Some(&"rx_to_pull"), "{names:?}");
            assert_eq!(get(&stats, "tx_to_pull"), Some(extra_value(4)));
            assert_eq!(get(&stats, "rx_to_pull"), Some(extra_value(6)));
            assert_eq!(get(&stats, "rx_to_push"), None);
            assert_eq!(get(&stats, "zc_bytes"), Some(extra_value(1)));
            // Ends inside the out control block: a counter beyond the end
            // of the file is not read (the mapping covers the file only).
            let (fd, dup) = region(4096 + 64);
            write_at(&dup, (OUT as usize + vlayout::TAIL) as i64, 9);
            let stats = AnyRingStats.stats(&RingMap::open(fd).view());
            assert_eq!(get(&stats, "out_bytes"), None);
            assert_eq!(get(&stats, "out_occupancy"), None);
            // Shorter than the header: magic and version fit, the counters
            // do not.
            let fd = memfd(64, true);
            let dup = fd.try_clone().unwrap();
            let hl = std::mem::size_of::<VerbsHeader>() as u64;
            write_at(&dup, 0, VERBS_MAGIC);
            write_at(&dup, 8, u64::from(VERBS_VERSION) | hl << 32);
            let stats = AnyRingStats.stats(&RingMap::open(fd).view());
            assert!(stats.is_empty(), "{stats:?}");
        }

        #[test]
        fn unsealed_regions_are_not_read() {
            let fd = memfd(3 * 4096, false);
            write_at(&fd, 0, VERBS_MAGIC);
            let stats = AnyRingStats.stats(&RingMap::open(fd).view());
            assert_eq!(get(&stats, "mapped"), Some(0));
        }

        #[test]
        fn segments_still_go_to_the_segment_provider() {
            let cfg = ringsock_ring::RingConfig::default();
            let seg = ringsock_ring::Segment::create(&cfg, 2).unwrap();
            let map = RingMap::open(seg.share_fd().unwrap());
            let stats = AnyRingStats.stats(&map.view());
            assert!(get(&stats, "c2s_bytes").is_some(), "{stats:?}");
        }
    }
}
