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

use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use crate::proc::{Cmd, Server};
use crate::shim::ctl_bin;
use crate::status::{links, show, status_of, Conn, Link};
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

/// `ringsock-ctl status --json` of the daemon at `sock`, parsed.
pub fn status_at(sock: &Path) -> Result<Vec<Conn>, String> {
    status_of(ctl_bin(), sock)
}
