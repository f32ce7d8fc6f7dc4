//! Command-line parsing (clap) and dispatch to the commands. Flags are
//! checked by clap (a bad one is a usage error, exit 2); environment
//! values are read here, and a bad one is reported and replaced by the
//! default instead.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use log::LevelFilter;
use ringsock_proto::Transport;

use crate::daemon::{self, DaemonConfig};
use crate::peer::{PeerConfig, DEFAULT_PEER_PORT, DEFAULT_PEER_RETRY_MS, DEFAULT_PEER_TIMEOUT_MS};
use crate::status::{self, CounterBound, Expectation, Output, Selection};
use crate::{logger, metrics, run, service};

/// Default socket when neither `--socket` nor `RINGSOCK_CTL_SOCK` is set.
pub const DEFAULT_SOCKET: &str = "/run/ringsock/ctl.sock";
pub const DEFAULT_OFFER_TIMEOUT_MS: u64 = 10_000;
/// An hour: anything longer is a typo, and would pin descriptors for ages.
pub const MAX_OFFER_TIMEOUT_MS: u64 = 3_600_000;
/// A connect to another host's ctl is never worth waiting longer for.
pub const MAX_PEER_TIMEOUT_MS: u64 = 60_000;

const ENVIRONMENT: &str = "\
Environment (a flag wins; an invalid value is reported and the default used):
  RINGSOCK_CTL_SOCK           control socket (default /run/ringsock/ctl.sock)
  RINGSOCK_OFFER_TIMEOUT_MS   offer lifetime in ms (default 10000)
  RINGSOCK_CTL_PORT           TCP port of the ctls of all hosts (default 7471, 0: off)
  RINGSOCK_PEER_TIMEOUT_MS    bound on a forwarded offer's reply (default 300)
  RINGSOCK_PEER_RETRY_MS      how long an unreachable host stays on TCP (default 30000)
  RINGSOCK_METRICS_LISTEN     ADDR:PORT serving GET /metrics over HTTP (default: off)
  RINGSOCK_LOG                log level: off, error, warn, info (default), debug, trace
  RINGSOCK_LIB                path of libringsock.so for `run`";

const STATUS_EXAMPLES: &str = "\
Selection: an end is selected when it passes every filter given (--port
matches its local or its peer port; --counter needs the end to have that
ring counter). --expect checks the selected ends; its terms, comma-separated,
must all hold:
  ends=N, ends>=N, ends<=N   how many connection ends are selected
  transport=T                every selected end is on T (shm, rdma, tcp)
It prints a line saying whether it holds and why, then the ends, and exits
0 if it holds, 1 if not (or if no listing could be had).

With --from, every report in every sample counts: an end is counted once
however many samples show it, and transport=T must hold in each of them.

Examples:
  ringsock-ctl status --port 6379 --expect transport=shm,ends=2 --wait-ms 5000
  ringsock-ctl status --from st.A --port 7209 --counter zc_writes>=1 --expect ends>=1
  ringsock-ctl status --from st.A --from st.B --port 7209 --count";

/// ringsock control daemon and CLI: sets up the ring connections of
/// programs run under libringsock.so, and lists them.
#[derive(Debug, Parser)]
#[command(name = "ringsock-ctl", version, after_help = ENVIRONMENT)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

/// In every command an option given twice takes the last value (scripts
/// add to a base command line); `--counter` and `--from` add up.
#[derive(Debug, PartialEq, Eq, Subcommand)]
pub enum Command {
    /// Runs the per-host control daemon (detaches once listening unless
    /// --foreground).
    #[command(after_help = ENVIRONMENT, args_override_self = true)]
    Daemon(DaemonArgs),
    /// Lists the connections the shims report, or checks them (--expect).
    #[command(after_help = STATUS_EXAMPLES, args_override_self = true)]
    Status(StatusArgs),
    /// Prints the daemon's metrics (Prometheus text format 0.0.4).
    #[command(args_override_self = true)]
    Metrics(MetricsArgs),
    /// Makes a systemd service run under libringsock.so: writes the drop-in
    /// /etc/systemd/system/UNIT.d/ringsock.conf (LD_PRELOAD, then any
    /// LD_PRELOAD the unit sets; RINGSOCK_CTL_SOCK) and reloads systemd if
    /// it runs.
    #[command(args_override_self = true)]
    Enable(EnableArgs),
    /// Removes the drop-in `enable` wrote for UNIT.
    #[command(args_override_self = true)]
    Disable(DisableArgs),
    /// Runs CMD with libringsock.so prepended to LD_PRELOAD.
    #[command(after_help = ENVIRONMENT, args_override_self = true)]
    Run(RunArgs),
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Args)]
pub struct DaemonArgs {
    /// Control socket [env: RINGSOCK_CTL_SOCK; default: /run/ringsock/ctl.sock]
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// How long an offer waits for its claim, a claim for its answer and a
    /// result for its collection, 1..=3600000 [env: RINGSOCK_OFFER_TIMEOUT_MS; default: 10000]
    #[arg(long, value_name = "N", value_parser = offer_timeout_arg)]
    pub offer_timeout_ms: Option<u64>,
    /// Log level: off, error, warn, info, debug, trace; a bad one is
    /// reported and info used [env: RINGSOCK_LOG; default: info]
    #[arg(long, value_name = "L")]
    pub log_level: Option<String>,
    /// Stay attached to the terminal
    #[arg(long)]
    pub foreground: bool,
    /// TCP port the ctls of all hosts listen on for each other, 0: off
    /// [env: RINGSOCK_CTL_PORT; default: 7471]
    #[arg(long, value_name = "N", value_parser = port_arg)]
    pub peer_port: Option<u16>,
    /// Bound on the reply to an offer for another host, 1..=60000
    /// [env: RINGSOCK_PEER_TIMEOUT_MS; default: 300]
    #[arg(long, value_name = "N", value_parser = peer_timeout_arg)]
    pub peer_timeout_ms: Option<u64>,
    /// How long a host whose ctl could not be reached stays on TCP,
    /// 0..=3600000 [env: RINGSOCK_PEER_RETRY_MS; default: 30000]
    #[arg(long, value_name = "N", value_parser = retry_arg)]
    pub peer_retry_ms: Option<u64>,
    /// Serve GET /metrics over HTTP on this TCP address, e.g.
    /// 127.0.0.1:9477 [env: RINGSOCK_METRICS_LISTEN; default: off]
    #[arg(long, value_name = "ADDR:PORT", value_parser = listen_arg)]
    pub metrics_listen: Option<SocketAddr>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Args)]
pub struct MetricsArgs {
    /// Control socket [env: RINGSOCK_CTL_SOCK; default: /run/ringsock/ctl.sock]
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Args)]
pub struct StatusArgs {
    /// Print {"connections":[...]}, one object per connection end
    #[arg(long, conflicts_with_all = ["count", "expect"])]
    pub json: bool,
    /// Print how many ends are on each transport: rdma=N,tcp=N,shm=N
    #[arg(long, conflicts_with = "expect")]
    pub count: bool,
    /// Control socket [env: RINGSOCK_CTL_SOCK; default: /run/ringsock/ctl.sock]
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// Only ends whose local or peer port is P
    #[arg(long, value_name = "P")]
    pub port: Option<u16>,
    /// Only ends reported by process N
    #[arg(long, value_name = "N")]
    pub pid: Option<u32>,
    /// Only ends on this transport: shm, rdma or tcp
    #[arg(long, value_name = "T", value_parser = transport_arg)]
    pub transport: Option<Transport>,
    /// Only ends with a ring counter within BOUND: NAME>=N, NAME<=N or
    /// NAME=N; repeatable
    #[arg(long = "counter", value_name = "BOUND", value_parser = CounterBound::parse)]
    pub counters: Vec<CounterBound>,
    /// Check the selected ends, e.g. transport=shm,ends=2 (see below)
    #[arg(long, value_name = "LIST", value_parser = Expectation::parse)]
    pub expect: Option<Expectation>,
    /// Ask again until --expect holds, for at most N ms
    #[arg(long, value_name = "N", requires = "expect", conflicts_with = "from")]
    pub wait_ms: Option<u64>,
    /// Read listings saved from `status --json` (one per line) from FILE
    /// instead of asking the daemon; repeatable
    #[arg(long, value_name = "FILE", conflicts_with = "socket")]
    pub from: Vec<PathBuf>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Args)]
pub struct EnableArgs {
    /// The service: NAME or NAME.service
    #[arg(value_name = "UNIT")]
    pub unit: String,
    /// Write under DIR instead of / (image builds); systemd is not reloaded
    #[arg(long, value_name = "DIR")]
    pub root: Option<PathBuf>,
    /// libringsock.so the service preloads [env: RINGSOCK_LIB; default:
    /// next to ringsock-ctl, or /usr/lib/ringsock/libringsock.so]
    #[arg(long, value_name = "PATH")]
    pub lib: Option<PathBuf>,
    /// Control socket the service uses [env: RINGSOCK_CTL_SOCK; default:
    /// /run/ringsock/ctl.sock]
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Args)]
pub struct DisableArgs {
    /// The service: NAME or NAME.service
    #[arg(value_name = "UNIT")]
    pub unit: String,
    /// Remove under DIR instead of /; systemd is not reloaded
    #[arg(long, value_name = "DIR")]
    pub root: Option<PathBuf>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Args)]
pub struct RunArgs {
    /// libringsock.so to preload [env: RINGSOCK_LIB; default: next to ringsock-ctl]
    #[arg(long, value_name = "PATH")]
    pub lib: Option<PathBuf>,
    /// Control socket for the program (sets its RINGSOCK_CTL_SOCK)
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// The command, then its arguments (from the command on, options are
    /// the command's own; `--` before it also ends ours)
    #[arg(
        value_name = "CMD",
        required = true,
        trailing_var_arg = true,
        num_args = 1..
    )]
    pub argv: Vec<OsString>,
}

/// Parses `argv` (without the program name).
pub fn parse(argv: Vec<OsString>) -> Result<Cli, clap::Error> {
    Cli::try_parse_from(std::iter::once(OsString::from("ringsock-ctl")).chain(argv))
}

fn offer_timeout_arg(s: &str) -> Result<u64, String> {
    parse_timeout(s).ok_or_else(|| format!("expected 1..={MAX_OFFER_TIMEOUT_MS}"))
}

fn port_arg(s: &str) -> Result<u16, String> {
    parse_port(s).ok_or_else(|| "expected 0..=65535".into())
}

fn peer_timeout_arg(s: &str) -> Result<u64, String> {
    parse_peer_timeout(s).ok_or_else(|| format!("expected 1..={MAX_PEER_TIMEOUT_MS}"))
}

fn retry_arg(s: &str) -> Result<u64, String> {
    parse_retry(s).ok_or_else(|| format!("expected 0..={MAX_OFFER_TIMEOUT_MS}"))
}

fn listen_arg(s: &str) -> Result<SocketAddr, String> {
    metrics::http::parse_listen(s).ok_or_else(|| "expected ADDR:PORT, e.g. 127.0.0.1:9477".into())
}

/// `--metrics-listen`, else a valid `RINGSOCK_METRICS_LISTEN` (an invalid
/// one is reported and the endpoint stays off), else off.
fn metrics_listen(flag: Option<SocketAddr>) -> Option<SocketAddr> {
    flag.or_else(|| match std::env::var("RINGSOCK_METRICS_LISTEN") {
        Ok(v) if !v.is_empty() => metrics::http::parse_listen(&v).or_else(|| {
            eprintln!("ringsock-ctl: invalid RINGSOCK_METRICS_LISTEN {v:?}; metrics endpoint off");
            None
        }),
        _ => None,
    })
}

fn transport_arg(s: &str) -> Result<Transport, String> {
    Transport::from_name(s).ok_or_else(|| "expected shm, rdma or tcp".into())
}

pub fn parse_timeout(s: &str) -> Option<u64> {
    s.trim()
        .parse::<u64>()
        .ok()
        .filter(|v| (1..=MAX_OFFER_TIMEOUT_MS).contains(v))
}

pub fn parse_port(s: &str) -> Option<u16> {
    s.trim().parse::<u16>().ok()
}

pub fn parse_peer_timeout(s: &str) -> Option<u64> {
    s.trim()
        .parse::<u64>()
        .ok()
        .filter(|v| (1..=MAX_PEER_TIMEOUT_MS).contains(v))
}

pub fn parse_retry(s: &str) -> Option<u64> {
    s.trim()
        .parse::<u64>()
        .ok()
        .filter(|v| *v <= MAX_OFFER_TIMEOUT_MS)
}

/// A flag, else a valid environment value (an invalid one is reported and
/// replaced by the default), else the default.
fn flag_env<T: Copy + std::fmt::Display>(
    flag: Option<T>,
    env: &str,
    parse: fn(&str) -> Option<T>,
    default: T,
) -> T {
    flag.unwrap_or_else(|| match std::env::var(env) {
        Ok(v) if !v.is_empty() => parse(&v).unwrap_or_else(|| {
            eprintln!("ringsock-ctl: invalid {env} {v:?}; using {default}");
            default
        }),
        _ => default,
    })
}

fn peer_config(d: &DaemonArgs) -> PeerConfig {
    PeerConfig {
        port: flag_env(
            d.peer_port,
            "RINGSOCK_CTL_PORT",
            parse_port,
            DEFAULT_PEER_PORT,
        ),
        timeout: Duration::from_millis(flag_env(
            d.peer_timeout_ms,
            "RINGSOCK_PEER_TIMEOUT_MS",
            parse_peer_timeout,
            DEFAULT_PEER_TIMEOUT_MS,
        )),
        retry: Duration::from_millis(flag_env(
            d.peer_retry_ms,
            "RINGSOCK_PEER_RETRY_MS",
            parse_retry,
            DEFAULT_PEER_RETRY_MS,
        )),
    }
}

fn socket_path(flag: Option<PathBuf>) -> PathBuf {
    flag.or_else(|| {
        std::env::var_os("RINGSOCK_CTL_SOCK")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    })
    .unwrap_or_else(|| PathBuf::from(DEFAULT_SOCKET))
}

/// `--log-level`, else `RINGSOCK_LOG`, else info; a bad value is reported
/// and replaced by the default rather than refused.
fn log_level(flag: Option<&str>) -> LevelFilter {
    let (value, origin) = match flag {
        Some(v) => (v.to_owned(), "--log-level"),
        None => match std::env::var("RINGSOCK_LOG") {
            Ok(v) if !v.is_empty() => (v, "RINGSOCK_LOG"),
            _ => return LevelFilter::Info,
        },
    };
    logger::parse_level(&value).unwrap_or_else(|| {
        eprintln!(
            "ringsock-ctl: invalid {origin} value {value:?} (expected one of: {}); using info",
            logger::LEVELS
        );
        LevelFilter::Info
    })
}

fn offer_timeout(flag: Option<u64>) -> Duration {
    let ms = flag.unwrap_or_else(|| match std::env::var("RINGSOCK_OFFER_TIMEOUT_MS") {
        Ok(v) if !v.is_empty() => parse_timeout(&v).unwrap_or_else(|| {
            eprintln!(
                "ringsock-ctl: invalid RINGSOCK_OFFER_TIMEOUT_MS {v:?} (expected 1..={MAX_OFFER_TIMEOUT_MS}); using {DEFAULT_OFFER_TIMEOUT_MS}"
            );
            DEFAULT_OFFER_TIMEOUT_MS
        }),
        _ => DEFAULT_OFFER_TIMEOUT_MS,
    });
    Duration::from_millis(ms)
}

fn status_options(s: StatusArgs) -> status::Options {
    status::Options {
        socket: socket_path(s.socket),
        output: if s.json {
            Output::Json
        } else if s.count {
            Output::Count
        } else {
            Output::Table
        },
        selection: Selection {
            port: s.port,
            pid: s.pid,
            transport: s.transport,
            counters: s.counters,
        },
        expect: s.expect,
        wait: s.wait_ms.map(Duration::from_millis),
        from: s.from,
    }
}

/// The shim a unit is to preload: on this system (checked, absolute), or
/// under `--root` the path as the image will have it (absolute, not
/// checked here).
fn enable_lib(e: &EnableArgs) -> Result<PathBuf, String> {
    let Some(_root) = &e.root else {
        return run::find_lib(
            e.lib.as_deref(),
            std::env::var_os("RINGSOCK_LIB"),
            std::env::current_exe().ok(),
        );
    };
    let lib = e
        .lib
        .clone()
        .or_else(|| {
            std::env::var_os("RINGSOCK_LIB")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        })
        .unwrap_or_else(|| PathBuf::from(service::PACKAGED_LIB));
    if !lib.is_absolute() {
        return Err(format!(
            "--lib {} must be absolute with --root",
            lib.display()
        ));
    }
    Ok(lib)
}

/// Exit code of a command that returns a one-line error.
fn report(r: Result<(), String>) -> i32 {
    match r {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("ringsock-ctl: {e}");
            1
        }
    }
}

/// Entry point; returns the process exit code: 2 for a usage error, 0 for
/// help and version (also when no command is given: the help).
pub fn main(argv: Vec<OsString>) -> i32 {
    let argv = if argv.is_empty() {
        vec![OsString::from("help")]
    } else {
        argv
    };
    let cli = match parse(argv) {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return e.exit_code();
        }
    };
    match cli.command {
        Command::Daemon(d) => {
            logger::init(log_level(d.log_level.as_deref()));
            let cfg = DaemonConfig {
                peer: peer_config(&d),
                socket: socket_path(d.socket),
                offer_timeout: offer_timeout(d.offer_timeout_ms),
                foreground: d.foreground,
                metrics_listen: metrics_listen(d.metrics_listen),
            };
            match daemon::run(&cfg) {
                Ok(()) => 0,
                Err(daemon::StartError::Message(m)) => {
                    eprintln!("ringsock-ctl: {m}");
                    1
                }
                Err(daemon::StartError::Reported) => 1,
            }
        }
        Command::Status(s) => status::run(&status_options(s)),
        Command::Metrics(m) => metrics::fetch::run(&socket_path(m.socket)),
        Command::Enable(e) => report(enable_lib(&e).and_then(|lib| {
            service::enable(
                &e.unit,
                e.root.as_deref().unwrap_or(Path::new("/")),
                &lib,
                &socket_path(e.socket.clone()),
            )
        })),
        Command::Disable(d) => report(service::disable(
            &d.unit,
            d.root.as_deref().unwrap_or(Path::new("/")),
        )),
        Command::Run(r) => {
            let lib = run::find_lib(
                r.lib.as_deref(),
                std::env::var_os("RINGSOCK_LIB"),
                std::env::current_exe().ok(),
            );
            match lib {
                Ok(lib) => run::exec(&lib, r.socket.as_deref(), &r.argv),
                Err(e) => {
                    eprintln!("ringsock-ctl: {e}");
                    1
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::error::ErrorKind;
    use clap::CommandFactory;

    use super::*;

    fn p(args: &[&str]) -> Result<Command, ErrorKind> {
        parse(args.iter().map(OsString::from).collect())
            .map(|c| c.command)
            .map_err(|e| e.kind())
    }

    #[test]
    fn definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn daemon_options() {
        assert_eq!(
            p(&[
                "daemon",
                "--socket",
                "/tmp/s",
                "--offer-timeout-ms=250",
                "--log-level",
                "debug",
                "--foreground"
            ])
            .unwrap(),
            Command::Daemon(DaemonArgs {
                socket: Some("/tmp/s".into()),
                offer_timeout_ms: Some(250),
                log_level: Some("debug".into()),
                foreground: true,
                ..DaemonArgs::default()
            })
        );
        assert_eq!(
            p(&[
                "daemon",
                "--peer-port=7",
                "--foreground",
                "--foreground",
                "--peer-port=0",
                "--peer-timeout-ms",
                "150",
                "--peer-retry-ms=0",
                "--metrics-listen=[::1]:9477"
            ])
            .unwrap(),
            Command::Daemon(DaemonArgs {
                peer_port: Some(0),
                foreground: true,
                peer_timeout_ms: Some(150),
                peer_retry_ms: Some(0),
                metrics_listen: Some("[::1]:9477".parse().unwrap()),
                ..DaemonArgs::default()
            })
        );
        assert_eq!(
            p(&["metrics", "--socket", "/s"]).unwrap(),
            Command::Metrics(MetricsArgs {
                socket: Some("/s".into())
            })
        );
        assert!(p(&["metrics", "extra"]).is_err());
        for bad in [
            &["daemon", "--peer-port", "65536"][..],
            &["daemon", "--peer-timeout-ms", "0"],
            &["daemon", "--peer-timeout-ms", "60001"],
            &["daemon", "--peer-retry-ms", "-1"],
            &["daemon", "--offer-timeout-ms", "0"],
            &["daemon", "--offer-timeout-ms", "abc"],
            &["daemon", "--socket"],
            &["daemon", "--bogus"],
            &["daemon", "extra"],
            &["daemon", "--foreground=yes"],
            &["daemon", "--metrics-listen", "9477"],
            &["daemon", "--metrics-listen", "localhost:9477"],
        ] {
            assert!(p(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn status_options() {
        assert_eq!(
            p(&["status", "--json", "--socket=/x"]).unwrap(),
            Command::Status(StatusArgs {
                json: true,
                socket: Some("/x".into()),
                ..StatusArgs::default()
            })
        );
        assert!(p(&["status", "--json=yes"]).is_err());
        let Command::Status(s) = p(&[
            "status",
            "--port",
            "7209",
            "--transport",
            "rdma",
            "--counter",
            "zc_writes>=1",
            "--counter=zc_bytes>=65536",
            "--expect",
            "transport=rdma,ends>=1",
            "--wait-ms",
            "5000",
        ])
        .unwrap() else {
            panic!("not status")
        };
        assert_eq!(s.port, Some(7209));
        assert_eq!(s.transport, Some(Transport::Rdma));
        assert_eq!(s.counters.len(), 2);
        assert_eq!(s.counters[1].to_string(), "zc_bytes>=65536");
        assert_eq!(s.expect.unwrap().to_string(), "transport=rdma,ends>=1");
        assert_eq!(s.wait_ms, Some(5000));
        for bad in [
            &["status", "--transport", "udp"][..],
            &["status", "--counter", "x"],
            &["status", "--expect", "ends"],
            &["status", "--wait-ms", "5"],
            &["status", "--json", "--count"],
            &["status", "--json", "--expect", "ends=1"],
            &["status", "--from", "f", "--socket", "s"],
            &[
                "status",
                "--from",
                "f",
                "--expect",
                "ends=1",
                "--wait-ms",
                "5",
            ],
        ] {
            assert!(p(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn run_argv() {
        let want = |lib: Option<&str>, argv: &[&str]| {
            Command::Run(RunArgs {
                lib: lib.map(PathBuf::from),
                socket: None,
                argv: argv.iter().map(OsString::from).collect(),
            })
        };
        assert_eq!(
            p(&["run", "--lib", "/l.so", "--", "redis-server", "--port", "7"]).unwrap(),
            want(Some("/l.so"), &["redis-server", "--port", "7"])
        );
        // Without "--", the first non-option starts the command, and its
        // own options are not ours.
        assert_eq!(
            p(&["run", "curl", "--lib", "x"]).unwrap(),
            want(None, &["curl", "--lib", "x"])
        );
        assert_eq!(
            p(&["run", "--", "--weird"]).unwrap(),
            want(None, &["--weird"])
        );
        assert!(p(&["run"]).is_err());
        assert!(p(&["run", "--"]).is_err());
        assert!(p(&["run", "--nope", "x"]).is_err());
    }

    #[test]
    fn misc() {
        assert_eq!(p(&["--version"]).unwrap_err(), ErrorKind::DisplayVersion);
        assert_eq!(p(&["--help"]).unwrap_err(), ErrorKind::DisplayHelp);
        assert_eq!(p(&["help"]).unwrap_err(), ErrorKind::DisplayHelp);
        assert!(p(&["frobnicate"]).is_err());
        assert_eq!(parse_timeout(" 10 "), Some(10));
        assert_eq!(parse_timeout("3600001"), None);
    }
}
