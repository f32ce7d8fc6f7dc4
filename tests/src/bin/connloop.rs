//! connloop: many connections, each checked, for load and resource
//! exhaustion tests of the shim.
//!
//! ```text
//! connloop echo-server
//! connloop client --port P [--conns N | --until-emfile] [--bytes B] [--hold-ms H]
//! connloop sockets
//! connloop redis --port P --n N [--hold-every K] [--hold-ms H] [--hold-pings Q]
//! ```
//!
//! * `echo-server` listens on 127.0.0.1:0, prints `listening PORT`, and
//!   echoes every connection (a thread each) until EOF; runs until killed.
//! * `client` opens connections one after the other and keeps them open;
//!   on each it sends B bytes (seeded by the connection's index) and checks
//!   the echo byte for byte. It stops after N connections, or with
//!   `--until-emfile` at the first error, which must be EMFILE from
//!   socket() (anything else fails). Then a second round trip on every held
//!   connection (a later connection must not break an earlier one). Prints
//!   `opened K`, `stopped ERRNO` (0 when N was reached), `ring_maps R` (ring
//!   mappings in this process while all are open: how many got a ring),
//!   holds H ms (for `ringsock-ctl status`), closes everything, prints `ok`.
//! * `sockets` calls socket() until it fails and prints `sockets K errno E`.
//! * `redis` makes N short connections to a redis server: connect, SET a
//!   key unique to the connection, GET it back, close; every reply is
//!   checked. Every K-th connection makes Q more round trips (PING) and
//!   is held H ms before it closes (so status can see it). Prints `ring_conns R` (connections that had a ring
//!   mapped while open), `ring_maps_after R` (ring mappings left once all
//!   are closed) and `ok N`.
//!
//! Any violation prints `FAIL ...` and exits 1.

use std::io::{Read, Seek, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::time::Duration;

use ringsock_integration::payload;

fn fail(msg: String) -> ! {
    eprintln!("FAIL {msg}");
    std::process::exit(1);
}

fn usage() -> ! {
    eprintln!("usage: connloop echo-server | client --port P [--conns N|--until-emfile] [--bytes B] [--hold-ms H] | sockets | redis --port P --n N [--hold-every K] [--hold-ms H] [--hold-pings Q]");
    std::process::exit(64);
}

/// The ring segments mapped in this process right now: the inode of each
/// mapping (a memfd's inode is unique while it exists, so a new ring shows
/// as a new inode even while an old one is still being unmapped).
/// /proc/self/maps is opened once, up front: at the fd limit no new file
/// can be opened.
fn ring_inodes() -> Vec<u64> {
    static MAPS: std::sync::OnceLock<std::sync::Mutex<std::fs::File>> = std::sync::OnceLock::new();
    let f = MAPS.get_or_init(|| {
        std::sync::Mutex::new(
            std::fs::File::open("/proc/self/maps")
                .unwrap_or_else(|e| fail(format!("/proc/self/maps: {e}"))),
        )
    });
    let mut f = f.lock().unwrap();
    let mut text = String::new();
    f.seek(std::io::SeekFrom::Start(0))
        .and_then(|_| f.read_to_string(&mut text))
        .unwrap_or_else(|e| fail(format!("reading /proc/self/maps: {e}")));
    text.lines()
        .filter(|l| ringsock_integration::resources::is_ring(l))
        .filter_map(|l| l.split_whitespace().nth(4)?.parse().ok())
        .collect()
}

/// How many ring segments are mapped in this process right now.
fn ring_maps() -> usize {
    ring_inodes().len()
}

struct Opts {
    port: u16,
    conns: usize,
    until_emfile: bool,
    bytes: usize,
    hold_ms: u64,
    n: usize,
    hold_every: usize,
    hold_pings: usize,
}

fn parse(args: &[String]) -> Opts {
    let mut o = Opts {
        port: 0,
        conns: 1,
        until_emfile: false,
        bytes: 4096,
        hold_ms: 0,
        n: 1,
        hold_every: 0,
        hold_pings: 0,
    };
    let mut i = 0;
    while i < args.len() {
        if args[i] == "--until-emfile" {
            o.until_emfile = true;
            i += 1;
            continue;
        }
        let v: u64 = args
            .get(i + 1)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| usage());
        match args[i].as_str() {
            "--port" => o.port = v as u16,
            "--conns" => o.conns = v as usize,
            "--bytes" => o.bytes = v as usize,
            "--hold-ms" => o.hold_ms = v,
            "--n" => o.n = v as usize,
            "--hold-every" => o.hold_every = v as usize,
            "--hold-pings" => o.hold_pings = v as usize,
            _ => usage(),
        }
        i += 2;
    }
    o
}

fn echo_server() {
    let l =
        TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap_or_else(|e| fail(format!("bind: {e}")));
    println!("listening {}", l.local_addr().unwrap().port());
    loop {
        match l.accept() {
            Ok((mut s, _)) => {
                std::thread::spawn(move || {
                    let mut buf = vec![0u8; 64 * 1024];
                    loop {
                        match s.read(&mut buf) {
                            Ok(0) => return,
                            Ok(n) => {
                                if let Err(e) = s.write_all(&buf[..n]) {
                                    eprintln!("echo write: {e}");
                                    return;
                                }
                            }
                            Err(e) => {
                                eprintln!("echo read: {e}");
                                return;
                            }
                        }
                    }
                });
            }
            // Out of descriptors: the client is what is tested; wait for
            // it to close some.
            Err(e) => {
                eprintln!("accept: {e}");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

/// One verified round trip of `data` on `s`, 64 KiB at a time (the echo
/// cannot hold more than the connection buffers while we write).
fn round_trip(s: &mut TcpStream, data: &[u8], what: &str) {
    let mut got = vec![0u8; 64 * 1024];
    for (i, part) in data.chunks(got.len()).enumerate() {
        s.write_all(part)
            .unwrap_or_else(|e| fail(format!("{what}: write: {e}")));
        let got = &mut got[..part.len()];
        s.read_exact(got)
            .unwrap_or_else(|e| fail(format!("{what}: read: {e}")));
        if got != part {
            let at = got.iter().zip(part).position(|(a, b)| a != b).unwrap_or(0);
            fail(format!(
                "{what}: echo differs at byte {}",
                i * 64 * 1024 + at
            ));
        }
    }
}

fn client(o: &Opts) {
    ring_maps();
    let mut held: Vec<TcpStream> = Vec::new();
    let mut stopped = 0;
    let limit = if o.until_emfile { usize::MAX } else { o.conns };
    while held.len() < limit {
        let i = held.len();
        match TcpStream::connect((Ipv4Addr::LOCALHOST, o.port)) {
            Ok(mut s) => {
                s.set_read_timeout(Some(Duration::from_secs(20))).ok();
                round_trip(
                    &mut s,
                    &payload(o.bytes, i as u64 + 1),
                    &format!("conn {i}"),
                );
                held.push(s);
            }
            Err(e) => {
                let errno = e.raw_os_error().unwrap_or(0);
                if !o.until_emfile || errno != libc::EMFILE {
                    fail(format!("conn {i}: connect: {e} (errno {errno})"));
                }
                stopped = errno;
                break;
            }
        }
    }
    println!("opened {}", held.len());
    println!("stopped {stopped}");
    for (i, s) in held.iter_mut().enumerate() {
        round_trip(
            s,
            &payload(o.bytes, 1_000_000 + i as u64),
            &format!("conn {i} again"),
        );
    }
    println!("ring_maps {}", ring_maps());
    std::thread::sleep(Duration::from_millis(o.hold_ms));
    drop(held);
    println!("ok");
}

fn sockets() {
    let mut n = 0;
    loop {
        // SAFETY: plain socket(2); the descriptors are never closed (the
        // process exits right after).
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0) };
        if fd < 0 {
            let e = std::io::Error::last_os_error();
            println!("sockets {n} errno {}", e.raw_os_error().unwrap_or(0));
            return;
        }
        n += 1;
    }
}

/// Reads one RESP reply line (up to CRLF) from `s`.
fn read_line(s: &mut TcpStream, what: &str) -> Vec<u8> {
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    while !line.ends_with(b"\r\n") {
        match s.read(&mut b) {
            Ok(1) => line.push(b[0]),
            Ok(_) => fail(format!("{what}: EOF after {line:?}")),
            Err(e) => fail(format!("{what}: read: {e}")),
        }
    }
    line.truncate(line.len() - 2);
    line
}

fn redis(o: &Opts) {
    ring_maps();
    let mut rings = 0;
    for i in 0..o.n {
        let what = format!("conn {i}");
        let before = ring_inodes();
        let mut s = TcpStream::connect((Ipv4Addr::LOCALHOST, o.port))
            .unwrap_or_else(|e| fail(format!("{what}: connect: {e}")));
        s.set_read_timeout(Some(Duration::from_secs(20))).ok();
        let key = format!("ringsock:short:{i}");
        let val = format!("value-{i}-{}", "x".repeat(i % 97));
        let set = format!(
            "*3\r\n$3\r\nSET\r\n${}\r\n{key}\r\n${}\r\n{val}\r\n",
            key.len(),
            val.len()
        );
        s.write_all(set.as_bytes())
            .unwrap_or_else(|e| fail(format!("{what}: write: {e}")));
        let r = read_line(&mut s, &what);
        if r != b"+OK" {
            fail(format!(
                "{what}: SET replied {:?}",
                String::from_utf8_lossy(&r)
            ));
        }
        if ring_inodes().iter().any(|i| !before.contains(i)) {
            rings += 1;
        }
        let get = format!("*2\r\n$3\r\nGET\r\n${}\r\n{key}\r\n", key.len());
        s.write_all(get.as_bytes())
            .unwrap_or_else(|e| fail(format!("{what}: write: {e}")));
        let hdr = read_line(&mut s, &what);
        if hdr != format!("${}", val.len()).as_bytes() {
            fail(format!(
                "{what}: GET replied {:?}",
                String::from_utf8_lossy(&hdr)
            ));
        }
        let body = read_line(&mut s, &what);
        if body != val.as_bytes() {
            fail(format!(
                "{what}: GET value {:?}",
                String::from_utf8_lossy(&body)
            ));
        }
        if o.hold_every > 0 && i % o.hold_every == 0 {
            for _ in 0..o.hold_pings {
                s.write_all(b"PING\r\n")
                    .unwrap_or_else(|e| fail(format!("{what}: write: {e}")));
                let r = read_line(&mut s, &what);
                if r != b"+PONG" {
                    fail(format!(
                        "{what}: PING replied {:?}",
                        String::from_utf8_lossy(&r)
                    ));
                }
            }
            std::thread::sleep(Duration::from_millis(o.hold_ms));
        }
    }
    println!("ring_conns {rings}");
    // Every connection is closed: its ring must be unmapped (the shim may
    // finish that on its background thread, so give it a moment).
    let mut left = ring_maps();
    for _ in 0..100 {
        if left == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
        left = ring_maps();
    }
    println!("ring_maps_after {left}");
    println!("ok {}", o.n);
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(role) = args.first() else { usage() };
    let o = parse(&args[1..]);
    match role.as_str() {
        "echo-server" => echo_server(),
        "client" => client(&o),
        "sockets" => sockets(),
        "redis" => redis(&o),
        _ => usage(),
    }
}
