//! One same-host connection over a shared-memory segment: the
//! `AttachedConn` the hooks dispatch to.
//!
//! The segment (created by the client, see handshake.rs) holds two rings:
//! ring 0 carries client -> server, ring 1 server -> client. Each side owns
//! an eventfd doorbell the other side rings (`bell` here, the peer's inside
//! both ring transports), and keeps a private duplicate of the kernel TCP
//! socket, which stays connected and idle underneath: its EOF or reset is
//! how a side learns that the peer *process* died without closing.
//!
//! Modes (the client starts `Pending`, the server starts `Ring`):
//! * `Pending`: the client may already write (up to `PENDING_CAP` bytes)
//!   into ring 0; the server has not decided yet. The server stores its
//!   decision in the segment header (`STATE_*`) and rings our bell; a
//!   decline we only learn from the daemon is delivered by the background
//!   thread (`decline_from_ctl`).
//! * `Ring`: everything goes through the rings.
//! * `Tcp`: the server turned the ring down; what we had written into ring 0
//!   was taken back and sent over TCP first, in order (`fall_back`), and
//!   from then on every call goes to the kernel socket.
//!
//! Waiting: `arm` announces a sleeping reader/writer in the ring (the RB2
//! flags whose ordering the loom models in ring/tests/loom.rs check) and
//! counts waiters. The doorbell is drained only by the last level-triggered
//! waiter (ppoll) to leave, under the same lock as arming, so one waiter
//! can never swallow the wake-up another is about to sleep on; edge
//! waiters (epoll sets holding arms) never drain, and a drain that leaves
//! them armed on a ready connection rings the bell again.

use std::io::{IoSlice, IoSliceMut};
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use libc::c_int;
use ringsock_proto::Transport;
use ringsock_ring::{EventFd, Notify, Receiver, RingError, RingMem, Segment, Sender, ShmTransport};

use super::background;
use super::msgstart::MessageStart;
use super::sockio::{self, lock, poll_one, ring_errno, send_all_bounded, sys_recv};
use super::tracked::{ReportState, Tracked};
use crate::attached::{AttachedConn, Errno, Ready, ReleaseKind, WaitFd, WaitFds};
use crate::{process, sys};

/// Segment header user words (`SegmentHeader::user`).
pub const WORD_STATE: usize = 0;
pub const WORD_CLIENT_PID: usize = 1;
pub const WORD_SERVER_PID: usize = 2;

/// Values of `WORD_STATE`, written by the server.
pub const STATE_PENDING: u64 = 0;
pub const STATE_ACCEPTED: u64 = 1;
pub const STATE_DECLINED: u64 = 2;

/// Bytes a client may put in the ring before the server decided: what a
/// decline makes us resend over TCP, so it is kept small.
pub const PENDING_CAP: usize = 64 * 1024;

const MODE_PENDING: u8 = 0;
const MODE_RING: u8 = 1;
const MODE_TCP: u8 = 2;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    Client,
    Server,
}

/// The peer's doorbell, shared by our two ring ends.
pub struct PeerBell(pub Arc<EventFd>);

impl Notify for PeerBell {
    fn notify(&self) -> Result<(), RingError> {
        self.0.notify()
    }
}

#[derive(Default)]
struct Waiters {
    /// Waiters sleeping in a level-triggered poll on our wait fds.
    level: u32,
    /// Outstanding arms per direction (level and edge waiters).
    rx: u32,
    tx: u32,
}

pub struct ShmConn {
    side: Side,
    /// The daemon's id for the offer that set this connection up.
    pub offer_id: u64,
    pub local: SocketAddr,
    pub peer: SocketAddr,
    seg: Segment,
    /// Control blocks of the ring we read (0 for the server) and the one
    /// we write, for lock-free looks at what the peer published.
    rx_mem: RingMem,
    tx_mem: RingMem,
    tx: Mutex<Sender<ShmTransport>>,
    rx: Mutex<Receiver<ShmTransport>>,
    bell: EventFd,
    /// Our duplicate of the kernel socket; -1 once released.
    tcp: AtomicI32,
    mode: AtomicU8,
    /// Bytes written while `Pending`.
    pending_sent: AtomicUsize,
    /// The daemon said the server will not use the ring.
    ctl_declined: AtomicBool,
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
    pub(super) dirty: AtomicBool,
    /// Whether the next send starts a message.
    message: MessageStart,
    waiters: Mutex<Waiters>,
    released: AtomicBool,
    /// Status report bookkeeping (background thread).
    pub report: ReportState,
    this: Weak<ShmConn>,
}

/// What the handshake hands over to build a connection.
pub struct Parts {
    pub side: Side,
    pub offer_id: u64,
    pub local: SocketAddr,
    pub peer: SocketAddr,
    pub seg: Segment,
    pub tx: Sender<ShmTransport>,
    pub rx: Receiver<ShmTransport>,
    pub bell: EventFd,
    pub tcp: RawFd,
}

fn pid_alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks existence.
    unsafe { libc::syscall(libc::SYS_kill, pid, 0) == 0 || sys::errno() == libc::EPERM }
}

impl ShmConn {
    pub fn new(p: Parts) -> Arc<ShmConn> {
        let mode = match p.side {
            Side::Client => MODE_PENDING,
            Side::Server => MODE_RING,
        };
        let word = match p.side {
            Side::Client => WORD_CLIENT_PID,
            Side::Server => WORD_SERVER_PID,
        };
        p.seg.header().user[word].store(process::pid() as u64, Ordering::Release);
        let (rx_ring, tx_ring) = match p.side {
            Side::Client => (1, 0),
            Side::Server => (0, 1),
        };
        let rx_mem = p.seg.ring(rx_ring);
        let tx_mem = p.seg.ring(tx_ring);
        Arc::new_cyclic(|this| ShmConn {
            side: p.side,
            offer_id: p.offer_id,
            local: p.local,
            peer: p.peer,
            seg: p.seg,
            rx_mem,
            tx_mem,
            tx: Mutex::new(p.tx),
            rx: Mutex::new(p.rx),
            bell: p.bell,
            tcp: AtomicI32::new(p.tcp),
            mode: AtomicU8::new(mode),
            pending_sent: AtomicUsize::new(0),
            ctl_declined: AtomicBool::new(false),
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

    pub fn this(&self) -> Option<Arc<ShmConn>> {
        self.this.upgrade()
    }

    pub fn segment(&self) -> &Segment {
        &self.seg
    }

    fn tcp_fd(&self) -> RawFd {
        self.tcp.load(Ordering::Acquire)
    }

    /// Resolves `Pending` from what the server wrote in the segment (or the
    /// daemon said). Cheap when already decided.
    fn settle(&self) -> u8 {
        let m = self.mode.load(Ordering::Acquire);
        if m != MODE_PENDING {
            return m;
        }
        match self.seg.header().user[WORD_STATE].load(Ordering::Acquire) {
            STATE_ACCEPTED => {
                let _ = self.mode.compare_exchange(
                    MODE_PENDING,
                    MODE_RING,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                );
                background::note_accepted(self.offer_id);
            }
            STATE_DECLINED => self.fall_back("the server declined the ring"),
            STATE_PENDING if self.ctl_declined.load(Ordering::Acquire) => {
                self.fall_back("the server did not take the ring")
            }
            _ => {}
        }
        self.mode.load(Ordering::Acquire)
    }

    /// Pending -> Tcp: takes back what we wrote into ring 0 and sends it
    /// over the kernel socket before anything else can be sent there.
    fn fall_back(&self, why: &str) {
        let mut tx = lock(&self.tx);
        if self.mode.load(Ordering::Acquire) != MODE_PENDING {
            return;
        }
        let fd = self.tcp_fd();
        let spill = match tx.take_unconsumed() {
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
        if self.wr_shut.load(Ordering::Acquire) {
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
    }

    /// Closing while the server has not decided: the bytes in ring 0 are
    /// only safe once it took the ring (or, if it turns it down, once they
    /// were resent over TCP, which `settle` does). Waits a bounded time;
    /// a server that is merely slow to accept still finds them in the ring.
    fn await_decision(&self) {
        let limit = u64::from(crate::config::get().connect_timeout_ms) * 1_000_000;
        let start = sys::monotonic_ns();
        while self.settle() == MODE_PENDING && sys::monotonic_ns() - start < limit {
            self.check_tcp();
            let mut p = [
                libc::pollfd {
                    fd: self.bell.fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: self.tcp_fd(),
                    events: libc::POLLIN | libc::POLLRDHUP,
                    revents: 0,
                },
            ];
            // SAFETY: two valid pollfds; 5 ms timeout; raw syscall.
            unsafe {
                libc::syscall(
                    libc::SYS_ppoll,
                    p.as_mut_ptr(),
                    2,
                    &libc::timespec {
                        tv_sec: 0,
                        tv_nsec: 5_000_000,
                    } as *const libc::timespec,
                    std::ptr::null::<libc::sigset_t>(),
                    8,
                )
            };
            self.bell.drain();
        }
    }

    /// Looks at the kernel socket after a wake-up: EOF or reset means the
    /// peer process is gone; data while pending means the server is talking
    /// TCP (it turned the ring down without a word).
    fn check_tcp(&self) {
        let fd = self.tcp_fd();
        if fd < 0 || self.peer_gone.load(Ordering::Relaxed) {
            return;
        }
        let re = poll_one(fd, libc::POLLIN | libc::POLLRDHUP);
        if re == 0 {
            return;
        }
        let mut b = [0u8; 1];
        match sys_recv(fd, &mut b, libc::MSG_PEEK) {
            Ok(0) => self.peer_gone.store(true, Ordering::Release),
            Ok(_) => {
                if self.mode.load(Ordering::Acquire) == MODE_PENDING {
                    self.fall_back("the server answered over TCP");
                } else if self.mode.load(Ordering::Acquire) == MODE_RING {
                    log::error!(
                        "{} -> {}: unexpected TCP data on a ring connection; resetting it",
                        self.local,
                        self.peer
                    );
                    self.error.store(libc::ECONNRESET, Ordering::Release);
                    self.peer_gone.store(true, Ordering::Release);
                }
            }
            Err(Errno(libc::EAGAIN)) => {}
            Err(Errno(e)) => {
                self.error.store(e, Ordering::Release);
                self.peer_gone.store(true, Ordering::Release);
            }
        }
    }

    /// The errno for a failed ring call. A corrupt ring is beyond repair:
    /// both directions end here, and the peer must hear of it or it would
    /// sleep forever on a ring nobody writes. Shutting the kernel socket
    /// down sends it a FIN, which its ring layer reads as this end gone
    /// (EOF after what it already received, EPIPE on send).
    fn ring_failed(&self, e: &RingError, what: &str) -> Errno {
        let errno = ring_errno(e, what);
        if matches!(e, RingError::Corrupt(_)) && !self.peer_gone.swap(true, Ordering::AcqRel) {
            self.rd_shut.store(true, Ordering::Release);
            let fd = self.tcp_fd();
            if fd >= 0 {
                // SAFETY: shutdown on our own duplicate of the socket.
                unsafe { libc::syscall(libc::SYS_shutdown, fd, libc::SHUT_RDWR) };
            }
        }
        errno
    }

    /// Pushes batched bytes out (and a deferred end-of-stream mark).
    fn flush_now(&self) {
        let mut tx = lock(&self.tx);
        self.flush_locked(&mut tx);
    }

    /// Background variant: skips a connection another thread is using (it
    /// will flush by itself before blocking). Returns false if skipped.
    fn try_flush(&self) -> bool {
        match self.tx.try_lock() {
            Ok(mut tx) => {
                self.flush_locked(&mut tx);
                true
            }
            Err(_) => false,
        }
    }

    fn flush_locked(&self, tx: &mut Sender<ShmTransport>) {
        self.dirty.store(false, Ordering::Release);
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
        if tx.has_unflushed() || self.eos_owed.load(Ordering::Acquire) {
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

    fn ring_readiness(&self) -> Ready {
        let mut r = Ready::NONE;
        let gone = self.peer_gone.load(Ordering::Acquire);
        {
            let mut rx = lock(&self.rx);
            let readable = rx.readable();
            if self.rd_shut.load(Ordering::Relaxed) || gone || !matches!(readable, Ok(false)) {
                r = r | Ready::READ;
            }
            if rx.at_eof() || gone {
                r = r | Ready::RDHUP;
            }
        }
        if self.mode.load(Ordering::Acquire) == MODE_PENDING {
            if self.pending_sent.load(Ordering::Relaxed) < PENDING_CAP && self.tcp_connected() {
                r = r | Ready::WRITE;
            }
        } else if gone
            || self.wr_shut.load(Ordering::Relaxed)
            || !matches!(lock(&self.tx).writable(), Ok(false))
        {
            r = r | Ready::WRITE;
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

    /// While pending: whether the kernel connect completed (a program
    /// waiting for POLLOUT after a non-blocking connect must not be told
    /// "writable" before the kernel would).
    fn tcp_connected(&self) -> bool {
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

    fn arm_inner(&self, interest: Ready, level: bool) -> Ready {
        if !level {
            // An epoll set watches the kernel socket edge-triggered: if its
            // EOF or reset (the peer process died) fired while this
            // registration was not armed, that edge is spent and will not
            // come again, so look now, as the ring side's re-check does
            // after prepare_wait. (Level waiters ppoll the socket itself.)
            self.check_tcp();
        }
        let mode = self.settle();
        if mode == MODE_TCP {
            if level {
                lock(&self.waiters).level += 1;
            }
            return self.tcp_readiness();
        }
        let mut w = lock(&self.waiters);
        if level {
            w.level += 1;
        }
        // While pending, the server's decision rings our bell whatever the
        // flags say. Counts depend on `interest` alone, so that `disarm`
        // undoes exactly what this did even if the mode changed meanwhile.
        let want_rx = interest.intersects(Ready::READ | Ready::RDHUP);
        let want_tx = interest.intersects(Ready::WRITE);
        if want_rx {
            w.rx += 1;
            let _ = lock(&self.rx).prepare_wait();
        }
        if want_tx {
            w.tx += 1;
            let _ = lock(&self.tx).prepare_wait();
        }
        drop(w);
        self.readiness()
    }

    fn disarm_inner(&self, interest: Ready, level: bool) {
        {
            let mut w = lock(&self.waiters);
            if level {
                w.level = w.level.saturating_sub(1);
            }
            let mode = self.mode.load(Ordering::Acquire);
            if mode != MODE_TCP {
                let had_rx = interest.intersects(Ready::READ | Ready::RDHUP);
                if had_rx && w.rx > 0 {
                    w.rx -= 1;
                    if w.rx == 0 {
                        let _ = lock(&self.rx).finish_wait(true);
                    }
                }
                if interest.intersects(Ready::WRITE) && w.tx > 0 {
                    w.tx -= 1;
                    if w.tx == 0 {
                        let _ = lock(&self.tx).finish_wait(true);
                    }
                }
            }
            // Only the last level-triggered waiter drains the doorbell (so a
            // later ppoll does not wake for an old ring). Edge waiters never
            // drain: the kernel re-checks an eventfd before epoll reports
            // it, so draining before an epoll set has read its event would
            // swallow that set's wake-up. If edge arms remain after a drain
            // and what they wait for is already there, the ring that told
            // them may just have been drained: ring again.
            if level && w.level == 0 && self.bell.drain() && (w.rx > 0 || w.tx > 0) {
                let r = self.readiness();
                let rx_ready =
                    w.rx > 0 && r.intersects(Ready::READ | Ready::RDHUP | Ready::HUP | Ready::ERR);
                let tx_ready = w.tx > 0 && r.intersects(Ready::WRITE | Ready::HUP | Ready::ERR);
                if rx_ready || tx_ready {
                    let _ = self.bell.notify();
                }
            }
        }
        self.check_tcp();
        self.settle();
    }
}

impl Tracked for ShmConn {
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
        if self.mode.load(Ordering::Acquire) == MODE_TCP {
            Transport::Tcp
        } else {
            Transport::Shm
        }
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
        self.settle() == MODE_PENDING
    }

    /// Fall back, and wake whoever sleeps on us.
    fn decline_from_ctl(&self, _reason: Option<&str>) {
        self.ctl_declined.store(true, Ordering::Release);
        let _ = self.bell.notify();
    }
}

impl AttachedConn for ShmConn {
    fn try_recv(&self, bufs: &mut [IoSliceMut<'_>], peek: bool) -> Result<usize, Errno> {
        match self.settle() {
            MODE_TCP => return self.tcp_recv(bufs, peek),
            MODE_PENDING => {
                // The server has not decided, so nothing can be in ring 1;
                // TCP data would mean it declined without telling us.
                self.check_tcp();
                if self.settle() == MODE_TCP {
                    return self.tcp_recv(bufs, peek);
                }
                if !self.peer_gone.load(Ordering::Acquire) {
                    return Err(Errno(libc::EAGAIN));
                }
            }
            _ => {}
        }
        if self.rd_shut.load(Ordering::Relaxed) {
            return Ok(0);
        }
        let mut rx = lock(&self.rx);
        let mut total = 0;
        for b in bufs.iter_mut().filter(|b| !b.is_empty()) {
            let r = if peek { rx.peek(b) } else { rx.read(b) };
            match r {
                Ok(0) => break,
                Ok(n) => {
                    total += n;
                    if n < b.len() || peek {
                        break;
                    }
                }
                Err(RingError::WouldBlock) if total > 0 => break,
                Err(RingError::WouldBlock) => {
                    drop(rx);
                    if self.peer_gone.load(Ordering::Acquire) {
                        let e = self.error.swap(0, Ordering::AcqRel);
                        return if e != 0 { Err(Errno(e)) } else { Ok(0) };
                    }
                    return Err(Errno(libc::EAGAIN));
                }
                Err(e) if total > 0 => {
                    let _ = e;
                    break;
                }
                Err(e) => return Err(self.ring_failed(&e, "recv")),
            }
        }
        if total > 0 && !peek {
            self.message.note_read();
        }
        Ok(total)
    }

    fn try_send(&self, bufs: &[IoSlice<'_>]) -> Result<usize, Errno> {
        let mode = self.settle();
        if mode == MODE_TCP {
            return self.tcp_send(bufs);
        }
        if self.wr_shut.load(Ordering::Relaxed) {
            return Err(Errno(libc::EPIPE));
        }
        if self.peer_gone.load(Ordering::Acquire) {
            // The peer process closed its socket or died: send on the
            // kernel socket (now in CLOSE_WAIT), so the program sees what
            // kernel TCP would show it: the first write accepted, the
            // peer's reset, then ECONNRESET/EPIPE. Failing the first write
            // at once is not the same: redis-benchmark retries a failed
            // write forever when its write handler meets it.
            return self.tcp_send(bufs);
        }
        let mut budget = usize::MAX;
        if mode == MODE_PENDING {
            budget = PENDING_CAP.saturating_sub(self.pending_sent.load(Ordering::Relaxed));
            if budget == 0 || !self.tcp_connected() {
                return Err(Errno(libc::EAGAIN));
            }
        }
        let mut tx = lock(&self.tx);
        if mode == MODE_PENDING && self.mode.load(Ordering::Acquire) != MODE_PENDING {
            // Declined meanwhile (fall_back holds the lock while it moves
            // the early bytes): this call goes to TCP.
            drop(tx);
            return self.try_send(bufs);
        }
        let first = self.message.starts_message();
        let mut total = 0;
        for b in bufs.iter().filter(|b| !b.is_empty()) {
            let chunk = &b[..b.len().min(budget - total)];
            match tx.write(chunk) {
                Ok(n) => {
                    total += n;
                    if n < b.len() || total == budget {
                        break;
                    }
                }
                Err(RingError::WouldBlock) => break,
                Err(e) if total > 0 => {
                    let _ = e;
                    break;
                }
                Err(RingError::PeerClosed) => {
                    // The peer closed its socket before its FIN reached
                    // us. An EPIPE at once failed iperf3's cookie write to
                    // a server that answered "busy" and closed.
                    drop(tx);
                    return sockio::send_after_peer_closed(&self.closed_write_taken, bufs);
                }
                Err(e) => return Err(self.ring_failed(&e, "send")),
            }
        }
        if mode == MODE_PENDING {
            self.pending_sent.fetch_add(total, Ordering::Relaxed);
        }
        if first {
            // A message goes out now (`msgstart`); flush_locked queues
            // what it cannot finish.
            self.flush_locked(&mut tx);
        } else if tx.has_unflushed() {
            drop(tx);
            self.mark_dirty();
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
        match self.settle() {
            MODE_TCP => self.tcp_readiness(),
            _ => self.ring_readiness(),
        }
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
        [
            Some(WaitFd {
                fd: self.bell.fd(),
                events: libc::POLLIN,
            }),
            (tcp >= 0).then_some(WaitFd {
                fd: tcp,
                events: libc::POLLIN | libc::POLLRDHUP,
            }),
            None,
        ]
    }

    fn event_seq(&self) -> u64 {
        // Both pointers only grow: their sum changes with every arrival
        // of data (the peer's tail) and of space (the peer's head push).
        let tail = self.rx_mem.ctrl().local_tail.value.load(Ordering::Acquire);
        let head = self.tx_mem.ctrl().local_head.value.load(Ordering::Acquire);
        let flags = u64::from(self.mode.load(Ordering::Acquire)) << 60
            | u64::from(self.peer_gone.load(Ordering::Acquire)) << 62;
        tail.wrapping_add(head) ^ flags
    }

    fn available(&self) -> usize {
        if self.settle() == MODE_TCP {
            return sockio::fionread(self.tcp_fd());
        }
        lock(&self.rx).available().unwrap_or(0)
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
            // peer process dying. The end-of-stream mark says it instead.
            self.eos_owed.store(true, Ordering::Release);
            self.flush_now();
        }
        if self.mode.load(Ordering::Acquire) == MODE_TCP && self.wr_shut.load(Ordering::Acquire) {
            // Declined while we were closing: fall_back did the SHUT_WR.
        }
        Ok(())
    }

    fn take_error(&self) -> c_int {
        self.error.swap(0, Ordering::AcqRel)
    }

    fn claim(&self) -> Result<(), Errno> {
        let word = match self.side {
            Side::Client => WORD_CLIENT_PID,
            Side::Server => WORD_SERVER_PID,
        };
        let w = &self.seg.header().user[word];
        let me = process::pid() as u64;
        // SAFETY: plain syscall.
        let parent = unsafe { libc::getppid() } as u64;
        loop {
            let cur = w.load(Ordering::Acquire);
            if cur == me {
                return Ok(());
            }
            // The connection passes to a child that inherited it from its
            // user, or from a user that is gone; never to a sibling or the
            // parent while the child that took it still lives.
            if cur != 0 && cur != parent && pid_alive(cur as i32) {
                log::error!(
                    "{} -> {}: in use by pid {cur}; a ring connection cannot be used by two processes (EBADFD)",
                    self.local,
                    self.peer
                );
                return Err(Errno(libc::EBADFD));
            }
            if w.compare_exchange(cur, me, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                return Ok(());
            }
        }
    }

    fn drain_at_exit(&self, _deadline_ns: u64) {
        // Published bytes are in the shared segment, which outlives us;
        // only an open batch would be lost. A client still pending keeps
        // its bytes in ring 0, where a server that takes the ring finds
        // them. Only the process using the connection may flush it (a
        // forked copy of the batch state would send the bytes twice).
        let word = match self.side {
            Side::Client => WORD_CLIENT_PID,
            Side::Server => WORD_SERVER_PID,
        };
        let user = self.seg.header().user[word].load(Ordering::Acquire);
        if self.mode.load(Ordering::Acquire) != MODE_RING || user != process::pid() as u64 {
            return;
        }
        if let Ok(mut tx) = self.tx.try_lock() {
            let _ = tx.flush();
        }
    }

    fn release(&self, _fd: RawFd, kind: ReleaseKind) {
        if self.released.swap(true, Ordering::AcqRel) {
            return;
        }
        if kind == ReleaseKind::Owner && self.mode.load(Ordering::Acquire) == MODE_PENDING {
            self.await_decision();
        }
        if kind == ReleaseKind::Owner && self.mode.load(Ordering::Acquire) != MODE_TCP {
            {
                let mut tx = lock(&self.tx);
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
            let _ = lock(&self.rx).close();
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

impl Drop for ShmConn {
    fn drop(&mut self) {
        let fd = *self.tcp.get_mut();
        if fd >= 0 {
            sys::close(fd);
        }
    }
}
