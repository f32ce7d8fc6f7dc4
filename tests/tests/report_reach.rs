//! A client's ring connection shows in `ringsock-ctl status` while the
//! client uses it, whenever the shim's background thread gets to run: a
//! process whose thread cannot start at all, and many clients at once
//! beside CPU-bound threads (where a new thread may wait long for a CPU).
//! Every client here waits in poll(2) on its connection until the test,
//! having seen both ends on one ring, stops it; the waits are bounds only.

use std::time::Duration;

use ringsock_integration::{links, show, Conn, Ctl, Link, Server};

const CONNLOOP: &str = env!("CARGO_BIN_EXE_connloop");
const HOLDCONN: &str = env!("CARGO_BIN_EXE_holdconn");
/// Bound on every wait for a report.
const REPORTED: Duration = Duration::from_secs(30);

/// A shimmed echo server on this daemon and its port.
fn echo_server(ctl: &Ctl) -> (Server, u16) {
    let mut s = ctl.shimmed(CONNLOOP).arg("echo-server").spawn();
    let line = s.wait_line("listening", Duration::from_secs(10));
    let port = line["listening ".len()..].parse().expect("port number");
    (s, port)
}

/// Starts a holdconn client of `port`; returns it and its local port once
/// its connection is up.
fn hold(ctl: &Ctl, port: u16, extra: &[&str]) -> (Server, u16) {
    let mut c = ctl
        .shimmed(HOLDCONN)
        .args(["--port", &port.to_string()])
        .args(extra)
        .spawn();
    let line = c.wait_line("connected", REPORTED);
    let local = line["connected ".len()..].parse().expect("local port");
    (c, local)
}

/// The link of the client end (`pid`, local port `local`) to `port` in a
/// status sample, if both ends are there.
fn link_of(sample: &[Conn], port: u16, pid: u32, local: u16) -> Option<Link> {
    links(sample, port)
        .into_iter()
        .find(|l| l.client.pid == pid && l.client.local.port() == local)
}

/// Waits until status shows every client of `clients` (pid, local port)
/// with both ends of its connection to `port` on one shm ring.
fn assert_reported(ctl: &Ctl, port: u16, clients: &[(u32, u16)]) {
    let mut last = Vec::new();
    let seen = ctl.wait_for(REPORTED, |s| {
        last = s.to_vec();
        clients
            .iter()
            .all(|&(pid, local)| link_of(s, port, pid, local).is_some())
    });
    let Some(sample) = seen else {
        panic!(
            "within {REPORTED:?} status did not show both ends of every client in {clients:?}; last sample:\n{}",
            show(&last)
        );
    };
    for &(pid, local) in clients {
        let l = link_of(&sample, port, pid, local).expect("seen above");
        assert!(l.is_shm(), "not on one shm ring: {l}");
    }
}

#[test]
fn a_client_whose_shim_thread_never_runs_is_reported() {
    let ctl = Ctl::start();
    let (mut server, port) = echo_server(&ctl);
    let (mut client, local) = hold(&ctl, port, &["--no-threads"]);
    assert_reported(&ctl, port, &[(client.pid(), local)]);
    client.assert_running();
    let (_, out, err) = client.stop();
    assert!(
        out.contains("threads refused") && err.contains("cannot start the ringsock thread"),
        "the client's shim thread ran after all:\n{out}{err}"
    );
    server.stop();
    ctl.assert_clean("no-thread client", Duration::from_secs(15));
}

#[test]
fn every_client_is_reported_beside_cpu_hogs() {
    const ROUNDS: usize = 3;
    const AT_ONCE: usize = 8;
    let ctl = Ctl::start();
    let (mut server, port) = echo_server(&ctl);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let hogs: Vec<_> = (0..2)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
        })
        .collect();
    for _ in 0..ROUNDS {
        let mut clients: Vec<(Server, u16)> = (0..AT_ONCE).map(|_| hold(&ctl, port, &[])).collect();
        let ids: Vec<(u32, u16)> = clients.iter().map(|(c, l)| (c.pid(), *l)).collect();
        assert_reported(&ctl, port, &ids);
        for (c, _) in &mut clients {
            c.assert_running();
            c.stop();
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for h in hogs {
        h.join().expect("hog thread");
    }
    server.stop();
    ctl.assert_clean("clients beside hogs", Duration::from_secs(15));
}

/// A listener on 127.0.0.1 whose accept queue takes one connection
/// (listen backlog 0), and that connection, which fills it: a further
/// SYN is dropped until the queue has room, so its connect stays in
/// progress.
fn full_listener() -> (std::net::TcpListener, std::net::TcpStream, u16) {
    use std::os::fd::FromRawFd;
    // SAFETY: plain socket calls on a descriptor this function owns; the
    // sockaddr is a valid sockaddr_in of its size.
    let listener = unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
        let mut sa: libc::sockaddr_in = std::mem::zeroed();
        sa.sin_family = libc::AF_INET as libc::sa_family_t;
        sa.sin_addr.s_addr = u32::from(std::net::Ipv4Addr::LOCALHOST).to_be();
        let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        assert_eq!(
            libc::bind(fd, (&sa as *const libc::sockaddr_in).cast(), len),
            0
        );
        assert_eq!(libc::listen(fd, 0), 0);
        std::net::TcpListener::from_raw_fd(fd)
    };
    let port = listener.local_addr().unwrap().port();
    let filler = std::net::TcpStream::connect(("127.0.0.1", port)).expect("filler");
    (listener, filler, port)
}

/// A connection kept off the ring by the port knobs shows in status with
/// its reason, also when its non-blocking connect was still in progress
/// when the shim decided (the socket had no peer to tell yet): here the
/// server's accept queue is full at the connect, and gets room later.
#[test]
fn an_excluded_nonblocking_connect_is_reported() {
    let ctl = Ctl::start();
    let (listener, filler, port) = full_listener();
    let script = format!(
        "import socket, select, sys, time\n\
         s = socket.socket()\n\
         s.setblocking(False)\n\
         r = s.connect_ex(('127.0.0.1', {port}))\n\
         select.select([], [s], [], 20)\n\
         print('connected', s.getsockname()[1], r, flush=True)\n\
         time.sleep(60)\n"
    );
    let mut c = ctl
        .shimmed("python3")
        .env("RINGSOCK_EXCLUDE_PORTS", port.to_string())
        .args(["-c", &script])
        .spawn();
    // Room in the queue once the client's first SYN was dropped: its
    // retransmission (after about a second) completes the connect.
    std::thread::sleep(Duration::from_millis(300));
    let first = listener.accept().expect("accept");
    drop(filler);
    let line = c.wait_line("connected", REPORTED);
    let mut words = line.split_whitespace().skip(1);
    let local: u16 = words.next().and_then(|w| w.parse().ok()).expect("port");
    let started = words.next().unwrap_or("");
    let end = std::time::Instant::now() + REPORTED;
    let found = loop {
        let conns: Vec<Conn> = ctl.status();
        if let Some(c) = conns.iter().find(|c| c.local.port() == local) {
            break Some(c.clone());
        }
        if std::time::Instant::now() >= end {
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let Some(conn) = found else {
        panic!(
            "the excluded client (connect_ex gave {started}) never appeared in status:\n{}",
            show(&ctl.status())
        );
    };
    assert_eq!(conn.transport, "tcp", "{conn:?}");
    assert_eq!(conn.reason, "port excluded", "{conn:?}");
    assert_eq!(conn.peer.port(), port, "{conn:?}");
    drop((listener, first));
}
