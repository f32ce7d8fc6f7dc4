//! The offer/claim/answer/collect handshake against a real daemon, with
//! real TCP sockets on 127.0.0.1 and real relayed descriptors.

mod common;

use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsRawFd, OwnedFd};
use std::thread::sleep;
use std::time::Duration;

use common::*;
use ringsock_proto::{ErrorCode, Msg, RefuseReason};

fn listen(d: &Daemon) -> (ringsock_proto::Client, TcpListener) {
    let mut server = d.session();
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let (r, _) = call(&mut server, &Msg::ListenerAdd { addr }, &[l.as_raw_fd()]);
    assert_eq!(r, Msg::Ok);
    (server, l)
}

#[test]
fn full_handshake_relays_the_same_objects() {
    let d = Daemon::start();
    let (mut server, l) = listen(&d);
    let server_addr = l.local_addr().unwrap();
    let mut client = d.session();

    // Offer before connect, from a bound socket.
    let sock = bound_tcp("127.0.0.1:0".parse().unwrap());
    let client_addr = local_addr(sock.as_raw_fd());
    let efd = eventfd();
    let ring = memfd(4096, false);
    let offer = Msg::Offer {
        client: client_addr,
        server: server_addr,
        payload: b"ring v1".to_vec(),
    };
    let (r, _) = call(
        &mut client,
        &offer,
        &[sock.as_raw_fd(), efd.as_raw_fd(), ring.as_raw_fd()],
    );
    let Msg::OfferOk { offer_id } = r else {
        panic!("offer refused: {r:?}")
    };
    assert_eq!(
        call(&mut client, &Msg::Collect { offer_id }, &[]).0,
        Msg::Pending
    );

    connect(&sock, server_addr).unwrap();
    let (accepted, peer) = l.accept().unwrap();
    assert_eq!(peer, client_addr);

    let (r, fds) = call(&mut server, &Msg::Claim, &[accepted.as_raw_fd()]);
    assert_eq!(
        r,
        Msg::ClaimOk {
            offer_id,
            client_pid: std::process::id(),
            payload: b"ring v1".to_vec()
        }
    );
    let relayed = fds.into_owned();
    assert_eq!(relayed.len(), 2);
    // Same eventfd: a write through the relayed copy reads at the source.
    eventfd_write(relayed[0].as_raw_fd(), 5);
    assert_eq!(eventfd_read(efd.as_raw_fd()), 5);
    // Same memfd: bytes written through one copy are read through the other.
    pwrite(relayed[1].as_raw_fd(), b"hello ring", 100);
    assert_eq!(pread(ring.as_raw_fd(), 10, 100), b"hello ring");

    // A second claim of the same connection finds nothing.
    assert_eq!(
        call(&mut server, &Msg::Claim, &[accepted.as_raw_fd()]).0,
        Msg::NoOffer
    );

    // The server answers with its own doorbell.
    let server_bell = eventfd();
    let answer = Msg::Answer {
        offer_id,
        payload: b"ok".to_vec(),
    };
    assert_eq!(
        call(&mut server, &answer, &[server_bell.as_raw_fd()]).0,
        Msg::Ok
    );
    let (r, fds) = call(&mut client, &Msg::Collect { offer_id }, &[]);
    assert_eq!(
        r,
        Msg::Answered {
            payload: b"ok".to_vec()
        }
    );
    let bell = fds.into_owned();
    eventfd_write(bell[0].as_raw_fd(), 7);
    assert_eq!(eventfd_read(server_bell.as_raw_fd()), 7);
    // Collected once.
    assert!(matches!(
        call(&mut client, &Msg::Collect { offer_id }, &[]).0,
        Msg::Error {
            code: ErrorCode::NotFound,
            ..
        }
    ));
}

#[test]
fn proof_descriptors_are_not_kept() {
    let d = Daemon::start();
    let (mut server, l) = listen(&d);
    let server_addr = l.local_addr().unwrap();
    // The daemon closed its copy of the listener: closing ours really
    // stops listening.
    drop(l);
    assert_refused_soon(server_addr);

    // Same for the accepted socket used as a claim proof: once we close it
    // the client sees end-of-file (a daemon copy would keep it open).
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (accepted, _) = l.accept().unwrap();
    assert_eq!(
        call(&mut server, &Msg::Claim, &[accepted.as_raw_fd()]).0,
        Msg::NoOffer
    );
    drop(accepted);
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut b = [0u8; 1];
    assert_eq!(c.read(&mut b).unwrap(), 0);
}

/// Connecting to `addr` is refused within a few seconds. Not at once: a
/// sibling test spawning its daemon holds a copy of every descriptor of
/// this process between its fork and its exec, our closed listener
/// included. A daemon keeping its own copy would keep accepting for good.
fn assert_refused_soon(addr: std::net::SocketAddr) {
    for _ in 0..50 {
        match TcpStream::connect(addr) {
            Err(e) => {
                assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused);
                return;
            }
            Ok(_accepted_by_a_copy) => sleep(Duration::from_millis(100)),
        }
    }
    panic!("{addr} still accepts connections 5 s after its listener was closed");
}

#[test]
fn claim_with_another_connected_socket_finds_nothing() {
    let d = Daemon::start();
    let (mut server, l) = listen(&d);
    let mut client = d.session();
    let sock = bound_tcp("127.0.0.1:0".parse().unwrap());
    let offer = Msg::Offer {
        client: local_addr(sock.as_raw_fd()),
        server: l.local_addr().unwrap(),
        payload: vec![],
    };
    let Msg::OfferOk { offer_id } = call(&mut client, &offer, &[sock.as_raw_fd()]).0 else {
        panic!("offer refused")
    };
    connect(&sock, l.local_addr().unwrap()).unwrap();
    let (accepted, _) = l.accept().unwrap();

    // Some other connection (to the same listener, from another port), and
    // the client's own end: neither is the accepted socket of this offer.
    let other = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (other_accepted, _) = l.accept().unwrap();
    for fd in [
        other.as_raw_fd(),
        other_accepted.as_raw_fd(),
        sock.as_raw_fd(),
    ] {
        assert_eq!(call(&mut server, &Msg::Claim, &[fd]).0, Msg::NoOffer);
    }
    // A listening socket or an eventfd is no proof at all.
    for fd in [l.as_raw_fd(), eventfd().as_raw_fd()] {
        assert!(matches!(
            call(&mut server, &Msg::Claim, &[fd]).0,
            Msg::Error {
                code: ErrorCode::BadProof,
                ..
            }
        ));
    }
    // The real one still works, and only the claimer may answer.
    let (r, _) = call(&mut server, &Msg::Claim, &[accepted.as_raw_fd()]);
    assert!(matches!(r, Msg::ClaimOk { offer_id: id, .. } if id == offer_id));
    let mut third = d.session();
    let decline = Msg::Decline {
        offer_id,
        reason: "not mine".into(),
    };
    assert!(matches!(
        call(&mut third, &decline, &[]).0,
        Msg::Error {
            code: ErrorCode::NotOwner,
            ..
        }
    ));
    let decline = Msg::Decline {
        offer_id,
        reason: "no memory".into(),
    };
    assert_eq!(call(&mut server, &decline, &[]).0, Msg::Ok);
    assert_eq!(
        call(&mut client, &Msg::Collect { offer_id }, &[]).0,
        Msg::Declined {
            reason: "no memory".into()
        }
    );
}

#[test]
fn offers_are_refused_without_proof_or_listener() {
    let d = Daemon::start();
    let mut client = d.session();
    let sock = bound_tcp("127.0.0.1:0".parse().unwrap());
    let me = local_addr(sock.as_raw_fd());
    // No listener registered for the server address.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let offer = Msg::Offer {
        client: me,
        server: l.local_addr().unwrap(),
        payload: vec![],
    };
    assert_eq!(
        call(&mut client, &offer, &[sock.as_raw_fd()]).0,
        Msg::OfferRefused {
            reason: RefuseReason::NoListener
        }
    );
    let (_server, l) = listen(&d);
    // The proof socket is bound elsewhere than the claimed client address.
    let mut spoofed = me;
    spoofed.set_port(if me.port() == 65535 {
        1024
    } else {
        me.port() + 1
    });
    let offer = Msg::Offer {
        client: spoofed,
        server: l.local_addr().unwrap(),
        payload: vec![],
    };
    assert_eq!(
        call(&mut client, &offer, &[sock.as_raw_fd()]).0,
        Msg::OfferRefused {
            reason: RefuseReason::Invalid
        }
    );
    // A non-socket as proof.
    let efd = eventfd();
    let offer = Msg::Offer {
        client: me,
        server: l.local_addr().unwrap(),
        payload: vec![],
    };
    assert_eq!(
        call(&mut client, &offer, &[efd.as_raw_fd()]).0,
        Msg::OfferRefused {
            reason: RefuseReason::Invalid
        }
    );
    // With the right proof: accepted once, then a duplicate.
    assert!(matches!(
        call(&mut client, &offer, &[sock.as_raw_fd()]).0,
        Msg::OfferOk { .. }
    ));
    assert_eq!(
        call(&mut client, &offer, &[sock.as_raw_fd()]).0,
        Msg::OfferRefused {
            reason: RefuseReason::Duplicate
        }
    );
}

#[test]
fn wildcard_listener_and_session_end() {
    let d = Daemon::start();
    let mut server = d.session();
    let l = TcpListener::bind("0.0.0.0:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let (r, _) = call(
        &mut server,
        &Msg::ListenerAdd {
            addr: l.local_addr().unwrap(),
        },
        &[l.as_raw_fd()],
    );
    assert_eq!(r, Msg::Ok);
    let mut client = d.session();
    let target = format!("127.0.0.1:{port}").parse().unwrap();
    let offer_for = |s: &OwnedFd| Msg::Offer {
        client: local_addr(s.as_raw_fd()),
        server: target,
        payload: vec![],
    };
    let s1 = bound_tcp("127.0.0.1:0".parse().unwrap());
    assert!(matches!(
        call(&mut client, &offer_for(&s1), &[s1.as_raw_fd()]).0,
        Msg::OfferOk { .. }
    ));
    // The server process goes away: its listener registration with it.
    drop(server);
    let s2 = bound_tcp("127.0.0.1:0".parse().unwrap());
    wait_until("listener removal", || {
        call(&mut client, &offer_for(&s2), &[s2.as_raw_fd()]).0
            == Msg::OfferRefused {
                reason: RefuseReason::NoListener,
            }
    });
}

#[test]
fn unclaimed_offers_expire() {
    // Expiry after 300 ms; the Expired result is then kept 300 ms more.
    let d = Daemon::start_with(&["--offer-timeout-ms", "300"]);
    let (_server, l) = listen(&d);
    let mut client = d.session();
    let sock = bound_tcp("127.0.0.1:0".parse().unwrap());
    let efd = eventfd();
    let offer = Msg::Offer {
        client: local_addr(sock.as_raw_fd()),
        server: l.local_addr().unwrap(),
        payload: vec![],
    };
    let Msg::OfferOk { offer_id } =
        call(&mut client, &offer, &[sock.as_raw_fd(), efd.as_raw_fd()]).0
    else {
        panic!("offer refused")
    };
    sleep(Duration::from_millis(450));
    // Expiry happened on the daemon's timer, not on our request.
    assert_eq!(
        call(&mut client, &Msg::Collect { offer_id }, &[]).0,
        Msg::Expired
    );
    connect(&sock, l.local_addr().unwrap()).unwrap();
    let (accepted, _) = l.accept().unwrap();
    let mut server = d.session();
    assert_eq!(
        call(&mut server, &Msg::Claim, &[accepted.as_raw_fd()]).0,
        Msg::NoOffer
    );
}

#[test]
fn cancel_withdraws_an_offer() {
    let d = Daemon::start();
    let (mut server, l) = listen(&d);
    let mut client = d.session();
    let sock = bound_tcp("127.0.0.1:0".parse().unwrap());
    let offer = Msg::Offer {
        client: local_addr(sock.as_raw_fd()),
        server: l.local_addr().unwrap(),
        payload: vec![],
    };
    let Msg::OfferOk { offer_id } = call(&mut client, &offer, &[sock.as_raw_fd()]).0 else {
        panic!("offer refused")
    };
    // Nobody else can cancel it.
    assert!(matches!(
        call(&mut server, &Msg::Cancel { offer_id }, &[]).0,
        Msg::Error { .. }
    ));
    assert_eq!(call(&mut client, &Msg::Cancel { offer_id }, &[]).0, Msg::Ok);
    connect(&sock, l.local_addr().unwrap()).unwrap();
    let (accepted, _) = l.accept().unwrap();
    assert_eq!(
        call(&mut server, &Msg::Claim, &[accepted.as_raw_fd()]).0,
        Msg::NoOffer
    );
}
