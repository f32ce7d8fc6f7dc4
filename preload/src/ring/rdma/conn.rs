//! One connection between hosts over RDMA verbs: the `AttachedConn` the
//! hooks dispatch to (the ring crate's verbs transport: one RC queue pair, this
//! end's two ring copies in one registered region).
//!
//! The kernel TCP socket stays connected and idle underneath, as on shared
//! memory: its EOF or reset is how a side learns that the peer process
//! died without closing, and writes after that go to it (CLOSE_WAIT
//! semantics, see ring/conn.rs).
//!
//! Modes (the client starts `Pending`, the server starts `Ring`):
//! * `Pending`: the client's queue pair cannot be connected before the
//!   server's answer (its QPN, PSN, rkey and ring addresses) arrives
//!   through the two ctl daemons. Meanwhile the program's bytes (up to
//!   `PENDING_CAP`) wait in `early`; the background thread asks the daemon
//!   every tick (`urgent_follow_up`), connects on the answer and writes
//!   them into the ring first, or sends them over TCP on a decline.
//! * `Ring`: everything goes through the rings.
//! * `Tcp`: the server turned the ring down; every call goes to the kernel
//!   socket.
//!
//! Waiting: `arm` publishes the RB2 sleeping flags (on verbs a WRITE into
//! the peer's copy, complete before the re-check: see the ring crate's verbs
//! module for why no wake-up is lost) and then polls both ends until no
//! control-word write is unreported (`settle_words`), so every kick owed
//! to a sleeping peer is sent before this thread sleeps. Three wait fds:
//! the doorbell (completion channel; the peer's solicited WRITE_WITH_IMM
//! makes it readable), our own eventfd (`wake`: the end of the handshake,
//! a decline, re-rings for edge waiters) and the kernel socket.
//!
//! Fork: the verbs objects belong to the process that created them. A
//! child that inherited the connection cannot use it (`claim` fails with
//! EBADFD and a log line) and never destroys it (Drop forgets the verbs
//! parts there: destroying them would destroy the parent's queue pair).

use std::io::{IoSlice, IoSliceMut};
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use libc::c_int;
use ringsock_proto::Transport;
use ringsock_ring::transport::verbs::{Connected, Doorbell, QpParams, VerbsConn, VerbsTransport};
use ringsock_ring::{EventFd, Notify, Receiver, RingError, Sender, VerbsError};

use super::super::background;
use super::super::conn::PENDING_CAP;
use super::super::msgstart::MessageStart;
use super::super::sockio::{self, lock, poll_one, ring_errno, send_all_bounded, sys_recv};
use super::super::tracked::{ReportState, Tracked};
use super::PREFIX;
use crate::attached::{AttachedConn, Errno, Ready, ReleaseKind, WaitFd, WaitFds};
use crate::{process, sys};

/// Longest a thread spins for its control-word writes to be acknowledged
/// (a round trip; far longer only when the peer is unreachable).
const SETTLE_LIMIT_NS: u64 = 200_000_000;

const MODE_PENDING: u8 = 0;
const MODE_RING: u8 = 1;
const MODE_TCP: u8 = 2;

#[derive(Default)]
struct Waiters {
    /// Waiters sleeping in a level-triggered poll on our wait fds.
    level: u32,
    /// Outstanding arms per direction (level and edge waiters).
    rx: u32,
    tx: u32,
}

/// What the handshake hands over to build a connection.
pub struct Parts {
    pub offer_id: u64,
    pub local: SocketAddr,
    pub peer: SocketAddr,
    /// "rxe0 port 1 gid 1": the status line's reason column.
    pub device: String,
    /// A client's end before the answer; `None` for a server.
    pub unconnected: Option<VerbsConn>,
    /// A server's end, connected.
    pub connected: Option<Connected>,
    pub bell_fd: RawFd,
    pub wake: EventFd,
    pub tcp: RawFd,
}

pub struct RdmaConn {
    offer_id: u64,
    local: SocketAddr,
    peer: SocketAddr,
    device: String,
    /// The process whose verbs objects these are.
    owner_pid: i32,
    /// Lock order: `early`, then `unconnected`, `tx`, `rx`.
    early: Mutex<Vec<u8>>,
    unconnected: Mutex<Option<VerbsConn>>,
    tx: Mutex<Option<Sender<VerbsTransport>>>,
    rx: Mutex<Option<Receiver<VerbsTransport>>>,
    bell: OnceLock<Doorbell>,
    bell_fd: RawFd,
    wake: EventFd,
    /// Our duplicate of the kernel socket; -1 once released.
    tcp: AtomicI32,
    mode: AtomicU8,
    /// Kernel socket saw EOF/reset: the peer process is gone (or closed).
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
    report: ReportState,
    this: Weak<RdmaConn>,
}

impl RdmaConn {
    pub fn new(p: Parts) -> Arc<RdmaConn> {
        let mode = if p.connected.is_some() {
            MODE_RING
        } else {
            MODE_PENDING
        };
        let (tx, rx, bell) = match p.connected {
            Some(c) => (Some(c.tx), Some(c.rx), OnceLock::from(c.bell)),
            None => (None, None, OnceLock::new()),
        };
        Arc::new_cyclic(|this| RdmaConn {
            offer_id: p.offer_id,
            local: p.local,
            peer: p.peer,
            device: p.device,
            owner_pid: process::pid(),
            early: Mutex::new(Vec::new()),
            unconnected: Mutex::new(p.unconnected),
            tx: Mutex::new(tx),
            rx: Mutex::new(rx),
            bell,
            bell_fd: p.bell_fd,
            wake: p.wake,
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

    fn tcp_fd(&self) -> RawFd {
        self.tcp.load(Ordering::Acquire)
    }

    fn mode(&self) -> u8 {
        self.mode.load(Ordering::Acquire)
    }

    /// The most bytes a client keeps before the answer: what fits in the
    /// ring at once (so they all go in before anything else), at most
    /// PENDING_CAP (what a decline makes us resend over TCP).
    fn early_cap(&self) -> usize {
        PENDING_CAP
    }

    /// Pending -> Ring with the server's parameters, or a dead connection
    /// if they cannot be used (the server already uses its ring: TCP is
    /// no way back for it either).
    fn connect_to(&self, payload: &[u8]) {
        let mut early = lock(&self.early);
        if self.mode() != MODE_PENDING {
            return;
        }
        let params = payload
            .strip_prefix(PREFIX)
            .ok_or(RingError::Verbs(VerbsError::Params(
                "the answer is not a verbs answer",
            )))
            .and_then(QpParams::decode);
        let vc = lock(&self.unconnected).take();
        let connected = match (vc, params) {
            (Some(vc), Ok(p)) => vc.connect(&p),
            (None, _) => Err(RingError::Closed),
            (_, Err(e)) => Err(e),
        };
        match connected {
            Ok(c) => {
                log::debug!(
                    "{} -> {}: queue pair connected, {} early bytes go first",
                    self.local,
                    self.peer,
                    early.len()
                );
                let _ = self.bell.set(c.bell);
                let mut tx = c.tx;
                let mut rest: &[u8] = &early;
                let mut failed = None;
                while !rest.is_empty() {
                    match tx.write(rest) {
                        Ok(n) => rest = &rest[n..],
                        Err(e) => {
                            failed = Some(e);
                            break;
                        }
                    }
                }
                if failed.is_none() && self.wr_shut.load(Ordering::Acquire) {
                    // Closed while pending: the mark follows the bytes.
                    if tx.close().is_err() {
                        self.eos_owed.store(true, Ordering::Release);
                    }
                }
                let _ = tx.flush();
                *lock(&self.tx) = Some(tx);
                *lock(&self.rx) = Some(c.rx);
                early.clear();
                self.mode.store(MODE_RING, Ordering::Release);
                if let Some(e) = failed {
                    self.ring_failed(&e, "connect");
                }
                self.mark_dirty();
            }
            Err(e) => {
                log::error!(
                    "{} -> {}: cannot connect to the server's queue pair ({e}); the connection is reset",
                    self.local,
                    self.peer
                );
                self.mode.store(MODE_RING, Ordering::Release);
                self.fail_hard(libc::ECONNRESET);
            }
        }
        drop(early);
        let _ = self.wake.notify();
    }

    /// Pending -> Tcp: the early bytes go over the kernel socket before
    /// anything else can.
    fn fall_back(&self, why: &str) {
        let early = lock(&self.early);
        if self.mode() != MODE_PENDING {
            return;
        }
        let fd = self.tcp_fd();
        if let Err(Errno(e)) = send_all_bounded(fd, &early) {
            log::warn!(
                "falling back to TCP: resending {} early bytes failed (errno {e})",
                early.len()
            );
            self.error.store(e, Ordering::Release);
        }
        if self.wr_shut.load(Ordering::Acquire) {
            // SAFETY: shutdown on our own duplicate of the socket.
            unsafe { libc::syscall(libc::SYS_shutdown, fd, libc::SHUT_WR) };
        }
        self.mode.store(MODE_TCP, Ordering::Release);
        let sent = early.len();
        drop(early);
        lock(&self.unconnected).take();
        log::info!(
            "{} -> {}: plain TCP ({why}); {sent} early bytes resent",
            self.local,
            self.peer
        );
        if let Some(me) = self.this.upgrade() {
            background::note_fallback(me);
        }
        let _ = self.wake.notify();
    }

    /// Closing while the server has not answered: the early bytes must
    /// reach it either way, so ask the daemon ourselves, a bounded time.
    fn await_decision(&self) {
        let limit = u64::from(crate::config::get().connect_timeout_ms) * 1_000_000;
        let start = sys::monotonic_ns();
        while self.mode() == MODE_PENDING {
            match super::collect(self.offer_id) {
                super::Collected::Answer(p) => self.connect_to(&p),
                super::Collected::Refused(reason) => self.decline_from_ctl(reason.as_deref()),
                super::Collected::Pending => {}
            }
            if self.mode() != MODE_PENDING || sys::monotonic_ns() - start >= limit {
                break;
            }
            self.check_tcp();
            // SAFETY: plain sleep of 1 ms.
            unsafe {
                libc::syscall(
                    libc::SYS_nanosleep,
                    &libc::timespec {
                        tv_sec: 0,
                        tv_nsec: 1_000_000,
                    } as *const libc::timespec,
                    std::ptr::null_mut::<libc::timespec>(),
                )
            };
        }
        if self.mode() == MODE_PENDING {
            log::warn!(
                "{} -> {}: closed before the server answered; {} early bytes are dropped",
                self.local,
                self.peer,
                lock(&self.early).len()
            );
        }
    }

    /// Looks at the kernel socket: EOF or reset means the peer process is
    /// gone; data means the server talks TCP (it turned the ring down
    /// without a word) or, on a ring, that something is badly wrong.
    fn check_tcp(&self) {
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
                let _ = self.wake.notify();
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

    /// The connection cannot go on: the program gets `errno`, the peer
    /// hears our kernel socket shut down (EOF/EPIPE on its side).
    fn fail_hard(&self, errno: c_int) {
        self.error.store(errno, Ordering::Release);
        if !self.peer_gone.swap(true, Ordering::AcqRel) {
            self.rd_shut.store(true, Ordering::Release);
            let fd = self.tcp_fd();
            if fd >= 0 {
                // SAFETY: shutdown on our own duplicate of the socket.
                unsafe { libc::syscall(libc::SYS_shutdown, fd, libc::SHUT_RDWR) };
            }
        }
        let _ = self.wake.notify();
    }

    /// The errno for a failed ring call. A verbs failure (a completion in
    /// error, a queue pair the peer destroyed) after the peer process
    /// closed its socket is that close, seen from the ring: the caller
    /// then behaves as after the peer's EOF. Anything else ends the
    /// connection.
    fn ring_failed(&self, e: &RingError, what: &str) -> Errno {
        match e {
            RingError::WouldBlock => return Errno(libc::EAGAIN),
            RingError::PeerClosed | RingError::Closed => return Errno(libc::EPIPE),
            _ => {}
        }
        self.check_tcp();
        if self.peer_gone.load(Ordering::Acquire) {
            log::debug!(
                "{what} on {} -> {}: {e} after the peer closed",
                self.local,
                self.peer
            );
            return Errno(libc::EPIPE);
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
        self.fail_hard(errno.0);
        errno
    }

    /// Polls both ends until no control-word write is unreported: every
    /// tail and head this process published has landed and the matching
    /// sleeping-flag check ran (the ring crate's verbs module, "What verbs need").
    /// Bounded: a peer whose queue pair is gone never acknowledges, and
    /// its death shows on the kernel socket; what is still owed then is
    /// left to the background thread (the connection stays queued).
    fn settle_words(&self) {
        let start = sys::monotonic_ns();
        let mut spins = 0u32;
        let mut wait = ringsock_ring::sleep::backoff::CompletionWait::new();
        loop {
            let mut owed = false;
            for end in [true, false] {
                let busy = if end {
                    lock(&self.tx)
                        .as_mut()
                        .is_some_and(|tx| tx.transport_mut().words_pending() && tx.poll().is_ok())
                } else {
                    lock(&self.rx)
                        .as_mut()
                        .is_some_and(|rx| rx.transport_mut().words_pending() && rx.poll().is_ok())
                };
                owed |= busy;
            }
            if !owed {
                return;
            }
            spins += 1;
            if spins.is_multiple_of(64) {
                self.check_tcp();
                if self.peer_gone.load(Ordering::Acquire)
                    || sys::monotonic_ns() - start > SETTLE_LIMIT_NS
                {
                    self.mark_dirty();
                    return;
                }
            }
            wait.relax();
        }
    }

    fn flush_now(&self) {
        let mut tx = lock(&self.tx);
        self.flush_locked(&mut tx);
    }

    fn try_flush(&self) -> bool {
        let Ok(mut tx) = self.tx.try_lock() else {
            return false;
        };
        self.flush_locked(&mut tx);
        drop(tx);
        // A head push the receiver made (a word write) owes the peer a
        // kick if it waits for space: poll it here too.
        if let Ok(mut rx) = self.rx.try_lock() {
            if let Some(rx) = rx.as_mut() {
                let _ = rx.poll();
                if rx.transport_mut().words_pending() {
                    self.mark_dirty();
                }
            }
        } else {
            self.mark_dirty();
        }
        true
    }

    fn flush_locked(&self, tx: &mut Option<Sender<VerbsTransport>>) {
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
        // The tail WRITE completes later: until it is reported, the check
        // for a sleeping peer has not run, so keep polling from here.
        let _ = tx.poll();
        if tx.has_unflushed()
            || self.eos_owed.load(Ordering::Acquire)
            || tx.transport_mut().words_pending()
        {
            self.mark_dirty();
        }
    }

    fn mark_dirty(&self) {
        if !self.dirty.swap(true, Ordering::AcqRel) {
            if let Some(me) = self.this.upgrade() {
                background::queue_flush(me);
            }
        }
    }

    /// While pending: whether the kernel connect completed (a program
    /// waiting for POLLOUT after a non-blocking connect must not be told
    /// "writable" before the kernel would).
    fn tcp_connected(&self) -> bool {
        let fd = self.tcp_fd();
        fd >= 0 && poll_one(fd, libc::POLLOUT) & libc::POLLOUT != 0
    }

    fn ring_readiness(&self) -> Ready {
        let mut r = Ready::NONE;
        let gone = self.peer_gone.load(Ordering::Acquire);
        let pending = self.mode() == MODE_PENDING;
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
        if pending {
            if lock(&self.early).len() < self.early_cap() && self.tcp_connected() {
                r = r | Ready::WRITE;
            }
        } else {
            let writable = match lock(&self.tx).as_mut() {
                Some(tx) => {
                    // Reap our send completions on every look, whatever
                    // the interest: a tail WRITE that completed may owe
                    // the peer its doorbell (it began to sleep after the
                    // WRITE was posted; `Sender::poll` rings it). Left to
                    // this end's own arming, the doorbell waited out our
                    // spin, the peer overslept, and a ping-pong's ends
                    // took turns sleeping (the ring library polls both
                    // queues in its spin). Alone, this took 64 B round
                    // trips under Soft-RoCE from 483-745 µs to 205-683.
                    let _ = tx.poll();
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

    fn tcp_recv(&self, bufs: &mut [IoSliceMut<'_>], peek: bool) -> Result<usize, Errno> {
        sockio::recv_then_error(self.tcp_fd(), &self.error, bufs, peek)
    }

    fn drain_bells(&self) -> bool {
        let rung = self.bell.get().is_some_and(|b| b.drain().unwrap_or(true));
        self.wake.drain() | rung
    }

    fn arm_inner(&self, interest: Ready, level: bool) -> Ready {
        if !level {
            // As on shm: an edge-triggered set may have spent the kernel
            // socket's EOF edge while this registration was not armed.
            self.check_tcp();
        }
        if self.mode() == MODE_TCP {
            if level {
                lock(&self.waiters).level += 1;
            }
            return sockio::tcp_readiness(self.tcp_fd(), self.error.load(Ordering::Acquire));
        }
        let mut w = lock(&self.waiters);
        // Unlike an eventfd, the completion channel raises a new event only
        // once it is re-armed, and every ring consumes a posted receive
        // (with none left the peer's queue pair stalls on RNR retries, its
        // later WRITEs behind it): so every waiter, level or edge, drains
        // and re-arms before it sleeps. The re-check below sees what the
        // drained rings announced; another waiter that may have been woken
        // by them is rung again through `wake`.
        if self.drain_bells() && (w.level > 0 || w.rx > 0 || w.tx > 0) {
            let _ = self.wake.notify();
        }
        if level {
            w.level += 1;
        }
        // Counts depend on `interest` alone, so that `disarm` undoes
        // exactly what this did even if the mode changed meanwhile. While
        // pending there is no ring to publish a flag in: the end of the
        // handshake rings `wake`.
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
            // Only the last level-triggered waiter drains (ring/conn.rs
            // says why); edge arms left on a ready connection get their
            // ring back through `wake`.
            if level && w.level == 0 && self.drain_bells() && (w.rx > 0 || w.tx > 0) {
                let r = self.readiness();
                let rx_ready =
                    w.rx > 0 && r.intersects(Ready::READ | Ready::RDHUP | Ready::HUP | Ready::ERR);
                let tx_ready = w.tx > 0 && r.intersects(Ready::WRITE | Ready::HUP | Ready::ERR);
                if rx_ready || tx_ready {
                    let _ = self.wake.notify();
                }
            }
        }
        self.check_tcp();
    }
}

impl Tracked for RdmaConn {
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

    fn transport(&self) -> Transport {
        if self.mode() == MODE_TCP {
            Transport::Tcp
        } else {
            Transport::Rdma
        }
    }

    fn ring_detail(&self) -> String {
        self.device.clone()
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
        self.mode() == MODE_PENDING
    }

    fn decline_from_ctl(&self, reason: Option<&str>) {
        if reason == Some(super::NO_DEVICE_REASON) {
            super::note_host_without_rdma(self.peer.ip());
        }
        self.fall_back(reason.unwrap_or("the server did not take the ring"));
    }

    fn answered(&self, payload: &[u8]) -> bool {
        self.connect_to(payload);
        true
    }

    fn urgent_follow_up(&self) -> bool {
        self.mode() == MODE_PENDING
    }
}

impl AttachedConn for RdmaConn {
    fn try_recv(&self, bufs: &mut [IoSliceMut<'_>], peek: bool) -> Result<usize, Errno> {
        match self.mode() {
            MODE_TCP => return self.tcp_recv(bufs, peek),
            MODE_PENDING => {
                // Nothing can be in our ring before the answer; TCP data
                // would mean the server declined without telling us.
                self.check_tcp();
                if self.mode() == MODE_TCP {
                    return self.tcp_recv(bufs, peek);
                }
                if self.mode() == MODE_PENDING {
                    if self.peer_gone.load(Ordering::Acquire) {
                        let e = self.error.swap(0, Ordering::AcqRel);
                        return if e != 0 { Err(Errno(e)) } else { Ok(0) };
                    }
                    return Err(Errno(libc::EAGAIN));
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
        // A head push made while reading completes later: the writer may
        // wait for that space, so its kick must not wait for our next call.
        let _ = rx.poll();
        let owe = rx.transport_mut().words_pending();
        drop(guard);
        if total > 0 && !peek {
            self.message.note_read();
        }
        if owe {
            self.mark_dirty();
        }
        if eof && total == 0 {
            log::debug!("{} -> {}: end of stream", self.local, self.peer);
        }
        if total > 0 || eof {
            return Ok(total);
        }
        match outcome {
            None => {
                if self.peer_gone.load(Ordering::Acquire) {
                    let e = self.error.swap(0, Ordering::AcqRel);
                    return if e != 0 { Err(Errno(e)) } else { Ok(0) };
                }
                Err(Errno(libc::EAGAIN))
            }
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
        let mode = self.mode();
        if mode == MODE_TCP {
            return sockio::send_vec(self.tcp_fd(), bufs);
        }
        if self.wr_shut.load(Ordering::Relaxed) {
            return Err(Errno(libc::EPIPE));
        }
        if self.peer_gone.load(Ordering::Acquire) {
            // As on shm: the kernel socket (now in CLOSE_WAIT) shows the
            // program what kernel TCP would.
            return sockio::send_vec(self.tcp_fd(), bufs);
        }
        if mode == MODE_PENDING {
            let mut early = lock(&self.early);
            if self.mode() != MODE_PENDING {
                drop(early);
                return self.try_send(bufs);
            }
            if !self.tcp_connected() {
                return Err(Errno(libc::EAGAIN));
            }
            let cap = self.early_cap();
            let mut total = 0;
            for b in bufs.iter().filter(|b| !b.is_empty()) {
                let room = cap.saturating_sub(early.len());
                let n = b.len().min(room);
                early.extend_from_slice(&b[..n]);
                total += n;
                if n < b.len() {
                    break;
                }
            }
            return if total == 0 {
                Err(Errno(libc::EAGAIN))
            } else {
                Ok(total)
            };
        }
        let mut guard = lock(&self.tx);
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
            // Large sends may go zero-copy (RINGSOCK_ZEROCOPY_MIN).
            match super::zerocopy::write(tx, b) {
                Ok(n) => {
                    total += n;
                    if n < b.len() {
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
            // A message goes out now (`msgstart`); flush_locked queues
            // what it cannot finish.
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
                // The peer closed its socket before its FIN reached us.
                return sockio::send_after_peer_closed(&self.closed_write_taken, bufs);
            }
            let errno = self.ring_failed(&e, "send");
            if errno == Errno(libc::EPIPE) && self.peer_gone.load(Ordering::Acquire) {
                return sockio::send_vec(self.tcp_fd(), bufs);
            }
            return Err(errno);
        }
        if total == 0 {
            return Err(Errno(libc::EAGAIN));
        }
        Ok(total)
    }

    fn flush(&self) {
        background::flush_all();
    }

    fn readiness(&self) -> Ready {
        match self.mode() {
            MODE_TCP => sockio::tcp_readiness(self.tcp_fd(), self.error.load(Ordering::Acquire)),
            _ => self.ring_readiness(),
        }
    }

    /// A look takes both ring locks and polls both completion queues, so
    /// the library's 256 busy turns held the CPU for a whole 50 µs spin,
    /// and under Soft-RoCE the "NIC" is kernel work that needs this CPU.
    /// With the yields after 16 looks and the completion reaping in
    /// `ring_readiness`, 64 B round trips there went from 654-1308 µs to
    /// 145-374 (rsocket's preload 394-552, the ring library 153-184; one
    /// boot, BENCHMARKS eleventh run). On a NIC 16 looks span about a
    /// round trip.
    fn spin_looks(&self) -> u32 {
        16
    }

    fn arm_waiter(&self, interest: Ready, level: bool) -> Ready {
        self.arm_inner(interest, level)
    }

    fn disarm_waiter(&self, interest: Ready, level: bool) {
        self.disarm_inner(interest, level)
    }

    fn wait_fds(&self, _fd: RawFd, interest: Ready) -> WaitFds {
        let tcp = self.tcp_fd();
        if self.mode() == MODE_TCP {
            return sockio::tcp_wait_fds(tcp, interest);
        }
        [
            Some(WaitFd {
                fd: self.bell_fd,
                events: libc::POLLIN,
            }),
            Some(WaitFd {
                fd: self.wake.fd(),
                events: libc::POLLIN,
            }),
            (tcp >= 0).then_some(WaitFd {
                fd: tcp,
                events: libc::POLLIN | libc::POLLRDHUP,
            }),
        ]
    }

    fn available(&self) -> usize {
        match self.mode() {
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
        if self.mode() == MODE_TCP {
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
            // The kernel socket stays untouched (its FIN reads as the peer
            // process dying); the end-of-stream mark says it. While
            // pending, `connect_to` or `fall_back` carries it on.
            if self.mode() == MODE_RING {
                self.eos_owed.store(true, Ordering::Release);
                self.flush_now();
            }
        }
        Ok(())
    }

    fn take_error(&self) -> c_int {
        self.error.swap(0, Ordering::AcqRel)
    }

    fn claim(&self) -> Result<(), Errno> {
        if process::pid() == self.owner_pid || self.mode() == MODE_TCP {
            return Ok(());
        }
        log::error!(
            "{} -> {}: an RDMA connection cannot be used by a forked child (pid {}); EBADFD",
            self.local,
            self.peer,
            process::pid()
        );
        Err(Errno(libc::EBADFD))
    }

    fn drain_at_exit(&self, deadline_ns: u64) {
        // The queue pair dies with the process, and requests it has not
        // sent die with it: flush, then wait for the last word WRITE's
        // completion (RC: every earlier WRITE was acknowledged before it).
        // The kick a sleeping reader is owed may be lost, but the kernel
        // socket's FIN wakes it, and it reads the ring before EOF. A
        // client still pending keeps its early bytes (README limits).
        if process::pid() != self.owner_pid || self.mode() != MODE_RING {
            return;
        }
        // The background thread may hold the sender for a flush of its
        // own: wait for it, within the deadline. Not a blocking lock: the
        // thread exiting may hold it itself (`_exit` from a signal handler
        // that interrupted a send), and would wait forever.
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
        let mut wait = ringsock_ring::sleep::backoff::CompletionWait::new();
        while tx.transport_mut().words_pending() && sys::monotonic_ns() < deadline_ns {
            if tx.poll().is_err() || self.peer_gone.load(Ordering::Acquire) {
                return;
            }
            wait.relax();
        }
    }

    fn release(&self, _fd: RawFd, kind: ReleaseKind) {
        if self.released.swap(true, Ordering::AcqRel) {
            return;
        }
        let owner = process::pid() == self.owner_pid;
        if kind == ReleaseKind::Owner && owner && self.mode() == MODE_PENDING {
            self.wr_shut.store(true, Ordering::Release);
            self.await_decision();
        }
        if kind == ReleaseKind::Owner && owner && self.mode() == MODE_RING {
            if let Some(tx) = lock(&self.tx).as_mut() {
                if !self.wr_shut.swap(true, Ordering::AcqRel)
                    || self.eos_owed.load(Ordering::Acquire)
                {
                    // A full ring leaves no room for the mark: the peer
                    // then sees our kernel socket close, which reads the
                    // same.
                    let _ = tx.close();
                    self.eos_owed.store(false, Ordering::Release);
                }
                let _ = tx.flush();
            }
            if let Some(rx) = lock(&self.rx).as_mut() {
                let _ = rx.close();
            }
            // The mark and the closed flag must land before the queue
            // pair goes away with the last reference.
            self.settle_words();
        }
        let fd = self.tcp.swap(-1, Ordering::AcqRel);
        if fd >= 0 {
            sys::close(fd);
        }
        if kind != ReleaseKind::Stale {
            if let Some(me) = self.this.upgrade() {
                background::note_closed(me);
            }
        }
    }
}

impl Drop for RdmaConn {
    fn drop(&mut self) {
        let fd = *self.tcp.get_mut();
        if fd >= 0 {
            sys::close(fd);
        }
        if process::pid() != self.owner_pid {
            // A forked child shares the parent's verbs context: destroying
            // "its" queue pair, CQs or memory region would destroy the
            // parent's. Leave them to the parent.
            std::mem::forget(self.tx.get_mut().unwrap_or_else(|p| p.into_inner()).take());
            std::mem::forget(self.rx.get_mut().unwrap_or_else(|p| p.into_inner()).take());
            std::mem::forget(
                self.unconnected
                    .get_mut()
                    .unwrap_or_else(|p| p.into_inner())
                    .take(),
            );
            std::mem::forget(self.bell.take());
        }
    }
}
