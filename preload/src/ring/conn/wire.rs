//! What differs between the media that carry a ring connection: the
//! `Wire` a `RingConn` is generic over (shared memory: `shm::ShmWire`,
//! RDMA verbs: `rdma::RdmaWire`), as the ring crate's `Transport` is the
//! medium under one ring end.

use std::io::IoSlice;
use std::os::fd::RawFd;

use ringsock_proto::Transport as StatusTransport;
use ringsock_ring::{RingError, Sender, Transport};

use super::{RingConn, Share};
use crate::attached::Errno;

/// Waiters a connection counts (see `RingConn::arm_waiter`).
#[derive(Default)]
pub struct Waiters {
    /// Waiters sleeping in a level-triggered poll on our wait fds.
    pub level: u32,
    /// Outstanding arms per direction (level and edge waiters).
    pub rx: u32,
    pub tx: u32,
}

impl Waiters {
    pub fn any_armed(&self) -> bool {
        self.rx > 0 || self.tx > 0
    }
}

/// The medium under a ring connection. Every hook takes the connection
/// itself, whose common state (modes, ring ends, kernel socket) is the
/// wire's to read and change through `RingConn`'s crate-visible API.
pub trait Wire: Sized + Send + Sync + 'static {
    /// The ring ends' transport.
    type Transport: Transport + Send;

    /// What `ringsock-ctl status` calls a ring of this wire.
    const STATUS: StatusTransport;

    /// Whether any ring failure ends the connection. A verbs queue pair in
    /// error carries nothing more; on shared memory only corruption is
    /// beyond repair.
    const FAILURES_ARE_FATAL: bool;

    /// Whether control-word writes complete later and must be reaped
    /// (verbs): readiness looks reap completions, a thread polls both ends
    /// until none is unreported before it sleeps, and so does the flush.
    const REAPS_COMPLETIONS: bool;

    /// Whether every send is visible to the peer when it returns, as on
    /// kernel TCP over loopback (shared memory: a publish is a store).
    /// Between hosts bytes take their time on any transport, and a stream
    /// of small sends coalesces until the next wait or the background
    /// flush.
    const PUBLISHES_EACH_SEND: bool;

    /// Whether the server's decision is readable in the ring's own memory
    /// before any byte it sends (shared memory: the segment's state word).
    /// Where it is not (verbs: it travels through the daemons), a client
    /// still pending when the server's FIN arrives must wait for it: the
    /// server may have taken the ring, written and closed, and its bytes
    /// be on their way.
    const DECISION_IN_SEGMENT: bool;

    /// Looks a spinning waiter takes back to back before it yields.
    fn spin_looks(&self) -> u32 {
        ringsock_ring::sleep::backoff::SPIN_TURNS
    }

    /// The reason column of a ring in status (the RDMA device, say).
    fn detail(&self) -> String {
        String::new()
    }

    /// Whether a word write of this end is still unreported.
    fn words_pending(_t: &mut Self::Transport) -> bool {
        false
    }

    /// Fails the transport if its requests stopped completing (now and
    /// then, from the background thread's wire check).
    fn check_stalled(_t: &mut Self::Transport) -> Result<(), RingError> {
        Ok(())
    }

    /// The doorbells a sleeper waits on besides the kernel socket.
    fn bell_fds(&self) -> [Option<RawFd>; 2];

    /// Drains every doorbell; true if any had rung.
    fn drain_bells(&self) -> bool;

    /// Rings our own doorbell: a waiter whose wake-up another waiter may
    /// have drained looks again.
    fn ring_own_bell(&self);

    /// Before a waiter arms, with the waiter counts held.
    fn before_arm(_c: &RingConn<Self>, _w: &Waiters) {}

    /// A number that changes with every arrival of data or space (epoll's
    /// edge-triggered reports), or None where the wire does not track it.
    fn event_seq(&self) -> Option<u64> {
        None
    }

    /// While pending: looks for the server's decision where the wire
    /// carries it itself. Cheap.
    fn poll_decision(c: &RingConn<Self>);

    /// While pending: how many more bytes may be sent before the decision.
    fn pending_room(c: &RingConn<Self>) -> usize;

    /// While pending: takes bytes the server will find first if it takes
    /// the ring, and that a fall-back resends over TCP.
    fn send_pending(c: &RingConn<Self>, bufs: &[IoSlice<'_>]) -> Result<usize, Errno>;

    /// Falling back: the bytes sent while pending, in order, taken out of
    /// wherever they wait (`tx` is the locked sender slot).
    fn take_early(
        c: &RingConn<Self>,
        tx: &mut Option<Sender<Self::Transport>>,
    ) -> Result<Vec<u8>, RingError>;

    /// Waits, a bounded time, for the server's decision (`closing`: the
    /// program closed its socket meanwhile).
    fn await_decision(c: &RingConn<Self>, closing: bool);

    /// The client stops waiting for the server (the claim wait passed):
    /// true when the wire settled it itself (the connection fell back, or
    /// entered the ring the server took first); false leaves it to the
    /// daemon's verdict.
    fn revoke(_c: &RingConn<Self>) -> bool {
        false
    }

    /// The daemon says the server declined (with its reason) or never
    /// took the ring.
    fn decline_from_ctl(c: &RingConn<Self>, reason: Option<&str>);

    /// The daemon handed over the server's answer; true if that ended the
    /// handshake (shared memory learns it from its segment instead).
    fn answered(_c: &RingConn<Self>, _payload: &[u8]) -> bool {
        false
    }

    /// Whether only the daemon can end this handshake, so the background
    /// thread asks every tick.
    fn urgent_follow_up(_c: &RingConn<Self>) -> bool {
        false
    }

    /// The peer's socket closed without a word on the ring: whether it
    /// left any of the `written` bytes we sent unread (TCP would have
    /// reset the connection then). False where the wire cannot tell.
    fn peer_left_unread(_c: &RingConn<Self>, _written: u64) -> bool {
        false
    }

    /// Before this process's first use in the current fork generation.
    fn claim(c: &RingConn<Self>) -> Result<(), Errno>;

    /// Whether this process is the one that uses the connection (it may
    /// flush and end it); a forked copy of a sender's state must not.
    fn is_user(c: &RingConn<Self>) -> bool;

    /// Writes one buffer into the ring (verbs may send it zero-copy).
    fn write(tx: &mut Sender<Self::Transport>, buf: &[u8]) -> Result<usize, RingError> {
        tx.write(buf)
    }

    /// The words through which the processes holding this side after a
    /// fork coordinate (`share`), in memory they all map; None where the
    /// wire has none (a forked copy then cannot use the connection).
    fn share(&self) -> Option<Share<'_>> {
        None
    }

    /// Whether this process may take over a side it finds another process
    /// using (`share`): false where the ring ends belong to one process
    /// (a verbs queue pair), which a forked copy then leaves instead.
    fn can_take_over(_c: &RingConn<Self>) -> bool {
        true
    }

    /// The process is dropping the connection: whether the ring ends
    /// belong to it, or must be forgotten (a forked child must not
    /// destroy its parent's verbs objects).
    fn owns_ends(&self) -> bool {
        true
    }
}
