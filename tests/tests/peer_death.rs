//! Peer death: one end of a shared-memory ring connection is killed with
//! SIGKILL and the other end must notice within a bounded time (read
//! returns 0 or ECONNRESET, send fails with EPIPE or ECONNRESET), never
//! hang or crash, and give back what the connection held (descriptors,
//! ring memfds and mappings back to what it had before the connection).
//!
//! The ends are `faultpeer` (tests/src/bin/faultpeer.rs): a streaming
//! writer and a checking reader (every byte received is checked against
//! the seeded stream, so what arrived before the death is a correct prefix
//! of it), idle ends blocked in read, poll or epoll_wait, and a writer
//! blocked in send on a full ring whose reader never reads. Then
//! redis-benchmark -P 16 against redis-server, each killed in turn.
//! Every connection is seen on a shm ring (ctl status) before the kill.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use ringsock_integration::resources::{holdings, Holdings};
use ringsock_integration::{
    assert_all_shm, free_port, links, payload, require, show, wait_port, Conn, Ctl, Server, TempDir,
};

const BIN: &str = env!("CARGO_BIN_EXE_faultpeer");
/// How long the survivor may take to notice a dead peer.
const NOTICE: Duration = Duration::from_secs(5);

fn sigkill(p: &mut Server) {
    // SAFETY: signalling our own child by pid.
    unsafe { libc::kill(p.pid() as libc::pid_t, libc::SIGKILL) };
    assert!(
        p.wait(Duration::from_secs(5)).is_some(),
        "{} survived SIGKILL",
        p.label()
    );
}

/// What `pid` holds once no ring is mapped any more and its descriptors
/// stopped changing (a closed ring is let go a few ms after close, when
/// the shim's background thread has reported it).
fn settled(pid: u32) -> Holdings {
    let end = Instant::now() + Duration::from_secs(5);
    let mut last = holdings(pid).expect("process alive");
    loop {
        std::thread::sleep(Duration::from_millis(50));
        let now = holdings(pid).expect("process alive");
        if now.ring_maps == 0 && now.ring_fds == 0 && now.fds == last.fds {
            return now;
        }
        assert!(
            Instant::now() < end,
            "pid {pid} never settled: {last:?} then {now:?}"
        );
        last = now;
    }
}

/// Waits (bounded) until `pid` holds what it held at `base` again.
fn assert_released(what: &str, pid: u32, base: Holdings) {
    let end = Instant::now() + NOTICE;
    loop {
        let now = holdings(pid).unwrap_or_else(|| panic!("{what}: the survivor died"));
        if (now.fds, now.ring_fds, now.ring_maps) == (base.fds, base.ring_fds, base.ring_maps) {
            println!("{what}: released: {now:?} (before the connection: {base:?})");
            return;
        }
        assert!(
            Instant::now() < end,
            "{what}: the survivor still holds {now:?} {NOTICE:?} after closing; before the connection: {base:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The `KEY=VALUE` word of a line.
fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
}

/// The last `PREFIX N` progress line's N (0 if none yet).
fn last_count(p: &Server, prefix: &str) -> u64 {
    p.output()
        .0
        .lines()
        .filter_map(|l| l.strip_prefix(prefix)?.trim().parse().ok())
        .next_back()
        .unwrap_or(0)
}

fn fnv_of_stream(len: u64, seed: u64) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in payload(len as usize, seed) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    format!("{h:016x}")
}

/// A faultpeer server and client on one shm connection, both warmed up,
/// with each end's holdings from before the connection.
struct Pair {
    ctl: Ctl,
    server: Server,
    client: Server,
    port: u16,
    base_server: Holdings,
    base_client: Holdings,
    _dir: TempDir,
}

fn pair(server: &[&str], client: &[&str]) -> Pair {
    let ctl = Ctl::start();
    let dir = TempDir::new("faultpeer");
    let go: PathBuf = dir.path().join("go");
    let mut srv = ctl
        .shimmed(BIN)
        .arg("server")
        .args(server)
        .arg("--warmup")
        .spawn();
    let line = srv.wait_line("listening ", Duration::from_secs(20));
    let port: u16 = line["listening ".len()..].trim().parse().unwrap();
    let mut cli = ctl
        .shimmed(BIN)
        .arg("client")
        .args(["--port", &port.to_string(), "--warmup", "--go"])
        .arg(&go)
        .args(client)
        .spawn();
    srv.wait_line("baseline", Duration::from_secs(20));
    cli.wait_line("baseline", Duration::from_secs(20));
    let base_server = settled(srv.pid());
    let base_client = settled(cli.pid());
    std::fs::write(&go, b"").unwrap();
    srv.wait_line("accepted", Duration::from_secs(10));
    cli.wait_line("connected", Duration::from_secs(10));
    // The connection is on a ring, both ends say so.
    let cpid = cli.pid();
    let mine = |s: &[Conn]| {
        links(s, port)
            .into_iter()
            .filter(|l| l.client.pid == cpid)
            .collect::<Vec<_>>()
    };
    let sample = ctl
        .wait_for(Duration::from_secs(15), |s| !mine(s).is_empty())
        .unwrap_or_else(|| {
            panic!(
                "the connection was never reported by both ends:\n{}",
                show(&ctl.status())
            )
        });
    assert_all_shm("faultpeer", &sample, port, 1);
    println!("on the ring: {}", mine(&sample)[0]);
    Pair {
        ctl,
        server: srv,
        client: cli,
        port,
        base_server,
        base_client,
        _dir: dir,
    }
}

#[derive(Clone, Copy)]
enum Victim {
    Server,
    Client,
}

impl Pair {
    /// Kills one end; returns the survivor's `end ...` line and how long
    /// it took to appear. Checks that the survivor closed and let go of
    /// the connection's descriptors and ring.
    fn kill(&mut self, victim: Victim, what: &str) -> (String, Duration) {
        let (dead, alive, base) = match victim {
            Victim::Server => (&mut self.server, &mut self.client, self.base_client),
            Victim::Client => (&mut self.client, &mut self.server, self.base_server),
        };
        let (o, _) = alive.output();
        assert!(
            !o.contains("\nend "),
            "{what}: the survivor saw the end before the kill:\n{o}"
        );
        let t = Instant::now();
        sigkill(dead);
        let line = alive.wait_line("end ", NOTICE);
        let took = t.elapsed();
        alive.wait_line("closed", NOTICE);
        alive.assert_running();
        println!("{what}: survivor `{line}` {took:?} after the kill");
        assert_released(what, alive.pid(), base);
        // The dead end's reports are gone from status, and so is the
        // survivor's closed end.
        let port = self.port;
        let gone = self.ctl.wait_for(NOTICE, |s| {
            !s.iter()
                .any(|c| c.peer.port() == port || c.local.port() == port)
        });
        assert!(
            gone.is_some(),
            "{what}: status still lists the connection:\n{}",
            show(&self.ctl.status())
        );
        let (o, e) = alive.output();
        assert!(!o.contains("FAIL"), "{what}: survivor:\n{o}{e}");
        (line, took)
    }
}

fn assert_eof_or_reset(what: &str, line: &str) {
    assert!(
        line.starts_with("end eof") || line.starts_with("end err=ECONNRESET"),
        "{what}: expected EOF or ECONNRESET, got `{line}`"
    );
}

fn assert_write_error(what: &str, line: &str) {
    assert!(
        line.starts_with("end err=EPIPE") || line.starts_with("end err=ECONNRESET"),
        "{what}: expected EPIPE or ECONNRESET from send, got `{line}`"
    );
}

/// Waits until the `prefix` progress of `p` reaches `n` bytes.
fn wait_count(p: &mut Server, prefix: &str, n: u64) -> u64 {
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        p.assert_running();
        let c = last_count(p, prefix);
        if c >= n {
            return c;
        }
        assert!(
            Instant::now() < end,
            "{}: `{prefix}` stuck at {c}:\n{:?}",
            p.label(),
            p.output()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

const SEED: u64 = 0x5eed_0001;

#[test]
fn writer_killed_mid_stream_reader_gets_the_prefix_then_eof() {
    let seed = SEED.to_string();
    // Paced (64 KiB per 100 us at most) so the test can recompute the hash
    // of what arrived in a moment.
    let mut p = pair(
        &["--act", "read", "--seed", &seed],
        &["--act", "write", "--seed", &seed, "--pace-us", "100"],
    );
    wait_count(&mut p.server, "recv", 4 << 20);
    // Bytes a writer's send() accepted are in the shared ring (flushed
    // within about 1 ms by the shim's timer): what the writer had sent a
    // moment before it died must all arrive.
    let sent = last_count(&p.client, "sent");
    std::thread::sleep(Duration::from_millis(50));
    let (line, _) = p.kill(Victim::Client, "writer killed");
    assert_eof_or_reset("writer killed", &line);
    let recv: u64 = field(&line, "recv").unwrap().parse().unwrap();
    assert!(
        recv >= sent,
        "the writer had sent {sent} B 50 ms before its death, the reader got {recv} B"
    );
    assert_eq!(
        field(&line, "hash").unwrap(),
        fnv_of_stream(recv, SEED),
        "the {recv} bytes received are not the stream's prefix"
    );
}

#[test]
fn reader_killed_mid_stream_writer_gets_epipe() {
    let seed = SEED.to_string();
    let mut p = pair(
        &["--act", "write", "--seed", &seed],
        &["--act", "read", "--seed", &seed],
    );
    wait_count(&mut p.client, "recv", 16 << 20);
    let (line, _) = p.kill(Victim::Client, "reader killed");
    assert_write_error("reader killed", &line);
    let (o, e) = p.client.output();
    assert!(!o.contains("FAIL"), "the reader saw a wrong byte:\n{o}{e}");
}

/// Idle connections (nothing ever sent): the survivor sleeps in `wait`
/// and must wake with EOF when the other end dies; both directions.
fn idle(wait: &str) {
    for victim in [Victim::Client, Victim::Server] {
        let what = format!(
            "idle, {} killed, survivor in {wait}",
            match victim {
                Victim::Client => "client",
                Victim::Server => "server",
            }
        );
        let args = ["--act", "idle", "--wait", wait];
        let mut p = pair(&args, &args);
        // Let both ends settle into their sleep (past the spin budget).
        std::thread::sleep(Duration::from_millis(200));
        let (line, _) = p.kill(victim, &what);
        assert_eof_or_reset(&what, &line);
        if wait != "read" {
            let alive = match victim {
                Victim::Client => &p.server,
                Victim::Server => &p.client,
            };
            assert!(
                alive.output().0.contains("woke "),
                "{what}: {:?}",
                alive.output()
            );
        }
    }
}

#[test]
fn idle_peer_killed_wakes_blocked_read() {
    idle("read");
}

#[test]
fn idle_peer_killed_wakes_poll() {
    idle("poll");
}

#[test]
fn idle_peer_killed_wakes_epoll_wait() {
    idle("epoll");
}

/// State of `pid`'s main thread (R, S, D, ...).
fn thread_state(pid: u32) -> char {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/stat")).unwrap_or_default();
    stat.rsplit(')')
        .next()
        .and_then(|s| s.trim_start().chars().next())
        .unwrap_or('?')
}

#[test]
fn reader_killed_while_writer_blocks_on_full_ring() {
    let mut p = pair(&["--act", "write"], &["--act", "sink"]);
    // The reader never reads: the writer fills the ring and blocks in
    // send. Wait until its main thread has been asleep for a while.
    let pid = p.server.pid();
    let end = Instant::now() + Duration::from_secs(10);
    let mut asleep = 0;
    while asleep < 20 {
        p.server.assert_running();
        asleep = if thread_state(pid) == 'S' {
            asleep + 1
        } else {
            0
        };
        assert!(Instant::now() < end, "the writer never blocked");
        std::thread::sleep(Duration::from_millis(25));
    }
    let syscall =
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/syscall")).unwrap_or_default();
    println!("writer blocked (syscall {})", syscall.trim());
    let (line, _) = p.kill(Victim::Client, "full ring, reader killed");
    assert_write_error("full ring, reader killed", &line);
    let sent: u64 = field(&line, "sent").unwrap().parse().unwrap();
    // The default ring holds 4096 slots of 256 B: it was full.
    assert!(
        sent >= 512 << 10,
        "only {sent} B sent: the writer was not blocked on a full ring"
    );
}

/// redis-server under the shim on a fresh port, warmed up by one shimmed
/// redis-cli (so its lazily created shim state exists), and the helper
/// running shimmed redis-cli commands.
struct Redis {
    ctl: Ctl,
    server: Server,
    port: String,
    _dir: TempDir,
}

impl Redis {
    fn start() -> Redis {
        let ctl = Ctl::start();
        let dir = TempDir::new("redis");
        let port = free_port().to_string();
        let mut server = ctl
            .shimmed("redis-server")
            .args(["--port", &port, "--bind", "127.0.0.1", "--save", ""])
            .args(["--appendonly", "no"])
            .arg("--dir")
            .arg(dir.path())
            .spawn();
        wait_port(&mut server, port.parse().unwrap(), Duration::from_secs(10));
        let r = Redis {
            ctl,
            server,
            port,
            _dir: dir,
        };
        assert_eq!(r.cli(&["PING"]), "PONG");
        r
    }

    fn port(&self) -> u16 {
        self.port.parse().unwrap()
    }

    fn cli(&self, args: &[&str]) -> String {
        let (o, _) = self
            .ctl
            .shimmed("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &self.port])
            .args(args)
            .run_ok(Duration::from_secs(10));
        o.trim_end().to_string()
    }

    /// A pipelined benchmark that would run for minutes, once its
    /// connections are on rings; returns it and its local ports.
    fn benchmark(&self) -> (Server, Vec<u16>) {
        let mut bench = self
            .ctl
            .shimmed("redis-benchmark")
            .args(["-h", "127.0.0.1", "-p", &self.port])
            .args(["-P", "16", "-c", "4", "-n", "100000000", "-t", "set"])
            .spawn();
        let (port, pid) = (self.port(), bench.pid());
        let mut last = Vec::new();
        let got = self.ctl.wait_for(Duration::from_secs(10), |s| {
            last = s.to_vec();
            links(s, port)
                .iter()
                .filter(|l| l.client.pid == pid)
                .count()
                >= 4
        });
        bench.assert_running();
        let s = got.unwrap_or_else(|| {
            panic!(
                "redis-benchmark's 4 connections never showed up:\n{}",
                show(&last)
            )
        });
        let mine: Vec<_> = links(&s, port)
            .into_iter()
            .filter(|l| l.client.pid == pid)
            .collect();
        for l in &mine {
            assert!(l.is_shm(), "not on a ring: {l}");
        }
        // Let it pipeline for a moment.
        std::thread::sleep(Duration::from_millis(300));
        bench.assert_running();
        (bench, mine.iter().map(|l| l.client.local.port()).collect())
    }
}

#[test]
fn redis_benchmark_killed_server_keeps_serving() {
    require!("redis-server", "redis-benchmark", "redis-cli");
    let r = Redis::start();
    let spid = r.server.pid();
    let base = settled(spid);
    let (mut bench, ports) = r.benchmark();
    let bpid = bench.pid();
    sigkill(&mut bench);
    // Both ends of the dead client's connections leave status: the
    // benchmark's reports with its session, redis' when it closes them.
    let port = r.port();
    let ours =
        |c: &Conn| c.pid == bpid || (c.local.port() == port && ports.contains(&c.peer.port()));
    let gone = r.ctl.wait_for(NOTICE, |s| !s.iter().any(ours));
    assert!(
        gone.is_some(),
        "the dead benchmark's connections are still listed {NOTICE:?} later:\n{}",
        show(&r.ctl.status())
    );
    assert_released("redis-server after redis-benchmark's death", spid, base);

    // redis-server still serves, over a ring.
    let mut incr = r
        .ctl
        .shimmed("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &r.port])
        .args(["-r", "10", "-i", "0.05", "INCR", "faults:counter"])
        .spawn();
    let w = r.ctl.watch(&mut incr, Duration::from_secs(20));
    w.assert_ok("redis-cli -r 10");
    let want: Vec<String> = (1..=10).map(|i| i.to_string()).collect();
    assert_eq!(w.stdout.lines().collect::<Vec<_>>(), want, "INCR replies");
    assert_all_shm("redis-cli after the kill", &w.conns, port, 1);
    let big = "x".repeat(100_000);
    assert_eq!(r.cli(&["SET", "faults:big", &big]), "OK");
    assert_eq!(r.cli(&["GET", "faults:big"]), big);
    let mut server = r.server;
    server.assert_running();
}

#[test]
fn redis_server_killed_benchmark_exits() {
    require!("redis-server", "redis-benchmark", "redis-cli");
    let mut r = Redis::start();
    let (mut bench, _) = r.benchmark();
    let t = Instant::now();
    sigkill(&mut r.server);
    let status = bench.wait(Duration::from_secs(10));
    let (o, e) = bench.output();
    let tail: String = o
        .chars()
        .rev()
        .take(600)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    assert!(
        status.is_some(),
        "redis-benchmark still runs 10 s after redis-server died:\n{tail}\n{e}"
    );
    println!(
        "redis-benchmark exited ({:?}) {:?} after redis-server's death: {}",
        status.unwrap(),
        t.elapsed(),
        e.trim()
    );
    assert!(
        !status.unwrap().success(),
        "redis-benchmark reported success with its server dead:\n{tail}\n{e}"
    );
}
