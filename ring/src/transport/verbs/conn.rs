//! One verbs ring connection end: a registered region holding this end's
//! two ring copies, one RC queue pair, its completion queues, and the
//! transports and doorbell built on them.

use super::device::Device;
use super::headerless;
use super::ibv::{
    ibv_ack_cq_events, ibv_create_comp_channel, ibv_create_cq, ibv_create_qp, ibv_dereg_mr,
    ibv_destroy_comp_channel, ibv_destroy_cq, ibv_destroy_qp, ibv_get_cq_event, ibv_modify_qp,
    ibv_reg_mr,
};
use super::params::{
    QpParams, RingDesc, FEATURE_HEADERLESS, FEATURE_STANDING_WAITS, FEATURE_TAIL_CREDITS,
    FEATURE_TAIL_IN_IMM,
};
use super::pull::PullKnobs;
use super::stats::{
    VerbsCounters, VerbsHeader, VERBS_FLAG_HUGE, VERBS_HEADER_PAGE, VERBS_MAGIC, VERBS_VERSION,
};
use super::{call_failed, errno};
use crate::config::RingConfig;
use crate::error::{RingError, VerbsError};
use crate::layout::{bump, RingControl, CONTROL_BYTES};
use crate::memory::RingMem;
use crate::receiver::Receiver;
use crate::record::{self, Header};
use crate::sender::Sender;
use crate::sleep::backoff::REQUEST_LIMIT;
use crate::sleep::flags::STANDING_KICKS;
use crate::transport::{ExternalSrc, PeerWord, Ring, Transport, Visibility};
use rdma_sys::*;
use std::collections::VecDeque;
use std::mem::offset_of;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

// Pull mode's verbs glue: a child module, so it sees the queue pair.
mod pull_io;

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

impl Region {
    fn new(len: usize) -> Result<Region, RingError> {
        if let Ok(r) = Region::memfd(len.div_ceil(HUGE) * HUGE, true) {
            return Ok(r);
        }
        Region::memfd(len.div_ceil(PAGE) * PAGE, false)
    }

    /// memfd of `len` bytes, sealed against shrinking and growing, mapped
    /// shared. Every failure path closes what it opened (the fd by
    /// `OwnedFd`, the mapping is the last step).
    fn memfd(len: usize, huge: bool) -> Result<Region, RingError> {
        let mut flags = libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING;
        if huge {
            flags |= libc::MFD_HUGETLB;
        }
        // SAFETY: the name is a NUL-terminated literal the kernel only
        // reads; a failure is a negative return, handled below.
        let raw = unsafe { libc::memfd_create(c"ringsock-verbs".as_ptr(), flags) };
        if raw < 0 {
            return Err(RingError::last_os());
        }
        // SAFETY: `raw` is the descriptor memfd_create just returned
        // (non-negative), owned by nothing else yet.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let fd = super::fdplace::place_owned(fd);
        let raw = fd.as_raw_fd();
        // SAFETY: ftruncate of the descriptor `fd` owns, integer arguments.
        if unsafe { libc::ftruncate(raw, len as libc::off_t) } != 0 {
            return Err(RingError::last_os());
        }
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;
        // SAFETY: F_ADD_SEALS on the same descriptor, integer arguments.
        if unsafe { libc::fcntl(raw, libc::F_ADD_SEALS, seals) } != 0 {
            return Err(RingError::last_os());
        }
        // SAFETY: shared mapping of the whole (sealed) file, no address
        // hint. On hugetlbfs the mapping reserves the huge pages, so it is
        // what fails when there are no free ones.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                raw,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(RingError::last_os());
        }
        Ok(Region {
            base: p.cast(),
            len,
            huge,
            fd,
        })
    }

    fn addr(&self, off: usize) -> u64 {
        self.base as u64 + off as u64
    }

    /// The header page (written once in `VerbsConn::new`, before anything
    /// else can see the region).
    fn header(&self) -> &VerbsHeader {
        // SAFETY: the region starts with a page-aligned header page, at
        // least size_of::<VerbsHeader>() long; zero bytes are a valid
        // VerbsHeader (plain integers and atomics); only atomics in it
        // change after `init_header`.
        unsafe { &*self.base.cast::<VerbsHeader>() }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: mapped in `memfd` with this length; the memory region
        // that registered it is deregistered before (Shared holds an Arc).
        // The fd closes after (OwnedFd).
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

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

impl Layout {
    fn new(out: &RingConfig, inn: &RingConfig) -> Layout {
        let out_bytes = out.ring_bytes() as usize;
        let in_bytes = inn.ring_bytes() as usize;
        let out_ctrl = VERBS_HEADER_PAGE;
        let out_slots = out_ctrl + CONTROL_BYTES;
        let in_ctrl = out_slots + out_bytes.div_ceil(PAGE) * PAGE;
        let in_slots = in_ctrl + CONTROL_BYTES;
        let staging = in_slots + in_bytes.div_ceil(PAGE) * PAGE;
        Layout {
            out_ctrl,
            out_slots,
            out_bytes,
            in_ctrl,
            in_slots,
            in_bytes,
            staging,
            total: staging + PAGE,
        }
    }
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

impl Drop for Shared {
    fn drop(&mut self) {
        // SAFETY: each object was created once by the matching call and is
        // destroyed once, children first; every CQ event was acked.
        unsafe {
            if !self.qp.is_null() {
                ibv_destroy_qp(self.qp);
            }
            if !self.send_cq.is_null() {
                ibv_destroy_cq(self.send_cq);
            }
            if !self.recv_cq.is_null() {
                ibv_destroy_cq(self.recv_cq);
            }
            if !self.channel.is_null() {
                ibv_destroy_comp_channel(self.channel);
            }
            if !self.mr.is_null() {
                ibv_dereg_mr(self.mr);
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock cannot leave the counters torn in a
    // way that matters more than the panic itself.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A failed work completion: the connection is dead after any.
fn wc_error(status: ibv_wc_status::Type) -> RingError {
    use ibv_wc_status::*;
    let what = match status {
        IBV_WC_REM_ACCESS_ERR => {
            "remote access error (the peer's rkey/address do not cover the write)"
        }
        IBV_WC_RETRY_EXC_ERR => {
            "transport retry count exceeded (peer unreachable or its QP is gone)"
        }
        IBV_WC_RNR_RETRY_EXC_ERR => "receiver-not-ready retries exceeded",
        IBV_WC_WR_FLUSH_ERR => "work request flushed (the queue pair is in error)",
        IBV_WC_LOC_PROT_ERR | IBV_WC_LOC_ACCESS_ERR => {
            "local protection error (source not in the registered region)"
        }
        IBV_WC_LOC_LEN_ERR => "local length error",
        // What Soft-RoCE reports when it cannot route to the peer's GID
        // from its netdev: rxe (Linux 6.1) routes in the initial network
        // namespace only, so an rxe device on a netdev moved into another
        // namespace fails every send this way (scripts/softroce-vm.d/check.sh).
        IBV_WC_LOC_QP_OP_ERR => {
            "local QP operation error (on Soft-RoCE: no route from the device's netdev \
             to the peer's GID address in the initial network namespace)"
        }
        IBV_WC_REM_INV_REQ_ERR => "remote invalid request",
        IBV_WC_REM_OP_ERR => "remote operation error",
        _ => "work request failed",
    };
    VerbsError::Completion { status, what }.into()
}

/// Writes the header page of a fresh region: nothing else has seen the
/// region yet (the memfd is shared and registered only afterwards).
fn init_header(region: &Region, l: &Layout, out: &RingConfig, inn: &RingConfig, dev: &Device) {
    let mut device = [0u8; 16];
    let name = dev.name().as_bytes();
    let n = name.len().min(device.len());
    device[..n].copy_from_slice(&name[..n]);
    let h = VerbsHeader {
        magic: VERBS_MAGIC,
        version: VERBS_VERSION,
        header_len: std::mem::size_of::<VerbsHeader>() as u32,
        region_len: region.len as u64,
        out_ctrl: l.out_ctrl as u64,
        out_slots: l.out_slots as u64,
        in_ctrl: l.in_ctrl as u64,
        in_slots: l.in_slots as u64,
        out_slot_count: out.slots,
        out_slot_size: out.slot_size,
        in_slot_count: inn.slots,
        in_slot_size: inn.slot_size,
        device,
        port: u32::from(dev.port),
        gid_index: u32::from(dev.gid_index),
        flags: if region.huge { VERBS_FLAG_HUGE } else { 0 },
        sq: Default::default(),
        rq: Default::default(),
        user: Default::default(),
    };
    // SAFETY: the header page is mapped, writable, page-aligned and not
    // referenced by anyone yet.
    unsafe { std::ptr::write(region.base.cast::<VerbsHeader>(), h) };
}

/// The receive queue for an end whose incoming ring has `in_slots` slots
/// on a device that allows `cap` entries (the lesser of its queue pair
/// and CQ limits): the doorbell's `RQ_DEPTH` plus one per slot where it
/// fits, which lets the peer carry every small batch's tail in an
/// immediate (`FEATURE_TAIL_CREDITS`, true then); the doorbell's alone
/// otherwise.
fn receive_queue_depth(in_slots: u32, cap: u32) -> (u32, bool) {
    let covering = u64::from(in_slots) + u64::from(RQ_DEPTH);
    if covering <= u64::from(cap) {
        (covering as u32, true)
    } else {
        (doorbell_depth(cap), false)
    }
}

/// The doorbell's receives alone, within the device's `cap`.
fn doorbell_depth(cap: u32) -> u32 {
    RQ_DEPTH.min(cap).max(1)
}

/// A 24-bit initial packet sequence number, different per connection.
fn random_psn() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0),
    );
    (h.finish() as u32) & 0x00ff_ffff
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

impl VerbsConn {
    /// Allocates and registers this end's two ring copies (`out_cfg`: the
    /// ring we send on, `in_cfg`: the ring we receive on) and creates the
    /// queue pair. This end's sender follows `knobs` (pull mode); its
    /// receiver follows whatever mode the peer's sender is in. A user that
    /// cannot keep a ring's unfetched data alive until the peer has READ
    /// it (the shim: a process may exit without closing) passes
    /// `PullKnobs::default()`, which always pushes.
    pub fn new(
        dev: &Arc<Device>,
        out_cfg: RingConfig,
        in_cfg: RingConfig,
        knobs: PullKnobs,
    ) -> Result<VerbsConn, RingError> {
        out_cfg.validate()?;
        in_cfg.validate()?;
        let layout = Layout::new(&out_cfg, &in_cfg);
        let region = Arc::new(Region::new(layout.total)?);
        init_header(&region, &layout, &out_cfg, &in_cfg, dev);
        let sq_depth = SQ_DEPTH.min(dev.max_qp_wr).min(dev.max_cqe).max(2);
        let rq_cap = dev.max_qp_wr.min(dev.max_cqe);
        let (rq_depth, tail_credits) = receive_queue_depth(in_cfg.slots, rq_cap);
        // Built field by field; Drop frees whatever was created if a later
        // step fails.
        let mut s = Shared {
            dev: dev.clone(),
            region,
            layout,
            out_slot_size: out_cfg.slot_size as u64,
            in_slots: u64::from(in_cfg.slots),
            in_slot_size: in_cfg.slot_size as usize,
            mr: std::ptr::null_mut(),
            channel: std::ptr::null_mut(),
            send_cq: std::ptr::null_mut(),
            recv_cq: std::ptr::null_mut(),
            qp: std::ptr::null_mut(),
            sq_depth,
            rq_depth,
            tail_credits,
            max_inline: 0,
            psn: random_psn(),
            remote: Remote::default(),
            sq: Mutex::new(SqState::default()),
            rq: Mutex::new(()),
            standing_ended: AtomicU32::new(0),
        };
        // REMOTE_READ for pull mode (the receiver READs our sender copy):
        // it exposes what the rkey already reaches for WRITE, our two
        // ring copies and the staging words, all bytes the peer sent us
        // or that we send it (see the module documentation).
        let access = (ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
            | ibv_access_flags::IBV_ACCESS_REMOTE_WRITE
            | ibv_access_flags::IBV_ACCESS_REMOTE_READ)
            .0 as i32;
        // Everything but the header page: the peer's rkey must not reach
        // the counters, and nothing is sent from there.
        let (mr_off, mr_len) = (layout.out_ctrl, s.region.len - layout.out_ctrl);
        // SAFETY: pd is open; the range lies inside the region, which
        // outlives the registration (Shared holds the Arc, Drop deregisters).
        s.mr = unsafe { ibv_reg_mr(dev.pd, s.region.base.add(mr_off).cast(), mr_len, access) };
        if s.mr.is_null() {
            // `s` (and with it the region: mapping and memfd) is released
            // on return; nothing else was created yet.
            return Err(VerbsError::Register {
                bytes: mr_len,
                errno: errno(),
            }
            .into());
        }
        // SAFETY: `dev.ctx` is an open context (Device keeps it open
        // while `s.dev` holds it); a null result is handled below.
        s.channel = unsafe { ibv_create_comp_channel(dev.ctx) };
        if s.channel.is_null() {
            return Err(call_failed("ibv_create_comp_channel", errno()));
        }
        // SAFETY: `s.channel` is the live channel just created (non-null)
        // and not shared yet; no CQ names its descriptor yet, and
        // ibv_get_cq_event and ibv_destroy_comp_channel read the field.
        let fd = unsafe {
            (*s.channel).fd = super::fdplace::place((*s.channel).fd);
            (*s.channel).fd
        };
        // Non-blocking, so that `Doorbell::drain` never blocks.
        // SAFETY: F_GETFL on the channel's descriptor, integer arguments.
        let fl = unsafe { libc::syscall(libc::SYS_fcntl, fd, libc::F_GETFL) };
        if fl < 0
            // SAFETY: F_SETFL on the same descriptor, integer arguments.
            || unsafe {
                libc::syscall(
                    libc::SYS_fcntl,
                    fd,
                    libc::F_SETFL,
                    fl | libc::O_NONBLOCK as i64,
                )
            } < 0
        {
            return Err(RingError::last_os());
        }
        // SAFETY: `dev.ctx` is open (as above); null channel and context
        // pointers are allowed (the send CQ is polled, not waited on); a
        // null result is handled below.
        s.send_cq = unsafe {
            ibv_create_cq(
                dev.ctx,
                sq_depth as i32,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
        };
        if s.send_cq.is_null() {
            return Err(call_failed("ibv_create_cq", errno()));
        }
        // SAFETY: `dev.ctx` is open and `s.channel` is the live channel
        // created on it above; a null result is handled below.
        s.recv_cq =
            unsafe { ibv_create_cq(dev.ctx, rq_depth as i32, std::ptr::null_mut(), s.channel, 0) };
        if s.recv_cq.is_null() {
            return Err(call_failed("ibv_create_cq", errno()));
        }
        // A device may refuse the receive queue that covers every slot
        // while its limits allowed it: then the doorbell's alone, and the
        // peer writes tail words (no FEATURE_TAIL_CREDITS).
        let small_rq = doorbell_depth(rq_cap);
        // Inline: a small message's slot write (up to 256 B: one slot of
        // the default geometry) is copied into the request at post time,
        // as rsocket inlines its small sends; a device that refuses that
        // much is asked for 64 B (control words), then none.
        let tries = [
            (INLINE_SLOT_BYTES, rq_depth),
            (64u32, rq_depth),
            (0, rq_depth),
            (INLINE_SLOT_BYTES, small_rq),
            (64, small_rq),
            (0, small_rq),
        ];
        for (inline, rq) in tries {
            // SAFETY: zeroed is a valid init attr; the fields we need are set.
            let mut ia: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
            ia.send_cq = s.send_cq;
            ia.recv_cq = s.recv_cq;
            ia.qp_type = ibv_qp_type::IBV_QPT_RC;
            ia.sq_sig_all = 0;
            ia.cap.max_send_wr = sq_depth;
            ia.cap.max_recv_wr = rq;
            ia.cap.max_send_sge = 1;
            ia.cap.max_recv_sge = 1;
            ia.cap.max_inline_data = inline;
            // SAFETY: pd open, attr valid; on success the caps are updated.
            s.qp = unsafe { ibv_create_qp(dev.pd, &mut ia) };
            if !s.qp.is_null() {
                s.max_inline = ia.cap.max_inline_data;
                s.rq_depth = rq;
                s.tail_credits = tail_credits && rq == rq_depth;
                break;
            }
        }
        if s.qp.is_null() {
            return Err(call_failed("ibv_create_qp", errno()));
        }
        Ok(VerbsConn {
            shared: s,
            out_cfg,
            in_cfg,
            knobs,
        })
    }

    /// What the peer needs to connect to this end.
    pub fn local_params(&self) -> QpParams {
        let s = &self.shared;
        let r = &s.region;
        let l = &s.layout;
        QpParams {
            gid: s.dev.gid,
            lid: s.dev.lid,
            // SAFETY: `s.qp` is the live queue pair `create` made (it
            // returns no VerbsConn without one); Shared destroys it only
            // on drop. A plain field read.
            qpn: unsafe { (*s.qp).qp_num },
            psn: s.psn,
            mtu: s.dev.mtu,
            features: FEATURE_STANDING_WAITS
                | FEATURE_TAIL_IN_IMM
                | if s.tail_credits {
                    FEATURE_TAIL_CREDITS
                } else {
                    0
                }
                | if s.takes_headerless() {
                    FEATURE_HEADERLESS
                } else {
                    0
                },
            // SAFETY: `s.mr` is the live registration `create` made, as
            // for `qp`. A plain field read.
            rkey: unsafe { (*s.mr).rkey },
            out_ring: RingDesc {
                ctrl_addr: r.addr(l.out_ctrl),
                slots_addr: r.addr(l.out_slots),
                slots: self.out_cfg.slots,
                slot_size: self.out_cfg.slot_size,
            },
            in_ring: RingDesc {
                ctrl_addr: r.addr(l.in_ctrl),
                slots_addr: r.addr(l.in_slots),
                slots: self.in_cfg.slots,
                slot_size: self.in_cfg.slot_size,
            },
        }
    }

    /// Whether the rings landed on huge pages.
    pub fn huge_pages(&self) -> bool {
        self.shared.region.huge
    }

    /// The fd of the doorbell `connect` will return (the completion
    /// channel): known before the connection is, so a caller can hand a
    /// fixed set of fds to pollers from the start.
    pub fn doorbell_fd(&self) -> std::os::fd::RawFd {
        // SAFETY: `channel` is the live completion channel `create` made;
        // Shared destroys it only on drop. A plain field read.
        unsafe { (*self.shared.channel).fd }
    }

    /// A close-on-exec duplicate of the region's memfd, for the ctl daemon:
    /// it maps the header read-only and reads the counters
    /// (`transport::verbs::stats`). The memfd is sealed against shrinking
    /// and growing, so a mapping of it can never fault.
    pub fn share_fd(&self) -> Result<OwnedFd, RingError> {
        self.shared.share_fd()
    }

    /// This end's verbs counters (also readable through `share_fd`).
    pub fn verbs_counters(&self) -> VerbsCounters {
        self.shared.region.header().counters()
    }

    /// Brings the queue pair to RTS towards `peer` (INIT -> RTR -> RTS) and
    /// builds the two ring ends. The peer must use our geometry for the
    /// rings we share: its incoming ring is our outgoing one and vice versa.
    pub fn connect(self, peer: &QpParams) -> Result<Connected, RingError> {
        if !peer.in_ring.matches(&self.out_cfg) || !peer.out_ring.matches(&self.in_cfg) {
            return Err(VerbsError::Params("the peer's ring geometry does not match ours").into());
        }
        let VerbsConn {
            mut shared,
            out_cfg,
            in_cfg,
            knobs,
        } = self;
        // Each feature builds on the one before it: credits need the tail
        // in the immediate, headerless records need the credits.
        let tail_in_imm = peer.features & FEATURE_TAIL_IN_IMM != 0;
        let tail_credits = tail_in_imm && peer.features & FEATURE_TAIL_CREDITS != 0;
        shared.remote = Remote {
            rkey: peer.rkey,
            in_ctrl: peer.in_ring.ctrl_addr,
            in_slots: peer.in_ring.slots_addr,
            out_ctrl: peer.out_ring.ctrl_addr,
            out_slots: peer.out_ring.slots_addr,
            standing: peer.features & FEATURE_STANDING_WAITS != 0,
            tail_in_imm,
            tail_credits,
            headerless: tail_credits
                && peer.features & FEATURE_HEADERLESS != 0
                && peer.in_ring.slots <= headerless::MAX_RING_SLOTS,
        };
        shared.to_init()?;
        {
            let _g = lock(&shared.rq);
            shared.post_recvs(shared.rq_depth)?;
            // SAFETY: `recv_cq` is the live CQ `create` made; 1 arms it for
            // solicited events only.
            let rc = unsafe { ibv_req_notify_cq(shared.recv_cq, 1) };
            if rc != 0 {
                return Err(call_failed("ibv_req_notify_cq", rc));
            }
        }
        shared.to_rtr(peer)?;
        shared.to_rts()?;
        let shared = Arc::new(shared);
        let l = shared.layout;
        let base = shared.region.base;
        let owner = || Box::new(shared.region.clone());
        // SAFETY: both ranges lie inside the region (Layout), control
        // blocks are page-aligned and zeroed (fresh memfd), and
        // the region lives as long as the RingMem's owner Arc.
        let (out_mem, in_mem) = unsafe {
            (
                RingMem::from_raw(
                    base.add(l.out_ctrl),
                    base.add(l.out_slots),
                    l.out_bytes,
                    owner(),
                ),
                RingMem::from_raw(
                    base.add(l.in_ctrl),
                    base.add(l.in_slots),
                    l.in_bytes,
                    owner(),
                ),
            )
        };
        let tx = Sender::new(
            out_mem,
            VerbsTransport {
                shared: shared.clone(),
                role: Role::Sender,
                pull: pull_io::PullState::new(knobs, out_cfg.slots, out_cfg.slot_size),
            },
            out_cfg,
        )?;
        let rx = Receiver::new(
            in_mem,
            VerbsTransport {
                shared: shared.clone(),
                role: Role::Receiver,
                pull: pull_io::PullState::new(knobs, in_cfg.slots, in_cfg.slot_size),
            },
            in_cfg,
        )?;
        Ok(Connected {
            tx,
            rx,
            bell: Doorbell { shared },
        })
    }
}

impl Connected {
    /// See `VerbsConn::share_fd`.
    pub fn share_fd(&self) -> Result<OwnedFd, RingError> {
        self.bell.shared.share_fd()
    }

    /// This end's verbs counters (both rings share one queue pair).
    pub fn verbs_counters(&self) -> VerbsCounters {
        self.bell.shared.region.header().counters()
    }

    /// This end's pull-mode counters (`transport::verbs::pull`).
    pub fn pull_stats(&self) -> super::pull::PullStats {
        self.bell.shared.pull_counters().snapshot()
    }
}

impl Shared {
    /// Whether this end's receiver takes headerless records
    /// (`FEATURE_HEADERLESS`): it reaps an immediate for every small
    /// batch, and its ring is small enough for the immediate's tail bits.
    fn takes_headerless(&self) -> bool {
        self.tail_credits && self.in_slots <= u64::from(headerless::MAX_RING_SLOTS)
    }

    /// The word at `off` in one of our ring copies' slots (`base`, `bytes`:
    /// `Layout`'s offset and size of that copy's slots).
    fn slot_word(&self, base: usize, bytes: usize, off: usize) -> &AtomicU64 {
        assert!(
            off.is_multiple_of(8) && off + 8 <= bytes,
            "slot word outside the ring"
        );
        // SAFETY: inside the copy's slots (checked above), which lie in the
        // region (Layout) and are page-aligned, so the word is 8-aligned;
        // the region lives as long as `self`. The peer's device may place
        // bytes there too: an aligned 8-byte word is placed whole (module
        // docs, "What verbs need" 3).
        unsafe { &*self.region.base.add(base + off).cast::<AtomicU64>() }
    }

    /// The immediate's field for the held write `h`, ending at `tail`, if
    /// it may go without its header: the peer takes that, and `h` is
    /// exactly one record (its header's length fills the write to the
    /// byte: a second record would start a slot later).
    fn headerless_field(&self, h: &HeldSlots, tail: u64) -> Option<u32> {
        if !self.remote.headerless {
            return None;
        }
        let l = &self.layout;
        let raw = self
            .slot_word(l.out_slots, l.out_bytes, h.off - l.out_slots)
            .load(Ordering::Relaxed);
        let hdr = Header::decode(raw)?;
        if hdr.flags != 0
            || hdr.len == 0
            || u64::from(hdr.len) + record::HEADER_BYTES as u64 != u64::from(h.len)
        {
            return None;
        }
        // The receiver finds the record's first slot from `tail`: the
        // write must end there (the sender sends up to the tail before
        // it writes it; anything else keeps its header).
        let ss = self.out_slot_size as usize;
        let ring = (l.out_bytes / ss) as u64;
        let first = ((h.off - l.out_slots) / ss) as u64;
        if (first + record::slots_for(hdr.len as usize, ss) as u64) % ring != tail % ring {
            return None;
        }
        headerless::encode(hdr.len, tail)
    }

    /// Whether one more record may go without its header: the list of
    /// those the receiver may not have read (after dropping the ones it
    /// has) is below `HEADERLESS_KEPT`. Caller holds `sq`.
    fn headerless_room(&self, st: &mut SqState) -> bool {
        self.forget_read_headerless(st);
        st.headerless.len() < HEADERLESS_KEPT
    }

    /// Drops the headerless records the receiver has read: its pushed
    /// head (in our sender copy) reached their end. A slot is rewritten
    /// only after that, so every record left still has its header in our
    /// copy.
    fn forget_read_headerless(&self, st: &mut SqState) {
        let head = self
            .ctrl_word(self.layout.out_ctrl, offset_of!(RingControl, local_head))
            .load(Ordering::Acquire);
        while st.headerless.front().is_some_and(|r| r.end <= head) {
            st.headerless.pop_front();
        }
    }

    /// WRITEs the headers of the headerless records the receiver may not
    /// have read (8 bytes each, inline where the device allows): posted
    /// before a tail word, so a receiver that learns its tail from the
    /// word before it reaped their immediates still finds every header
    /// (module docs, "Headerless records"). Caller holds `sq`.
    fn resend_headers(&self, st: &mut SqState) -> Result<(), RingError> {
        self.forget_read_headerless(st);
        let l = &self.layout;
        while let Some(r) = st.headerless.pop_front() {
            let raw = self
                .slot_word(l.out_slots, l.out_bytes, r.off - l.out_slots)
                .load(Ordering::Relaxed);
            self.post(st, Src::Word(raw), r.remote, false)?;
            bump(&self.counters().slot_writes, 1);
            bump(&self.counters().slot_bytes, 8);
            // Under the send-queue lock, as every writer of this counter.
            bump(&self.rq_counters().headers_resent, 1);
        }
        Ok(())
    }

    /// A reaped headerless record (`IMM_HEADERLESS`, its `field`): writes
    /// its header into our receiver copy, then raises the copy's tail
    /// over it. Caller holds `rq`, as every reaper does, and the receiver
    /// loads the tail under it (`fetch_tail`): so a header is never
    /// written here after the receiver read past the record and the
    /// sender reused its slot (module docs, "Headerless records").
    fn place_headerless(&self, field: u32) -> Result<(), RingError> {
        if !self.takes_headerless() {
            return Err(VerbsError::Protocol(
                "the peer sent a record without its header, which this end did not offer",
            )
            .into());
        }
        let l = &self.layout;
        let tail = self.ctrl_word(l.in_ctrl, offset_of!(RingControl, local_tail));
        let mut cur = tail.load(Ordering::Acquire);
        loop {
            match headerless::place(cur, field, self.in_slots, self.in_slot_size) {
                headerless::Hint::Stale => return Ok(()),
                headerless::Hint::Bad { len } => {
                    return Err(RingError::Corrupt(crate::error::Corruption::Length {
                        slot: cur,
                        len,
                    }))
                }
                headerless::Hint::Place(p) => {
                    let off = p.slot as usize * self.in_slot_size;
                    self.slot_word(l.in_slots, l.in_bytes, off)
                        .store(p.header, Ordering::Relaxed);
                    // Release: a receiver that loads this tail sees the
                    // header (the device placed the payload before the
                    // completion). A tail word the device placed meanwhile
                    // (after the same header, re-sent) fails the exchange:
                    // look again.
                    match tail.compare_exchange(cur, p.tail, Ordering::AcqRel, Ordering::Acquire) {
                        Ok(_) => return Ok(()),
                        Err(now) => cur = now,
                    }
                }
            }
        }
    }

    fn share_fd(&self) -> Result<OwnedFd, RingError> {
        self.region
            .fd
            .try_clone()
            .map_err(|e| RingError::Os(e.raw_os_error().unwrap_or(libc::EIO)))
    }

    fn counters(&self) -> &super::stats::SqCounters {
        &self.region.header().sq
    }

    fn rq_counters(&self) -> &super::stats::RqCounters {
        &self.region.header().rq
    }

    fn modify(
        &self,
        attr: &mut ibv_qp_attr,
        mask: ibv_qp_attr_mask,
        what: &'static str,
    ) -> Result<(), RingError> {
        // SAFETY: qp valid, attr initialized for the fields in mask.
        let rc = unsafe { ibv_modify_qp(self.qp, attr, mask.0 as i32) };
        if rc != 0 {
            return Err(call_failed(what, rc));
        }
        Ok(())
    }

    fn to_init(&self) -> Result<(), RingError> {
        // SAFETY: zeroed is a valid ibv_qp_attr.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_INIT;
        a.pkey_index = 0;
        a.port_num = self.dev.port;
        a.qp_access_flags = (ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
            | ibv_access_flags::IBV_ACCESS_REMOTE_WRITE
            | ibv_access_flags::IBV_ACCESS_REMOTE_READ)
            .0;
        use ibv_qp_attr_mask as M;
        self.modify(
            &mut a,
            M::IBV_QP_STATE | M::IBV_QP_PKEY_INDEX | M::IBV_QP_PORT | M::IBV_QP_ACCESS_FLAGS,
            "ibv_modify_qp to INIT",
        )
    }

    fn to_rtr(&self, peer: &QpParams) -> Result<(), RingError> {
        // SAFETY: zeroed is a valid ibv_qp_attr.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_RTR;
        a.path_mtu = self.dev.mtu.min(peer.mtu) as ibv_mtu::Type;
        a.dest_qp_num = peer.qpn;
        a.rq_psn = peer.psn;
        a.max_dest_rd_atomic = 1;
        a.min_rnr_timer = 12;
        a.ah_attr.is_global = 1;
        a.ah_attr.grh.dgid.raw = peer.gid;
        a.ah_attr.grh.sgid_index = self.dev.gid_index;
        a.ah_attr.grh.hop_limit = 64;
        a.ah_attr.dlid = peer.lid;
        a.ah_attr.sl = 0;
        a.ah_attr.port_num = self.dev.port;
        use ibv_qp_attr_mask as M;
        self.modify(
            &mut a,
            M::IBV_QP_STATE
                | M::IBV_QP_AV
                | M::IBV_QP_PATH_MTU
                | M::IBV_QP_DEST_QPN
                | M::IBV_QP_RQ_PSN
                | M::IBV_QP_MAX_DEST_RD_ATOMIC
                | M::IBV_QP_MIN_RNR_TIMER,
            "ibv_modify_qp to RTR",
        )
    }

    fn to_rts(&self) -> Result<(), RingError> {
        // SAFETY: zeroed is a valid ibv_qp_attr.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_RTS;
        // 4.096 us x 2^16 = 268 ms per try (TCP's least retransmission
        // timeout is 200 ms), 7 tries: a stall of about 2 s is ridden out;
        // a longer one fails the queue pair, and the shim carries the
        // connection on over TCP. Not 7 retries: Soft-RoCE takes 7 to mean
        // retry forever.
        a.timeout = 16;
        a.retry_cnt = 6;
        a.rnr_retry = 7;
        a.sq_psn = self.psn;
        a.max_rd_atomic = 1;
        use ibv_qp_attr_mask as M;
        self.modify(
            &mut a,
            M::IBV_QP_STATE
                | M::IBV_QP_TIMEOUT
                | M::IBV_QP_RETRY_CNT
                | M::IBV_QP_RNR_RETRY
                | M::IBV_QP_SQ_PSN
                | M::IBV_QP_MAX_QP_RD_ATOMIC,
            "ibv_modify_qp to RTS",
        )
    }

    /// Posts `n` zero-length receives (doorbell rings consume them).
    /// Caller holds `rq`.
    fn post_recvs(&self, n: u32) -> Result<(), RingError> {
        for _ in 0..n {
            let mut wr = ibv_recv_wr {
                wr_id: 0,
                next: std::ptr::null_mut(),
                sg_list: std::ptr::null_mut(),
                num_sge: 0,
            };
            let mut bad = std::ptr::null_mut();
            // SAFETY: qp valid; a receive without buffers is allowed (the
            // only sends we expect are zero-length WRITE_WITH_IMM).
            let rc = unsafe { ibv_post_recv(self.qp, &mut wr, &mut bad) };
            if rc != 0 {
                return Err(call_failed("ibv_post_recv", rc));
            }
        }
        Ok(())
    }

    /// Reaps send completions. Caller holds `sq`.
    fn reap(&self, st: &mut SqState) -> Result<(), RingError> {
        if let Some(e) = &st.failed {
            return Err(e.clone());
        }
        // SAFETY: ibv_wc is integers and a union of integers, for which
        // zero is valid.
        let mut wc: [ibv_wc; 16] = unsafe { std::mem::zeroed() };
        loop {
            // SAFETY: `send_cq` is live while `self` is; `wc` has room for
            // the 16 completions the call may write.
            let n = unsafe { ibv_poll_cq(self.send_cq, wc.len() as i32, wc.as_mut_ptr()) };
            if n < 0 {
                // A provider's own code, not an errno.
                let e = call_failed("ibv_poll_cq", 0);
                st.failed = Some(e.clone());
                return Err(e);
            }
            for (i, w) in wc[..n as usize].iter().enumerate() {
                if w.status != ibv_wc_status::IBV_WC_SUCCESS {
                    bump(&self.counters().completions, i as u64);
                    self.rq_counters()
                        .cq_errors
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let e = wc_error(w.status);
                    st.failed = Some(e.clone());
                    return Err(e);
                }
                st.done = st.done.max(w.wr_id);
            }
            bump(&self.counters().completions, n as u64);
            if (n as usize) < wc.len() {
                return Ok(());
            }
        }
    }

    /// The sequence number of the next request, once the send queue has
    /// room for `n` more; the connection's error if it failed. Caller
    /// holds `sq`. Reaping makes progress: at least one outstanding
    /// request is signaled (`post` forces one every sq_depth / 2; READs
    /// always are).
    fn next_seq_for(&self, st: &mut SqState, n: u64) -> Result<u64, RingError> {
        if let Some(e) = &st.failed {
            return Err(e.clone());
        }
        let mut wait = crate::sleep::backoff::CompletionWait::new();
        while st.posted + n - st.done > self.sq_depth as u64 {
            self.reap(st)?;
            if !wait.relax_within(REQUEST_LIMIT) {
                return Err(self.give_up(st, "WRITE"));
            }
        }
        Ok(st.posted + 1)
    }

    /// Fails the connection after a request went unanswered for
    /// `REQUEST_LIMIT`. The queue pair goes to the error state, which
    /// flushes every outstanding request: none may still read the
    /// program's memory (a zero-copy WRITE) or land later. Caller holds
    /// `sq`.
    fn give_up(&self, st: &mut SqState, op: &'static str) -> RingError {
        // SAFETY: zeroed is a valid ibv_qp_attr.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_ERR;
        // A queue pair that cannot even be moved to the error state is
        // beyond use already; the connection fails either way.
        let _ = self.modify(
            &mut a,
            ibv_qp_attr_mask::IBV_QP_STATE,
            "ibv_modify_qp to ERR",
        );
        let e = RingError::from(VerbsError::Unanswered {
            op,
            secs: REQUEST_LIMIT.as_secs(),
        });
        st.failed = Some(e.clone());
        e
    }

    fn next_seq(&self, st: &mut SqState) -> Result<u64, RingError> {
        self.next_seq_for(st, 1)
    }

    /// Posts one WRITE (`imm`: WRITE_WITH_IMM, solicited, no payload),
    /// chained behind the held slot write if there is one: one
    /// `ibv_post_send`, so one system call on Soft-RoCE, for a batch and
    /// its tail. Caller holds `sq`. Returns the request's sequence number.
    fn post(
        &self,
        st: &mut SqState,
        src: Src,
        remote: u64,
        signaled: bool,
    ) -> Result<u64, RingError> {
        let held = st.held_slots.take();
        let n = 1 + u64::from(held.is_some());
        let first = self.next_seq_for(st, n)?;
        // SAFETY: ibv_send_wr and ibv_sge are plain data (pointers may be
        // null); `fill_wr` sets every field the opcode uses.
        let mut wrs: [ibv_send_wr; 2] = unsafe { std::mem::zeroed() };
        // SAFETY: ibv_sge is plain integers, for which zero is valid.
        let mut sges: [ibv_sge; 2] = unsafe { std::mem::zeroed() };
        // Inline sources: the library copies them during the post call.
        let mut words = [0u64; 2];
        let mut flags = [0u32; 2];
        let mut unsignaled = st.unsignaled;
        let mut k = 0;
        if let Some(h) = held {
            let held_src = Src::Region {
                off: h.off,
                len: h.len,
            };
            flags[0] = self.fill_wr(
                (&mut wrs[0], &mut sges[0], &mut words[0]),
                held_src,
                h.remote,
                false,
                first,
                &mut unsignaled,
            );
            k = 1;
        }
        flags[k] = self.fill_wr(
            (&mut wrs[k], &mut sges[k], &mut words[k]),
            src,
            remote,
            signaled,
            first + k as u64,
            &mut unsignaled,
        );
        // The arrays stay where they are until the call returns.
        for i in 0..=k {
            if wrs[i].num_sge > 0 {
                wrs[i].sg_list = &mut sges[i];
            }
        }
        if k == 1 {
            let (a, b) = wrs.split_at_mut(1);
            a[0].next = &mut b[0];
        }
        let mut bad = std::ptr::null_mut();
        // SAFETY: qp valid; the requests, their sges and inline words live
        // across the call (an inline source is copied during it); a region
        // source stays valid until the request completes (the protocol
        // does not rewrite transmitted slots before the receiver consumed
        // them).
        let rc = unsafe { ibv_post_send(self.qp, &mut wrs[0], &mut bad) };
        if rc != 0 {
            let e = call_failed("ibv_post_send", rc);
            st.failed = Some(e.clone());
            return Err(e);
        }
        let seq = first + k as u64;
        st.posted = seq;
        st.unsignaled = unsignaled;
        // Under the send-queue lock: single writer (see `bump`).
        let c = self.counters();
        for f in &flags[..=k] {
            bump(&c.wr_posted, 1);
            bump(
                &c.wr_signaled,
                u64::from(f & ibv_send_flags::IBV_SEND_SIGNALED.0 != 0),
            );
            bump(
                &c.wr_inline,
                u64::from(f & ibv_send_flags::IBV_SEND_INLINE.0 != 0),
            );
        }
        Ok(seq)
    }

    /// Fills one work request `seq` for `src` at the peer's `remote`
    /// (sg_list is set by the caller once the arrays are final; an inline
    /// word is copied from `word`, which must stay in place until the
    /// post). `unsignaled`: requests since the last signaled one,
    /// updated. Returns the send flags.
    fn fill_wr(
        &self,
        (wr, sge, word): (&mut ibv_send_wr, &mut ibv_sge, &mut u64),
        src: Src,
        remote: u64,
        signaled: bool,
        seq: u64,
        unsignaled: &mut u32,
    ) -> u32 {
        let force = *unsignaled + 1 >= (self.sq_depth / 2).max(1);
        let signaled = signaled || force;
        *unsignaled = if signaled { 0 } else { *unsignaled + 1 };
        // SAFETY: `mr` is the live registration made before `Shared` was
        // shared; it is deregistered only on drop. A plain field read.
        sge.lkey = unsafe { (*self.mr).lkey };
        let mut flags = if signaled {
            ibv_send_flags::IBV_SEND_SIGNALED.0
        } else {
            0
        };
        let mut opcode = ibv_wr_opcode::IBV_WR_RDMA_WRITE;
        let mut imm = 0u32;
        let mut num_sge = 1;
        if let Src::WordKick(_, v) | Src::RegionImm { imm: v, .. } = src {
            // The peer's receive completes only after the data is placed.
            opcode = ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM;
            imm = v.to_be();
        }
        // A kick is the doorbell: solicited. Slots carrying only their
        // tail are not: a receiver asleep on its doorbell is not woken by
        // them (the sender's check at their completion rings a sleeper).
        if matches!(src, Src::WordKick(..) | Src::RegionImm { ring: true, .. }) {
            flags |= ibv_send_flags::IBV_SEND_SOLICITED.0;
        }
        match src {
            Src::Region { off, len } | Src::RegionImm { off, len, .. } => {
                sge.addr = self.region.addr(off);
                sge.length = len;
                // Every slot write is counted here, as posted: a held one
                // may go without its header (`headerless`).
                bump(&self.counters().slot_bytes, u64::from(len));
                if len <= self.max_inline.min(INLINE_SLOT_BYTES) {
                    // Copied during the post (the caller leaves sge.addr
                    // at the region for region sources).
                    flags |= ibv_send_flags::IBV_SEND_INLINE.0;
                }
            }
            Src::External(x) => {
                // The program's own buffer, registered in the device's
                // zero-copy cache (`regcache`) under `x.lkey`.
                sge.addr = x.addr;
                sge.length = x.len;
                sge.lkey = x.lkey;
            }
            Src::Word(v) | Src::WordKick(v, _) => {
                *word = v;
                if self.max_inline >= 8 {
                    // Inline: the library copies the bytes at post time.
                    flags |= ibv_send_flags::IBV_SEND_INLINE.0;
                    sge.addr = word as *const u64 as u64;
                } else {
                    let off = self.layout.staging + (seq as usize % STAGING_WORDS) * 8;
                    // SAFETY: the staging page is in the region; this word
                    // is not the source of any outstanding request (the
                    // queue holds fewer than STAGING_WORDS).
                    unsafe { std::ptr::write_volatile(self.region.base.add(off).cast::<u64>(), v) };
                    sge.addr = self.region.addr(off);
                }
                sge.length = 8;
            }
            Src::Imm(v) => {
                opcode = ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM;
                flags |= ibv_send_flags::IBV_SEND_SOLICITED.0;
                imm = v.to_be();
                num_sge = 0;
            }
        }
        wr.wr_id = seq;
        wr.num_sge = num_sge;
        wr.opcode = opcode;
        wr.send_flags = flags;
        wr.imm_data_invalidated_rkey_union.imm_data = imm;
        wr.wr.rdma.remote_addr = remote;
        wr.wr.rdma.rkey = self.remote.rkey;
        flags
    }

    /// Posts the held slot write, if any, as a plain unsignaled WRITE.
    /// Caller holds `sq`.
    fn post_held_slots(&self, st: &mut SqState) -> Result<(), RingError> {
        if let Some(h) = st.held_slots.take() {
            self.post(
                st,
                Src::Region {
                    off: h.off,
                    len: h.len,
                },
                h.remote,
                false,
            )?;
        }
        Ok(())
    }

    /// Reaps receive completions (doorbell rings), learns what their
    /// immediates say (a standing flag's end, a tail) and reposts as many
    /// receives. Caller holds `rq`.
    fn poll_recv(&self) -> Result<u32, RingError> {
        // SAFETY: ibv_wc is integers and a union of integers, for which
        // zero is valid.
        let mut wc: [ibv_wc; 16] = unsafe { std::mem::zeroed() };
        let mut total = 0;
        loop {
            // SAFETY: `recv_cq` is live while `self` is; `wc` has room for
            // the 16 completions the call may write.
            let n = unsafe { ibv_poll_cq(self.recv_cq, wc.len() as i32, wc.as_mut_ptr()) };
            if n < 0 {
                // A provider's own code, not an errno.
                return Err(call_failed("ibv_poll_cq", 0));
            }
            for w in &wc[..n as usize] {
                if w.status != ibv_wc_status::IBV_WC_SUCCESS {
                    self.rq_counters()
                        .cq_errors
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    // Kept where every later reap finds it: whoever drained
                    // this completion (a doorbell's waiter, say) may drop
                    // the error, and the queue pair carries nothing more.
                    // The rq -> sq lock order is fetch_tail's.
                    let e = wc_error(w.status);
                    lock(&self.sq).failed.get_or_insert_with(|| e.clone());
                    return Err(e);
                }
                if w.wc_flags & ibv_wc_flags::IBV_WC_WITH_IMM.0 == 0 {
                    continue;
                }
                // SAFETY: the union holds the immediate when the flag says
                // so (and is plain data either way). The peer chose it
                // (`kick_imm`, `post_tail_in_imm`): an epoch is only
                // compared, a tail is validated by the receiver.
                let imm = u32::from_be(unsafe { w.imm_data_invalidated_rkey_union.imm_data });
                if imm & IMM_ENDS_STANDING != 0 {
                    self.standing_ended
                        .store(imm & !IMM_ENDS_STANDING, Ordering::Release);
                } else if imm & IMM_CARRIES_TAIL != 0 {
                    // The ring's WRITE placed the slots before this
                    // completion: raise our copy's tail over them.
                    let tail =
                        self.ctrl_word(self.layout.in_ctrl, offset_of!(RingControl, local_tail));
                    super::tail_hint::apply(tail, imm & !IMM_CARRIES_TAIL);
                } else if imm & IMM_HEADERLESS != 0 {
                    // The payload is placed; the header is ours to write.
                    self.place_headerless(imm & !IMM_HEADERLESS)?;
                }
            }
            // Under the receive-queue lock: single writer.
            bump(&self.rq_counters().rings_received, n as u64);
            self.post_recvs(n as u32)?;
            total += n as u32;
            if (n as usize) < wc.len() {
                return Ok(total);
            }
        }
    }
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

impl VerbsTransport {
    /// Whether a control-word write of this end has not been reported by
    /// `poll_completions` yet. Before a process blocks it must poll its
    /// ends until this is false (see the module documentation).
    pub fn words_pending(&self) -> bool {
        lock(&self.shared.sq).unreported[self.role as usize] > 0
    }

    /// Reaps, and fails the connection (`give_up`) if a signaled request
    /// has been outstanding without one completing for `REQUEST_LIMIT`: a device
    /// may retry without end (Soft-RoCE after its link came back, say),
    /// and nothing else bounds a stall no thread waits on. Called now and
    /// then (the shim's background thread, every second or so); each call
    /// compares with the previous one.
    pub fn check_stalled(&self) -> Result<(), RingError> {
        let s = &*self.shared;
        let mut st = lock(&s.sq);
        s.reap(&mut st)?;
        // Only a signaled request reports its completion: the latest one is
        // `unsignaled` posts back.
        let last_signaled = st.posted - u64::from(st.unsignaled);
        if last_signaled <= st.done || st.done != st.stall_done {
            st.stall_done = st.done;
            st.stall_since = None;
            return Ok(());
        }
        let since = *st.stall_since.get_or_insert_with(std::time::Instant::now);
        if since.elapsed() >= REQUEST_LIMIT {
            return Err(s.give_up(&mut st, "WRITE"));
        }
        Ok(())
    }

    /// Whether the rings use huge pages.
    pub fn huge_pages(&self) -> bool {
        self.shared.region.huge
    }

    /// See `VerbsConn::share_fd`.
    pub fn share_fd(&self) -> Result<OwnedFd, RingError> {
        self.shared.share_fd()
    }

    /// The connection's verbs counters (shared by both ends).
    pub fn verbs_counters(&self) -> VerbsCounters {
        self.shared.region.header().counters()
    }

    /// A registration of `buf` for `Sender::write_zero_copy`, from the
    /// device's cache (`regcache`); `Err` when it cannot have one (the
    /// caller copies instead).
    pub fn zc_lease(&self, buf: &[u8]) -> Result<super::regcache::ZcLease, super::regcache::Miss> {
        self.shared.dev.zc_cache().acquire(buf)
    }

    /// A word write at `word`'s place in the peer's copy (`post_word`).
    fn post_word_at(&self, word: PeerWord, src: Src) -> Result<Visibility, RingError> {
        let mut st = lock(&self.shared.sq);
        self.post_word(&mut st, self.word_addr(word), src)?;
        Ok(Visibility::AtCompletion)
    }

    /// The immediate a kick from this end carries: the role (1, 2), or
    /// for the ring that ends a standing flag `IMM_ENDS_STANDING` and its
    /// epoch.
    fn kick_imm(&self, ring: Ring) -> u32 {
        match ring {
            Ring::Plain => self.role as u32 + 1,
            Ring::EndsStanding(epoch) => IMM_ENDS_STANDING | epoch,
        }
    }

    /// The tail write of a sender whose slots are held (`write_slots`):
    /// those slots go out as one WRITE_WITH_IMM that carries `tail`
    /// (`verbs::tail_hint`) and, if `ring`, rings the receiver; reported
    /// as this end's word write. `None`: nothing held, write the tail
    /// word.
    fn post_tail_in_imm(&self, tail: u64, ring: bool) -> Result<Option<Visibility>, RingError> {
        let s = &*self.shared;
        let mut st = lock(&s.sq);
        let Some(h) = st.held_slots.take() else {
            return Ok(None);
        };
        // One record alone (the usual small message): its payload only,
        // the header in the immediate (`headerless`), while the
        // list of such records has room.
        let field = s
            .headerless_field(&h, tail)
            .filter(|_| s.headerless_room(&mut st));
        let (off, len, remote, imm) = match field {
            Some(field) => {
                st.headerless.push_back(SentHeaderless {
                    off: h.off,
                    remote: h.remote,
                    end: tail,
                });
                let hb = record::HEADER_BYTES;
                let imm = IMM_HEADERLESS | field;
                // Under the send-queue lock, as every writer of this one.
                bump(&s.rq_counters().headerless_writes, 1);
                (h.off + hb, h.len - hb as u32, h.remote + hb as u64, imm)
            }
            None => {
                let imm = IMM_CARRIES_TAIL | super::tail_hint::encode(tail);
                (h.off, h.len, h.remote, imm)
            }
        };
        let src = Src::RegionImm {
            off,
            len,
            imm,
            ring,
        };
        self.post_reported(&mut st, remote, src)?;
        Ok(Some(Visibility::AtCompletion))
    }

    fn word_addr(&self, word: PeerWord) -> u64 {
        let r = &self.shared.remote;
        match word {
            PeerWord::LocalTail => r.in_ctrl + offset_of!(RingControl, local_tail) as u64,
            PeerWord::TxWaiting => r.in_ctrl + offset_of!(RingControl, tx_waiting) as u64,
            PeerWord::LocalHead => r.out_ctrl + offset_of!(RingControl, local_head) as u64,
            PeerWord::RxWaiting => r.out_ctrl + offset_of!(RingControl, rx_waiting) as u64,
            PeerWord::RxClosed => r.out_ctrl + offset_of!(RingControl, rx_closed) as u64,
        }
    }
}

impl Transport for VerbsTransport {
    fn write_slots(&mut self, first: u32, count: u32, last_bytes: u32) -> Result<(), RingError> {
        let s = &*self.shared;
        let l = &s.layout;
        let ss = s.out_slot_size;
        let off = first as u64 * ss;
        // The last slot's unused bytes stay home: a 64 B message is a
        // 72 B WRITE (inline where the device allows) instead of 256 B.
        let len = (count as u64 * ss).saturating_sub(ss - u64::from(last_bytes).clamp(1, ss));
        if self.role != Role::Sender || off + len > l.out_bytes as u64 || len > u32::MAX as u64 {
            return Err(VerbsError::OutOfRing("slot range outside the ring").into());
        }
        if self.pull.note_slots(first, count) {
            return Ok(());
        }
        let mut st = lock(&s.sq);
        let src_off = l.out_slots + off as usize;
        let remote = s.remote.in_slots + off;
        if s.remote.tail_in_imm && len <= TAIL_IN_IMM_MAX_BYTES as u64 {
            // Held for the tail write that follows (`sync_tail`); an
            // earlier held write (the first half of a wrapped batch) goes
            // out now. Its bytes are counted when it is posted (`fill_wr`):
            // it may go without its header.
            s.post_held_slots(&mut st)?;
            st.held_slots = Some(HeldSlots {
                off: src_off,
                len: len as u32,
                remote,
            });
        } else {
            s.post(
                &mut st,
                Src::Region {
                    off: src_off,
                    len: len as u32,
                },
                remote,
                false,
            )?;
        }
        bump(&s.counters().slot_writes, 1);
        Ok(())
    }

    fn write_word(
        &mut self,
        word: PeerWord,
        value: u64,
        _signaled: bool,
    ) -> Result<Visibility, RingError> {
        // Every word write is signaled: its completion is what makes it
        // "visible" for the wakeup protocol, and words are rare (one per
        // alpha slots) next to slot writes, which are signaled only every
        // sq_depth/2 requests to recycle the send queue.
        if word == PeerWord::LocalTail {
            if let Some(vis) = self.pull_tail(value)? {
                return Ok(vis);
            }
            // A receiver with a receive for every slot takes the tail from
            // the immediate of the small batch's own WRITE: one work
            // request (under Soft-RoCE two packets, the WRITE and its
            // acknowledgement) where the word took two (four).
            if self.shared.remote.tail_credits {
                if let Some(vis) = self.post_tail_in_imm(value, false)? {
                    return Ok(vis);
                }
            }
        }
        self.post_word_at(word, Src::Word(value))
    }

    fn poll_completions(&mut self) -> Result<u32, RingError> {
        let s = &*self.shared;
        let mut st = lock(&s.sq);
        let r = self.role as usize;
        if st.unreported[r] == 0 {
            // Still reap, so the queue recycles and errors surface.
            s.reap(&mut st)?;
            return Ok(0);
        }
        s.reap(&mut st)?;
        if st.done >= st.last_word[r] {
            let n = std::mem::take(&mut st.unreported[r]);
            drop(st);
            // Pull mode: a wakeup check owed to this report.
            self.pull_reported()?;
            Ok(n)
        } else {
            Ok(0)
        }
    }

    fn write_external(
        &mut self,
        first: u32,
        count: u32,
        header: u64,
        src: ExternalSrc,
    ) -> Result<u64, RingError> {
        let s = &*self.shared;
        let ss = s.out_slot_size;
        let off = first as u64 * ss;
        let room = count as u64 * ss;
        if self.role != Role::Sender
            || off + room > s.layout.out_bytes as u64
            || src.len as u64 + 8 > room
        {
            return Err(VerbsError::OutOfRing("zero-copy record outside the ring").into());
        }
        if let Some(token) = self.pull.external(s, first, count, src)? {
            return Ok(token);
        }
        let remote = s.remote.in_slots + off;
        let mut st = lock(&s.sq);
        // The header from our copy's value (inline where the device can),
        // then the payload from the program's memory right after it; the
        // RC queue pair keeps them in order before the tail WRITE that
        // publishes them. Signaled: `wait_external` needs its completion.
        s.post(&mut st, Src::Word(header), remote, false)?;
        let seq = s.post(&mut st, Src::External(src), remote + 8, true)?;
        let c = s.counters();
        // Status has no room for more counters: the record also counts as
        // a slot write (see `RqCounters::zc_writes`).
        bump(&c.slot_writes, 1);
        bump(&c.slot_bytes, src.len as u64 + 8);
        let z = s.rq_counters();
        bump(&z.zc_writes, 1);
        bump(&z.zc_bytes, src.len as u64);
        Ok(seq)
    }

    fn wait_external(&mut self, token: u64) -> Result<(), RingError> {
        let s = &*self.shared;
        let mut wait = crate::sleep::backoff::CompletionWait::new();
        loop {
            {
                let mut st = lock(&s.sq);
                s.reap(&mut st)?;
                if st.done >= token {
                    return Ok(());
                }
            }
            if !wait.relax_within(REQUEST_LIMIT) {
                let mut st = lock(&s.sq);
                s.reap(&mut st)?;
                if st.done >= token {
                    return Ok(());
                }
                return Err(s.give_up(&mut st, "WRITE"));
            }
        }
    }

    fn fetch_tail(&mut self, head: u64, known: u64) -> Result<Option<u64>, RingError> {
        // The receiver learns every tail under the `rq` lock, pull mode's
        // fetch included: a reaper that writes a headerless record's header
        // holds it too, so it never writes one into a slot the receiver
        // already read past (module docs, "Headerless records").
        if self.role != Role::Receiver {
            return Ok(None);
        }
        let s = &*self.shared;
        let _rq = lock(&s.rq);
        let fetched = VerbsTransport::pull_fetch(s, &mut self.pull, head, known)?;
        // Reap the rings before every look at the tail. In push mode a
        // tail may have come in a ring's immediate only (`poll_recv`
        // raises our copy's tail). In either mode each ring takes a
        // posted receive, which only a reap puts back: a receiver that
        // keeps finding data without sleeping (pulling, or spinning
        // to the end of a stream) would otherwise let the queue run
        // dry, and the peer's queue pair then waits on RNR retries
        // with everything behind the ring (a switch back to push
        // among it). The channel's events stay for the doorbell's
        // waiter, and a drain that finds events but no completions
        // still counts as rung (`Doorbell::drain`).
        s.poll_recv()?;
        if fetched.is_none() && s.tail_credits {
            // Push mode, with a receive for every incoming slot
            // (`FEATURE_TAIL_CREDITS`): load the tail here, then reap
            // again. Every immediate whose tail this load covers
            // completed before the word it reads was written (the
            // queue pair keeps order), so after the second reap the
            // receiver has reaped all of them before it can consume
            // past them, and the unreaped ones never outnumber the
            // ring's slots (module docs). A tail the second reap
            // learns is seen at the next look. A tail that has not
            // moved lets nothing new be consumed: no second reap (a
            // spinning look's common case).
            let tail = s
                .ctrl_word(s.layout.in_ctrl, offset_of!(RingControl, local_tail))
                .load(Ordering::Acquire);
            if tail > known {
                s.poll_recv()?;
            }
            return Ok(Some(tail));
        }
        Ok(fetched)
    }

    fn kick_peer(&mut self, ring: Ring) -> Result<(), RingError> {
        let s = &*self.shared;
        let mut st = lock(&s.sq);
        s.post(
            &mut st,
            Src::Imm(self.kick_imm(ring)),
            s.remote.in_ctrl,
            false,
        )?;
        bump(&s.counters().kicks_sent, 1);
        Ok(())
    }

    fn kicks_with_word(&self) -> bool {
        true
    }

    fn batches_streams(&self) -> bool {
        // In pull mode the receiver READs what it wants when it wants it:
        // the sender's batches save no WRITE there.
        !self.pulling()
    }

    fn write_word_kicking(
        &mut self,
        word: PeerWord,
        value: u64,
        ring: Ring,
    ) -> Result<Visibility, RingError> {
        if word == PeerWord::LocalTail {
            if let Some(vis) = self.pull_tail(value)? {
                // Pull mode (or a switch): the tail went where the
                // receiver READs it, or with the mode word; a kick queued
                // after that still reaches it after the tail.
                self.kick_peer(ring)?;
                return Ok(vis);
            }
        }
        if word == PeerWord::LocalTail && ring == Ring::Plain {
            if let Some(vis) = self.post_tail_in_imm(value, true)? {
                bump(&self.shared.counters().kicks_sent, 1);
                return Ok(vis);
            }
        }
        if word == PeerWord::LocalTail && self.shared.remote.tail_credits {
            // The ring that ends a standing flag carries its epoch in the
            // immediate, so not the tail: the held slots carry the tail in
            // their own (unsolicited) immediate and the ring follows, a
            // kick from the doorbell's receives. No tail word, so no
            // header re-send (`resend_headers`) every 16th message.
            if let Some(vis) = self.post_tail_in_imm(value, false)? {
                self.kick_peer(ring)?;
                return Ok(vis);
            }
        }
        let vis = self.post_word_at(word, Src::WordKick(value, self.kick_imm(ring)))?;
        bump(&self.shared.counters().kicks_sent, 1);
        Ok(vis)
    }

    fn standing_waits(&self) -> bool {
        // Every ring of a standing flag takes one of our posted receives
        // until the doorbell is drained: keep the budget a quarter of them.
        self.role == Role::Receiver
            && self.shared.remote.standing
            && self.shared.rq_depth >= 4 * STANDING_KICKS
    }

    fn standing_ended(&self, epoch: u32) -> bool {
        self.shared.standing_ended.load(Ordering::Acquire) == epoch
    }
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

impl Doorbell {
    /// The region header's `user` words (`VerbsHeader::user`).
    pub fn user_words(&self) -> &[AtomicU64; 8] {
        &self.shared.region.header().user
    }

    pub fn fd(&self) -> std::os::fd::RawFd {
        // SAFETY: `channel` is live while `shared` is (destroyed only on
        // its drop). A plain field read.
        unsafe { (*self.shared.channel).fd }
    }

    /// Consumes pending rings; returns whether there were any. Leaves the
    /// CQ armed, so a ring arriving after this returns makes `fd()`
    /// readable.
    pub fn drain(&self) -> Result<bool, RingError> {
        let s = &*self.shared;
        let _g = lock(&s.rq);
        let mut events = 0u32;
        loop {
            let mut cq = std::ptr::null_mut();
            let mut ctx = std::ptr::null_mut();
            // SAFETY: channel valid and non-blocking: fails with EAGAIN
            // when no event is pending.
            if unsafe { ibv_get_cq_event(s.channel, &mut cq, &mut ctx) } != 0 {
                break;
            }
            events += 1;
        }
        if events > 0 {
            // SAFETY: acks exactly the events just received on recv_cq.
            unsafe { ibv_ack_cq_events(s.recv_cq, events) };
        }
        let mut got = self.shared.poll_recv()?;
        // SAFETY: `recv_cq` is live while `shared` is; 1 = solicited
        // events only.
        let rc = unsafe { ibv_req_notify_cq(s.recv_cq, 1) };
        if rc != 0 {
            return Err(call_failed("ibv_req_notify_cq", rc));
        }
        // A ring that completed between the poll and the arm raised no
        // event: look once more.
        got += self.shared.poll_recv()?;
        // An event whose completion the receiver already reaped (its
        // check before looking at the tail, `fetch_tail`) still rings:
        // the ring may have been for this end's other waiter.
        Ok(got > 0 || events > 0)
    }

    /// Blocks until rung or `timeout` passes (`None`: forever). Returns
    /// whether it was rung.
    pub fn wait(&self, timeout: Option<Duration>) -> Result<bool, RingError> {
        if self.drain()? {
            return Ok(true);
        }
        let mut pfd = libc::pollfd {
            fd: self.fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ts = timeout.map(|d| libc::timespec {
            tv_sec: d.as_secs().min(i32::MAX as u64) as _,
            tv_nsec: d.subsec_nanos() as _,
        });
        // SAFETY: one valid pollfd; ts (if any) lives across the call.
        let r = unsafe {
            libc::syscall(
                libc::SYS_ppoll,
                &mut pfd as *mut libc::pollfd,
                1,
                ts.as_ref()
                    .map_or(std::ptr::null(), |t| t as *const libc::timespec),
                std::ptr::null::<libc::sigset_t>(),
                8,
            )
        };
        if r < 0 && RingError::last_os() != RingError::Os(libc::EINTR) {
            return Err(RingError::last_os());
        }
        self.drain()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_receive_queue_covers_the_ring_where_the_device_allows() {
        // rxe allows 16384 work requests: a receive per default slot fits.
        assert_eq!(receive_queue_depth(4096, 16384), (4096 + RQ_DEPTH, true));
        assert_eq!(receive_queue_depth(4096, 4096 + RQ_DEPTH), (4160, true));
        // One short: the doorbell's receives only, no credits claimed.
        assert_eq!(
            receive_queue_depth(4096, 4096 + RQ_DEPTH - 1),
            (RQ_DEPTH, false)
        );
        assert_eq!(receive_queue_depth(u32::MAX, u32::MAX), (RQ_DEPTH, false));
        // A tiny device still gets a queue.
        assert_eq!(receive_queue_depth(4096, 16), (16, false));
        assert_eq!(receive_queue_depth(4096, 0), (1, false));
    }
}
