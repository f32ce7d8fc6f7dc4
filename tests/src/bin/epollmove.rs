//! epollmove: connections handed between threads that each wait on their
//! own epoll set, the way haproxy (`nbthread`), nginx thread pools and
//! memcached `-t N` use epoll. For the shim's readiness tests.
//!
//! ```text
//! epollmove server --threads N --events lt|et|oneshot|mixed [--fork] [--nest]
//! epollmove client --port P --conns C --rounds R
//! ```
//!
//! The server listens on 127.0.0.1:0 and prints `listening PORT`. Its N
//! worker threads each wait (no timeout) on an epoll set of their own,
//! made each its own way: epoll_create, epoll_create1, syscall(2),
//! dup(2) of a set (registrations through one number, waits through the
//! other), F_DUPFD of a set (the original closed). With
//! `--fork` the sets are made before a fork and used in the child. With
//! `--nest` the last worker waits on an outer set holding its own set,
//! then takes the events from its set without waiting.
//!
//! The accepting thread adds each new connection to a worker's set while
//! that worker sleeps. A worker that reads a whole request frame checks
//! its bytes, answers with the frame's sequence number and hash, and
//! hands the connection to another worker's set, in turn: removing it
//! from its own set first (DEL, then ADD), adding it to the other set
//! first (ADD, then DEL), or adding it and leaving the old registration
//! in place (the old owner removes it when it next reports the
//! connection; an ADD that finds one left there is a MOD, as after
//! haproxy's fd takeover). Registrations are level-triggered, EPOLLET or
//! EPOLLONESHOT (`mixed`: by frame). Level-triggered workers read at most
//! 1 KiB per report, so the rest must be reported again.
//!
//! The client opens C connections; each round sends a frame (header:
//! length, sequence number; body from a generator seeded by connection
//! and sequence) on every connection, then waits for every answer and
//! checks it. Prints `frames F bytes B`, then `ok`. The server prints the
//! same once every connection reached end-of-stream, then `ok`.
//!
//! Any violation prints `FAIL ...` and exits 1; a side that waits 30 s
//! without progress prints what it waited for and exits 2.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::os::fd::{IntoRawFd, RawFd};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use libc::c_int;

const HDR: usize = 8;
const MAX_BODY: usize = 12 * 1024;
const STALL: Duration = Duration::from_secs(30);
/// epoll_data of the stop eventfd in every worker's set.
const STOP: u64 = u64::MAX;

fn fail(msg: String) -> ! {
    println!("FAIL {msg}");
    std::process::exit(1);
}

fn stall(msg: String) -> ! {
    println!("FAIL stalled: {msg}");
    std::process::exit(2);
}

fn errno() -> c_int {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// Body of frame `seq` on connection `conn`.
fn body(conn: u64, seq: u32) -> Vec<u8> {
    let seed = conn.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ u64::from(seq);
    let len = (seed.wrapping_mul(0xbf58_476d_1ce4_e5b9) >> 40) as usize % MAX_BODY + 1;
    ringsock_integration::payload(len, seed)
}

/// FNV-1a of `b`.
fn hash(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325, |h, &x| {
        (h ^ u64::from(x)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn arg<T: std::str::FromStr>(args: &[String], name: &str, default: Option<T>) -> T {
    match args.iter().position(|a| a == name) {
        Some(i) => args
            .get(i + 1)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| fail(format!("bad value for {name}"))),
        None => default.unwrap_or_else(|| fail(format!("{name} is required"))),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("server") => server(&args),
        Some("client") => client(&args),
        _ => fail("usage: epollmove server|client ...".into()),
    }
}

// ---- server ----

#[derive(Clone, Copy, PartialEq)]
enum Events {
    Level,
    Edge,
    OneShot,
    Mixed,
}

impl Events {
    /// epoll events for frame `seq` of a connection.
    fn bits(self, seq: u32) -> u32 {
        let kind = match self {
            Events::Mixed => [Events::Level, Events::Edge, Events::OneShot][seq as usize % 3],
            k => k,
        };
        let base = (libc::EPOLLIN | libc::EPOLLRDHUP) as u32;
        match kind {
            Events::Edge => base | libc::EPOLLET as u32,
            Events::OneShot => base | libc::EPOLLONESHOT as u32,
            _ => base,
        }
    }
}

/// One accepted connection; `state` is only touched by its owner, under
/// the lock.
struct Conn {
    fd: RawFd,
    state: Mutex<ConnState>,
}

struct ConnState {
    /// The worker whose set is meant to report this connection.
    owner: usize,
    /// Events of its registration in the owner's set.
    events: u32,
    buf: Vec<u8>,
    /// Next expected frame.
    seq: u32,
    closed: bool,
}

struct Server {
    /// Each worker's set, as registrations name it.
    sets: Vec<RawFd>,
    /// Each worker's set, as it waits on it.
    wait_on: Vec<RawFd>,
    conns: Mutex<Vec<Arc<Conn>>>,
    events: Events,
    frames: AtomicU64,
    bytes: AtomicU64,
    open: AtomicUsize,
    accepted: AtomicUsize,
}

fn ctl(set: RawFd, op: c_int, fd: RawFd, events: u32, data: u64) -> c_int {
    let mut ev = libc::epoll_event { events, u64: data };
    // SAFETY: ev is valid for the call.
    let r = unsafe { libc::epoll_ctl(set, op, fd, &mut ev) };
    if r < 0 {
        errno()
    } else {
        0
    }
}

/// Adds `fd` to `set`; a registration left there by an earlier owner is
/// modified instead.
fn add_or_mod(set: RawFd, fd: RawFd, events: u32, data: u64) {
    match ctl(set, libc::EPOLL_CTL_ADD, fd, events, data) {
        0 => {}
        libc::EEXIST => {
            let e = ctl(set, libc::EPOLL_CTL_MOD, fd, events, data);
            if e != 0 {
                fail(format!("MOD fd {fd} in set {set} after EEXIST: errno {e}"));
            }
        }
        e => fail(format!("ADD fd {fd} to set {set}: errno {e}")),
    }
}

/// The epoll set of worker `i`, made in one of five ways: the fd that
/// registrations go through, and the fd its worker waits on (a duplicate
/// of the first for the fourth way: one instance under two numbers).
fn make_set(i: usize) -> (RawFd, RawFd) {
    // SAFETY: plain fd-creating calls on descriptors this function owns.
    let fds = unsafe {
        match i % 5 {
            0 => (libc::epoll_create(64), -1),
            1 => (libc::epoll_create1(libc::EPOLL_CLOEXEC), -1),
            2 => (libc::syscall(libc::SYS_epoll_create1, 0) as c_int, -1),
            3 => {
                let a = libc::epoll_create1(0);
                (a, libc::dup(a))
            }
            _ => {
                let a = libc::epoll_create1(0);
                let b = libc::fcntl(a, libc::F_DUPFD_CLOEXEC, 100);
                libc::close(a);
                (b, -1)
            }
        }
    };
    match fds {
        (a, _) if a < 0 => fail(format!("making epoll set {i}: errno {}", errno())),
        (a, -1) => (a, a),
        (_, b) if b < 0 => fail(format!("duplicating epoll set {i}: errno {}", errno())),
        pair => pair,
    }
}

fn server(args: &[String]) {
    let threads: usize = arg(args, "--threads", Some(4));
    let events = match arg::<String>(args, "--events", Some("mixed".into())).as_str() {
        "lt" => Events::Level,
        "et" => Events::Edge,
        "oneshot" => Events::OneShot,
        "mixed" => Events::Mixed,
        e => fail(format!("unknown --events {e}")),
    };
    let fork = args.iter().any(|a| a == "--fork");
    let nest = args.iter().any(|a| a == "--nest");
    if threads < 2 {
        fail("--threads must be at least 2".into());
    }
    let (sets, wait_on): (Vec<RawFd>, Vec<RawFd>) = (0..threads).map(make_set).unzip();
    if fork {
        // SAFETY: no other thread runs yet.
        match unsafe { libc::fork() } {
            -1 => fail(format!("fork: errno {}", errno())),
            0 => {}
            child => {
                let mut status = 0;
                // SAFETY: waiting for our own child.
                unsafe { libc::waitpid(child, &mut status, 0) };
                let code = if libc::WIFEXITED(status) {
                    libc::WEXITSTATUS(status)
                } else {
                    3
                };
                std::process::exit(code);
            }
        }
    }
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
    let port = listener.local_addr().unwrap().port();
    // SAFETY: plain eventfd creation.
    let stop = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK) };
    for &s in &sets {
        if ctl(s, libc::EPOLL_CTL_ADD, stop, libc::EPOLLIN as u32, STOP) != 0 {
            fail("adding the stop eventfd".into());
        }
    }
    let srv = Arc::new(Server {
        sets,
        wait_on,
        conns: Mutex::new(Vec::new()),
        events,
        frames: AtomicU64::new(0),
        bytes: AtomicU64::new(0),
        open: AtomicUsize::new(0),
        accepted: AtomicUsize::new(0),
    });
    let workers: Vec<_> = (0..threads)
        .map(|i| {
            let srv = srv.clone();
            let nested = nest && i == threads - 1;
            std::thread::spawn(move || worker(&srv, i, nested))
        })
        .collect();
    println!("listening {port}");
    std::io::stdout().flush().unwrap();
    let watchdog = {
        let srv = srv.clone();
        std::thread::spawn(move || watch(&srv))
    };
    // Accept until the first connection has come and every one has gone.
    listener.set_nonblocking(true).unwrap();
    loop {
        match listener.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(true).unwrap();
                s.set_nodelay(true).unwrap();
                let fd = s.into_raw_fd();
                let n = srv.accepted.fetch_add(1, Ordering::SeqCst);
                let owner = n % threads;
                let ev = srv.events.bits(0);
                let c = Arc::new(Conn {
                    fd,
                    state: Mutex::new(ConnState {
                        owner,
                        events: ev,
                        buf: Vec::new(),
                        seq: 0,
                        closed: false,
                    }),
                });
                let idx = {
                    let mut v = srv.conns.lock().unwrap();
                    v.push(c.clone());
                    v.len() as u64 - 1
                };
                srv.open.fetch_add(1, Ordering::SeqCst);
                let st = c.state.lock().unwrap();
                add_or_mod(srv.sets[owner], fd, ev, idx);
                drop(st);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if srv.accepted.load(Ordering::SeqCst) > 0 && srv.open.load(Ordering::SeqCst) == 0 {
                    break;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => fail(format!("accept: {e}")),
        }
    }
    let one = 1u64;
    // SAFETY: 8 bytes to our eventfd.
    unsafe { libc::write(stop, (&one as *const u64).cast(), 8) };
    for w in workers {
        w.join().unwrap();
    }
    drop(watchdog);
    println!(
        "frames {} bytes {}",
        srv.frames.load(Ordering::SeqCst),
        srv.bytes.load(Ordering::SeqCst)
    );
    println!("ok");
}

/// Exits with a report if no frame completes for `STALL` while
/// connections are open.
fn watch(srv: &Server) {
    let mut last = (u64::MAX, Instant::now());
    loop {
        std::thread::sleep(Duration::from_millis(200));
        let f = srv.frames.load(Ordering::SeqCst);
        let open = srv.open.load(Ordering::SeqCst);
        if f != last.0 || open == 0 {
            last = (f, Instant::now());
            continue;
        }
        if last.1.elapsed() >= STALL {
            let conns = srv.conns.lock().unwrap();
            let mut msg = format!("server: no frame for {STALL:?}, {open} open;");
            for (i, c) in conns.iter().enumerate() {
                if let Ok(s) = c.state.try_lock() {
                    if !s.closed {
                        msg += &format!(
                            " conn {i} (fd {}) owner {} events {:#x} seq {} buffered {};",
                            c.fd,
                            s.owner,
                            s.events,
                            s.seq,
                            s.buf.len()
                        );
                    }
                }
            }
            for (i, fd) in srv.wait_on.iter().enumerate() {
                msg += &format!(" set {i} (fd {fd}) watches fds {:?};", watched_fds(*fd));
            }
            stall(msg);
        }
    }
}

/// The fds epoll instance `fd` watches, as the kernel lists them.
fn watched_fds(fd: RawFd) -> Vec<String> {
    std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.strip_prefix("tfd:"))
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

/// Waits for events of worker `i`'s set: directly, or (`nested`) on an
/// outer set holding it, then from the set without waiting.
struct Waiter {
    set: RawFd,
    outer: Option<RawFd>,
}

impl Waiter {
    fn new(set: RawFd, nested: bool) -> Waiter {
        let outer = nested.then(|| {
            // SAFETY: plain epoll creation.
            let o = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
            if o < 0 || ctl(o, libc::EPOLL_CTL_ADD, set, libc::EPOLLIN as u32, 0) != 0 {
                fail(format!("nesting set {set}: errno {}", errno()));
            }
            o
        });
        Waiter { set, outer }
    }

    fn wait(&self, evs: &mut [libc::epoll_event]) -> usize {
        loop {
            let r = match self.outer {
                Some(o) => {
                    let mut one = [libc::epoll_event { events: 0, u64: 0 }];
                    // SAFETY: one valid event slot.
                    let r = unsafe { libc::epoll_wait(o, one.as_mut_ptr(), 1, -1) };
                    if r < 0 {
                        r
                    } else {
                        // SAFETY: evs is valid for its length.
                        unsafe {
                            libc::epoll_wait(self.set, evs.as_mut_ptr(), evs.len() as c_int, 0)
                        }
                    }
                }
                // SAFETY: evs is valid for its length.
                None => unsafe {
                    libc::epoll_wait(self.set, evs.as_mut_ptr(), evs.len() as c_int, -1)
                },
            };
            if r < 0 {
                if errno() == libc::EINTR {
                    continue;
                }
                fail(format!("epoll_wait on set {}: errno {}", self.set, errno()));
            }
            return r as usize;
        }
    }
}

fn worker(srv: &Server, me: usize, nested: bool) {
    let waiter = Waiter::new(srv.wait_on[me], nested);
    let mut evs = vec![libc::epoll_event { events: 0, u64: 0 }; 16];
    loop {
        let n = waiter.wait(&mut evs);
        for ev in &evs[..n] {
            let (data, bits) = (ev.u64, ev.events);
            if data == STOP {
                return;
            }
            let c = srv.conns.lock().unwrap()[data as usize].clone();
            serve(srv, me, data, &c, bits);
        }
    }
}

/// Handles a report of connection `idx` (`c`) by worker `me`'s set.
fn serve(srv: &Server, me: usize, idx: u64, c: &Conn, bits: u32) {
    let mut st = c.state.lock().unwrap();
    if st.closed {
        return;
    }
    let set = srv.sets[me];
    if st.owner != me {
        // Left here by a hand-over: the registration goes now.
        let e = ctl(set, libc::EPOLL_CTL_DEL, c.fd, 0, 0);
        if e != 0 && e != libc::ENOENT {
            fail(format!("DEL of a left-over fd {}: errno {e}", c.fd));
        }
        return;
    }
    if bits & libc::EPOLLIN as u32 == 0 && bits & (libc::EPOLLHUP | libc::EPOLLERR) as u32 != 0 {
        fail(format!("fd {}: error or hang-up {bits:#x}", c.fd));
    }
    let edge = st.events & (libc::EPOLLET | libc::EPOLLONESHOT) as u32 != 0;
    let mut chunk = [0u8; 16 * 1024];
    let mut eof = false;
    loop {
        // Level-triggered: 1 KiB per report, the rest is reported again.
        let want = if edge { chunk.len() } else { 1024 };
        // SAFETY: chunk is valid for `want` bytes.
        let r = unsafe { libc::read(c.fd, chunk.as_mut_ptr().cast(), want) };
        if r > 0 {
            st.buf.extend_from_slice(&chunk[..r as usize]);
            srv.bytes.fetch_add(r as u64, Ordering::SeqCst);
            if !edge {
                break;
            }
            continue;
        }
        if r == 0 {
            eof = true;
            break;
        }
        match errno() {
            libc::EAGAIN => break,
            libc::EINTR => continue,
            e => fail(format!("read fd {}: errno {e}", c.fd)),
        }
    }
    let mut answered = false;
    while st.buf.len() >= HDR {
        let len = u32::from_le_bytes(st.buf[..4].try_into().unwrap()) as usize;
        let seq = u32::from_le_bytes(st.buf[4..8].try_into().unwrap());
        if seq != st.seq || len == 0 || len > MAX_BODY {
            fail(format!(
                "conn {idx}: frame header seq {seq} len {len}, expected seq {}",
                st.seq
            ));
        }
        if st.buf.len() < HDR + len {
            break;
        }
        let got = &st.buf[HDR..HDR + len];
        if got != body(idx, seq).as_slice() {
            fail(format!("conn {idx} frame {seq}: body differs"));
        }
        let mut reply = [0u8; 12];
        reply[..4].copy_from_slice(&seq.to_le_bytes());
        reply[4..].copy_from_slice(&hash(got).to_le_bytes());
        write_all(c.fd, &reply);
        st.buf.drain(..HDR + len);
        st.seq += 1;
        srv.frames.fetch_add(1, Ordering::SeqCst);
        answered = true;
    }
    if eof {
        if !st.buf.is_empty() {
            fail(format!("conn {idx}: end of stream inside a frame"));
        }
        st.closed = true;
        // The kernel drops the fd from every set on close.
        // SAFETY: closing our own connection's fd, once.
        unsafe { libc::close(c.fd) };
        srv.open.fetch_sub(1, Ordering::SeqCst);
        return;
    }
    if answered && st.buf.is_empty() {
        hand_over(srv, me, idx, c.fd, &mut st);
    } else if st.events & libc::EPOLLONESHOT as u32 != 0 {
        // Disabled by the report: enable it again in this set.
        let e = ctl(set, libc::EPOLL_CTL_MOD, c.fd, st.events, idx);
        if e != 0 {
            fail(format!("re-arming fd {}: errno {e}", c.fd));
        }
    }
}

/// Moves connection `idx` from worker `me`'s set to another's, in one of
/// three ways chosen by its next frame number.
fn hand_over(srv: &Server, me: usize, idx: u64, fd: RawFd, st: &mut ConnState) {
    let n = srv.sets.len();
    let to = (me + 1 + st.seq as usize % (n - 1)) % n;
    let (from_set, to_set) = (srv.sets[me], srv.sets[to]);
    let events = srv.events.bits(st.seq);
    st.owner = to;
    st.events = events;
    match st.seq % 3 {
        0 => {
            let e = ctl(from_set, libc::EPOLL_CTL_DEL, fd, 0, 0);
            if e != 0 {
                fail(format!("DEL fd {fd} from set {from_set}: errno {e}"));
            }
            add_or_mod(to_set, fd, events, idx);
        }
        1 => {
            add_or_mod(to_set, fd, events, idx);
            let e = ctl(from_set, libc::EPOLL_CTL_DEL, fd, 0, 0);
            if e != 0 {
                fail(format!("DEL fd {fd} from set {from_set}: errno {e}"));
            }
        }
        _ => add_or_mod(to_set, fd, events, idx),
    }
}

/// Writes all of `b` to non-blocking `fd` (a short answer: waits with
/// poll if the socket is full).
fn write_all(fd: RawFd, mut b: &[u8]) {
    let end = Instant::now() + STALL;
    while !b.is_empty() {
        // SAFETY: b is valid for its length.
        let r = unsafe { libc::write(fd, b.as_ptr().cast(), b.len()) };
        if r > 0 {
            b = &b[r as usize..];
            continue;
        }
        match errno() {
            libc::EAGAIN => {
                if Instant::now() >= end {
                    stall(format!("fd {fd}: answer not accepted"));
                }
                let mut p = libc::pollfd {
                    fd,
                    events: libc::POLLOUT,
                    revents: 0,
                };
                // SAFETY: one valid pollfd.
                unsafe { libc::poll(&mut p, 1, 100) };
            }
            libc::EINTR => {}
            e => fail(format!("write fd {fd}: errno {e}")),
        }
    }
}

// ---- client ----

fn client(args: &[String]) {
    let port: u16 = arg(args, "--port", None);
    let conns: usize = arg(args, "--conns", Some(16));
    let rounds: u32 = arg(args, "--rounds", Some(200));
    let mut socks: Vec<TcpStream> = (0..conns)
        .map(|_| {
            let s = TcpStream::connect((Ipv4Addr::LOCALHOST, port)).expect("connect");
            s.set_nodelay(true).unwrap();
            s.set_read_timeout(Some(Duration::from_millis(500)))
                .unwrap();
            s
        })
        .collect();
    let mut bytes = 0u64;
    for seq in 0..rounds {
        let mut want = Vec::with_capacity(conns);
        for (i, s) in socks.iter_mut().enumerate() {
            let b = body(i as u64, seq);
            let mut frame = Vec::with_capacity(HDR + b.len());
            frame.extend_from_slice(&(b.len() as u32).to_le_bytes());
            frame.extend_from_slice(&seq.to_le_bytes());
            frame.extend_from_slice(&b);
            s.write_all(&frame)
                .unwrap_or_else(|e| fail(format!("conn {i} frame {seq}: write: {e}")));
            bytes += frame.len() as u64;
            want.push(hash(&b));
        }
        for (i, s) in socks.iter_mut().enumerate() {
            let mut reply = [0u8; 12];
            read_reply(s, &mut reply, i, seq);
            let got_seq = u32::from_le_bytes(reply[..4].try_into().unwrap());
            let got_hash = u64::from_le_bytes(reply[4..].try_into().unwrap());
            if got_seq != seq || got_hash != want[i] {
                fail(format!(
                    "conn {i} frame {seq}: answer for frame {got_seq} hash {got_hash:#x}, expected {:#x}",
                    want[i]
                ));
            }
        }
    }
    for s in &socks {
        let _ = s.shutdown(std::net::Shutdown::Write);
    }
    // Wait for the server's close: nothing more may arrive.
    for (i, s) in socks.iter_mut().enumerate() {
        let mut b = [0u8; 1];
        let end = Instant::now() + STALL;
        loop {
            match s.read(&mut b) {
                Ok(0) => break,
                Ok(_) => fail(format!("conn {i}: bytes after the last answer")),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    if Instant::now() >= end {
                        stall(format!("conn {i}: server did not close"));
                    }
                }
                Err(e) => fail(format!("conn {i}: reading end of stream: {e}")),
            }
        }
    }
    println!("frames {} bytes {bytes}", rounds as usize * conns);
    println!("ok");
}

fn read_reply(s: &mut TcpStream, reply: &mut [u8; 12], conn: usize, seq: u32) {
    let end = Instant::now() + STALL;
    let mut got = 0;
    while got < reply.len() {
        match s.read(&mut reply[got..]) {
            Ok(0) => fail(format!("conn {conn} frame {seq}: end of stream")),
            Ok(n) => got += n,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                        | std::io::ErrorKind::Interrupted
                ) =>
            {
                if Instant::now() >= end {
                    stall(format!(
                        "conn {conn}: no answer to frame {seq} in {STALL:?} ({got} bytes of it)"
                    ));
                }
            }
            Err(e) => fail(format!("conn {conn} frame {seq}: read: {e}")),
        }
    }
}
