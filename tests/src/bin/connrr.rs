//! connrr: short connections for `scripts/bench` (suite `short`): each is
//! connect, one request, its response, close.
//!
//! ```text
//! connrr server [--port P] [--threads T] [--size B]
//! connrr client --port P --n N [--size B] [--probe-every K] [--slowest S]
//! connrr churn --port P --secs S --rate R [--threads T] [--size B]
//! ```
//!
//! * `server` listens on 127.0.0.1:P (0: any port), prints `listening PORT`,
//!   and on T threads accepts connections; on each it reads B bytes, sends
//!   them back and closes first, as HTTP/1.0 servers do (so TIME-WAIT
//!   falls on the server's port, not on the client's ephemeral ports,
//!   which a churn would run out of). Runs until killed.
//! * `client` makes N connections one after the other; each sends B bytes
//!   (seeded by the connection's index), checks the echo byte for byte,
//!   reads the server's EOF and closes. Every K-th connection (default 100) is a probe: before it
//!   closes, /proc/self says whether a ring is mapped (so whether it got
//!   one); probes are left out of the latencies. Prints one JSON line:
//!   `{"n":..,"p50_us":..,"p99_us":..,"mean_us":..,"conns_per_s":..,
//!   "probes":..,"probes_on_ring":..}`, the latencies from before
//!   connect() to after close(); with S > 0 also `"slowest":[[i,us],..]`,
//!   the S slowest connections by index (where in the run the slow ones
//!   fall).
//! * `churn` runs T threads of such connections for S seconds, paced to R
//!   connections per second in all (a thread that falls behind goes on at
//!   once, so the rate achieved is what the machine gives). Prints one JSON
//!   line: `{"conns":..,"secs":..,"rate":..,"target":..}`.
//!
//! Any error or wrong byte prints `FAIL ...` and exits 1; every read is
//! bounded by a 20 s timeout.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ringsock_integration::payload;

const IO_TIMEOUT: Duration = Duration::from_secs(20);

fn fail(msg: String) -> ! {
    eprintln!("FAIL {msg}");
    std::process::exit(1);
}

fn usage() -> ! {
    eprintln!(
        "usage: connrr server [--port P] [--threads T] [--size B] | \
         client --port P --n N [--size B] | \
         churn --port P --secs S --rate R [--threads T] [--size B]"
    );
    std::process::exit(64);
}

struct Opts {
    port: u16,
    threads: usize,
    size: usize,
    n: usize,
    secs: f64,
    rate: f64,
    probe_every: usize,
    slowest: usize,
}

fn parse(args: &[String]) -> Opts {
    let mut o = Opts {
        port: 0,
        threads: 1,
        size: 64,
        n: 1000,
        secs: 10.0,
        rate: 20_000.0,
        probe_every: 100,
        slowest: 0,
    };
    for pair in args.chunks(2) {
        let [k, v] = pair else { usage() };
        let v: f64 = v.parse().unwrap_or_else(|_| usage());
        match k.as_str() {
            "--port" => o.port = v as u16,
            "--threads" => o.threads = v as usize,
            "--size" => o.size = v as usize,
            "--n" => o.n = v as usize,
            "--secs" => o.secs = v,
            "--rate" => o.rate = v,
            "--probe-every" => o.probe_every = v as usize,
            "--slowest" => o.slowest = v as usize,
            _ => usage(),
        }
    }
    if o.threads == 0
        || o.size == 0
        || o.n == 0
        || o.probe_every == 0
        || o.secs <= 0.0
        || o.rate <= 0.0
    {
        usage();
    }
    o
}

/// The server's side of one connection: request in, echo out, close.
fn serve_one(mut s: TcpStream, size: usize) -> Result<(), String> {
    s.set_read_timeout(Some(IO_TIMEOUT))
        .map_err(|e| format!("set_read_timeout: {e}"))?;
    let mut buf = vec![0u8; size];
    s.read_exact(&mut buf)
        .map_err(|e| format!("server read: {e}"))?;
    s.write_all(&buf).map_err(|e| format!("server write: {e}"))
}

fn server(o: &Opts) {
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, o.port))
        .unwrap_or_else(|e| fail(format!("bind: {e}")));
    println!("listening {}", l.local_addr().unwrap().port());
    std::io::stdout().flush().ok();
    let l = Arc::new(l);
    let workers: Vec<_> = (0..o.threads)
        .map(|_| {
            let l = Arc::clone(&l);
            let size = o.size;
            std::thread::spawn(move || loop {
                match l.accept() {
                    Ok((s, _)) => serve_one(s, size).unwrap_or_else(|e| fail(e)),
                    Err(e) => fail(format!("accept: {e}")),
                }
            })
        })
        .collect();
    for w in workers {
        let _ = w.join();
    }
}

/// Whether this process has a ring mapped right now.
fn ring_mapped() -> bool {
    ringsock_integration::resources::holdings(std::process::id())
        .unwrap_or_else(|| fail("cannot read /proc/self".into()))
        .ring_maps
        > 0
}

/// One short connection carrying `data`, checked; returns its duration
/// and, with `probe`, whether a ring was mapped while it was open.
fn one_conn(port: u16, data: &[u8], got: &mut [u8], what: &str, probe: bool) -> (Duration, bool) {
    let t0 = Instant::now();
    let mut s = TcpStream::connect((Ipv4Addr::LOCALHOST, port))
        .unwrap_or_else(|e| fail(format!("{what}: connect: {e}")));
    s.set_read_timeout(Some(IO_TIMEOUT))
        .unwrap_or_else(|e| fail(format!("{what}: set_read_timeout: {e}")));
    s.write_all(data)
        .unwrap_or_else(|e| fail(format!("{what}: write: {e}")));
    read_response(&mut s, got, what);
    let ring = probe && ring_mapped();
    let mut more = [0u8; 1];
    match s.read(&mut more) {
        Ok(0) => {}
        Ok(_) => fail(format!("{what}: bytes after the response")),
        Err(e) => fail(format!("{what}: read (EOF expected): {e}")),
    }
    drop(s);
    let took = t0.elapsed();
    if got != data {
        let at = got.iter().zip(data).position(|(a, b)| a != b).unwrap_or(0);
        fail(format!("{what}: echo differs at byte {at}"));
    }
    (took, ring)
}

/// Reads the whole response; an early EOF or error fails with how much
/// had arrived and whether this process had a ring mapped (was the lost
/// part on a ring).
fn read_response(s: &mut TcpStream, got: &mut [u8], what: &str) {
    let mut n = 0;
    while n < got.len() {
        match s.read(&mut got[n..]) {
            Ok(0) => fail(format!(
                "{what}: read: EOF after {n} of {} bytes (a ring mapped in this process: {})",
                got.len(),
                ring_mapped()
            )),
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => fail(format!(
                "{what}: read: {e} after {n} of {} bytes (a ring mapped in this process: {})",
                got.len(),
                ring_mapped()
            )),
        }
    }
}

/// The `p`-th percentile (0..=100) of sorted `v`, nearest rank.
fn percentile(v: &[Duration], p: f64) -> f64 {
    let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1].as_secs_f64() * 1e6
}

fn client(o: &Opts) {
    if o.port == 0 {
        usage();
    }
    let mut got = vec![0u8; o.size];
    let mut lat = Vec::with_capacity(o.n);
    let (mut probes, mut on_ring) = (0, 0);
    let t0 = Instant::now();
    for i in 0..o.n {
        let data = payload(o.size, i as u64 + 1);
        let probe = (i + 1) % o.probe_every == 0;
        let (took, ring) = one_conn(o.port, &data, &mut got, &format!("conn {i}"), probe);
        if probe {
            probes += 1;
            on_ring += usize::from(ring);
        } else {
            lat.push((took, i));
        }
    }
    if lat.is_empty() {
        fail("every connection was a probe: raise --n or --probe-every".into());
    }
    let wall = t0.elapsed().as_secs_f64();
    let mean = lat.iter().map(|l| l.0).sum::<Duration>().as_secs_f64() * 1e6 / lat.len() as f64;
    lat.sort_unstable();
    let slowest: Vec<String> = lat
        .iter()
        .rev()
        .take(o.slowest)
        .map(|(d, i)| format!("[{i},{:.1}]", d.as_secs_f64() * 1e6))
        .collect();
    let slowest = if o.slowest > 0 {
        format!(",\"slowest\":[{}]", slowest.join(","))
    } else {
        String::new()
    };
    let times: Vec<Duration> = lat.iter().map(|l| l.0).collect();
    println!(
        "{{\"n\":{},\"p50_us\":{:.1},\"p99_us\":{:.1},\"mean_us\":{mean:.1},\"conns_per_s\":{:.1},\
         \"probes\":{probes},\"probes_on_ring\":{on_ring}{slowest}}}",
        o.n,
        percentile(&times, 50.0),
        percentile(&times, 99.0),
        o.n as f64 / wall
    );
}

fn churn(o: &Opts) {
    if o.port == 0 {
        usage();
    }
    let done = Arc::new(AtomicU64::new(0));
    let t0 = Instant::now();
    let end = t0 + Duration::from_secs_f64(o.secs);
    // Each thread's share of the rate: one connection every `gap`.
    let gap = Duration::from_secs_f64(o.threads as f64 / o.rate);
    let workers: Vec<_> = (0..o.threads)
        .map(|t| {
            let done = Arc::clone(&done);
            let (port, size) = (o.port, o.size);
            std::thread::spawn(move || {
                let mut got = vec![0u8; size];
                let mut next = Instant::now();
                let mut i = 0u64;
                while Instant::now() < end {
                    let now = Instant::now();
                    if next > now {
                        std::thread::sleep(next - now);
                    }
                    next = next.max(now) + gap;
                    let seed = (t as u64) << 40 | i;
                    let data = payload(size, seed + 1);
                    one_conn(
                        port,
                        &data,
                        &mut got,
                        &format!("thread {t} conn {i}"),
                        false,
                    );
                    done.fetch_add(1, Ordering::Relaxed);
                    i += 1;
                }
            })
        })
        .collect();
    for w in workers {
        if w.join().is_err() {
            fail("a churn thread panicked".into());
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    let n = done.load(Ordering::Relaxed);
    println!(
        "{{\"conns\":{n},\"secs\":{secs:.3},\"rate\":{:.1},\"target\":{:.1}}}",
        n as f64 / secs,
        o.rate
    );
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(role) = args.first() else { usage() };
    let o = parse(&args[1..]);
    match role.as_str() {
        "server" => server(&o),
        "client" => client(&o),
        "churn" => churn(&o),
        _ => usage(),
    }
}
