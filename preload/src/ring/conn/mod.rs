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

mod fork;
mod leave;
mod lock;
#[cfg(test)]
pub mod seam;
mod share;
mod tcp;
mod wire;

use std::collections::VecDeque;
use std::io::{IoSlice, IoSliceMut};
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use libc::c_int;
use ringsock_proto::Transport as StatusTransport;
use ringsock_ring::{Receiver, RingError, Sender};

pub use share::Share;
pub use wire::{Waiters, Wire};

use lock::{OpGuard, OpLock};

use super::background;
use super::msgstart::MessageStart;
use super::sockio::{self, lock, poll_one, ring_errno, sys_recv};
use super::tracked::{ReportState, Tracked};
use crate::attached::{AttachedConn, Errno, Look, Ready, ReleaseKind, WaitFd, WaitFds};
use crate::sys;

/// Bytes a client may send before the server decided: what a decline
/// makes us resend over TCP, so it is kept small.
pub const PENDING_CAP: usize = 64 * 1024;

pub const MODE_PENDING: u8 = 0;
pub const MODE_RING: u8 = 1;
pub const MODE_TCP: u8 = 2;

/// Longest a thread polls for its control-word writes to be reported (a
/// round trip; far longer only when the peer is unreachable).
const SETTLE_LIMIT_NS: u64 = 200_000_000;

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

impl<W: Wire> RingConn<W> {
    pub fn new(p: Parts<W>) -> Arc<RingConn<W>> {
        let mode = if p.pending { MODE_PENDING } else { MODE_RING };
        let rcvlowat = crate::sys::rcvlowat(p.tcp);
        Arc::new_cyclic(|this| RingConn {
            offer_id: p.offer_id,
            local: p.local,
            peer: p.peer,
            wire: p.wire,
            tx: OpLock::new(p.tx),
            rx: OpLock::new(p.rx),
            rx_spill: Mutex::new(VecDeque::new()),
            tx_spill: Mutex::new(VecDeque::new()),
            shut_wr_owed: AtomicBool::new(false),
            tcp: AtomicI32::new(p.tcp),
            mode: AtomicU8::new(mode),
            peer_gone: AtomicBool::new(false),
            reset: AtomicBool::new(false),
            error: AtomicI32::new(0),
            closed_write_taken: AtomicBool::new(false),
            socket_error_seen: AtomicBool::new(false),
            rd_shut: AtomicBool::new(false),
            wr_shut: AtomicBool::new(false),
            eos_owed: AtomicBool::new(false),
            leaving: AtomicBool::new(false),
            wire_failed: AtomicBool::new(false),
            wire_error: Mutex::new(None),
            lost_sent: AtomicBool::new(false),
            settle_owed: AtomicBool::new(false),
            header_since: AtomicU64::new(0),
            header_early: AtomicBool::new(false),
            rcvlowat: AtomicUsize::new(rcvlowat),
            forked: AtomicBool::new(false),
            forked_ops: AtomicU64::new(0),
            counted_out: AtomicBool::new(false),
            connected: AtomicBool::new(!p.pending),
            initiated: p.pending,
            born_ns: sys::monotonic_ns(),
            turned_down: AtomicBool::new(false),
            dirty: AtomicBool::new(false),
            message: MessageStart::new(),
            waiters: Mutex::new(Waiters::default()),
            released: AtomicBool::new(false),
            report: ReportState::new(),
            this: this.clone(),
        })
    }

    pub fn this(&self) -> Option<Arc<RingConn<W>>> {
        self.this.upgrade()
    }

    pub fn tcp_fd(&self) -> RawFd {
        self.tcp.load(Ordering::Acquire)
    }

    pub fn mode(&self) -> u8 {
        self.mode.load(Ordering::Acquire)
    }

    /// Pending -> Ring (the server took the ring). Returns false if the
    /// connection had already left `Pending`.
    pub fn enter_ring(&self) -> bool {
        self.mode
            .compare_exchange(MODE_PENDING, MODE_RING, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    pub fn wr_shut(&self) -> bool {
        self.wr_shut.load(Ordering::Acquire)
    }

    /// Marks this side shut for writing without a mark yet (a close while
    /// the wire has no sender: the mark follows the early bytes).
    pub fn set_wr_shut(&self) {
        self.wr_shut.store(true, Ordering::Release);
    }

    pub fn owe_eos(&self) {
        self.eos_owed.store(true, Ordering::Release);
    }

    pub fn peer_gone(&self) -> bool {
        self.peer_gone.load(Ordering::Acquire)
    }

    /// The locked sender slot (the wire's pending paths and handshake).
    pub fn tx_slot(&self) -> OpGuard<'_, TxSlot<W>> {
        self.tx.lock()
    }

    /// The locked receiver slot.
    pub fn rx_slot(&self) -> OpGuard<'_, RxSlot<W>> {
        self.rx.lock()
    }

    /// Resolves `Pending` where the wire carries the decision itself.
    /// Cheap when already decided: on the ring with nothing owed, three
    /// loads inlined into the data path.
    #[inline]
    pub fn settle(&self) -> u8 {
        let m = self.mode();
        if m == MODE_RING
            && !self.header_early.load(Ordering::Relaxed)
            && !self.forked.load(Ordering::Relaxed)
        {
            return m;
        }
        self.settle_from(m)
    }

    /// `settle`'s work once the mode read `m` is not a plain ring.
    #[inline(never)]
    fn settle_from(&self, m: u8) -> u8 {
        if m == MODE_RING {
            if self.header_early.load(Ordering::Relaxed)
                && self.header_early.swap(false, Ordering::AcqRel)
            {
                self.check_tcp();
            }
            if self.forked.load(Ordering::Relaxed) {
                self.notice_shared_leave();
            }
            return self.mode();
        }
        if m != MODE_PENDING {
            return m;
        }
        W::poll_decision(self);
        if self.mode() == MODE_RING {
            return self.settle();
        }
        self.mode()
    }

    /// Pending -> Tcp: takes back what was sent while pending; it goes
    /// over the kernel socket before anything else.
    pub fn fall_back(&self, why: &str) {
        let mut tx = self.tx.lock();
        if self.mode() != MODE_PENDING {
            return;
        }
        let spill = match W::take_early(self, &mut tx) {
            Ok(b) => b,
            Err(e) => {
                log::error!("falling back to TCP: the early bytes are unreadable ({e:?})");
                self.error.store(libc::ECONNRESET, Ordering::Release);
                Vec::new()
            }
        };
        let early = spill.len();
        self.spill_tx(spill, self.wr_shut());
        self.mode.store(MODE_TCP, Ordering::Release);
        drop(tx);
        self.push_tx_spill();
        if self.initiated {
            self.turned_down.store(true, Ordering::Release);
            super::policy::turned_down(self.peer);
        }
        log::info!(
            "{} -> {}: plain TCP ({why}); {early} early bytes resent",
            self.local,
            self.peer,
        );
        if let Some(me) = self.this() {
            background::note_fallback(me);
        }
        self.wire.ring_own_bell();
    }

    /// Looks at the kernel socket of a connection on the ring (or pending):
    /// EOF or reset means the peer process is gone; a leave header means
    /// the peer left (`stay`); other data while pending means the server
    /// talks TCP (it turned the ring down without a word), and on a ring
    /// that something is badly wrong.
    pub fn check_tcp(&self) {
        let fd = self.tcp_fd();
        let mode = self.mode();
        if fd >= 0 && mode != MODE_TCP && self.peer_gone.load(Ordering::Relaxed) {
            // The reset that answers a send after the peer's close: waiters
            // look again (readiness shows it), once.
            if !self.reset.load(Ordering::Acquire)
                && poll_one(fd, 0) & libc::POLLERR != 0
                && !self.socket_error_seen.swap(true, Ordering::AcqRel)
            {
                self.wire.ring_own_bell();
            }
            return;
        }
        if fd < 0 || mode == MODE_TCP || self.leaving.load(Ordering::Acquire) {
            // (A side that sent its leave header reads the peer's answer
            // in `leave` itself.)
            return;
        }
        if self.forked.load(Ordering::Relaxed) {
            self.notice_shared_leave();
            if self.mode() == MODE_TCP {
                return;
            }
        }
        if poll_one(fd, libc::POLLIN | libc::POLLRDHUP) == 0 {
            return;
        }
        if !W::is_user(self) {
            // The process using the connection answers (a forked copy
            // that took the header would strand the user).
            return;
        }
        let mut b = [0u8; leave::HEADER_BYTES];
        match sys_recv(fd, &mut b, libc::MSG_PEEK) {
            Ok(0) => self.peer_closed_socket(),
            Ok(n) if mode == MODE_PENDING => self.tcp_while_pending(&b[..n]),
            Ok(_) => self.header_arrived(),
            Err(Errno(libc::EAGAIN)) => {}
            Err(Errno(libc::ECONNRESET)) => self.reset_as_tcp_would(),
            Err(Errno(e)) => self.reset_by_peer(e),
        }
    }

    /// Bytes on the kernel socket before the server's decision reached us.
    /// A leave header means the server took the ring (and left it at
    /// once): its decision is already in the segment, or on its way
    /// through the daemons, and the header is read on the ring. Anything
    /// else is a server that talks TCP: where the wire decides, its
    /// decision word is revoked first (a server that took the ring wins).
    fn tcp_while_pending(&self, peeked: &[u8]) {
        if leave::Leave::parse(peeked) != leave::Parsed::Garbage {
            self.header_early.store(true, Ordering::Release);
            self.settle();
            return;
        }
        if !W::revoke(self) {
            self.fall_back("the server answered over TCP");
        }
        self.settle();
    }

    /// The kernel socket's EOF: the peer process closed it or died. Kernel
    /// TCP would have reset the connection if the peer left bytes of ours
    /// unread; where the wire can tell, so does this.
    fn peer_closed_socket(&self) {
        log::debug!(
            "{} -> {}: the peer closed its socket",
            self.local,
            self.peer
        );
        let unread = {
            let tx = self.tx.lock();
            tx.as_ref()
                .is_some_and(|tx| W::peer_left_unread(self, tx.bytes_written()))
        };
        self.peer_gone.store(true, Ordering::Release);
        if unread {
            self.reset_as_tcp_would();
        }
        self.wire.ring_own_bell();
    }

    /// The reset the peer's kernel would have sent (it closed with bytes
    /// of ours unread): after its FIN TCP reports it as EPIPE (the socket
    /// was in CLOSE_WAIT), before it as ECONNRESET. A ring that fails shows
    /// no FIN.
    fn reset_as_tcp_would(&self) {
        let fin = self
            .rx
            .lock()
            .as_mut()
            .is_none_or(|rx| rx.eos_published().unwrap_or(false));
        let errno = if fin && !self.wr_shut() {
            libc::EPIPE
        } else {
            libc::ECONNRESET
        };
        self.reset_by_peer(errno);
    }

    /// The peer reset the connection (or, gone with our bytes unread,
    /// would have): reads return what the ring holds, then the error once,
    /// then EOF; writes fail; poll shows ERR and HUP.
    fn reset_by_peer(&self, errno: c_int) {
        if self.reset.swap(true, Ordering::AcqRel) {
            return;
        }
        self.error.store(errno, Ordering::Release);
        self.peer_gone.store(true, Ordering::Release);
        self.wire.ring_own_bell();
    }

    /// The connection cannot go on: the program gets `errno`, and the peer
    /// gets a reset on our kernel socket (its ring layer reads that as
    /// this end gone), so it neither sleeps forever on a ring nobody
    /// writes nor takes a cut stream for a whole one.
    pub fn fail_hard(&self, errno: c_int) {
        self.error.store(errno, Ordering::Release);
        self.reset.store(true, Ordering::Release);
        if !self.peer_gone.swap(true, Ordering::AcqRel) {
            self.rd_shut.store(true, Ordering::Release);
            let fd = self.tcp_fd();
            if fd >= 0 {
                sockio::abort(fd);
            }
        }
        self.wire.ring_own_bell();
    }

    /// The errno for a failed ring call. A failure after the peer process
    /// closed its socket is that close seen from the ring: the caller then
    /// behaves as after the peer's EOF. Corruption (and on a wire whose
    /// failures are fatal, anything) ends the connection.
    pub fn ring_failed(&self, e: &RingError, what: &str) -> Errno {
        match e {
            RingError::WouldBlock => return Errno(libc::EAGAIN),
            RingError::PeerClosed | RingError::Closed => return Errno(libc::EPIPE),
            _ => {}
        }
        self.check_tcp();
        if self.peer_gone() {
            log::debug!(
                "{what} on {} -> {}: {e} after the peer closed",
                self.local,
                self.peer
            );
            return Errno(libc::EPIPE);
        }
        if W::FAILURES_ARE_FATAL && matches!(e, RingError::Verbs(_)) {
            self.wire_lost(e);
            if self.mode() == MODE_TCP && !self.reset.load(Ordering::Acquire) {
                // Carried on over the kernel socket: the caller goes there.
                return Errno(libc::EAGAIN);
            }
            if self.peer_gone() {
                return Errno(if self.reset.load(Ordering::Acquire) {
                    libc::ECONNRESET
                } else {
                    libc::EPIPE
                });
            }
        }
        let errno = match e {
            RingError::Config(_) | RingError::Verbs(_) => {
                log::error!(
                    "{what} on {} -> {}: {e}; the connection is reset",
                    self.local,
                    self.peer
                );
                Errno(libc::ECONNRESET)
            }
            other => ring_errno(other, what),
        };
        if W::FAILURES_ARE_FATAL || matches!(e, RingError::Corrupt(_)) {
            self.fail_hard(errno.0);
        }
        errno
    }

    /// Polls both ends (held by the caller) until no control-word write is
    /// unreported, or the bound runs out. True when settled.
    fn settle_locked(&self, tx: &mut TxSlot<W>, rx: &mut RxSlot<W>, limit_ns: u64) -> bool {
        if !W::REAPS_COMPLETIONS {
            return true;
        }
        let start = sys::monotonic_ns();
        let mut wait = ringsock_ring::sleep::backoff::CompletionWait::new();
        loop {
            let tx_owes = tx
                .as_mut()
                .is_some_and(|tx| W::words_pending(tx.transport_mut()) && tx.poll().is_ok());
            let rx_owes = rx
                .as_mut()
                .is_some_and(|rx| W::words_pending(rx.transport_mut()) && rx.poll().is_ok());
            if !tx_owes && !rx_owes {
                return true;
            }
            if self.peer_gone() || sys::monotonic_ns() - start > limit_ns {
                return false;
            }
            wait.relax();
        }
    }

    /// Polls both ends until no control-word write is unreported: every
    /// tail and head this process published has landed and the matching
    /// sleeping-flag check ran (the ring crate's verbs module, "What verbs
    /// need"). Bounded: a peer whose queue pair is gone never acknowledges,
    /// and its death shows on the kernel socket; what is still owed then
    /// is left to the background thread (the connection stays queued).
    fn settle_words(&self) {
        if !W::REAPS_COMPLETIONS {
            return;
        }
        let start = sys::monotonic_ns();
        let mut spins = 0u32;
        let mut wait = ringsock_ring::sleep::backoff::CompletionWait::new();
        loop {
            let tx_owes = self
                .tx
                .lock()
                .as_mut()
                .is_some_and(|tx| W::words_pending(tx.transport_mut()) && tx.poll().is_ok());
            let rx_owes = self
                .rx
                .lock()
                .as_mut()
                .is_some_and(|rx| W::words_pending(rx.transport_mut()) && rx.poll().is_ok());
            if !tx_owes && !rx_owes {
                return;
            }
            spins += 1;
            if spins.is_multiple_of(64) {
                self.check_tcp();
                if self.peer_gone() || sys::monotonic_ns() - start > SETTLE_LIMIT_NS {
                    self.settle_owed.store(true, Ordering::Release);
                    self.mark_dirty();
                    return;
                }
            }
            wait.relax();
        }
    }

    /// Pushes batched bytes out (and a deferred end-of-stream mark, and
    /// bytes the ring owes the kernel socket).
    fn flush_now(&self) {
        let mut tx = self.tx.lock();
        self.flush_locked(&mut tx);
        drop(tx);
        self.lose_wire();
        self.push_tx_spill();
    }

    /// Records `e` if it says the wire failed (`wire_failed`): the ring is
    /// left by whoever next holds none of our locks (`lose_wire`), and a
    /// waiter looks again. Returns whether it did.
    fn note_wire_failure(&self, e: &RingError) -> bool {
        if !(W::FAILURES_ARE_FATAL && matches!(e, RingError::Verbs(_))) {
            return false;
        }
        lock(&self.wire_error).get_or_insert_with(|| e.clone());
        self.wire_failed.store(true, Ordering::Release);
        self.wire.ring_own_bell();
        true
    }

    /// The background thread's look for a failed wire (`watch::check_wires`)
    /// on a connection no thread of the program may be looking at: reaps
    /// the completions of both ends, skipping one in use, and leaves the
    /// ring if they tell of a failure. A device need not wake a sleeping
    /// end when its queue pair fails, and both ends may sleep, each
    /// waiting for the other.
    fn check_wire(&self) {
        if !W::REAPS_COMPLETIONS || self.mode() != MODE_RING || !W::is_user(self) {
            return;
        }
        if let Some(mut tx) = self.tx.try_lock() {
            let polled = tx.as_mut().map(|tx| {
                tx.poll()
                    .and_then(|()| W::check_stalled(tx.transport_mut()))
            });
            if let Some(Err(e)) = polled {
                self.note_wire_failure(&e);
            }
        }
        if let Some(mut rx) = self.rx.try_lock() {
            if let Some(Err(e)) = rx.as_mut().map(|rx| rx.poll()) {
                self.note_wire_failure(&e);
            }
        }
        self.lose_wire();
    }

    /// Leaves the ring if a flush found its wire failed (`wire_failed`).
    /// The caller holds none of our locks.
    #[inline]
    fn lose_wire(&self) {
        // One plain load on the way of every send and receive.
        if self.wire_failed.load(Ordering::Relaxed) {
            self.lose_failed_wire();
        }
    }

    /// `lose_wire` once the flag showed.
    #[cold]
    #[inline(never)]
    fn lose_failed_wire(&self) {
        if self.wire_failed.swap(false, Ordering::AcqRel) {
            // `wire_error` is a leaf lock: taken under the ring ends' locks
            // (`note_wire_failure`), so not held while leaving takes them.
            let e = lock(&self.wire_error).take();
            if let Some(e) = e {
                self.wire_lost(&e);
            }
        }
    }

    /// Background variant: skips a connection another thread is using (it
    /// flushes by itself before it blocks). Returns false if skipped.
    fn try_flush(&self) -> bool {
        let Some(mut tx) = self.tx.try_lock() else {
            return false;
        };
        self.flush_locked(&mut tx);
        drop(tx);
        self.lose_wire();
        self.push_tx_spill();
        if W::REAPS_COMPLETIONS {
            // A head push the receiver made (a word write) owes the peer a
            // kick if it waits for space: poll it here too.
            let rx_owes = match self.rx.try_lock() {
                Some(mut rx) => rx.as_mut().is_some_and(|rx| {
                    if let Err(e) = rx.poll() {
                        self.note_wire_failure(&e);
                    }
                    W::words_pending(rx.transport_mut())
                }),
                None => true,
            };
            if rx_owes || self.dirty.load(Ordering::Acquire) {
                self.mark_dirty();
            } else if self.settle_owed.swap(false, Ordering::AcqRel) {
                self.wake_if_ready();
            }
            self.lose_wire();
        }
        true
    }

    /// Rings our own bell if a waiter is armed for what readiness now
    /// shows: the look a sleeper took while its flag write was unreported
    /// may have missed bytes or space the peer, not seeing the flag yet,
    /// announced to no one.
    fn wake_if_ready(&self) {
        let armed = {
            let w = lock(&self.waiters);
            (w.rx > 0, w.tx > 0)
        };
        if armed == (false, false) {
            return;
        }
        let r = self.readiness();
        let rx_ready = armed.0 && r.intersects(Ready::IN | Ready::RDHUP | Ready::HUP | Ready::ERR);
        let tx_ready = armed.1 && r.intersects(Ready::OUT | Ready::HUP | Ready::ERR);
        if rx_ready || tx_ready {
            self.wire.ring_own_bell();
        }
    }

    /// Flushes with the sender locked; pays a deferred end-of-stream mark.
    pub fn flush_locked(&self, tx: &mut TxSlot<W>) {
        self.dirty.store(false, Ordering::Release);
        if self.mode() == MODE_TCP {
            return;
        }
        let Some(tx) = tx.as_mut() else {
            return;
        };
        if let Err(e) = tx.flush() {
            if self.note_wire_failure(&e) {
                return;
            }
            if e != RingError::Closed {
                log::debug!("flush: {e:?}");
            }
        }
        if self.eos_owed.load(Ordering::Acquire) {
            match tx.close() {
                Ok(()) => self.eos_owed.store(false, Ordering::Release),
                Err(RingError::WouldBlock) => {}
                Err(_) => self.eos_owed.store(false, Ordering::Release),
            }
        }
        let mut owed = false;
        if W::REAPS_COMPLETIONS {
            // The tail WRITE completes later: until it is reported, the
            // check for a sleeping peer has not run, so keep polling.
            let _ = tx.poll();
            owed = W::words_pending(tx.transport_mut());
        }
        if owed || tx.has_unflushed() || self.eos_owed.load(Ordering::Acquire) {
            self.mark_dirty();
        }
    }

    /// Records written into this connection's rings, by us and by the
    /// peer (the peer's count is its own word in the segment: it only
    /// steers the policy).
    fn records_carried(&self) -> u64 {
        let sent = self.tx.lock().as_ref().map_or(0, |t| t.records_written());
        let got = self.rx.lock().as_ref().map_or(0, |r| r.stats().tx_records);
        sent.saturating_add(got)
    }

    pub fn mark_dirty(&self) {
        if !self.dirty.swap(true, Ordering::AcqRel) {
            if let Some(me) = self.this() {
                background::queue_flush(me);
            }
        }
    }

    /// While pending: whether the kernel connect completed (a program
    /// waiting for POLLOUT after a non-blocking connect must not be told
    /// "writable" before the kernel would).
    pub fn tcp_connected(&self) -> bool {
        if self.connected.load(Ordering::Relaxed) {
            return true;
        }
        let fd = self.tcp_fd();
        let now = fd >= 0 && poll_one(fd, libc::POLLOUT) & libc::POLLOUT != 0;
        if now {
            // A connected socket stays connected; spinning readers need
            // not ask the kernel again.
            self.connected.store(true, Ordering::Relaxed);
        }
        now
    }

    /// A ring read that found nothing: the pending error once the
    /// connection was reset, EOF once the peer is gone (its FIN came after
    /// everything it put in the ring) or this side shut reading, else
    /// EAGAIN.
    fn nothing_to_read(&self) -> Result<usize, Errno> {
        if self.peer_gone() || self.reset.load(Ordering::Acquire) {
            return sockio::take_recv_error(&self.error).map_or(Ok(0), |e| Err(Errno(e)));
        }
        if self.rd_shut.load(Ordering::Acquire) {
            return Ok(0);
        }
        Err(Errno(libc::EAGAIN))
    }

    /// `event_seq` from the ring ends themselves, where the wire keeps no
    /// cheaper count: the stream position the peer's bytes reached (bytes
    /// consumed plus readable) and the head it handed back, both only
    /// growing, so their sum changes with every arrival of data or space.
    fn ring_seq(&self) -> u64 {
        let tx = self.tx.lock();
        let mut rx = self.rx.lock();
        let head = tx.as_ref().map_or(0, |t| t.head_seen());
        let arrived = rx.as_mut().map_or(0, |r| {
            r.bytes_consumed() + r.available().unwrap_or(0) as u64
        });
        arrived.wrapping_add(head)
    }

    /// Writes up to `budget` bytes of `bufs` into the ring, seen in mode
    /// `seen` (Pending or Ring); a call that finds the mode changed under
    /// the sender's lock starts over (a fall-back or a leave moves the
    /// bytes while it holds that lock).
    pub fn send_into_ring(
        &self,
        bufs: &[IoSlice<'_>],
        budget: usize,
        seen: u8,
    ) -> Result<usize, Errno> {
        let mut guard = self.tx.lock();
        if self.mode() != seen {
            drop(guard);
            return self.try_send(bufs);
        }
        let shared = match self.enter_shared(Some(&mut guard)) {
            fork::Entered::Alone => None,
            fork::Entered::Shared(s) => Some(s),
            fork::Entered::Left => {
                drop(guard);
                return self.try_send(bufs);
            }
        };
        let Some(tx) = guard.as_mut() else {
            if let Some(s) = shared {
                self.exit_shared(s, None, None);
            }
            return Err(Errno(libc::EAGAIN));
        };
        // On a shared side every byte is published within the operation,
        // so the positions it leaves are the ring's.
        let starts = self.message.starts_message() || shared.is_some();
        if starts {
            tx.end_stream();
        }
        let mut total = 0;
        let mut failed = None;
        let mut full = false;
        for b in bufs.iter().filter(|b| !b.is_empty()) {
            let chunk = &b[..b.len().min(budget - total)];
            match W::write(tx, chunk) {
                Ok(n) => {
                    total += n;
                    full = n < chunk.len();
                    if n < b.len() || total == budget {
                        break;
                    }
                }
                Err(RingError::WouldBlock) => {
                    full = true;
                    break;
                }
                Err(e) => {
                    if total == 0 {
                        failed = Some(e);
                    }
                    break;
                }
            }
        }
        if !starts && W::PUBLISHES_EACH_SEND {
            // The bytes are readable when the send returns; a sleeping
            // reader is woken by the flush that follows (`Sender::publish`).
            let _ = tx.publish();
        }
        if starts {
            // A message goes out now (`msgstart`); flush_locked queues what
            // it cannot finish.
            self.flush_locked(&mut guard);
            if let Some(s) = shared {
                let written = guard.as_ref().map(|t| t.bytes_written());
                self.exit_shared(s, None, written);
            }
            drop(guard);
        } else {
            let unflushed = tx.has_unflushed();
            drop(guard);
            if unflushed {
                self.mark_dirty();
            }
        }
        if let Some(e) = failed {
            if e == RingError::PeerClosed {
                // The peer closed its socket before its FIN reached us. An
                // EPIPE at once would fail a write TCP accepts (iperf3's
                // cookie write to a server that answered "busy" and closed);
                // the peer's kernel answers that write with a reset.
                let r = sockio::send_after_peer_closed(&self.closed_write_taken, bufs);
                if r.is_ok() {
                    self.reset_as_tcp_would();
                }
                return r;
            }
            let errno = self.ring_failed(&e, "send");
            if self.mode() == MODE_TCP {
                return self.tcp_send(bufs);
            }
            if errno == Errno(libc::EPIPE) && self.peer_gone() {
                return self.send_after_peer_gone(bufs);
            }
            return Err(errno);
        }
        if full {
            self.keep_waiters_armed(false);
        }
        if total == 0 {
            return Err(Errno(libc::EAGAIN));
        }
        Ok(total)
    }

    /// A call found the ring empty (`input`) or full while a waiter is
    /// armed for it: raises our flag now, as the kernel marks a socket
    /// whose call returned EAGAIN, so that the peer's next send (or read)
    /// rings us. The waiter may have armed while the ring still had data
    /// (or room), when no flag was needed, and the program emptied (or
    /// filled) it since without an epoll set looking again: an
    /// edge-triggered set would never hear of the next change.
    fn keep_waiters_armed(&self, input: bool) {
        let w = lock(&self.waiters);
        let armed = if input { w.rx > 0 } else { w.tx > 0 };
        if !armed || self.peer_gone() {
            return;
        }
        let raised = if input {
            self.rx.lock().as_mut().map(|rx| rx.prepare_wait())
        } else {
            self.tx.lock().as_mut().map(|tx| tx.prepare_wait())
        };
        drop(w);
        self.settle_words();
        if let Some(Ok(false)) = raised {
            // Data (or room) came meanwhile: the waiter looks again.
            self.wire.ring_own_bell();
        }
    }

    /// A send once the peer process is gone: after a reset, the error once
    /// and then EPIPE, as TCP; after a plain close, on the kernel socket
    /// (now in CLOSE_WAIT), so the program sees what TCP would show it: the
    /// first write accepted, the peer's reset, then ECONNRESET/EPIPE.
    /// Failing the first write at once is not the same: redis-benchmark
    /// retries a failed write forever when its write handler meets it.
    fn send_after_peer_gone(&self, bufs: &[IoSlice<'_>]) -> Result<usize, Errno> {
        if self.reset.load(Ordering::Acquire) {
            let e = self.error.swap(0, Ordering::AcqRel);
            return Err(Errno(if e != 0 { e } else { libc::EPIPE }));
        }
        sockio::send_vec(self.tcp_fd(), bufs)
    }

    /// Readiness while on the ring (or pending), as TCP's poll computes it,
    /// for a waiter that wants `interest`: exact for `interest`, ERR and
    /// HUP; the other bits may be missing. A side that is not asked about
    /// is not locked: the receive side matters to reading interest, and to
    /// HUP once the sending side is shut; the sending side to writing
    /// interest, and on a wire that reaps completions on every look.
    fn ring_readiness(&self, interest: Ready) -> Ready {
        if self.wire_failed.load(Ordering::Relaxed) {
            // The next send or receive leaves the ring (`lose_wire`).
            return Ready(interest.0 & (Ready::IN.0 | Ready::OUT.0));
        }
        let gone = self.peer_gone();
        let reset = self.reset.load(Ordering::Acquire);
        let snd_shut = reset || self.wr_shut.load(Ordering::Acquire);
        let look_rx = interest.intersects(Ready::INPUT) || snd_shut;
        let look_tx = interest.intersects(Ready::OUTPUT) || W::REAPS_COMPLETIONS;
        let (data, fin) = if !look_rx {
            (false, false)
        } else {
            let mut rx = self.rx.lock();
            match rx.as_mut() {
                Some(rx) => {
                    let lowat = self.rcvlowat.load(Ordering::Relaxed);
                    let data = if lowat <= 1 {
                        match rx.readable() {
                            Ok(d) => d,
                            Err(e) => !self.note_wire_failure(&e),
                        }
                    } else {
                        rx.available().map_or(true, |n| n >= lowat)
                    };
                    (data, rx.eos_published().unwrap_or(true))
                }
                None => (false, false),
            }
        };
        let rcv_shut = fin || gone || reset || self.rd_shut.load(Ordering::Acquire);
        let mut r = Ready::NONE;
        if data || rcv_shut {
            r = r | Ready::IN;
        }
        if rcv_shut {
            r = r | Ready::RDHUP;
        }
        let writable = if !look_tx {
            false
        } else if self.mode() == MODE_PENDING {
            W::pending_room(self) > 0 && self.tcp_connected()
        } else {
            match self.tx.lock().as_mut() {
                Some(tx) => {
                    // Reaping on every look, whatever the interest: a tail
                    // WRITE that completed may owe the peer its doorbell
                    // (it began to sleep after the WRITE was posted), and
                    // left to this end's own arming the doorbell would
                    // wait out our spin while the peer oversleeps.
                    if W::REAPS_COMPLETIONS {
                        if let Err(e) = tx.poll() {
                            self.note_wire_failure(&e);
                        }
                    }
                    !matches!(tx.write_space(), Ok(false))
                }
                None => true,
            }
        };
        if self.wire_failed.load(Ordering::Relaxed) {
            // A look above found the wire failed.
            return Ready(interest.0 & (Ready::IN.0 | Ready::OUT.0));
        }
        if snd_shut || gone || writable {
            r = r | Ready::OUT;
        }
        if rcv_shut && snd_shut {
            r = r | Ready::HUP;
        }
        if self.error.load(Ordering::Acquire) != 0 {
            r = r | Ready::ERR;
        }
        if gone && !reset {
            // After the peer's close our sends go on the kernel socket,
            // and the reset that answers them arrives there.
            let k = poll_one(self.tcp_fd(), 0);
            if k & libc::POLLERR != 0 {
                r = r | Ready::ERR;
            }
            if k & libc::POLLHUP != 0 {
                r = r | Ready::HUP;
            }
        }
        r
    }

    fn arm_inner(&self, interest: Ready, level: bool) -> Ready {
        if !level && self.forked.load(Ordering::Acquire) {
            // An epoll set looks at the kernel socket whenever it fires in
            // its private set (`socket_fired`), so an edge arm need not.
            // Except on a side a fork shared: the other process may have
            // taken the edge from the set both hold, and not answered it
            // (it is not the side's user), so look now, as the ring side's
            // re-check does after prepare_wait. (Level waiters ppoll the
            // socket itself.)
            self.check_tcp();
        }
        if self.settle() == MODE_TCP {
            if level {
                lock(&self.waiters).level += 1;
            }
            return self.tcp_readiness();
        }
        let mut w = lock(&self.waiters);
        W::before_arm(self, &w);
        if level {
            w.level += 1;
        }
        // Counts depend on `interest` alone, so that `disarm` undoes
        // exactly what this did even if the mode changed meanwhile. While
        // pending the server's decision rings our bell whatever the flags
        // say. A peer known gone announces nothing: readiness shows it
        // (read and write both end), and its queue pair may never report
        // a flag WRITE to it. A flag whose report does not come in time
        // (`prepare_wait`'s WouldBlock) leaves the sleep bounded by
        // `settle_words` and the waiter's re-check.
        let gone = self.peer_gone();
        if interest.intersects(Ready::INPUT) {
            w.rx += 1;
            if !gone {
                if let Some(rx) = self.rx.lock().as_mut() {
                    let _ = rx.prepare_wait();
                }
            }
        }
        if interest.intersects(Ready::OUTPUT) {
            w.tx += 1;
            if !gone {
                if let Some(tx) = self.tx.lock().as_mut() {
                    let _ = tx.prepare_wait();
                }
            }
        }
        drop(w);
        self.settle_words();
        self.readiness_for(interest)
    }

    /// `rung`: a doorbell may have rung (else there is nothing to drain);
    /// `socket`: the kernel socket may have news (else no look at it).
    fn disarm_inner(&self, interest: Ready, level: bool, rung: bool, socket: bool) {
        {
            let mut w = lock(&self.waiters);
            if level {
                w.level = w.level.saturating_sub(1);
            }
            if interest.intersects(Ready::INPUT) && w.rx > 0 {
                w.rx -= 1;
                if w.rx == 0 {
                    if let Some(rx) = self.rx.lock().as_mut() {
                        let _ = rx.finish_wait(true);
                    }
                }
            }
            if interest.intersects(Ready::OUTPUT) && w.tx > 0 {
                w.tx -= 1;
                if w.tx == 0 {
                    if let Some(tx) = self.tx.lock().as_mut() {
                        let _ = tx.finish_wait(true);
                    }
                }
            }
            // Only the last level-triggered waiter drains (so a later ppoll
            // does not wake for an old ring). Edge waiters never drain: the
            // kernel re-checks an eventfd before epoll reports it, so
            // draining before an epoll set has read its event would swallow
            // that set's wake-up. If edge arms remain after a drain and what
            // they wait for is already there, the ring that told them may
            // just have been drained: ring again.
            if rung && level && w.level == 0 && self.wire.drain_bells() && w.any_armed() {
                let r = self.readiness();
                let rx_ready =
                    w.rx > 0 && r.intersects(Ready::IN | Ready::RDHUP | Ready::HUP | Ready::ERR);
                let tx_ready = w.tx > 0 && r.intersects(Ready::OUT | Ready::HUP | Ready::ERR);
                if rx_ready || tx_ready {
                    self.wire.ring_own_bell();
                }
            }
        }
        if socket {
            self.check_tcp();
        }
        self.settle();
    }

    /// Whether the program left bytes of the peer's unread: closing then
    /// resets the connection, as TCP does.
    fn unread_at_close(&self) -> bool {
        if !lock(&self.rx_spill).is_empty() {
            return true;
        }
        self.mode() == MODE_RING
            && self
                .rx
                .lock()
                .as_mut()
                .is_some_and(|rx| rx.available().unwrap_or(0) > 0)
    }

    /// Whether the program asked for a reset on close (SO_LINGER {1, 0}).
    fn linger_zero(&self) -> bool {
        let mut l = libc::linger {
            l_onoff: 0,
            l_linger: 0,
        };
        let mut len = std::mem::size_of::<libc::linger>() as libc::socklen_t;
        // SAFETY: l and len describe a linger struct of our own.
        let r = unsafe {
            crate::sys::sys_call!(
                libc::SYS_getsockopt,
                self.tcp_fd(),
                libc::SOL_SOCKET,
                libc::SO_LINGER,
                &mut l as *mut libc::linger,
                &mut len as *mut libc::socklen_t,
            )
        };
        r == 0 && l.l_onoff != 0 && l.l_linger == 0
    }

    /// Closes with a reset: SO_LINGER {1, 0} on the kernel socket, whose
    /// last close then sends RST; the ring gets no end-of-stream mark, so
    /// the peer reads what we sent, then ECONNRESET.
    fn close_with_reset(&self) {
        let l = libc::linger {
            l_onoff: 1,
            l_linger: 0,
        };
        // SAFETY: l describes a linger struct of our own.
        unsafe {
            crate::sys::sys_call!(
                libc::SYS_setsockopt,
                self.tcp_fd(),
                libc::SOL_SOCKET,
                libc::SO_LINGER,
                &l as *const libc::linger,
                std::mem::size_of::<libc::linger>() as libc::socklen_t,
            )
        };
    }
}

impl<W: Wire> Tracked for RingConn<W> {
    fn offer_id(&self) -> u64 {
        self.offer_id
    }

    fn local(&self) -> SocketAddr {
        self.local
    }

    fn peer(&self) -> SocketAddr {
        self.peer
    }

    fn report_state(&self) -> &ReportState {
        &self.report
    }

    fn transport(&self) -> StatusTransport {
        if self.mode() == MODE_TCP {
            StatusTransport::Tcp
        } else {
            W::STATUS
        }
    }

    fn ring_detail(&self) -> String {
        self.wire.detail()
    }

    fn socket_fd(&self) -> RawFd {
        self.tcp_fd()
    }

    fn check_socket(&self) {
        self.check_tcp();
        if self.mode() == MODE_TCP {
            super::watch::unwatch(self, self.tcp_fd());
        }
    }

    fn flush_ring(&self) {
        self.flush_now();
    }

    fn wire_checked(&self) -> bool {
        W::FAILURES_ARE_FATAL
    }

    fn check_wire(&self) {
        RingConn::check_wire(self);
    }

    fn try_flush_ring(&self) -> bool {
        self.try_flush()
    }

    fn is_released(&self) -> bool {
        self.released.load(Ordering::Acquire)
    }

    fn still_pending(&self) -> bool {
        self.check_tcp();
        self.settle() == MODE_PENDING
    }

    fn revoke(&self) -> bool {
        W::revoke(self)
    }

    fn decline_from_ctl(&self, reason: Option<&str>) {
        W::decline_from_ctl(self, reason);
    }

    fn answered(&self, payload: &[u8]) -> bool {
        W::answered(self, payload)
    }

    fn urgent_follow_up(&self) -> bool {
        W::urgent_follow_up(self)
    }
}

/// TCP states as TCP_INFO's `tcpi_state` numbers them (include/net/tcp_states.h).
mod tcp_state {
    pub const FIN_WAIT2: u8 = 5;
    pub const CLOSE: u8 = 7;
    pub const CLOSE_WAIT: u8 = 8;
}

impl<W: Wire> RingConn<W> {
    /// `try_recv`, or with `quiet` a blocking read's look (`recv_look`):
    /// the same read under the receiver's lock, but a connection not
    /// plainly on its ring is `Unsure` before anything is read, and an
    /// empty ring is `Empty` without asking the kernel socket, or `Unsure`
    /// where a flag says a reader has more to see (`reader_news`).
    fn recv_ring(&self, bufs: &mut [IoSliceMut<'_>], peek: bool, quiet: bool) -> Look {
        self.lose_wire();
        match self.settle() {
            MODE_RING => {}
            _ if quiet => return Look::Unsure,
            MODE_TCP => return Look::Done(self.tcp_recv(bufs, peek)),
            _ => {
                // Pending: nothing can be in our ring before the server
                // decided; TCP data would mean it declined without telling
                // us.
                self.check_tcp();
                if !W::DECISION_IN_SEGMENT
                    && self.peer_gone()
                    && !self.reset.load(Ordering::Acquire)
                    && self.mode() == MODE_PENDING
                {
                    // The server's FIN came ahead of its decision: learn
                    // the decision (one daemon round trip, bounded) before
                    // an empty answer may read as end of stream.
                    W::await_decision(self, false);
                }
                match self.settle() {
                    MODE_TCP => return Look::Done(self.tcp_recv(bufs, peek)),
                    MODE_PENDING => return Look::Done(self.nothing_to_read()),
                    _ => {}
                }
            }
        }
        // An empty ring is the peer's end of stream only if the peer was
        // known gone before we looked: its FIN follows everything it put in
        // the ring, so a FIN seen after the look may have bytes ahead of it.
        if quiet && W::REAPS_COMPLETIONS {
            // As every readiness look does (`ring_readiness`): a completed
            // tail WRITE may owe the peer its doorbell, which must not wait
            // for the end of our spin.
            if let Some(tx) = self.tx.lock().as_mut() {
                if let Err(e) = tx.poll() {
                    self.note_wire_failure(&e);
                }
            }
        }
        let gone_before = self.peer_gone();
        let mut guard = self.rx.lock();
        if self.mode() == MODE_TCP {
            // The peer left while we waited for the lock.
            return self.recv_left(guard, bufs, peek, quiet);
        }
        let shared = match self.enter_shared(None) {
            fork::Entered::Alone => None,
            fork::Entered::Shared(s) => Some(s),
            fork::Entered::Left => return self.recv_left(guard, bufs, peek, quiet),
        };
        let Some(rx) = guard.as_mut() else {
            if let Some(s) = shared {
                self.exit_shared(s, None, None);
            }
            return if quiet {
                Look::Unsure
            } else {
                Look::Done(Err(Errno(libc::EAGAIN)))
            };
        };
        if quiet && matches!(rx.readable(), Ok(false)) {
            // Nothing for the read: the look ends here (the spin's looks
            // are its waiter's delay in seeing the peer's bytes). A failed
            // ring is left to the read, which reports it.
            if let Some(s) = shared {
                self.exit_shared(s, Some(rx.bytes_consumed()), None);
            }
            drop(guard);
            return if gone_before || self.reader_news() {
                Look::Unsure
            } else {
                Look::Empty
            };
        }
        let mut total = 0;
        let mut outcome = None;
        let mut eof = false;
        for b in bufs.iter_mut().filter(|b| !b.is_empty()) {
            let r = if peek { rx.peek(b) } else { rx.read(b) };
            match r {
                Ok(0) => {
                    eof = true;
                    break;
                }
                Ok(n) => {
                    total += n;
                    if n < b.len() || peek {
                        break;
                    }
                }
                Err(RingError::WouldBlock) => break,
                Err(e) => {
                    if total == 0 {
                        outcome = Some(e);
                    }
                    break;
                }
            }
        }
        let mut owe = false;
        if W::REAPS_COMPLETIONS {
            // A head push made while reading completes later: the writer
            // may wait for that space, so its kick must not wait for our
            // next call.
            let _ = rx.poll();
            owe = W::words_pending(rx.transport_mut());
        }
        if let Some(s) = shared {
            self.exit_shared(s, Some(rx.bytes_consumed()), None);
        }
        drop(guard);
        if total > 0 && !peek {
            self.message.note_read();
        }
        if owe {
            self.mark_dirty();
        }
        if total > 0 {
            return Look::Done(Ok(total));
        }
        if eof {
            // The peer's FIN: a reset after it leaves its error to the
            // next send or SO_ERROR, as on TCP.
            return Look::Done(Ok(0));
        }
        match outcome {
            None if quiet => {
                if gone_before || self.reader_news() {
                    Look::Unsure
                } else {
                    Look::Empty
                }
            }
            None => {
                #[cfg(test)]
                seam::after_empty_look();
                if gone_before {
                    return Look::Done(self.nothing_to_read());
                }
                // The kernel socket may hold news the ring does not: the
                // peer's FIN or reset, or its leave header.
                self.check_tcp();
                if self.mode() == MODE_TCP {
                    return Look::Done(self.tcp_recv(bufs, peek));
                }
                if self.peer_gone() {
                    // Gone since we looked (seen here or by another
                    // thread): what it wrote before is in the ring now. The
                    // second look ends at `gone_before`.
                    return self.recv_ring(bufs, peek, false);
                }
                let r = self.nothing_to_read();
                if r == Err(Errno(libc::EAGAIN)) {
                    self.keep_waiters_armed(true);
                }
                Look::Done(r)
            }
            Some(e) => Look::Done(self.recv_failed(&e, bufs, peek)),
        }
    }

    /// `recv_ring` once the connection left the ring under it (the rx lock
    /// `guard` held, no shared operation entered).
    fn recv_left(
        &self,
        guard: OpGuard<'_, RxSlot<W>>,
        bufs: &mut [IoSliceMut<'_>],
        peek: bool,
        quiet: bool,
    ) -> Look {
        drop(guard);
        if quiet {
            return Look::Unsure;
        }
        Look::Done(self.tcp_recv(bufs, peek))
    }

    /// Whether a reader that found the ring empty has something else to
    /// see: the peer gone, a reset, our SHUT_RD, a pending error or a
    /// failed wire (what `ring_readiness` reports beyond the ring's data).
    /// Plain loads.
    #[inline]
    fn reader_news(&self) -> bool {
        self.peer_gone()
            || self.reset.load(Ordering::Acquire)
            || self.rd_shut.load(Ordering::Acquire)
            || self.error.load(Ordering::Acquire) != 0
            || self.wire_failed.load(Ordering::Relaxed)
    }

    /// `recv_ring` when the ring read failed with `e` before any byte.
    fn recv_failed(
        &self,
        e: &RingError,
        bufs: &mut [IoSliceMut<'_>],
        peek: bool,
    ) -> Result<usize, Errno> {
        let errno = self.ring_failed(e, "recv");
        if self.mode() == MODE_TCP {
            return self.tcp_recv(bufs, peek);
        }
        if errno == Errno(libc::EPIPE) {
            // The peer closed: what it sent is read, this is EOF, or its
            // reset where it reset.
            match self.nothing_to_read() {
                Err(Errno(libc::EAGAIN)) => Ok(0),
                r => r,
            }
        } else {
            Err(errno)
        }
    }
}

impl<W: Wire> AttachedConn for RingConn<W> {
    fn try_recv(&self, bufs: &mut [IoSliceMut<'_>], peek: bool) -> Result<usize, Errno> {
        match self.recv_ring(bufs, peek, false) {
            Look::Done(r) => r,
            // Only a quiet look answers these.
            Look::Empty | Look::Unsure => Err(Errno(libc::EAGAIN)),
        }
    }

    fn recv_look(&self, bufs: &mut [IoSliceMut<'_>]) -> Look {
        self.recv_ring(bufs, false, true)
    }

    fn try_send(&self, bufs: &[IoSlice<'_>]) -> Result<usize, Errno> {
        self.lose_wire();
        let mode = self.settle();
        if mode == MODE_TCP {
            return self.tcp_send(bufs);
        }
        if self.wr_shut.load(Ordering::Relaxed) {
            return Err(Errno(libc::EPIPE));
        }
        if self.peer_gone() {
            return self.send_after_peer_gone(bufs);
        }
        if mode == MODE_PENDING {
            if !self.tcp_connected() {
                return Err(Errno(libc::EAGAIN));
            }
            return W::send_pending(self, bufs);
        }
        self.send_into_ring(bufs, usize::MAX, MODE_RING)
    }

    fn flush(&self) {
        background::flush_all();
    }

    fn readiness(&self) -> Ready {
        self.readiness_for(Ready(!0))
    }

    fn readiness_for(&self, interest: Ready) -> Ready {
        match self.settle() {
            MODE_TCP => self.tcp_readiness(),
            _ => self.ring_readiness(interest),
        }
    }

    fn spin_looks(&self) -> u32 {
        self.wire.spin_looks()
    }

    fn arm_waiter(&self, interest: Ready, level: bool) -> Ready {
        self.arm_inner(interest, level)
    }

    fn disarm_waiter(&self, interest: Ready, level: bool) {
        // An edge waiter's set calls `socket_fired` when the socket has
        // news (see `arm_inner` for a side a fork shared).
        let socket = level || self.forked.load(Ordering::Acquire);
        self.disarm_inner(interest, level, true, socket)
    }

    fn disarm_after(&self, interest: Ready, woke: &[libc::pollfd]) {
        let fired = |fd: RawFd| woke.iter().any(|p| p.fd == fd && p.revents != 0);
        let rung = self.wire.bell_fds().into_iter().flatten().any(fired);
        let tcp = self.tcp_fd();
        self.disarm_inner(interest, true, rung, tcp >= 0 && fired(tcp))
    }

    fn watched_socket(&self) -> RawFd {
        self.tcp_fd()
    }

    fn socket_fired(&self) {
        self.check_tcp();
    }

    fn wait_fds(&self, _fd: RawFd, interest: Ready) -> WaitFds {
        let tcp = self.tcp_fd();
        if self.settle() == MODE_TCP {
            return self.tcp_wait_fds(interest);
        }
        let mut out: WaitFds = [None; 3];
        let bells = self.wire.bell_fds().into_iter().flatten();
        let socket = (tcp >= 0).then_some(tcp);
        for (slot, fd) in out.iter_mut().zip(bells.chain(socket)) {
            let events = if fd == tcp {
                libc::POLLIN | libc::POLLRDHUP
            } else {
                libc::POLLIN
            };
            *slot = Some(WaitFd { fd, events });
        }
        out
    }

    fn event_seq(&self) -> u64 {
        let flags = u64::from(self.mode()) << 60 | u64::from(self.peer_gone()) << 62;
        let seq = self.wire.event_seq().unwrap_or_else(|| self.ring_seq());
        seq ^ flags
    }

    fn available(&self) -> usize {
        match self.settle() {
            MODE_TCP => self.tcp_available(),
            _ => self
                .rx
                .lock()
                .as_mut()
                .map_or(0, |rx| rx.available().unwrap_or(0)),
        }
    }

    fn shutdown(&self, _fd: RawFd, how: c_int) -> Result<(), Errno> {
        if !matches!(how, libc::SHUT_RD | libc::SHUT_WR | libc::SHUT_RDWR) {
            return Err(Errno(libc::EINVAL));
        }
        if self.settle() == MODE_TCP {
            return self.tcp_shutdown(how);
        }
        let rd = how != libc::SHUT_WR;
        if rd {
            // Reads return what is (or later arrives) in the ring, then 0
            // where they would wait: the peer may still send, as on TCP.
            self.rd_shut.store(true, Ordering::Release);
        }
        // Both halves are set before a waiter is woken: one woken by
        // SHUT_RDWR sees HUP, as on TCP.
        let wr = how != libc::SHUT_RD && !self.wr_shut.swap(true, Ordering::AcqRel);
        let mut res = Ok(());
        if wr {
            // The kernel socket stays untouched: its FIN would read as the
            // peer process dying. The end-of-stream mark says it instead;
            // a wire without a sender yet carries it on when it gets one.
            let mut tx = self.tx.lock();
            if tx.is_some() && self.mode() != MODE_TCP {
                self.eos_owed.store(true, Ordering::Release);
                self.flush_locked(&mut tx);
            } else if self.mode() == MODE_TCP {
                drop(tx);
                res = self.tcp_shutdown(libc::SHUT_WR);
            }
        }
        if rd || wr {
            self.wire.ring_own_bell();
        }
        res
    }

    fn take_error(&self) -> c_int {
        self.error.swap(0, Ordering::AcqRel)
    }

    fn claim(&self) -> Result<(), Errno> {
        // A side a fork made shared is taken over, or left, by the shared
        // rule (`share`); the wire's own rule is for the rest.
        match self.enter_shared(None) {
            fork::Entered::Shared(s) => s.unlock(),
            fork::Entered::Left => return Ok(()),
            fork::Entered::Alone => W::claim(self)?,
        }
        if self.mode() != MODE_TCP {
            if let Some(me) = self.this() {
                let tracked: Arc<dyn Tracked> = me;
                super::watch::ensure(&tracked);
                background::note_taken_over(tracked);
            }
        }
        Ok(())
    }

    fn drain_at_exit(&self, deadline_ns: u64) {
        // The kernel delivers what a process wrote to a socket it leaves
        // open; an open batch would be lost with the process, and where the
        // wire dies with it (a verbs queue pair) so would requests not yet
        // sent: flush, then wait for the last word write's report. Only the
        // process using the connection flushes (a forked copy of the batch
        // state would send bytes twice). Never a blocking lock: `_exit` may
        // run in a signal handler that interrupted a thread holding it.
        self.count_out();
        if !W::is_user(self) {
            return;
        }
        if self.mode() == MODE_TCP {
            self.push_tx_spill_until(deadline_ns);
            return;
        }
        if self.mode() != MODE_RING {
            return;
        }
        let mut guard = loop {
            match self.tx.try_lock() {
                Some(g) => break g,
                None => {
                    if sys::monotonic_ns() >= deadline_ns {
                        return;
                    }
                    std::thread::yield_now();
                }
            }
        };
        let Some(tx) = guard.as_mut() else {
            return;
        };
        let _ = tx.flush();
        if !W::REAPS_COMPLETIONS {
            return;
        }
        let mut wait = ringsock_ring::sleep::backoff::CompletionWait::new();
        while W::words_pending(tx.transport_mut()) && sys::monotonic_ns() < deadline_ns {
            if tx.poll().is_err() || self.peer_gone() {
                return;
            }
            wait.relax();
        }
    }

    fn release(&self, _fd: RawFd, kind: ReleaseKind) {
        if self.released.swap(true, Ordering::AcqRel) {
            return;
        }
        let mut ends = kind == ReleaseKind::Owner && W::is_user(self);
        if ends && self.initiated && !self.turned_down.load(Ordering::Acquire) {
            let lifetime = sys::monotonic_ns().saturating_sub(self.born_ns);
            super::policy::ring_closed(self.peer, lifetime, self.records_carried());
        }
        let mut shared = None;
        if self.forked.load(Ordering::Acquire) && kind != ReleaseKind::Stale {
            // A side other processes still hold stays open for them, as a
            // socket does until its last descriptor closes; the last holder
            // ends it, whoever used it.
            self.count_out();
            ends = false;
            if self
                .wire
                .share()
                .is_some_and(|s| s.holders.load(Ordering::Acquire) == 0)
            {
                match self.enter_shared(None) {
                    fork::Entered::Shared(s) => {
                        shared = Some(s);
                        ends = true;
                    }
                    fork::Entered::Alone => ends = true,
                    fork::Entered::Left => ends = true,
                }
            }
        }
        if ends && self.mode() == MODE_PENDING {
            W::await_decision(self, true);
        }
        if ends && self.mode() == MODE_TCP {
            // What the ring owed the kernel socket goes out before the
            // program's close (bounded, as a lingering close would).
            let limit = u64::from(crate::config::get().connect_timeout_ms) * 1_000_000;
            self.push_tx_spill_until(sys::monotonic_ns() + limit);
            if self.unread_at_close() {
                self.close_with_reset();
            }
        } else if ends {
            let reset = self.unread_at_close() || self.linger_zero();
            if reset {
                self.close_with_reset();
            }
            // Our reader is closed before the mark goes out: a peer that
            // sees our end of stream and writes finds us closed, as TCP's
            // FIN comes from a socket that takes no more data.
            if let Some(rx) = self.rx.lock().as_mut() {
                let _ = rx.close();
            }
            if let Some(tx) = self.tx.lock().as_mut() {
                if !reset
                    && (!self.wr_shut.swap(true, Ordering::AcqRel)
                        || self.eos_owed.load(Ordering::Acquire))
                {
                    // A full ring leaves no room for the mark: the peer then
                    // sees our kernel socket close, which reads the same.
                    let _ = tx.close();
                    self.eos_owed.store(false, Ordering::Release);
                }
                let _ = tx.flush();
            }
            // The mark and the closed flag must land before the wire goes
            // away with the last reference. A client still pending keeps
            // its early bytes (and the mark, where they wait in the ring)
            // for a server that is merely slow to take the ring.
            self.settle_words();
        }
        if let Some(s) = shared {
            self.exit_shared(s, None, None);
        }
        super::watch::unwatch(self, self.tcp_fd());
        let fd = self.tcp.swap(-1, Ordering::AcqRel);
        if fd >= 0 {
            crate::fdspace::close(fd);
        }
        // Status forgets the connection whichever way its last fd went.
        if let Some(me) = self.this() {
            background::note_closed(me);
        }
    }

    fn leave_ring(&self, hand_over: bool) -> bool {
        self.leave(hand_over);
        if self.mode() != MODE_TCP {
            return false;
        }
        let limit = u64::from(crate::config::get().connect_timeout_ms) * 1_000_000;
        self.push_tx_spill_until(sys::monotonic_ns() + limit);
        lock(&self.tx_spill).is_empty()
    }

    fn fork_prepare(&self) {
        RingConn::fork_prepare(self);
    }

    fn fork_finish(&self) {
        RingConn::fork_finish(self);
    }

    fn set_rcvlowat(&self, bytes: usize) {
        self.rcvlowat.store(bytes.max(1), Ordering::Relaxed);
    }

    fn rcvlowat(&self) -> usize {
        self.rcvlowat.load(Ordering::Relaxed)
    }

    fn tcp_state(&self) -> Option<u8> {
        if self.settle() == MODE_TCP {
            return None;
        }
        let fin = self
            .rx
            .lock()
            .as_mut()
            .is_some_and(|rx| rx.eos_published().unwrap_or(false));
        let ours = self.wr_shut() && !self.eos_owed.load(Ordering::Acquire);
        // On loopback the peer's ACK comes at once: FIN_WAIT1 and LAST_ACK
        // pass before a program can look.
        Some(match (fin, ours) {
            (false, false) => return None,
            (true, false) => tcp_state::CLOSE_WAIT,
            (false, true) => tcp_state::FIN_WAIT2,
            // Both ways shut: an open socket is CLOSE whichever went first
            // (the kernel keeps TIME_WAIT in a separate socket).
            (true, true) => tcp_state::CLOSE,
        })
    }

    fn at_mark(&self) -> Option<bool> {
        match self.mode() {
            MODE_TCP if lock(&self.rx_spill).is_empty() => None,
            _ => Some(false),
        }
    }
}

impl<W: Wire> Drop for RingConn<W> {
    fn drop(&mut self) {
        let fd = *self.tcp.get_mut();
        if fd >= 0 {
            crate::fdspace::close(fd);
        }
        if !self.wire.owns_ends() {
            std::mem::forget(self.tx.get_mut().take());
            std::mem::forget(self.rx.get_mut().take());
        }
    }
}
