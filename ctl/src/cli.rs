//! Command-line parsing (pure, unit-tested) and dispatch to the commands.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use log::LevelFilter;

use crate::daemon::{self, DaemonConfig};
use crate::peer::{PeerConfig, DEFAULT_PEER_PORT, DEFAULT_PEER_RETRY_MS, DEFAULT_PEER_TIMEOUT_MS};
use crate::{logger, run, status};

/// Default socket when neither `--socket` nor `RINGSOCK_CTL_SOCK` is set.
pub const DEFAULT_SOCKET: &str = "/run/ringsock/ctl.sock";
pub const DEFAULT_OFFER_TIMEOUT_MS: u64 = 10_000;
/// An hour: anything longer is a typo, and would pin descriptors for ages.
pub const MAX_OFFER_TIMEOUT_MS: u64 = 3_600_000;
/// A connect to another host's ctl is never worth waiting longer for.
pub const MAX_PEER_TIMEOUT_MS: u64 = 60_000;

pub const USAGE: &str = "\
usage:
  ringsock-ctl daemon [--socket PATH] [--offer-timeout-ms N] [--log-level L] [--foreground]
                      [--peer-port N] [--peer-timeout-ms N] [--peer-retry-ms N]
  ringsock-ctl status [--json] [--socket PATH]
  ringsock-ctl run [--lib PATH] [--socket PATH] [--] CMD [ARGS...]
  ringsock-ctl help | --help | --version

environment:
  RINGSOCK_CTL_SOCK           control socket (default /run/ringsock/ctl.sock)
  RINGSOCK_OFFER_TIMEOUT_MS   offer lifetime in ms (default 10000)
  RINGSOCK_CTL_PORT           TCP port of the ctls of all hosts (default 7471, 0: off)
  RINGSOCK_PEER_TIMEOUT_MS    bound on a forwarded offer's reply (default 300)
  RINGSOCK_PEER_RETRY_MS      how long an unreachable host stays on TCP (default 30000)
  RINGSOCK_LOG                log level: off, error, warn, info (default), debug, trace
  RINGSOCK_LIB                path of libringsock.so for `run`
";

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DaemonArgs {
    pub socket: Option<PathBuf>,
    pub offer_timeout_ms: Option<u64>,
    pub log_level: Option<String>,
    pub foreground: bool,
    pub peer_port: Option<u16>,
    pub peer_timeout_ms: Option<u64>,
    pub peer_retry_ms: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StatusArgs {
    pub json: bool,
    pub socket: Option<PathBuf>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RunArgs {
    pub lib: Option<PathBuf>,
    pub socket: Option<PathBuf>,
    pub argv: Vec<OsString>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    Daemon(DaemonArgs),
    Status(StatusArgs),
    Run(RunArgs),
    Help,
    Version,
}

/// Splits `--name=value` / `--name value` arguments.
struct Args {
    items: std::vec::IntoIter<OsString>,
}

impl Args {
    fn next(&mut self) -> Option<OsString> {
        self.items.next()
    }

    /// The value of option `name`: inline after '=' or the next argument.
    fn value(&mut self, name: &str, inline: Option<String>) -> Result<OsString, String> {
        match inline {
            Some(v) => Ok(v.into()),
            None => self
                .next()
                .ok_or_else(|| format!("option {name} needs a value")),
        }
    }
}

/// (`--name`, Some(value)) for `--name=value`.
fn split_opt(arg: &OsString) -> Option<(String, Option<String>)> {
    let s = arg.to_str()?;
    if !s.starts_with("--") {
        return None;
    }
    Some(match s.split_once('=') {
        Some((n, v)) => (n.to_owned(), Some(v.to_owned())),
        None => (s.to_owned(), None),
    })
}

fn unknown(cmd: &str, arg: &OsString) -> String {
    format!("{cmd}: unexpected argument {}", arg.to_string_lossy())
}

pub fn parse(argv: Vec<OsString>) -> Result<Command, String> {
    let mut args = Args {
        items: argv.into_iter(),
    };
    let Some(sub) = args.next() else {
        return Ok(Command::Help);
    };
    match sub.to_str() {
        Some("daemon") => parse_daemon(&mut args).map(Command::Daemon),
        Some("status") => parse_status(&mut args).map(Command::Status),
        Some("run") => parse_run(&mut args).map(Command::Run),
        Some("help" | "--help" | "-h") => Ok(Command::Help),
        Some("--version" | "-V") => Ok(Command::Version),
        _ => Err(format!("unknown command {}", sub.to_string_lossy())),
    }
}

fn parse_daemon(args: &mut Args) -> Result<DaemonArgs, String> {
    let mut d = DaemonArgs::default();
    while let Some(arg) = args.next() {
        let Some((name, inline)) = split_opt(&arg) else {
            return Err(unknown("daemon", &arg));
        };
        match name.as_str() {
            "--socket" => d.socket = Some(args.value(&name, inline)?.into()),
            "--offer-timeout-ms" => {
                let v = args.value(&name, inline)?;
                d.offer_timeout_ms =
                    Some(parse_timeout(&v.to_string_lossy()).ok_or_else(|| {
                        format!(
                            "--offer-timeout-ms: expected 1..={MAX_OFFER_TIMEOUT_MS}, got {}",
                            v.to_string_lossy()
                        )
                    })?);
            }
            "--log-level" => {
                d.log_level = Some(args.value(&name, inline)?.to_string_lossy().into_owned())
            }
            "--foreground" if inline.is_none() => d.foreground = true,
            "--peer-port" => {
                let v = args.value(&name, inline)?.to_string_lossy().into_owned();
                d.peer_port = Some(
                    parse_port(&v)
                        .ok_or_else(|| format!("--peer-port: expected 0..=65535, got {v}"))?,
                );
            }
            "--peer-timeout-ms" => {
                let v = args.value(&name, inline)?.to_string_lossy().into_owned();
                d.peer_timeout_ms = Some(parse_peer_timeout(&v).ok_or_else(|| {
                    format!("--peer-timeout-ms: expected 1..={MAX_PEER_TIMEOUT_MS}, got {v}")
                })?);
            }
            "--peer-retry-ms" => {
                let v = args.value(&name, inline)?.to_string_lossy().into_owned();
                d.peer_retry_ms = Some(parse_retry(&v).ok_or_else(|| {
                    format!("--peer-retry-ms: expected 0..={MAX_OFFER_TIMEOUT_MS}, got {v}")
                })?);
            }
            _ => return Err(unknown("daemon", &arg)),
        }
    }
    Ok(d)
}

fn parse_status(args: &mut Args) -> Result<StatusArgs, String> {
    let mut s = StatusArgs::default();
    while let Some(arg) = args.next() {
        let Some((name, inline)) = split_opt(&arg) else {
            return Err(unknown("status", &arg));
        };
        match name.as_str() {
            "--json" if inline.is_none() => s.json = true,
            "--socket" => s.socket = Some(args.value(&name, inline)?.into()),
            _ => return Err(unknown("status", &arg)),
        }
    }
    Ok(s)
}

fn parse_run(args: &mut Args) -> Result<RunArgs, String> {
    let mut r = RunArgs::default();
    while let Some(arg) = args.next() {
        if arg == "--" {
            break;
        }
        match split_opt(&arg) {
            Some((name, inline)) if name == "--lib" => {
                r.lib = Some(args.value(&name, inline)?.into())
            }
            Some((name, inline)) if name == "--socket" => {
                r.socket = Some(args.value(&name, inline)?.into())
            }
            Some(_) => return Err(unknown("run", &arg)),
            // The command itself: everything from here on is its argv.
            None => {
                r.argv.push(arg);
                break;
            }
        }
    }
    r.argv.extend(args.items.by_ref());
    if r.argv.is_empty() {
        return Err("run: no command given".into());
    }
    Ok(r)
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

/// Entry point; returns the process exit code.
pub fn main(argv: Vec<OsString>) -> i32 {
    let cmd = match parse(argv) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("ringsock-ctl: {e}\n\n{USAGE}");
            return 2;
        }
    };
    match cmd {
        Command::Help => {
            print!("{USAGE}");
            0
        }
        Command::Version => {
            println!("ringsock-ctl {}", env!("CARGO_PKG_VERSION"));
            0
        }
        Command::Daemon(d) => {
            logger::init(log_level(d.log_level.as_deref()));
            let cfg = DaemonConfig {
                peer: peer_config(&d),
                socket: socket_path(d.socket),
                offer_timeout: offer_timeout(d.offer_timeout_ms),
                foreground: d.foreground,
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
        Command::Status(s) => status::run(&socket_path(s.socket), s.json),
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
    use super::*;

    fn p(args: &[&str]) -> Result<Command, String> {
        parse(args.iter().map(OsString::from).collect())
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
            ]),
            Ok(Command::Daemon(DaemonArgs {
                socket: Some("/tmp/s".into()),
                offer_timeout_ms: Some(250),
                log_level: Some("debug".into()),
                foreground: true,
                ..DaemonArgs::default()
            }))
        );
        assert_eq!(
            p(&[
                "daemon",
                "--peer-port=0",
                "--peer-timeout-ms",
                "150",
                "--peer-retry-ms=0"
            ]),
            Ok(Command::Daemon(DaemonArgs {
                peer_port: Some(0),
                peer_timeout_ms: Some(150),
                peer_retry_ms: Some(0),
                ..DaemonArgs::default()
            }))
        );
        assert!(p(&["daemon", "--peer-port", "65536"]).is_err());
        assert!(p(&["daemon", "--peer-timeout-ms", "0"]).is_err());
        assert!(p(&["daemon", "--peer-timeout-ms", "60001"]).is_err());
        assert!(p(&["daemon", "--peer-retry-ms", "-1"]).is_err());
        assert!(p(&["daemon", "--offer-timeout-ms", "0"]).is_err());
        assert!(p(&["daemon", "--offer-timeout-ms", "abc"]).is_err());
        assert!(p(&["daemon", "--socket"]).is_err());
        assert!(p(&["daemon", "--bogus"]).is_err());
        assert!(p(&["daemon", "extra"]).is_err());
    }

    #[test]
    fn status_options() {
        assert_eq!(
            p(&["status", "--json", "--socket=/x"]),
            Ok(Command::Status(StatusArgs {
                json: true,
                socket: Some("/x".into())
            }))
        );
        assert!(p(&["status", "--json=yes"]).is_err());
    }

    #[test]
    fn run_argv() {
        let want = |lib: Option<&str>, argv: &[&str]| {
            Ok(Command::Run(RunArgs {
                lib: lib.map(PathBuf::from),
                socket: None,
                argv: argv.iter().map(OsString::from).collect(),
            }))
        };
        assert_eq!(
            p(&["run", "--lib", "/l.so", "--", "redis-server", "--port", "7"]),
            want(Some("/l.so"), &["redis-server", "--port", "7"])
        );
        // Without "--", the first non-option starts the command, and its
        // own options are not ours.
        assert_eq!(
            p(&["run", "curl", "--lib", "x"]),
            want(None, &["curl", "--lib", "x"])
        );
        assert_eq!(p(&["run", "--", "--weird"]), want(None, &["--weird"]));
        assert!(p(&["run"]).is_err());
        assert!(p(&["run", "--"]).is_err());
        assert!(p(&["run", "--nope", "x"]).is_err());
    }

    #[test]
    fn misc() {
        assert_eq!(p(&[]), Ok(Command::Help));
        assert_eq!(p(&["--version"]), Ok(Command::Version));
        assert!(p(&["frobnicate"]).is_err());
        assert_eq!(parse_timeout(" 10 "), Some(10));
        assert_eq!(parse_timeout("3600001"), None);
    }
}
