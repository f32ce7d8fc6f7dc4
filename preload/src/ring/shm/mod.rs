//! Rings between processes of one host, over a shared-memory segment.
//!
//! The segment (created by the client, `handshake`) holds two rings: ring 0
//! carries client -> server, ring 1 server -> client. Each side owns an
//! eventfd doorbell the other side rings (`bell` here, the peer's inside
//! both ring transports). While pending, the client writes straight into
//! ring 0, where a server that takes the ring finds the bytes; the server
//! stores its decision in the segment header (`STATE_*`) and rings our
//! bell, and a decline we only learn from the daemon arrives through the
//! background thread (`decline_from_ctl`).

pub mod handshake;
#[cfg(test)]
mod tests;

use std::io::IoSlice;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use ringsock_proto::Transport as StatusTransport;
use ringsock_ring::{EventFd, Notify, RingError, RingMem, Segment, Sender, ShmTransport};

use super::background;
use super::conn::{RingConn, Share, Wire, MODE_PENDING, PENDING_CAP};
use crate::attached::Errno;
use crate::{process, sys};

/// A same-host ring connection.
pub type ShmConn = RingConn<ShmWire>;

/// Segment header user words (`SegmentHeader::user`).
pub const WORD_STATE: usize = 0;
pub const WORD_CLIENT_PID: usize = 1;
pub const WORD_SERVER_PID: usize = 2;

/// First of each side's `Share` words (user words 8.. and 16..).
const SHARE_CLIENT: usize = 8;
const SHARE_SERVER: usize = 16;

/// Values of `WORD_STATE`, written by the server.
pub const STATE_PENDING: u64 = 0;
pub const STATE_ACCEPTED: u64 = 1;
pub const STATE_DECLINED: u64 = 2;
/// Written by the client: it stopped waiting for the server.
pub const STATE_REVOKED: u64 = 3;

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

pub struct ShmWire {
    side: Side,
    seg: Segment,
    /// Control blocks of the ring we read and the one we write, for
    /// lock-free looks at what the peer published.
    rx_mem: RingMem,
    tx_mem: RingMem,
    /// Our doorbell.
    bell: EventFd,
    /// Bytes written while pending.
    pending_sent: AtomicUsize,
    /// The daemon said the server will not use the ring.
    ctl_declined: AtomicBool,
}

impl ShmWire {
    /// Our side of `seg`, with our doorbell; records this process as the
    /// side's user.
    pub fn new(side: Side, seg: Segment, bell: EventFd) -> ShmWire {
        seg.header().user[user_word(side)].store(process::pid() as u64, Ordering::Release);
        let (rx_ring, tx_ring) = match side {
            Side::Client => (1, 0),
            Side::Server => (0, 1),
        };
        ShmWire {
            side,
            rx_mem: seg.ring(rx_ring),
            tx_mem: seg.ring(tx_ring),
            seg,
            bell,
            pending_sent: AtomicUsize::new(0),
            ctl_declined: AtomicBool::new(false),
        }
    }

    pub fn segment(&self) -> &Segment {
        &self.seg
    }

    fn user(&self) -> &std::sync::atomic::AtomicU64 {
        &self.seg.header().user[user_word(self.side)]
    }
}

fn user_word(side: Side) -> usize {
    match side {
        Side::Client => WORD_CLIENT_PID,
        Side::Server => WORD_SERVER_PID,
    }
}

fn pid_alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks existence.
    unsafe { crate::sys::sys_call!(libc::SYS_kill, pid, 0) == 0 || sys::errno() == libc::EPERM }
}

impl Wire for ShmWire {
    type Transport = ShmTransport;

    const STATUS: StatusTransport = StatusTransport::Shm;
    const FAILURES_ARE_FATAL: bool = false;
    const REAPS_COMPLETIONS: bool = false;
    const PUBLISHES_EACH_SEND: bool = true;
    const DECISION_IN_SEGMENT: bool = true;

    fn bell_fds(&self) -> [Option<RawFd>; 2] {
        [Some(self.bell.fd()), None]
    }

    fn drain_bells(&self) -> bool {
        self.bell.drain()
    }

    fn ring_own_bell(&self) {
        let _ = self.bell.notify();
    }

    fn event_seq(&self) -> Option<u64> {
        // Both pointers only grow: their sum changes with every arrival of
        // data (the peer's tail) and of space (the peer's head push).
        let tail = self.rx_mem.ctrl().local_tail.value.load(Ordering::Acquire);
        let head = self.tx_mem.ctrl().local_head.value.load(Ordering::Acquire);
        Some(tail.wrapping_add(head))
    }

    fn poll_decision(c: &ShmConn) {
        match c.wire.seg.header().user[WORD_STATE].load(Ordering::Acquire) {
            STATE_ACCEPTED if c.enter_ring() => background::note_accepted(c.offer_id),
            STATE_DECLINED => c.fall_back("the server declined the ring"),
            STATE_REVOKED => c.fall_back("the server did not take the ring in time"),
            STATE_PENDING if c.wire.ctl_declined.load(Ordering::Acquire) => {
                // The daemon says nobody will take it; the word decides.
                Self::revoke(c);
            }
            _ => {}
        }
    }

    fn pending_room(c: &ShmConn) -> usize {
        PENDING_CAP.saturating_sub(c.wire.pending_sent.load(Ordering::Relaxed))
    }

    fn send_pending(c: &ShmConn, bufs: &[IoSlice<'_>]) -> Result<usize, Errno> {
        let budget = Self::pending_room(c);
        if budget == 0 {
            return Err(Errno(libc::EAGAIN));
        }
        let n = c.send_into_ring(bufs, budget, MODE_PENDING)?;
        c.wire.pending_sent.fetch_add(n, Ordering::Relaxed);
        Ok(n)
    }

    fn take_early(
        _c: &ShmConn,
        tx: &mut Option<Sender<ShmTransport>>,
    ) -> Result<Vec<u8>, RingError> {
        tx.as_mut()
            .map_or(Ok(Vec::new()), |tx| tx.take_unconsumed())
    }

    /// The bytes in ring 0 are only safe once the server took the ring
    /// (or, if it turns it down, once they were resent over TCP, which
    /// `settle` does). A server that has not decided by the connect
    /// timeout loses the race to our revoke: the bytes go over TCP.
    fn await_decision(c: &ShmConn, _closing: bool) {
        let limit = u64::from(crate::config::get().connect_timeout_ms) * 1_000_000;
        let start = sys::monotonic_ns();
        while c.settle() == MODE_PENDING && sys::monotonic_ns() - start < limit {
            c.check_tcp();
            if c.was_reset() {
                // The kernel connection is gone (a listener that closed
                // with it queued): the server's decision will never come.
                break;
            }
            // A socket that showed its EOF stays readable: then only the
            // doorbell is worth a sleep.
            let socket = if c.peer_gone() { -1 } else { c.tcp_fd() };
            let mut p = [
                libc::pollfd {
                    fd: c.wire.bell.fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: socket,
                    events: libc::POLLIN | libc::POLLRDHUP,
                    revents: 0,
                },
            ];
            // SAFETY: two valid pollfds (a negative fd is skipped); 5 ms
            // timeout; raw syscall.
            unsafe {
                crate::sys::sys_call!(
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
            c.wire.bell.drain();
        }
        if c.settle() == MODE_PENDING {
            Self::revoke(c);
        }
    }

    /// The receiver counts the bytes it consumed in the shared control
    /// block of the ring we write.
    fn peer_left_unread(c: &ShmConn, written: u64) -> bool {
        c.wire.tx_mem.ctrl().rx_stats.bytes.load(Ordering::Acquire) < written
    }

    /// Moves the state word from pending to revoked (a server that took
    /// the ring first wins, and the connection enters it), then acts on it.
    fn revoke(c: &ShmConn) -> bool {
        let word = &c.wire.seg.header().user[WORD_STATE];
        let _ = word.compare_exchange(
            STATE_PENDING,
            STATE_REVOKED,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
        Self::poll_decision(c);
        true
    }

    fn decline_from_ctl(c: &ShmConn, _reason: Option<&str>) {
        c.wire.ctl_declined.store(true, Ordering::Release);
        let _ = c.wire.bell.notify();
    }

    fn claim(c: &ShmConn) -> Result<(), Errno> {
        let w = c.wire.user();
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
                    "{}: in use by pid {cur}; a ring connection cannot be used by two processes (EBADFD)",
                    c.ends()
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

    fn share(&self) -> Option<Share<'_>> {
        let u = &self.seg.header().user;
        let at = match self.side {
            Side::Client => SHARE_CLIENT,
            Side::Server => SHARE_SERVER,
        };
        Some(Share {
            user: self.user(),
            lock: &u[at],
            ops: &u[at + 1],
            consumed: &u[at + 2],
            written: &u[at + 3],
            left: &u[at + 4],
            holders: &u[at + 5],
        })
    }

    fn is_user(c: &ShmConn) -> bool {
        c.wire.user().load(Ordering::Acquire) == process::pid() as u64
    }
}
