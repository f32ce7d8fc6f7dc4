//! Setting a verbs ring up between hosts (docs/design.md, "Control plane").
//!
//! Client, in connect(): open the device, create this end (registered
//! region, queue pair in RESET), offer its parameters through the local
//! daemon, which forwards them to the server host's daemon *before* the
//! SYN leaves; then let the kernel connect. The connection is attached at
//! once, in `Pending` mode, and connected when the answer arrives.
//!
//! Server, in accept(): claim the offer with the accepted socket as proof
//! (only its owner can), create this end sized for the client's rings,
//! connect the queue pair to the client's, and answer with our
//! parameters. From then on the server may write: until the client's
//! queue pair is ready, RC retransmits. Any failure before the answer is
//! a decline, and both sides stay TCP; the daemons make answer, decline
//! and expiry mutually exclusive.

use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::Arc;

use ringsock_proto::Msg;
use ringsock_ring::transport::verbs::{PullKnobs, QpParams, VerbsConn};

use super::super::conn::{Parts, RingConn};
use super::super::setup::{
    claim, config_for, connect_started, decline, dup_cloexec, ensure_bound, log_no_resources,
    new_bell, offer, report_fd, ring_config, Medium,
};
use super::super::tracked::Tracked;
use super::super::{background, ctl};
use super::wire::{RdmaConn, RdmaWire};
use super::{describe, device_for, host_without_rdma, NO_DEVICE_REASON, PREFIX};
use crate::attached::{Decision, Errno, TcpReason};
use crate::config;

/// This end's half of a verbs ring. The shim's senders always push
/// (`PullKnobs::default()`): in pull mode a ring's unfetched data lives
/// in the sending process, which may exit without closing its socket (no
/// hook sees that), and a close with unfetched data lost ring data in
/// the Soft-RoCE guest (docs/limits.md). Pull mode is the verbs ring
/// library's.
fn new_end(
    dev: &Arc<ringsock_ring::transport::verbs::Device>,
    out_cfg: ringsock_ring::RingConfig,
    in_cfg: ringsock_ring::RingConfig,
) -> Result<VerbsConn, ringsock_ring::RingError> {
    static SAID: std::sync::Once = std::sync::Once::new();
    if let Some(v) = &config::get().verbs_mode {
        if v != "push" {
            SAID.call_once(|| {
                log::warn!(
                    "RINGSOCK_VERBS_MODE={v:?} ignored: the shim's rdma connections always push \
                     (pull mode belongs to the verbs ring library; README limits)"
                )
            });
        }
    }
    VerbsConn::new(dev, out_cfg, in_cfg, PullKnobs::default())
}

fn payload(p: &QpParams) -> Vec<u8> {
    let mut v = PREFIX.to_vec();
    v.extend_from_slice(&p.encode());
    v
}

/// Client side: offer, connect, attach in `Pending` mode.
pub fn connect(
    fd: RawFd,
    dest: SocketAddr,
    real_connect: &mut dyn FnMut() -> Result<(), Errno>,
) -> (Result<(), Errno>, Decision) {
    if host_without_rdma(dest.ip()) {
        return (real_connect(), Decision::Tcp(TcpReason::Declined));
    }
    let dev = match device_for(dest.ip()) {
        Ok(d) => d,
        Err(_) => return (real_connect(), Decision::Tcp(TcpReason::NoTransport)),
    };
    let Some(local) = ensure_bound(fd, &dest) else {
        return (real_connect(), Decision::Tcp(TcpReason::Declined));
    };
    let cfg = ring_config(Medium::Rdma);
    let made = (|| {
        let vc = new_end(&dev, cfg, cfg).map_err(|e| format!("{e}"))?;
        let wake = new_bell().map_err(|e| format!("cannot create an eventfd: {e}"))?;
        // Before the offer: once a server may have claimed the ring, a
        // client that cannot keep it any more has no way back to TCP.
        let tcp_dup = dup_cloexec(fd).map_err(|Errno(e)| {
            format!(
                "cannot duplicate the socket: {}",
                std::io::Error::from_raw_os_error(e)
            )
        })?;
        Ok::<_, String>((vc, wake, tcp_dup))
    })();
    let (vc, wake, tcp_dup) = match made {
        Ok(m) => m,
        Err(why) => {
            log_no_resources(fd, &why);
            return (real_connect(), Decision::Tcp(TcpReason::NoResources));
        }
    };
    let msg = Msg::Offer {
        client: local,
        server: dest,
        payload: payload(&vc.local_params()),
    };
    let Some(offer_id) = offer(fd, dest, &msg, &[fd]) else {
        crate::fdspace::close(tcp_dup);
        return (real_connect(), Decision::Tcp(TcpReason::Declined));
    };
    let res = real_connect();
    if !connect_started(&res, offer_id, tcp_dup) {
        return (res, Decision::Tcp(TcpReason::Declined));
    }
    // The region's header and counters, for status (read-only there).
    let stats_fd = report_fd(vc.share_fd());
    let conn: Arc<RdmaConn> = RingConn::new(Parts {
        offer_id,
        local,
        peer: dest,
        wire: RdmaWire::pending(describe(&dev), vc, wake),
        tx: None,
        rx: None,
        tcp: tcp_dup,
        pending: true,
    });
    let tracked: Arc<dyn Tracked> = conn.clone();
    background::note_pending(&tracked);
    background::note_ring(fd, tracked, stats_fd);
    (res, Decision::Ring(conn))
}

/// Server side: claim the offer for the accepted socket, if there is one.
pub fn accept(fd: RawFd, local: SocketAddr, peer: SocketAddr) -> Decision {
    if !ctl::offer_may_exist(peer, local) {
        return Decision::Tcp(TcpReason::Declined);
    }
    let Some((offer_id, offered, _)) = claim(fd) else {
        return Decision::Tcp(TcpReason::Declined);
    };
    accept_claimed(fd, local, peer, offer_id, &offered)
}

/// Server side, once the daemon handed over offer `offer_id` of a client
/// on another host, whose payload is `offered`: the verbs end.
pub fn accept_claimed(
    fd: RawFd,
    local: SocketAddr,
    peer: SocketAddr,
    offer_id: u64,
    offered: &[u8],
) -> Decision {
    let client = match offered.strip_prefix(PREFIX).map(QpParams::decode) {
        Some(Ok(p)) => p,
        Some(Err(e)) => {
            log::warn!("fd {fd}: the client's verbs parameters are unusable ({e})");
            decline(offer_id, "verbs parameters rejected");
            return Decision::Tcp(TcpReason::Declined);
        }
        None => {
            decline(offer_id, "unknown offer payload");
            return Decision::Tcp(TcpReason::Declined);
        }
    };
    let dev = match device_for(peer.ip()) {
        Ok(d) => d,
        Err(_) => {
            decline(offer_id, NO_DEVICE_REASON);
            return Decision::Tcp(TcpReason::NoTransport);
        }
    };
    // Our outgoing ring is the client's incoming one and vice versa, with
    // the client's geometry and our own batching knobs.
    let out_cfg = config_for(client.in_ring.slots, client.in_ring.slot_size, Medium::Rdma);
    let in_cfg = config_for(
        client.out_ring.slots,
        client.out_ring.slot_size,
        Medium::Rdma,
    );
    let made = (|| {
        let vc = new_end(&dev, out_cfg, in_cfg).map_err(|e| (format!("{e}"), true))?;
        let wake = new_bell().map_err(|e| (format!("cannot create an eventfd: {e}"), true))?;
        let tcp_dup = dup_cloexec(fd).map_err(|Errno(e)| {
            (
                format!(
                    "cannot duplicate the socket: {}",
                    std::io::Error::from_raw_os_error(e)
                ),
                true,
            )
        })?;
        let ours = vc.local_params();
        let bell_fd = vc.doorbell_fd();
        match vc.connect(&client) {
            Ok(c) => Ok((c, ours, bell_fd, wake, tcp_dup)),
            Err(e) => {
                crate::fdspace::close(tcp_dup);
                Err((format!("{e}"), false))
            }
        }
    })();
    let (connected, ours, bell_fd, wake, tcp_dup) = match made {
        Ok(m) => m,
        Err((why, resources)) => {
            decline(offer_id, "the server could not set up its end");
            return if resources {
                log_no_resources(fd, &why);
                Decision::Tcp(TcpReason::NoResources)
            } else {
                log::warn!("fd {fd}: cannot connect to {peer}'s queue pair ({why}); plain TCP");
                Decision::Tcp(TcpReason::Declined)
            };
        }
    };
    // Between hosts only the daemons know both sides: the ring is ours
    // once the daemon took the answer. An offer that expired meanwhile (or
    // that the client withdrew) refuses it, and both ends stay TCP.
    match ctl::call(
        &Msg::Answer {
            offer_id,
            payload: payload(&ours),
        },
        &[],
    ) {
        Ok((Msg::Ok, _)) => {}
        other => {
            log::debug!("fd {fd}: the answer was not taken ({other:?}); plain TCP");
            crate::fdspace::close(tcp_dup);
            return Decision::Tcp(TcpReason::Declined);
        }
    }
    let stats_fd = report_fd(connected.share_fd());
    let conn: Arc<RdmaConn> = RingConn::new(Parts {
        offer_id,
        local,
        peer,
        wire: RdmaWire::connected(describe(&dev), connected.bell, bell_fd, wake),
        tx: Some(connected.tx),
        rx: Some(connected.rx),
        tcp: tcp_dup,
        pending: false,
    });
    background::note_ring(fd, conn.clone(), stats_fd);
    Decision::Ring(conn)
}
