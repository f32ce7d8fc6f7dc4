//! One verbs ring connection end: a registered region holding this end's
//! two ring copies, one RC queue pair, its completion queues, and the
//! transports and doorbell built on them.

use super::device::Device;
use super::headerless;
use super::pull::PullKnobs;
use crate::config::RingConfig;
use crate::error::RingError;
use crate::receiver::Receiver;
use crate::sender::Sender;
use crate::transport::ExternalSrc;
use rdma_sys::*;
use std::collections::VecDeque;
use std::os::fd::OwnedFd;
use std::sync::atomic::AtomicU32;
use std::sync::{Arc, Mutex, MutexGuard};

mod connect;
mod create;
mod doorbell;
mod headerless_io;
// Pull mode's verbs glue: a child module, so it sees the queue pair.
mod pull_io;
mod region;
mod rq;
mod sq;
mod transport;

const PAGE: usize = 4096;
const HUGE: usize = 2 << 20;
/// Send queue depth (capped by the device).
const SQ_DEPTH: u32 = 256;
/// Receive queue depth: doorbell rings that may be pending at once. An
/// end whose device allows it posts a receive per incoming slot on top
/// (`params::FEATURE_TAIL_CREDITS`).
const RQ_DEPTH: u32 = 64;
/// Immediate bit of the ring that ends a standing flag (the low 31 bits
/// carry its epoch, `Ring::EndsStanding`); plain kicks carry 1
/// or 2.
const IMM_ENDS_STANDING: u32 = 1 << 31;
/// Immediate bit of a ring that carries the sender's new tail in its low
/// `tail_hint::HINT_BITS` (never together with `IMM_ENDS_STANDING`).
const IMM_CARRIES_TAIL: u32 = 1 << 30;
const _: () = assert!(super::tail_hint::HINT_BITS == 30);
/// Immediate bit of a slot WRITE that carries one record's payload
/// without its header (`FEATURE_HEADERLESS`): the low
/// `headerless::FIELD_BITS` hold its length and tail (never together with
/// the two bits above; plain kicks carry 1 or 2).
const IMM_HEADERLESS: u32 = 1 << 29;
const _: () = assert!(headerless::FIELD_BITS == 29);
/// Headerless records kept for a header re-send (`SqState::headerless`):
/// while that many wait for the receiver's pushed head, further records
/// keep their header. Bounds the list and the re-send before a tail word.
/// A shim ring on RDMA pushes its head every 1,024 slots, so a ping-pong
/// of one-slot records fills the list: past the cap records keep their
/// header, which costs a small record nothing (the same single inline
/// packet), where re-sending headers unasked would cost a second WRITE.
const HEADERLESS_KEPT: usize = 256;
/// Largest slot write held back to carry the tail and the ring that
/// follows it (`FEATURE_TAIL_IN_IMM`): a small batch, where one packet
/// less is a large part of its latency. Larger ones go out at once, so
/// sync-ahead keeps the wire busy while the batch grows.
const TAIL_IN_IMM_MAX_BYTES: u32 = 16 << 10;
/// Slot writes up to this size go inline where the device takes it.
const INLINE_SLOT_BYTES: u32 = 256;
/// Staging words for control-word writes when the device cannot inline:
/// more than the send queue can hold, so a word is never overwritten while
/// its WRITE is outstanding.
const STAGING_WORDS: usize = PAGE / 8;
const _: () = assert!(SQ_DEPTH as usize <= STAGING_WORDS);

/// The memory of one connection end: a sealed memfd (so `share_fd` can
/// hand it to the ctl daemon, which maps the header page read-only for
/// `status`), on huge pages when the system has free ones, 4 KiB pages
/// otherwise. Mapped shared: a fork does not turn the registered pages
/// copy-on-write under the device.
struct Region {
    base: *mut u8,
    len: usize,
    huge: bool,
    fd: OwnedFd,
}

// SAFETY: the region owns its mapping and memfd alone; unmapping from
// another thread is fine. The memory itself is reached through RingMem
// (atomics and bounds-checked copies), the header's atomics, the staging
// words (one writer: the `sq` lock) or the device.
unsafe impl Send for Region {}
// SAFETY: `&Region` only reads `base`, `len`, `huge` and `fd`, which never
// change; the memory behind `base` is accessed as said for `Send`.
unsafe impl Sync for Region {}

/// Where things are in a region: `[header | out ctrl | out slots | in ctrl
/// | in slots | staging]`, every part page-aligned. Only `[out ctrl ..
/// end)` is registered: the peer's rkey does not reach the header.
#[derive(Clone, Copy)]
struct Layout {
    out_ctrl: usize,
    out_slots: usize,
    out_bytes: usize,
    in_ctrl: usize,
    in_slots: usize,
    in_bytes: usize,
    staging: usize,
    total: usize,
}

/// Which end of a ring a transport serves; both share the connection's
/// queue pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    Sender = 0,
    Receiver = 1,
}

/// Send-queue bookkeeping, under the connection's lock. Every work request
/// gets the next sequence number as its `wr_id`; a completion with id `s`
/// means every request up to `s` completed (an RC send queue completes in
/// order, unsignaled requests included).
#[derive(Default)]
struct SqState {
    posted: u64,
    done: u64,
    unsignaled: u32,
    /// Per role: sequence of its latest control-word write and how many
    /// word writes it has not been told about yet.
    last_word: [u64; 2],
    unreported: [u32; 2],
    /// The sender's latest slot write, not posted yet: the tail write
    /// that follows may turn it into the WRITE_WITH_IMM that carries the
    /// tail and the ring (`FEATURE_TAIL_IN_IMM`). Any other post sends it
    /// first, as a plain WRITE, so the queue pair's order is unchanged.
    held_slots: Option<HeldSlots>,
    /// Records sent without their header (`FEATURE_HEADERLESS`) that the
    /// receiver's pushed head has not passed and no tail word has covered
    /// yet, oldest first, at most `HEADERLESS_KEPT`: their headers are
    /// re-sent before the next tail word (`Shared::resend_headers`).
    headerless: VecDeque<SentHeaderless>,
    failed: Option<RingError>,
    /// `check_stalled`'s watch: the completion count it last saw, and
    /// since when it has not moved with requests outstanding.
    stall_done: u64,
    stall_since: Option<std::time::Instant>,
}

/// A record whose header stayed home (`SqState::headerless`).
#[derive(Clone, Copy)]
struct SentHeaderless {
    /// The header's offset in our region (our sender copy: the slot is
    /// not rewritten before the receiver consumed the record).
    off: usize,
    /// Where it belongs in the peer's copy.
    remote: u64,
    /// The tail after the record: once the receiver's pushed head reaches
    /// it, the receiver has read the record.
    end: u64,
}

/// A slot write held back (`SqState::held_slots`).
#[derive(Clone, Copy)]
struct HeldSlots {
    off: usize,
    len: u32,
    remote: u64,
}

/// Peer addresses, fixed at connect.
#[derive(Clone, Copy, Default)]
struct Remote {
    rkey: u32,
    /// Peer's receiver copy (we send into it).
    in_ctrl: u64,
    in_slots: u64,
    /// Peer's sender copy (we push head / flags into it; in pull mode we
    /// READ its published tail and slots).
    out_ctrl: u64,
    out_slots: u64,
    /// The peer's sender honours standing sleep flags
    /// (`params::FEATURE_STANDING_WAITS`).
    standing: bool,
    /// The peer's receiver takes a tail from a ring's immediate
    /// (`params::FEATURE_TAIL_IN_IMM`).
    tail_in_imm: bool,
    /// The peer keeps a receive per slot of the ring we send it
    /// (`params::FEATURE_TAIL_CREDITS`): every small batch's tail may
    /// ride in its slot WRITE's immediate.
    tail_credits: bool,
    /// The peer writes the headers of records we send without them
    /// (`params::FEATURE_HEADERLESS`).
    headerless: bool,
}

struct Shared {
    dev: Arc<Device>,
    region: Arc<Region>,
    layout: Layout,
    out_slot_size: u64,
    /// The incoming ring's geometry (slots, slot size): where a
    /// headerless record's header goes.
    in_slots: u64,
    in_slot_size: usize,
    mr: *mut ibv_mr,
    channel: *mut ibv_comp_channel,
    send_cq: *mut ibv_cq,
    recv_cq: *mut ibv_cq,
    qp: *mut ibv_qp,
    sq_depth: u32,
    rq_depth: u32,
    /// `rq_depth` covers every incoming slot (`FEATURE_TAIL_CREDITS`).
    tail_credits: bool,
    /// Bytes the send queue takes inline (copied at post time): control
    /// words where at least 8, and slot writes up to this size.
    max_inline: u32,
    psn: u32,
    remote: Remote,
    sq: Mutex<SqState>,
    rq: Mutex<()>,
    /// The epoch of the last standing flag whose ending ring the doorbell
    /// reaped (`Ring::EndsStanding`); 0: none.
    standing_ended: AtomicU32,
}

// SAFETY: the verbs objects are thread-safe in libibverbs; this crate
// serializes its own use of the send queue (`sq`) and of the receive
// queue and channel (`rq`) with mutexes.
unsafe impl Send for Shared {}
// SAFETY: `&Shared` reads the verbs object pointers (set before `Shared`
// is shared, then fixed) and calls libibverbs on them, which is
// thread-safe; the queues' own state is behind `sq` and `rq`, the rest are
// atomics or immutable.
unsafe impl Sync for Shared {}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock cannot leave the counters torn in a
    // way that matters more than the panic itself.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A connection end before it is connected: resources allocated, the queue
/// pair in RESET, local parameters ready to send to the peer.
pub struct VerbsConn {
    shared: Shared,
    out_cfg: RingConfig,
    in_cfg: RingConfig,
    /// The pull-mode knobs this end's sender follows.
    knobs: PullKnobs,
}

/// A connected end: the sending end of the outgoing ring, the receiving end
/// of the incoming one, and the doorbell both sleep on.
pub struct Connected {
    pub tx: Sender<VerbsTransport>,
    pub rx: Receiver<VerbsTransport>,
    pub bell: Doorbell,
}

#[derive(Clone, Copy)]
enum Src {
    Region {
        off: usize,
        len: u32,
    },
    /// Slots whose WRITE carries the tail in its immediate
    /// (`FEATURE_TAIL_IN_IMM`) and, if `ring`, a doorbell ring
    /// (solicited); without it the tail alone (`FEATURE_TAIL_CREDITS`).
    RegionImm {
        off: usize,
        len: u32,
        imm: u32,
        ring: bool,
    },
    External(ExternalSrc),
    Word(u64),
    /// A word whose WRITE carries a doorbell ring (WRITE_WITH_IMM).
    WordKick(u64, u32),
    Imm(u32),
}

/// One end of one ring over the connection's queue pair.
///
/// `poll_completions` reports word writes only once the *latest* word
/// write of this end has completed (and with it, by RC ordering, every
/// earlier request). So a non-zero return always means "the last control
/// word you wrote is in the peer's memory", which is what
/// `Sender::poll`/`await_completion` and `Receiver::poll`/`prepare_wait`
/// rely on.
pub struct VerbsTransport {
    shared: Arc<Shared>,
    role: Role,
    pull: pull_io::PullState,
}

/// The doorbell of a connection end: the completion channel of the
/// receive CQ. The peer rings it with a zero-length, solicited RDMA
/// WRITE_WITH_IMM; the CQ is armed for solicited events only. `fd()`
/// becomes readable when a ring arrives and can join an epoll set; `drain`
/// consumes the events, reposts the receives and rearms; `wait` blocks.
///
/// One thread at a time waits on a given doorbell (like an eventfd that is
/// drained: a second waiter could consume the first one's ring).
pub struct Doorbell {
    shared: Arc<Shared>,
}
