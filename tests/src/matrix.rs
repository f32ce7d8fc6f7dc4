//! One run of a real program (or several) under the shim, as the program
//! matrix checks it: a private daemon; servers and clients started through
//! it, all shimmed, their process trees remembered; the clients watched
//! (status sampled while they run); and at the end nothing left behind.
//!
//! ```text
//! let mut m = Matrix::new();
//! let mut server = m.serve(m.ctl.shimmed("redis-server").args(..));
//! wait_port(..);
//! let before = m.baseline();              // what the servers hold idle
//! let w = m.run(m.ctl.shimmed("redis-benchmark").args(..), timeout);
//! ...                                     // the client's own checks
//! w.expect(port, "transport=shm,ends>=2");
//! before.assert_settled(..);              // no ring, no new fd left
//! m.finish("redis", vec![server]);        // no process, report or ring left
//! ```

use std::time::Duration;

use crate::ctl::{Ctl, Watched};
use crate::leftovers::{Baseline, Tree};
use crate::proc::{Cmd, Server};

/// How long a process may take to go once told to, and the daemon to hear
/// that its sessions ended.
pub const GONE: Duration = Duration::from_secs(15);
/// How long `settle` waits for a port's ends to leave status.
const SETTLE: Duration = Duration::from_secs(10);

pub struct Matrix {
    pub ctl: Ctl,
    tree: Tree,
}

impl Default for Matrix {
    fn default() -> Self {
        Matrix::new()
    }
}

impl Matrix {
    /// A fresh daemon; nothing started yet.
    pub fn new() -> Matrix {
        Matrix {
            ctl: Ctl::start(),
            tree: Tree::new(),
        }
    }

    /// Starts `cmd` in the background and remembers its process tree.
    pub fn serve(&mut self, cmd: Cmd) -> Server {
        let s = cmd.spawn();
        self.tree.root(s.pid());
        s
    }

    /// Runs `cmd` to completion (killed after `timeout`), sampling status
    /// and the process trees meanwhile.
    pub fn run(&mut self, cmd: Cmd, timeout: Duration) -> Watched {
        let mut c = cmd.spawn();
        self.ctl.watch_tree(&mut c, timeout, &mut self.tree)
    }

    /// Waits (10 s at most) until status lists no connection end on
    /// `port`: the previous client's connections are closed and their
    /// closes reported (reports lag by design, more on a loaded machine),
    /// so the next run's samples hold only its own. Panics if one stays.
    pub fn settle(&self, port: u16) {
        self.ctl.expect(port, "ends=0", SETTLE);
    }

    /// As `run` for a client already started (to look at it meanwhile).
    pub fn watch(&mut self, client: &mut Server, timeout: Duration) -> Watched {
        self.ctl.watch_tree(client, timeout, &mut self.tree)
    }

    /// Samples the process trees now (a server's workers, once it has
    /// started them).
    pub fn sample(&mut self) {
        self.tree.sample();
    }

    /// What every process started so far holds now: take it once the
    /// servers are up and idle.
    pub fn baseline(&mut self) -> Baseline {
        self.tree.sample();
        Baseline::of(&self.tree)
    }

    /// Stops `servers` (SIGTERM, then SIGKILL after 3 s), then asserts
    /// that every process ever seen is gone, and that the daemon lists no
    /// connection and holds no ring. Returns the servers' stderr, in order.
    pub fn finish(mut self, what: &str, servers: Vec<Server>) -> Vec<String> {
        self.tree.sample();
        let mut errs = Vec::new();
        for mut s in servers {
            let (_, _, e) = s.stop();
            errs.push(e);
        }
        self.tree.assert_gone(what, GONE);
        self.ctl.assert_clean(what, GONE);
        println!(
            "{what}: {} processes seen, all gone; nothing left with the daemon",
            self.tree.len()
        );
        errs
    }
}
