//! One ring connection: the `AttachedConn` the hooks dispatch to, generic
//! over the `Wire` that carries it (shared memory or RDMA verbs).
//!
//! Each end keeps a private duplicate of the kernel TCP socket, which
//! stays connected and idle underneath: its EOF or reset is how a side
//! learns that the peer *process* died without closing, and writes after
//! that go to it (CLOSE_WAIT semantics: the first write is accepted, then
//! the peer's reset shows).
//!
//! Modes (the client starts `Pending`, the server `Ring`):
//! * `Pending`: the server has not decided yet. The client may already
//!   send up to `PENDING_CAP` bytes, which wait where the wire keeps them
//!   (`Wire::send_pending`) and reach the server first if it takes the
//!   ring.
//! * `Ring`: everything goes through the rings.
//! * `Tcp`: the server turned the ring down; what was sent while pending
//!   was resent over TCP first, in order (`fall_back`), and every call
//!   goes to the kernel socket from then on.
//!
//! Waiting: `arm` announces a sleeping reader or writer in the ring (the
//! RB2 flags whose orders the loom models check) and counts waiters. The
//! doorbells are drained only by the last level-triggered waiter (ppoll)
//! to leave, under the same lock as arming, so one waiter never swallows
//! the wake-up another is about to sleep on; edge waiters (epoll sets
//! holding arms) never drain, and a drain that leaves them armed on a
//! ready connection rings our own bell again.

mod wire;

use std::io::{IoSlice, IoSliceMut};
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, Weak};

use libc::c_int;
use ringsock_proto::Transport as StatusTransport;
use ringsock_ring::{Receiver, RingError, Sender};

pub use wire::{Waiters, Wire};

use super::background;
use super::msgstart::MessageStart;
use super::sockio::{self, lock, poll_one, ring_errno, send_all_bounded, sys_recv};
use super::tracked::{ReportState, Tracked};
use crate::attached::{AttachedConn, Errno, Ready, ReleaseKind, WaitFd, WaitFds};
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

/// What a handshake hands over to build a connection.
pub struct Parts<W: Wire> {
    pub offer_id: u64,
    pub local: SocketAddr,
    pub peer: SocketAddr,
    pub wire: W,
    /// The ring ends, where they exist yet (a verbs client gets them with
    /// the server's answer).
    pub tx: Option<Sender<W::Transport>>,
    pub rx: Option<Receiver<W::Transport>>,
    /// Our duplicate of the kernel socket.
    pub tcp: RawFd,
    pub pending: bool,
}

pub struct RingConn<W: Wire> {
    pub offer_id: u64,
    pub local: SocketAddr,
    pub peer: SocketAddr,
    pub wire: W,
    /// Lock order: the wire's own locks, then `tx`, then `rx`, then
    /// `waiters` (taken before either end when arming).
    tx: Mutex<Option<Sender<W::Transport>>>,
    rx: Mutex<Option<Receiver<W::Transport>>>,
    /// Our duplicate of the kernel socket; -1 once released.
    tcp: AtomicI32,
    mode: AtomicU8,
    /// The kernel socket saw EOF or a reset: the peer process is gone (or
    /// closed).
    peer_gone: AtomicBool,
    /// Pending SO_ERROR for the program.
    error: AtomicI32,
    /// A write after the peer closed was taken (sockio::send_after_peer_closed).
    closed_write_taken: AtomicBool,
    rd_shut: AtomicBool,
    wr_shut: AtomicBool,
    /// The end-of-stream mark could not be written yet (ring full).
    eos_owed: AtomicBool,
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
        Arc::new_cyclic(|this| RingConn {
            offer_id: p.offer_id,
            local: p.local,
            peer: p.peer,
            wire: p.wire,
            tx: Mutex::new(p.tx),
            rx: Mutex::new(p.rx),
            tcp: AtomicI32::new(p.tcp),
            mode: AtomicU8::new(mode),
            peer_gone: AtomicBool::new(false),
            error: AtomicI32::new(0),
            closed_write_taken: AtomicBool::new(false),
            rd_shut: AtomicBool::new(false),
            wr_shut: AtomicBool::new(false),
            eos_owed: AtomicBool::new(false),
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

    pub fn owe_eos(&self) {
        self.eos_owed.store(true, Ordering::Release);
    }

    /// Marks this side shut for writing without a mark yet (a close while
    /// the wire has no sender: the mark follows the early bytes).
    pub fn set_wr_shut(&self) {
        self.wr_shut.store(true, Ordering::Release);
    }

    pub fn peer_gone(&self) -> bool {
        self.peer_gone.load(Ordering::Acquire)
    }

    /// The locked sender slot (the wire's pending paths and handshake).
    pub fn tx_slot(&self) -> std::sync::MutexGuard<'_, Option<Sender<W::Transport>>> {
        lock(&self.tx)
    }

    /// The locked receiver slot.
    pub fn rx_slot(&self) -> std::sync::MutexGuard<'_, Option<Receiver<W::Transport>>> {
        lock(&self.rx)
    }

    /// Resolves `Pending` where the wire carries the decision itself.
    /// Cheap when already decided.
    pub fn settle(&self) -> u8 {
        let m = self.mode();
        if m != MODE_PENDING {
            return m;
        }
        W::poll_decision(self);
        self.mode()
    }

    /// Pending -> Tcp: takes back what was sent while pending and sends it
    /// over the kernel socket before anything else can be sent there.
    pub fn fall_back(&self, why: &str) {
        let mut tx = lock(&self.tx);
        if self.mode() != MODE_PENDING {
            return;
        }
        let fd = self.tcp_fd();
        let spill = match W::take_early(self, &mut tx) {
            Ok(b) => b,
            Err(e) => {
                log::error!("falling back to TCP: the early bytes are unreadable ({e:?})");
                self.error.store(libc::ECONNRESET, Ordering::Release);
                Vec::new()
            }
        };
        if let Err(Errno(e)) = send_all_bounded(fd, &spill) {
            log::warn!(
                "falling back to TCP: resending {} early bytes failed (errno {e})",
                spill.len()
            );
            self.error.store(e, Ordering::Release);
        }
        if self.wr_shut() {
            // SAFETY: shutdown on our own duplicate of the socket.
            unsafe { libc::syscall(libc::SYS_shutdown, fd, libc::SHUT_WR) };
        }
        self.mode.store(MODE_TCP, Ordering::Release);
        drop(tx);
        log::info!(
            "{} -> {}: plain TCP ({why}); {} early bytes resent",
            self.local,
            self.peer,
            spill.len()
        );
        if let Some(me) = self.this() {
            background::note_fallback(me);
        }
        self.wire.ring_own_bell();
    }

    /// Looks at the kernel socket: EOF or reset means the peer process is
    /// gone; data while pending means the server talks TCP (it turned the
    /// ring down without a word), and on a ring that something is badly
    /// wrong.
    pub fn check_tcp(&self) {
        let fd = self.tcp_fd();
        if fd < 0 || self.peer_gone.load(Ordering::Relaxed) {
            return;
        }
        if poll_one(fd, libc::POLLIN | libc::POLLRDHUP) == 0 {
            return;
        }
        let mut b = [0u8; 1];
        match sys_recv(fd, &mut b, libc::MSG_PEEK) {
            Ok(0) => {
                log::debug!(
                    "{} -> {}: the peer closed its socket",
                    self.local,
                    self.peer
                );
                self.peer_gone.store(true, Ordering::Release);
                self.wire.ring_own_bell();
            }
            Ok(_) => match self.mode() {
                MODE_PENDING => self.fall_back("the server answered over TCP"),
                MODE_RING => {
                    log::error!(
                        "{} -> {}: unexpected TCP data on a ring connection; resetting it",
                        self.local,
                        self.peer
                    );
                    self.fail_hard(libc::ECONNRESET);
                }
                _ => {}
            },
            Err(Errno(libc::EAGAIN)) => {}
            Err(Errno(e)) => {
                self.error.store(e, Ordering::Release);
                self.peer_gone.store(true, Ordering::Release);
            }
        }
    }

    /// The connection cannot go on: the program gets `errno`, and the peer
    /// hears our kernel socket shut down (its ring layer reads that as this
    /// end gone: EOF after what it received, EPIPE on send), so it does not
    /// sleep forever on a ring nobody writes.
    pub fn fail_hard(&self, errno: c_int) {
        self.error.store(errno, Ordering::Release);
        if !self.peer_gone.swap(true, Ordering::AcqRel) {
            self.rd_shut.store(true, Ordering::Release);
            let fd = self.tcp_fd();
            if fd >= 0 {
                // SAFETY: shutdown on our own duplicate of the socket.
                unsafe { libc::syscall(libc::SYS_shutdown, fd, libc::SHUT_RDWR) };
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
        let errno = match e {
            RingError::Config(m) => {
                log::error!(
                    "{what} on {} -> {}: {m}; the connection is reset",
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
        let mut wait = ringsock_ring::backoff::CompletionWait::new();
        loop {
            let tx_owes = lock(&self.tx)
                .as_mut()
                .is_some_and(|tx| W::words_pending(tx.transport_mut()) && tx.poll().is_ok());
            let rx_owes = lock(&self.rx)
                .as_mut()
                .is_some_and(|rx| W::words_pending(rx.transport_mut()) && rx.poll().is_ok());
            if !tx_owes && !rx_owes {
                return;
            }
            spins += 1;
            if spins.is_multiple_of(64) {
                self.check_tcp();
                if self.peer_gone() || sys::monotonic_ns() - start > SETTLE_LIMIT_NS {
                    self.mark_dirty();
                    return;
                }
            }
            wait.relax();
        }
    }

    /// Pushes batched bytes out (and a deferred end-of-stream mark).
    fn flush_now(&self) {
        let mut tx = lock(&self.tx);
        self.flush_locked(&mut tx);
    }

    /// Background variant: skips a connection another thread is using (it
    /// flushes by itself before it blocks). Returns false if skipped.
    fn try_flush(&self) -> bool {
        let Ok(mut tx) = self.tx.try_lock() else {
            return false;
        };
        self.flush_locked(&mut tx);
        drop(tx);
        if W::REAPS_COMPLETIONS {
            // A head push the receiver made (a word write) owes the peer a
            // kick if it waits for space: poll it here too.
            if let Ok(mut rx) = self.rx.try_lock() {
                if let Some(rx) = rx.as_mut() {
                    let _ = rx.poll();
                    if W::words_pending(rx.transport_mut()) {
                        self.mark_dirty();
                    }
                }
            } else {
                self.mark_dirty();
            }
        }
        true
    }

    /// Flushes with the sender locked; pays a deferred end-of-stream mark.
    pub fn flush_locked(&self, tx: &mut Option<Sender<W::Transport>>) {
        self.dirty.store(false, Ordering::Release);
        let Some(tx) = tx.as_mut() else {
            return;
        };
        if let Err(e) = tx.flush() {
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
        let fd = self.tcp_fd();
        fd >= 0 && poll_one(fd, libc::POLLOUT) & libc::POLLOUT != 0
    }

    fn tcp_readiness(&self) -> Ready {
        sockio::tcp_readiness(self.tcp_fd(), self.error.load(Ordering::Acquire))
    }

    fn tcp_recv(&self, bufs: &mut [IoSliceMut<'_>], peek: bool) -> Result<usize, Errno> {
        sockio::recv_then_error(self.tcp_fd(), &self.error, bufs, peek)
    }

    fn tcp_send(&self, bufs: &[IoSlice<'_>]) -> Result<usize, Errno> {
        sockio::send_vec(self.tcp_fd(), bufs)
    }

    /// A read that found nothing: EOF (or the pending error) once the peer
    /// is gone, else EAGAIN.
    fn nothing_to_read(&self) -> Result<usize, Errno> {
        if self.peer_gone() {
            let e = self.error.swap(0, Ordering::AcqRel);
            return if e != 0 { Err(Errno(e)) } else { Ok(0) };
        }
        Err(Errno(libc::EAGAIN))
    }

    /// Writes up to `budget` bytes of `bufs` into the ring, seen in mode
    /// `seen` (Pending or Ring); a call that finds the mode changed under
    /// the sender's lock starts over (a fall-back moves the early bytes
    /// while it holds that lock).
    pub fn send_into_ring(
        &self,
        bufs: &[IoSlice<'_>],
        budget: usize,
        seen: u8,
    ) -> Result<usize, Errno> {
        let mut guard = lock(&self.tx);
        if self.mode() != seen {
            drop(guard);
            return self.try_send(bufs);
        }
        let Some(tx) = guard.as_mut() else {
            return Err(Errno(libc::EAGAIN));
        };
        let first = self.message.starts_message();
        if first {
            tx.end_stream();
        }
        let mut total = 0;
        let mut failed = None;
        for b in bufs.iter().filter(|b| !b.is_empty()) {
            let chunk = &b[..b.len().min(budget - total)];
            match W::write(tx, chunk) {
                Ok(n) => {
                    total += n;
                    if n < b.len() || total == budget {
                        break;
                    }
                }
                Err(RingError::WouldBlock) => break,
                Err(e) => {
                    if total == 0 {
                        failed = Some(e);
                    }
                    break;
                }
            }
        }
        if first {
            // A message goes out now (`msgstart`); flush_locked queues what
            // it cannot finish.
            self.flush_locked(&mut guard);
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
                // EPIPE at once failed iperf3's cookie write to a server
                // that answered "busy" and closed.
                return sockio::send_after_peer_closed(&self.closed_write_taken, bufs);
            }
            let errno = self.ring_failed(&e, "send");
            if errno == Errno(libc::EPIPE) && self.peer_gone() {
                return self.tcp_send(bufs);
            }
            return Err(errno);
        }
        if total == 0 {
            return Err(Errno(libc::EAGAIN));
        }
        Ok(total)
    }

    fn ring_readiness(&self) -> Ready {
        let mut r = Ready::NONE;
        let gone = self.peer_gone();
        {
            let mut rx = lock(&self.rx);
            let readable = rx.as_mut().map(|rx| rx.readable());
            let data = matches!(readable, Some(Ok(true)) | Some(Err(_)));
            if self.rd_shut.load(Ordering::Relaxed) || gone || data {
                r = r | Ready::READ;
            }
            if rx.as_ref().is_some_and(|rx| rx.at_eof()) || gone {
                r = r | Ready::RDHUP;
            }
        }
        if self.mode() == MODE_PENDING {
            if W::pending_room(self) > 0 && self.tcp_connected() {
                r = r | Ready::WRITE;
            }
        } else {
            let writable = match lock(&self.tx).as_mut() {
                Some(tx) => {
                    // Reaping on every look, whatever the interest: a tail
                    // WRITE that completed may owe the peer its doorbell
                    // (it began to sleep after the WRITE was posted), and
                    // left to this end's own arming the doorbell would
                    // wait out our spin while the peer oversleeps.
                    if W::REAPS_COMPLETIONS {
                        let _ = tx.poll();
                    }
                    !matches!(tx.writable(), Ok(false))
                }
                None => true,
            };
            if gone || self.wr_shut.load(Ordering::Relaxed) || writable {
                r = r | Ready::WRITE;
            }
        }
        if self.error.load(Ordering::Acquire) != 0 {
            r = r | Ready::ERR;
        }
        if gone && (self.wr_shut.load(Ordering::Relaxed) || self.error.load(Ordering::Acquire) != 0)
        {
            r = r | Ready::HUP;
        }
        r
    }

    fn arm_inner(&self, interest: Ready, level: bool) -> Ready {
        if !level {
            // An epoll set watches the kernel socket edge-triggered: if its
            // EOF or reset fired while this registration was not armed,
            // that edge is spent and will not come again, so look now, as
            // the ring side's re-check does after prepare_wait. (Level
            // waiters ppoll the socket itself.)
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
        // say.
        if interest.intersects(Ready::READ | Ready::RDHUP) {
            w.rx += 1;
            if let Some(rx) = lock(&self.rx).as_mut() {
                let _ = rx.prepare_wait();
            }
        }
        if interest.intersects(Ready::WRITE) {
            w.tx += 1;
            if let Some(tx) = lock(&self.tx).as_mut() {
                let _ = tx.prepare_wait();
            }
        }
        drop(w);
        self.settle_words();
        self.readiness()
    }

    fn disarm_inner(&self, interest: Ready, level: bool) {
        {
            let mut w = lock(&self.waiters);
            if level {
                w.level = w.level.saturating_sub(1);
            }
            if self.mode() != MODE_TCP {
                if interest.intersects(Ready::READ | Ready::RDHUP) && w.rx > 0 {
                    w.rx -= 1;
                    if w.rx == 0 {
                        if let Some(rx) = lock(&self.rx).as_mut() {
                            let _ = rx.finish_wait(true);
                        }
                    }
                }
                if interest.intersects(Ready::WRITE) && w.tx > 0 {
                    w.tx -= 1;
                    if w.tx == 0 {
                        if let Some(tx) = lock(&self.tx).as_mut() {
                            let _ = tx.finish_wait(true);
                        }
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
            if level && w.level == 0 && self.wire.drain_bells() && w.any_armed() {
                let r = self.readiness();
                let rx_ready =
                    w.rx > 0 && r.intersects(Ready::READ | Ready::RDHUP | Ready::HUP | Ready::ERR);
                let tx_ready = w.tx > 0 && r.intersects(Ready::WRITE | Ready::HUP | Ready::ERR);
                if rx_ready || tx_ready {
                    self.wire.ring_own_bell();
                }
            }
        }
        self.check_tcp();
        self.settle();
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

    fn flush_ring(&self) {
        self.flush_now();
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

impl<W: Wire> AttachedConn for RingConn<W> {
    fn try_recv(&self, bufs: &mut [IoSliceMut<'_>], peek: bool) -> Result<usize, Errno> {
        match self.settle() {
            MODE_TCP => return self.tcp_recv(bufs, peek),
            MODE_PENDING => {
                // Nothing can be in our ring before the server decided; TCP
                // data would mean it declined without telling us.
                self.check_tcp();
                match self.settle() {
                    MODE_TCP => return self.tcp_recv(bufs, peek),
                    MODE_PENDING => return self.nothing_to_read(),
                    _ => {}
                }
            }
            _ => {}
        }
        if self.rd_shut.load(Ordering::Relaxed) {
            let e = self.error.swap(0, Ordering::AcqRel);
            return if e != 0 { Err(Errno(e)) } else { Ok(0) };
        }
        let mut guard = lock(&self.rx);
        let Some(rx) = guard.as_mut() else {
            return Err(Errno(libc::EAGAIN));
        };
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
        drop(guard);
        if total > 0 && !peek {
            self.message.note_read();
        }
        if owe {
            self.mark_dirty();
        }
        if total > 0 || eof {
            return Ok(total);
        }
        match outcome {
            None => self.nothing_to_read(),
            Some(e) => {
                let errno = self.ring_failed(&e, "recv");
                if errno == Errno(libc::EPIPE) {
                    // The peer closed: what it sent is read, this is EOF.
                    Ok(0)
                } else {
                    Err(errno)
                }
            }
        }
    }

    fn try_send(&self, bufs: &[IoSlice<'_>]) -> Result<usize, Errno> {
        let mode = self.settle();
        if mode == MODE_TCP {
            return self.tcp_send(bufs);
        }
        if self.wr_shut.load(Ordering::Relaxed) {
            return Err(Errno(libc::EPIPE));
        }
        if self.peer_gone() {
            // The peer process closed its socket or died: send on the
            // kernel socket (now in CLOSE_WAIT), so the program sees what
            // kernel TCP would show it: the first write accepted, the
            // peer's reset, then ECONNRESET/EPIPE. Failing the first write
            // at once is not the same: redis-benchmark retries a failed
            // write forever when its write handler meets it.
            return self.tcp_send(bufs);
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
        match self.settle() {
            MODE_TCP => self.tcp_readiness(),
            _ => self.ring_readiness(),
        }
    }

    fn spin_looks(&self) -> u32 {
        self.wire.spin_looks()
    }

    fn arm_waiter(&self, interest: Ready, level: bool) -> Ready {
        self.arm_inner(interest, level)
    }

    fn disarm_waiter(&self, interest: Ready, level: bool) {
        self.disarm_inner(interest, level)
    }

    fn wait_fds(&self, _fd: RawFd, interest: Ready) -> WaitFds {
        let tcp = self.tcp_fd();
        if self.settle() == MODE_TCP {
            return sockio::tcp_wait_fds(tcp, interest);
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
        self.wire.event_seq().map_or(0, |seq| seq ^ flags)
    }

    fn available(&self) -> usize {
        match self.settle() {
            MODE_TCP => sockio::fionread(self.tcp_fd()),
            _ => lock(&self.rx)
                .as_mut()
                .map_or(0, |rx| rx.available().unwrap_or(0)),
        }
    }

    fn shutdown(&self, _fd: RawFd, how: c_int) -> Result<(), Errno> {
        if !matches!(how, libc::SHUT_RD | libc::SHUT_WR | libc::SHUT_RDWR) {
            return Err(Errno(libc::EINVAL));
        }
        if self.settle() == MODE_TCP {
            // SAFETY: shutdown on our duplicate of the socket.
            let r = unsafe { libc::syscall(libc::SYS_shutdown, self.tcp_fd(), how) };
            return if r < 0 {
                Err(Errno(sys::errno()))
            } else {
                Ok(())
            };
        }
        if how != libc::SHUT_WR {
            self.rd_shut.store(true, Ordering::Release);
        }
        if how != libc::SHUT_RD && !self.wr_shut.swap(true, Ordering::AcqRel) {
            // The kernel socket stays untouched: its FIN would read as the
            // peer process dying. The end-of-stream mark says it instead;
            // a wire without a sender yet carries it on when it gets one.
            let mut tx = lock(&self.tx);
            if tx.is_some() {
                self.eos_owed.store(true, Ordering::Release);
                self.flush_locked(&mut tx);
            }
        }
        Ok(())
    }

    fn take_error(&self) -> c_int {
        self.error.swap(0, Ordering::AcqRel)
    }

    fn claim(&self) -> Result<(), Errno> {
        W::claim(self)
    }

    fn drain_at_exit(&self, deadline_ns: u64) {
        // The kernel delivers what a process wrote to a socket it leaves
        // open; an open batch would be lost with the process, and where the
        // wire dies with it (a verbs queue pair) so would requests not yet
        // sent: flush, then wait for the last word write's report. Only the
        // process using the connection flushes (a forked copy of the batch
        // state would send bytes twice). Never a blocking lock: `_exit` may
        // run in a signal handler that interrupted a thread holding it.
        if !W::is_user(self) || self.mode() != MODE_RING {
            return;
        }
        let mut guard = loop {
            match self.tx.try_lock() {
                Ok(g) => break g,
                Err(std::sync::TryLockError::Poisoned(p)) => break p.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => {
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
        let mut wait = ringsock_ring::backoff::CompletionWait::new();
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
        let ends = kind == ReleaseKind::Owner && W::is_user(self);
        if ends && self.mode() == MODE_PENDING {
            W::await_decision(self);
        }
        if ends && self.mode() != MODE_TCP {
            if let Some(tx) = lock(&self.tx).as_mut() {
                if !self.wr_shut.swap(true, Ordering::AcqRel)
                    || self.eos_owed.load(Ordering::Acquire)
                {
                    // A full ring leaves no room for the mark: the peer then
                    // sees our kernel socket close, which reads the same.
                    let _ = tx.close();
                    self.eos_owed.store(false, Ordering::Release);
                }
                let _ = tx.flush();
            }
            if let Some(rx) = lock(&self.rx).as_mut() {
                let _ = rx.close();
            }
            // The mark and the closed flag must land before the wire goes
            // away with the last reference. A client still pending keeps
            // its early bytes (and the mark, where they wait in the ring)
            // for a server that is merely slow to take the ring.
            self.settle_words();
        }
        let fd = self.tcp.swap(-1, Ordering::AcqRel);
        if fd >= 0 {
            sys::close(fd);
        }
        if kind != ReleaseKind::Stale {
            if let Some(me) = self.this() {
                background::note_closed(me);
            }
        }
    }
}

impl<W: Wire> Drop for RingConn<W> {
    fn drop(&mut self) {
        let fd = *self.tcp.get_mut();
        if fd >= 0 {
            sys::close(fd);
        }
        if !self.wire.owns_ends() {
            std::mem::forget(self.tx.get_mut().unwrap_or_else(|p| p.into_inner()).take());
            std::mem::forget(self.rx.get_mut().unwrap_or_else(|p| p.into_inner()).take());
        }
    }
}
