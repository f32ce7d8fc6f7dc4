//! The ring layer: the `Attacher` that moves TCP connections onto rings,
//! set up through the local `ringsock-ctl` daemon: shared memory to
//! processes of this host, RDMA verbs to other hosts. The crate root
//! installs it (`install`); the rest of the shim reaches it only through
//! `attached`.
//!
//! * `conn` — one ring connection (`RingConn`, the `AttachedConn`),
//!   generic over the `Wire` that carries it; leaving the ring mid-stream
//!   (`leave`) and the kernel socket's path after it (`tcp`);
//! * `shm`, `rdma` (feature `verbs`) — the two wires and their handshakes:
//!   offer (client, in connect) and claim/answer (server, in accept);
//!   zero-copy sends over RDMA (`rdma::zerocopy`);
//! * `setup` — what both handshakes share (ring parameters, the bind
//!   before an offer, daemon calls);
//! * `ctl` — this process's session with the daemon, listener registration;
//! * `background` — the one lazily started thread: flush timer, handshake
//!   follow-up, status reports;
//! * `watch` — the kernel sockets under the rings, which that thread
//!   watches for a peer that leaves, closes or dies;
//! * `tracked` — what the thread needs of a connection, whatever its wire;
//! * `sockio` — plain calls on the kernel socket under a connection, and
//!   the errno mapping of ring failures;
//! * `policy` — which destinations' connections are short, and go over
//!   plain TCP instead;
//! * `msgstart` — which sends start a message and go out unbatched;
//! * `local` — which destinations are on this host (only those get
//!   shared-memory rings).

mod background;
mod conn;
mod ctl;
mod local;
mod msgstart;
mod policy;
#[cfg(feature = "verbs")]
mod rdma;
mod setup;
mod shm;
mod sockio;
mod tracked;
mod watch;

use std::net::SocketAddr;
use std::os::fd::RawFd;

use crate::attached::{Attacher, Decision, Errno, TcpMemo, TcpReason};
use crate::sys;

pub use setup::ring_config;
pub use shm::handshake::PAYLOAD;
pub use shm::ShmConn;

/// Another host: a verbs ring when the transport is built in.
#[cfg(feature = "verbs")]
fn remote_connect(
    fd: RawFd,
    dest: SocketAddr,
    connect: &mut dyn FnMut() -> Result<(), Errno>,
) -> (Result<(), Errno>, Decision) {
    rdma::connect(fd, dest, connect)
}

/// Another host without the verbs transport: TCP, no daemon round trip.
#[cfg(not(feature = "verbs"))]
fn remote_connect(
    _fd: RawFd,
    _dest: SocketAddr,
    connect: &mut dyn FnMut() -> Result<(), Errno>,
) -> (Result<(), Errno>, Decision) {
    (connect(), Decision::Tcp(TcpReason::NoTransport))
}

/// An accepted connection from a peer that is not an address of this
/// namespace, whose offer the daemon's table lists: a client of another
/// namespace of this host (a shared-memory offer) or of another host (a
/// verbs offer). One claim, taken up by what was offered: a second claim
/// would find the offer already taken.
fn accept_listed(fd: RawFd, local: SocketAddr, peer: SocketAddr) -> Decision {
    let Some((offer_id, payload, fds)) = setup::claim(fd) else {
        return Decision::Tcp(TcpReason::Declined);
    };
    if payload == shm::handshake::PAYLOAD {
        return shm::handshake::accept_claimed(fd, local, peer, offer_id, fds);
    }
    #[cfg(feature = "verbs")]
    if payload.starts_with(rdma::PREFIX) {
        return rdma::accept_claimed(fd, local, peer, offer_id, &payload);
    }
    setup::decline(offer_id, "unknown offer payload");
    Decision::Tcp(TcpReason::Declined)
}

/// Same-host rings over shared memory, rings between hosts over verbs.
pub struct ShmAttacher;

pub static SHM: ShmAttacher = ShmAttacher;

impl Attacher for ShmAttacher {
    fn connect(
        &self,
        fd: RawFd,
        dest: SocketAddr,
        _nonblocking: bool,
        connect: &mut dyn FnMut() -> Result<(), Errno>,
        memo: &mut TcpMemo,
    ) -> (Result<(), Errno>, Decision) {
        if let Some(why) = policy::skip_reason(dest) {
            let res = connect();
            if matches!(res, Ok(()) | Err(Errno(libc::EINPROGRESS))) {
                // Its lifetime counts from its report's time (one clock
                // read for both).
                let (ticket, at) = background::note_tcp(fd, None, Some(dest), why)
                    .unwrap_or_else(|| (0, sys::monotonic_ns()));
                *memo = TcpMemo {
                    skipped: Some((dest, at)),
                    report: ticket,
                };
            }
            return (res, Decision::Tcp(why));
        }
        // An address of another namespace of this host that a shimmed
        // listener there serves also gets a shared-memory ring.
        let (res, d) = if local::is_local(dest.ip()) || ctl::served_here(dest) {
            shm::handshake::connect(fd, dest, connect)
        } else {
            remote_connect(fd, dest, connect)
        };
        if let Decision::Tcp(r) = &d {
            if matches!(res, Ok(()) | Err(Errno(libc::EINPROGRESS))) {
                if *r == TcpReason::Declined {
                    policy::turned_down(dest);
                }
                memo.report = background::note_tcp(fd, None, Some(dest), *r).map_or(0, |n| n.0);
            }
        }
        (res, d)
    }

    fn accept(
        &self,
        _listener: RawFd,
        fd: RawFd,
        local: SocketAddr,
        peer: SocketAddr,
        memo: &mut TcpMemo,
    ) -> Decision {
        let d = if local::is_local(peer.ip()) {
            shm::handshake::accept(fd, local, peer)
        } else if ctl::offer_listed(peer, local) {
            accept_listed(fd, local, peer)
        } else {
            #[cfg(feature = "verbs")]
            let d = rdma::accept(fd, local, peer);
            #[cfg(not(feature = "verbs"))]
            let d = Decision::Tcp(TcpReason::NoTransport);
            d
        };
        if let Decision::Tcp(r) = &d {
            memo.report = background::note_tcp(fd, Some(local), Some(peer), *r).map_or(0, |n| n.0);
        }
        d
    }

    fn flush_all(&self) {
        background::flush_all();
    }

    fn listening(&self, fd: RawFd, addr: SocketAddr) {
        ctl::add_listener(fd, addr);
        background::start();
    }

    fn listener_closed(&self, addr: SocketAddr) {
        ctl::forget_listener(addr);
    }

    fn tcp_decided(&self, fd: RawFd, peer: Option<SocketAddr>, reason: TcpReason) -> TcpMemo {
        TcpMemo {
            skipped: None,
            report: background::note_tcp(fd, None, peer, reason).map_or(0, |n| n.0),
        }
    }

    fn tcp_closed(&self, fd: RawFd, memo: TcpMemo) {
        if let Some((dest, since)) = memo.skipped {
            policy::skipped_closed(fd, dest, since);
        }
        background::note_tcp_closed(fd, memo.report);
    }

    fn sandboxed(&self) {
        background::stop();
    }
}

/// Installs the shared-memory ring layer (library constructor).
pub fn install() {
    crate::attached::register_attacher(&SHM);
}
