//! `shapes`: a small load generator for `scripts/bench`, built from plain
//! sockets and epoll so that it runs unmodified under the shim.
//!
//! One process can be a server (`--listen PORT`: echoes every byte back),
//! a client (`--connect P1,P2,..`: `--conns K` connections to each port,
//! each sending `--msg S` bytes and waiting for the S-byte echo, in a
//! loop), or both (all-to-all). The server and the client run on their own
//! threads, each with one epoll loop, so a process that both listens and
//! connects never stalls its own accepts.
//!
//! The client measures for `--secs T` after a short warm-up, then prints
//! one JSON line on stdout:
//! `{"ops":N,"secs":T,"conns":C,"msg":S,"ops_per_s":..,"mb_per_s":..}` and,
//! with `--lat`, `"p50_us"`, `"p99_us"`, `"p999_us"` of the round trips.
//! A process that also listens keeps serving after that line until it is
//! killed (its peers may still be measuring); a pure client exits.
//!
//! ```text
//! shapes --listen 9000
//! shapes --connect 9000 --conns 64 --msg 64 --secs 2
//! shapes --listen 9001 --connect 9002,9003 --conns 4 --msg 64 --secs 2
//! ```
//!
//! `--wait-for PATH`: connect only once PATH exists (all-to-all: the
//! harness creates it when every peer listens).

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

struct Opts {
    listen: Option<u16>,
    connect: Vec<u16>,
    conns: usize,
    msg: usize,
    secs: f64,
    warmup: f64,
    lat: bool,
    wait_for: Option<std::path::PathBuf>,
}

fn usage() -> ! {
    eprintln!(
        "usage: shapes [--listen PORT] [--connect P1,P2,..] [--conns K] [--msg BYTES] \
         [--secs T] [--warmup T] [--lat] [--wait-for PATH]"
    );
    std::process::exit(2)
}

fn parse() -> Opts {
    let mut o = Opts {
        listen: None,
        connect: vec![],
        conns: 1,
        msg: 64,
        secs: 2.0,
        warmup: -1.0,
        lat: false,
        wait_for: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().unwrap_or_else(|| usage());
        match a.as_str() {
            "--listen" => o.listen = Some(val().parse().unwrap_or_else(|_| usage())),
            "--connect" => {
                o.connect = val()
                    .split(',')
                    .filter(|s| !s.is_empty())
                    .map(|s| s.parse().unwrap_or_else(|_| usage()))
                    .collect()
            }
            "--conns" => o.conns = val().parse().unwrap_or_else(|_| usage()),
            "--msg" => o.msg = val().parse().unwrap_or_else(|_| usage()),
            "--secs" => o.secs = val().parse().unwrap_or_else(|_| usage()),
            "--warmup" => o.warmup = val().parse().unwrap_or_else(|_| usage()),
            "--lat" => o.lat = true,
            "--wait-for" => o.wait_for = Some(val().into()),
            _ => usage(),
        }
    }
    if o.listen.is_none() && o.connect.is_empty() || o.conns == 0 || o.msg == 0 {
        usage();
    }
    if o.warmup < 0.0 {
        o.warmup = (o.secs / 5.0).min(0.5);
    }
    o
}

fn raise_nofile() {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain syscalls on a local struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 && r.rlim_cur < r.rlim_max {
            r.rlim_cur = r.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        }
    }
}

struct Epoll(i32);

impl Epoll {
    fn new() -> io::Result<Epoll> {
        // SAFETY: plain syscall.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Epoll(fd))
    }

    fn ctl(&self, op: i32, fd: i32, events: u32, token: u64) -> io::Result<()> {
        let mut ev = libc::epoll_event { events, u64: token };
        // SAFETY: `ev` lives across the call.
        if unsafe { libc::epoll_ctl(self.0, op, fd, &mut ev) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    fn wait(&self, evs: &mut [libc::epoll_event], ms: i32) -> usize {
        // SAFETY: the buffer is valid for evs.len() entries.
        let n = unsafe { libc::epoll_wait(self.0, evs.as_mut_ptr(), evs.len() as i32, ms) };
        n.max(0) as usize
    }
}

const IN: u32 = libc::EPOLLIN as u32;
const OUT: u32 = libc::EPOLLOUT as u32;

fn would_block(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
    )
}

/// Echo server: reads what arrives and writes it back; while a write is
/// pending, the connection is not read from (bounded memory per connection).
fn serve(listener: TcpListener) {
    struct Conn {
        s: TcpStream,
        buf: Vec<u8>,
        off: usize,
        len: usize,
    }
    listener
        .set_nonblocking(true)
        .expect("nonblocking listener");
    let ep = Epoll::new().expect("epoll");
    ep.ctl(libc::EPOLL_CTL_ADD, listener.as_raw_fd(), IN, u64::MAX)
        .expect("epoll add listener");
    let mut conns: Vec<Option<Conn>> = Vec::new();
    let mut evs = vec![libc::epoll_event { events: 0, u64: 0 }; 256];
    loop {
        let n = ep.wait(&mut evs, 1000);
        for ev in &evs[..n] {
            let tok = ev.u64;
            if tok == u64::MAX {
                loop {
                    match listener.accept() {
                        Ok((s, _)) => {
                            let _ = s.set_nonblocking(true);
                            let _ = s.set_nodelay(true);
                            let slot =
                                conns.iter().position(Option::is_none).unwrap_or_else(|| {
                                    conns.push(None);
                                    conns.len() - 1
                                });
                            if ep
                                .ctl(libc::EPOLL_CTL_ADD, s.as_raw_fd(), IN, slot as u64)
                                .is_ok()
                            {
                                conns[slot] = Some(Conn {
                                    s,
                                    buf: vec![0; 64 * 1024],
                                    off: 0,
                                    len: 0,
                                });
                            }
                        }
                        Err(e) if would_block(&e) => break,
                        Err(_) => break,
                    }
                }
                continue;
            }
            let slot = tok as usize;
            let Some(c) = conns.get_mut(slot).and_then(Option::as_mut) else {
                continue;
            };
            let mut dead = false;
            loop {
                if c.off < c.len {
                    match c.s.write(&c.buf[c.off..c.len]) {
                        Ok(0) => {
                            dead = true;
                            break;
                        }
                        Ok(w) => c.off += w,
                        Err(e) if would_block(&e) => break,
                        Err(_) => {
                            dead = true;
                            break;
                        }
                    }
                    continue;
                }
                match c.s.read(&mut c.buf) {
                    Ok(0) => {
                        dead = true;
                        break;
                    }
                    Ok(r) => {
                        c.off = 0;
                        c.len = r;
                    }
                    Err(e) if would_block(&e) => break,
                    Err(_) => {
                        dead = true;
                        break;
                    }
                }
            }
            if dead {
                let _ = ep.ctl(libc::EPOLL_CTL_DEL, c.s.as_raw_fd(), 0, 0);
                conns[slot] = None;
            } else {
                let want = if c.off < c.len { OUT } else { IN };
                let _ = ep.ctl(libc::EPOLL_CTL_MOD, c.s.as_raw_fd(), want, tok);
            }
        }
    }
}

fn connect_retry(port: u16) -> TcpStream {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let end = Instant::now() + Duration::from_secs(15);
    loop {
        match TcpStream::connect(addr) {
            Ok(s) => return s,
            Err(e) if Instant::now() < end => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => {
                eprintln!("shapes: connect 127.0.0.1:{port}: {e}");
                std::process::exit(1);
            }
        }
    }
}

fn pct(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    f64::from(sorted[i.min(sorted.len() - 1)]) / 1000.0
}

/// Closed-loop clients: every connection has one request of `msg` bytes in
/// flight. Returns the JSON result line.
fn client(o: &Opts) -> String {
    struct Conn {
        s: TcpStream,
        sent: usize,
        got: usize,
        t0: Instant,
    }
    let ep = Epoll::new().expect("epoll");
    let mut conns = Vec::new();
    for &p in &o.connect {
        for _ in 0..o.conns {
            let s = connect_retry(p);
            s.set_nodelay(true).expect("nodelay");
            s.set_nonblocking(true).expect("nonblocking");
            ep.ctl(libc::EPOLL_CTL_ADD, s.as_raw_fd(), OUT, conns.len() as u64)
                .expect("epoll add");
            conns.push(Conn {
                s,
                sent: 0,
                got: 0,
                t0: Instant::now(),
            });
        }
    }
    let out = vec![0x5au8; o.msg];
    let mut inb = vec![0u8; o.msg.min(256 * 1024)];
    let mut evs = vec![libc::epoll_event { events: 0, u64: 0 }; 256];
    let start = Instant::now();
    let m0 = start + Duration::from_secs_f64(o.warmup);
    let m1 = m0 + Duration::from_secs_f64(o.secs);
    let mut ops = 0u64;
    let mut lats: Vec<u32> = Vec::new();
    let mut measuring = false;
    loop {
        let now = Instant::now();
        if now >= m1 {
            break;
        }
        if !measuring && now >= m0 {
            measuring = true;
        }
        let n = ep.wait(&mut evs, 50);
        for ev in &evs[..n] {
            let i = ev.u64 as usize;
            let c = &mut conns[i];
            loop {
                if c.sent < o.msg {
                    if c.sent == 0 {
                        c.t0 = Instant::now();
                    }
                    match c.s.write(&out[c.sent..]) {
                        Ok(0) => fail("peer closed"),
                        Ok(w) => c.sent += w,
                        Err(e) if would_block(&e) => break,
                        Err(e) => fail(&e.to_string()),
                    }
                    if c.sent == o.msg {
                        let _ = ep.ctl(libc::EPOLL_CTL_MOD, c.s.as_raw_fd(), IN, i as u64);
                    }
                    continue;
                }
                let want = (o.msg - c.got).min(inb.len());
                match c.s.read(&mut inb[..want]) {
                    Ok(0) => fail("peer closed"),
                    Ok(r) => c.got += r,
                    Err(e) if would_block(&e) => break,
                    Err(e) => fail(&e.to_string()),
                }
                if c.got == o.msg {
                    if measuring {
                        ops += 1;
                        if o.lat {
                            let ns = c.t0.elapsed().as_nanos().min(u128::from(u32::MAX));
                            lats.push(ns as u32);
                        }
                    }
                    c.sent = 0;
                    c.got = 0;
                    let _ = ep.ctl(libc::EPOLL_CTL_MOD, c.s.as_raw_fd(), OUT, i as u64);
                    break;
                }
            }
        }
    }
    let secs = o.secs;
    let mut line = format!(
        "{{\"ops\":{ops},\"secs\":{secs},\"conns\":{},\"msg\":{},\"ops_per_s\":{:.1},\"mb_per_s\":{:.3}",
        conns.len(),
        o.msg,
        ops as f64 / secs,
        ops as f64 * o.msg as f64 / secs / 1e6
    );
    if o.lat {
        lats.sort_unstable();
        line += &format!(
            ",\"p50_us\":{:.3},\"p99_us\":{:.3},\"p999_us\":{:.3}",
            pct(&lats, 50.0),
            pct(&lats, 99.0),
            pct(&lats, 99.9)
        );
    }
    line.push('}');
    line
}

fn fail(what: &str) -> ! {
    eprintln!("shapes: client connection failed: {what}");
    std::process::exit(1)
}

fn main() {
    let o = parse();
    raise_nofile();
    if let Some(p) = o.listen {
        let l = TcpListener::bind((Ipv4Addr::LOCALHOST, p)).unwrap_or_else(|e| {
            eprintln!("shapes: bind 127.0.0.1:{p}: {e}");
            std::process::exit(1)
        });
        // std listens with a small backlog; 1024 connections arrive at once.
        // SAFETY: plain syscall on a socket we own.
        unsafe { libc::listen(l.as_raw_fd(), 4096) };
        if o.connect.is_empty() {
            serve(l);
            return;
        }
        std::thread::spawn(move || serve(l));
    }
    if let Some(path) = &o.wait_for {
        // The harness creates `path` once every peer listens.
        let end = Instant::now() + Duration::from_secs(30);
        while !path.exists() {
            if Instant::now() > end {
                eprintln!("shapes: {} never appeared", path.display());
                std::process::exit(1);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    let line = client(&o);
    let mut so = io::stdout().lock();
    let _ = writeln!(so, "{line}");
    let _ = so.flush();
    drop(so);
    if o.listen.is_some() {
        loop {
            std::thread::park();
        }
    }
}
