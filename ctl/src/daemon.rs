//! `ringsock-ctl daemon`: claims the socket path (one daemon per path),
//! starts the server, and removes the socket file on a clean exit.
//!
//! Single-instance rule: an flock on `<socket>.lock` decides who owns the
//! path, so two daemons started at once cannot both "remove the stale
//! socket" and bind. The lock file is never deleted (deleting it would let
//! a third daemon lock a fresh inode while the second holds the old one).
//! A socket file that no daemon answers is stale and replaced; a live one
//! makes us refuse to start.

use std::fs::{self, DirBuilder, File};
use std::io;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::OwnedFd;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use log::{info, warn};
use ringsock_proto::io as pio;

use crate::handler::Handler;
use crate::hostid::host_id;
use crate::peer::PeerConfig;
use crate::proof::SysEnv;
use crate::registry::Limits;
use crate::ring::AnyRingStats;
use crate::server::Server;
use crate::sys;

/// Options of `ringsock-ctl daemon`, resolved from flags and environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DaemonConfig {
    pub socket: PathBuf,
    pub offer_timeout: Duration,
    pub foreground: bool,
    /// ctl-to-ctl TCP (port 0: off).
    pub peer: PeerConfig,
    /// Where `GET /metrics` is served over HTTP (None: off).
    pub metrics_listen: Option<SocketAddr>,
}

/// Why the daemon did not start (exit code 1).
#[derive(Debug)]
pub enum StartError {
    /// To be printed as one clear line.
    Message(String),
    /// A detached daemon's parent already printed it.
    Reported,
}

fn fail<T>(msg: String) -> Result<T, StartError> {
    Err(StartError::Message(msg))
}

fn lock_path(socket: &Path) -> PathBuf {
    let mut p = socket.as_os_str().to_owned();
    p.push(".lock");
    PathBuf::from(p)
}

/// Creates the socket's directory (0755) if missing.
fn make_dir(socket: &Path) -> Result<(), StartError> {
    match socket.parent() {
        Some(dir) if !dir.as_os_str().is_empty() && !dir.exists() => DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(dir)
            .or_else(|e| fail(format!("cannot create {}: {e}", dir.display()))),
        _ => Ok(()),
    }
}

/// Takes the instance lock; the returned file must live as long as the
/// daemon.
fn take_lock(socket: &Path) -> Result<File, StartError> {
    let path = lock_path(socket);
    let file = File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o644)
        .custom_flags(libc::O_CLOEXEC)
        .open(&path)
        .or_else(|e| fail(format!("cannot open lock file {}: {e}", path.display())))?;
    match sys::try_lock(&file) {
        Ok(true) => Ok(file),
        Ok(false) => fail(format!(
            "another ringsock-ctl daemon is already running on {} (it holds {})",
            socket.display(),
            path.display()
        )),
        Err(e) => fail(format!("cannot lock {}: {e}", path.display())),
    }
}

/// Removes a stale socket file; refuses when a daemon answers on it or the
/// path is something other than a socket.
fn clear_stale(socket: &Path) -> Result<(), StartError> {
    let meta = match fs::symlink_metadata(socket) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return fail(format!("cannot inspect {}: {e}", socket.display())),
    };
    if !meta.file_type().is_socket() {
        return fail(format!(
            "{} exists and is not a socket; not replacing it",
            socket.display()
        ));
    }
    match pio::connect_unix(socket) {
        Ok(_) => fail(format!(
            "a ringsock-ctl daemon is already answering on {}",
            socket.display()
        )),
        Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED) => {
            fs::remove_file(socket)
                .or_else(|e| fail(format!("cannot remove stale {}: {e}", socket.display())))?;
            info!("removed stale socket {}", socket.display());
            Ok(())
        }
        Err(e) => fail(format!("cannot probe {}: {e}", socket.display())),
    }
}

/// What the daemon holds once it claimed its addresses.
struct Held {
    _lock: File,
    listener: OwnedFd,
    metrics: Option<TcpListener>,
}

/// Everything that can fail in a way the user must hear about: directory,
/// instance lock, stale socket, listening socket, the metrics address (a
/// port asked for explicitly that cannot be had is an error).
fn claim_socket(cfg: &DaemonConfig) -> Result<Held, StartError> {
    make_dir(&cfg.socket)?;
    let lock = take_lock(&cfg.socket)?;
    clear_stale(&cfg.socket)?;
    let metrics = match cfg.metrics_listen {
        Some(addr) => Some(
            TcpListener::bind(addr)
                .or_else(|e| fail(format!("cannot listen for metrics on {addr}: {e}")))?,
        ),
        None => None,
    };
    let listener = sys::listen_unix(&cfg.socket, libc::SOMAXCONN)
        .or_else(|e| fail(format!("cannot listen on {}: {e}", cfg.socket.display())))?;
    Ok(Held {
        _lock: lock,
        listener,
        metrics,
    })
}

/// Runs the daemon until SIGTERM/SIGINT (in the background unless
/// `foreground`: then this returns in the parent only on failure).
pub fn run(cfg: &DaemonConfig) -> Result<(), StartError> {
    // From the moment the socket answers, SIGTERM and SIGINT must end the
    // daemon through its loop (which removes the socket file), not by
    // their default action: they stay pending until the loop's signalfd.
    sys::block_signals(&[libc::SIGTERM, libc::SIGINT])
        .or_else(|e| fail(format!("cannot block SIGTERM/SIGINT: {e}")))?;
    let held = if cfg.foreground {
        claim_socket(cfg)?
    } else {
        let ready = sys::detach().or_else(|e| fail(format!("cannot detach: {e}")))?;
        match claim_socket(cfg).and_then(|held| {
            sys::quiet_stdio()
                .map(|()| held)
                .or_else(|e| fail(format!("cannot redirect stdio: {e}")))
        }) {
            Ok(held) => {
                ready.ready();
                held
            }
            Err(StartError::Message(m)) => {
                ready.failed(&m);
                return Err(StartError::Reported);
            }
            Err(StartError::Reported) => return Err(StartError::Reported),
        }
    };
    if let Some(l) = held.metrics.as_ref() {
        let addr = l
            .local_addr()
            .map_or_else(|e| e.to_string(), |a| a.to_string());
        let copy = l
            .try_clone()
            .or_else(|e| fail(format!("cannot use the metrics listener: {e}")))?;
        // A thread of its own (after any detach: threads do not survive a
        // fork); it asks the daemon through the control socket.
        crate::metrics::http::spawn(copy, cfg.socket.clone())
            .or_else(|e| fail(format!("cannot start the metrics thread: {e}")))?;
        info!("metrics on http://{addr}/metrics");
    }
    serve(cfg, held.listener)
}

fn serve(cfg: &DaemonConfig, listener: OwnedFd) -> Result<(), StartError> {
    // Budget descriptors: half for held relays and rings, a quarter for
    // sessions, the rest for proofs in flight and the daemon itself.
    let nofile = sys::raise_nofile_limit().min(1 << 20) as usize;
    let limits = Limits {
        offer_timeout: cfg.offer_timeout,
        max_held_fds: (nofile / 2).max(16),
        ..Limits::default()
    };
    let max_sessions = (nofile / 4).max(4);
    let mut env = SysEnv::new(Box::new(AnyRingStats));
    let table = match crate::offer_table::OfferTableFd::create() {
        Ok((fd, table)) => {
            env = env.with_offer_table(fd);
            Some(table)
        }
        Err(e) => {
            warn!("cannot make the offer table ({e}): every accept asks the daemon");
            None
        }
    };
    let mut handler = Handler::new(env, limits, host_id());
    if let Some(t) = table {
        handler.share_offers(t);
    }
    // The inter-host path is optional: a port that cannot be had costs
    // incoming offers from other hosts, never the local service.
    let peer_listener = match cfg.peer.port {
        0 => None,
        port => match sys::listen_tcp(port, libc::SOMAXCONN) {
            Ok(l) => Some(l),
            Err(e) => {
                warn!("cannot listen on TCP port {port} for other hosts' ctls: {e}; offers from other hosts will not reach this one");
                None
            }
        },
    };
    let peers = match (cfg.peer.port, peer_listener.is_some()) {
        (0, _) => "inter-host offers off".to_owned(),
        (p, true) => format!(
            "peers on TCP port {p}, peer timeout {} ms, retry {} ms",
            cfg.peer.timeout.as_millis(),
            cfg.peer.retry.as_millis()
        ),
        (p, false) => format!("peers: outgoing only (port {p})"),
    };
    let result = Server::new(listener, handler, max_sessions, cfg.peer, peer_listener).and_then(
        |mut server| {
            info!(
                "listening on {} (offer timeout {} ms, {peers}, pid {})",
                cfg.socket.display(),
                cfg.offer_timeout.as_millis(),
                std::process::id()
            );
            server.run()
        },
    );
    if let Err(e) = fs::remove_file(&cfg.socket) {
        warn!("cannot remove {}: {e}", cfg.socket.display());
    }
    result.or_else(|e| fail(format!("event loop failed: {e}")))
}
