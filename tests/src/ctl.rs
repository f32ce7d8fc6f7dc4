//! A private `ringsock-ctl daemon` per test, and its `status --json`.
//!
//! `Ctl::start()` runs `ringsock-ctl daemon --socket <tmp>/ctl.sock
//! --foreground` (stopped on drop); `Cmd::shimmed(..).ctl(&ctl)` (or
//! `ctl.shimmed(..)`) points a program's shim at it. `status()` runs
//! `ringsock-ctl status --json` and parses every entry into a `Conn`;
//! `watch()` samples it while a client runs, so tests can assert which
//! transport the connections between two programs used while they were
//! alive (the shim reports a connection a few ms after it is set up and
//! withdraws the report when it closes), also with the CLI's own check
//! (`Watched::expect`: `status --from` over the samples; `Ctl::expect`:
//! `status --expect --wait-ms` on the live daemon). `assert_clean` checks
//! that nothing is left with the daemon once the programs are gone.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::leftovers::Tree;
use crate::proc::{Cmd, Server};
use crate::resources::holdings;
use crate::shim::ctl_bin;
use crate::status::{links, parse, show, status_json, status_of, Conn, Link};
use crate::tmp::TempDir;

/// A `ringsock-ctl daemon` on a private socket, stopped on drop.
pub struct Ctl {
    /// None while no daemon runs (`absent`, after `kill`).
    daemon: Option<Server>,
    sock: PathBuf,
    /// Logs of daemons that were killed, for failure messages.
    old_log: String,
    /// Descriptors the running daemon held once it answered, before any
    /// program talked to it.
    idle_fds: usize,
    /// Numbers the files of recorded samples.
    recordings: AtomicU32,
    dir: TempDir,
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
            idle_fds: 0,
            recordings: AtomicU32::new(0),
            dir,
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
        self.idle_fds = idle_fds(daemon.pid());
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
    /// status and every connection seen (latest sample of each). Every
    /// sample is also saved, as `status --json` printed it, for
    /// `Watched::expect`.
    pub fn watch(&self, child: &mut Server, timeout: Duration) -> Watched {
        self.watch_tree(child, timeout, &mut Tree::new())
    }

    /// As `watch`, and adds `child` to `tree`, sampling the tree's
    /// processes along with status.
    pub fn watch_tree(&self, child: &mut Server, timeout: Duration, tree: &mut Tree) -> Watched {
        self.watch_with(child, timeout, Duration::from_millis(10), tree)
    }

    /// As `watch`, a sample every `interval`: with thousands of connection
    /// ends a status request costs the daemon real work, and sampling
    /// often slows down the very claims it is watching.
    pub fn watch_every(
        &self,
        child: &mut Server,
        timeout: Duration,
        interval: Duration,
    ) -> Watched {
        self.watch_with(child, timeout, interval, &mut Tree::new())
    }

    fn watch_with(
        &self,
        child: &mut Server,
        timeout: Duration,
        interval: Duration,
        tree: &mut Tree,
    ) -> Watched {
        tree.root(child.pid());
        let n = self.recordings.fetch_add(1, Ordering::Relaxed);
        let record = self.dir.path().join(format!("samples-{n}.jsonl"));
        let mut file = std::fs::File::create(&record).expect("samples file");
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
            tree.sample();
            if let Ok(text) = status_json(ctl_bin(), &self.sock) {
                if let Ok(s) = parse(&text) {
                    seen.add(&s);
                    samples += 1;
                    file.write_all(text.as_bytes()).expect("saving a sample");
                }
            }
            std::thread::sleep(interval);
        };
        let (stdout, stderr) = child.output();
        Watched {
            status,
            stdout,
            stderr,
            conns: seen.conns,
            samples,
            record,
        }
    }

    /// `ringsock-ctl status --port PORT --expect TERMS --wait-ms N` on the
    /// live daemon: the connections open now must satisfy TERMS (within
    /// `wait`); panics with the CLI's verdict otherwise. Returns the
    /// verdict's first line (the sentence saying why it holds).
    pub fn expect(&self, port: u16, terms: &str, wait: Duration) -> String {
        let wait_ms = wait.as_millis().to_string();
        let extra = ["--wait-ms", wait_ms.as_str()];
        let (ok, verdict) = self.check(port, terms, &extra);
        assert!(ok, "status --port {port} --expect {terms}:\n{verdict}");
        verdict.lines().next().unwrap_or_default().to_string()
    }

    fn check(&self, port: u16, terms: &str, extra: &[&str]) -> (bool, String) {
        let out = Cmd::plain(ctl_bin().to_str().expect("utf-8 path"))
            .args(["status", "--socket"])
            .arg(&self.sock)
            .args(["--port", &port.to_string(), "--expect", terms])
            .args(extra)
            .run(Duration::from_secs(60));
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    }

    /// Waits (up to `timeout`) until the daemon lists no connection, holds
    /// no ring memfd and no more descriptors than when it started (every
    /// session closed): what is left once every program is gone. Panics
    /// with what is left otherwise.
    pub fn assert_clean(&self, what: &str, timeout: Duration) {
        let pid = self.daemon_pid().expect("no daemon running");
        let end = Instant::now() + timeout;
        loop {
            let left = self.status();
            let held = holdings(pid).expect("the daemon is gone");
            if left.is_empty() && held.ring_fds == 0 && held.fds <= self.idle_fds {
                return;
            }
            assert!(
                Instant::now() < end,
                "{what}: {timeout:?} after the programs ended the daemon still lists:\n{}\
                 and holds {} descriptors ({} when it started), {} of them ring memfds",
                show(&left),
                held.fds,
                self.idle_fds,
                held.ring_fds
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Descriptors `pid` holds, once that number stays put for a moment (the
/// session of the status call that found the daemon answering closes
/// right after it).
fn idle_fds(pid: u32) -> usize {
    let mut last = usize::MAX;
    for _ in 0..50 {
        let now = holdings(pid).map_or(0, |h| h.fds);
        if now == last {
            return now;
        }
        last = now;
        std::thread::sleep(Duration::from_millis(20));
    }
    last
}

/// Connections accumulated over several samples, keyed by (pid, fd, local,
/// peer); the latest sample of each is kept, with the first and last
/// sample that listed it. Two ends with the same key on two different
/// rings are two connections that had the same descriptor and addresses
/// one after the other: both are kept. (An end whose ring went, a
/// fallback to TCP, is the same connection.)
#[derive(Default)]
pub struct Seen {
    pub conns: Vec<Conn>,
    samples: usize,
}

impl Seen {
    pub fn add(&mut self, sample: &[Conn]) {
        let n = self.samples;
        self.samples += 1;
        for c in sample {
            let key = |x: &Conn| (x.pid, x.fd, x.local, x.peer);
            let other_ring = |x: &Conn| x.ring.is_some() && c.ring.is_some() && x.ring != c.ring;
            match self
                .conns
                .iter_mut()
                .rev()
                .find(|x| key(x) == key(c) && !other_ring(x))
            {
                Some(x) => {
                    let since = x.samples.map_or(n, |s| s.0);
                    *x = c.clone();
                    x.samples = Some((since, n));
                }
                None => {
                    let mut x = c.clone();
                    x.samples = Some((n, n));
                    self.conns.push(x);
                }
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
    /// Every sample, one `status --json` listing per line.
    pub record: PathBuf,
}

impl Watched {
    /// At least `min` connections to `port` seen with both ends on one shm
    /// ring and no client end on anything else (`assert_all_shm`), and the
    /// CLI agrees over the same samples (every end on shm, at least 2 x
    /// `min` of them). Prints what it saw; returns the links.
    pub fn assert_on_rings(&self, what: &str, port: u16, min: usize) -> Vec<Link> {
        let l = crate::status::assert_all_shm(what, &self.conns, port, min);
        let verdict = self.expect(port, &format!("transport=shm,ends>={}", 2 * min));
        match l.first() {
            Some(first) => println!(
                "{what}: {} link(s) on rings, e.g. {first}; {verdict}",
                l.len()
            ),
            None => println!("{what}: {verdict}"),
        }
        l
    }

    /// `ringsock-ctl status --from <the samples> --port PORT --expect
    /// TERMS`: the CLI's own check of what was seen while the program ran
    /// (every report of every end counts); panics with its verdict unless
    /// it holds. Returns the verdict's first line.
    pub fn expect(&self, port: u16, terms: &str) -> String {
        let out = Cmd::plain(ctl_bin().to_str().expect("utf-8 path"))
            .arg("status")
            .arg("--from")
            .arg(&self.record)
            .args(["--port", &port.to_string(), "--expect", terms])
            .run(Duration::from_secs(60));
        let verdict = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.status.success(),
            "status --from ({} samples) --port {port} --expect {terms}:\n{verdict}",
            self.samples
        );
        verdict.lines().next().unwrap_or_default().to_string()
    }

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

/// `ringsock-ctl status --json` of the daemon at `sock`, parsed.
pub fn status_at(sock: &Path) -> Result<Vec<Conn>, String> {
    status_of(ctl_bin(), sock)
}
