//! Load: many connections at once, many connections in a row, several
//! threads on one socket, and a writer held up for seconds by a slow
//! reader, all under the shim with a daemon. Every test checks the data
//! (checksums, replies, readback), that the connections were on rings, and
//! that nothing is left behind (ring descriptors and mappings back to
//! their baseline in the server and on the machine, bounded RSS).
//!
//! Helpers: `connloop redis` (short connections, each reply checked) and
//! `sharedsock` (framed records from several threads; the slow reader).

use std::time::{Duration, Instant};

use ringsock_integration::nginx;
use ringsock_integration::resources::{self, Holdings};
use ringsock_integration::{
    assert_all_shm, assert_shim_silent, free_port, links, payload, require, sha256, show,
    wait_port, Ctl, Server, TempDir,
};

const CONNLOOP: &str = env!("CARGO_BIN_EXE_connloop");
/// How long the shims here wait for a daemon reply. These tests make the
/// daemon answer thousands of requests on 2 shared cores, next to another
/// test; a reply later than the default budget would end the session
/// (correctly: connections go on over TCP) and the test would then see
/// TCP where it checks rings.
const LOADED_DAEMON_MS: &str = "5000";
const SHAREDSOCK: &str = env!("CARGO_BIN_EXE_sharedsock");

use ringsock_integration::{out_field as field, out_num as num};

/// Polls `pid`'s holdings until `ok` accepts them or `timeout` passes;
/// returns the last reading.
fn settle(pid: u32, timeout: Duration, ok: impl Fn(&Holdings) -> bool) -> Holdings {
    let end = Instant::now() + timeout;
    loop {
        let h = resources::holdings(pid).unwrap_or_else(|| panic!("pid {pid} is gone"));
        if ok(&h) || Instant::now() >= end {
            return h;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Ring descriptors and mappings on the machine back to `base` (or below:
/// other tests' rings may have gone meanwhile), within `timeout`. Rings
/// held by processes of other test runs that started meanwhile are
/// printed, not counted against us: only processes this test started
/// (`ours`, and the daemon, which keeps a copy of every reported ring)
/// must be back to nothing.
fn assert_machine_rings_back(base: (usize, usize), ours: &[u32], timeout: Duration) {
    let end = Instant::now() + timeout;
    loop {
        let now = resources::rings_on_machine();
        let held: Vec<(u32, Holdings)> = ours
            .iter()
            .filter_map(|&p| resources::holdings(p).map(|h| (p, h)))
            .filter(|(_, h)| h.ring_fds > 0 || h.ring_maps > 0)
            .collect();
        if now.0 <= base.0 && now.1 <= base.1 {
            println!("rings on the machine: {now:?}, baseline {base:?}");
            return;
        }
        if Instant::now() >= end {
            assert!(
                held.is_empty(),
                "rings still held by this test's processes: {held:?} (machine {now:?}, baseline {base:?})"
            );
            println!(
                "rings on the machine {now:?} above the baseline {base:?}, none of them ours (other tests run meanwhile)"
            );
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The two heavy tests take turns: each makes the daemon answer thousands
/// of requests, and side by side on 2 cores they measured each other's
/// scheduling more than the shim (1,000 connections not all accepted
/// within the claim wait, or not served within the run).
static HEAVY: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn heavy_turn() -> std::sync::MutexGuard<'static, ()> {
    HEAVY.lock().unwrap_or_else(|p| p.into_inner())
}

#[test]
fn nginx_1000_concurrent_connections() {
    let _turn = heavy_turn();
    nginx_1000();
}

/// 1,000 connections at once from wrk (2 threads, 5 s) to one nginx
/// worker, every response body checked by a wrk script; all on rings.
/// Afterwards the worker and the machine must be back to their ring and
/// descriptor baselines: every connection ends when wrk exits, and the
/// worker must notice each end (a lost notice keeps the connection, its
/// ring and its status entry forever).
fn nginx_1000() {
    require!("nginx", "wrk", "curl");
    const CONNS: usize = 1000;
    let ctl = Ctl::start();
    let prefix = TempDir::new("nginx-load");
    let body = payload(16 << 10, 21);
    let file = prefix.write("html/f.bin", &body);
    let script = ringsock_integration::script("wrk_check.lua");
    let port = free_port();
    let p = prefix.path().display();
    // One worker holds every connection; its descriptor limit and
    // connection count leave room for 1,000 rings (4 descriptors each).
    // multi_accept: without it the worker (with or without the shim)
    // serves the connections it has before it accepts more, and a 3 s
    // run ends with a fifth of wrk's connections still in the backlog.
    let conf = nginx::conf(
        prefix.path(),
        "worker_processes 1; worker_rlimit_nofile 16384;",
        "worker_connections 4096; multi_accept on;",
        &format!(
            "keepalive_requests 1000000; sendfile on;\n\
             server {{ listen 127.0.0.1:{port} backlog=4096; root {p}/html; }}"
        ),
    );
    let mut nginx = nginx::args(
        ctl.shimmed("nginx")
            .env("RINGSOCK_CONNECT_TIMEOUT_MS", LOADED_DAEMON_MS),
        prefix.path(),
        &conf,
    )
    .spawn();
    wait_port(&mut nginx, port, Duration::from_secs(10));
    let end = Instant::now() + Duration::from_secs(10);
    let worker = loop {
        if let [w] = resources::children(nginx.pid())[..] {
            break w;
        }
        assert!(Instant::now() < end, "no nginx worker");
        std::thread::sleep(Duration::from_millis(20));
    };

    // One request first, so the worker's one-time descriptors (daemon
    // session, the shim's thread) are part of the baseline.
    let url = format!("http://127.0.0.1:{port}/f.bin");
    let got = prefix.path().join("got.bin");
    let (_, e) = ctl
        .shimmed("curl")
        .args(["-sS", "--fail", "--max-time", "10", "-o"])
        .arg(&got)
        .arg(&url)
        .run_ok(Duration::from_secs(20));
    assert_shim_silent("curl", &e);
    let got = std::fs::read(&got).expect("curl output");
    assert_eq!(sha256::hex(&got), sha256::hex(&body));
    let base = settle(worker, Duration::from_secs(10), |h| {
        h.ring_fds == 0 && h.ring_maps == 0
    });
    let machine = resources::rings_on_machine();
    println!("worker {worker} baseline {base:?}; machine rings {machine:?}");

    // The worker accepts the 1,000 connections one after the other, each
    // with a daemon round trip (debug build, 2 shared cores): the last
    // ones are accepted well over the default 1 s claim wait after their
    // connect, and their clients would give up on the ring (plain TCP,
    // correct, but not what this test is about).
    let mut wrk = ctl
        .shimmed("wrk")
        .env("RINGSOCK_CLAIM_WAIT_MS", "20000")
        .env("RINGSOCK_CONNECT_TIMEOUT_MS", LOADED_DAEMON_MS)
        .args([
            "-c",
            &CONNS.to_string(),
            "-t",
            "2",
            "-d",
            "5s",
            "--timeout",
            "10s",
        ])
        .arg("-s")
        .arg(&script)
        .arg(&url)
        .arg("--")
        .arg(&file)
        .spawn();
    let w = ctl.watch_every(
        &mut wrk,
        Duration::from_secs(90),
        Duration::from_millis(250),
    );
    w.assert_ok("wrk");
    println!("{}", w.stdout);
    assert_shim_silent("wrk", &w.stderr);
    let checked = field(&w.stdout, "checked");
    let (ok, bad): (u64, u64) = (checked[1].parse().unwrap(), checked[3].parse().unwrap());
    assert_eq!(
        bad, 0,
        "responses with a wrong status or body:\n{}",
        w.stdout
    );
    assert!(ok >= CONNS as u64, "only {ok} responses:\n{}", w.stdout);
    assert!(
        !w.stdout.contains("Non-2xx") && !w.stdout.contains("Socket errors"),
        "{}",
        w.stdout
    );
    let l = assert_all_shm("wrk -c 1000", &w.conns, port, CONNS);
    assert!(
        l.iter().all(|l| l.server.pid == worker),
        "a connection not served by the one worker"
    );
    let max_bytes = l
        .iter()
        .map(|l| l.client.stat("s2c_bytes"))
        .max()
        .unwrap_or(0);
    println!(
        "{} connections seen, all on shm rings ({} samples; most bytes one ring carried to wrk: {max_bytes})",
        l.len(),
        w.samples
    );

    // wrk is gone: the worker closes its ends and must be back to its
    // baseline: no ring descriptor, no ring mapping, no descriptor more.
    let after = settle(worker, Duration::from_secs(20), |h| {
        h.ring_fds == base.ring_fds && h.ring_maps == base.ring_maps && h.fds <= base.fds
    });
    println!("worker after wrk: {after:?}");
    assert_eq!(
        (after.ring_fds, after.ring_maps),
        (base.ring_fds, base.ring_maps),
        "ring leak in the nginx worker"
    );
    assert!(
        after.fds <= base.fds,
        "descriptor leak: {after:?} vs {base:?}"
    );
    let mut ours = vec![nginx.pid(), worker];
    ours.extend(ctl.daemon_pid());
    assert_machine_rings_back(machine, &ours, Duration::from_secs(20));
    let status_left = ctl.wait_for(Duration::from_secs(10), |s| links(s, port).is_empty());
    assert!(
        status_left.is_some(),
        "status still lists connections:\n{}",
        show(&ctl.status())
    );

    let (_, _, serr) = nginx.stop();
    assert_shim_silent("nginx", &serr);
    nginx::assert_quiet_log(prefix.path());
}

fn redis_cli(ctl: &Ctl, port: u16, args: &[&str]) -> String {
    let (o, e) = ctl
        .shimmed("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .run_ok(Duration::from_secs(10));
    assert_shim_silent("redis-cli", &e);
    o.trim_end().to_string()
}

#[test]
fn redis_10000_short_connections() {
    let _turn = heavy_turn();
    require!("redis-server", "redis-cli");
    const N: u64 = 10_000;
    let ctl = Ctl::start();
    let dir = TempDir::new("redis-load");
    let port = free_port();
    let mut redis: Server = ctl
        .shimmed("redis-server")
        .env("RINGSOCK_CONNECT_TIMEOUT_MS", LOADED_DAEMON_MS)
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no", "--dir"])
        .arg(dir.path())
        .spawn();
    wait_port(&mut redis, port, Duration::from_secs(10));
    assert_eq!(redis_cli(&ctl, port, &["PING"]), "PONG");
    let base = settle(redis.pid(), Duration::from_secs(10), |h| {
        h.ring_fds == 0 && h.ring_maps == 0
    });
    let machine = resources::rings_on_machine();
    println!("redis-server baseline {base:?}; machine rings {machine:?}");

    // Every 1000th connection stays open 300 ms: status needs both ends'
    // reports (each sent 5 ms after the connection is made) in one of its
    // samples, which 50 ms did not always give on a busy machine. Every
    // connection is offered a ring (RINGSOCK_SHORT_MS=0): this is about
    // ring set-up and teardown; short_conns.rs covers the default.
    let mut client = ctl
        .shimmed(CONNLOOP)
        .env("RINGSOCK_CONNECT_TIMEOUT_MS", LOADED_DAEMON_MS)
        .env("RINGSOCK_SHORT_MS", "0")
        .args(["redis", "--port", &port.to_string(), "--n", &N.to_string()])
        .args(["--hold-every", "1000", "--hold-ms", "300"])
        .spawn();
    let started = Instant::now();
    let w = ctl.watch(&mut client, Duration::from_secs(120));
    w.assert_ok("10,000 short connections");
    println!(
        "{N} connections (SET + GET each) in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert_shim_silent("client", &w.stderr);
    assert_eq!(num(&w.stdout, "ok"), N, "{}", w.stdout);
    assert_eq!(
        num(&w.stdout, "ring_conns"),
        N,
        "connections that had a ring: {}",
        w.stdout
    );
    assert_eq!(num(&w.stdout, "ring_maps_after"), 0, "{}", w.stdout);
    let l = assert_all_shm("held short connections", &w.conns, port, 5);
    println!("{} held connections seen, all on shm rings", l.len());

    // Readback through fresh connections.
    assert_eq!(redis_cli(&ctl, port, &["DBSIZE"]), N.to_string());
    for i in [0u64, 1, 4321, N - 1] {
        let want = format!("value-{i}-{}", "x".repeat((i % 97) as usize));
        assert_eq!(
            redis_cli(&ctl, port, &["GET", &format!("ringsock:short:{i}")]),
            want
        );
    }
    let info = redis_cli(&ctl, port, &["INFO", "stats"]);
    let received: u64 = info
        .lines()
        .find_map(|l| l.strip_prefix("total_connections_received:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{info}"));
    assert!(received > N, "{received} connections received");

    // Nothing left behind in the server: descriptors, rings, memory.
    let after = settle(redis.pid(), Duration::from_secs(10), |h| {
        h.ring_fds == base.ring_fds && h.ring_maps == base.ring_maps && h.fds <= base.fds
    });
    println!("redis-server after: {after:?}");
    assert_eq!(
        (after.ring_fds, after.ring_maps),
        (base.ring_fds, base.ring_maps),
        "ring leak in redis-server"
    );
    assert!(
        after.fds <= base.fds,
        "descriptor leak: {after:?} vs {base:?}"
    );
    assert!(
        after.rss_kib < base.rss_kib + 64 * 1024,
        "redis-server RSS grew from {} to {} KiB",
        base.rss_kib,
        after.rss_kib
    );
    let mut ours = vec![redis.pid()];
    ours.extend(ctl.daemon_pid());
    assert_machine_rings_back(machine, &ours, Duration::from_secs(10));
    let (_, _, serr) = redis.stop();
    assert_shim_silent("redis-server", &serr);
}

/// Starts `sharedsock MODE server ARGS` under the shim; its port.
fn sharedsock_server(ctl: &Ctl, mode: &str, args: &[&str]) -> (Server, u16) {
    let mut s = ctl
        .shimmed(SHAREDSOCK)
        .args([mode, "server"])
        .args(args)
        .spawn();
    let line = s.wait_line("listening ", Duration::from_secs(10));
    (s, line[10..].trim().parse().unwrap())
}

#[test]
fn threads_share_one_socket() {
    // Each side: one reader thread and three writer threads sending
    // framed records in turn (a lock per record), both directions at
    // once, 16 MiB each way.
    let ctl = Ctl::start();
    let args = ["--writers", "3", "--mib", "16"];
    let (mut srv, port) = sharedsock_server(&ctl, "shared", &args);
    let mut cli = ctl
        .shimmed(SHAREDSOCK)
        .args(["shared", "client", "--port", &port.to_string()])
        .args(args)
        .spawn();
    let w = ctl.watch(&mut cli, Duration::from_secs(60));
    w.assert_ok("sharedsock client");
    let (sout, serr) = srv.wait_ok(Duration::from_secs(30));
    assert_shim_silent("client", &w.stderr);
    assert_shim_silent("server", &serr);
    let (c_sent, c_recv) = (field(&w.stdout, "sent"), field(&w.stdout, "recv"));
    let (s_sent, s_recv) = (field(&sout, "sent"), field(&sout, "recv"));
    println!("client sent {c_sent:?} recv {c_recv:?}; server sent {s_sent:?} recv {s_recv:?}");
    assert_eq!(c_sent, s_recv, "client -> server (bytes, hash, records)");
    assert_eq!(s_sent, c_recv, "server -> client (bytes, hash, records)");
    for v in [&c_sent, &s_sent] {
        assert!(v[0].parse::<u64>().unwrap() >= 16 << 20, "{v:?}");
        assert!(v[2].parse::<u64>().unwrap() > 100, "{v:?}");
    }
    let l = assert_all_shm("shared socket", &w.conns, port, 1);
    assert_eq!(l.len(), 1, "one connection");
}

#[test]
fn slow_reader_blocks_the_writer_without_buffering() {
    // The reader sleeps 2 s, then reads 4 KiB at a time; the writer has
    // 64 MiB to send. The ring fills up (EAGAIN with MSG_DONTWAIT, still
    // EAGAIN 200 ms later), the writer blocks, and its memory stays small:
    // nothing buffers the 64 MiB on the way.
    let ctl = Ctl::start();
    let (mut srv, port) =
        sharedsock_server(&ctl, "slow", &["--sleep-ms", "2000", "--chunk", "4096"]);
    let mut cli = ctl
        .shimmed(SHAREDSOCK)
        .args(["slow", "client", "--mib", "64", "--port", &port.to_string()])
        .spawn();
    let w = ctl.watch(&mut cli, Duration::from_secs(60));
    w.assert_ok("slow writer");
    let (sout, serr) = srv.wait_ok(Duration::from_secs(30));
    assert_shim_silent("writer", &w.stderr);
    assert_shim_silent("reader", &serr);
    let out = &w.stdout;
    let full_at = num(out, "eagain_after");
    let peak = num(out, "rss_peak_kib");
    println!("EAGAIN after {full_at} bytes; writer's peak RSS {peak} KiB");
    // One 1 MiB ring (the default geometry) is all the writer may fill.
    assert!(
        full_at > 0 && full_at <= 1 << 20,
        "EAGAIN after {full_at} bytes"
    );
    assert!(out.lines().any(|l| l == "still_full"), "{out}");
    assert_eq!(field(out, "sent"), field(&sout, "recv"), "bytes and hash");
    assert_eq!(num(out, "sent"), 64 << 20);
    assert!(peak < 48 * 1024, "the writer's RSS peaked at {peak} KiB");
    let l = assert_all_shm("slow reader", &w.conns, port, 1);
    println!("{}", l[0]);
}

#[test]
fn tcp_connections_reset_by_the_peer_leave_status() {
    // A shimmed server's plain-TCP connections (the client is not
    // shimmed) are listed by status while open; a peer that resets them
    // (SO_LINGER 0) leaves no address to read back at close
    // (getpeername: ENOTCONN), and the entries must still go.
    require!("python3");
    let ctl = Ctl::start();
    let mut srv = ctl.shimmed(CONNLOOP).arg("echo-server").spawn();
    let line = srv.wait_line("listening ", Duration::from_secs(10));
    let port: u16 = line[10..].trim().parse().unwrap();
    let script = format!(
        "import socket, struct, time\n\
         socks = []\n\
         for i in range(20):\n\
         \x20   s = socket.create_connection(('127.0.0.1', {port}))\n\
         \x20   s.sendall(b'x' * 100)\n\
         \x20   got = b''\n\
         \x20   while len(got) < 100:\n\
         \x20       got += s.recv(100)\n\
         \x20   assert got == b'x' * 100\n\
         \x20   socks.append(s)\n\
         print('open', flush=True)\n\
         time.sleep(0.5)\n\
         for s in socks:\n\
         \x20   s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack('ii', 1, 0))\n\
         \x20   s.close()\n\
         print('reset', flush=True)\n"
    );
    let mut cli = ringsock_integration::Cmd::plain("python3")
        .arg("-c")
        .arg(&script)
        .spawn();
    cli.wait_line("open", Duration::from_secs(20));
    let open = ctl.wait_for(Duration::from_secs(10), |s| {
        s.iter().filter(|c| c.local.port() == port).count() == 20
    });
    assert!(
        open.is_some(),
        "20 server ends expected:\n{}",
        show(&ctl.status())
    );
    cli.wait_ok(Duration::from_secs(20));
    let gone = ctl.wait_for(Duration::from_secs(10), |s| {
        s.iter().all(|c| c.local.port() != port)
    });
    assert!(
        gone.is_some(),
        "closed connections still listed:\n{}",
        show(&ctl.status())
    );
    srv.assert_running();
}
