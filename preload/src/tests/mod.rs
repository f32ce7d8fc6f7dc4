//! The hooks dispatch ring-attached fds to their `AttachedConn`: blocking
//! and non-blocking recv/send, MSG_PEEK, MSG_WAITALL, FIONREAD, poll,
//! select, epoll (level, edge, oneshot), shutdown and close, checked against
//! the in-memory `mock` transport. The hook functions are called directly.

use std::ptr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

mod layers;
mod mock;
mod sandbox;

use mock::{pair, pair_with_sockets, MockConn};

use crate::attached::{self, AttachedConn, Attacher, Decision, Errno, TcpMemo, TcpReason};
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
    let r = unsafe { fdh::ioctl(fb, libc::FIONREAD, &mut n as *mut i32 as usize) };
    assert_eq!(r, 0);
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
    let r = unsafe { fdh::fcntl(fa, libc::F_SETFL, libc::O_NONBLOCK as usize) };
    assert_eq!(r, 0);
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
fn peek_waitall_waits_for_the_length_and_takes_nothing() {
    let (a, b) = pair(64);
    let (fa, fb) = (ring_fd(a), ring_fd(b));
    let peek_all = libc::MSG_PEEK | libc::MSG_WAITALL;
    assert_eq!(write(fa, b"1234"), 4);
    // Without waiting: what is there.
    assert_eq!(
        read(fb, 12, peek_all | libc::MSG_DONTWAIT),
        (4, b"1234".to_vec())
    );
    // Blocking: each write leaves it short until the last.
    let writer = std::thread::spawn(move || {
        for part in [b"5678", b"9abc"] {
            std::thread::sleep(Duration::from_millis(20));
            assert_eq!(write(fa, part), 4);
        }
        fa
    });
    assert_eq!(read(fb, 12, peek_all), (12, b"123456789abc".to_vec()));
    let fa = writer.join().unwrap();
    assert_eq!(read(fb, 16, 0), (12, b"123456789abc".to_vec()));

    // The end of the stream ends the wait with what there is.
    assert_eq!(write(fa, b"xy"), 2);
    let closer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(20));
        // SAFETY: plain hook call on our fd.
        assert_eq!(unsafe { sock::shutdown(fa, libc::SHUT_WR) }, 0);
        fa
    });
    assert_eq!(read(fb, 12, peek_all), (2, b"xy".to_vec()));
    let fa = closer.join().unwrap();
    assert_eq!(read(fb, 12, 0), (2, b"xy".to_vec()));
    assert_eq!(read(fb, 12, peek_all), (0, vec![]));
    // SAFETY: closing our fds.
    unsafe {
        fdh::close(fa);
        fdh::close(fb);
    }
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

/// Held by tests that open thousands of fds and by tests that need fds
/// below FD_SETSIZE (select), which must not run at the same time.
static MANY_FDS: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn many_fds() -> std::sync::MutexGuard<'static, ()> {
    MANY_FDS.lock().unwrap_or_else(|p| p.into_inner())
}

#[test]
fn poll_and_select_wake_on_ring_data() {
    let _fds = many_fds();
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

    assert!(
        (fb as usize) < libc::FD_SETSIZE,
        "fd {fb} cannot be used with select"
    );
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
fn a_ready_kernel_fd_answers_a_mixed_poll_without_arming_the_ring() {
    let _fds = many_fds();
    let (a, b) = pair(64);
    let fb = ring_fd(b.clone());
    let mut pipe = [0i32; 2];
    // SAFETY: pipe writes two fds into the array.
    assert_eq!(unsafe { libc::pipe(pipe.as_mut_ptr()) }, 0);
    // SAFETY: one byte from a valid buffer into our pipe.
    assert_eq!(unsafe { libc::write(pipe[1], b"k".as_ptr().cast(), 1) }, 1);
    let mut p = [
        libc::pollfd {
            fd: fb,
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: pipe[0],
            events: libc::POLLIN | libc::POLLPRI,
            revents: -1,
        },
    ];
    let arms = b.arm_calls.load(Ordering::Relaxed);
    // SAFETY: p is a valid pollfd array.
    assert_eq!(unsafe { ph::poll(p.as_mut_ptr(), 2, 5000) }, 1);
    assert_eq!((p[0].revents, p[1].revents), (0, libc::POLLIN));
    assert_eq!(
        b.arm_calls.load(Ordering::Relaxed),
        arms,
        "no arm, no sleep"
    );
    // The same with the ring ready too: both entries, as the kernel would.
    let fa = ring_fd(a);
    assert_eq!(write(fa, b"r"), 1);
    // SAFETY: as above.
    assert_eq!(unsafe { ph::poll(p.as_mut_ptr(), 2, 5000) }, 2);
    assert_eq!((p[0].revents, p[1].revents), (libc::POLLIN, libc::POLLIN));
    // And with nothing ready a zero timeout returns at once.
    assert_eq!(read(fb, 8, 0).1, b"r");
    let mut k = [0u8; 1];
    // SAFETY: one byte into a valid buffer from our pipe.
    assert_eq!(unsafe { libc::read(pipe[0], k.as_mut_ptr().cast(), 1) }, 1);
    // SAFETY: as above.
    assert_eq!(unsafe { ph::poll(p.as_mut_ptr(), 2, 0) }, 0);
    assert_eq!((p[0].revents, p[1].revents), (0, 0));
    for fd in [fa, fb, pipe[0], pipe[1]] {
        // SAFETY: closing fds this test opened.
        unsafe { fdh::close(fd) };
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

impl Attacher for MockAttacher {
    fn connect(
        &self,
        _fd: i32,
        dest: std::net::SocketAddr,
        _nonblocking: bool,
        connect: &mut dyn FnMut() -> Result<(), Errno>,
        _memo: &mut TcpMemo,
    ) -> (Result<(), Errno>, Decision) {
        let res = connect();
        let mut peers = PEERS.lock().unwrap();
        match peers.iter().position(|(p, _)| *p == dest.port()) {
            Some(i) if res.is_ok() => {
                let (mine, theirs) = pair(64);
                peers[i].1 = theirs;
                (res, Decision::Ring(mine))
            }
            _ => (res, Decision::Tcp(TcpReason::Declined)),
        }
    }

    fn accept(
        &self,
        _l: i32,
        _fd: i32,
        local: std::net::SocketAddr,
        _peer: std::net::SocketAddr,
        _memo: &mut TcpMemo,
    ) -> Decision {
        let peers = PEERS.lock().unwrap();
        if peers.iter().any(|(p, _)| *p == local.port()) {
            Decision::Ring(pair(64).0)
        } else {
            Decision::Tcp(TcpReason::Declined)
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

/// connect(2) through the hook, to 127.0.0.1:`port`.
fn connect_loopback(fd: i32, port: u16) -> i32 {
    let sin = libc::sockaddr_in {
        sin_family: libc::AF_INET as u16,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(std::net::Ipv4Addr::LOCALHOST).to_be(),
        },
        sin_zero: [0; 8],
    };
    let len = std::mem::size_of::<libc::sockaddr_in>() as u32;
    // SAFETY: sin is a sockaddr_in of len bytes that outlives the call.
    unsafe { sock::connect(fd, (&sin as *const libc::sockaddr_in).cast(), len) }
}

#[test]
fn connect_attaches_and_takes_over_earlier_epoll_registration() {
    attached::register_attacher(&ATTACHER);
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
        assert_eq!(connect_loopback(c, port), 0);
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
    attached::register_attacher(&ATTACHER);
    let (l, port) = listener();
    // SAFETY: hook calls with valid arguments throughout.
    unsafe {
        let c = sock::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
        assert_eq!(connect_loopback(c, port), 0);
        let st = fdtable::get(c).unwrap();
        assert!(st.conn().is_none());
        assert_eq!(st.tcp_reason(), TcpReason::Declined);
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

/// Raises the soft fd limit towards `want`; returns the new soft limit.
fn raise_nofile(want: u64) -> u64 {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid struct.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl);
        if rl.rlim_cur < want {
            rl.rlim_cur = want.min(rl.rlim_max);
            libc::setrlimit(libc::RLIMIT_NOFILE, &rl);
        }
    }
    rl.rlim_cur
}

/// Calls of `readiness` and `arm` on `c` so far, then resets them.
fn take_calls(c: &MockConn) -> u64 {
    c.readiness_calls.swap(0, Ordering::SeqCst) + c.arm_calls.swap(0, Ordering::SeqCst)
}

fn epoll_add(epfd: i32, fd: i32, events: i32, data: u64) {
    let mut ev = libc::epoll_event {
        events: events as u32,
        u64: data,
    };
    // SAFETY: valid event for the call.
    let r = unsafe { ep::epoll_ctl(epfd, libc::EPOLL_CTL_ADD, fd, &mut ev) };
    assert_eq!(r, 0);
}

fn epoll_wait(epfd: i32, max: usize, timeout: i32) -> Vec<(u32, u64)> {
    let mut out = vec![libc::epoll_event { events: 0, u64: 0 }; max];
    // SAFETY: out is valid for max entries.
    let n = unsafe { ep::epoll_wait(epfd, out.as_mut_ptr(), max as i32, timeout) };
    assert!(n >= 0, "epoll_wait failed: errno {}", crate::sys::errno());
    out[..n as usize]
        .iter()
        .map(|e| (e.events, e.u64))
        .collect()
}

#[test]
fn epoll_wait_cost_does_not_grow_with_idle_connections() {
    let _fds = many_fds();
    // Five fds per idle connection (its socket, the pair's four doorbells).
    let limit = raise_nofile(8000);
    let idle = 1000usize.min((limit.saturating_sub(400) / 5) as usize);
    assert!(idle >= 100, "fd limit {limit} too low for this test");
    // SAFETY: plain hook call.
    let epfd = unsafe { ep::epoll_create1(libc::EPOLL_CLOEXEC) };
    assert!(epfd >= 0);
    let mut conns = Vec::with_capacity(idle);
    for i in 0..idle {
        let (a, b) = pair(64);
        let fd = ring_fd(a.clone());
        epoll_add(epfd, fd, libc::EPOLLIN, i as u64);
        conns.push((a, b, fd));
    }
    let (ra, rb) = pair(64);
    let rfd = ring_fd(ra.clone());
    epoll_add(epfd, rfd, libc::EPOLLIN, 0xbeef);
    {
        assert_eq!(rb.try_send(&[std::io::IoSlice::new(b"ready")]), Ok(5));
    }

    // The first wait looks at everything (all were just added) and arms
    // the idle ones, once.
    let got = epoll_wait(epfd, 8, 0);
    assert_eq!(got, vec![(libc::EPOLLIN as u32, 0xbeef)]);
    for (a, _, _) in &conns {
        assert_eq!(a.arms().rx, 1, "each idle connection holds one arm");
        take_calls(a);
    }
    take_calls(&ra);

    // Later waits look at the ready connection only.
    for _ in 0..10 {
        let got = epoll_wait(epfd, 8, 0);
        assert_eq!(got, vec![(libc::EPOLLIN as u32, 0xbeef)]);
    }
    let idle_calls: u64 = conns.iter().map(|(a, _, _)| take_calls(a)).sum();
    assert_eq!(idle_calls, 0, "idle connections were looked at");
    let ready_calls = take_calls(&ra);
    assert!(
        ready_calls <= 20,
        "{ready_calls} calls for 10 waits on one ready connection"
    );
    assert_eq!(ra.arms().rx, 0, "a reported registration holds no arm");

    // Data on one idle connection wakes a blocking wait, with its data.
    assert_eq!(read(rfd, 16, 0), (5, b"ready".to_vec()));
    let target = idle / 2;
    let sender = conns[target].1.clone();
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(30));
        sender.try_send(&[std::io::IoSlice::new(b"wake")]).unwrap()
    });
    let got = epoll_wait(epfd, 8, 5000);
    assert_eq!(got, vec![(libc::EPOLLIN as u32, target as u64)]);
    assert_eq!(t.join().unwrap(), 4);
    let others: u64 = conns
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != target)
        .map(|(_, (a, _, _))| take_calls(a))
        .sum();
    assert_eq!(others, 0, "a wake-up looked at idle connections");
    assert!(take_calls(&conns[target].0) <= 4);
    assert_eq!(conns[target].0.arms().rx, 0, "disarmed when its fd fired");

    // EPOLL_CTL_DEL gives the arm back; closing the epoll fd gives back
    // all the others.
    // SAFETY: hook calls on our fds.
    unsafe {
        let fd0 = conns[0].2;
        assert_eq!(
            ep::epoll_ctl(epfd, libc::EPOLL_CTL_DEL, fd0, ptr::null_mut()),
            0
        );
        assert_eq!(conns[0].0.arms().rx, 0);
        assert_eq!(conns[1].0.arms().rx, 1);
        fdh::close(epfd);
    }
    for (a, _, _) in &conns {
        assert_eq!(a.arms(), mock::Arms::default());
    }
    // SAFETY: closing our fds.
    unsafe {
        for (_, _, fd) in &conns {
            fdh::close(*fd);
        }
        fdh::close(rfd);
    }
}

#[test]
fn nested_arms_two_sets_a_poll_and_a_blocking_reader_all_wake() {
    let (a, b) = pair(64);
    let (fa, fb) = (ring_fd(a), ring_fd(b.clone()));
    // SAFETY: plain hook calls.
    let (ep1, ep2) = unsafe {
        (
            ep::epoll_create1(libc::EPOLL_CLOEXEC),
            ep::epoll_create1(libc::EPOLL_CLOEXEC),
        )
    };
    epoll_add(ep1, fb, libc::EPOLLIN, 1);
    epoll_add(ep2, fb, libc::EPOLLIN, 2);
    assert!(epoll_wait(ep1, 4, 0).is_empty());
    assert!(epoll_wait(ep2, 4, 0).is_empty());
    assert_eq!(b.arms().rx, 2, "both sets hold an arm");

    let w1 = std::thread::spawn(move || epoll_wait(ep1, 4, 5000));
    let w2 = std::thread::spawn(move || epoll_wait(ep2, 4, 5000));
    let reader = std::thread::spawn(move || read(fb, 16, libc::MSG_PEEK));
    let poller = std::thread::spawn(move || {
        let mut p = [libc::pollfd {
            fd: fb,
            events: libc::POLLIN,
            revents: 0,
        }];
        // SAFETY: p is a valid pollfd array.
        let n = unsafe { ph::poll(p.as_mut_ptr(), 1, 5000) };
        (n, p[0].revents)
    });
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(write(fa, b"x"), 1);
    assert_eq!(w1.join().unwrap(), vec![(libc::EPOLLIN as u32, 1)]);
    assert_eq!(w2.join().unwrap(), vec![(libc::EPOLLIN as u32, 2)]);
    assert_eq!(reader.join().unwrap(), (1, b"x".to_vec()));
    assert_eq!(poller.join().unwrap(), (1, libc::POLLIN));
    assert_eq!(b.arms(), mock::Arms::default(), "every arm was given back");

    // Once the data is read, both sets arm again; a second write wakes a
    // set that is already sleeping.
    assert_eq!(read(fb, 16, 0), (1, b"x".to_vec()));
    assert!(epoll_wait(ep1, 4, 0).is_empty());
    let w1 = std::thread::spawn(move || epoll_wait(ep1, 4, 5000));
    std::thread::sleep(Duration::from_millis(30));
    assert_eq!(write(fa, b"y"), 1);
    assert_eq!(w1.join().unwrap(), vec![(libc::EPOLLIN as u32, 1)]);
    // SAFETY: closing our fds.
    unsafe {
        fdh::close(ep1);
        fdh::close(ep2);
        fdh::close(fa);
        fdh::close(fb);
    }
    assert_eq!(b.arms(), mock::Arms::default());
}

#[test]
fn epoll_arms_follow_mod_del_dup_and_close() {
    let (a, b) = pair(64);
    let fb = ring_fd(b.clone());
    // SAFETY: hook calls with valid arguments throughout.
    unsafe {
        let d = fdh::dup(fb);
        let epfd = ep::epoll_create1(0);
        epoll_add(epfd, fb, libc::EPOLLIN, 1);
        epoll_add(epfd, d, libc::EPOLLIN | libc::EPOLLRDHUP, 2);
        assert!(epoll_wait(epfd, 4, 0).is_empty());
        assert_eq!(b.arms().rx, 2, "dup'd registrations arm separately");

        // MOD gives the arm back and looks again; the next wait re-arms.
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: 3,
        };
        assert_eq!(ep::epoll_ctl(epfd, libc::EPOLL_CTL_MOD, fb, &mut ev), 0);
        assert_eq!(b.arms().rx, 1);
        assert!(epoll_wait(epfd, 4, 0).is_empty());
        assert_eq!(b.arms().rx, 2);

        // Both registrations of the connection wake from its one doorbell.
        {
            a.try_send(&[std::io::IoSlice::new(b"z")]).unwrap();
        }
        let mut got = epoll_wait(epfd, 4, 1000);
        got.sort_by_key(|e| e.1);
        let rd = libc::EPOLLIN as u32;
        assert_eq!(got, vec![(rd, 2), (rd, 3)]);
        assert_eq!(read(fb, 16, 0), (1, b"z".to_vec()));
        assert!(epoll_wait(epfd, 4, 0).is_empty());
        assert_eq!(b.arms().rx, 2);

        // DEL gives one back.
        assert_eq!(
            ep::epoll_ctl(epfd, libc::EPOLL_CTL_DEL, d, ptr::null_mut()),
            0
        );
        assert_eq!(b.arms().rx, 1);

        // Closing every fd of the connection ends its registration: never
        // reported again, and its arm is given back (by the sweep).
        fdh::close(d);
        fdh::close(fb);
        assert!(epoll_wait(epfd, 4, 0).is_empty());
        assert_eq!(b.arms(), mock::Arms::default());

        // Peer shutdown after close reports nothing.
        assert!(epoll_wait(epfd, 4, 0).is_empty());
        fdh::close(epfd);
    }
}

/// The kernel drops a closed file from its epoll instances at its last
/// close; so must the shim, with no later wait: an event loop that blocks
/// for good after its last connection closed (memcached's workers) would
/// otherwise hold each closed ring's memory.
#[test]
fn last_close_lets_every_epoll_set_drop_the_connection() {
    let (_a, b) = pair(64);
    let (_c, d) = pair(64);
    let fb = ring_fd(b.clone());
    let fd = ring_fd(d.clone());
    assert_eq!((Arc::strong_count(&b), Arc::strong_count(&d)), (2, 2));
    // SAFETY: hook calls with valid arguments throughout.
    unsafe {
        let ep1 = ep::epoll_create1(0);
        let ep2 = ep::epoll_create1(0);
        epoll_add(ep1, fb, libc::EPOLLIN, 1);
        epoll_add(ep2, fb, libc::EPOLLIN, 2);
        epoll_add(ep1, fd, libc::EPOLLIN, 3);
        assert!(epoll_wait(ep1, 4, 0).is_empty());
        assert!(epoll_wait(ep2, 4, 0).is_empty());
        // libevent's order: DEL, then close. The set keeps the entry of a
        // deleted but open socket (cheap re-ADD); the close ends it.
        assert_eq!(
            ep::epoll_ctl(ep1, libc::EPOLL_CTL_DEL, fb, ptr::null_mut()),
            0
        );
        assert!(Arc::strong_count(&b) > 1);
        assert_eq!(fdh::close(fb), 0);
        // Closed while still registered (and armed) in ep1.
        assert_eq!(fdh::close(fd), 0);
        assert_eq!(
            Arc::strong_count(&b),
            1,
            "a set still holds the closed ring"
        );
        assert_eq!(
            Arc::strong_count(&d),
            1,
            "a set still holds the closed ring"
        );
        assert_eq!(d.arms(), mock::Arms::default());
        assert!(epoll_wait(ep1, 4, 0).is_empty());
        assert!(epoll_wait(ep2, 4, 0).is_empty());
        fdh::close(ep1);
        fdh::close(ep2);
    }
}

#[test]
fn epoll_ctl_from_another_thread_wakes_a_sleeping_wait() {
    let (a, _a_peer) = pair(64);
    let (b, b_peer) = pair(64);
    let (fa, fb) = (ring_fd(a), ring_fd(b));
    // SAFETY: plain hook call.
    let epfd = unsafe { ep::epoll_create1(0) };
    epoll_add(epfd, fa, libc::EPOLLIN, 1);
    {
        b_peer.try_send(&[std::io::IoSlice::new(b"ready")]).unwrap();
    }
    let w = std::thread::spawn(move || {
        let t0 = std::time::Instant::now();
        (epoll_wait(epfd, 4, 5000), t0.elapsed())
    });
    std::thread::sleep(Duration::from_millis(50));
    // A registration that is ready at once, added while the waiter sleeps.
    epoll_add(epfd, fb, libc::EPOLLIN, 2);
    let (got, took) = w.join().unwrap();
    assert_eq!(got, vec![(libc::EPOLLIN as u32, 2)]);
    assert!(took < Duration::from_secs(2), "woke after {took:?}");
    // SAFETY: closing our fds.
    unsafe {
        fdh::close(epfd);
        fdh::close(fa);
        fdh::close(fb);
    }
}

/// This thread's voluntary context switches so far: each is a sleep.
fn sleeps_of_this_thread() -> u64 {
    let status = std::fs::read_to_string("/proc/thread-self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("voluntary_ctxt_switches in /proc/thread-self/status")
}

/// apache event's hand-over: a listener thread sleeps in epoll_wait while
/// a worker, done with a keep-alive request, puts the quiet connection
/// back into the listener's set (EPOLL_CTL_ADD, or MOD of a oneshot
/// registration). The kernel wakes no waiter for a quiet fd, so the
/// listener sleeps once per request; a wake-up for the hand-over cost it
/// a second sleep each time. The hand-over itself arms the registration,
/// so the request's doorbell reaches the sleeper.
#[test]
fn a_quiet_connection_handed_to_a_sleeping_set_wakes_nobody() {
    const ROUNDS: u64 = 4;
    let (_ia, ib) = pair(64);
    let fi = ring_fd(ib);
    for oneshot in [false, true] {
        let (a, b) = pair(64);
        let fb = ring_fd(b.clone());
        // SAFETY: plain hook call.
        let epfd = unsafe { ep::epoll_create1(0) };
        // An idle ring keeps the set's waits in the shim from the start.
        epoll_add(epfd, fi, libc::EPOLLIN, 1);
        let events = libc::EPOLLIN | if oneshot { libc::EPOLLONESHOT } else { 0 };
        let (done, handled) = std::sync::mpsc::channel();
        // The listener: each request wakes it; it takes the request and
        // the connection out of its set, and waits again.
        let listener = std::thread::spawn(move || {
            let before = sleeps_of_this_thread();
            for _ in 0..ROUNDS {
                assert_eq!(epoll_wait(epfd, 4, 5000), vec![(libc::EPOLLIN as u32, 2)]);
                assert_eq!(read(fb, 16, 0), (3, b"GET".to_vec()));
                if !oneshot {
                    // SAFETY: plain hook call.
                    let r =
                        unsafe { ep::epoll_ctl(epfd, libc::EPOLL_CTL_DEL, fb, ptr::null_mut()) };
                    assert_eq!(r, 0);
                }
                done.send(()).unwrap();
            }
            sleeps_of_this_thread() - before
        });
        for round in 0..ROUNDS {
            if round == 0 && oneshot {
                epoll_add(epfd, fb, events, 2);
            } else {
                // The worker hands the connection back while the listener
                // sleeps.
                std::thread::sleep(Duration::from_millis(20));
                let mut ev = libc::epoll_event {
                    events: events as u32,
                    u64: 2,
                };
                let op = if oneshot {
                    libc::EPOLL_CTL_MOD
                } else {
                    libc::EPOLL_CTL_ADD
                };
                // SAFETY: valid event for the call.
                assert_eq!(unsafe { ep::epoll_ctl(epfd, op, fb, &mut ev) }, 0);
                assert_eq!(b.arms().rx, 1, "the hand-over armed the quiet connection");
            }
            std::thread::sleep(Duration::from_millis(20));
            a.try_send(&[std::io::IoSlice::new(b"GET")]).unwrap();
            handled.recv_timeout(Duration::from_secs(5)).unwrap();
        }
        let sleeps = listener.join().unwrap();
        // One sleep per request; a stray one (a page fault, a lock) is let
        // pass, a second sleep per request is not.
        assert!(
            sleeps < ROUNDS + ROUNDS / 2,
            "oneshot {oneshot}: the listener slept {sleeps} times for {ROUNDS} requests"
        );
        // SAFETY: closing our fds.
        unsafe {
            fdh::close(epfd);
            fdh::close(fb);
        }
    }
    // SAFETY: closing our fd.
    unsafe { fdh::close(fi) };
}

#[test]
fn epoll_edge_triggered_reports_each_arrival_and_sleeps_between() {
    let (a, b) = pair(64);
    let (fa, fb) = (ring_fd(a), ring_fd(b));
    // SAFETY: plain hook call.
    let epfd = unsafe { ep::epoll_create1(0) };
    epoll_add(epfd, fb, libc::EPOLLIN | libc::EPOLLOUT | libc::EPOLLET, 9);
    let both = (libc::EPOLLIN | libc::EPOLLOUT) as u32;
    assert_eq!(
        epoll_wait(epfd, 4, 0),
        vec![(libc::EPOLLOUT as u32, 9)],
        "writable at once"
    );
    // Stays writable: no new edge, so a wait sleeps until the timeout.
    let t0 = std::time::Instant::now();
    assert!(epoll_wait(epfd, 4, 50).is_empty());
    assert!(t0.elapsed() >= Duration::from_millis(40));
    // Every arrival is an edge, even while the data is unread.
    for _ in 0..3 {
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            write(fa, b"e")
        });
        assert_eq!(epoll_wait(epfd, 4, 5000), vec![(both, 9)]);
        assert_eq!(t.join().unwrap(), 1);
        assert!(epoll_wait(epfd, 4, 0).is_empty());
    }
    // SAFETY: closing our fds.
    unsafe {
        fdh::close(epfd);
        fdh::close(fa);
        fdh::close(fb);
    }
}

#[test]
fn epoll_looks_at_the_kernel_socket_only_when_it_fires() {
    let (a, b) = pair_with_sockets(64);
    let (fa, fb) = (ring_fd(a), ring_fd(b.clone()));
    // SAFETY: plain hook call.
    let epfd = unsafe { ep::epoll_create1(0) };
    let want = (libc::EPOLLIN | libc::EPOLLRDHUP) as u32;
    epoll_add(epfd, fb, want as i32, 7);
    // Nothing to report: the registration is armed, its socket unlooked at.
    assert!(epoll_wait(epfd, 4, 0).is_empty());
    assert!(epoll_wait(epfd, 4, 0).is_empty());
    assert_eq!(b.socket_looks.load(Ordering::SeqCst), 0);
    // The peer dies: only the socket hears of it, and the sleeping wait
    // must look at it to report the end of the stream.
    let b2 = b.clone();
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(20));
        b2.socket_news();
    });
    assert_eq!(epoll_wait(epfd, 4, 5000), vec![(want, 7)]);
    t.join().unwrap();
    assert_eq!(b.socket_looks.load(Ordering::SeqCst), 1);
    // SAFETY: closing our fds.
    unsafe {
        fdh::close(epfd);
        fdh::close(fa);
        fdh::close(fb);
    }
}
