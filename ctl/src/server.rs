//! The event loop: one thread, epoll over the listening socket, a signalfd
//! and every session; non-blocking throughout.
//!
//! Each readable session yields at most a few datagrams per wakeup
//! (fairness), each is handled and its reply queued. While a session has
//! unsent replies it is not read from (backpressure: a process that never
//! reads its replies stops being served instead of growing our memory).
//! Any protocol fault or I/O error closes that one session; nothing a
//! session sends can stop the loop.
//!
//! Between hosts: an offer for a server elsewhere is forwarded over a
//! cached TCP connection to that host's ctl (non-blocking connect); the
//! offering session is not read from until the other ctl answers or the
//! peer timeout fires, so its one reply stays in order and bounded in
//! time. Hosts that fail are remembered for the retry interval. The other
//! ctl's later news (claimed, answered, declined, expired) settles the
//! local record that the offering process collects.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::fs::File;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use log::{debug, error, info, warn};
use ringsock_proto::addr::canonical;
use ringsock_proto::{frame, io as pio, Error, Msg, RefuseReason, MAX_FDS, MAX_FRAME_TOTAL};

use crate::handler::{millis, Forward, Handler, Reply};
use crate::peer::{NegativeCache, PeerConfig, PeerConn, ReadOutcome, Role};
use crate::proof::SysEnv;
use crate::registry::{Cred, OfferId, OfferState, Outcome, PeerEvent, SessionId};
use crate::sys::{self, Epoll, SignalFd};

const TOKEN_LISTENER: u64 = 0;
const TOKEN_SIGNAL: u64 = 1;
const TOKEN_PEER_LISTENER: u64 = 2;
const FIRST_SESSION: SessionId = 16;
/// Reason given to the offering process when the connection to the
/// server host's ctl breaks before that ctl decided.
pub const PEER_LOST: &str = "connection to the server host's ctl was lost";

/// Datagrams read from one session per wakeup before serving others.
const FRAMES_PER_WAKEUP: usize = 16;
/// Unsent reply bytes a session may have queued before it is closed.
pub const MAX_BUFFERED: usize = 64 * 1024;

const EV_READ: u32 = (libc::EPOLLIN | libc::EPOLLRDHUP) as u32;
const EV_WRITE: u32 = libc::EPOLLOUT as u32;

/// A reply on its way out, holding the descriptors it relays.
struct Outgoing {
    frame: Vec<u8>,
    fds: Vec<OwnedFd>,
}

struct Conn {
    sock: OwnedFd,
    pid: u32,
    out: VecDeque<Outgoing>,
    out_bytes: usize,
    /// Registered for EPOLLOUT (and not EPOLLIN) because `out` is non-empty.
    writing: bool,
    /// Waiting for another host's ctl to answer its offer: not read from.
    parked: bool,
    /// The epoll interest currently registered.
    interest: u32,
}

/// A forwarded offer whose reply the offering session is waiting for.
struct Pending {
    session: SessionId,
    peer: SessionId,
    deadline: Instant,
}

pub struct Server {
    epoll: Epoll,
    listener: OwnedFd,
    signals: SignalFd,
    handler: Handler<SysEnv>,
    conns: HashMap<SessionId, Conn>,
    next_id: SessionId,
    max_sessions: usize,
    rbuf: Vec<u8>,
    /// A descriptor kept in reserve: when accept fails with EMFILE it is
    /// released to accept-and-close the pending connection, instead of
    /// spinning on a listener that stays readable.
    spare: Option<File>,
    peer_cfg: PeerConfig,
    peer_listener: Option<OwnedFd>,
    /// ctl-to-ctl connections, by session id (also their epoll token).
    peers: HashMap<SessionId, PeerConn>,
    /// The connection we opened to each remote host.
    hosts: HashMap<IpAddr, SessionId>,
    down: NegativeCache,
    /// Forwarded offers waiting for RemoteOfferOk / RemoteRefused.
    pending: HashMap<OfferId, Pending>,
    pending_deadlines: BTreeSet<(Instant, OfferId)>,
    /// Forwarded offers registered remotely, by the connection carrying
    /// them, both ways.
    forwarded: HashMap<OfferId, SessionId>,
    carried: HashMap<SessionId, HashSet<OfferId>>,
}

/// What an offering process gets when the server host's ctl cannot be
/// asked: the same as "no shimmed listener", so it stays on TCP quietly.
fn unreachable() -> Msg {
    Msg::OfferRefused {
        reason: RefuseReason::NoListener,
    }
}

fn spare_fd() -> Option<File> {
    File::open("/dev/null").ok()
}

impl Server {
    /// `peer_listener`: the TCP socket other hosts' ctls connect to (None
    /// when the inter-host path is off or only outgoing).
    pub fn new(
        listener: OwnedFd,
        handler: Handler<SysEnv>,
        max_sessions: usize,
        peer_cfg: PeerConfig,
        peer_listener: Option<OwnedFd>,
    ) -> io::Result<Server> {
        let epoll = Epoll::new()?;
        let signals = SignalFd::new(&[libc::SIGTERM, libc::SIGINT])?;
        epoll.add(listener.as_raw_fd(), libc::EPOLLIN as u32, TOKEN_LISTENER)?;
        epoll.add(signals.as_raw_fd(), libc::EPOLLIN as u32, TOKEN_SIGNAL)?;
        if let Some(l) = &peer_listener {
            epoll.add(l.as_raw_fd(), libc::EPOLLIN as u32, TOKEN_PEER_LISTENER)?;
        }
        Ok(Server {
            peer_cfg,
            peer_listener,
            peers: HashMap::new(),
            hosts: HashMap::new(),
            down: NegativeCache::default(),
            pending: HashMap::new(),
            pending_deadlines: BTreeSet::new(),
            forwarded: HashMap::new(),
            carried: HashMap::new(),
            epoll,
            listener,
            signals,
            handler,
            conns: HashMap::new(),
            next_id: FIRST_SESSION,
            max_sessions,
            rbuf: vec![0; MAX_FRAME_TOTAL],
            spare: spare_fd(),
        })
    }

    /// Serves until SIGTERM or SIGINT; errors only if epoll itself fails.
    pub fn run(&mut self) -> io::Result<()> {
        let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 64];
        loop {
            let next = match (
                self.handler.next_deadline(),
                self.pending_deadlines.first().map(|&(t, _)| t),
            ) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            let timeout = next.map(|d| d.saturating_duration_since(Instant::now()));
            let n = self.epoll.wait(&mut events, timeout)?;
            for ev in &events[..n] {
                // Copies out of the (packed) epoll_event.
                let (token, flags) = (ev.u64, ev.events);
                match token {
                    TOKEN_LISTENER => self.accept_all(),
                    TOKEN_PEER_LISTENER => self.accept_peers(),
                    id if self.peers.contains_key(&id) => self.on_peer(id, flags),
                    TOKEN_SIGNAL => {
                        if let Some(sig) = self.signals.read() {
                            let name = match sig as i32 {
                                libc::SIGTERM => "SIGTERM",
                                libc::SIGINT => "SIGINT",
                                _ => "a signal",
                            };
                            info!("received {name}, shutting down");
                            return Ok(());
                        }
                    }
                    id => self.on_session(id, flags),
                }
            }
            let now = Instant::now();
            self.expire_pending(now);
            let fired = self.handler.tick(now);
            if fired > 0 {
                debug!("{fired} offer deadline(s) passed");
            }
            self.drain_events(now);
        }
    }

    fn accept_all(&mut self) {
        loop {
            match sys::accept(self.listener.as_raw_fd()) {
                Ok(sock) => self.open_session(sock),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.raw_os_error() == Some(libc::ECONNABORTED) => continue,
                Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
                    warn!("out of file descriptors, refusing a connection");
                    if self.spare.take().is_none() {
                        return;
                    }
                    drop(sys::accept(self.listener.as_raw_fd()));
                    self.spare = spare_fd();
                }
                Err(e) => {
                    error!("accept: {e}");
                    return;
                }
            }
        }
    }

    fn open_session(&mut self, sock: OwnedFd) {
        let cred = match pio::peer_cred(sock.as_raw_fd()) {
            Ok(c) => Cred {
                pid: c.pid,
                uid: c.uid,
                gid: c.gid,
                // Only for status listings: the offers' namespaces come
                // from the sockets themselves.
                netns: crate::netns::of_pid(c.pid).ok(),
                caps: crate::netns::caps_of(c.pid),
            },
            Err(e) => {
                warn!("SO_PEERCRED failed ({e}), refusing the connection");
                return;
            }
        };
        if self.conns.len() >= self.max_sessions {
            warn!(
                "pid {}: {} sessions open, refusing another",
                cred.pid, self.max_sessions
            );
            return;
        }
        let id = self.next_id;
        self.next_id += 1;
        if let Err(e) = self.epoll.add(sock.as_raw_fd(), EV_READ, id) {
            error!("epoll add: {e}");
            return;
        }
        debug!("session {id}: pid {} uid {} connected", cred.pid, cred.uid);
        self.handler.open_session(id, cred);
        self.conns.insert(
            id,
            Conn {
                sock,
                pid: cred.pid,
                out: VecDeque::new(),
                out_bytes: 0,
                writing: false,
                parked: false,
                interest: EV_READ,
            },
        );
    }

    fn close_session(&mut self, id: SessionId) {
        if let Some(c) = self.conns.remove(&id) {
            // Closing the descriptor removes it from epoll as well; the
            // explicit delete only makes that independent of dup'd copies.
            let _ = self.epoll.delete(c.sock.as_raw_fd());
            let now = Instant::now();
            self.handler.close_session(id, now);
            debug!("session {id}: closed");
            self.drain_events(now);
        }
    }

    /// Closes a session for something it did, with the one log line.
    fn evict(&mut self, id: SessionId, why: impl std::fmt::Display) {
        let pid = self.conns.get(&id).map_or(0, |c| c.pid);
        warn!("session {id} (pid {pid}): {why}; closing it");
        self.close_session(id);
    }

    fn on_session(&mut self, id: SessionId, flags: u32) {
        let Some(conn) = self.conns.get(&id) else {
            return;
        };
        if conn.parked && !conn.writing {
            // Not read while its offer travels; only a hang-up matters.
            if flags & (libc::EPOLLHUP | libc::EPOLLERR) as u32 != 0 {
                self.close_session(id);
            }
            return;
        }
        if conn.writing {
            if flags & (libc::EPOLLHUP | libc::EPOLLERR) as u32 != 0 {
                // Replies pending and nobody left to read them.
                self.close_session(id);
            } else if flags & EV_WRITE != 0 {
                self.flush(id);
            }
            return;
        }
        // Readable, hung up or in error: reading tells which.
        self.read_frames(id);
    }

    fn read_frames(&mut self, id: SessionId) {
        for _ in 0..FRAMES_PER_WAKEUP {
            let Some(conn) = self.conns.get(&id) else {
                return;
            };
            let sock = conn.sock.as_raw_fd();
            let (n, fds) = match pio::recv_frame(sock, &mut self.rbuf, libc::MSG_DONTWAIT) {
                Ok(Some(x)) => x,
                Ok(None) => return self.close_session(id),
                Err(Error::Io(e)) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(Error::Io(e)) => {
                    debug!("session {id}: receive failed: {e}");
                    return self.close_session(id);
                }
                Err(e) => return self.evict(id, e),
            };
            let now = Instant::now();
            match self
                .handler
                .handle_frame(id, &self.rbuf[..n], fds.into_owned(), now)
            {
                Ok(Reply {
                    forward: Some(fwd),
                    msg,
                    ..
                }) => {
                    self.start_forward(id, fwd, msg, now);
                }
                Ok(reply) => {
                    if !self.queue(id, reply) {
                        return;
                    }
                }
                Err(fault) => return self.evict(id, fault),
            }
            self.drain_events(now);
            if self.conns.get(&id).is_none_or(|c| c.writing || c.parked) {
                return;
            }
        }
    }

    /// Queues a reply and tries to send it; false if the session is gone.
    fn queue(&mut self, id: SessionId, reply: Reply<OwnedFd>) -> bool {
        let bytes = match frame::encode(&reply.msg) {
            Ok(b) => b,
            Err(e) => {
                error!("session {id}: cannot encode {}: {e}", reply.msg.name());
                self.close_session(id);
                return false;
            }
        };
        let Some(conn) = self.conns.get_mut(&id) else {
            return false;
        };
        conn.out_bytes += bytes.len();
        conn.out.push_back(Outgoing {
            frame: bytes,
            fds: reply.fds,
        });
        if conn.out_bytes > MAX_BUFFERED {
            self.evict(id, "too many unread replies");
            return false;
        }
        self.flush(id)
    }

    /// Sends queued replies until done or the socket is full, switching
    /// epoll interest between reading and writing; false if closed.
    fn flush(&mut self, id: SessionId) -> bool {
        let Some(conn) = self.conns.get_mut(&id) else {
            return false;
        };
        while let Some(front) = conn.out.front() {
            let mut raw = [0 as RawFd; MAX_FDS];
            let nfds = front.fds.len().min(MAX_FDS);
            for (slot, fd) in raw.iter_mut().zip(&front.fds) {
                *slot = fd.as_raw_fd();
            }
            match pio::send_frame(
                conn.sock.as_raw_fd(),
                &front.frame,
                &raw[..nfds],
                libc::MSG_DONTWAIT,
            ) {
                Ok(()) => {
                    conn.out_bytes -= front.frame.len();
                    // Dropping the entry closes our copies of relayed fds:
                    // the receiver has its own now.
                    conn.out.pop_front();
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    debug!("session {id}: send failed: {e}");
                    self.close_session(id);
                    return false;
                }
            }
        }
        conn.writing = !conn.out.is_empty();
        self.update_interest(id)
    }

    /// Epoll interest of a session: writing while replies are queued, else
    /// reading unless parked (then only hang-ups, which epoll always
    /// reports). False if the session had to be closed.
    fn update_interest(&mut self, id: SessionId) -> bool {
        let Some(conn) = self.conns.get_mut(&id) else {
            return false;
        };
        let interest = if conn.writing {
            EV_WRITE
        } else if conn.parked {
            0
        } else {
            EV_READ
        };
        if interest == conn.interest {
            return true;
        }
        conn.interest = interest;
        if let Err(e) = self.epoll.modify(conn.sock.as_raw_fd(), interest, id) {
            error!("epoll modify: {e}");
            self.close_session(id);
            return false;
        }
        true
    }

    /// Sends the (deferred) reply to a forwarded offer and serves the
    /// session again.
    fn unpark(&mut self, id: SessionId, msg: Msg) {
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        conn.parked = false;
        // Queueing sets the interest back (level-triggered: anything it
        // sent meanwhile is read next).
        self.queue(id, Reply::plain_reply(msg));
    }

    // ---- forwarding offers to other hosts ----

    /// Sends a forwarded offer towards the ctl of its server's host, or
    /// refuses it at once when that host is known to be unreachable.
    fn start_forward(&mut self, id: SessionId, fwd: Forward, fallback: Msg, now: Instant) {
        let host = canonical(fwd.server).ip();
        let refuse = |s: &mut Server, why: &str| {
            debug!(
                "session {id}: offer {} -> {}: {why}",
                fwd.client, fwd.server
            );
            s.handler.registry_mut().drop_forwarded(fwd.offer_id);
            s.queue(id, Reply::plain_reply(fallback.clone()));
        };
        if self.peer_cfg.port == 0 {
            return refuse(self, "inter-host offers are off (--peer-port 0)");
        }
        if self.down.is_down(host, now) {
            return refuse(self, "host recently unreachable (cached)");
        }
        let Some(peer) = self.peer_for(host, now) else {
            return refuse(self, "cannot connect to its ctl");
        };
        // A client bound to the wildcard address will leave through the
        // same source address as our connection to that host.
        let mut client = fwd.client;
        if client.ip().is_unspecified() {
            match self.peers.get(&peer).and_then(PeerConn::local_ip) {
                Some(ip) => client = SocketAddr::new(ip, client.port()),
                None => return refuse(self, "no source address towards the host"),
            }
        }
        let msg = Msg::RemoteOffer {
            offer_ref: fwd.offer_id,
            client,
            server: fwd.server,
            payload: fwd.payload,
        };
        let deadline = now + self.peer_cfg.timeout;
        self.pending.insert(
            fwd.offer_id,
            Pending {
                session: id,
                peer,
                deadline,
            },
        );
        self.pending_deadlines.insert((deadline, fwd.offer_id));
        self.carried.entry(peer).or_default().insert(fwd.offer_id);
        if let Some(conn) = self.conns.get_mut(&id) {
            conn.parked = true;
        }
        self.update_interest(id);
        debug!(
            "session {id}: offer {} forwarded to {} as {client} -> {}",
            fwd.offer_id,
            self.peers.get(&peer).map_or(host, |p| p.remote.ip()),
            fwd.server
        );
        self.peer_send(peer, &msg);
    }

    /// The cached connection to `host`'s ctl, or a new one (connect in
    /// progress). None if even starting the connect failed.
    fn peer_for(&mut self, host: IpAddr, now: Instant) -> Option<SessionId> {
        if let Some(&p) = self.hosts.get(&host) {
            return Some(p);
        }
        let to = SocketAddr::new(host, self.peer_cfg.port);
        let sock = match sys::connect_tcp(to) {
            Ok(s) => s,
            Err(e) => {
                info!(
                    "peer {to}: connect failed: {e}; not retried for {} ms",
                    self.peer_cfg.retry.as_millis()
                );
                self.down.mark(host, now + self.peer_cfg.retry);
                return None;
            }
        };
        let id = self.next_id;
        self.next_id += 1;
        if let Err(e) = self.epoll.add(sock.as_raw_fd(), EV_WRITE | EV_READ, id) {
            error!("epoll add: {e}");
            return None;
        }
        self.peers
            .insert(id, PeerConn::new(sock, Role::Connecting, to, true));
        self.hosts.insert(host, id);
        debug!("peer {id}: connecting to {to}");
        Some(id)
    }

    /// Refuses forwarded offers whose remote answer did not come in time;
    /// their connection is considered dead.
    fn expire_pending(&mut self, now: Instant) {
        while let Some(&(t, offer)) = self.pending_deadlines.first() {
            if t > now {
                break;
            }
            self.pending_deadlines.remove(&(t, offer));
            let Some(p) = self.pending.get(&offer) else {
                continue;
            };
            let peer = p.peer;
            let what = self.peers.get(&peer).map_or_else(String::new, |c| {
                if c.connecting {
                    format!("no connection to {} within the peer timeout", c.remote)
                } else {
                    format!("ctl at {} did not answer within the peer timeout", c.remote)
                }
            });
            self.close_peer(peer, &what, true, now);
            if self.pending.contains_key(&offer) {
                self.resolve(offer, unreachable(), false, now);
            }
        }
    }

    /// Resolves a pending forward: the offering session gets `msg`.
    fn resolve(&mut self, offer: OfferId, msg: Msg, registered: bool, now: Instant) {
        let Some(p) = self.pending.remove(&offer) else {
            return;
        };
        self.pending_deadlines.remove(&(p.deadline, offer));
        if registered {
            self.forwarded.insert(offer, p.peer);
        } else {
            if let Some(set) = self.carried.get_mut(&p.peer) {
                set.remove(&offer);
            }
            self.handler.registry_mut().drop_forwarded(offer);
        }
        self.unpark(p.session, msg);
        self.drain_events(now);
    }

    // ---- ctl-to-ctl connections ----

    fn accept_peers(&mut self) {
        let Some(l) = self.peer_listener.as_ref().map(|l| l.as_raw_fd()) else {
            return;
        };
        loop {
            match sys::accept(l) {
                Ok(sock) => {
                    let Ok(remote) = pio::peer_addr(sock.as_raw_fd()) else {
                        continue;
                    };
                    if self.peers.len() >= self.max_sessions {
                        warn!(
                            "peer {remote}: {} peer connections open, refusing another",
                            self.peers.len()
                        );
                        continue;
                    }
                    let _ = sys::set_nodelay(sock.as_raw_fd());
                    let id = self.next_id;
                    self.next_id += 1;
                    if let Err(e) = self.epoll.add(sock.as_raw_fd(), EV_READ, id) {
                        error!("epoll add: {e}");
                        continue;
                    }
                    self.handler.registry_mut().open_peer_session(id);
                    self.peers
                        .insert(id, PeerConn::new(sock, Role::Accepting, remote, false));
                    debug!("peer {id}: ctl at {remote} connected");
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.raw_os_error() == Some(libc::ECONNABORTED) => continue,
                Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
                    warn!("out of file descriptors, refusing a peer connection");
                    if self.spare.take().is_none() {
                        return;
                    }
                    drop(sys::accept(l));
                    self.spare = spare_fd();
                }
                Err(e) => {
                    error!("accept (peer port): {e}");
                    return;
                }
            }
        }
    }

    fn on_peer(&mut self, id: SessionId, flags: u32) {
        let now = Instant::now();
        let Some(conn) = self.peers.get_mut(&id) else {
            return;
        };
        if conn.connecting {
            if flags & (EV_WRITE | (libc::EPOLLERR | libc::EPOLLHUP) as u32) == 0 {
                return;
            }
            match sys::so_error(conn.sock.as_raw_fd()) {
                Ok(0) if flags & libc::EPOLLERR as u32 == 0 => {
                    conn.connecting = false;
                    let host = conn.remote.ip();
                    debug!("peer {id}: connected to {}", conn.remote);
                    self.down.clear(host);
                }
                Ok(e) => {
                    let why = format!(
                        "connect to {} failed: {}",
                        conn.remote,
                        io::Error::from_raw_os_error(e)
                    );
                    return self.close_peer(id, &why, true, now);
                }
                Err(e) => {
                    let why = format!("connect to {} failed: {e}", conn.remote);
                    return self.close_peer(id, &why, true, now);
                }
            }
        }
        if flags & (EV_READ | (libc::EPOLLERR | libc::EPOLLHUP) as u32) != 0 {
            let Some(conn) = self.peers.get_mut(&id) else {
                return;
            };
            let (msgs, closed) = match conn.read() {
                Ok(ReadOutcome::Frames(m)) => (m, false),
                Ok(ReadOutcome::Closed(m)) => (m, true),
                Err(f) => {
                    let why = format!("{f}");
                    return self.peer_fault(id, &why, now);
                }
            };
            for msg in msgs {
                if !self.peers.contains_key(&id) {
                    return;
                }
                self.on_peer_msg(id, msg, now);
            }
            if closed {
                let mid = self.carries_offers(id);
                return self.close_peer(id, "closed by the other ctl", mid, now);
            }
        }
        self.peer_flush(id, now);
    }

    /// A protocol violation by the other ctl: one log line, that
    /// connection closed, nothing else.
    fn peer_fault(&mut self, id: SessionId, why: &str, now: Instant) {
        let remote = self.peers.get(&id).map(|c| c.remote.to_string());
        warn!(
            "peer {id} ({}): {why}; closing the connection",
            remote.unwrap_or_default()
        );
        self.close_peer(id, "", true, now);
    }

    fn on_peer_msg(&mut self, id: SessionId, msg: Msg, now: Instant) {
        let Some(conn) = self.peers.get(&id) else {
            return;
        };
        match conn.role {
            Role::Accepting => {
                let source = conn.remote.ip();
                match self.handler.peer_request(id, source, msg, now) {
                    Ok(Some(reply)) => self.peer_send(id, &reply),
                    Ok(None) => {}
                    Err(f) => return self.peer_fault(id, &f.to_string(), now),
                }
            }
            Role::Connecting => {
                if msg.is_peer_request() {
                    let why = format!("sent {}, which this side does not accept", msg.name());
                    return self.peer_fault(id, &why, now);
                }
                self.on_remote_news(id, msg, now);
            }
        }
        self.drain_events(now);
    }

    /// What the server host's ctl says about one of our forwarded offers.
    /// News about offers we no longer track (cancelled meanwhile) is
    /// dropped: both sides may act at the same time.
    fn on_remote_news(&mut self, id: SessionId, msg: Msg, now: Instant) {
        let ours = |s: &Server, offer: OfferId| s.forwarded.get(&offer) == Some(&id);
        let pending =
            |s: &Server, offer: OfferId| s.pending.get(&offer).is_some_and(|p| p.peer == id);
        match msg {
            Msg::RemoteOfferOk {
                offer_ref,
                expires_ms,
            } if pending(self, offer_ref) => {
                let remote = Duration::from_millis(u64::from(expires_ms));
                self.handler
                    .registry_mut()
                    .forwarded_extend(offer_ref, remote, now);
                self.resolve(
                    offer_ref,
                    Msg::OfferOk {
                        offer_id: offer_ref,
                    },
                    true,
                    now,
                );
            }
            Msg::RemoteRefused { offer_ref, reason } if pending(self, offer_ref) => {
                self.resolve(offer_ref, Msg::OfferRefused { reason }, false, now);
            }
            Msg::RemoteClaimed {
                offer_ref,
                expires_ms,
            } if ours(self, offer_ref) => {
                let remote = Duration::from_millis(u64::from(expires_ms));
                debug!("peer {id}: offer {offer_ref} claimed on the server's host");
                self.handler
                    .registry_mut()
                    .forwarded_claimed(offer_ref, id, remote, now);
            }
            Msg::RemoteAnswer { offer_ref, payload } if ours(self, offer_ref) => {
                self.settle_forwarded(
                    offer_ref,
                    OfferState::Answered {
                        payload,
                        fds: Vec::new(),
                    },
                    now,
                );
            }
            Msg::RemoteDecline { offer_ref, reason } if ours(self, offer_ref) => {
                self.settle_forwarded(offer_ref, OfferState::Declined { reason }, now);
            }
            Msg::RemoteExpired { offer_ref } if ours(self, offer_ref) => {
                self.settle_forwarded(offer_ref, OfferState::Expired, now);
            }
            other => debug!("peer {id}: {} for an offer no longer tracked", other.name()),
        }
    }

    fn settle_forwarded(&mut self, offer: OfferId, state: OfferState<OwnedFd>, now: Instant) {
        if let Some(peer) = self.forwarded.remove(&offer) {
            if let Some(set) = self.carried.get_mut(&peer) {
                set.remove(&offer);
            }
        }
        self.handler
            .registry_mut()
            .forwarded_settle(offer, state, now);
    }

    /// Queues a frame to a peer and writes what the socket takes.
    fn peer_send(&mut self, id: SessionId, msg: &Msg) {
        let now = Instant::now();
        let Some(conn) = self.peers.get_mut(&id) else {
            return;
        };
        if let Err(f) = conn.queue(msg) {
            let why = format!("{f}");
            return self.peer_fault(id, &why, now);
        }
        self.peer_flush(id, now);
    }

    fn peer_flush(&mut self, id: SessionId, now: Instant) {
        let Some(conn) = self.peers.get_mut(&id) else {
            return;
        };
        if let Err(f) = conn.flush() {
            let why = format!("{f}");
            let mid = self.carries_offers(id);
            return self.close_peer(id, &why, mid, now);
        }
        let want_write = conn.connecting || conn.has_output();
        if want_write != conn.writing {
            conn.writing = want_write;
            let interest = if want_write {
                EV_WRITE | EV_READ
            } else {
                EV_READ
            };
            if let Err(e) = self.epoll.modify(conn.sock.as_raw_fd(), interest, id) {
                error!("epoll modify: {e}");
                self.close_peer(id, "", false, now);
            }
        }
    }

    /// Closes a ctl-to-ctl connection. Offers it carried: on the server
    /// side they vanish with its registry session; on the offering side
    /// pending ones are refused (NoListener) and registered ones settle as
    /// Declined. `failed`: remember the host as unreachable.
    fn close_peer(&mut self, id: SessionId, why: &str, failed: bool, now: Instant) {
        let Some(conn) = self.peers.remove(&id) else {
            return;
        };
        let _ = self.epoll.delete(conn.sock.as_raw_fd());
        let host = conn.remote.ip();
        if !why.is_empty() {
            if failed && conn.role == Role::Connecting {
                info!(
                    "peer {id}: {why}; offers to {host} stay on TCP for {} ms",
                    self.peer_cfg.retry.as_millis()
                );
            } else {
                debug!("peer {id}: {why}");
            }
        }
        match conn.role {
            Role::Accepting => {
                self.handler.close_session(id, now);
            }
            Role::Connecting => {
                if self.hosts.get(&host) == Some(&id) {
                    self.hosts.remove(&host);
                }
                if failed {
                    self.down.mark(host, now + self.peer_cfg.retry);
                }
            }
        }
        drop(conn);
        for offer in self.carried.remove(&id).unwrap_or_default() {
            if self.pending.get(&offer).is_some_and(|p| p.peer == id) {
                self.resolve(offer, unreachable(), false, now);
            } else if self.forwarded.get(&offer) == Some(&id) {
                self.forwarded.remove(&offer);
                self.handler.registry_mut().forwarded_settle(
                    offer,
                    OfferState::Declined {
                        reason: PEER_LOST.to_owned(),
                    },
                    now,
                );
            }
        }
        self.drain_events(now);
    }

    /// Sends what the registry says other hosts must hear.
    fn drain_events(&mut self, now: Instant) {
        loop {
            let events = self.handler.take_peer_events(now);
            if events.is_empty() {
                return;
            }
            for ev in events {
                match ev {
                    PeerEvent::Claimed {
                        peer,
                        offer_ref,
                        expires,
                    } => self.peer_send(
                        peer,
                        &Msg::RemoteClaimed {
                            offer_ref,
                            expires_ms: millis(expires),
                        },
                    ),
                    PeerEvent::Settled {
                        peer,
                        offer_ref,
                        outcome,
                    } => {
                        let msg = match outcome {
                            // Answers to remote offers carry no descriptors
                            // (refused by the handler); none are sent.
                            Outcome::Answered { payload, .. } => {
                                Msg::RemoteAnswer { offer_ref, payload }
                            }
                            Outcome::Declined { reason } => {
                                Msg::RemoteDecline { offer_ref, reason }
                            }
                            Outcome::Expired | Outcome::Pending => Msg::RemoteExpired { offer_ref },
                        };
                        self.peer_send(peer, &msg);
                    }
                    PeerEvent::Withdrawn { offer } => self.withdrawn(offer),
                }
            }
        }
    }

    /// A forwarded offer was cancelled, dropped with its session, or
    /// expired here: tell the server host's ctl; a session still waiting
    /// for its reply gets the fallback.
    fn withdrawn(&mut self, offer: OfferId) {
        let peer = if let Some(p) = self.pending.remove(&offer) {
            self.pending_deadlines.remove(&(p.deadline, offer));
            if self.conns.get(&p.session).is_some_and(|c| c.parked) {
                self.unpark(p.session, unreachable());
            }
            Some(p.peer)
        } else {
            self.forwarded.remove(&offer)
        };
        let Some(peer) = peer else {
            return;
        };
        if let Some(set) = self.carried.get_mut(&peer) {
            set.remove(&offer);
        }
        self.peer_send(peer, &Msg::RemoteCancel { offer_ref: offer });
    }

    /// Whether offers of ours travel on this connection (it breaking then
    /// counts as the host failing).
    fn carries_offers(&self, id: SessionId) -> bool {
        self.carried.get(&id).is_some_and(|s| !s.is_empty())
    }
}
