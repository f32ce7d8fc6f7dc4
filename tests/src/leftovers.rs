//! Nothing left behind: the checks a real-program test makes once its
//! programs are done.
//!
//! * [`Tree`] remembers every process of the trees it is shown (servers'
//!   workers and backends, clients' helpers: nginx workers, postgres
//!   backends, scp's ssh), each by pid and start time so a reused pid is
//!   not mistaken for it, and asserts they are all gone at the end;
//! * [`Baseline`] is what long-lived processes held before a workload
//!   (sockets, ring memfds and mappings), and asserts they are back to it,
//!   with no ring left, once the workload's connections are closed. Other
//!   descriptors may stay: a database keeps the table files a workload
//!   made it open.
//!
//! The daemon's side (no report left, no ring memfd held) is
//! `Ctl::assert_clean`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::resources::{children, holdings, Holdings};

/// A process as first seen: its start time (clock ticks after boot, field
/// 22 of /proc/PID/stat) and its name.
#[derive(Clone, Debug)]
struct Seen {
    start: u64,
    comm: String,
}

/// (start time, state, comm) of a live process, None once it is gone.
fn stat(pid: u32) -> Option<(u64, char, String)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) S ppid ...": comm may hold spaces and parentheses.
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let comm = text[open + 1..close].to_string();
    let rest: Vec<&str> = text[close + 1..].split_whitespace().collect();
    let state = rest.first()?.chars().next()?;
    // Field 22 overall; `rest` starts at field 3.
    let start = rest.get(19)?.parse().ok()?;
    Some((start, state, comm))
}

/// The processes of some program trees, as seen while they ran.
#[derive(Default)]
pub struct Tree {
    roots: Vec<u32>,
    seen: BTreeMap<u32, Seen>,
}

impl Tree {
    pub fn new() -> Tree {
        Tree::default()
    }

    /// Adds `pid` and (now and at every `sample`) its descendants.
    pub fn root(&mut self, pid: u32) {
        self.roots.push(pid);
        self.sample();
    }

    /// Records every live descendant of the roots not seen yet.
    pub fn sample(&mut self) {
        let mut todo = self.roots.clone();
        while let Some(pid) = todo.pop() {
            let Some((start, state, comm)) = stat(pid) else {
                continue;
            };
            if state == 'Z' {
                continue;
            }
            // A number seen before may name a new process by now.
            if self.seen.get(&pid).is_none_or(|s| s.start != start) {
                self.seen.insert(pid, Seen { start, comm });
            }
            todo.extend(children(pid));
        }
    }

    /// The processes seen that still run (zombies count as gone: they hold
    /// nothing): "pid (comm)" each.
    pub fn alive(&self) -> Vec<(u32, String)> {
        self.seen
            .iter()
            .filter(|(&pid, s)| matches!(stat(pid), Some((start, st, _)) if start == s.start && st != 'Z'))
            .map(|(&pid, s)| (pid, s.comm.clone()))
            .collect()
    }

    /// How many processes were seen.
    pub fn len(&self) -> usize {
        self.seen.len()
    }

    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }

    /// Waits (up to `timeout`) until every process seen is gone; panics
    /// naming those that are not.
    pub fn assert_gone(&self, what: &str, timeout: Duration) {
        let end = Instant::now() + timeout;
        loop {
            let left = self.alive();
            if left.is_empty() {
                return;
            }
            assert!(
                Instant::now() < end,
                "{what}: processes left behind after {timeout:?}: {left:?} (of {} seen)",
                self.seen.len()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// What some long-lived processes held before a workload.
pub struct Baseline {
    held: Vec<(u32, String, Holdings)>,
}

impl Baseline {
    /// Takes the holdings of every process of `tree` that runs now.
    pub fn of(tree: &Tree) -> Baseline {
        Baseline {
            held: tree
                .alive()
                .into_iter()
                .filter_map(|(pid, comm)| Some((pid, comm, holdings(pid)?)))
                .collect(),
        }
    }

    /// Waits (up to `timeout`) until each process of the baseline that
    /// still runs holds no ring memfd and no ring mapping, and no more
    /// sockets than before the workload (a closed ring is let go a few ms
    /// after its close); panics with what each holds otherwise.
    pub fn assert_settled(&self, what: &str, timeout: Duration) {
        let end = Instant::now() + timeout;
        loop {
            let mut off = Vec::new();
            for (pid, comm, before) in &self.held {
                let Some(now) = holdings(*pid) else { continue };
                if now.ring_fds > 0 || now.ring_maps > 0 || now.sockets > before.sockets {
                    off.push(format!(
                        "pid {pid} ({comm}): {} sockets (was {}), {} ring fds, {} ring mappings",
                        now.sockets, before.sockets, now.ring_fds, now.ring_maps
                    ));
                }
            }
            if off.is_empty() {
                return;
            }
            assert!(
                Instant::now() < end,
                "{what}: not back to what it held before, {timeout:?} after the clients finished:\n  {}",
                off.join("\n  ")
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn pids(&self) -> Vec<u32> {
        self.held.iter().map(|h| h.0).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sleeper() -> (std::process::Child, Tree) {
        let child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let mut t = Tree::new();
        t.root(child.id());
        (child, t)
    }

    #[test]
    fn sees_a_child_and_its_end() {
        let (mut child, t) = sleeper();
        assert_eq!(t.alive().len(), 1);
        assert_eq!(t.alive()[0].1, "sleep");
        child.kill().unwrap();
        child.wait().unwrap();
        t.assert_gone("sleep", Duration::from_secs(5));
    }

    #[test]
    fn a_process_left_running_is_named() {
        let (mut child, t) = sleeper();
        let r = std::panic::catch_unwind(|| t.assert_gone("sleep", Duration::ZERO));
        child.kill().unwrap();
        child.wait().unwrap();
        let msg = *r.unwrap_err().downcast::<String>().unwrap();
        assert!(msg.contains("\"sleep\""), "{msg}");
    }
}
