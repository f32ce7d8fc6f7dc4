//! Offers between hosts: two network namespaces ("hosts" A and B) joined by
//! a veth pair, a real daemon in each (`ip netns exec`), and test sockets
//! made inside the namespaces (a thread that entered the namespace with
//! setns creates them; a socket stays in the namespace it was made in).
//! The daemons talk over the real ctl-to-ctl TCP port.
//!
//! Every test skips, saying why, when network namespaces are unavailable.

mod common;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, OwnedFd};
use std::thread::sleep;
use std::time::{Duration, Instant};

use common::*;
use ringsock_integration::netns::{in_ns, Hosts};
use ringsock_proto::{frame, Client, ErrorCode, Msg, RefuseReason};

const PORT: &str = "7471";
const PEER_TIMEOUT_MS: u64 = 300;

fn daemon_in(ns: &str, extra: &[&str]) -> Daemon {
    let timeout = PEER_TIMEOUT_MS.to_string();
    let mut args = vec!["--peer-port", PORT, "--peer-timeout-ms", &timeout];
    args.extend_from_slice(extra);
    Daemon::start_in(Some(ns), &args)
}

fn sa(ip: Ipv4Addr, port: u16) -> SocketAddr {
    SocketAddr::new(ip.into(), port)
}

/// A listener on B registered with B's daemon by `session`.
fn listen_b(h: &Hosts, session: &mut Client) -> (TcpListener, SocketAddr) {
    let l = in_ns(&h.b, || TcpListener::bind(sa(h.ip_b, 0)).unwrap());
    let addr = l.local_addr().unwrap();
    let (r, _) = call(session, &Msg::ListenerAdd { addr }, &[l.as_raw_fd()]);
    assert_eq!(r, Msg::Ok);
    (l, addr)
}

/// A client socket on A bound like the shim binds it: wildcard address,
/// ephemeral port.
fn client_a(h: &Hosts) -> (OwnedFd, SocketAddr) {
    let sock = in_ns(&h.a, || bound_tcp("0.0.0.0:0".parse().unwrap()));
    let local = local_addr(sock.as_raw_fd());
    (sock, local)
}

/// Offers from A and returns the reply and how long it took.
fn offer(
    c: &mut Client,
    sock: &OwnedFd,
    client: SocketAddr,
    server: SocketAddr,
    payload: &[u8],
) -> (Msg, Duration) {
    let t = Instant::now();
    let m = Msg::Offer {
        client,
        server,
        payload: payload.to_vec(),
    };
    let (r, _) = call(c, &m, &[sock.as_raw_fd()]);
    (r, t.elapsed())
}

fn collect(c: &mut Client, offer_id: u64) -> Msg {
    call(c, &Msg::Collect { offer_id }, &[]).0
}

/// Polls Collect until it is no longer Pending.
fn collect_final(c: &mut Client, offer_id: u64) -> Msg {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let r = collect(c, offer_id);
        if r != Msg::Pending || Instant::now() > deadline {
            return r;
        }
        sleep(Duration::from_millis(10));
    }
}

#[test]
fn offer_across_hosts_is_claimed_answered_and_collected() {
    let Some(h) = Hosts::new() else { return };
    let da = daemon_in(&h.a, &[]);
    let db = daemon_in(&h.b, &[]);
    let mut server = db.session();
    let (l, server_addr) = listen_b(&h, &mut server);
    let mut client = da.session();
    let (sock, client_addr) = client_a(&h);

    // The offer travels to B's ctl and back before the reply.
    let (r, took) = offer(&mut client, &sock, client_addr, server_addr, b"qp 17");
    let Msg::OfferOk { offer_id } = r else {
        panic!(
            "offer refused: {r:?}\nA:\n{}\nB:\n{}",
            da.log_text(),
            db.log_text()
        )
    };
    assert!(took < Duration::from_millis(PEER_TIMEOUT_MS), "{took:?}");
    assert_eq!(collect(&mut client, offer_id), Msg::Pending);
    // A duplicate for the same 4-tuple is refused on A already.
    let (dup, _) = offer(&mut client, &sock, client_addr, server_addr, b"again");
    assert_eq!(
        dup,
        Msg::OfferRefused {
            reason: RefuseReason::Duplicate
        }
    );

    connect(&sock, server_addr).unwrap();
    let (accepted, peer) = l.accept().unwrap();
    assert_eq!(peer, sa(h.ip_a, client_addr.port()));

    // The forwarded record on A is not claimable there: presenting the
    // client's own connected socket finds nothing.
    assert_eq!(
        call(&mut client, &Msg::Claim, &[sock.as_raw_fd()]).0,
        Msg::NoOffer
    );
    // A process on B that does not own the accepted socket can only
    // present some other socket: no offer for it.
    let mut other = db.session();
    let (l2, other_addr) = listen_b(&h, &mut other);
    let s2 = in_ns(&h.b, || TcpStream::connect(other_addr).unwrap());
    let (a2, _) = l2.accept().unwrap();
    assert_eq!(
        call(&mut other, &Msg::Claim, &[a2.as_raw_fd()]).0,
        Msg::NoOffer
    );
    assert_eq!(
        call(&mut other, &Msg::Claim, &[s2.as_raw_fd()]).0,
        Msg::NoOffer
    );

    // The owner claims: the payload crossed, no descriptors, no pid.
    let (r, fds) = call(&mut server, &Msg::Claim, &[accepted.as_raw_fd()]);
    let Msg::ClaimOk {
        offer_id: b_id,
        client_pid,
        payload,
    } = r
    else {
        panic!("claim failed: {r:?}\nB:\n{}", db.log_text())
    };
    assert_eq!((client_pid, payload.as_slice()), (0, &b"qp 17"[..]));
    assert!(fds.into_owned().is_empty());
    // Claimed on B, so on A too: the client may no longer withdraw.
    wait_until("A learns of the claim", || {
        da.log_text()
            .contains(&format!("offer {offer_id} claimed on the server's host"))
    });
    assert!(matches!(
        call(&mut client, &Msg::Cancel { offer_id }, &[]).0,
        Msg::Error {
            code: ErrorCode::BadState,
            ..
        }
    ));
    assert_eq!(collect(&mut client, offer_id), Msg::Pending);

    // Descriptors cannot cross hosts.
    let bell = eventfd();
    let with_fd = Msg::Answer {
        offer_id: b_id,
        payload: b"x".to_vec(),
    };
    assert!(matches!(
        call(&mut server, &with_fd, &[bell.as_raw_fd()]).0,
        Msg::Error {
            code: ErrorCode::BadRequest,
            ..
        }
    ));
    let answer = Msg::Answer {
        offer_id: b_id,
        payload: b"rkey 99".to_vec(),
    };
    assert_eq!(call(&mut server, &answer, &[]).0, Msg::Ok);
    assert_eq!(
        collect_final(&mut client, offer_id),
        Msg::Answered {
            payload: b"rkey 99".to_vec()
        }
    );
    // Handed out once.
    assert!(matches!(
        collect(&mut client, offer_id),
        Msg::Error {
            code: ErrorCode::NotFound,
            ..
        }
    ));
    // The connection between the ctls is cached: a second offer reuses it.
    let (sock2, c2) = client_a(&h);
    let (r, _) = offer(&mut client, &sock2, c2, server_addr, b"");
    assert!(matches!(r, Msg::OfferOk { .. }), "{r:?}");
    assert_eq!(da.log_text().matches("connecting to").count(), 1);
}

#[test]
fn decline_cancel_expiry_and_lost_claimer_reach_the_other_host() {
    let Some(h) = Hosts::new() else { return };
    let da = daemon_in(&h.a, &[]);
    let db = daemon_in(&h.b, &["--offer-timeout-ms", "400"]);
    let mut server = db.session();
    let (l, server_addr) = listen_b(&h, &mut server);
    let mut client = da.session();

    // Declined on B -> Declined on A.
    let (sock, ca) = client_a(&h);
    let Msg::OfferOk { offer_id } = offer(&mut client, &sock, ca, server_addr, b"").0 else {
        panic!()
    };
    connect(&sock, server_addr).unwrap();
    let (acc, _) = l.accept().unwrap();
    let Msg::ClaimOk { offer_id: b_id, .. } = call(&mut server, &Msg::Claim, &[acc.as_raw_fd()]).0
    else {
        panic!()
    };
    let decline = Msg::Decline {
        offer_id: b_id,
        reason: "no rdma device".into(),
    };
    assert_eq!(call(&mut server, &decline, &[]).0, Msg::Ok);
    assert_eq!(
        collect_final(&mut client, offer_id),
        Msg::Declined {
            reason: "no rdma device".into()
        }
    );

    // Cancelled on A before the claim -> gone on B.
    let (sock, ca) = client_a(&h);
    let Msg::OfferOk { offer_id } = offer(&mut client, &sock, ca, server_addr, b"").0 else {
        panic!()
    };
    assert_eq!(call(&mut client, &Msg::Cancel { offer_id }, &[]).0, Msg::Ok);
    connect(&sock, server_addr).unwrap();
    let (acc, _) = l.accept().unwrap();
    wait_until("B drops the cancelled offer", || {
        call(&mut server, &Msg::Claim, &[acc.as_raw_fd()]).0 == Msg::NoOffer
    });

    // Never claimed: expires on B (400 ms) -> Expired on A.
    let (sock, ca) = client_a(&h);
    let Msg::OfferOk { offer_id } = offer(&mut client, &sock, ca, server_addr, b"").0 else {
        panic!()
    };
    assert_eq!(collect_final(&mut client, offer_id), Msg::Expired);

    // The claiming process goes away -> Declined on A.
    let (sock, ca) = client_a(&h);
    let Msg::OfferOk { offer_id } = offer(&mut client, &sock, ca, server_addr, b"").0 else {
        panic!()
    };
    connect(&sock, server_addr).unwrap();
    let (acc, _) = l.accept().unwrap();
    let mut claimer = db.session();
    assert!(matches!(
        call(&mut claimer, &Msg::Claim, &[acc.as_raw_fd()]).0,
        Msg::ClaimOk { .. }
    ));
    drop(claimer);
    assert!(matches!(
        collect_final(&mut client, offer_id),
        Msg::Declined { .. }
    ));

    // The offering process goes away -> its offer is withdrawn on B.
    let mut gone = da.session();
    let (sock, ca) = client_a(&h);
    assert!(matches!(
        offer(&mut gone, &sock, ca, server_addr, b"").0,
        Msg::OfferOk { .. }
    ));
    drop(gone);
    connect(&sock, server_addr).unwrap();
    let (acc, _) = l.accept().unwrap();
    wait_until("B drops the offer of a closed session", || {
        call(&mut server, &Msg::Claim, &[acc.as_raw_fd()]).0 == Msg::NoOffer
    });

    // B's ctl dies with an offer open there: A settles it as Declined.
    let (sock, ca) = client_a(&h);
    let Msg::OfferOk { offer_id } = offer(&mut client, &sock, ca, server_addr, b"").0 else {
        panic!()
    };
    drop(db);
    assert!(matches!(
        collect_final(&mut client, offer_id),
        Msg::Declined { .. }
    ));
}

#[test]
fn host_without_ctl_is_refused_at_once_and_remembered() {
    let Some(h) = Hosts::new() else { return };
    let da = daemon_in(&h.a, &[]);
    let mut client = da.session();
    // B has a listener but no ctl: the connect is refused (RST).
    let l = in_ns(&h.b, || TcpListener::bind(sa(h.ip_b, 0)).unwrap());
    let server_addr = l.local_addr().unwrap();
    let (sock, ca) = client_a(&h);
    let (r, took) = offer(&mut client, &sock, ca, server_addr, b"");
    assert_eq!(
        r,
        Msg::OfferRefused {
            reason: RefuseReason::NoListener
        }
    );
    assert!(
        took < Duration::from_millis(PEER_TIMEOUT_MS + 200),
        "{took:?}"
    );
    // A ctl starts on B, with a listener: A still remembers B as down.
    let db = daemon_in(&h.b, &[]);
    let mut server = db.session();
    let (_l2, server2) = listen_b(&h, &mut server);
    let (sock, ca) = client_a(&h);
    let (r, took) = offer(&mut client, &sock, ca, server2, b"");
    assert_eq!(
        r,
        Msg::OfferRefused {
            reason: RefuseReason::NoListener
        }
    );
    assert!(took < Duration::from_millis(100), "{took:?}");
    assert!(da.log_text().contains("(cached)"), "{}", da.log_text());
    assert_eq!(da.log_text().matches("connecting to").count(), 1);

    // A daemon with a short retry interval tries again afterwards.
    drop(client);
    drop(da);
    let da = daemon_in(&h.a, &["--peer-retry-ms", "200"]);
    let mut client = da.session();
    let (_l3, server3) = listen_b(&h, &mut server);
    // First: a host with no ctl at all (nobody on that address).
    let (sock, ca) = client_a(&h);
    let (r, took) = offer(&mut client, &sock, ca, sa(h.ip_nobody(), 80), b"");
    assert_eq!(
        r,
        Msg::OfferRefused {
            reason: RefuseReason::NoListener
        }
    );
    // Unanswered SYNs (no host there): refused after the peer timeout.
    assert!(
        took >= Duration::from_millis(PEER_TIMEOUT_MS - 20)
            && took < Duration::from_millis(PEER_TIMEOUT_MS + 300),
        "{took:?}"
    );
    let (sock, ca) = client_a(&h);
    assert!(matches!(
        offer(&mut client, &sock, ca, server3, b"").0,
        Msg::OfferOk { .. }
    ));
}

#[test]
fn ctl_that_accepts_but_never_answers_is_bounded_and_cached() {
    let Some(h) = Hosts::new() else { return };
    let da = daemon_in(&h.a, &[]);
    let mut client = da.session();
    // On B, something holds the ctl port, accepts, and never answers.
    let silent = in_ns(&h.b, || TcpListener::bind(sa(h.ip_b, 7471)).unwrap());
    let app = in_ns(&h.b, || TcpListener::bind(sa(h.ip_b, 0)).unwrap());
    let server_addr = app.local_addr().unwrap();
    let (sock, ca) = client_a(&h);
    let (r, took) = offer(&mut client, &sock, ca, server_addr, b"");
    assert_eq!(
        r,
        Msg::OfferRefused {
            reason: RefuseReason::NoListener
        }
    );
    assert!(
        took >= Duration::from_millis(PEER_TIMEOUT_MS - 20)
            && took < Duration::from_millis(PEER_TIMEOUT_MS + 300),
        "{took:?}"
    );
    // The connection was made and the offer sent: the silent end got it.
    // (Bounded: a connect the daemon gave up on leaves nothing to accept.)
    let mut s = accept_within(&silent, Duration::from_secs(10))
        .expect("the daemon never connected to B's ctl port");
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut head = [0u8; 8];
    s.read_exact(&mut head).unwrap();
    assert_eq!(
        u16::from_le_bytes([head[6], head[7]]),
        ringsock_proto::msg::kind::REMOTE_OFFER
    );
    // Later offers to that host do not wait again.
    let (sock, ca) = client_a(&h);
    let (r, took) = offer(&mut client, &sock, ca, server_addr, b"");
    assert!(matches!(r, Msg::OfferRefused { .. }));
    assert!(took < Duration::from_millis(100), "{took:?}");
    // The daemon is fine.
    assert!(matches!(
        call(&mut client, &Msg::Status { after: None }, &[]).0,
        Msg::StatusReply { .. }
    ));
}

/// A connection accepted on `l` within `limit`, or None.
fn accept_within(l: &TcpListener, limit: Duration) -> Option<TcpStream> {
    l.set_nonblocking(true).unwrap();
    let deadline = Instant::now() + limit;
    loop {
        match l.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false).unwrap();
                return Some(s);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && Instant::now() < deadline => {
                sleep(Duration::from_millis(10))
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return None,
            Err(e) => panic!("accept: {e}"),
        }
    }
}

/// A raw ctl-to-ctl connection from host A to B's ctl.
fn raw_peer(h: &Hosts) -> TcpStream {
    let s = in_ns(&h.a, || TcpStream::connect(sa(h.ip_b, 7471)).unwrap());
    s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    s
}

fn send_msg(s: &mut TcpStream, m: &Msg) {
    s.write_all(&frame::encode(m).unwrap()).unwrap();
}

fn recv_msg(s: &mut TcpStream) -> Msg {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).unwrap();
    let mut f = len.to_vec();
    f.resize(4 + u32::from_le_bytes(len) as usize, 0);
    s.read_exact(&mut f[4..]).unwrap();
    frame::decode(&f).unwrap()
}

/// True once B's ctl closed the connection (EOF or reset).
fn closed_by_peer(s: &mut TcpStream) -> bool {
    let mut b = [0u8; 64];
    loop {
        match s.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) => return e.kind() != std::io::ErrorKind::WouldBlock,
        }
    }
}

#[test]
fn remote_offers_must_come_from_the_client_address() {
    let Some(h) = Hosts::new() else { return };
    let db = daemon_in(&h.b, &[]);
    let mut server = db.session();
    let (l, server_addr) = listen_b(&h, &mut server);
    let mut p = raw_peer(&h);
    // A client address that is not the connection's source: refused.
    let [a, b, c, _] = h.ip_a.octets();
    let forged = Msg::RemoteOffer {
        offer_ref: 1,
        client: sa(Ipv4Addr::new(a, b, c, 9), 40000),
        server: server_addr,
        payload: vec![],
    };
    send_msg(&mut p, &forged);
    assert_eq!(
        recv_msg(&mut p),
        Msg::RemoteRefused {
            offer_ref: 1,
            reason: RefuseReason::Invalid
        }
    );
    // No listener for that server address.
    let nolistener = Msg::RemoteOffer {
        offer_ref: 2,
        client: sa(h.ip_a, 40000),
        server: sa(h.ip_b, 1),
        payload: vec![],
    };
    send_msg(&mut p, &nolistener);
    assert_eq!(
        recv_msg(&mut p),
        Msg::RemoteRefused {
            offer_ref: 2,
            reason: RefuseReason::NoListener
        }
    );
    // From the source address: registered, claimable by the owner of the
    // accepted socket, and the claim is reported back.
    let (sock, ca) = client_a(&h);
    let good = Msg::RemoteOffer {
        offer_ref: 3,
        client: sa(h.ip_a, ca.port()),
        server: server_addr,
        payload: b"p".to_vec(),
    };
    send_msg(&mut p, &good);
    assert!(matches!(
        recv_msg(&mut p),
        Msg::RemoteOfferOk { offer_ref: 3, .. }
    ));
    connect(&sock, server_addr).unwrap();
    let (acc, _) = l.accept().unwrap();
    assert!(matches!(
        call(&mut server, &Msg::Claim, &[acc.as_raw_fd()]).0,
        Msg::ClaimOk { .. }
    ));
    assert!(matches!(
        recv_msg(&mut p),
        Msg::RemoteClaimed { offer_ref: 3, .. }
    ));
}

#[test]
fn garbage_and_oversized_frames_close_only_that_connection() {
    let Some(h) = Hosts::new() else { return };
    let db = daemon_in(&h.b, &[]);
    let mut bad: Vec<Vec<u8>> = vec![
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
        // Announces more than the frame limit.
        ((ringsock_proto::MAX_FRAME + 1) as u32)
            .to_le_bytes()
            .to_vec(),
        u32::MAX.to_le_bytes().to_vec(),
        // A local-socket kind on the peer port.
        frame::encode(&Msg::Claim).unwrap(),
        // A kind only the accepting side sends.
        frame::encode(&Msg::RemoteExpired { offer_ref: 1 }).unwrap(),
    ];
    let mut wrong_version = frame::encode(&Msg::RemoteCancel { offer_ref: 1 }).unwrap();
    wrong_version[4] = 9;
    bad.push(wrong_version);
    let n = bad.len();
    for bytes in bad {
        let mut p = raw_peer(&h);
        p.write_all(&bytes).unwrap();
        assert!(closed_by_peer(&mut p), "{bytes:?}");
    }
    // One log line per closed connection, and the daemon still serves
    // both its local socket and other peers.
    wait_until("log lines", || {
        db.log_text().matches("closing the connection").count() == n
    });
    let mut s = db.session();
    assert!(matches!(
        call(&mut s, &Msg::Status { after: None }, &[]).0,
        Msg::StatusReply { .. }
    ));
    let mut p = raw_peer(&h);
    send_msg(&mut p, &Msg::RemoteCancel { offer_ref: 5 });
    send_msg(
        &mut p,
        &Msg::RemoteOffer {
            offer_ref: 6,
            client: sa(h.ip_a, 1234),
            server: sa(h.ip_b, 1),
            payload: vec![],
        },
    );
    assert!(matches!(
        recv_msg(&mut p),
        Msg::RemoteRefused { offer_ref: 6, .. }
    ));
}

#[test]
fn remote_offers_refuse_descriptors_and_peer_port_zero_stays_local() {
    let Some(h) = Hosts::new() else { return };
    let da = daemon_in(&h.a, &[]);
    let db = daemon_in(&h.b, &[]);
    let mut server = db.session();
    let (_l, server_addr) = listen_b(&h, &mut server);
    let mut client = da.session();
    // The shim's shared-memory offer carries a memfd and doorbells: those
    // cannot reach another host.
    let (sock, ca) = client_a(&h);
    let efd = eventfd();
    let m = Msg::Offer {
        client: ca,
        server: server_addr,
        payload: vec![],
    };
    let (r, _) = call(&mut client, &m, &[sock.as_raw_fd(), efd.as_raw_fd()]);
    assert_eq!(
        r,
        Msg::OfferRefused {
            reason: RefuseReason::Invalid
        }
    );
    // --peer-port 0: no forwarding, no listening.
    let d0 = daemon_in(&h.a, &["--peer-port", "0"]);
    let mut c0 = d0.session();
    let (sock, ca) = client_a(&h);
    let (r, took) = offer(&mut c0, &sock, ca, server_addr, b"");
    assert_eq!(
        r,
        Msg::OfferRefused {
            reason: RefuseReason::NoListener
        }
    );
    assert!(took < Duration::from_millis(100));
    assert!(d0.log_text().contains("inter-host offers off"));
}

/// An offer from another host is for the process that owns the accepted
/// socket only: on B, a claim with another connection to the same
/// listener, or with a UDP socket carrying the connection's exact 4-tuple,
/// finds nothing; a second ctl connection from A can neither withdraw the
/// offer (its refs are its own) nor register another for the same
/// connection; the owner's claim then succeeds and is reported to the
/// offering connection only.
#[test]
fn remote_offer_is_claimed_only_with_the_accepted_socket() {
    let Some(h) = Hosts::new() else { return };
    let db = daemon_in(&h.b, &[]);
    let mut server = db.session();
    let (l, server_addr) = listen_b(&h, &mut server);
    let mut p1 = raw_peer(&h);
    let mut p2 = raw_peer(&h);
    let (sock, ca) = client_a(&h);
    let client = sa(h.ip_a, ca.port());
    send_msg(
        &mut p1,
        &Msg::RemoteOffer {
            offer_ref: 3,
            client,
            server: server_addr,
            payload: b"p".to_vec(),
        },
    );
    assert!(matches!(
        recv_msg(&mut p1),
        Msg::RemoteOfferOk { offer_ref: 3, .. }
    ));
    send_msg(&mut p2, &Msg::RemoteCancel { offer_ref: 3 });
    send_msg(
        &mut p2,
        &Msg::RemoteOffer {
            offer_ref: 3,
            client,
            server: server_addr,
            payload: b"hijack".to_vec(),
        },
    );
    assert_eq!(
        recv_msg(&mut p2),
        Msg::RemoteRefused {
            offer_ref: 3,
            reason: RefuseReason::Duplicate
        }
    );

    // Another connection from A to the same listener: not this offer's.
    let _other = in_ns(&h.a, || TcpStream::connect(server_addr).unwrap());
    let (other_acc, _) = l.accept().unwrap();
    let mut intruder = db.session();
    assert_eq!(
        call(&mut intruder, &Msg::Claim, &[other_acc.as_raw_fd()]).0,
        Msg::NoOffer
    );
    // The exact 4-tuple, on a socket that is not the TCP connection.
    let forged = in_ns(&h.b, || {
        let u = std::net::UdpSocket::bind(server_addr).unwrap();
        u.connect(client).unwrap();
        u
    });
    assert!(matches!(
        call(&mut intruder, &Msg::Claim, &[forged.as_raw_fd()]).0,
        Msg::Error {
            code: ErrorCode::BadProof,
            ..
        }
    ));

    // The owner of the accepted socket claims it, p2's cancel changed
    // nothing, and only p1 hears of the claim.
    connect(&sock, server_addr).unwrap();
    let (acc, peer) = l.accept().unwrap();
    assert_eq!(peer, client);
    let (r, _) = call(&mut server, &Msg::Claim, &[acc.as_raw_fd()]);
    assert!(
        matches!(r, Msg::ClaimOk { ref payload, .. } if payload == b"p"),
        "{r:?}"
    );
    assert!(matches!(
        recv_msg(&mut p1),
        Msg::RemoteClaimed { offer_ref: 3, .. }
    ));
    p2.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let mut b = [0u8; 1];
    let e = p2.read(&mut b).expect_err("p2 heard something");
    assert!(
        matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
        "{e}"
    );
}
