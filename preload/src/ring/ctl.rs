//! This process's session with the local `ringsock-ctl` daemon.
//!
//! One SOCK_SEQPACKET session per process, opened lazily on the first
//! connect/accept/listen that needs it, with send/receive timeouts of
//! RINGSOCK_CONNECT_TIMEOUT_MS so a stuck daemon can only delay a connect,
//! never hang it. Without a daemon every connection stays plain TCP; a
//! failed attempt is not retried for `RETRY_NS`, so a host without a daemon
//! pays one failed connect(2) per second at most. A daemon that restarts is
//! picked up by the next attempt, and the listeners this process registered
//! are registered again (the new daemon knows nothing of them).
//!
//! After a fork the child must not speak on its parent's session (replies
//! would go to whichever process reads first): the session is keyed by pid
//! and a child opens its own, registering the listeners it inherited.

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};
use std::time::Duration;

use ringsock_proto::offers::{self, Table};
use ringsock_proto::{Client, Fds, Msg};

use crate::plock::{PGuard, PLock};
use crate::{config, process, sys};

/// Pause between attempts to reach an absent daemon.
const RETRY_NS: u64 = 1_000_000_000;

/// A listening socket this process registered, to re-register after a
/// daemon restart or in a forked child. Only the program's fd number is
/// kept (a copy of the socket would keep it open after the program closed
/// it); the daemon re-checks the proof, so a number that was closed and
/// reused for something else is simply refused and forgotten.
struct Listener {
    fd: RawFd,
    addr: SocketAddr,
}

struct Session {
    pid: libc::pid_t,
    client: Option<Client>,
    retry_at: u64,
    listeners: Vec<Listener>,
    /// Listeners must be (re)sent on the current session.
    listeners_stale: bool,
    /// Replies still to be read for requests sent with `send_only`.
    owed: u32,
    scratch: Vec<u8>,
    /// Sessions opened so far: a new one means a daemon that may not know
    /// this process's connections (see `background::reports::resend`).
    opened: u64,
}

const FRESH: Session = Session {
    pid: 0,
    client: None,
    retry_at: 0,
    listeners: Vec::new(),
    listeners_stale: false,
    owed: 0,
    scratch: Vec::new(),
    opened: 0,
};

fn fresh() -> Session {
    FRESH
}

static SESSION: PLock<Session> = PLock::new(FRESH, fresh);

/// Why a request could not be answered.
#[derive(Debug)]
pub enum CtlError {
    /// No daemon (or not reachable right now).
    Unavailable,
    /// The session broke during the call (timeout, daemon exit, garbage).
    Broken,
}

fn exe_name() -> String {
    std::fs::read_link("/proc/self/exe")
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default()
}

impl Session {
    /// A usable client, connecting (and re-registering listeners) if needed.
    fn client(&mut self) -> Result<&mut Client, CtlError> {
        let me = process::pid();
        if self.pid != me {
            // A forked child: the inherited session belongs to the parent.
            // Dropping our copy of its fd does not close the parent's.
            self.client = None;
            self.owed = 0;
            self.pid = me;
            self.retry_at = 0;
            self.listeners_stale = true;
        }
        if self.client.is_none() {
            let now = sys::monotonic_ns();
            if now < self.retry_at {
                return Err(CtlError::Unavailable);
            }
            let cfg = config::get();
            let timeout = Duration::from_millis(u64::from(cfg.connect_timeout_ms));
            let path = Path::new(&cfg.ctl_sock);
            let connected = Client::connect(path, Some(timeout)).and_then(|c| {
                let mut c = Client::from_fd(crate::fdspace::high_owned(c.into_fd()));
                let (_, _, table) = c.hello_with_offers(&exe_name())?;
                if let Some(t) = table {
                    map_offer_table(t);
                }
                Ok(c)
            });
            match connected {
                Ok(c) => {
                    log::debug!("ctl session open on {}", path.display());
                    crate::fdspace::set_mover(c.as_raw_fd(), move_session);
                    self.client = Some(c);
                    self.listeners_stale = true;
                    self.opened += 1;
                }
                Err(e) => {
                    log::debug!("no ctl daemon at {}: {e}", path.display());
                    self.retry_at = now + RETRY_NS;
                    return Err(CtlError::Unavailable);
                }
            }
        }
        if self.listeners_stale {
            self.listeners_stale = false;
            self.register_all();
        }
        self.client.as_mut().ok_or(CtlError::Unavailable)
    }

    fn register_all(&mut self) {
        let mut i = 0;
        while i < self.listeners.len() {
            let (sock, addr) = (self.listeners[i].fd, self.listeners[i].addr);
            if !still_listens(sock, addr) {
                // The program moved the listener to another number (php-fpm
                // dup2s it for its workers) and closed this one: sent as a
                // proof, the number would fail the whole session (EBADF).
                log::debug!("listener {addr}: fd {sock} no longer holds it; not registered again");
                self.listeners.swap_remove(i);
                continue;
            }
            match self.raw_call(&Msg::ListenerAdd { addr }, &[sock]) {
                Ok(Msg::Ok) => i += 1,
                Ok(other) => {
                    log::info!("listener {addr} not registered: {other:?}");
                    self.listeners.swap_remove(i);
                }
                Err(_) => return,
            }
        }
    }

    fn raw_call(&mut self, msg: &Msg, fds: &[RawFd]) -> Result<Msg, CtlError> {
        Ok(self.raw_call_fds(msg, fds)?.0)
    }

    fn raw_call_fds(&mut self, msg: &Msg, fds: &[RawFd]) -> Result<(Msg, Fds), CtlError> {
        self.settle_owed()?;
        let Some(c) = self.client.as_mut() else {
            return Err(CtlError::Unavailable);
        };
        match c.call(msg, fds) {
            Ok(r) => Ok(r),
            Err(e) => Err(self.lost(&e.to_string())),
        }
    }

    fn lost(&mut self, why: &str) -> CtlError {
        log::warn!("ctl session lost: {why}; connections stay on TCP until it is back");
        self.client = None;
        self.owed = 0;
        self.retry_at = sys::monotonic_ns() + RETRY_NS;
        CtlError::Broken
    }

    /// Reads the replies of requests sent with `send_only` (the daemon
    /// answers every request, in order).
    fn settle_owed(&mut self) -> Result<(), CtlError> {
        while self.owed > 0 {
            let Some(c) = self.client.as_ref() else {
                self.owed = 0;
                return Err(CtlError::Unavailable);
            };
            let sock = c.as_raw_fd();
            if self.scratch.len() < ringsock_proto::MAX_FRAME_TOTAL {
                self.scratch = vec![0; ringsock_proto::MAX_FRAME_TOTAL];
            }
            match ringsock_proto::client::recv_msg(sock, &mut self.scratch) {
                Ok((Msg::Ok, _)) => self.owed -= 1,
                Ok((other, _)) => {
                    // Only an answer read after its offer was gone: it
                    // expired, or its client's session ended first (the
                    // client took the ring from the segment, finished
                    // and exited). The segment's state word decided
                    // already, so nothing is wrong.
                    log::debug!("ctl: a request sent ahead was refused: {other:?}");
                    self.owed -= 1;
                }
                Err(e) => return Err(self.lost(&e.to_string())),
            }
        }
        Ok(())
    }

    fn send_only(&mut self, msg: &Msg, fds: &[RawFd]) -> Result<(), CtlError> {
        let Some(c) = self.client.as_ref() else {
            return Err(CtlError::Unavailable);
        };
        match ringsock_proto::client::send_msg(c.as_raw_fd(), msg, fds) {
            Ok(()) => {
                self.owed += 1;
                Ok(())
            }
            Err(e) => Err(self.lost(&e.to_string())),
        }
    }
}

/// Whether `fd` is still a listening socket bound to `addr`: a number the
/// program closed, or reused for something else, is no proof of a listener.
fn still_listens(fd: RawFd, addr: SocketAddr) -> bool {
    crate::sys::getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_ACCEPTCONN).is_some_and(|on| on != 0)
        && crate::sockaddr::query(fd, false) == Some(addr)
}

/// The daemon's offer table, mapped read-only (null before a session gave
/// one). A mapping is never unmapped: a reader may hold it, and a table
/// from a restarted daemon replaces it here (the old one is a few pages).
static OFFER_TABLE: AtomicPtr<AtomicU64> = AtomicPtr::new(std::ptr::null_mut());
/// The inode of the memfd behind `OFFER_TABLE`: a forked child's session
/// gets the table its parent mapped, and keeps the inherited mapping.
static OFFER_TABLE_INODE: AtomicU64 = AtomicU64::new(0);

fn map_offer_table(fd: OwnedFd) {
    let (inode, size) = crate::sys::inode_and_size(fd.as_raw_fd()).unwrap_or((0, 0));
    if size < offers::BYTES as u64 {
        // Another version's table, or not one at all: reading past its end
        // would raise SIGBUS.
        log::debug!(
            "the daemon's offer table is {size} bytes, not {}: every accept asks the daemon",
            offers::BYTES
        );
        return;
    }
    if inode != 0
        && inode == OFFER_TABLE_INODE.load(Ordering::Relaxed)
        && !OFFER_TABLE.load(Ordering::Acquire).is_null()
    {
        return;
    }
    // SAFETY: a shared read-only mapping of the daemon's sealed memfd, at
    // least BYTES long (its size cannot shrink under us: F_SEAL_SHRINK);
    // the result is checked.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            offers::BYTES,
            libc::PROT_READ,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        log::debug!("cannot map the daemon's offer table: every accept asks the daemon");
        return;
    }
    OFFER_TABLE_INODE.store(inode, Ordering::Relaxed);
    OFFER_TABLE.store(p.cast(), Ordering::Release);
}

/// The daemon's offer table, once a session mapped it.
fn offer_table() -> Option<Table<'static>> {
    let p = OFFER_TABLE.load(Ordering::Acquire);
    if p.is_null() {
        return None;
    }
    // SAFETY: a live mapping of offers::BYTES bytes (never unmapped), read
    // only through atomics; the daemon alone writes it.
    let words = unsafe { std::slice::from_raw_parts(p.cast_const(), offers::WORDS) };
    Table::new(words)
}

/// Whether the daemon may hold an offer for a connection from `client` to
/// `server` (an accepted socket's peer and local address): false only
/// when its offer table says no, so the accept needs no round trip.
#[cfg(feature = "verbs")]
pub fn offer_may_exist(client: SocketAddr, server: SocketAddr) -> bool {
    // A client that bound the wildcard address offered from it.
    offer_table().is_none_or(|t| t.may_have_offer(&client, &server))
}

/// Whether a listener of this host, in another network namespace, takes
/// connections to `server` (an address this namespace does not have): the
/// offer table lists it (`offers::served_key`). Opens the session (whose
/// hello maps the table) if there is none yet; without a daemon or a
/// table, no. A table that overflowed says yes, and the daemon decides.
pub fn served_here(server: SocketAddr) -> bool {
    if OFFER_TABLE.load(Ordering::Acquire).is_null() {
        let _ = open_session();
    }
    offer_table().is_some_and(|t| t.may_have(&offers::served_key(&server)))
}

/// Whether an accepted connection from `client` to `server` may come with
/// an offer: `offer_may_exist`, or the table says that connections to
/// `server` may come translated (DNAT) from an address a client offered
/// for (`offers::target_key`). One look at the table for both.
pub fn accepted_offer_may_exist(client: SocketAddr, server: SocketAddr) -> bool {
    offer_table().is_none_or(|t| t.may_have_offer_or_target(&client, &server))
}

/// `accepted_offer_may_exist` for a peer that is not an address of this
/// namespace (a client of another namespace, `served_here`, or of another
/// host): no when there is no table.
pub fn offer_listed(client: SocketAddr, server: SocketAddr) -> bool {
    offer_table().is_some_and(|t| t.may_have_offer_or_target(&client, &server))
}

/// Sends a request whose reply (`Ok`, or an error that is only logged) is
/// read before the next call's: saves a round trip where nothing depends
/// on the answer.
pub fn send_only(msg: &Msg) -> Result<(), CtlError> {
    let mut s = SESSION.lock();
    if s.pid != process::pid() || s.client.is_none() {
        return Err(CtlError::Unavailable);
    }
    s.send_only(msg, &[])
}

/// This process's open session, held for requests sent ahead (`send`)
/// by a caller that must not wait on anyone.
pub struct Ahead(PGuard<'static, Session>);

impl Ahead {
    /// Sends `msg` (and `fds`) without waiting for the reply, which is
    /// read before the next call's (as `send_only`).
    pub fn send(&mut self, msg: &Msg, fds: &[RawFd]) -> Result<(), CtlError> {
        self.0.send_only(msg, fds)
    }

    /// The session's number (see `current_session`).
    pub fn session(&self) -> u64 {
        self.0.opened
    }
}

/// The session, if it is open in this process and free right now: None
/// while another call holds it (or this very thread does, interrupted by
/// a signal) and where only a call could open it.
pub fn try_ahead() -> Option<Ahead> {
    let s = SESSION.try_lock()?;
    (s.pid == process::pid() && s.client.is_some()).then_some(Ahead(s))
}

/// One request/reply with the daemon.
pub fn call(msg: &Msg, fds: &[RawFd]) -> Result<(Msg, Fds), CtlError> {
    let mut s = SESSION.lock();
    s.client()?;
    s.raw_call_fds(msg, fds)
}

/// Moves the session's socket from `fd` to another number of ours (the
/// program dup2s onto `fd`). Every use of the socket is under the session
/// lock but the background thread's poll, which only waits on it: a poll
/// that still watches the old number wakes at most spuriously. The old
/// descriptor is left open for the program's dup2 to replace.
fn move_session(fd: RawFd) -> bool {
    let mut s = SESSION.lock();
    let Some(c) = s.client.as_mut().filter(|c| c.as_raw_fd() == fd) else {
        return false;
    };
    let Ok(new) = crate::fdspace::dup_high(fd) else {
        return false;
    };
    // SAFETY: dup_high just gave us this descriptor.
    let new = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(new) };
    let old = std::mem::replace(c, Client::from_fd(new));
    let old = std::os::fd::IntoRawFd::into_raw_fd(old.into_fd());
    crate::fdspace::disown(old);
    crate::fdspace::set_mover(c.as_raw_fd(), move_session);
    true
}

/// The session's descriptor, for the background thread to watch.
pub fn session_fd() -> Option<RawFd> {
    let s = SESSION.lock();
    if s.pid != process::pid() {
        return None;
    }
    s.client.as_ref().map(|c| c.as_raw_fd())
}

/// Called when the session has news outside a call: reads replies sent
/// ahead; a session the daemon closed is dropped and, if this process has
/// listeners, reopened (the registrations are then made again) as soon as
/// a daemon answers.
pub fn tend(reports: bool) {
    let mut s = SESSION.lock();
    if s.pid != process::pid() {
        return;
    }
    if let Some(c) = s.client.as_ref() {
        let fd = c.as_raw_fd();
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN | libc::POLLRDHUP,
            revents: 0,
        };
        // SAFETY: one valid pollfd, no wait.
        unsafe { libc::poll(&mut p, 1, 0) };
        if p.revents & (libc::POLLHUP | libc::POLLRDHUP | libc::POLLERR) != 0 {
            let _ = s.lost("the daemon closed the session");
        } else if p.revents & libc::POLLIN != 0 {
            if s.owed > 0 {
                let _ = s.settle_owed();
            } else {
                // The daemon never speaks unasked.
                let _ = s.lost("unexpected data from the daemon");
            }
        }
    }
    if s.client.is_none() && (!s.listeners.is_empty() || reports) {
        let _ = s.client();
    }
}

/// Whether this process would like to hear when a daemon is back: it has
/// listeners to register, or (`reports`) connections to report again.
pub fn wants_session(reports: bool) -> bool {
    let s = SESSION.lock();
    s.pid == process::pid() && s.client.is_none() && (!s.listeners.is_empty() || reports)
}

/// Opens a session if there is none (and a daemon answers); its number.
pub fn open_session() -> Option<u64> {
    let mut s = SESSION.lock();
    s.client().ok()?;
    Some(s.opened)
}

/// The current session's number (sessions opened so far in this
/// process), or None while there is no session.
pub fn current_session() -> Option<u64> {
    let s = SESSION.lock();
    (s.pid == process::pid() && s.client.is_some()).then_some(s.opened)
}

/// Registers listening socket `fd` bound to `addr`, now and after every
/// reconnect. Quietly does nothing without a daemon (the registration is
/// made when one appears).
pub fn add_listener(fd: RawFd, addr: SocketAddr) {
    let mut s = SESSION.lock();
    s.listeners.retain(|l| l.fd != fd);
    s.listeners.push(Listener { fd, addr });
    let fresh_session = s.client.is_none() || s.pid != process::pid();
    // Opening a session registers every listener, this one included.
    if s.client().is_ok() && !fresh_session {
        match s.raw_call(&Msg::ListenerAdd { addr }, &[fd]) {
            Ok(Msg::Ok) => log::debug!("listener {addr} registered"),
            Ok(other) => log::info!("listener {addr} not registered: {other:?}"),
            Err(_) => {}
        }
    }
}

/// The program closed the last fd of listening socket `addr` in this
/// process: connections to it must no longer be offered a ring on its
/// behalf.
pub fn forget_listener(addr: SocketAddr) {
    let mut s = SESSION.lock();
    let before = s.listeners.len();
    s.listeners.retain(|l| l.addr != addr);
    if s.listeners.len() != before && s.pid == process::pid() && s.client.is_some() {
        let _ = s.raw_call(&Msg::ListenerRemove { addr }, &[]);
    }
}
