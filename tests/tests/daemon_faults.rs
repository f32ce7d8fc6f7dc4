//! Control daemon faults: `ringsock-ctl daemon` killed with SIGKILL and
//! restarted on the same socket during a connection storm, and a daemon
//! that only starts after the programs.
//!
//! `faultpeer echo-server` (shimmed) echoes; `faultpeer echo-client --mode
//! storm` opens short connections in a loop, checking each echo and
//! saying whether the connection got a ring (a new ring segment mapped in
//! the client during connect) and when it started connecting; `--mode
//! long` keeps one connection busy with checked echo rounds. Expected (see
//! docs/shim.md, "The shared-memory ring layer"):
//!
//! * connections established before the kill keep carrying correct data;
//! * connections opened while no daemon runs are plain TCP and work;
//! * once a daemon runs again, new connections get rings again (the
//!   server's shim registers its listener with the new daemon within about
//!   a second), seen in ctl status;
//! * no connect takes more than 3 s (the clients fail otherwise) and no
//!   accept() more than 1 s (the server reports it).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use ringsock_integration::{links, show, Conn, Ctl, Server, TempDir};

const BIN: &str = env!("CARGO_BIN_EXE_faultpeer");
/// How long after a daemon (re)start new connections may stay TCP: the
/// listener is registered again within about 1 s, the client's session
/// retries after 1 s.
const BACK_ON_SHM: Duration = Duration::from_secs(10);

fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// One `conn I t=NS ring=R connect_us=C us=T` line of a storm client.
#[derive(Debug)]
struct StormConn {
    t: u64,
    ring: bool,
    connect_us: u64,
}

fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
}

fn storm_conns(p: &Server) -> Vec<StormConn> {
    p.output()
        .0
        .lines()
        .filter(|l| l.starts_with("conn "))
        .map(|l| {
            let num = |k| field(l, k).and_then(|v| v.parse().ok()).unwrap_or(0);
            StormConn {
                t: num("t"),
                ring: num("ring") == 1,
                connect_us: num("connect_us"),
            }
        })
        .collect()
}

/// The last `rounds N` of a long client.
fn rounds(p: &Server) -> u64 {
    p.output()
        .0
        .lines()
        .filter_map(|l| l.strip_prefix("rounds ")?.trim().parse().ok())
        .next_back()
        .unwrap_or(0)
}

/// Polls `cond` on `p` every 10 ms for up to `timeout`; panics with its
/// output (and `what`) if it exits or the time passes.
fn wait_until(
    p: &mut Server,
    what: &str,
    timeout: Duration,
    mut cond: impl FnMut(&Server) -> bool,
) {
    let end = Instant::now() + timeout;
    loop {
        if cond(p) {
            return;
        }
        p.assert_running();
        if Instant::now() >= end {
            let (o, e) = p.output();
            let tail: String = o.lines().rev().take(20).collect::<Vec<_>>().join("\n");
            panic!(
                "{what}: not within {timeout:?}; {} (latest lines first):\n{tail}\n{e}",
                p.label()
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

struct Rig {
    ctl: Ctl,
    server: Server,
    port: u16,
    stop: PathBuf,
    _dir: TempDir,
}

impl Rig {
    fn new(ctl: Ctl) -> Rig {
        let dir = TempDir::new("daemon-faults");
        let mut server = ctl.shimmed(BIN).arg("echo-server").spawn();
        let line = server.wait_line("listening ", Duration::from_secs(20));
        let port = line["listening ".len()..].trim().parse().unwrap();
        Rig {
            ctl,
            server,
            port,
            stop: dir.path().join("stop"),
            _dir: dir,
        }
    }

    /// A client; storm connections stay open `hold_ms` after their echo
    /// (status sees a connection once it lived about 5 ms). Every
    /// connection is offered a ring (RINGSOCK_SHORT_MS=0): the storm is
    /// about ring set-up while the daemon dies.
    fn client(&self, mode: &str, seed: u64, hold_ms: u64) -> Server {
        self.ctl
            .shimmed(BIN)
            .env("RINGSOCK_SHORT_MS", "0")
            .arg("echo-client")
            .args(["--port", &self.port.to_string(), "--mode", mode])
            .args(["--seed", &seed.to_string()])
            .args(["--hold-ms", &hold_ms.to_string()])
            .args(["--bound-ms", "3000", "--stop"])
            .arg(&self.stop)
            .spawn()
    }

    /// A long client's `ring=R` line.
    fn long_ring(p: &mut Server) -> bool {
        let l = p.wait_line("ring=", Duration::from_secs(10));
        l.trim() == "ring=1"
    }

    /// Waits until status shows a connection of `pid` to the server with
    /// both ends on one ring; returns how long that took.
    fn wait_shm_link(&self, pid: u32, timeout: Duration) -> Duration {
        let t = Instant::now();
        let mut last = Vec::new();
        let port = self.port;
        let got = self.ctl.wait_for(timeout, |s: &[Conn]| {
            last = s.to_vec();
            links(s, port)
                .iter()
                .any(|l| l.client.pid == pid && l.is_shm())
        });
        assert!(
            got.is_some(),
            "no shm connection of pid {pid} in status within {timeout:?}; last sample:\n{}\ndaemon log:\n{}",
            show(&last),
            self.ctl.log()
        );
        t.elapsed()
    }

    /// Stops the clients (they finish the connection in hand), checks
    /// they succeeded (every echo was right) and that the server never
    /// took long to accept.
    fn finish(mut self, clients: &mut [&mut Server]) {
        std::fs::write(&self.stop, b"").unwrap();
        for c in clients.iter_mut() {
            let (o, _) = c.wait_ok(Duration::from_secs(15));
            assert!(o.contains("done "), "{o}");
        }
        self.server.assert_running();
        // Every client is gone: so is every end from status, including
        // those the restarted daemon was told of again while connections
        // were closing.
        self.ctl
            .expect(self.port, "ends=0", Duration::from_secs(10));
        let (o, e) = self.server.output();
        assert!(
            !o.contains("slow-accept") && !o.contains("accept-error"),
            "echo-server:\n{o}\n{e}"
        );
    }
}

fn assert_connects_bounded(conns: &[StormConn]) {
    let worst = conns.iter().map(|c| c.connect_us).max().unwrap_or(0);
    println!(
        "{} storm connections, slowest connect {worst} us",
        conns.len()
    );
    assert!(worst < 3_000_000, "a connect took {worst} us");
}

#[test]
fn daemon_killed_and_restarted_during_connection_storm() {
    let mut rig = Rig::new(Ctl::start());

    // Before the fault: everything on rings.
    let mut long1 = rig.client("long", 11, 0);
    assert!(Rig::long_ring(&mut long1), "long connection not on a ring");
    rig.wait_shm_link(long1.pid(), Duration::from_secs(5));
    let mut storm = rig.client("storm", 22, 10);
    wait_until(
        &mut storm,
        "10 storm connections",
        Duration::from_secs(20),
        |p| storm_conns(p).len() >= 10,
    );
    rig.wait_shm_link(storm.pid(), Duration::from_secs(5));
    // A second storm without pauses, so that the kill and the restart land
    // in the middle of handshakes.
    let mut fast = rig.client("storm", 23, 0);
    wait_until(&mut fast, "fast storm", Duration::from_secs(20), |p| {
        storm_conns(p).len() >= 50
    });

    // Kill the daemon. Established rings do not need it.
    let t_kill = mono_ns();
    rig.ctl.kill();
    let t_dead = mono_ns();
    let r = rounds(&long1);
    wait_until(
        &mut long1,
        "long connection after the kill",
        Duration::from_secs(10),
        |p| rounds(p) >= r + 20,
    );
    // New connections while no daemon runs: TCP, and they work.
    let mut long2 = rig.client("long", 33, 0);
    assert!(
        !Rig::long_ring(&mut long2),
        "a connection opened without a daemon got a ring"
    );
    wait_until(
        &mut storm,
        "storm without a daemon",
        Duration::from_secs(20),
        |p| storm_conns(p).iter().filter(|c| c.t > t_dead).count() >= 20,
    );
    wait_until(
        &mut long2,
        "TCP long connection",
        Duration::from_secs(10),
        |p| rounds(p) >= 20,
    );

    // Restart on the same socket: new connections go back to rings.
    let t_restart = mono_ns();
    rig.ctl.restart();
    let t_up = mono_ns();
    let took = rig.wait_shm_link(storm.pid(), BACK_ON_SHM);
    println!("storm connections on rings again {took:?} after the restart");
    wait_until(&mut storm, "storm back on rings", BACK_ON_SHM, |p| {
        storm_conns(p)
            .iter()
            .filter(|c| c.t > t_up && c.ring)
            .count()
            >= 5
    });
    let r = rounds(&long1);
    wait_until(
        &mut long1,
        "long connection after the restart",
        Duration::from_secs(10),
        |p| rounds(p) >= r + 20,
    );
    // The restarted daemon hears again of the connections made before it
    // (each process re-reports its live connections once a new session
    // opens): the ring opened before the kill, with both ends, and the
    // TCP connection opened meanwhile, as TCP.
    rig.wait_shm_link(long1.pid(), Duration::from_secs(10));
    let (l2pid, port) = (long2.pid(), rig.port);
    let tcp_seen = rig.ctl.wait_for(Duration::from_secs(10), |s: &[Conn]| {
        links(s, port)
            .iter()
            .any(|l| l.client.pid == l2pid && l.client.transport == "tcp")
    });
    assert!(
        tcp_seen.is_some(),
        "the TCP connection opened without a daemon is not in status after the restart:\n{}",
        show(&rig.ctl.status())
    );
    for c in rig.ctl.status().iter().filter(|c| c.pid == long2.pid()) {
        assert!(!c.is_shm(), "the connection opened without a daemon: {c}");
    }

    let mut conns = storm_conns(&storm);
    let fast_conns = storm_conns(&fast);
    let (l1, l2) = (long1.pid(), long2.pid());
    rig.finish(&mut [&mut storm, &mut fast, &mut long1, &mut long2]);
    println!(
        "fast storm: {} connections ({} on rings)",
        fast_conns.len(),
        fast_conns.iter().filter(|c| c.ring).count()
    );
    conns.extend(fast_conns);
    // Connections whose connect() returned before the kill (one that
    // started just before it may have lost its daemon mid-handshake: TCP).
    let before: Vec<_> = conns
        .iter()
        .filter(|c| c.t + c.connect_us * 1000 < t_kill)
        .collect();
    let dead: Vec<_> = conns
        .iter()
        .filter(|c| c.t > t_dead && c.t < t_restart)
        .collect();
    let after: Vec<_> = conns.iter().filter(|c| c.t > t_up).collect();
    println!(
        "storm: {} connections before the kill, {} while the daemon was dead, {} after the restart ({} on rings); long clients {l1}, {l2}",
        before.len(),
        dead.len(),
        after.len(),
        after.iter().filter(|c| c.ring).count()
    );
    assert!(
        before.iter().all(|c| c.ring),
        "a connection fell back to TCP before any fault: {before:?}"
    );
    assert!(
        dead.iter().all(|c| !c.ring),
        "a connection got a ring without a daemon: {dead:?}"
    );
    assert_connects_bounded(&conns);
}

#[test]
fn daemon_started_after_the_programs() {
    // The programs start with RINGSOCK_CTL_SOCK naming a path where no
    // daemon runs yet.
    let mut rig = Rig::new(Ctl::absent());
    let mut long = rig.client("long", 44, 0);
    assert!(!Rig::long_ring(&mut long), "a ring without a daemon");
    let mut storm = rig.client("storm", 55, 10);
    wait_until(
        &mut storm,
        "storm without a daemon",
        Duration::from_secs(20),
        |p| storm_conns(p).len() >= 20,
    );
    assert!(
        storm_conns(&storm).iter().all(|c| !c.ring),
        "a ring without a daemon"
    );

    let t_up = {
        rig.ctl.restart();
        mono_ns()
    };
    let took = rig.wait_shm_link(storm.pid(), BACK_ON_SHM);
    println!("storm connections on rings {took:?} after the daemon started");
    wait_until(&mut storm, "storm on rings", BACK_ON_SHM, |p| {
        storm_conns(p)
            .iter()
            .filter(|c| c.t > t_up && c.ring)
            .count()
            >= 5
    });
    // The TCP connection from before keeps working.
    let r = rounds(&long);
    wait_until(
        &mut long,
        "long TCP connection",
        Duration::from_secs(10),
        |p| rounds(p) >= r + 20,
    );
    let conns = storm_conns(&storm);
    rig.finish(&mut [&mut storm, &mut long]);
    assert_connects_bounded(&conns);
}
