//! A shared-memory connection's two ends in one process, over a real
//! loopback TCP connection, driven through the calls the hooks make.

use std::io::{IoSlice, IoSliceMut};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use ringsock_ring::{EventFd, Receiver, Segment, Sender, ShmTransport};

use super::super::conn::{seam, Parts, RingConn, MODE_RING};
use super::super::setup::{dup_cloexec, ring_config, Medium};
use super::super::tracked::Tracked;
use super::{PeerBell, ShmConn, ShmWire, Side, STATE_ACCEPTED, WORD_STATE};
use crate::attached::{AttachedConn, Errno, Ready, ReleaseKind};

/// Both ends of one connection the server took, and the program's own
/// kernel sockets under them (the ends hold duplicates).
struct Pair {
    client: Arc<ShmConn>,
    server: Arc<ShmConn>,
    client_sock: TcpStream,
    server_sock: TcpStream,
}

/// A doorbell as its owner keeps it, and the peer's copy of it.
fn bell() -> (EventFd, Arc<EventFd>) {
    let own = OwnedFd::from(EventFd::new().expect("eventfd"));
    let copy = own.try_clone().expect("dup");
    (
        EventFd::from_owned(own),
        Arc::new(EventFd::from_owned(copy)),
    )
}

fn dup(fd: RawFd) -> RawFd {
    dup_cloexec(fd).expect("dup")
}

/// Sets a pair up as `handshake` does: the client's segment and doorbells,
/// the server's claim moving the state word to accepted.
fn pair() -> Pair {
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
    let client_sock = TcpStream::connect(l.local_addr().unwrap()).expect("connect");
    let (server_sock, _) = l.accept().expect("accept");
    let (local, peer) = (
        client_sock.local_addr().unwrap(),
        client_sock.peer_addr().unwrap(),
    );
    let cfg = ring_config(Medium::Shm);
    let cseg = Segment::create(&cfg, 2).expect("segment");
    let sseg = Segment::attach(cseg.share_fd().expect("memfd")).expect("attach");
    let (cbell, to_client) = bell();
    let (sbell, to_server) = bell();
    let end = |seg: &Segment, ring: u32, to: &Arc<EventFd>| {
        ShmTransport::new(seg.ring(ring), Some(Box::new(PeerBell(to.clone()))))
    };
    let ctx = Sender::new(cseg.ring(0), end(&cseg, 0, &to_server), cfg).expect("tx");
    let crx = Receiver::new(cseg.ring(1), end(&cseg, 1, &to_server), cfg).expect("rx");
    let client = RingConn::new(Parts {
        offer_id: 1,
        local,
        peer,
        wire: ShmWire::new(Side::Client, cseg, cbell),
        tx: Some(ctx),
        rx: Some(crx),
        tcp: dup(client_sock.as_raw_fd()),
        pending: true,
    });
    let srx = Receiver::new(sseg.ring(0), end(&sseg, 0, &to_client), cfg).expect("rx");
    let stx = Sender::new(sseg.ring(1), end(&sseg, 1, &to_client), cfg).expect("tx");
    sseg.header().user[WORD_STATE].store(STATE_ACCEPTED, Ordering::Release);
    let server = RingConn::new(Parts {
        offer_id: 1,
        local: peer,
        peer: local,
        wire: ShmWire::new(Side::Server, sseg, sbell),
        tx: Some(stx),
        rx: Some(srx),
        tcp: dup(server_sock.as_raw_fd()),
        pending: false,
    });
    Pair {
        client,
        server,
        client_sock,
        server_sock,
    }
}

fn send(c: &ShmConn, data: &[u8]) {
    assert_eq!(c.try_send(&[IoSlice::new(data)]), Ok(data.len()));
}

fn recv(c: &ShmConn, n: usize) -> Result<Vec<u8>, Errno> {
    let mut buf = vec![0u8; n];
    let got = c.try_recv(&mut [IoSliceMut::new(&mut buf)], false)?;
    buf.truncate(got);
    Ok(buf)
}

/// Waits (bounded) until the kernel socket under `c` has the peer's FIN.
fn fin_arrived(c: &ShmConn) {
    for _ in 0..10_000 {
        let mut p = libc::pollfd {
            fd: c.tcp_fd(),
            events: libc::POLLRDHUP,
            revents: 0,
        };
        // SAFETY: one valid pollfd, 1 ms timeout.
        if unsafe { libc::poll(&mut p, 1, 1) } == 1 {
            return;
        }
    }
    panic!("the peer's FIN never arrived");
}

/// The server answers and closes first in the window between the client's
/// empty look at its ring and its look at the kernel socket (connrr under
/// churn): the FIN found there follows a response already in the ring,
/// which the client must read before the end of stream. Both with the FIN
/// found by the reading thread itself and by another one (the background
/// thread's check of the socket).
#[test]
fn a_fin_seen_after_an_empty_look_does_not_hide_the_response() {
    for fin_seen_elsewhere in [false, true] {
        let p = pair();
        send(&p.client, b"request");
        assert_eq!(p.client.settle(), MODE_RING);
        assert_eq!(recv(&p.server, 64), Ok(b"request".to_vec()));

        let server = p.server.clone();
        let client = p.client.clone();
        let server_sock = p.server_sock;
        let ran = Arc::new(AtomicBool::new(false));
        let ran_too = ran.clone();
        seam::after_empty_look_do(move || {
            send(&server, b"response");
            server.release(-1, ReleaseKind::Owner);
            drop(server_sock);
            fin_arrived(&client);
            if fin_seen_elsewhere {
                client.check_socket();
                assert!(client.peer_gone());
            }
            ran_too.store(true, Ordering::Relaxed);
        });
        let mut got = Vec::new();
        loop {
            match recv(&p.client, 64) {
                Ok(b) if b.is_empty() => break,
                Ok(b) => got.extend(b),
                Err(e) => panic!("read: {e:?} after {got:?}"),
            }
        }
        assert!(
            ran.load(Ordering::Relaxed),
            "the client never found its ring empty"
        );
        assert_eq!(got, b"response", "fin seen elsewhere: {fin_seen_elsewhere}");
        p.client.release(-1, ReleaseKind::Owner);
        drop(p.client_sock);
    }
}

/// What a waiter for one interest is told agrees with the full readiness
/// on that interest, ERR and HUP, in every state a side goes through:
/// fresh, with data, the peer's end of stream, both sides shut.
#[test]
fn readiness_for_an_interest_agrees_with_the_full_readiness() {
    let p = pair();
    send(&p.client, b"hello");
    assert_eq!(p.client.settle(), MODE_RING);
    assert_eq!(recv(&p.server, 64), Ok(b"hello".to_vec()));
    let interests = [
        Ready::NONE,
        Ready::READ,
        Ready::RDNORM,
        Ready::RDHUP,
        Ready::PRI,
        Ready::WRITE,
        Ready::WRNORM,
        Ready::INPUT,
        Ready::INPUT | Ready::OUTPUT,
    ];
    let agree = |c: &ShmConn, state: &str| {
        for i in interests {
            let asked = i | Ready::ERR | Ready::HUP;
            assert_eq!(
                (c.readiness_for(i) & asked).0,
                (c.readiness() & asked).0,
                "{state}, interest {:#x}",
                i.0
            );
        }
    };
    agree(&p.client, "fresh");
    send(&p.server, b"data");
    agree(&p.client, "data");
    let server_fd = p.server_sock.as_raw_fd();
    let client_fd = p.client_sock.as_raw_fd();
    assert_eq!(p.server.shutdown(server_fd, libc::SHUT_WR), Ok(()));
    agree(&p.client, "data and the peer's end of stream");
    assert_eq!(recv(&p.client, 64), Ok(b"data".to_vec()));
    agree(&p.client, "the peer's end of stream");
    assert_eq!(p.client.shutdown(client_fd, libc::SHUT_WR), Ok(()));
    assert!(p.client.readiness().contains(Ready::HUP));
    agree(&p.client, "both sides shut");
    agree(&p.server, "both sides shut, the other end");
    p.client.release(-1, ReleaseKind::Owner);
    p.server.release(-1, ReleaseKind::Owner);

    // Data ahead of the peer's end of stream while this side is shut too:
    // HUP then rests on the mark behind the data.
    let q = pair();
    send(&q.client, b"hello");
    assert_eq!(q.client.settle(), MODE_RING);
    assert_eq!(recv(&q.server, 64), Ok(b"hello".to_vec()));
    send(&q.server, b"data");
    let server_fd = q.server_sock.as_raw_fd();
    let client_fd = q.client_sock.as_raw_fd();
    assert_eq!(q.client.shutdown(client_fd, libc::SHUT_WR), Ok(()));
    agree(&q.client, "data, this side shut");
    assert_eq!(q.server.shutdown(server_fd, libc::SHUT_WR), Ok(()));
    assert!(q.client.readiness().contains(Ready::HUP));
    agree(&q.client, "data, both sides shut");
    q.client.release(-1, ReleaseKind::Owner);
    q.server.release(-1, ReleaseKind::Owner);
}

/// A thread that read a connection's socket number just before another
/// released the connection (the background thread looking at the socket,
/// resetting it, flushing to it) and uses it a moment later acts on
/// nothing: the number is not handed to the next connection's socket
/// while the released connection can still be reached.
#[test]
fn a_late_use_of_a_released_sockets_number_reaches_no_other_socket() {
    use std::io::{Read, Write};

    let old = pair();
    let stale = [old.client.tcp_fd(), old.server.tcp_fd()];
    old.client.release(-1, ReleaseKind::Owner);
    old.server.release(-1, ReleaseKind::Owner);
    assert_eq!(old.client.tcp_fd(), -1);

    // The next connection's duplicates take the lowest free numbers.
    let mut new = pair();
    for fd in [new.client.tcp_fd(), new.server.tcp_fd()] {
        assert!(!stale.contains(&fd), "{fd} handed out again in {stale:?}");
    }
    for fd in stale {
        // Inert: never ready, not a socket.
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN | libc::POLLOUT,
            revents: 0,
        };
        // SAFETY: one valid pollfd, no wait.
        assert_eq!(unsafe { libc::poll(&mut p, 1, 0) }, 0);
        // The late reset `fail_hard` would send.
        super::super::sockio::abort(fd);
        assert_eq!(crate::sys::errno(), libc::ENOTSOCK);
    }

    // The new connection's kernel sockets are untouched.
    new.client_sock.write_all(b"ping").expect("client write");
    let mut got = [0u8; 4];
    new.server_sock.read_exact(&mut got).expect("server read");
    assert_eq!(&got, b"ping");
    new.server_sock.write_all(b"pong").expect("server write");
    new.client_sock.read_exact(&mut got).expect("client read");
    assert_eq!(&got, b"pong");
}

/// Polls the waiter's fds of `c` for `interest` up to `ms`; true when one
/// of them woke.
fn woken(c: &ShmConn, interest: Ready, ms: i32) -> (bool, Vec<libc::pollfd>) {
    let mut pfds: Vec<libc::pollfd> = c
        .wait_fds(c.tcp_fd(), interest)
        .into_iter()
        .flatten()
        .map(|w| libc::pollfd {
            fd: w.fd,
            events: w.events,
            revents: 0,
        })
        .collect();
    // SAFETY: a valid pollfd array of its length; bounded timeout.
    let n = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, ms) };
    (n > 0, pfds)
}

/// A reader that needs more bytes than the ring holds (a peek with
/// MSG_WAITALL, SO_RCVLOWAT) arms with bytes in the ring: the peer's next
/// send rings its doorbell, though a plain arm would ask for nothing.
#[test]
fn a_reader_needing_more_than_the_ring_holds_is_rung_by_the_next_send() {
    let p = pair();
    send(&p.client, b"hello");
    assert_eq!(p.client.settle(), MODE_RING);
    assert_eq!(recv(&p.server, 64), Ok(b"hello".to_vec()));
    let interest = Ready::READ | Ready::RDHUP;
    send(&p.server, b"ab");
    assert_eq!(p.client.available(), 2);
    assert!(!p.client.readiness_needing(4).intersects(Ready::IN));
    assert!(!p.client.arm_needing(4).intersects(Ready::IN));
    assert!(!woken(&p.client, interest, 50).0, "rung with 2 of 4 bytes");
    send(&p.server, b"c");
    let (rung, pfds) = woken(&p.client, interest, 2000);
    assert!(rung, "the third byte rang nobody");
    p.client.disarm_after(interest, &pfds);
    // Still short: armed again, the fourth byte rings again.
    assert!(!p.client.arm_needing(4).intersects(Ready::IN));
    send(&p.server, b"d");
    let (rung, pfds) = woken(&p.client, interest, 2000);
    assert!(rung, "the fourth byte rang nobody");
    p.client.disarm_after(interest, &pfds);
    assert!(p.client.readiness_needing(4).intersects(Ready::IN));

    // A peek into several buffers fills them in turn; nothing is taken.
    let (mut a, mut b, mut c) = ([0u8; 1], [0u8; 2], [0u8; 8]);
    let mut bufs = [
        IoSliceMut::new(&mut a),
        IoSliceMut::new(&mut b),
        IoSliceMut::new(&mut c),
    ];
    assert_eq!(p.client.try_recv(&mut bufs, true), Ok(4));
    assert_eq!((&a, &b, &c[..1]), (b"a", b"bc", &b"d"[..]));
    assert_eq!(recv(&p.client, 64), Ok(b"abcd".to_vec()));
    p.client.release(-1, ReleaseKind::Owner);
    p.server.release(-1, ReleaseKind::Owner);
}

/// After a leave, bytes the ring held stay readable ahead of the kernel
/// socket's: a peek sees both as one stream, so that a peek that waits
/// for more than the ring left finds the rest, and a reader that needs
/// them is told they are there.
#[test]
fn a_peek_after_a_leave_sees_the_rings_bytes_then_the_sockets() {
    let p = pair();
    send(&p.client, b"hello");
    assert_eq!(p.client.settle(), MODE_RING);
    assert_eq!(recv(&p.server, 64), Ok(b"hello".to_vec()));
    send(&p.server, b"ab");
    assert_eq!(p.client.available(), 2);
    let client = p.client.clone();
    let leaver = std::thread::spawn(move || client.leave_ring(false));
    while !leaver.is_finished() {
        p.server.check_socket();
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert!(leaver.join().unwrap(), "the leave did not complete");
    send(&p.server, b"cd");
    let mut buf = [0u8; 8];
    for _ in 0..2000 {
        if p.client.readiness_needing(4).intersects(Ready::IN) {
            break;
        }
        // The server learns of the leave from its socket: it takes back
        // what it wrote into the ring since and sends it there.
        p.server.check_socket();
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert!(p.client.readiness_needing(4).intersects(Ready::IN));
    let got = p.client.try_recv(&mut [IoSliceMut::new(&mut buf)], true);
    assert_eq!((got, &buf[..4]), (Ok(4), &b"abcd"[..]));
    let (mut a, mut b) = ([0u8; 3], [0u8; 3]);
    let got = p.client.try_recv(
        &mut [IoSliceMut::new(&mut a), IoSliceMut::new(&mut b)],
        true,
    );
    assert_eq!((got, &a, &b[..1]), (Ok(4), b"abc", &b"d"[..]));
    // A read after the peek takes at least what the peek saw.
    assert_eq!(recv(&p.client, 64), Ok(b"abcd".to_vec()));
    p.client.release(-1, ReleaseKind::Owner);
    p.server.release(-1, ReleaseKind::Owner);
}
