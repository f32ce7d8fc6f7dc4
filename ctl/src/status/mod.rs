//! `ringsock-ctl status`: the connection ends the shims report, from the
//! daemon (or from saved samples, `--from`), narrowed by a [`Selection`],
//! printed as a table, as JSON or as counts per transport, or checked
//! against an [`Expectation`] (`--expect`, optionally polled until it
//! holds, `--wait-ms`).

mod ends;
mod expect;
mod fetch;
pub mod json;
mod samples;
pub mod select;
mod table;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use ringsock_proto::{Error, StatusEntry};

pub use expect::{Expectation, Verdict};
pub use fetch::fetch;
pub use select::{CounterBound, Selection};
pub use table::table;

/// How `--wait-ms` polls the daemon.
const POLL: Duration = Duration::from_millis(100);

/// How the selected ends are printed when nothing is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Output {
    #[default]
    Table,
    Json,
    /// `rdma=N,tcp=N,shm=N`.
    Count,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    pub socket: PathBuf,
    pub output: Output,
    pub selection: Selection,
    pub expect: Option<Expectation>,
    /// Poll the daemon until the expectation holds, this long at most.
    pub wait: Option<Duration>,
    /// Read saved listings from these files instead of asking the daemon.
    pub from: Vec<PathBuf>,
}

/// Runs the command; returns the exit code (1 when the expectation fails
/// or no listing could be had).
pub fn run(o: &Options) -> i32 {
    let samples = if o.from.is_empty() {
        match &o.expect {
            Some(x) => return poll(o, x),
            None => match fetch(&o.socket) {
                Ok(entries) => vec![entries],
                Err(e) => return fetch_failed(o, &e),
            },
        }
    } else {
        match samples::read(&o.from) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("ringsock-ctl: {e}");
                return 1;
            }
        }
    };
    if let Some(x) = &o.expect {
        return report(&x.check(&o.selection, &samples));
    }
    let ends = ends::group(&samples, &o.selection);
    let last: Vec<StatusEntry> = ends.iter().map(|e| e.last().clone()).collect();
    match o.output {
        Output::Table => print!("{}", table(&last)),
        Output::Json => print!("{}", json::render(&last)),
        Output::Count => println!("{}", ends::count(&ends)),
    }
    0
}

/// Asks the daemon until the expectation holds or `--wait-ms` runs out
/// (once without it); a daemon that does not answer is asked again too.
fn poll(o: &Options, x: &Expectation) -> i32 {
    let end = Instant::now() + o.wait.unwrap_or(Duration::ZERO);
    loop {
        let got = fetch(&o.socket).map(|entries| x.check(&o.selection, &[entries]));
        let done = Instant::now() >= end;
        match got {
            Ok(v) if v.holds || done => return report(&v),
            Err(e) if done => return fetch_failed(o, &e),
            _ => std::thread::sleep(POLL.min(end.saturating_duration_since(Instant::now()))),
        }
    }
}

fn report(v: &Verdict) -> i32 {
    print!("{}", v.text);
    if v.holds {
        0
    } else {
        1
    }
}

fn fetch_failed(o: &Options, e: &Error) -> i32 {
    match e {
        Error::Io(e) => eprintln!(
            "ringsock-ctl: no daemon is answering on {} ({e}); start one with `ringsock-ctl daemon`",
            o.socket.display()
        ),
        e => eprintln!(
            "ringsock-ctl: status from {} failed: {e}",
            o.socket.display()
        ),
    }
    1
}

#[cfg(test)]
pub(crate) mod tests {
    use ringsock_proto::{RingStat, StatusEntry, Transport};

    /// An shm end with a hostile exe and reason, for the output tests.
    pub fn entry() -> StatusEntry {
        StatusEntry {
            session: 16,
            pid: 42,
            uid: 0,
            exe: "/usr/bin/redis-\"server".into(),
            name: "redis-server".into(),
            fd: 7,
            local: "127.0.0.1:6379".parse().unwrap(),
            peer: "[::1]:5000".parse().unwrap(),
            transport: Transport::Shm,
            reason: "line\nbreak".into(),
            ring: Some(3),
            ring_stats: vec![RingStat {
                name: "memfd_size".into(),
                value: 4096,
            }],
        }
    }
}
