//! One ring connection: the `AttachedConn` the hooks dispatch to, generic
//! over the `Wire` that carries it (shared memory or RDMA verbs).
//!
//! Each end keeps a private duplicate of the kernel TCP socket, which
//! stays connected underneath: its EOF or reset is how a side learns that
//! the peer *process* died without closing, a side that leaves the ring
//! carries on over it (`leave`), and writes after the peer died go to it
//! (CLOSE_WAIT semantics: the first write is accepted, then the peer's
//! reset shows).
//!
//! Modes (the client starts `Pending`, the server `Ring`):
//! * `Pending`: the server has not decided yet. The client may already
//!   send up to `PENDING_CAP` bytes, which wait where the wire keeps them
//!   (`Wire::send_pending`) and reach the server first if it takes the
//!   ring.
//! * `Ring`: everything goes through the rings.
//! * `Tcp`: the connection left the ring, or never got it (the server
//!   turned it down): every call goes to the kernel socket, after what the
//!   ring still owed it (`tcp`: bytes drained from the ring are read first,
//!   bytes taken back from it are sent first).
//!
//! Readiness follows TCP's poll: readable with data or once the receiving
//! side is shut (the peer's end-of-stream mark has *arrived*, a reset, or
//! our own SHUT_RD), writable with room or once the sending side is shut,
//! HUP when both sides are, ERR while an error is pending.
//!
//! Waiting: `arm` announces a sleeping reader or writer in the ring (the
//! RB2 flags whose orders the loom models check) and counts waiters. The
//! doorbells are drained only by the last level-triggered waiter (ppoll)
//! to leave, under the same lock as arming, so one waiter never swallows
//! the wake-up another is about to sleep on; edge waiters (epoll sets
//! holding arms) never drain, and a drain that leaves them armed on a
//! ready connection rings our own bell again.

mod attached;
mod close;
mod failure;
mod flush;
mod fork;
mod leave;
mod lock;
mod mode;
mod peer;
mod ready;
mod recv;
#[cfg(test)]
pub mod seam;
mod send;
mod share;
mod state;
mod tcp;
mod tracked;
mod wait;
mod wire;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicU8, AtomicUsize};
use std::sync::{Mutex, Weak};

use ringsock_ring::{Receiver, RingError, Sender};

pub use share::Share;
pub use wire::{Waiters, Wire};

use lock::OpLock;

use super::msgstart::MessageStart;
use super::tracked::ReportState;

/// Bytes a client may send before the server decided: what a decline
/// makes us resend over TCP, so it is kept small.
pub const PENDING_CAP: usize = 64 * 1024;

pub const MODE_PENDING: u8 = 0;
pub const MODE_RING: u8 = 1;
pub const MODE_TCP: u8 = 2;

type TxSlot<W> = Option<Sender<<W as Wire>::Transport>>;
type RxSlot<W> = Option<Receiver<<W as Wire>::Transport>>;

/// What a handshake hands over to build a connection.
pub struct Parts<W: Wire> {
    pub offer_id: u64,
    pub local: SocketAddr,
    pub peer: SocketAddr,
    pub wire: W,
    /// The ring ends, where they exist yet (a verbs client gets them with
    /// the server's answer).
    pub tx: TxSlot<W>,
    pub rx: RxSlot<W>,
    /// Our duplicate of the kernel socket.
    pub tcp: RawFd,
    pub pending: bool,
}

pub struct RingConn<W: Wire> {
    pub offer_id: u64,
    pub local: SocketAddr,
    pub peer: SocketAddr,
    pub wire: W,
    /// Lock order: the wire's own locks, then `tx`, then `rx`, then the
    /// spills, then `waiters` (taken before either end when arming).
    tx: OpLock<TxSlot<W>>,
    rx: OpLock<RxSlot<W>>,
    /// Bytes the peer put into the ring before it left, read before the
    /// kernel socket's.
    rx_spill: Mutex<VecDeque<u8>>,
    /// Bytes taken back from the ring when the peer left, sent on the
    /// kernel socket before anything else.
    tx_spill: Mutex<VecDeque<u8>>,
    /// The kernel socket's SHUT_WR waits for `tx_spill` to drain.
    shut_wr_owed: AtomicBool,
    /// Our duplicate of the kernel socket; -1 once released.
    tcp: AtomicI32,
    /// The number `tcp` held until the release, kept (holding an inert
    /// file, `fdspace::retire`) until the last reference goes: another
    /// thread may have read it just before.
    retired_tcp: AtomicI32,
    mode: AtomicU8,
    /// The kernel socket saw EOF or a reset: the peer process is gone (or
    /// closed).
    peer_gone: AtomicBool,
    /// The connection was reset (by the peer, or as TCP would have been:
    /// the peer went away with bytes of ours unread).
    reset: AtomicBool,
    /// Pending SO_ERROR for the program.
    error: AtomicI32,
    /// A write after the peer closed was taken (sockio::send_after_peer_closed).
    closed_write_taken: AtomicBool,
    /// The kernel socket's error after the peer's close was passed on.
    socket_error_seen: AtomicBool,
    rd_shut: AtomicBool,
    wr_shut: AtomicBool,
    /// The end-of-stream mark could not be written yet (ring full).
    eos_owed: AtomicBool,
    /// We left and wait for the peer's acknowledgement: the kernel socket
    /// may still bring the peer's own leave header.
    leaving: AtomicBool,
    /// Our LOST header went unanswered in time (`wire_lost`): only the
    /// peer's header settles `leaving`, and until it comes nothing of ours
    /// goes on the socket (what it says we must send again goes first).
    lost_pending: AtomicBool,
    /// A flush met a failure of the wire (verbs): the connection must
    /// leave the ring (`wire_lost`) once no lock of ours is held. The
    /// failure, for the log.
    wire_failed: AtomicBool,
    wire_error: Mutex<Option<RingError>>,
    /// Our LOST leave header went out (`wire_lost`): never a second one,
    /// which the peer, on the socket by then, would read as stream data.
    lost_sent: AtomicBool,
    /// `settle_words` gave up with a word write unreported (a sleeping
    /// flag among them, maybe): once it is reported the background thread
    /// looks at readiness for the armed waiters, whose own look came
    /// before the flag was known to be visible (`try_flush`).
    settle_owed: AtomicBool,
    /// When a partial leave header was first seen (0: none).
    header_since: AtomicU64,
    /// A leave header came while we were pending: the server took the ring
    /// and left it at once, and its decision reaches us after the header
    /// (between hosts it travels through the daemons). Read once the
    /// connection is on the ring.
    header_early: AtomicBool,
    /// SO_RCVLOWAT.
    rcvlowat: AtomicUsize,
    /// Sends on the kernel socket that found no room (`tcp_send`): part of
    /// `event_seq` once the connection left its ring.
    tcp_blocked: AtomicU64,
    /// A fork made this side shared with another process (`share`), and
    /// the shared op count at the last fork this process took part in.
    forked: AtomicBool,
    forked_ops: AtomicU64,
    /// This process no longer counts among the side's holders.
    counted_out: AtomicBool,
    /// The kernel connect completed (`tcp_connected`).
    connected: AtomicBool,
    /// This end connected (the client), and when.
    initiated: bool,
    born_ns: u64,
    /// The server turned the ring down at set-up (`fall_back`), which the
    /// client's policy counted then, not at the close.
    turned_down: AtomicBool,
    /// Queued on the background thread's flush list.
    dirty: AtomicBool,
    /// Whether the next send starts a message.
    message: MessageStart,
    waiters: Mutex<Waiters>,
    released: AtomicBool,
    /// Status report bookkeeping (background thread).
    report: ReportState,
    this: Weak<RingConn<W>>,
}
