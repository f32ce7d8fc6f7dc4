//! faultpeer: one end of a TCP connection for fault tests (a peer killed
//! with SIGKILL, a control daemon killed and restarted), in raw libc so
//! that every call goes through the shim's hooks.
//!
//! ```text
//! faultpeer server [--act A] [--seed S] [--pace-us U] [--wait W] [--warmup]
//! faultpeer client --port P [same options] [--go FILE]
//! faultpeer echo-server
//! faultpeer echo-client --port P --mode long|storm --stop FILE [--seed S] [--hold-ms H] [--bound-ms B]
//! ```
//!
//! `server` listens on 127.0.0.1:0 and prints `listening PORT`; `client`
//! connects to it. With `--warmup` both first pass one byte each way over
//! a throwaway connection and close it (so the shim's per-process state,
//! daemon session and background thread, exists before the measured
//! connection), then print `baseline`; a client with `--go FILE` waits for
//! FILE to exist before its main connection, so the test can read the
//! processes' holdings in between. On the main connection (`connected` /
//! `accepted`) each does `--act`:
//!
//! * `write`: sends the seeded stream (`ringsock_integration::payload`'s
//!   bytes, endless) in 64 KiB blocking sends, sleeping `--pace-us` after
//!   each, printing `sent N` at most every 20 ms;
//! * `read`: reads and checks every byte against the same stream (a
//!   mismatch prints `FAIL` and exits 1), printing `recv N` at most every
//!   20 ms;
//! * `idle`: waits for the socket to become readable with `--wait`
//!   (`read`: a blocking read; `poll`; `epoll`: level-triggered with
//!   EPOLLRDHUP), prints `woke`, then reads;
//! * `sink`: never reads.
//!
//! When the peer is gone, the survivor prints `end eof ...` (read returned
//! 0) or `end err=NAME ...` (the call failed), with `recv=N hash=H` (FNV-1a
//! 64 of every byte received) or `sent=N`, closes the socket, prints
//! `closed` and sleeps until killed. SIGPIPE is ignored.
//!
//! `echo-server` echoes every connection (a thread each) and prints
//! `slow-accept ms=X` for an accept() call that took over a second.
//! `echo-client --mode storm` opens short connections in a loop until FILE
//! exists: connect, echo a seeded 1..8 KiB message and check it, hold the
//! connection `--hold-ms`, close, print `conn I t=NS ring=R connect_us=C
//! us=T` (t: CLOCK_MONOTONIC at connect; ring: 1 if a new ring segment
//! appeared in this process's mappings during connect, i.e. the shim put
//! the connection on shared memory). `--mode long` keeps one connection
//! and echoes 16 KiB rounds on it (printing `rounds N`). Both print `done
//! ...` at the end; a connect, send or receive that takes longer than
//! `--bound-ms` (default 5000), a wrong echo or any error prints `FAIL` and
//! exits 1.

use std::collections::HashSet;
use std::os::fd::RawFd;
use std::path::Path;
use std::time::{Duration, Instant};

const CHUNK: usize = 64 * 1024;

fn fail(msg: String) -> ! {
    println!("FAIL {msg}");
    eprintln!("FAIL {msg}");
    std::process::exit(1);
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn errname(e: i32) -> String {
    let n = match e {
        libc::EPIPE => "EPIPE",
        libc::ECONNRESET => "ECONNRESET",
        libc::ECONNABORTED => "ECONNABORTED",
        libc::ENOTCONN => "ENOTCONN",
        libc::EAGAIN => "EAGAIN",
        libc::EBADF => "EBADF",
        libc::EBADFD => "EBADFD",
        libc::ETIMEDOUT => "ETIMEDOUT",
        libc::ECONNREFUSED => "ECONNREFUSED",
        libc::EINTR => "EINTR",
        _ => "errno",
    };
    format!("{n}({e})")
}

fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The endless byte stream of `ringsock_integration::payload(_, seed)`
/// (xorshift64*, 8 bytes per step), produced piecewise.
struct Gen {
    x: u64,
    block: [u8; 8],
    used: usize,
}

impl Gen {
    fn new(seed: u64) -> Gen {
        Gen {
            x: seed | 1,
            block: [0; 8],
            used: 8,
        }
    }

    fn fill(&mut self, out: &mut [u8]) {
        for b in out {
            if self.used == 8 {
                self.x ^= self.x >> 12;
                self.x ^= self.x << 25;
                self.x ^= self.x >> 27;
                self.block = self.x.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes();
                self.used = 0;
            }
            *b = self.block[self.used];
            self.used += 1;
        }
    }
}

fn fnv(h: &mut u64, data: &[u8]) {
    for &b in data {
        *h ^= u64::from(b);
        *h = h.wrapping_mul(0x100_0000_01b3);
    }
}

const FNV0: u64 = 0xcbf2_9ce4_8422_2325;

struct Opts {
    role: String,
    port: u16,
    act: String,
    seed: u64,
    pace_us: u64,
    wait: String,
    warmup: bool,
    go: Option<String>,
    mode: String,
    stop: Option<String>,
    hold_ms: u64,
    bound_ms: u64,
}

fn usage() -> ! {
    eprintln!("usage: faultpeer server|client|echo-server|echo-client [--port P] [--act write|read|idle|sink] [--seed S] [--pace-us U] [--wait read|poll|epoll] [--warmup] [--go FILE] [--mode long|storm] [--stop FILE] [--hold-ms H] [--bound-ms B]");
    std::process::exit(64);
}

fn parse() -> Opts {
    let mut a = std::env::args().skip(1);
    let mut o = Opts {
        role: a.next().unwrap_or_else(|| usage()),
        port: 0,
        act: "idle".into(),
        seed: 1,
        pace_us: 0,
        wait: "read".into(),
        warmup: false,
        go: None,
        mode: "storm".into(),
        stop: None,
        hold_ms: 0,
        bound_ms: 5000,
    };
    while let Some(k) = a.next() {
        if k == "--warmup" {
            o.warmup = true;
            continue;
        }
        let v = a.next().unwrap_or_else(|| usage());
        let num = || v.parse::<u64>().unwrap_or_else(|_| usage());
        match k.as_str() {
            "--port" => o.port = num() as u16,
            "--act" => o.act = v.clone(),
            "--seed" => o.seed = num(),
            "--pace-us" => o.pace_us = num(),
            "--wait" => o.wait = v.clone(),
            "--go" => o.go = Some(v.clone()),
            "--mode" => o.mode = v.clone(),
            "--stop" => o.stop = Some(v.clone()),
            "--hold-ms" => o.hold_ms = num(),
            "--bound-ms" => o.bound_ms = num(),
            _ => usage(),
        }
    }
    o
}

fn tcp_socket() -> RawFd {
    // SAFETY: plain syscall.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0) };
    if fd < 0 {
        fail(format!("socket: {}", errname(errno())));
    }
    fd
}

fn sin(port: u16) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(std::net::Ipv4Addr::LOCALHOST).to_be(),
        },
        sin_zero: [0; 8],
    }
}

const SIN_LEN: libc::socklen_t = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;

/// A listener on 127.0.0.1:0; returns (fd, port).
fn listen_any() -> (RawFd, u16) {
    let fd = tcp_socket();
    let addr = sin(0);
    let mut got = sin(0);
    let mut len = SIN_LEN;
    // SAFETY: valid sockaddr_in buffers of the given length.
    unsafe {
        if libc::bind(fd, (&addr as *const libc::sockaddr_in).cast(), SIN_LEN) != 0
            || libc::listen(fd, 1024) != 0
            || libc::getsockname(fd, (&mut got as *mut libc::sockaddr_in).cast(), &mut len) != 0
        {
            fail(format!("bind/listen: {}", errname(errno())));
        }
    }
    (fd, u16::from_be(got.sin_port))
}

fn connect_to(port: u16) -> Result<RawFd, i32> {
    let fd = tcp_socket();
    let addr = sin(port);
    // SAFETY: valid sockaddr_in.
    let r = unsafe { libc::connect(fd, (&addr as *const libc::sockaddr_in).cast(), SIN_LEN) };
    if r != 0 {
        let e = errno();
        close(fd);
        return Err(e);
    }
    Ok(fd)
}

fn accept_one(l: RawFd) -> RawFd {
    loop {
        // SAFETY: null address buffers are allowed.
        let fd = unsafe { libc::accept(l, std::ptr::null_mut(), std::ptr::null_mut()) };
        if fd >= 0 {
            return fd;
        }
        if errno() != libc::EINTR {
            fail(format!("accept: {}", errname(errno())));
        }
    }
}

fn close(fd: RawFd) {
    // SAFETY: closing our own descriptor.
    unsafe { libc::close(fd) };
}

/// One read; Ok(0) at EOF.
fn read_some(fd: RawFd, buf: &mut [u8]) -> Result<usize, i32> {
    loop {
        // SAFETY: buf is valid for buf.len() bytes.
        let r = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if r >= 0 {
            return Ok(r as usize);
        }
        if errno() != libc::EINTR {
            return Err(errno());
        }
    }
}

/// Sends all of `data` with blocking send(2) (flags 0: SIGPIPE, ignored).
fn send_all(fd: RawFd, mut data: &[u8]) -> Result<(), i32> {
    while !data.is_empty() {
        // SAFETY: data is valid for data.len() bytes.
        let r = unsafe { libc::send(fd, data.as_ptr().cast(), data.len(), 0) };
        if r < 0 {
            if errno() == libc::EINTR {
                continue;
            }
            return Err(errno());
        }
        data = &data[r as usize..];
    }
    Ok(())
}

fn read_exact(fd: RawFd, mut buf: &mut [u8]) -> Result<(), String> {
    while !buf.is_empty() {
        match read_some(fd, buf) {
            Ok(0) => return Err("EOF".into()),
            Ok(n) => buf = &mut buf[n..],
            Err(e) => return Err(errname(e)),
        }
    }
    Ok(())
}

fn sleep_forever() -> ! {
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

/// Prints a progress line at most every 20 ms.
struct Progress {
    what: &'static str,
    last: Instant,
}

impl Progress {
    fn new(what: &'static str) -> Progress {
        Progress {
            what,
            last: Instant::now(),
        }
    }

    fn tick(&mut self, n: u64) {
        if self.last.elapsed() >= Duration::from_millis(20) {
            println!("{} {n}", self.what);
            self.last = Instant::now();
        }
    }
}

fn warmup_server(l: RawFd) {
    let fd = accept_one(l);
    let mut b = [0u8; 1];
    if read_exact(fd, &mut b).is_err() || send_all(fd, &b).is_err() {
        fail("warm-up connection broke".into());
    }
    // Wait for the client's close so the connection is fully gone.
    match read_some(fd, &mut b) {
        Ok(0) => {}
        other => fail(format!("warm-up: expected EOF, got {other:?}")),
    }
    close(fd);
}

fn warmup_client(port: u16) {
    let fd = connect_to(port).unwrap_or_else(|e| fail(format!("warm-up connect: {}", errname(e))));
    let mut b = [b'w'];
    if send_all(fd, &b).is_err() || read_exact(fd, &mut b).is_err() {
        fail("warm-up connection broke".into());
    }
    close(fd);
}

/// The survivor's last words: what ended the connection, then close.
fn end(fd: RawFd, how: String) -> ! {
    println!("end {how}");
    close(fd);
    println!("closed");
    sleep_forever();
}

fn act_write(fd: RawFd, o: &Opts) -> ! {
    let mut g = Gen::new(o.seed);
    let mut buf = vec![0u8; CHUNK];
    let mut sent = 0u64;
    let mut p = Progress::new("sent");
    loop {
        g.fill(&mut buf);
        let mut off = 0;
        while off < buf.len() {
            // SAFETY: buf[off..] is valid.
            let r = unsafe { libc::send(fd, buf[off..].as_ptr().cast(), buf.len() - off, 0) };
            if r < 0 {
                let e = errno();
                if e == libc::EINTR {
                    continue;
                }
                end(fd, format!("err={} sent={sent}", errname(e)));
            }
            off += r as usize;
            sent += r as u64;
            p.tick(sent);
        }
        if o.pace_us > 0 {
            std::thread::sleep(Duration::from_micros(o.pace_us));
        }
    }
}

fn act_read(fd: RawFd, o: &Opts) -> ! {
    let mut g = Gen::new(o.seed);
    let mut buf = vec![0u8; CHUNK];
    let mut want = vec![0u8; CHUNK];
    let mut recv = 0u64;
    let mut h = FNV0;
    let mut p = Progress::new("recv");
    loop {
        match read_some(fd, &mut buf) {
            Ok(0) => end(fd, format!("eof recv={recv} hash={h:016x}")),
            Ok(n) => {
                g.fill(&mut want[..n]);
                if let Some(i) = (0..n).find(|&i| buf[i] != want[i]) {
                    fail(format!("byte {} of the stream is wrong", recv + i as u64));
                }
                fnv(&mut h, &buf[..n]);
                recv += n as u64;
                p.tick(recv);
            }
            Err(e) => end(fd, format!("err={} recv={recv} hash={h:016x}", errname(e))),
        }
    }
}

fn act_idle(fd: RawFd, o: &Opts) -> ! {
    match o.wait.as_str() {
        "read" => {}
        "poll" => {
            let mut p = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            let r = unsafe { libc::poll(&mut p, 1, -1) };
            println!("woke poll={r} revents={:#x}", p.revents);
        }
        "epoll" => {
            // SAFETY: plain syscalls on our own descriptors.
            unsafe {
                let ep = libc::epoll_create1(libc::EPOLL_CLOEXEC);
                let mut ev = libc::epoll_event {
                    events: (libc::EPOLLIN | libc::EPOLLRDHUP) as u32,
                    u64: 7,
                };
                if ep < 0 || libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, fd, &mut ev) != 0 {
                    fail(format!("epoll: {}", errname(errno())));
                }
                let mut out = [libc::epoll_event { events: 0, u64: 0 }; 4];
                let r = loop {
                    let r = libc::epoll_wait(ep, out.as_mut_ptr(), 4, -1);
                    if r >= 0 || errno() != libc::EINTR {
                        break r;
                    }
                };
                let (events, data) = (out[0].events, out[0].u64);
                println!("woke epoll={r} events={events:#x} data={data}");
                if r != 1 || data != 7 {
                    fail(format!("epoll_wait returned {r}, data {data}"));
                }
                close(ep);
            }
        }
        w => fail(format!("unknown --wait {w}")),
    }
    let mut b = [0u8; 16];
    match read_some(fd, &mut b) {
        Ok(0) => end(fd, "eof recv=0".into()),
        Ok(n) => fail(format!("idle connection received {n} byte(s)")),
        Err(e) => end(fd, format!("err={} recv=0", errname(e))),
    }
}

fn peer(o: &Opts) {
    let fd = if o.role == "server" {
        let (l, port) = listen_any();
        println!("listening {port}");
        if o.warmup {
            warmup_server(l);
            println!("baseline");
        }
        // The listener stays open: closing it would change the process's
        // descriptors and listener registrations that the test compares.
        let fd = accept_one(l);
        println!("accepted");
        fd
    } else {
        if o.warmup {
            warmup_client(o.port);
            println!("baseline");
        }
        if let Some(go) = &o.go {
            let end = Instant::now() + Duration::from_secs(60);
            while !Path::new(go).exists() {
                if Instant::now() > end {
                    fail(format!("{go} never appeared"));
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        let fd = connect_to(o.port).unwrap_or_else(|e| fail(format!("connect: {}", errname(e))));
        println!("connected");
        fd
    };
    match o.act.as_str() {
        "write" => act_write(fd, o),
        "read" => act_read(fd, o),
        "idle" => act_idle(fd, o),
        "sink" => sleep_forever(),
        a => fail(format!("unknown --act {a}")),
    }
}

fn echo_server() -> ! {
    let (l, port) = listen_any();
    println!("listening {port}");
    loop {
        let mut p = libc::pollfd {
            fd: l,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        if unsafe { libc::poll(&mut p, 1, -1) } <= 0 {
            continue;
        }
        // A connection is waiting: accept must not take long, whatever the
        // daemon is doing.
        let t = Instant::now();
        // SAFETY: null address buffers are allowed.
        let fd = unsafe { libc::accept(l, std::ptr::null_mut(), std::ptr::null_mut()) };
        let ms = t.elapsed().as_millis();
        if ms > 1000 {
            println!("slow-accept ms={ms}");
        }
        if fd < 0 {
            println!("accept-error {}", errname(errno()));
            continue;
        }
        std::thread::spawn(move || {
            let mut buf = vec![0u8; CHUNK];
            while let Ok(n) = read_some(fd, &mut buf) {
                if n == 0 || send_all(fd, &buf[..n]).is_err() {
                    break;
                }
            }
            close(fd);
        });
    }
}

/// Inodes of the ring segments mapped in this process right now.
fn ring_inodes() -> HashSet<u64> {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    maps.lines()
        .filter(|l| ringsock_integration::resources::is_ring(l))
        .filter_map(|l| l.split_whitespace().nth(4)?.parse().ok())
        .collect()
}

/// SO_RCVTIMEO and SO_SNDTIMEO, so a hang becomes an error we report.
fn set_timeouts(fd: RawFd, ms: u64) {
    let tv = libc::timeval {
        tv_sec: (ms / 1000) as libc::time_t,
        tv_usec: ((ms % 1000) * 1000) as libc::suseconds_t,
    };
    for opt in [libc::SO_RCVTIMEO, libc::SO_SNDTIMEO] {
        // SAFETY: tv is a valid timeval of the given size.
        unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                opt,
                (&tv as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
    }
}

/// Sends `msg` and checks that the same bytes come back.
fn echo_round(fd: RawFd, msg: &[u8], back: &mut [u8], what: &str) {
    if let Err(e) = send_all(fd, msg) {
        fail(format!("{what}: send: {}", errname(e)));
    }
    if let Err(e) = read_exact(fd, back) {
        fail(format!("{what}: receive: {e}"));
    }
    if back != msg {
        fail(format!("{what}: the echo differs"));
    }
}

fn echo_client(o: &Opts) {
    let stop = o.stop.clone().unwrap_or_else(|| usage());
    let stopped = || Path::new(&stop).exists();
    let bound = Duration::from_millis(o.bound_ms);
    let mut seen = ring_inodes();
    let mut connect = |what: &str| -> (RawFd, bool) {
        let t = Instant::now();
        let fd =
            connect_to(o.port).unwrap_or_else(|e| fail(format!("{what}: connect: {}", errname(e))));
        if t.elapsed() > bound {
            fail(format!("{what}: connect took {:?}", t.elapsed()));
        }
        let now = ring_inodes();
        let ring = now.iter().any(|i| !seen.contains(i));
        seen.extend(now);
        set_timeouts(fd, o.bound_ms);
        (fd, ring)
    };
    match o.mode.as_str() {
        "storm" => {
            let mut i = 0u64;
            while !stopped() {
                let what = format!("conn {i}");
                let t0 = mono_ns();
                let t = Instant::now();
                let (fd, ring) = connect(&what);
                let connect_us = t.elapsed().as_micros();
                let seed = o.seed ^ (i + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
                let len = 1024 + (seed % 7168) as usize;
                let mut msg = vec![0u8; len];
                Gen::new(seed).fill(&mut msg);
                let mut back = vec![0u8; len];
                echo_round(fd, &msg, &mut back, &what);
                std::thread::sleep(Duration::from_millis(o.hold_ms));
                close(fd);
                if t.elapsed() > bound + Duration::from_millis(o.hold_ms) {
                    fail(format!("{what} took {:?}", t.elapsed()));
                }
                println!(
                    "conn {i} t={t0} ring={} connect_us={connect_us} us={}",
                    u8::from(ring),
                    t.elapsed().as_micros()
                );
                i += 1;
            }
            println!("done conns={i}");
        }
        "long" => {
            let (fd, ring) = connect("long connection");
            println!("ring={}", u8::from(ring));
            let mut rounds = 0u64;
            let mut p = Progress::new("rounds");
            let mut g = Gen::new(o.seed);
            let mut msg = vec![0u8; 16 * 1024];
            let mut back = vec![0u8; msg.len()];
            while !stopped() {
                g.fill(&mut msg);
                echo_round(fd, &msg, &mut back, &format!("round {rounds}"));
                rounds += 1;
                p.tick(rounds);
                std::thread::sleep(Duration::from_millis(2));
            }
            close(fd);
            println!("done rounds={rounds} ring={}", u8::from(ring));
        }
        m => fail(format!("unknown --mode {m}")),
    }
}

fn main() {
    // SAFETY: setting a signal disposition before any thread exists.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
    let o = parse();
    match o.role.as_str() {
        "server" | "client" => peer(&o),
        "echo-server" => echo_server(),
        "echo-client" => echo_client(&o),
        _ => usage(),
    }
}
