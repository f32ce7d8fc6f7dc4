//! Setting a shared-memory ring up for one connection (docs/design.md,
//! "Control plane").
//!
//! Client, in connect(): bind (to learn the local port), create the segment
//! and both doorbells, and offer them through the daemon for the 4-tuple
//! *before* the SYN leaves; then let the kernel connect. The connection is
//! attached at once, in `Pending` mode (ring/conn).
//!
//! Server, in accept(): claim the offer with the accepted socket as proof,
//! map the segment, move the segment's state word from pending to
//! `STATE_ACCEPTED` and ring the client's bell, then tell the daemon. The
//! state word alone decides: a client that gives up waiting (the claim
//! wait, a decline or an expiry the daemon reports, a close) moves it from
//! pending to `STATE_REVOKED` itself, so exactly one of the two moves
//! wins and the two sides never disagree, whatever the daemon knows.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use ringsock_proto::{Fds, Msg};
use ringsock_ring::{EventFd, Notify, Receiver, Segment, Sender, ShmTransport};

use super::super::conn::{Parts, RingConn};
use super::super::setup::{
    claim, config_for, connect_started, decline, dup_cloexec, ensure_bound, log_no_resources,
    new_bell, offer, report_fd, ring_config, Medium,
};
use super::super::tracked::Tracked;
use super::super::{background, ctl};
use super::{
    PeerBell, ShmConn, ShmWire, Side, STATE_ACCEPTED, STATE_DECLINED, STATE_PENDING, WORD_STATE,
};
use crate::attached::{Decision, Errno, TcpReason};
use crate::fdspace;

/// Offer payload: what the segment is and which ring goes which way.
pub const PAYLOAD: &[u8] = b"ringsock-shm/1 c2s=0 s2c=1";

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
    let cfg = ring_config(Medium::Shm);
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
        crate::fdspace::close(tcp_dup);
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
        crate::fdspace::close(tcp_dup);
        let _ = ctl::call(&Msg::Cancel { offer_id }, &[]);
        return (res, Decision::Tcp(TcpReason::Declined));
    };
    let report_memfd = report_fd(seg.share_fd());
    seg.close_fd();
    let conn: Arc<ShmConn> = RingConn::new(Parts {
        offer_id,
        local,
        peer: server,
        wire: ShmWire::new(Side::Client, seg, cbell),
        tx: Some(tx),
        rx: Some(rx),
        tcp: tcp_dup,
        pending: true,
    });
    let tracked: Arc<dyn Tracked> = conn.clone();
    background::note_pending(&tracked);
    background::note_ring(fd, tracked, report_memfd);
    (res, Decision::Ring(conn))
}

/// Server side: claim the offer for the accepted socket, if there is one.
pub fn accept(fd: RawFd, local: SocketAddr, peer: SocketAddr) -> Decision {
    // A translated connection's offer is under the original tuple; the
    // table then lists the server's address as a translation target.
    if !ctl::accepted_offer_may_exist(peer, local) {
        return Decision::Tcp(TcpReason::Declined);
    }
    let Some((offer_id, payload, fds)) = claim(fd) else {
        return Decision::Tcp(TcpReason::Declined);
    };
    if payload != PAYLOAD {
        decline(offer_id, "unknown offer payload");
        return Decision::Tcp(TcpReason::Declined);
    }
    accept_claimed(fd, local, peer, offer_id, fds)
}

/// Server side, once the daemon handed over a shared-memory offer
/// (`offer_id`, its payload `PAYLOAD`, with `fds`): attach to its segment.
pub fn accept_claimed(
    fd: RawFd,
    local: SocketAddr,
    peer: SocketAddr,
    offer_id: u64,
    fds: Fds,
) -> Decision {
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
        let _ = seg.header().user[WORD_STATE].compare_exchange(
            STATE_PENDING,
            STATE_DECLINED,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
        let _ = cbell.notify();
        Decision::Tcp(TcpReason::Declined)
    };
    let (slots, slot_size) = seg.geometry();
    let cfg = config_for(slots, slot_size, Medium::Shm);
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
    // The segment's state word decides: the client withdraws by moving it
    // from pending itself (it gave up waiting), so whoever moves it first
    // wins, and neither side ever uses a ring the other left.
    if seg.header().user[WORD_STATE]
        .compare_exchange(
            STATE_PENDING,
            STATE_ACCEPTED,
            Ordering::AcqRel,
            Ordering::Acquire,
        )
        .is_err()
    {
        log::debug!("fd {fd}: the client withdrew its ring before we took it; plain TCP");
        crate::fdspace::close(tcp_dup);
        decline(offer_id, "the client withdrew");
        return Decision::Tcp(TcpReason::Declined);
    }
    let _ = cbell.notify();
    // The daemon hears of it without a round trip (its reply is read
    // before our next request); the client learned it from the segment.
    let _ = ctl::send_only(&Msg::Answer {
        offer_id,
        payload: Vec::new(),
    });
    drop(cbell);
    let report_memfd = report_fd(seg.share_fd());
    seg.close_fd();
    let conn: Arc<ShmConn> = RingConn::new(Parts {
        offer_id,
        local,
        peer,
        wire: ShmWire::new(Side::Server, seg, sbell),
        tx: Some(tx),
        rx: Some(rx),
        tcp: tcp_dup,
        pending: false,
    });
    background::note_ring(fd, conn.clone(), report_memfd);
    Decision::Ring(conn)
}
