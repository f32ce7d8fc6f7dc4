//! A private `ringsock-ctl daemon` per test, and its `status --json`.
//!
//! `Ctl::start()` runs `ringsock-ctl daemon --socket <tmp>/ctl.sock
//! --foreground` (stopped on drop); `Cmd::shimmed(..).ctl(&ctl)` (or
//! `ctl.shimmed(..)`) points a program's shim at it. `status()` runs
//! `ringsock-ctl status --json` and parses every entry into a `Conn`;
//! `watch()` samples it while a client runs, so tests can assert which
//! transport the connections between two programs used while they were
//! alive (the shim reports a connection a few ms after it is set up and
//! withdraws the report when it closes).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use crate::json;
use crate::proc::{Cmd, Server};
use crate::shim::ctl_bin;
use crate::tmp::TempDir;

/// A `ringsock-ctl daemon` on a private socket, stopped on drop.
pub struct Ctl {
    /// None while no daemon runs (`absent`, after `kill`).
    daemon: Option<Server>,
    sock: PathBuf,
    /// Logs of daemons that were killed, for failure messages.
    old_log: String,
    _dir: TempDir,
}

/// One connection as reported by a shim (one side of it).
#[derive(Debug, Clone, PartialEq)]
pub struct Conn {
    pub pid: u32,
    pub fd: i32,
    pub exe: String,
    pub local: SocketAddr,
    pub peer: SocketAddr,
    /// `shm`, `rdma` or `tcp`.
    pub transport: String,
    /// Why it is TCP (empty for rings).
    pub reason: String,
    /// The ring's id, when it has one.
    pub ring: Option<u64>,
    /// The ring's counters (`c2s_bytes`, `s2c_batches`, `memfd_size`, ...).
    pub stats: BTreeMap<String, u64>,
}

impl Conn {
    pub fn is_shm(&self) -> bool {
        self.transport == "shm"
    }

    /// A ring counter, 0 when absent.
    pub fn stat(&self, name: &str) -> u64 {
        self.stats.get(name).copied().unwrap_or(0)
    }

    /// The process name (last path component of its executable).
    pub fn exe_name(&self) -> &str {
        self.exe.rsplit('/').next().unwrap_or("")
    }
}

impl std::fmt::Display for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "pid {} ({}) fd {} {} -> {} {}",
            self.pid,
            self.exe_name(),
            self.fd,
            self.local,
            self.peer,
            self.transport
        )?;
        if !self.reason.is_empty() {
            write!(f, " ({})", self.reason)?;
        }
        if let Some(id) = self.ring {
            write!(f, " ring #{id}")?;
        }
        Ok(())
    }
}

/// Parses `ringsock-ctl status --json` output.
pub fn parse_status(text: &str) -> Result<Vec<Conn>, String> {
    let v = json::parse(text)?;
    let list = v
        .get("connections")
        .as_array()
        .ok_or("no `connections` array")?;
    list.iter()
        .map(|c| {
            let s = |k: &str| {
                c.get(k)
                    .as_str()
                    .map(str::to_string)
                    .ok_or_else(|| format!("`{k}` missing in {c:?}"))
            };
            let addr = |k: &str| -> Result<SocketAddr, String> {
                s(k)?.parse().map_err(|e| format!("`{k}`: {e}"))
            };
            let ring = c.get("ring");
            let stats = ring
                .get("stats")
                .as_object()
                .map(|m| {
                    m.iter()
                        .filter_map(|(k, v)| Some((k.clone(), v.as_u64()?)))
                        .collect()
                })
                .unwrap_or_default();
            Ok(Conn {
                pid: c.get("pid").as_u64().ok_or("pid")? as u32,
                fd: c.get("fd").as_i64().ok_or("fd")? as i32,
                exe: s("exe")?,
                local: addr("local")?,
                peer: addr("peer")?,
                transport: s("transport")?,
                reason: s("reason")?,
                ring: ring.get("id").as_u64(),
                stats,
            })
        })
        .collect()
}

impl Ctl {
    /// Starts a daemon on a fresh socket and waits until it answers.
    pub fn start() -> Ctl {
        let mut c = Ctl::absent();
        c.restart();
        c
    }

    /// A socket path where no daemon runs yet: programs pointed at it stay
    /// TCP until `restart` starts one there.
    pub fn absent() -> Ctl {
        let dir = TempDir::new("ctl");
        let sock = dir.path().join("ctl.sock");
        Ctl {
            daemon: None,
            sock,
            old_log: String::new(),
            _dir: dir,
        }
    }

    /// Kills the daemon with SIGKILL (no clean-up: its socket file stays,
    /// as after a crash) and reaps it.
    pub fn kill(&mut self) {
        let mut d = self.daemon.take().expect("no daemon to kill");
        // SAFETY: signalling our own child by pid.
        unsafe { libc::kill(d.pid() as libc::pid_t, libc::SIGKILL) };
        d.wait(Duration::from_secs(5));
        let (o, e) = d.output();
        self.old_log
            .push_str(&format!("{o}{e}--- daemon killed ---\n"));
    }

    /// Starts a daemon on this socket path (a first one, or a new one after
    /// `kill`) and waits until it answers.
    pub fn restart(&mut self) {
        assert!(self.daemon.is_none(), "a daemon is already running");
        let sock = &self.sock;
        let mut daemon = Cmd::plain(ctl_bin().to_str().expect("utf-8 path"))
            .arg("daemon")
            .arg("--socket")
            .arg(sock)
            .args(["--foreground", "--log-level", "info"])
            .spawn();
        let end = Instant::now() + Duration::from_secs(10);
        loop {
            daemon.assert_running();
            if sock.exists() && status_at(sock).is_ok() {
                break;
            }
            assert!(
                Instant::now() < end,
                "ringsock-ctl daemon did not answer on {}: {:?}",
                sock.display(),
                daemon.output()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        self.daemon = Some(daemon);
    }

    /// The running daemon's pid (None while none runs).
    pub fn daemon_pid(&self) -> Option<u32> {
        self.daemon.as_ref().map(Server::pid)
    }

    /// The control socket path (the programs' RINGSOCK_CTL_SOCK).
    pub fn sock(&self) -> &Path {
        &self.sock
    }

    /// `program` under the shim, using this daemon.
    pub fn shimmed(&self, program: &str) -> Cmd {
        Cmd::shimmed(program).ctl(self)
    }

    /// The daemon's log so far.
    pub fn log(&self) -> String {
        let (o, e) = self.daemon.as_ref().map(Server::output).unwrap_or_default();
        format!("{}{o}{e}", self.old_log)
    }

    /// Every connection the shims report right now.
    pub fn status(&self) -> Vec<Conn> {
        status_at(&self.sock).unwrap_or_else(|e| panic!("{e}\ndaemon log:\n{}", self.log()))
    }

    /// Polls status until `pred` holds (returning that sample) or `timeout`
    /// passes (returning None).
    pub fn wait_for(
        &self,
        timeout: Duration,
        mut pred: impl FnMut(&[Conn]) -> bool,
    ) -> Option<Vec<Conn>> {
        let end = Instant::now() + timeout;
        loop {
            let s = self.status();
            if pred(&s) {
                return Some(s);
            }
            if Instant::now() >= end {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits (up to `timeout`) until status shows at least `n` links to
    /// `server_port` (see `links`) and returns them; panics with the last
    /// sample otherwise.
    pub fn wait_links(&self, server_port: u16, n: usize, timeout: Duration) -> Vec<Link> {
        let mut last = Vec::new();
        let got = self.wait_for(timeout, |s| {
            last = s.to_vec();
            links(s, server_port).len() >= n
        });
        match got {
            Some(s) => links(&s, server_port),
            None => panic!(
                "status never showed {n} link(s) to port {server_port} within {timeout:?}; last sample:\n{}",
                show(&last)
            ),
        }
    }

    /// Samples status while `child` runs (up to `timeout`, then it is
    /// killed), and once more right after it started; returns its exit
    /// status and every connection seen (latest sample of each).
    pub fn watch(&self, child: &mut Server, timeout: Duration) -> Watched {
        let end = Instant::now() + timeout;
        let mut seen = Seen::default();
        let mut samples = 0;
        let status = loop {
            if let Some(s) = child.exited() {
                break Some(s);
            }
            if Instant::now() >= end {
                break child.wait(Duration::ZERO);
            }
            if let Ok(s) = status_at(&self.sock) {
                seen.add(&s);
                samples += 1;
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let (stdout, stderr) = child.output();
        Watched {
            status,
            stdout,
            stderr,
            conns: seen.conns,
            samples,
        }
    }
}

/// Connections accumulated over several samples, keyed by (pid, fd, local,
/// peer); the latest sample of each is kept.
#[derive(Default)]
pub struct Seen {
    pub conns: Vec<Conn>,
}

impl Seen {
    pub fn add(&mut self, sample: &[Conn]) {
        for c in sample {
            let key = |x: &Conn| (x.pid, x.fd, x.local, x.peer);
            match self.conns.iter_mut().find(|x| key(x) == key(c)) {
                Some(x) => *x = c.clone(),
                None => self.conns.push(c.clone()),
            }
        }
    }
}

/// What `Ctl::watch` saw.
pub struct Watched {
    /// None if it had to be killed.
    pub status: Option<ExitStatus>,
    pub stdout: String,
    pub stderr: String,
    pub conns: Vec<Conn>,
    pub samples: usize,
}

impl Watched {
    /// Panics with the output unless the program exited successfully.
    pub fn assert_ok(&self, what: &str) {
        assert!(
            self.status.is_some_and(|s| s.success()),
            "{what} failed or timed out ({:?}):\nstdout:\n{}\nstderr:\n{}",
            self.status,
            self.stdout,
            self.stderr
        );
    }

    pub fn links(&self, server_port: u16) -> Vec<Link> {
        links(&self.conns, server_port)
    }
}

/// Both ends of one connection to a server port, as reported by the two
/// shims (client: peer port = server port; server: local port = server
/// port, addresses mirrored).
#[derive(Debug, Clone)]
pub struct Link {
    pub client: Conn,
    pub server: Conn,
}

impl Link {
    /// Both ends on the same shared-memory ring.
    pub fn is_shm(&self) -> bool {
        self.client.is_shm()
            && self.server.is_shm()
            && self.client.ring.is_some()
            && self.client.ring == self.server.ring
    }
}

impl std::fmt::Display for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "[{}] <=> [{}]", self.client, self.server)
    }
}

fn same_ip(a: SocketAddr, b: SocketAddr) -> bool {
    let canon = |x: SocketAddr| match x.ip() {
        std::net::IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map_or(std::net::IpAddr::V6(v6), std::net::IpAddr::V4),
        ip => ip,
    };
    canon(a) == canon(b) && a.port() == b.port()
}

/// The connections to `server_port` that both ends reported.
///
/// Samples taken over a run may hold two connections with the same
/// addresses: a client port the kernel gave out again after the first
/// connection closed (seen in CI: redis-benchmark's 40 connections, one
/// port twice, rings #8 and #37). A client end is paired with the server
/// ends on its own ring when there are any, so the two connections are
/// not crossed; otherwise with every server end at its addresses (and a
/// check for one ring fails on those).
pub fn links(conns: &[Conn], server_port: u16) -> Vec<Link> {
    let mut out = Vec::new();
    for c in conns.iter().filter(|c| c.peer.port() == server_port) {
        let ends: Vec<&Conn> = conns
            .iter()
            .filter(|s| s.local.port() == server_port)
            .filter(|s| same_ip(c.local, s.peer) && same_ip(c.peer, s.local) && c.pid != s.pid)
            .collect();
        let same_ring = |s: &&Conn| c.ring.is_some() && s.ring == c.ring;
        let on_ring = ends.iter().any(same_ring);
        for s in ends.into_iter().filter(|s| !on_ring || same_ring(s)) {
            out.push(Link {
                client: c.clone(),
                server: s.clone(),
            });
        }
    }
    out
}

/// One line per connection, for failure messages.
pub fn show(conns: &[Conn]) -> String {
    if conns.is_empty() {
        return "(no connections reported)".into();
    }
    conns.iter().map(|c| format!("  {c}\n")).collect::<String>()
}

/// Asserts that at least `min` connections to `server_port` were seen with
/// both ends reported, every such link on one shm ring, and no end of a
/// connection to that port reported as anything but shm; returns the links.
pub fn assert_all_shm(what: &str, conns: &[Conn], server_port: u16, min: usize) -> Vec<Link> {
    let l = links(conns, server_port);
    assert!(
        l.len() >= min,
        "{what}: expected at least {min} connection(s) to port {server_port} reported by both ends, saw {}:\n{}",
        l.len(),
        show(conns)
    );
    for link in &l {
        assert!(
            link.is_shm(),
            "{what}: not on one shm ring: {link}\nall:\n{}",
            show(conns)
        );
    }
    // Client ends (peer = the server port) that are not shm: a connection
    // the client shim put on TCP.
    let bad: Vec<&Conn> = conns
        .iter()
        .filter(|c| c.peer.port() == server_port && !c.is_shm())
        .filter(|c| l.iter().any(|x| x.client.pid == c.pid))
        .collect();
    assert!(
        bad.is_empty(),
        "{what}: client connections on TCP:\n{}\nall:\n{}",
        show(&bad.into_iter().cloned().collect::<Vec<_>>()),
        show(conns)
    );
    l
}

/// `ringsock-ctl status --json` of the daemon at `sock`, parsed.
pub fn status_at(sock: &Path) -> Result<Vec<Conn>, String> {
    let out = std::process::Command::new(ctl_bin())
        .args(["status", "--json", "--socket"])
        .arg(sock)
        .env_remove("LD_PRELOAD")
        .output()
        .map_err(|e| format!("running ringsock-ctl status: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!(
            "ringsock-ctl status failed ({}): {text}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    parse_status(&text).map_err(|e| format!("{e} in:\n{text}"))
}

#[cfg(test)]
mod tests {
    use super::{links, Conn};

    fn conn(pid: u32, local: &str, peer: &str, ring: Option<u64>) -> Conn {
        Conn {
            pid,
            fd: 3,
            exe: "x".into(),
            local: local.parse().unwrap(),
            peer: peer.parse().unwrap(),
            transport: "shm".into(),
            reason: String::new(),
            ring,
            stats: Default::default(),
        }
    }

    #[test]
    fn a_reused_client_port_is_paired_by_ring() {
        let (cli, srv) = ("127.0.0.1:47691", "127.0.0.1:24142");
        let conns = [
            conn(1, cli, srv, Some(8)),
            conn(2, srv, cli, Some(8)),
            conn(1, cli, srv, Some(37)),
            conn(2, srv, cli, Some(37)),
        ];
        let l = links(&conns, 24142);
        assert_eq!(l.len(), 2);
        assert!(l.iter().all(|k| k.is_shm()), "crossed: {l:?}");
    }

    #[test]
    fn ends_on_different_rings_are_still_a_link_that_fails_the_ring_check() {
        let (cli, srv) = ("127.0.0.1:40000", "127.0.0.1:24142");
        let conns = [conn(1, cli, srv, Some(3)), conn(2, srv, cli, Some(4))];
        let l = links(&conns, 24142);
        assert_eq!(l.len(), 1);
        assert!(!l[0].is_shm());
    }
}
