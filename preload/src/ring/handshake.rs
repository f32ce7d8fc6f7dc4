//! Setting a ring up for one connection (DESIGN "Control plane").
//!
//! Client, in connect(): bind (to learn the local port), create the segment
//! and both doorbells, and offer them through the daemon for the 4-tuple
//! *before* the SYN leaves; then let the kernel connect. The connection is
//! attached at once, in `Pending` mode (conn.rs).
//!
//! Server, in accept(): claim the offer with the accepted socket as proof,
//! map the segment, send the answer through the daemon, store
//! `STATE_ACCEPTED` in the segment and ring the client's bell. The daemon
//! makes Answer, Decline and expiry mutually exclusive, and the segment's
//! state word takes precedence over what the daemon says (conn.rs `settle`),
//! so the two sides can never disagree: a client falls back only while the
//! word is still pending *and* the daemon declared the offer declined or
//! expired, which rules out an answer.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use ringsock_proto::{Fds, Msg, RefuseReason};
use ringsock_ring::{EventFd, Notify, Receiver, RingConfig, Segment, Sender, ShmTransport};

use super::conn::{Parts, PeerBell, ShmConn, Side, STATE_ACCEPTED, STATE_DECLINED, WORD_STATE};
use super::tracked::Tracked;
use super::{background, ctl, fdspace};
use crate::attached::{Decision, Errno, TcpReason};
use crate::{config, sockaddr, sys};

/// Offer payload: what the segment is and which ring goes which way.
pub const PAYLOAD: &[u8] = b"ringsock-shm/1 c2s=0 s2c=1";

/// What carries a ring: shared memory or RDMA. The receiver's head goes
/// back to the sender by a store on the one and by a WRITE on the other,
/// so the lazy push interval's default differs (`default_gamma`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wire {
    Shm,
    Rdma,
}

/// The shim's ring parameters: geometry and batching from the knobs, the
/// batching intervals clamped to what the geometry allows (a 64-slot ring
/// cannot publish every 16 slots and push the head every 64).
pub fn ring_config(wire: Wire) -> RingConfig {
    let c = config::get();
    config_for(c.ring_slots, c.slot_size, wire)
}

/// Our batching knobs on a geometry (ours, or one chosen by the peer and
/// never trusted: the result is validated by the ring constructors).
pub(super) fn config_for(slots: u32, slot_size: u32, wire: Wire) -> RingConfig {
    let c = config::get();
    let half = (slots / 2).max(1);
    let alpha = c.alpha.min(half);
    RingConfig {
        slots,
        slot_size,
        alpha,
        beta: c.beta.min(alpha),
        gamma: c.gamma.unwrap_or(default_gamma(slots, wire)).min(half),
        max_record_slots: ringsock_ring::config::record_slots(slot_size).min(half),
        ..RingConfig::default()
    }
}

/// RINGSOCK_GAMMA when unset. On shared memory a push is a store: 64
/// slots, the sweep's choice (README, "Choosing the defaults"). On RDMA
/// each push is a WRITE; a quarter of the ring (1024 slots, 256 KiB)
/// still leaves the sender three quarters of it before it must wait, and
/// a sender that waits for space is pushed to at once whatever the
/// interval. Under Soft-RoCE a 64 KiB ping-pong posted 2.3 work requests
/// per message and side instead of 2.9; 4 KiB round trips were 2-18%
/// shorter in each of four boots, 64 KiB ones within the noise.
fn default_gamma(slots: u32, wire: Wire) -> u32 {
    match wire {
        Wire::Shm => 64,
        Wire::Rdma => (slots / 4).max(1),
    }
}

pub(super) fn dup_cloexec(fd: RawFd) -> Result<RawFd, Errno> {
    fdspace::dup_high(fd).map_err(Errno)
}

/// A doorbell of ours, at a high fd number.
pub(super) fn new_bell() -> Result<EventFd, ringsock_ring::RingError> {
    let b = EventFd::new()?;
    let fd = fdspace::high_or_emfile(b.into_owned()).map_err(ringsock_ring::RingError::Os)?;
    Ok(EventFd::from_owned(fd))
}

/// Set once the first "no resources for a ring" line is out: a program at
/// its fd or memory limit would otherwise log on every connect.
static NO_RESOURCES_LOGGED: AtomicBool = AtomicBool::new(false);

/// One warning per process when a ring cannot be built (fd limit, no
/// memfd, no memory); later connections say it at info level.
pub(super) fn log_no_resources(fd: RawFd, why: &str) {
    if NO_RESOURCES_LOGGED.swap(true, Ordering::Relaxed) {
        log::info!("fd {fd}: no ring ({why}); plain TCP");
    } else {
        log::warn!(
            "fd {fd}: no ring ({why}); this and later connections that cannot get one use plain TCP"
        );
    }
}

fn wildcard(dest: &SocketAddr, family: i32) -> SocketAddr {
    if family == libc::AF_INET6 || dest.is_ipv6() {
        SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), 0)
    } else {
        SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0)
    }
}

/// Makes sure `fd` has a local port (an unbound socket gets one the way
/// connect would have picked it: any address, ephemeral port).
pub(super) fn ensure_bound(fd: RawFd, dest: &SocketAddr) -> Option<SocketAddr> {
    let local = sockaddr::query(fd, false)?;
    if local.port() != 0 {
        return Some(local);
    }
    let family = crate::fdtable::get(fd).map_or(libc::AF_INET, |st| st.family());
    let any = wildcard(dest, family);
    let (ss, sl) = sockaddr::from_std(&any);
    // SAFETY: ss/sl describe a valid sockaddr of our own.
    let r = unsafe { libc::syscall(libc::SYS_bind, fd, &ss as *const libc::sockaddr_storage, sl) };
    if r < 0 {
        log::debug!("fd {fd}: bind before offer failed (errno {})", sys::errno());
        return None;
    }
    sockaddr::query(fd, false)
}

/// Client side: offer, connect, attach in `Pending` mode.
pub fn connect(
    fd: RawFd,
    dest: SocketAddr,
    real_connect: &mut dyn FnMut() -> Result<(), Errno>,
) -> (Result<(), Errno>, Decision) {
    let tcp = |real_connect: &mut dyn FnMut() -> Result<(), Errno>| {
        (real_connect(), Decision::Tcp(TcpReason::Declined))
    };
    let Some(local) = ensure_bound(fd, &dest) else {
        return tcp(real_connect);
    };
    let cfg = ring_config(Wire::Shm);
    let made = (|| {
        let seg = Segment::create(&cfg, 2)
            .map_err(|e| format!("cannot create its shared memory: {e}"))?;
        let cbell = new_bell().map_err(|e| format!("cannot create a doorbell eventfd: {e}"))?;
        let sbell = new_bell().map_err(|e| format!("cannot create a doorbell eventfd: {e}"))?;
        let memfd = seg
            .share_fd()
            .map_err(|e| format!("cannot duplicate the segment descriptor: {e}"))?;
        // Before the offer: once a server may have claimed the ring, a
        // client that cannot keep it any more has no way back to TCP.
        let tcp_dup = dup_cloexec(fd).map_err(|Errno(e)| {
            format!(
                "cannot duplicate the socket: {}",
                std::io::Error::from_raw_os_error(e)
            )
        })?;
        Ok::<_, String>((seg, cbell, sbell, memfd, tcp_dup))
    })();
    let (mut seg, cbell, sbell, memfd, tcp_dup) = match made {
        Ok(m) => m,
        Err(why) => {
            log_no_resources(fd, &why);
            return (real_connect(), Decision::Tcp(TcpReason::NoResources));
        }
    };
    // connect(2) to the unspecified address reaches this host's loopback;
    // the server's accepted socket shows that address, so offer for it.
    let server = match dest.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => {
            SocketAddr::new(Ipv4Addr::LOCALHOST.into(), dest.port())
        }
        IpAddr::V6(ip) if ip.is_unspecified() => {
            SocketAddr::new(Ipv6Addr::LOCALHOST.into(), dest.port())
        }
        _ => dest,
    };
    let msg = Msg::Offer {
        client: local,
        server,
        payload: PAYLOAD.to_vec(),
    };
    let fds = [fd, memfd.as_raw_fd(), cbell.fd(), sbell.fd()];
    let Some(offer_id) = offer(fd, dest, &msg, &fds) else {
        sys::close(tcp_dup);
        return tcp(real_connect);
    };
    drop(memfd);
    let res = real_connect();
    if !connect_started(&res, offer_id, tcp_dup) {
        return (res, Decision::Tcp(TcpReason::Declined));
    }
    let ring0 = seg.ring(0);
    let ring1 = seg.ring(1);
    let peer = Arc::new(sbell);
    let tx = Sender::new(
        ring0,
        ShmTransport::new(seg.ring(0), Some(Box::new(PeerBell(peer.clone())))),
        cfg,
    );
    let rx = Receiver::new(
        ring1,
        ShmTransport::new(seg.ring(1), Some(Box::new(PeerBell(peer)))),
        cfg,
    );
    let (Ok(tx), Ok(rx)) = (tx, rx) else {
        sys::close(tcp_dup);
        let _ = ctl::call(&Msg::Cancel { offer_id }, &[]);
        return (res, Decision::Tcp(TcpReason::Declined));
    };
    let report_memfd = seg.share_fd().ok();
    seg.close_fd();
    let conn = ShmConn::new(Parts {
        side: Side::Client,
        offer_id,
        local,
        peer: server,
        seg,
        tx,
        rx,
        bell: cbell,
        tcp: tcp_dup,
    });
    let tracked: Arc<dyn Tracked> = conn.clone();
    background::note_pending(&tracked);
    background::note_ring(fd, tracked, report_memfd);
    (res, Decision::Ring(conn))
}

/// Sends the client's offer; its id, or None (logged unless nobody
/// listens there) when the daemon refused it or did not answer.
pub(super) fn offer(fd: RawFd, dest: SocketAddr, offer: &Msg, fds: &[RawFd]) -> Option<u64> {
    match ctl::call(offer, fds) {
        Ok((Msg::OfferOk { offer_id }, _)) => Some(offer_id),
        Ok((Msg::OfferRefused { reason }, _)) => {
            if reason != RefuseReason::NoListener {
                log::info!("fd {fd}: offer to {dest} refused ({})", reason.as_str());
            }
            None
        }
        Ok((other, _)) => {
            log::warn!("fd {fd}: unexpected reply to an offer: {other:?}");
            None
        }
        Err(_) => None,
    }
}

/// After an accepted offer, whether the kernel connect is on its way. If
/// it failed outright no server can have claimed the offer: it is
/// withdrawn and the socket duplicate closed.
pub(super) fn connect_started(res: &Result<(), Errno>, offer_id: u64, tcp_dup: RawFd) -> bool {
    let started = matches!(
        res,
        Ok(()) | Err(Errno(libc::EINPROGRESS)) | Err(Errno(libc::EINTR))
    );
    if !started {
        sys::close(tcp_dup);
        let _ = ctl::call(&Msg::Cancel { offer_id }, &[]);
    }
    started
}

/// Claims the offer for the accepted socket `fd`: its id, payload and
/// descriptors, or None when there is none (or no daemon answers).
pub(super) fn claim(fd: RawFd) -> Option<(u64, Vec<u8>, Fds)> {
    match ctl::call(&Msg::Claim, &[fd]) {
        Ok((
            Msg::ClaimOk {
                offer_id, payload, ..
            },
            fds,
        )) => Some((offer_id, payload, fds)),
        Ok((Msg::NoOffer, _)) | Err(_) => None,
        Ok((other, _)) => {
            log::warn!("fd {fd}: unexpected reply to a claim: {other:?}");
            None
        }
    }
}

/// Server side: claim the offer for the accepted socket, if there is one.
pub fn accept(fd: RawFd, local: SocketAddr, peer: SocketAddr) -> Decision {
    let Some((offer_id, payload, fds)) = claim(fd) else {
        return Decision::Tcp(TcpReason::Declined);
    };
    if payload != PAYLOAD {
        decline(offer_id, "unknown offer payload");
        return Decision::Tcp(TcpReason::Declined);
    }
    let mut fds: Vec<OwnedFd> = fds.into_owned();
    if fds.len() != 3 {
        decline(offer_id, "wrong descriptor count");
        return Decision::Tcp(TcpReason::Declined);
    }
    let bells = (
        fdspace::high_or_emfile(fds.pop().expect("3 fds")),
        fdspace::high_or_emfile(fds.pop().expect("3 fds")),
    );
    let (Ok(sbell), Ok(cbell)) = bells else {
        decline(offer_id, "out of descriptors");
        log_no_resources(fd, "cannot keep the doorbells: Too many open files");
        return Decision::Tcp(TcpReason::NoResources);
    };
    let sbell = EventFd::from_owned(sbell);
    let cbell = Arc::new(EventFd::from_owned(cbell));
    let memfd = fds.pop().expect("3 fds");
    let mut seg = match Segment::attach(memfd) {
        Ok(s) if s.rings() == 2 => s,
        Ok(_) => {
            decline(offer_id, "segment without two rings");
            return Decision::Tcp(TcpReason::Declined);
        }
        Err(e) => {
            log::warn!("fd {fd}: the offered ring is unusable ({e:?}); plain TCP");
            decline(offer_id, "segment rejected");
            return Decision::Tcp(TcpReason::Declined);
        }
    };
    let refuse = |seg: &Segment, why: &str| {
        decline(offer_id, why);
        seg.header().user[WORD_STATE].store(STATE_DECLINED, Ordering::Release);
        let _ = cbell.notify();
        Decision::Tcp(TcpReason::Declined)
    };
    let (slots, slot_size) = seg.geometry();
    let cfg = config_for(slots, slot_size, Wire::Shm);
    let peer_bell = cbell.clone();
    let rx = Receiver::new(
        seg.ring(0),
        ShmTransport::new(seg.ring(0), Some(Box::new(PeerBell(peer_bell.clone())))),
        cfg,
    );
    let tx = Sender::new(
        seg.ring(1),
        ShmTransport::new(seg.ring(1), Some(Box::new(PeerBell(peer_bell)))),
        cfg,
    );
    let (Ok(tx), Ok(rx)) = (tx, rx) else {
        return refuse(&seg, "ring geometry rejected");
    };
    let Ok(tcp_dup) = dup_cloexec(fd) else {
        refuse(&seg, "out of descriptors");
        log_no_resources(fd, "cannot duplicate the socket: Too many open files");
        return Decision::Tcp(TcpReason::NoResources);
    };
    // The answer goes out without waiting for its reply: the daemon reads
    // this session's requests in order, so it handles the Answer right
    // after the Claim, long before the claim's deadline (the offer timeout,
    // counted from the claim) could pass; only a lost session can make it
    // fail, and the claim and the client's offer die with the session. The
    // reply is read (and checked) before our next request.
    if ctl::send_only(&Msg::Answer {
        offer_id,
        payload: Vec::new(),
    })
    .is_err()
    {
        sys::close(tcp_dup);
        return Decision::Tcp(TcpReason::Declined);
    }
    seg.header().user[WORD_STATE].store(STATE_ACCEPTED, Ordering::Release);
    let _ = cbell.notify();
    drop(cbell);
    let report_memfd = seg.share_fd().ok();
    seg.close_fd();
    let conn = ShmConn::new(Parts {
        side: Side::Server,
        offer_id,
        local,
        peer,
        seg,
        tx,
        rx,
        bell: sbell,
        tcp: tcp_dup,
    });
    background::note_ring(fd, conn.clone(), report_memfd);
    Decision::Ring(conn)
}

pub(super) fn decline(offer_id: u64, reason: &str) {
    let _ = ctl::call(
        &Msg::Decline {
            offer_id,
            reason: reason.to_owned(),
        },
        &[],
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn knobs_fit_the_geometry_and_the_wire() {
        // The tests run without RINGSOCK_* knobs: the defaults.
        let shm = config_for(4096, 256, Wire::Shm);
        let rdma = config_for(4096, 256, Wire::Rdma);
        assert_eq!((shm.alpha, shm.beta, shm.gamma), (16, 8, 64));
        assert_eq!((rdma.alpha, rdma.beta, rdma.gamma), (16, 8, 1024));
        // A record holds a 64 KiB write whatever the slot size.
        assert_eq!(rdma.max_record_slots, 257);
        assert_eq!(config_for(4096, 4096, Wire::Rdma).max_record_slots, 17);
        // A small ring clamps everything to half of it.
        let small = config_for(64, 256, Wire::Shm);
        assert_eq!(
            (small.alpha, small.gamma, small.max_record_slots),
            (16, 32, 32)
        );
        assert_eq!(config_for(64, 256, Wire::Rdma).gamma, 16);
        for c in [shm, rdma, small] {
            c.validate().unwrap();
        }
    }
}
