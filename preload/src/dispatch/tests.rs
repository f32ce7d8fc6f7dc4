//! The hooks dispatch ring-attached fds to their `AttachedConn`: blocking
//! and non-blocking recv/send, MSG_PEEK, MSG_WAITALL, FIONREAD, poll,
//! select, epoll (level, edge, oneshot), shutdown and close, checked against
//! the in-memory `mock` transport. The hook functions are called directly.

use std::ptr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::mock::{pair, MockConn};
use crate::fdtable::{self, Kind};
use crate::hooks::{epoll as ep, fd as fdh, io, poll as ph, socket as sock};

/// A real (unconnected) TCP socket fd, tracked, with `conn` attached.
fn ring_fd(conn: Arc<MockConn>) -> i32 {
    // SAFETY: plain socket creation through libc.
    let fd = unsafe { crate::real::socket(libc::AF_INET, libc::SOCK_STREAM, 0) };
    assert!(fd >= 0);
    let st = match fdtable::get(fd) {
        Some(st) => st,
        None => fdtable::track_new(fd, Kind::Tcp, libc::AF_INET, false).expect("tracked"),
    };
    assert!(st.attach(conn).is_ok());
    fd
}

fn read(fd: i32, n: usize, flags: i32) -> (isize, Vec<u8>) {
    let mut buf = vec![0u8; n];
    // SAFETY: buf is valid for n bytes.
    let r = unsafe { io::recv(fd, buf.as_mut_ptr().cast(), n, flags) };
    buf.truncate(r.max(0) as usize);
    (r, buf)
}

fn write(fd: i32, data: &[u8]) -> isize {
    // SAFETY: data is valid for its length.
    unsafe { io::write(fd, data.as_ptr().cast(), data.len()) }
}

#[test]
fn recv_send_peek_waitall_nonblock() {
    let (a, b) = pair(64);
    let (fa, fb) = (ring_fd(a.clone()), ring_fd(b.clone()));
    assert_eq!(write(fa, b"hello"), 5);
    let mut n: i32 = -1;
    // SAFETY: FIONREAD writes one int.
    assert_eq!(
        unsafe { fdh::ioctl(fb, libc::FIONREAD, &mut n as *mut i32 as usize) },
        0
    );
    assert_eq!(n, 5);
    assert_eq!(read(fb, 3, libc::MSG_PEEK), (3, b"hel".to_vec()));
    assert_eq!(read(fb, 16, 0), (5, b"hello".to_vec()));
    assert_eq!(read(fb, 16, libc::MSG_DONTWAIT).0, -1);
    assert_eq!(crate::sys::errno(), libc::EAGAIN);

    // MSG_WAITALL collects three delayed writes into one recv.
    let writer = std::thread::spawn(move || {
        for part in [b"1234", b"5678", b"9abc"] {
            std::thread::sleep(Duration::from_millis(20));
            assert_eq!(write(fa, part), 4);
        }
        fa
    });
    assert_eq!(
        read(fb, 12, libc::MSG_WAITALL),
        (12, b"123456789abc".to_vec())
    );
    let fa = writer.join().unwrap();

    // A blocking write larger than the ring completes as the reader drains.
    let big: Vec<u8> = (0..1000u32).map(|i| i as u8).collect();
    let expect = big.clone();
    let reader = std::thread::spawn(move || {
        let mut got = Vec::new();
        while got.len() < 1000 {
            let (r, chunk) = read(fb, 100, 0);
            assert!(r > 0);
            got.extend(chunk);
        }
        (fb, got)
    });
    assert_eq!(write(fa, &big), 1000);
    let (fb, got) = reader.join().unwrap();
    assert_eq!(got, expect);

    // O_NONBLOCK via fcntl applies to the ring: a full ring gives a short
    // write, then EAGAIN.
    // SAFETY: F_SETFL with an int argument.
    assert_eq!(
        unsafe { fdh::fcntl(fa, libc::F_SETFL, libc::O_NONBLOCK as usize) },
        0
    );
    assert_eq!(write(fa, &[7u8; 100]), 64);
    assert_eq!(write(fa, b"x"), -1);
    assert_eq!(crate::sys::errno(), libc::EAGAIN);

    // shutdown(SHUT_WR) is end-of-stream for the peer after the data.
    // SAFETY: plain hook calls on our fds.
    assert_eq!(unsafe { sock::shutdown(fa, libc::SHUT_WR) }, 0);
    assert_eq!(read(fb, 100, 0).0, 64);
    assert_eq!(read(fb, 100, 0), (0, vec![]));

    // close releases the connection once, as its owner.
    // SAFETY: closing our fds.
    unsafe {
        assert_eq!(fdh::close(fa), 0);
        assert_eq!(fdh::close(fb), 0);
    }
    assert_eq!(a.releases.load(Ordering::SeqCst), 1);
    assert!(a.last_release_owner.load(Ordering::SeqCst));
}

#[test]
fn dup_shares_the_connection_and_close_releases_last() {
    let (a, _b) = pair(64);
    let fa = ring_fd(a.clone());
    // SAFETY: dup of our fd.
    let d = unsafe { fdh::dup(fa) };
    assert!(d >= 0 && fdtable::attached(d).is_some());
    // SAFETY: closing our fds.
    unsafe { fdh::close(fa) };
    assert_eq!(
        a.releases.load(Ordering::SeqCst),
        0,
        "the dup keeps it open"
    );
    // SAFETY: as above.
    unsafe { fdh::close(d) };
    assert_eq!(a.releases.load(Ordering::SeqCst), 1);
}

#[test]
fn poll_and_select_wake_on_ring_data() {
    let (a, b) = pair(64);
    let (fa, fb) = (ring_fd(a), ring_fd(b));
    let mut p = [libc::pollfd {
        fd: fb,
        events: libc::POLLIN,
        revents: 0,
    }];
    // SAFETY: p is a valid pollfd array.
    assert_eq!(unsafe { ph::poll(p.as_mut_ptr(), 1, 30) }, 0, "nothing yet");
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(30));
        write(fa, b"wake")
    });
    // SAFETY: as above.
    assert_eq!(unsafe { ph::poll(p.as_mut_ptr(), 1, 5000) }, 1);
    assert_eq!(p[0].revents, libc::POLLIN);
    assert_eq!(t.join().unwrap(), 4);

    // SAFETY: fd_set is plain data; FD_* on a valid set.
    unsafe {
        let mut rd: libc::fd_set = std::mem::zeroed();
        libc::FD_SET(fb, &mut rd);
        let mut tv = libc::timeval {
            tv_sec: 1,
            tv_usec: 0,
        };
        assert_eq!(
            ph::select(fb + 1, &mut rd, ptr::null_mut(), ptr::null_mut(), &mut tv),
            1
        );
        assert!(libc::FD_ISSET(fb, &rd));
    }
}

#[test]
fn epoll_level_edge_oneshot() {
    let (a, b) = pair(64);
    let (fa, fb) = (ring_fd(a), ring_fd(b));
    // SAFETY: epoll calls with valid arguments throughout.
    unsafe {
        let epfd = ep::epoll_create1(libc::EPOLL_CLOEXEC);
        assert!(epfd >= 0);
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: 0xfeed,
        };
        assert_eq!(ep::epoll_ctl(epfd, libc::EPOLL_CTL_ADD, fb, &mut ev), 0);
        assert_eq!(ep::epoll_ctl(epfd, libc::EPOLL_CTL_ADD, fb, &mut ev), -1);
        assert_eq!(crate::sys::errno(), libc::EEXIST);
        let mut out = [libc::epoll_event { events: 0, u64: 0 }; 4];
        assert_eq!(ep::epoll_wait(epfd, out.as_mut_ptr(), 4, 20), 0);

        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            write(fa, b"x")
        });
        assert_eq!(ep::epoll_wait(epfd, out.as_mut_ptr(), 4, 5000), 1);
        let (events, data) = (out[0].events, out[0].u64);
        assert_eq!((events, data), (libc::EPOLLIN as u32, 0xfeed));
        assert_eq!(t.join().unwrap(), 1);
        // Level-triggered: reported again while unread.
        assert_eq!(ep::epoll_wait(epfd, out.as_mut_ptr(), 4, 0), 1);

        // Edge-triggered: once per new readiness.
        ev.events = (libc::EPOLLIN | libc::EPOLLET) as u32;
        assert_eq!(ep::epoll_ctl(epfd, libc::EPOLL_CTL_MOD, fb, &mut ev), 0);
        assert_eq!(ep::epoll_wait(epfd, out.as_mut_ptr(), 4, 0), 1);
        assert_eq!(ep::epoll_wait(epfd, out.as_mut_ptr(), 4, 0), 0);

        // Oneshot: once until re-armed with MOD.
        ev.events = (libc::EPOLLIN | libc::EPOLLONESHOT) as u32;
        assert_eq!(ep::epoll_ctl(epfd, libc::EPOLL_CTL_MOD, fb, &mut ev), 0);
        assert_eq!(ep::epoll_wait(epfd, out.as_mut_ptr(), 4, 0), 1);
        assert_eq!(ep::epoll_wait(epfd, out.as_mut_ptr(), 4, 0), 0);

        // Kernel fds in the same set are still reported.
        let efd = libc::eventfd(1, libc::EFD_CLOEXEC);
        let mut kev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: 7,
        };
        assert_eq!(ep::epoll_ctl(epfd, libc::EPOLL_CTL_ADD, efd, &mut kev), 0);
        assert_eq!(ep::epoll_wait(epfd, out.as_mut_ptr(), 4, 0), 1);
        assert_eq!({ out[0].u64 }, 7);

        assert_eq!(
            ep::epoll_ctl(epfd, libc::EPOLL_CTL_DEL, fb, ptr::null_mut()),
            0
        );
        fdh::close(efd);
        fdh::close(epfd);
        fdh::close(fa);
        fdh::close(fb);
    }
}

/// A ring layer double: attaches a mock connection to connects/accepts on
/// the ports listed in `PEERS` (with the far end stored there), declines
/// everything else.
struct MockAttacher;

static PEERS: std::sync::Mutex<Vec<(u16, Arc<MockConn>)>> = std::sync::Mutex::new(Vec::new());

impl crate::attached::Attacher for MockAttacher {
    fn connect(
        &self,
        _fd: i32,
        dest: std::net::SocketAddr,
        _nonblocking: bool,
        connect: &mut dyn FnMut() -> Result<(), crate::Errno>,
    ) -> (Result<(), crate::Errno>, crate::Decision) {
        let res = connect();
        let mut peers = PEERS.lock().unwrap();
        match peers.iter().position(|(p, _)| *p == dest.port()) {
            Some(i) if res.is_ok() => {
                let (mine, theirs) = pair(64);
                peers[i].1 = theirs;
                (res, crate::Decision::Ring(mine))
            }
            _ => (res, crate::Decision::Tcp(crate::TcpReason::Declined)),
        }
    }

    fn accept(
        &self,
        _l: i32,
        _fd: i32,
        local: std::net::SocketAddr,
        _peer: std::net::SocketAddr,
    ) -> crate::Decision {
        let peers = PEERS.lock().unwrap();
        if peers.iter().any(|(p, _)| *p == local.port()) {
            crate::Decision::Ring(pair(64).0)
        } else {
            crate::Decision::Tcp(crate::TcpReason::Declined)
        }
    }

    fn flush_all(&self) {}
}

static ATTACHER: MockAttacher = MockAttacher;

/// A listening socket on 127.0.0.1 (through the hooks, so it is tracked).
fn listener() -> (i32, u16) {
    // SAFETY: socket/bind/listen/getsockname with valid arguments.
    unsafe {
        let l = sock::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        let mut sin: libc::sockaddr_in = std::mem::zeroed();
        sin.sin_family = libc::AF_INET as u16;
        sin.sin_addr.s_addr = u32::from(std::net::Ipv4Addr::LOCALHOST).to_be();
        let len = std::mem::size_of::<libc::sockaddr_in>() as u32;
        assert_eq!(
            sock::bind(l, (&sin as *const libc::sockaddr_in).cast(), len),
            0
        );
        assert_eq!(sock::listen(l, 8), 0);
        let mut got = len;
        sock::getsockname(l, (&mut sin as *mut libc::sockaddr_in).cast(), &mut got);
        (l, u16::from_be(sin.sin_port))
    }
}

#[test]
fn connect_attaches_and_takes_over_earlier_epoll_registration() {
    crate::register_attacher(&ATTACHER);
    let (l, port) = listener();
    PEERS.lock().unwrap().push((port, pair(1).0));
    // SAFETY: hook calls with valid arguments throughout.
    unsafe {
        let c = sock::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
        assert!(fdtable::get(c).is_some_and(|s| s.is_preconnect()));
        let epfd = ep::epoll_create1(0);
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: 42,
        };
        // Registered before connect, as nginx does for upstreams.
        assert_eq!(ep::epoll_ctl(epfd, libc::EPOLL_CTL_ADD, c, &mut ev), 0);
        let mut sin: libc::sockaddr_in = std::mem::zeroed();
        sin.sin_family = libc::AF_INET as u16;
        sin.sin_port = port.to_be();
        sin.sin_addr.s_addr = u32::from(std::net::Ipv4Addr::LOCALHOST).to_be();
        let len = std::mem::size_of::<libc::sockaddr_in>() as u32;
        assert_eq!(
            sock::connect(c, (&sin as *const libc::sockaddr_in).cast(), len),
            0
        );
        assert!(
            fdtable::attached(c).is_some(),
            "the attacher's ring is attached"
        );

        let peer = PEERS
            .lock()
            .unwrap()
            .iter()
            .find(|(p, _)| *p == port)
            .unwrap()
            .1
            .clone();
        let mut out = [libc::epoll_event { events: 0, u64: 0 }; 2];
        assert_eq!(ep::epoll_wait(epfd, out.as_mut_ptr(), 2, 0), 0);
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            use crate::AttachedConn;
            peer.try_send(&[std::io::IoSlice::new(b"ring")]).unwrap()
        });
        assert_eq!(ep::epoll_wait(epfd, out.as_mut_ptr(), 2, 5000), 1);
        assert_eq!({ out[0].u64 }, 42);
        assert_eq!(t.join().unwrap(), 4);
        assert_eq!(read(c, 16, 0), (4, b"ring".to_vec()));
        fdh::close(epfd);
        fdh::close(c);
        fdh::close(l);
    }
}

#[test]
fn declined_connect_stays_tcp_and_works() {
    crate::register_attacher(&ATTACHER);
    let (l, port) = listener();
    // SAFETY: hook calls with valid arguments throughout.
    unsafe {
        let c = sock::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
        let mut sin: libc::sockaddr_in = std::mem::zeroed();
        sin.sin_family = libc::AF_INET as u16;
        sin.sin_port = port.to_be();
        sin.sin_addr.s_addr = u32::from(std::net::Ipv4Addr::LOCALHOST).to_be();
        let len = std::mem::size_of::<libc::sockaddr_in>() as u32;
        assert_eq!(
            sock::connect(c, (&sin as *const libc::sockaddr_in).cast(), len),
            0
        );
        let st = fdtable::get(c).unwrap();
        assert!(st.conn().is_none());
        assert_eq!(st.tcp_reason(), crate::TcpReason::Declined);
        let a = sock::accept(l, ptr::null_mut(), ptr::null_mut());
        assert!(
            a >= 0 && fdtable::get(a).is_some(),
            "accepted sockets are tracked"
        );
        assert!(fdtable::attached(a).is_none());
        assert_eq!(write(c, b"tcp"), 3);
        assert_eq!(read(a, 8, 0), (3, b"tcp".to_vec()));
        for fd in [a, c, l] {
            fdh::close(fd);
        }
    }
}
