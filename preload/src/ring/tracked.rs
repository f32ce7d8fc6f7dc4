//! What the background thread (flush timer, handshake follow-up, status
//! reports) needs of a ring connection, whatever wire carries it.

use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::Mutex;

use ringsock_proto::Transport;

use super::sockio::lock;
use crate::{process, sys};

/// Bookkeeping of one connection's status reports.
pub struct ReportState {
    /// The fd number under which the connection was reported.
    pub fd: AtomicI32,
    /// The daemon was told about this connection (so it must hear of its
    /// end).
    pub reported: AtomicBool,
    /// The process that reported it (a forked child that takes the
    /// connection over reports it again, as its own).
    pub reporter_pid: AtomicI32,
    /// The local address it was reported with (a client offered from the
    /// wildcard address; the kernel picked the real one later).
    pub local: Mutex<Option<SocketAddr>>,
    /// When the client started waiting for the server's decision.
    pub born_ns: AtomicU64,
    /// The process that made the offer (only it can ask the daemon).
    pub offer_pid: i32,
    /// The connection's registration with the background thread's socket
    /// watch (`watch`; 0: none), and the process that made it.
    pub watch_id: AtomicU64,
    pub watch_pid: AtomicI32,
}

impl ReportState {
    pub fn new() -> ReportState {
        ReportState {
            fd: AtomicI32::new(-1),
            reported: AtomicBool::new(false),
            reporter_pid: AtomicI32::new(0),
            local: Mutex::new(None),
            born_ns: AtomicU64::new(sys::monotonic_ns()),
            offer_pid: process::pid(),
            watch_id: AtomicU64::new(0),
            watch_pid: AtomicI32::new(0),
        }
    }

    /// The local address the daemon knows, else `fallback`.
    pub fn local_or(&self, fallback: SocketAddr) -> SocketAddr {
        lock(&self.local).unwrap_or(fallback)
    }

    pub fn born_ns(&self) -> u64 {
        self.born_ns.load(Ordering::Relaxed)
    }
}

/// A ring connection as the background thread sees it.
pub trait Tracked: Send + Sync {
    /// The daemon's id of the offer that set it up.
    fn offer_id(&self) -> u64;
    fn local(&self) -> SocketAddr;
    fn peer(&self) -> SocketAddr;
    fn report_state(&self) -> &ReportState;
    /// What status shows: the ring's transport, or `Tcp` after a fallback.
    fn transport(&self) -> Transport;
    /// The reason column for a ring (the RDMA device, say); may be empty.
    fn ring_detail(&self) -> String {
        String::new()
    }
    /// Our duplicate of the connection's kernel socket (-1 once released).
    fn socket_fd(&self) -> RawFd;
    /// The kernel socket has news (the background thread's watch): a
    /// leave header, the peer's close or reset.
    fn check_socket(&self);
    /// Pushes batched bytes out (may wait for a lock the program holds).
    fn flush_ring(&self);
    /// Whether the background thread must look for a failed wire now and
    /// then (`check_wire`): the wire's failures wake no sleeper for sure.
    fn wire_checked(&self) -> bool {
        false
    }
    /// Looks for a failed wire and leaves the ring over it (skipping a
    /// connection in use).
    fn check_wire(&self) {}
    /// Background variant: skips a connection in use; false if skipped
    /// or if it must be flushed again (it stays queued).
    fn try_flush_ring(&self) -> bool;
    fn is_released(&self) -> bool;
    /// Looks at the server's decision; true while there is none.
    fn still_pending(&self) -> bool;
    /// The claim wait passed: stop waiting where the wire can settle it
    /// alone (`Wire::revoke`); false leaves it to the daemon.
    fn revoke(&self) -> bool {
        false
    }
    /// The daemon says the server declined (with its reason) or never
    /// claimed the offer.
    fn decline_from_ctl(&self, reason: Option<&str>);
    /// The daemon handed over the server's answer. Returns true if that
    /// ended the handshake (the connection no longer needs following up);
    /// shared memory learns the answer from its segment instead.
    fn answered(&self, _payload: &[u8]) -> bool {
        false
    }
    /// Whether the handshake must be followed up at once and often: only
    /// the daemon can tell this client the answer, and its first bytes
    /// wait for it.
    fn urgent_follow_up(&self) -> bool {
        false
    }
}
