//! Running a scenario: once plain (no LD_PRELOAD), once with both roles
//! under the shim and a private daemon, then comparing the two runs'
//! observation logs role by role.
//!
//! A run fails on its own when a role hangs (killed at `DEADLINE`), when
//! the roles desynchronise, when (shim mode) a barrier that asks for rings
//! does not see the connections on `shm`, or when something is left
//! behind: a process of a role, or a ring memfd in the daemon.

mod compare;
mod coord;
pub mod hosts;
pub mod spawn;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ringsock_integration::resources::holdings;
use ringsock_integration::{free_port, links, shim, show, Conn, Ctl, TempDir};

use crate::role::{exit_text, Side};
use coord::{coordinate, End};
use hosts::Hosts;
use spawn::{channel, group_gone, start, RoleArgs};

pub use compare::diff;

/// The longest a run may take before its roles are killed as hung.
pub const DEADLINE: Duration = Duration::from_secs(20);

/// How long the ring check waits for both ends' reports.
pub(super) const RING_WAIT: Duration = Duration::from_secs(5);

/// How long leftovers (processes, ring memfds) may take to go.
const CLEANUP: Duration = Duration::from_secs(5);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Plain,
    Shim,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Plain => "plain",
            Mode::Shim => "shim",
        }
    }
}

/// What one run of a scenario produced.
#[derive(Debug, Default)]
pub struct Run {
    pub server: Vec<String>,
    pub client: Vec<String>,
    /// Hang, desync, not on a ring, leftovers.
    pub problems: Vec<String>,
    /// The roles' stderr (diagnostics; never compared).
    pub stderr: String,
}

/// Where the roles run.
pub enum Place {
    /// Both on this host over loopback; in shim mode with a private
    /// daemon for the run.
    Local,
    /// On two hosts with a daemon each (hosts.rs).
    Hosts(Box<Hosts>),
}

impl Place {
    /// Two hosts when the environment describes them, else this host.
    pub fn from_env() -> Place {
        Hosts::from_env().map_or(Place::Local, |h| Place::Hosts(Box::new(h)))
    }
}

/// Runs scenario `name` once in `mode` with the `conform` binary `bin`.
pub fn run(bin: &Path, name: &str, mode: Mode, place: &Place) -> Run {
    let dir = TempDir::new(&format!("conform-{name}"));
    let port = free_port();
    let ctl = (mode == Mode::Shim && matches!(place, Place::Local)).then(Ctl::start);
    let local_shim = ctl.as_ref().map(|c| (shim(), c.sock()));
    let (server_ip, deadline) = match place {
        Place::Local => ("127.0.0.1", DEADLINE),
        Place::Hosts(h) => (h.server_ip.as_str(), h.deadline),
    };
    let args = |side: Side| {
        let i = side as usize;
        RoleArgs {
            bin,
            scenario: name,
            side,
            port,
            dir: dir.path(),
            server_ip,
            wrap: match place {
                Place::Local => &[],
                Place::Hosts(h) => &h.wrap[i],
            },
            shim: match (mode, place) {
                (Mode::Plain, _) => None,
                (Mode::Shim, Place::Local) => local_shim,
                (Mode::Shim, Place::Hosts(h)) => Some((h.shim.as_path(), h.ctl[i].as_path())),
            },
        }
    };
    let (sa, sc) = (args(Side::Server), args(Side::Client));
    let (s_mine, s_theirs) = channel();
    let (c_mine, c_theirs) = channel();
    let s_child = start(&sa, &s_theirs);
    let c_child = start(&sc, &c_theirs);
    drop((s_theirs, c_theirs));
    let mut ends = [
        End::new(Side::Server, s_mine, s_child),
        End::new(Side::Client, c_mine, c_child),
    ];
    let deadline = Instant::now() + deadline;
    let mut problems = coordinate(&mut ends, deadline, |barrier, n| match (mode, place) {
        (Mode::Plain, _) => None,
        (Mode::Shim, Place::Local) => ctl.as_ref().and_then(|c| ring_check(c, port, barrier, n)),
        (Mode::Shim, Place::Hosts(h)) => h.ring_check(port, barrier, n, 3 * RING_WAIT),
    });
    for e in &ends {
        if !group_gone(e.child.id(), CLEANUP) {
            problems.push(format!(
                "left behind: a process of the {} role outlived it (killed)",
                e.side.as_str()
            ));
        }
    }
    if let Some(c) = &ctl {
        problems.extend(daemon_leak(c));
    }
    let log = |a: &RoleArgs<'_>, e: &End| {
        let mut lines: Vec<String> = std::fs::read_to_string(a.log_path())
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect();
        let end = match (e.killed, e.status) {
            (true, _) => "killed by the runner".to_string(),
            (false, Some(s)) => exit_text(std::os::unix::process::ExitStatusExt::into_raw(s)),
            (false, None) => "never reaped".to_string(),
        };
        lines.push(format!("end: {end}"));
        lines
    };
    let stderr = [&sa, &sc]
        .iter()
        .map(|a| {
            let text = std::fs::read_to_string(a.err_path()).unwrap_or_default();
            format!("--- {} stderr ---\n{text}", a.side.as_str())
        })
        .collect::<String>();
    Run {
        server: log(&sa, &ends[0]),
        client: log(&sc, &ends[1]),
        problems,
        stderr,
    }
}

/// In shim mode at a barrier: waits until the daemon lists `n`
/// connections to `port` with both ends on one shm ring and none of that
/// port's ends on anything else; the problem if that never happens.
fn ring_check(ctl: &Ctl, port: u16, barrier: &str, n: u32) -> Option<String> {
    let mut last: Vec<Conn> = Vec::new();
    let ok = ctl
        .wait_for(RING_WAIT, |s| {
            last = s.to_vec();
            let l = links(s, port);
            let mine = s
                .iter()
                .filter(|c| c.peer.port() == port || c.local.port() == port);
            l.len() >= n as usize && l.iter().all(|k| k.is_shm()) && mine.clone().all(Conn::is_shm)
        })
        .is_some();
    (!ok).then(|| {
        format!(
            "not on a ring at barrier `{barrier}` (wanted {n} shm link(s) to the server port):\n{}",
            show(&last)
        )
    })
}

/// Ring memfds the daemon still holds once every role is gone.
fn daemon_leak(ctl: &Ctl) -> Option<String> {
    let pid = ctl.daemon_pid()?;
    let end = Instant::now() + CLEANUP;
    loop {
        let h = holdings(pid)?;
        if h.ring_fds == 0 && h.ring_maps == 0 {
            return None;
        }
        if Instant::now() >= end {
            return Some(format!(
                "left behind: the daemon still holds {} ring memfd(s), {} mapping(s)",
                h.ring_fds, h.ring_maps
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// How a scenario compares.
#[derive(Debug)]
pub enum Verdict {
    /// Both runs logged the same and the shim run had no problem.
    Same,
    /// The shim run differs from the plain one (the report says how).
    Differs(String),
    /// The plain run itself failed: the scenario is broken.
    Broken(String),
}

/// Runs `name` plain, then under the shim, and compares.
pub fn check(bin: &Path, name: &str, place: &Place) -> Verdict {
    let plain = run(bin, name, Mode::Plain, place);
    if !plain.problems.is_empty() {
        return Verdict::Broken(format!(
            "{name}: the plain run failed:\n{}\n{}\nserver log:\n{}\nclient log:\n{}",
            plain.problems.join("\n"),
            plain.stderr,
            plain.server.join("\n"),
            plain.client.join("\n")
        ));
    }
    let shim = run(bin, name, Mode::Shim, place);
    let mut report = String::new();
    for p in &shim.problems {
        report.push_str(&format!("{p}\n"));
    }
    for (role, a, b) in [
        ("server", &plain.server, &shim.server),
        ("client", &plain.client, &shim.client),
    ] {
        if a != b {
            report.push_str(&diff(role, a, b));
        }
    }
    if report.is_empty() {
        Verdict::Same
    } else {
        let stderr = digest(&shim.stderr);
        if !stderr.is_empty() {
            report.push_str(&format!("shim run stderr:\n{stderr}"));
        }
        Verdict::Differs(report)
    }
}

/// The roles' stderr for a report: each distinct line once, with how
/// often it came, at most 8 of them.
fn digest(stderr: &str) -> String {
    let mut seen: Vec<(String, usize)> = Vec::new();
    for l in stderr
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with("---"))
    {
        // The pid in `ringsock[PID]:` differs line to line; the text not.
        let text = l.split_once("]: ").map_or(l, |(_, t)| t).to_string();
        match seen.iter_mut().find(|(t, _)| *t == text) {
            Some((_, n)) => *n += 1,
            None => seen.push((text, 1)),
        }
    }
    let mut out = String::new();
    for (text, n) in seen.iter().take(8) {
        let times = if *n > 1 {
            format!(" (x{n})")
        } else {
            String::new()
        };
        out.push_str(&format!("  {text}{times}\n"));
    }
    if seen.len() > 8 {
        out.push_str(&format!(
            "  ... and {} more distinct lines\n",
            seen.len() - 8
        ));
    }
    out
}

/// The `conform` binary next to the running executable (the CLI itself,
/// or, from a test, `target/<profile>/conform`).
pub fn default_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let dir = exe.parent().expect("exe dir");
    let dir = if dir.file_name().is_some_and(|n| n == "deps") {
        dir.parent().expect("profile dir")
    } else {
        dir
    };
    dir.join("conform")
}
