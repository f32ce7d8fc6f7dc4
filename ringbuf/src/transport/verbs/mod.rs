//! The RDMA verbs transport (cargo feature `verbs`, `rdma-sys`).
//!
//! Each end of a connection registers one region holding its two ring
//! copies: the *sender copy* of the ring it sends on and the *receiver
//! copy* of the ring it receives on (`[header | out ctrl | out slots | in
//! ctrl | in slots | staging]`, a sealed memfd on huge pages when the
//! system has free ones, else 4 KiB pages). The header page
//! (`transport::verbs_stats::VerbsHeader`: layout and counters) is not
//! registered; `share_fd` hands the memfd to the ctl daemon, which reads
//! the counters for `status`. One RC queue pair per connection end carries
//! both rings:
//!
//! - `write_slots` is an RDMA WRITE of the slot range from our sender copy
//!   into the peer's receiver copy (remote address + rkey);
//! - `write_word` is an RDMA WRITE (inline when the device can, else from a
//!   registered staging word) of the control word into the peer's control
//!   block. The RC queue pair executes requests in order, so a tail WRITE
//!   lands after the slot WRITEs before it: RB2's "write twice";
//! - every word write is signaled, slot writes are signaled only every
//!   `sq_depth / 2` requests (to recycle the send queue): word writes are
//!   one per `alpha` slots, so this is selective signaling where it counts;
//!   `write_word` returns `Visibility::AtCompletion`;
//! - `poll_completions` polls the send CQ and reports an end's word writes
//!   only once its *latest* word write completed (a completion covers every
//!   earlier request of the queue). A non-zero report therefore always
//!   means "the last control word this end wrote is in the peer's memory";
//! - `kick_peer` is a zero-length, solicited RDMA WRITE_WITH_IMM. The peer
//!   has receives posted for it; their completions go to a receive CQ with
//!   a completion channel armed for solicited events: the channel fd is the
//!   `Doorbell` (`fd()`, `drain()` = get/ack events, reap, repost, rearm,
//!   look again; `wait()`).
//!
//! Connection setup: `Device::open()` (env `RINGSOCK_DEVICE`,
//! `RINGSOCK_GID_INDEX`; default the first device with an active port and
//! its IPv4-mapped RoCE v2 GID), `VerbsConn::new` (region, MR, CQs, QP),
//! `local_params()` -> `QpParams` (versioned bytes via `encode`/`decode`,
//! carried out of band), `connect(peer)` (INIT -> RTR -> RTS) -> the
//! `Sender`, `Receiver` and `Doorbell` of this end.
//!
//! # Why no wakeup is lost on verbs
//!
//! The shm argument (README, loom models) is Dekker's: each side stores
//! its word, fences, loads the other's. On verbs the stores are RDMA
//! WRITEs into the *other* side's memory and the loads read our own copy:
//!
//! - receiver (`Receiver::prepare_wait`): R1 WRITE `rx_waiting = 1` into
//!   the sender's copy; R2 spin on `poll_completions` until it reports
//!   (= that WRITE is placed in the sender's memory: an RC WRITE completes
//!   at the requester only after the responder acknowledged it, and the
//!   responder acknowledges after placing the data); R3 fence, load
//!   `local_tail` from its own copy; sleep only if the ring is still empty.
//! - sender (`Sender::poll` or `await_completion` -> `tail_visible`): S1
//!   WRITE the tail into the receiver's copy (after the slot WRITEs); S2 a
//!   completion report (= that tail, or a later one, is placed); S3 fence,
//!   load `rx_waiting` from its own copy; if set, clear it and kick.
//!
//! Let W be when the flag lands and T when the tail lands. If both loads
//! missed, R3 < T (the receiver did not see the tail) and S3 < W (the
//! sender did not see the flag); with W < R2 < R3 and T < S2 < S3 that
//! gives W < R3 < T < S3 < W, impossible. So the receiver sees the data
//! or the sender kicks. A kick cannot be lost either: it is a completion
//! on the receive CQ, and `Doorbell::drain` arms the CQ *before* its last
//! poll, so a kick either is reaped by that poll or raises an event that
//! makes the fd readable for the `ppoll` that follows. The full-ring case
//! (`tx_waiting` WRITE into the receiver's copy, head push into the
//! sender's copy, `Receiver::head_visible`) is the mirror image.
//!
//! The sender clears `rx_waiting` in its own copy while the receiver may
//! WRITE it: the receiver writes 1 only in `prepare_wait`, and a 1 that
//! lands after the clear is a flag for a *later* sleep, which the argument
//! above covers for the next tail; a stale 1 costs one spurious kick
//! (drained and ignored).
//!
//! What verbs need beyond shm:
//!
//! 1. S2 happens only when somebody polls. A process that published data
//!    (or pushed a head) and is about to block must first poll both ends
//!    until `VerbsTransport::words_pending()` is false (`settle`): on shm
//!    the check runs inside the store, here it runs at the completion.
//! 2. Two protocol changes, both on the `AtCompletion` path only (shm and
//!    the loom models never take it): `Sender::await_completion` (in
//!    `prepare_wait`) consumes a report that may cover an outstanding tail
//!    write, so it now runs the `tail_visible` check for it; likewise
//!    `Receiver::prepare_wait` runs `head_visible` after its flag WRITE
//!    completed, since that report covers the head push it made just
//!    before. Without them the report is swallowed and the peer that
//!    sleeps for that tail (or head) is never rung.
//! 3. Placement of an 8-byte word must not tear (the reader loads
//!    `local_tail`/`local_head` while the WRITE lands). RDMA NICs place an
//!    aligned 8-byte WRITE with one PCIe write. Soft-RoCE copies with the
//!    kernel's `memcpy`, which on a CPU with ERMS is `rep movsb`, byte by
//!    byte under qemu TCG: the harness (`scripts/softroce-vm`) gives the
//!    guest a CPU without ERMS/FSRM so the copy is one 8-byte store. A
//!    transport-level read hook with a checked encoding of peer-written
//!    words would remove the assumption; not done yet.
//!
//! One thread waits on a `Doorbell` at a time (as with an eventfd that is
//! drained). A hostile peer can only write into our region where its rkey
//! allows, i.e. our two ring copies: the receiver validates everything it
//! reads there exactly as on shm.

mod conn;
mod device;
mod params;
pub mod regcache;

pub use crate::transport::verbs_stats::VerbsCounters;
pub use conn::{Connected, Doorbell, VerbsConn, VerbsTransport};
pub use device::{
    find_roce_gid, gid_of, is_ipv4_mapped, netdev_of, parse_gid, route_source, Device,
    DeviceChoice, DeviceRoute,
};
pub use params::{QpParams, RingDesc, PARAMS_LEN, PARAMS_MAGIC, PARAMS_VERSION};

use crate::error::RingError;
use crate::receiver::Receiver;
use crate::sender::Sender;

/// Polls both ends until neither has an unreported control-word write:
/// every tail and head this process published has reached the peer and
/// the matching sleeping-flag check ran. Call before blocking.
pub fn settle(
    tx: &mut Sender<VerbsTransport>,
    rx: &mut Receiver<VerbsTransport>,
) -> Result<(), RingError> {
    loop {
        tx.poll()?;
        rx.poll()?;
        if !tx.transport_mut().words_pending() && !rx.transport_mut().words_pending() {
            return Ok(());
        }
        std::hint::spin_loop();
    }
}
