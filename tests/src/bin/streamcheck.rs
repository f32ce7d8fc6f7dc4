//! streamcheck: a byte-stream property check for the shim, speaking raw
//! libc so that every data hook is exercised.
//!
//! ```text
//! streamcheck server --seed S --mib M [--conns C] [--mode block|nonblock|mixed] [--pause-ms P] [--timeout-s T]
//! streamcheck client --port PORT [--host ADDR] (same options)
//! ```
//!
//! The server listens on 127.0.0.1:0 (`--host ADDR`: ADDR, an IPv4 address,
//! for runs between hosts) and prints `listening PORT`. The client
//! opens C connections (each starts with a 4-byte connection index). On
//! every connection both sides at once send M MiB of seeded pseudo-random
//! bytes (a writer thread) and verify, byte for byte, what they receive (a
//! reader thread), then shutdown(SHUT_WR) and expect EOF exactly at the end.
//!
//! Writes: random sizes (1 B .. 256 KiB, log-uniform) through write, send,
//! sendto, writev and sendmsg (1..8 iovecs), flags 0 / MSG_DONTWAIT /
//! MSG_NOSIGNAL. Reads: random sizes through read, recv, recvfrom, readv,
//! recvmsg, MSG_PEEK followed by a read of exactly the peeked bytes (which
//! must be the same), MSG_WAITALL (on a blocking socket it must fill the
//! buffer unless the stream ends), MSG_DONTWAIT, FIONREAD. EAGAIN is waited
//! out with poll, ppoll, select, or epoll (level-triggered or one-shot).
//! Sockets are blocking or O_NONBLOCK (`--mode`, `mixed`: per side and
//! connection at random; a non-blocking client connects asynchronously).
//! With `--pause-ms`, each writer pauses once halfway, so the connection is
//! surely alive for a while (for `ringsock-ctl status`).
//!
//! Prints `conn I sent N HASH recv N HASH` per connection (HASH: FNV-1a 64
//! of the bytes) and `ok`; any violation prints `FAIL ...` and exits 1; the
//! watchdog (`--timeout-s`, default 60) prints the progress of every
//! connection and exits 2.

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ringsock_integration::payload;

const MAX_IO: usize = 256 * 1024;

struct Opts {
    server: bool,
    port: u16,
    host: std::net::Ipv4Addr,
    seed: u64,
    mib: usize,
    conns: u32,
    mode: String,
    pause_ms: u64,
    timeout_s: u64,
}

fn usage() -> ! {
    eprintln!("usage: streamcheck server|client [--port P] [--host A] [--seed S] [--mib M] [--conns C] [--mode block|nonblock|mixed] [--pause-ms P] [--timeout-s T]");
    std::process::exit(64);
}

fn parse() -> Opts {
    let mut a = std::env::args().skip(1);
    let role = a.next().unwrap_or_else(|| usage());
    let mut o = Opts {
        server: match role.as_str() {
            "server" => true,
            "client" => false,
            _ => usage(),
        },
        port: 0,
        host: std::net::Ipv4Addr::LOCALHOST,
        seed: 1,
        mib: 4,
        conns: 1,
        mode: "mixed".into(),
        pause_ms: 0,
        timeout_s: 60,
    };
    while let Some(k) = a.next() {
        let v = a.next().unwrap_or_else(|| usage());
        let num = || v.parse::<u64>().unwrap_or_else(|_| usage());
        match k.as_str() {
            "--port" => o.port = num() as u16,
            "--host" => o.host = v.parse().unwrap_or_else(|_| usage()),
            "--seed" => o.seed = num(),
            "--mib" => o.mib = num() as usize,
            "--conns" => o.conns = num() as u32,
            "--mode" => o.mode = v.clone(),
            "--pause-ms" => o.pause_ms = num(),
            "--timeout-s" => o.timeout_s = num(),
            _ => usage(),
        }
    }
    o
}

fn fail(msg: String) -> ! {
    eprintln!("FAIL {msg}");
    std::process::exit(1);
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// xorshift64* for the choices (sizes, calls, flags).
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    /// 1 ..= MAX_IO, log-uniform: as many tiny as huge operations.
    fn size(&mut self) -> usize {
        let bits = self.below(19) as u32; // 2^0 .. 2^18 = 256 KiB
        let base = 1usize << bits;
        (base + self.below(base as u64) as usize).clamp(1, MAX_IO)
    }
}

fn fnv(h: &mut u64, data: &[u8]) {
    for &b in data {
        *h ^= u64::from(b);
        *h = h.wrapping_mul(0x100_0000_01b3);
    }
}

const FNV0: u64 = 0xcbf2_9ce4_8422_2325;

/// How a thread waits for readiness after EAGAIN.
struct Waiter {
    fd: RawFd,
    events: i16,
    ep_lt: RawFd,
    ep_oneshot: RawFd,
}

impl Waiter {
    fn new(fd: RawFd, events: i16) -> Waiter {
        let ev = if events == libc::POLLIN {
            libc::EPOLLIN
        } else {
            libc::EPOLLOUT
        } as u32;
        // SAFETY: plain syscalls on our own descriptors.
        unsafe {
            let ep_lt = libc::epoll_create1(libc::EPOLL_CLOEXEC);
            let ep_oneshot = libc::epoll_create1(libc::EPOLL_CLOEXEC);
            if ep_lt < 0 || ep_oneshot < 0 {
                fail(format!("epoll_create1: errno {}", errno()));
            }
            let mut e = libc::epoll_event { events: ev, u64: 7 };
            if libc::epoll_ctl(ep_lt, libc::EPOLL_CTL_ADD, fd, &mut e) != 0 {
                fail(format!("epoll_ctl ADD: errno {}", errno()));
            }
            let mut e = libc::epoll_event {
                events: ev | libc::EPOLLONESHOT as u32,
                u64: 9,
            };
            if libc::epoll_ctl(ep_oneshot, libc::EPOLL_CTL_ADD, fd, &mut e) != 0 {
                fail(format!("epoll_ctl ADD oneshot: errno {}", errno()));
            }
            // Fire once now so that every later wait starts with a MOD.
            let mut out = [libc::epoll_event { events: 0, u64: 0 }; 1];
            libc::epoll_wait(ep_oneshot, out.as_mut_ptr(), 1, 0);
            Waiter {
                fd,
                events,
                ep_lt,
                ep_oneshot,
            }
        }
    }

    /// Waits until the fd is ready (or 1 s passes: the caller just retries).
    fn wait(&self, rng: &mut Rng, what: &str) {
        // SAFETY: plain syscalls on our own descriptors and stack buffers.
        unsafe {
            match rng.below(5) {
                0 => {
                    let mut p = libc::pollfd {
                        fd: self.fd,
                        events: self.events,
                        revents: 0,
                    };
                    if libc::poll(&mut p, 1, 1000) < 0 && errno() != libc::EINTR {
                        fail(format!("{what}: poll: errno {}", errno()));
                    }
                }
                1 => {
                    let mut p = libc::pollfd {
                        fd: self.fd,
                        events: self.events,
                        revents: 0,
                    };
                    let ts = libc::timespec {
                        tv_sec: 1,
                        tv_nsec: 0,
                    };
                    if libc::ppoll(&mut p, 1, &ts, std::ptr::null()) < 0 && errno() != libc::EINTR {
                        fail(format!("{what}: ppoll: errno {}", errno()));
                    }
                }
                2 if self.fd < libc::FD_SETSIZE as RawFd => {
                    let mut set: libc::fd_set = std::mem::zeroed();
                    libc::FD_ZERO(&mut set);
                    libc::FD_SET(self.fd, &mut set);
                    let mut tv = libc::timeval {
                        tv_sec: 1,
                        tv_usec: 0,
                    };
                    let (r, w) = if self.events == libc::POLLIN {
                        (&mut set as *mut _, std::ptr::null_mut())
                    } else {
                        (std::ptr::null_mut(), &mut set as *mut _)
                    };
                    if libc::select(self.fd + 1, r, w, std::ptr::null_mut(), &mut tv) < 0
                        && errno() != libc::EINTR
                    {
                        fail(format!("{what}: select: errno {}", errno()));
                    }
                }
                3 => {
                    let mut out = [libc::epoll_event { events: 0, u64: 0 }; 4];
                    let n = libc::epoll_wait(self.ep_lt, out.as_mut_ptr(), 4, 1000);
                    if n < 0 && errno() != libc::EINTR {
                        fail(format!("{what}: epoll_wait: errno {}", errno()));
                    }
                    if n > 0 && out[0].u64 != 7 {
                        fail(format!("{what}: epoll_wait returned data {}", {
                            out[0].u64
                        }));
                    }
                }
                _ => {
                    let ev = if self.events == libc::POLLIN {
                        libc::EPOLLIN
                    } else {
                        libc::EPOLLOUT
                    } as u32;
                    let mut e = libc::epoll_event {
                        events: ev | libc::EPOLLONESHOT as u32,
                        u64: 9,
                    };
                    if libc::epoll_ctl(self.ep_oneshot, libc::EPOLL_CTL_MOD, self.fd, &mut e) != 0 {
                        fail(format!("{what}: epoll_ctl MOD: errno {}", errno()));
                    }
                    let mut out = [libc::epoll_event { events: 0, u64: 0 }; 4];
                    let n = libc::epoll_pwait(
                        self.ep_oneshot,
                        out.as_mut_ptr(),
                        4,
                        1000,
                        std::ptr::null(),
                    );
                    if n < 0 && errno() != libc::EINTR {
                        fail(format!("{what}: epoll_pwait: errno {}", errno()));
                    }
                    if n > 0 && out[0].u64 != 9 {
                        fail(format!("{what}: epoll_pwait returned data {}", {
                            out[0].u64
                        }));
                    }
                }
            }
        }
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        // SAFETY: closing our own epoll descriptors.
        unsafe {
            libc::close(self.ep_lt);
            libc::close(self.ep_oneshot);
        }
    }
}

/// Splits `len` bytes at `base` into 1..8 iovecs.
fn iovecs(base: *mut u8, len: usize, rng: &mut Rng) -> Vec<libc::iovec> {
    let n = 1 + rng.below(8) as usize;
    let mut cuts: Vec<usize> = (0..n - 1)
        .map(|_| rng.below(len as u64 + 1) as usize)
        .collect();
    cuts.push(0);
    cuts.push(len);
    cuts.sort_unstable();
    cuts.windows(2)
        .map(|w| libc::iovec {
            // SAFETY: w[0] <= len, inside the buffer.
            iov_base: unsafe { base.add(w[0]) }.cast(),
            iov_len: w[1] - w[0],
        })
        .collect()
}

/// Progress counters, for the watchdog.
struct Progress {
    sent: AtomicU64,
    received: AtomicU64,
}

struct Conn {
    idx: u32,
    fd: RawFd,
    nonblocking: bool,
}

fn writer(c: &Conn, data: &[u8], seed: u64, pause_ms: u64, prog: &Progress) -> u64 {
    let mut rng = Rng::new(seed);
    let w = Waiter::new(c.fd, libc::POLLOUT);
    let mut off = 0usize;
    let mut hash = FNV0;
    let mut paused = pause_ms == 0;
    let what = format!("conn {} writer", c.idx);
    while off < data.len() {
        if !paused && off >= data.len() / 2 {
            paused = true;
            std::thread::sleep(Duration::from_millis(pause_ms));
        }
        let len = rng.size().min(data.len() - off);
        let p = data[off..].as_ptr() as *mut u8;
        let flags = match rng.below(4) {
            0 => libc::MSG_DONTWAIT,
            1 => libc::MSG_NOSIGNAL,
            _ => 0,
        };
        let call = rng.below(5);
        // SAFETY: p..p+len lies in `data`; the kernel (or shim) only reads.
        let n = unsafe {
            match call {
                0 => libc::write(c.fd, p.cast(), len),
                1 => libc::send(c.fd, p.cast(), len, flags),
                2 => libc::sendto(c.fd, p.cast(), len, flags, std::ptr::null(), 0),
                3 => {
                    let v = iovecs(p, len, &mut rng);
                    libc::writev(c.fd, v.as_ptr(), v.len() as i32)
                }
                _ => {
                    let mut v = iovecs(p, len, &mut rng);
                    let mut m: libc::msghdr = std::mem::zeroed();
                    m.msg_iov = v.as_mut_ptr();
                    m.msg_iovlen = v.len();
                    libc::sendmsg(c.fd, &m, flags)
                }
            }
        };
        if n < 0 {
            let e = errno();
            let may_block =
                c.nonblocking || (flags == libc::MSG_DONTWAIT && call != 0 && call != 3);
            if (e == libc::EAGAIN || e == libc::EWOULDBLOCK) && may_block {
                w.wait(&mut rng, &what);
                continue;
            }
            if e == libc::EINTR {
                continue;
            }
            fail(format!(
                "{what}: call {call} flags {flags:#x} len {len} at {off}: errno {e}"
            ));
        }
        let n = n as usize;
        if n == 0 || n > len {
            fail(format!("{what}: call {call} wrote {n} of {len} at {off}"));
        }
        fnv(&mut hash, &data[off..off + n]);
        off += n;
        prog.sent.store(off as u64, Ordering::Relaxed);
    }
    // SAFETY: shutting down our own socket's sending side.
    if unsafe { libc::shutdown(c.fd, libc::SHUT_WR) } != 0 {
        fail(format!("{what}: shutdown(SHUT_WR): errno {}", errno()));
    }
    hash
}

fn check(what: &str, got: &[u8], want: &[u8], off: usize, how: &str) {
    if got != want {
        let i = got.iter().zip(want).position(|(a, b)| a != b).unwrap_or(0);
        fail(format!(
            "{what}: {how}: wrong bytes at stream offset {} (chunk of {} at {off}): got {:02x?} want {:02x?}",
            off + i,
            got.len(),
            &got[i..(i + 16).min(got.len())],
            &want[i..(i + 16).min(want.len())]
        ));
    }
}

fn reader(c: &Conn, want: &[u8], seed: u64, prog: &Progress) -> u64 {
    let mut rng = Rng::new(seed);
    let w = Waiter::new(c.fd, libc::POLLIN);
    let mut buf = vec![0u8; MAX_IO];
    let mut off = 0usize;
    let mut hash = FNV0;
    let what = format!("conn {} reader", c.idx);
    loop {
        let len = rng.size();
        let p = buf.as_mut_ptr();
        let call = rng.below(10);
        let dontwait = rng.below(4) == 0;
        let f = if dontwait { libc::MSG_DONTWAIT } else { 0 };
        let remaining = want.len() - off;
        // SAFETY: p..p+len lies in `buf`.
        let n = unsafe {
            match call {
                0 => libc::read(c.fd, p.cast(), len),
                1 => libc::recv(c.fd, p.cast(), len, f),
                2 => libc::recvfrom(
                    c.fd,
                    p.cast(),
                    len,
                    f,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                ),
                3 => {
                    let v = iovecs(p, len, &mut rng);
                    libc::readv(c.fd, v.as_ptr(), v.len() as i32)
                }
                4 => {
                    let mut v = iovecs(p, len, &mut rng);
                    let mut m: libc::msghdr = std::mem::zeroed();
                    m.msg_iov = v.as_mut_ptr();
                    m.msg_iovlen = v.len();
                    libc::recvmsg(c.fd, &mut m, f)
                }
                5 => libc::recv(c.fd, p.cast(), len, libc::MSG_WAITALL),
                6 => {
                    let mut avail: libc::c_int = -1;
                    if libc::ioctl(c.fd, libc::FIONREAD, &mut avail) != 0 {
                        fail(format!("{what}: FIONREAD: errno {}", errno()));
                    }
                    if avail < 0 || avail as usize > remaining {
                        fail(format!(
                            "{what}: FIONREAD says {avail} with {remaining} left in the stream"
                        ));
                    }
                    libc::recv(c.fd, p.cast(), len, f)
                }
                _ => {
                    // Peek, then read exactly what was peeked.
                    let k = libc::recv(c.fd, p.cast(), len, libc::MSG_PEEK | f);
                    if k > 0 {
                        let k = k as usize;
                        if k > remaining {
                            fail(format!("{what}: peeked {k} with {remaining} left"));
                        }
                        check(&what, &buf[..k], &want[off..off + k], off, "MSG_PEEK");
                        let mut again = vec![0u8; k];
                        let r = libc::recv(c.fd, again.as_mut_ptr().cast(), k, f);
                        if r != k as isize {
                            fail(format!(
                                "{what}: read after a peek of {k} returned {r} (errno {})",
                                errno()
                            ));
                        }
                        buf[..k].copy_from_slice(&again);
                    }
                    k
                }
            }
        };
        if n < 0 {
            let e = errno();
            if e == libc::EAGAIN || e == libc::EWOULDBLOCK {
                if !(c.nonblocking || dontwait && matches!(call, 1 | 2 | 4 | 6 | 7 | 8 | 9)) {
                    fail(format!("{what}: EAGAIN on a blocking call {call}"));
                }
                w.wait(&mut rng, &what);
                continue;
            }
            if e == libc::EINTR {
                continue;
            }
            fail(format!("{what}: call {call} len {len} at {off}: errno {e}"));
        }
        let n = n as usize;
        if n == 0 {
            if off != want.len() {
                fail(format!(
                    "{what}: EOF after {off} of {} bytes (call {call})",
                    want.len()
                ));
            }
            return hash;
        }
        if n > len || n > remaining {
            fail(format!(
                "{what}: call {call} returned {n} for {len} with {remaining} left at {off}"
            ));
        }
        if call == 5 && !c.nonblocking && n < len.min(remaining) {
            fail(format!(
                "{what}: MSG_WAITALL on a blocking socket returned {n} of {len} ({remaining} left in the stream) at {off}"
            ));
        }
        check(
            &what,
            &buf[..n],
            &want[off..off + n],
            off,
            &format!("call {call}"),
        );
        fnv(&mut hash, &buf[..n]);
        off += n;
        prog.received.store(off as u64, Ordering::Relaxed);
    }
}

fn set_nonblocking(fd: RawFd, on: bool) {
    // SAFETY: fcntl on our own socket.
    unsafe {
        let fl = libc::fcntl(fd, libc::F_GETFL);
        let fl = if on {
            fl | libc::O_NONBLOCK
        } else {
            fl & !libc::O_NONBLOCK
        };
        if libc::fcntl(fd, libc::F_SETFL, fl) != 0 {
            fail(format!("fcntl(F_SETFL): errno {}", errno()));
        }
    }
}

fn sockaddr(host: std::net::Ipv4Addr, port: u16) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as u16,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(host).to_be(),
        },
        sin_zero: [0; 8],
    }
}

/// Reads exactly `buf.len()` bytes (a blocking or non-blocking socket).
fn read_exact(fd: RawFd, buf: &mut [u8], what: &str) {
    let mut off = 0;
    while off < buf.len() {
        // SAFETY: into our buffer.
        let n = unsafe { libc::recv(fd, buf[off..].as_mut_ptr().cast(), buf.len() - off, 0) };
        if n < 0 {
            let e = errno();
            if e == libc::EAGAIN || e == libc::EINTR {
                let mut p = libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one pollfd on the stack.
                unsafe { libc::poll(&mut p, 1, 1000) };
                continue;
            }
            fail(format!("{what}: header recv: errno {e}"));
        }
        if n == 0 {
            fail(format!("{what}: EOF in the header"));
        }
        off += n as usize;
    }
}

fn write_all(fd: RawFd, buf: &[u8], what: &str) {
    let mut off = 0;
    while off < buf.len() {
        // SAFETY: from our buffer.
        let n = unsafe { libc::send(fd, buf[off..].as_ptr().cast(), buf.len() - off, 0) };
        if n < 0 {
            let e = errno();
            if e == libc::EAGAIN || e == libc::EINTR {
                let mut p = libc::pollfd {
                    fd,
                    events: libc::POLLOUT,
                    revents: 0,
                };
                // SAFETY: one pollfd on the stack.
                unsafe { libc::poll(&mut p, 1, 1000) };
                continue;
            }
            fail(format!("{what}: header send: errno {e}"));
        }
        off += n as usize;
    }
}

fn nonblocking_for(o: &Opts, rng: &mut Rng) -> bool {
    match o.mode.as_str() {
        "block" => false,
        "nonblock" => true,
        _ => rng.below(2) == 0,
    }
}

/// The stream seeds: what the client sends on connection `idx`, and what
/// the server sends (odd and distinct: `payload` forces the low bit).
fn stream_seed(seed: u64, idx: u32, from_client: bool) -> u64 {
    let n = seed.wrapping_mul(1_000_003) + u64::from(idx) * 2 + u64::from(!from_client);
    (n << 1) | 1
}

fn run_conn(o: &Opts, c: Conn, prog: Arc<Progress>) -> String {
    let bytes = o.mib << 20;
    let role = if o.server { 2 } else { 1 };
    let mine = payload(bytes, stream_seed(o.seed, c.idx, !o.server));
    let theirs = payload(bytes, stream_seed(o.seed, c.idx, o.server));
    let choice_seed = o.seed ^ (u64::from(c.idx) << 32) ^ (role << 48);
    let (sent, recv) = std::thread::scope(|s| {
        let w = s.spawn(|| writer(&c, &mine, choice_seed ^ 0x5757, o.pause_ms, &prog));
        let r = s.spawn(|| reader(&c, &theirs, choice_seed ^ 0x5252, &prog));
        (w.join().expect("writer"), r.join().expect("reader"))
    });
    // SAFETY: closing our socket once both threads are done.
    unsafe { libc::close(c.fd) };
    format!(
        "conn {} sent {bytes} {sent:016x} recv {bytes} {recv:016x} nonblocking {}",
        c.idx, c.nonblocking
    )
}

fn main() {
    let o = Arc::new(parse());
    let progress: Vec<Arc<Progress>> = (0..o.conns)
        .map(|_| {
            Arc::new(Progress {
                sent: AtomicU64::new(0),
                received: AtomicU64::new(0),
            })
        })
        .collect();
    {
        let progress = progress.clone();
        let t = o.timeout_s;
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_secs(t));
            let state: Vec<String> = progress
                .iter()
                .enumerate()
                .map(|(i, p)| {
                    format!(
                        "conn {i}: sent {} received {}",
                        p.sent.load(Ordering::Relaxed),
                        p.received.load(Ordering::Relaxed)
                    )
                })
                .collect();
            eprintln!("TIMEOUT after {t} s: {}", state.join("; "));
            std::process::exit(2);
        });
    }
    let mut rng = Rng::new(o.seed ^ if o.server { 0xaaaa } else { 0xbbbb });
    let mut handles = Vec::new();
    // SAFETY: raw socket calls on descriptors we own.
    unsafe {
        if o.server {
            let l = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
            let one: libc::c_int = 1;
            libc::setsockopt(
                l,
                libc::SOL_SOCKET,
                libc::SO_REUSEADDR,
                (&one as *const libc::c_int).cast(),
                4,
            );
            let a = sockaddr(o.host, o.port);
            if libc::bind(l, (&a as *const libc::sockaddr_in).cast(), 16) != 0
                || libc::listen(l, 64) != 0
            {
                fail(format!("bind/listen: errno {}", errno()));
            }
            let mut got: libc::sockaddr_in = std::mem::zeroed();
            let mut len: libc::socklen_t = 16;
            libc::getsockname(l, (&mut got as *mut libc::sockaddr_in).cast(), &mut len);
            println!("listening {}", u16::from_be(got.sin_port));
            use std::io::Write;
            let _ = std::io::stdout().flush();
            for _ in 0..o.conns {
                let nb = nonblocking_for(&o, &mut rng);
                let fd = if nb && rng.below(2) == 0 {
                    libc::accept4(
                        l,
                        std::ptr::null_mut(),
                        std::ptr::null_mut(),
                        libc::SOCK_NONBLOCK,
                    )
                } else {
                    let fd = libc::accept(l, std::ptr::null_mut(), std::ptr::null_mut());
                    if fd >= 0 && nb {
                        set_nonblocking(fd, true);
                    }
                    fd
                };
                if fd < 0 {
                    fail(format!("accept: errno {}", errno()));
                }
                let mut hdr = [0u8; 4];
                read_exact(fd, &mut hdr, "server");
                let idx = u32::from_le_bytes(hdr);
                if idx >= o.conns {
                    fail(format!("bad connection index {idx}"));
                }
                let c = Conn {
                    idx,
                    fd,
                    nonblocking: nb,
                };
                let (o, p) = (o.clone(), progress[idx as usize].clone());
                handles.push(std::thread::spawn(move || run_conn(&o, c, p)));
            }
            libc::close(l);
        } else {
            for idx in 0..o.conns {
                let nb = nonblocking_for(&o, &mut rng);
                let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
                if nb {
                    set_nonblocking(fd, true);
                }
                let a = sockaddr(o.host, o.port);
                if libc::connect(fd, (&a as *const libc::sockaddr_in).cast(), 16) != 0 {
                    if errno() != libc::EINPROGRESS || !nb {
                        fail(format!("connect: errno {}", errno()));
                    }
                    let mut p = libc::pollfd {
                        fd,
                        events: libc::POLLOUT,
                        revents: 0,
                    };
                    if libc::poll(&mut p, 1, 10_000) != 1 {
                        fail(format!(
                            "connect: not writable after 10 s (errno {})",
                            errno()
                        ));
                    }
                    let mut err: libc::c_int = 0;
                    let mut l: libc::socklen_t = 4;
                    libc::getsockopt(
                        fd,
                        libc::SOL_SOCKET,
                        libc::SO_ERROR,
                        (&mut err as *mut libc::c_int).cast(),
                        &mut l,
                    );
                    if err != 0 {
                        fail(format!("async connect: SO_ERROR {err}"));
                    }
                }
                write_all(fd, &idx.to_le_bytes(), "client");
                let c = Conn {
                    idx,
                    fd,
                    nonblocking: nb,
                };
                let (o, p) = (o.clone(), progress[idx as usize].clone());
                handles.push(std::thread::spawn(move || run_conn(&o, c, p)));
            }
        }
    }
    let mut lines: Vec<String> = handles
        .into_iter()
        .map(|h| h.join().expect("connection thread"))
        .collect();
    lines.sort();
    for l in lines {
        println!("{l}");
    }
    println!("ok");
}
