//! A connection between hosts over RDMA verbs (the ring crate's verbs
//! transport: one RC queue pair, this end's two ring copies in one
//! registered region).
//!
//! Pending: the client's queue pair cannot be connected before the
//! server's answer (its QPN, PSN, rkey and ring addresses) arrives through
//! the two ctl daemons. Meanwhile the program's bytes (up to
//! `PENDING_CAP`) wait in `early`; the background thread asks the daemon
//! every tick (`urgent_follow_up`), connects on the answer and writes them
//! into the ring first, or sends them over TCP on a decline.
//!
//! Waiting: `arm` publishes the RB2 sleeping flags (a WRITE into the
//! peer's copy, complete before the re-check: see the ring crate's verbs
//! module for why no wake-up is lost) and then polls both ends until no
//! control-word write is unreported, so every kick owed to a sleeping peer
//! is sent before this thread sleeps. Wait fds: the doorbell (completion
//! channel; the peer's solicited WRITE_WITH_IMM makes it readable), our
//! own eventfd (`wake`: the end of the handshake, a decline, re-rings for
//! other waiters) and the kernel socket.
//!
//! Fork: the verbs objects belong to the process that created them. A
//! child that inherited the connection cannot use it (`claim` fails with
//! EBADFD and a log line) and never destroys it (destroying would destroy
//! the parent's queue pair).

use std::io::IoSlice;
use std::os::fd::RawFd;
use std::sync::{Mutex, OnceLock};

use ringsock_proto::Transport as StatusTransport;
use ringsock_ring::transport::verbs::{Doorbell, QpParams, VerbsConn, VerbsTransport};
use ringsock_ring::{EventFd, Notify, RingError, Sender, VerbsError};

use super::super::conn::{RingConn, Share, Waiters, Wire, MODE_PENDING, MODE_TCP, PENDING_CAP};
use super::super::sockio::lock;
use super::{collect, note_host_without_rdma, Collected, NO_DEVICE_REASON, PREFIX};
use crate::attached::Errno;
use crate::{process, sys};

/// A connection to another host.
pub type RdmaConn = RingConn<RdmaWire>;

pub struct RdmaWire {
    /// "rxe0 port 1 gid 1": the status line's reason column.
    device: String,
    /// The process whose verbs objects these are.
    owner_pid: i32,
    /// Bytes sent while pending. Lock order: the connection's sender
    /// slot, then `early`, then `unconnected`.
    early: Mutex<Vec<u8>>,
    /// A client's end before the answer.
    unconnected: Mutex<Option<VerbsConn>>,
    bell: OnceLock<Doorbell>,
    bell_fd: RawFd,
    wake: EventFd,
}

impl RdmaWire {
    /// A client's wire, before the answer.
    pub fn pending(device: String, end: VerbsConn, wake: EventFd) -> RdmaWire {
        RdmaWire {
            device,
            owner_pid: process::pid(),
            early: Mutex::new(Vec::new()),
            bell_fd: end.doorbell_fd(),
            unconnected: Mutex::new(Some(end)),
            bell: OnceLock::new(),
            wake,
        }
    }

    /// A server's wire, its queue pair connected.
    pub fn connected(device: String, bell: Doorbell, bell_fd: RawFd, wake: EventFd) -> RdmaWire {
        record_user(&bell);
        RdmaWire {
            device,
            owner_pid: process::pid(),
            early: Mutex::new(Vec::new()),
            unconnected: Mutex::new(None),
            bell: OnceLock::from(bell),
            bell_fd,
            wake,
        }
    }

    fn owned_here(&self) -> bool {
        process::pid() == self.owner_pid
    }
}

/// `user` word of the region header: the side's user (`share`) is the
/// process whose queue pair it is.
const SHARE_USER: usize = 0;

fn record_user(bell: &Doorbell) {
    bell.user_words()[SHARE_USER]
        .store(process::pid() as u64, std::sync::atomic::Ordering::Release);
}

/// Pending -> Ring with the server's parameters, or a dead connection if
/// they cannot be used (the server already uses its ring: TCP is no way
/// back for it either).
fn connect_to(c: &RdmaConn, payload: &[u8]) {
    let w = &c.wire;
    let mut tx_slot = c.tx_slot();
    let mut early = lock(&w.early);
    if c.mode() != MODE_PENDING {
        return;
    }
    let params = payload
        .strip_prefix(PREFIX)
        .ok_or(RingError::Verbs(VerbsError::Params(
            "the answer is not a verbs answer",
        )))
        .and_then(QpParams::decode);
    let vc = lock(&w.unconnected).take();
    let connected = match (vc, params) {
        (Some(vc), Ok(p)) => vc.connect(&p),
        (None, _) => Err(RingError::Closed),
        (_, Err(e)) => Err(e),
    };
    match connected {
        Ok(conn) => {
            log::debug!(
                "{}: queue pair connected, {} early bytes go first",
                c.ends(),
                early.len()
            );
            record_user(&conn.bell);
            let _ = w.bell.set(conn.bell);
            let mut tx = conn.tx;
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
            if failed.is_none() && c.wr_shut() {
                // Closed while pending: the mark follows the bytes.
                if tx.close().is_err() {
                    c.owe_eos();
                }
            }
            let _ = tx.flush();
            *tx_slot = Some(tx);
            *c.rx_slot() = Some(conn.rx);
            early.clear();
            c.enter_ring();
            drop(early);
            drop(tx_slot);
            if let Some(e) = failed {
                c.ring_failed(&e, "connect");
            }
            c.mark_dirty();
        }
        Err(e) => {
            log::error!(
                "{}: cannot connect to the server's queue pair ({e}); the connection is reset",
                c.ends()
            );
            c.enter_ring();
            drop(early);
            drop(tx_slot);
            c.fail_hard(libc::ECONNRESET);
        }
    }
    let _ = w.wake.notify();
}

impl Wire for RdmaWire {
    type Transport = VerbsTransport;

    const STATUS: StatusTransport = StatusTransport::Rdma;
    const FAILURES_ARE_FATAL: bool = true;
    const REAPS_COMPLETIONS: bool = true;
    const PUBLISHES_EACH_SEND: bool = false;
    const DECISION_IN_SEGMENT: bool = false;

    /// A look takes both ring locks and polls both completion queues, and
    /// where the device is kernel work (Soft-RoCE) it needs this CPU: a
    /// spinner yields after this many looks, about a round trip on a NIC.
    fn spin_looks(&self) -> u32 {
        16
    }

    fn detail(&self) -> String {
        self.device.clone()
    }

    fn words_pending(t: &mut VerbsTransport) -> bool {
        t.words_pending()
    }

    fn check_stalled(t: &mut VerbsTransport) -> Result<(), RingError> {
        t.check_stalled()
    }

    fn bell_fds(&self) -> [Option<RawFd>; 2] {
        [Some(self.bell_fd), Some(self.wake.fd())]
    }

    fn drain_bells(&self) -> bool {
        let rung = self.bell.get().is_some_and(|b| b.drain().unwrap_or(true));
        self.wake.drain() | rung
    }

    fn ring_own_bell(&self) {
        let _ = self.wake.notify();
    }

    /// Unlike an eventfd, the completion channel raises a new event only
    /// once it is re-armed, and every ring consumes a posted receive (with
    /// none left the peer's queue pair stalls on RNR retries): so every
    /// waiter, level or edge, drains and re-arms before it sleeps. The
    /// re-check after arming sees what the drained rings announced; another
    /// waiter that may have been woken by them is rung again.
    fn before_arm(c: &RdmaConn, w: &Waiters) {
        if c.wire.drain_bells() && (w.level > 0 || w.any_armed()) {
            c.wire.ring_own_bell();
        }
    }

    fn poll_decision(_c: &RdmaConn) {}

    fn pending_room(c: &RdmaConn) -> usize {
        PENDING_CAP.saturating_sub(lock(&c.wire.early).len())
    }

    fn send_pending(c: &RdmaConn, bufs: &[IoSlice<'_>]) -> Result<usize, Errno> {
        let mut early = lock(&c.wire.early);
        if c.mode() != MODE_PENDING {
            drop(early);
            return crate::attached::AttachedConn::try_send(c, bufs);
        }
        let mut total = 0;
        for b in bufs.iter().filter(|b| !b.is_empty()) {
            let room = PENDING_CAP.saturating_sub(early.len());
            let n = b.len().min(room);
            early.extend_from_slice(&b[..n]);
            total += n;
            if n < b.len() {
                break;
            }
        }
        if total == 0 {
            return Err(Errno(libc::EAGAIN));
        }
        Ok(total)
    }

    fn take_early(
        c: &RdmaConn,
        _tx: &mut Option<Sender<VerbsTransport>>,
    ) -> Result<Vec<u8>, RingError> {
        let early = std::mem::take(&mut *lock(&c.wire.early));
        lock(&c.wire.unconnected).take();
        Ok(early)
    }

    /// The early bytes must reach the server either way, so ask the daemon
    /// ourselves, a bounded time.
    fn await_decision(c: &RdmaConn, closing: bool) {
        if closing {
            c.set_wr_shut();
        }
        let limit = u64::from(crate::config::get().connect_timeout_ms) * 1_000_000;
        let start = sys::monotonic_ns();
        while c.mode() == MODE_PENDING {
            match collect(c.offer_id) {
                Collected::Answer(p) => connect_to(c, &p),
                Collected::Refused(reason) => {
                    <Self as Wire>::decline_from_ctl(c, reason.as_deref())
                }
                Collected::Pending => {}
            }
            if c.mode() != MODE_PENDING || sys::monotonic_ns() - start >= limit {
                break;
            }
            c.check_tcp();
            if c.was_reset() {
                // The kernel connection is gone: no answer will come.
                break;
            }
            // SAFETY: plain sleep of 1 ms.
            unsafe {
                crate::sys::sys_call!(
                    libc::SYS_nanosleep,
                    &libc::timespec {
                        tv_sec: 0,
                        tv_nsec: 1_000_000,
                    } as *const libc::timespec,
                    std::ptr::null_mut::<libc::timespec>(),
                )
            };
        }
        if c.mode() == MODE_PENDING && !c.was_reset() {
            log::warn!(
                "{}: closed before the server answered; {} early bytes are dropped",
                c.ends(),
                lock(&c.wire.early).len()
            );
        }
    }

    fn decline_from_ctl(c: &RdmaConn, reason: Option<&str>) {
        if reason == Some(NO_DEVICE_REASON) {
            note_host_without_rdma(c.peer.ip());
        }
        c.fall_back(reason.unwrap_or("the server did not take the ring"));
    }

    fn answered(c: &RdmaConn, payload: &[u8]) -> bool {
        connect_to(c, payload);
        true
    }

    fn urgent_follow_up(c: &RdmaConn) -> bool {
        c.mode() == MODE_PENDING
    }

    fn claim(c: &RdmaConn) -> Result<(), Errno> {
        if c.wire.owned_here() || c.mode() == MODE_TCP {
            return Ok(());
        }
        log::error!(
            "{}: an RDMA connection cannot be used by a forked child (pid {}); EBADFD",
            c.ends(),
            process::pid()
        );
        Err(Errno(libc::EBADFD))
    }

    fn is_user(c: &RdmaConn) -> bool {
        c.wire.owned_here()
    }

    fn share(&self) -> Option<Share<'_>> {
        let w = self.bell.get()?.user_words();
        Some(Share {
            user: &w[SHARE_USER],
            lock: &w[1],
            ops: &w[2],
            consumed: &w[3],
            written: &w[4],
            left: &w[5],
            holders: &w[6],
        })
    }

    fn can_take_over(c: &RdmaConn) -> bool {
        c.wire.owned_here()
    }

    fn write(tx: &mut Sender<VerbsTransport>, buf: &[u8]) -> Result<usize, RingError> {
        // Large sends may go zero-copy (RINGSOCK_ZEROCOPY_MIN).
        super::zerocopy::write(tx, buf)
    }

    fn owns_ends(&self) -> bool {
        self.owned_here()
    }
}

impl Drop for RdmaWire {
    fn drop(&mut self) {
        if !self.owned_here() {
            // A forked child shares the parent's verbs context: destroying
            // "its" queue pair or completion channel would destroy the
            // parent's. Leave them to the parent.
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
