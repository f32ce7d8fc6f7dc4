//! sharedsock: one socket used by several threads at once, and a writer
//! held up by a slow reader, for the shim's load tests.
//!
//! ```text
//! sharedsock shared server [--writers W] [--mib M]
//! sharedsock shared client --port P [--writers W] [--mib M]
//! sharedsock slow server [--sleep-ms S] [--chunk C]      (the reader)
//! sharedsock slow client --port P [--mib M]              (the writer)
//! ```
//!
//! Servers listen on 127.0.0.1:0, print `listening PORT` and take one
//! connection.
//!
//! `shared`: each side runs one reader thread and W writer threads on the
//! same socket at once. A writer sends framed records (16-byte header:
//! magic, writer, sequence number, length; then seeded pseudo-random bytes)
//! holding a lock for the whole record, so records never interleave; the
//! stream hash is taken under the same lock, in the order the bytes went
//! out. Together the writers send M MiB, then the side shuts down its write
//! half. The reader reads in random sizes, checks every record's bytes and
//! that each writer's sequence numbers arrive in order, until EOF. Prints
//! `sent BYTES HASH RECORDS` and `recv BYTES HASH RECORDS`, then `ok`.
//!
//! `slow`: the reader says `go` (so the writer knows the connection is
//! settled), sleeps S ms, then reads C bytes at a time, pausing 1 ms every
//! 256 KiB, checking every byte against the writer's generator, until EOF.
//! The writer first fills the connection with MSG_DONTWAIT sends until
//! EAGAIN (`eagain_after BYTES`), checks that a send 200 ms later still gets
//! EAGAIN (`still_full`), then sends the rest of M MiB with blocking sends,
//! shuts down, and prints `sent BYTES HASH` and its peak RSS
//! (`rss_peak_kib K`, VmHWM). The reader prints `recv BYTES HASH`.
//!
//! Any violation prints `FAIL ...` and exits 1; every side gives up after
//! 60 s (exit 2).

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ringsock_integration::payload;

const MAGIC: u32 = 0x5253_4852; // "RHSR"
const HDR: usize = 16;
const MAX_BODY: u64 = 64 * 1024;

fn fail(msg: String) -> ! {
    eprintln!("FAIL {msg}");
    std::process::exit(1);
}

fn usage() -> ! {
    eprintln!("usage: sharedsock shared|slow server|client [--port P] [--writers W] [--mib M] [--sleep-ms S] [--chunk C]");
    std::process::exit(64);
}

struct Opts {
    shared: bool,
    server: bool,
    port: u16,
    writers: u32,
    mib: u64,
    sleep_ms: u64,
    chunk: usize,
}

fn parse() -> Opts {
    let a: Vec<String> = std::env::args().skip(1).collect();
    if a.len() < 2 {
        usage();
    }
    let mut o = Opts {
        shared: match a[0].as_str() {
            "shared" => true,
            "slow" => false,
            _ => usage(),
        },
        server: match a[1].as_str() {
            "server" => true,
            "client" => false,
            _ => usage(),
        },
        port: 0,
        writers: 3,
        mib: 8,
        sleep_ms: 2000,
        chunk: 4096,
    };
    for kv in a[2..].chunks(2) {
        let v: u64 = kv
            .get(1)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| usage());
        match kv[0].as_str() {
            "--port" => o.port = v as u16,
            "--writers" => o.writers = v as u32,
            "--mib" => o.mib = v,
            "--sleep-ms" => o.sleep_ms = v,
            "--chunk" => o.chunk = v as usize,
            _ => usage(),
        }
    }
    o
}

/// FNV-1a 64.
#[derive(Clone, Copy)]
struct Fnv(u64);

impl Fnv {
    fn new() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
    fn feed(&mut self, b: &[u8]) {
        for &x in b {
            self.0 = (self.0 ^ u64::from(x)).wrapping_mul(0x100_0000_01b3);
        }
    }
}

/// xorshift64*, for sizes and the slow writer's byte stream.
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
}

/// A byte stream both slow ends generate the same way, any chunking.
struct ByteGen {
    rng: Rng,
    word: [u8; 8],
    used: usize,
}

impl ByteGen {
    fn new() -> ByteGen {
        ByteGen {
            rng: Rng::new(77),
            word: [0; 8],
            used: 8,
        }
    }
    fn fill(&mut self, out: &mut [u8]) {
        for b in out {
            if self.used == 8 {
                self.word = self.rng.next().to_le_bytes();
                self.used = 0;
            }
            *b = self.word[self.used];
            self.used += 1;
        }
    }
}

fn connect_or_accept(o: &Opts) -> TcpStream {
    let s = if o.server {
        let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .unwrap_or_else(|e| fail(format!("bind: {e}")));
        println!("listening {}", l.local_addr().unwrap().port());
        l.accept()
            .unwrap_or_else(|e| fail(format!("accept: {e}")))
            .0
    } else {
        TcpStream::connect((Ipv4Addr::LOCALHOST, o.port))
            .unwrap_or_else(|e| fail(format!("connect: {e}")))
    };
    s.set_read_timeout(Some(Duration::from_secs(30))).ok();
    s.set_write_timeout(Some(Duration::from_secs(30))).ok();
    s
}

/// Seed of one record's body: side, writer, sequence number.
fn body_seed(server_sent: bool, writer: u32, seq: u32) -> u64 {
    (u64::from(server_sent) << 63) | (u64::from(writer) << 32) | u64::from(seq)
}

/// What the writers of one side have sent, in wire order.
struct Sent {
    bytes: u64,
    hash: Fnv,
    records: u64,
}

fn shared(o: &Opts) {
    let s = Arc::new(connect_or_accept(o));
    let wire = Arc::new(Mutex::new(Sent {
        bytes: 0,
        hash: Fnv::new(),
        records: 0,
    }));
    // Bytes still to send, shared by the writers.
    let budget = Arc::new(AtomicU64::new(o.mib << 20));
    let me_server = o.server;
    let writers: Vec<_> = (0..o.writers)
        .map(|w| {
            let (s, wire, budget) = (s.clone(), wire.clone(), budget.clone());
            std::thread::spawn(move || {
                let mut rng = Rng::new(u64::from(w) + 1 + 100 * u64::from(me_server));
                let mut seq = 0u32;
                loop {
                    let len = 1 + rng.next() % MAX_BODY;
                    let took = budget.fetch_update(Ordering::AcqRel, Ordering::Acquire, |b| {
                        (b > 0).then(|| b - len.min(b))
                    });
                    let Ok(left) = took else { return };
                    let len = len.min(left) as usize;
                    let mut rec = Vec::with_capacity(HDR + len);
                    for x in [MAGIC, w, seq, len as u32] {
                        rec.extend_from_slice(&x.to_le_bytes());
                    }
                    rec.extend_from_slice(&payload(len, body_seed(me_server, w, seq)));
                    let mut g = wire.lock().unwrap();
                    (&*s)
                        .write_all(&rec)
                        .unwrap_or_else(|e| fail(format!("writer {w} record {seq}: {e}")));
                    g.bytes += rec.len() as u64;
                    g.hash.feed(&rec);
                    g.records += 1;
                    drop(g);
                    seq += 1;
                }
            })
        })
        .collect();
    let reader = {
        let s = s.clone();
        std::thread::spawn(move || read_records(&s, !me_server))
    };
    for w in writers {
        w.join()
            .unwrap_or_else(|_| fail("a writer panicked".into()));
    }
    s.shutdown(std::net::Shutdown::Write)
        .unwrap_or_else(|e| fail(format!("shutdown: {e}")));
    let (rbytes, rhash, rrecords) = reader
        .join()
        .unwrap_or_else(|_| fail("the reader panicked".into()));
    let g = wire.lock().unwrap();
    println!("sent {} {:016x} {}", g.bytes, g.hash.0, g.records);
    println!("recv {rbytes} {rhash:016x} {rrecords}");
    println!("ok");
}

/// Reads records sent by the other side (`from_server`) until EOF,
/// checking each; returns (bytes, hash, records).
fn read_records(s: &TcpStream, from_server: bool) -> (u64, u64, u64) {
    let mut rng = Rng::new(if from_server { 5 } else { 6 });
    let mut hash = Fnv::new();
    let mut total = 0u64;
    let mut pending: Vec<u8> = Vec::new();
    let mut next_seq: Vec<u32> = Vec::new();
    let mut records = 0u64;
    let mut buf = vec![0u8; 128 * 1024];
    loop {
        let want = 1 + (rng.next() % buf.len() as u64) as usize;
        let n = match (&*s).read(&mut buf[..want]) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) => fail(format!("read after {total} bytes: {e}")),
        };
        hash.feed(&buf[..n]);
        total += n as u64;
        pending.extend_from_slice(&buf[..n]);
        let mut at = 0;
        while pending.len() - at >= HDR {
            let word = |i: usize| {
                u32::from_le_bytes(pending[at + 4 * i..at + 4 * i + 4].try_into().unwrap())
            };
            let (magic, w, seq, len) = (word(0), word(1), word(2), word(3) as usize);
            if magic != MAGIC || len == 0 || len as u64 > MAX_BODY {
                fail(format!(
                    "bad record header after {} bytes: {magic:#x} writer {w} seq {seq} len {len}",
                    total - (pending.len() - at) as u64
                ));
            }
            if pending.len() - at < HDR + len {
                break;
            }
            if next_seq.len() <= w as usize {
                next_seq.resize(w as usize + 1, 0);
            }
            if seq != next_seq[w as usize] {
                fail(format!(
                    "writer {w}: record {seq} arrived, expected {}",
                    next_seq[w as usize]
                ));
            }
            next_seq[w as usize] += 1;
            let body = &pending[at + HDR..at + HDR + len];
            if body != payload(len, body_seed(from_server, w, seq)).as_slice() {
                fail(format!("writer {w} record {seq}: body differs"));
            }
            records += 1;
            at += HDR + len;
        }
        pending.drain(..at);
    }
    if !pending.is_empty() {
        fail(format!("{} bytes of a record before EOF", pending.len()));
    }
    (total, hash.0, records)
}

fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

fn send_dontwait(fd: i32, b: &[u8]) -> Result<usize, i32> {
    // SAFETY: send(2) from a live buffer on our socket.
    let n = unsafe { libc::send(fd, b.as_ptr().cast(), b.len(), libc::MSG_DONTWAIT) };
    if n < 0 {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    } else {
        Ok(n as usize)
    }
}

/// Generates the next chunk once `chunk` is all sent (`off` at its end),
/// at most `left` bytes.
fn refill(left: u64, off: &mut usize, chunk: &mut Vec<u8>, gen: &mut ByteGen) {
    if *off == chunk.len() {
        let n = left.min(64 * 1024) as usize;
        chunk.resize(n, 0);
        gen.fill(chunk);
        *off = 0;
    }
}

fn slow_writer(o: &Opts) {
    let mut s = connect_or_accept(o);
    let mut go = [0u8; 2];
    s.read_exact(&mut go)
        .unwrap_or_else(|e| fail(format!("waiting for go: {e}")));
    let fd = s.as_raw_fd();
    let total = o.mib << 20;
    let mut gen = ByteGen::new();
    let mut hash = Fnv::new();
    let mut sent = 0u64;
    let mut chunk = vec![0u8; 64 * 1024];
    // `chunk[off..]` is generated but not yet sent.
    let mut off = chunk.len();
    // Fill until the connection takes no more.
    loop {
        refill(total - sent, &mut off, &mut chunk, &mut gen);
        match send_dontwait(fd, &chunk[off..]) {
            Ok(n) => {
                hash.feed(&chunk[off..off + n]);
                off += n;
                sent += n as u64;
                if sent >= total {
                    fail(format!("all {total} bytes went out without EAGAIN"));
                }
            }
            Err(libc::EAGAIN) => break,
            Err(e) => fail(format!("send(MSG_DONTWAIT) after {sent} bytes: errno {e}")),
        }
    }
    println!("eagain_after {sent}");
    std::thread::sleep(Duration::from_millis(200));
    match send_dontwait(fd, &chunk[off..]) {
        Err(libc::EAGAIN) => println!("still_full"),
        Ok(n) => fail(format!(
            "a sleeping reader's connection took {n} more bytes"
        )),
        Err(e) => fail(format!("send(MSG_DONTWAIT) while full: errno {e}")),
    }
    while sent < total {
        refill(total - sent, &mut off, &mut chunk, &mut gen);
        let n = (&s)
            .write(&chunk[off..])
            .unwrap_or_else(|e| fail(format!("blocking send after {sent} bytes: {e}")));
        hash.feed(&chunk[off..off + n]);
        off += n;
        sent += n as u64;
    }
    s.shutdown(std::net::Shutdown::Write)
        .unwrap_or_else(|e| fail(format!("shutdown: {e}")));
    // The reader closes once it has seen EOF.
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    println!("sent {sent} {:016x}", hash.0);
    println!("rss_peak_kib {}", peak_rss_kib());
    println!("ok");
}

fn slow_reader(o: &Opts) {
    let mut s = connect_or_accept(o);
    s.write_all(b"go")
        .unwrap_or_else(|e| fail(format!("go: {e}")));
    std::thread::sleep(Duration::from_millis(o.sleep_ms));
    let mut gen = ByteGen::new();
    let mut want = vec![0u8; o.chunk];
    let mut buf = vec![0u8; o.chunk];
    let mut hash = Fnv::new();
    let mut total = 0u64;
    let mut since_pause = 0usize;
    loop {
        let n = match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) => fail(format!("read after {total} bytes: {e}")),
        };
        gen.fill(&mut want[..n]);
        if buf[..n] != want[..n] {
            let at = buf.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(0);
            fail(format!("byte {} differs", total + at as u64));
        }
        hash.feed(&buf[..n]);
        total += n as u64;
        since_pause += n;
        if since_pause >= 256 * 1024 {
            since_pause = 0;
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    println!("recv {total} {:016x}", hash.0);
    println!("ok");
}

fn main() {
    let o = parse();
    // A watchdog: a stuck connection fails the run instead of hanging it.
    std::thread::spawn(|| {
        std::thread::sleep(Duration::from_secs(60));
        eprintln!("FAIL timeout after 60 s");
        std::process::exit(2);
    });
    match (o.shared, o.server) {
        (true, _) => shared(&o),
        (false, true) => slow_reader(&o),
        (false, false) => slow_writer(&o),
    }
}
