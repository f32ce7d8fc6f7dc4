//! `ringsock-ctl metrics` and the daemon's HTTP endpoint end to end: shimmed
//! connections on shm rings show in the counts exactly as `status` shows
//! them, the text parses as the exposition format, the HTTP answer is the
//! same text, and clients that send nothing, garbage or too much neither
//! stall the daemon nor the next scrape.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use ringsock_integration::ctl::status_at;
use ringsock_integration::prom::{parse, Exposition};
use ringsock_integration::{ctl_bin, free_port, Cmd, Server, TempDir};

const CONNLOOP: &str = env!("CARGO_BIN_EXE_connloop");
const CONNS: usize = 3;
const BYTES: usize = 20_000;

fn cli_metrics(sock: &Path) -> String {
    let out = Command::new(ctl_bin())
        .args(["metrics", "--socket"])
        .arg(sock)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "metrics: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// One HTTP exchange: `request` sent as is; (status code, body).
fn http(addr: SocketAddr, request: &[u8]) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(request).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").expect("a response head");
    let code = head.split(' ').nth(1).unwrap().parse().unwrap();
    if code == 200 {
        assert!(
            head.contains("Content-Type: text/plain; version=0.0.4"),
            "{head}"
        );
    }
    (code, body.to_owned())
}

fn scrape(addr: SocketAddr) -> String {
    let (code, body) = http(addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(code, 200, "{body}");
    body
}

/// Waits (bounded) until `f` holds, returning its last value.
fn until<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

struct Daemon {
    _dir: TempDir,
    sock: std::path::PathBuf,
    http: SocketAddr,
    proc: Server,
}

fn start() -> Daemon {
    let dir = TempDir::new("metrics");
    let sock = dir.path().join("ctl.sock");
    let http: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let mut proc = Cmd::plain(ctl_bin().to_str().unwrap())
        .arg("daemon")
        .arg("--socket")
        .arg(&sock)
        .args(["--foreground", "--peer-port", "0", "--metrics-listen"])
        .arg(http.to_string())
        .spawn();
    until("the daemon", || {
        proc.assert_running();
        status_at(&sock).ok()
    });
    Daemon {
        _dir: dir,
        sock,
        http,
        proc,
    }
}

fn counts(e: &Exposition, t: &str) -> usize {
    e.get(&format!("ringsock_connection_ends{{transport=\"{t}\"}}")) as usize
}

#[test]
fn metrics_match_status_and_http_serves_the_same_text() {
    let mut d = start();
    let mut srv = Cmd::shimmed(CONNLOOP)
        .env("RINGSOCK_CTL_SOCK", &d.sock)
        .arg("echo-server")
        .spawn();
    let port = srv.wait_line("listening ", Duration::from_secs(20))[10..]
        .trim()
        .to_owned();
    let mut cli = Cmd::shimmed(CONNLOOP)
        .env("RINGSOCK_CTL_SOCK", &d.sock)
        .args(["client", "--port", &port])
        .args(["--conns", &CONNS.to_string(), "--bytes", &BYTES.to_string()])
        .args(["--hold-ms", "4000"])
        .spawn();

    // While the connections are held: the same ends in status and metrics
    // (a status, then metrics, then the same status again).
    let live = until("every connection on shm, seen alike", || {
        let before = status_at(&d.sock).ok()?;
        let m = parse(&cli_metrics(&d.sock)).unwrap();
        let after = status_at(&d.sock).ok()?;
        let shm = before.iter().filter(|c| c.is_shm()).count();
        let same =
            before.len() == after.len() && shm == after.iter().filter(|c| c.is_shm()).count();
        (same
            && shm == 2 * CONNS
            && counts(&m, "shm") == shm
            && counts(&m, "tcp") == before.len() - shm
            && counts(&m, "rdma") == 0)
            .then_some(m)
    });
    // Two processes (the CLI asking is not counted).
    assert_eq!(live.get("ringsock_sessions"), 2.0);
    assert!(live.get("ringsock_ring_setups_total{transport=\"shm\"}") >= (2 * CONNS) as f64);
    assert!(live.get("ringsock_offers_made_total") >= CONNS as f64);
    assert!(live.get("ringsock_offers_claimed_total") >= CONNS as f64);
    let answered = live.get("ringsock_offers_answered_total");
    assert!(answered >= CONNS as f64);
    assert_eq!(live.get("ringsock_setup_latency_seconds_count"), answered);
    assert!(live.get("ringsock_setup_latency_seconds_bucket{le=\"1\"}") <= answered);
    assert!(live.get("ringsock_ring_bytes_total{transport=\"shm\"}") > 0.0);

    cli.wait_ok(Duration::from_secs(60));
    // Quiet again: the client's ends are gone (the server's go with its
    // EOF), and the text no longer changes, so both ways give the same.
    let quiet = until("the client's ends to close", || {
        let st = status_at(&d.sock).ok()?;
        st.is_empty().then(|| cli_metrics(&d.sock))
    });
    let m = parse(&quiet).unwrap();
    assert_eq!(m.get("ringsock_sessions"), 1.0, "{quiet}");
    // Each connection carried BYTES each way twice; a ring's bytes count
    // once although both its ends were on this host.
    let bytes = m.get("ringsock_ring_bytes_total{transport=\"shm\"}") as usize;
    assert!(
        bytes > 2 * BYTES * CONNS && bytes <= 4 * BYTES * CONNS,
        "ring bytes {bytes}\n{quiet}"
    );
    assert_eq!(m.get("ringsock_fallbacks_total"), 0.0);
    until("the same text over HTTP", || {
        (scrape(d.http) == cli_metrics(&d.sock)).then_some(())
    });

    srv.stop();
    let (code, body) = http(d.http, b"GET / HTTP/1.1\r\n\r\n");
    assert_eq!(code, 404, "{body}");
    d.proc.assert_running();
}

#[test]
fn hostile_http_clients_stall_nothing() {
    let mut d = start();
    // Connects and sends nothing: the control socket still answers at
    // once, and the next scrape is answered once its deadline passed.
    let silent = TcpStream::connect(d.http).unwrap();
    status_at(&d.sock).expect("status while an HTTP client is silent");
    assert!(parse(&cli_metrics(&d.sock)).is_ok());
    let text = scrape(d.http);
    parse(&text).unwrap();
    drop(silent);
    // Garbage, a head that never ends, and another method.
    let (code, _) = http(d.http, b"\x16\x03\x01\x02\x00garbage\r\n\r\n");
    assert_eq!(code, 400);
    // Exactly the bound, so the daemon reads all of it before answering.
    let mut long = b"GET /metrics HTTP/1.1\r\nX: ".to_vec();
    long.resize(8192, b'a');
    let (code, _) = http(d.http, &long);
    assert_eq!(code, 431);
    let (code, _) = http(d.http, b"POST /metrics HTTP/1.1\r\n\r\n");
    assert_eq!(code, 405);
    // Closes half-way through its head.
    {
        let mut s = TcpStream::connect(d.http).unwrap();
        s.write_all(b"GET /met").unwrap();
    }
    parse(&scrape(d.http)).unwrap();
    d.proc.assert_running();
}
