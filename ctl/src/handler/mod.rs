//! One request in, one reply out: decodes a frame, checks that the session
//! may send it, verifies descriptor proofs through an [`Env`], drives the
//! registry, and builds the reply. Still no I/O of its own, so the fuzzer
//! can drive it with fake descriptors.

use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::time::Instant;

use log::debug;
use ringsock_proto::addr::canonical;
use ringsock_proto::client::truncate_utf8;
use ringsock_proto::{
    frame, ErrorCode, Msg, ProtoError, RefuseReason, RingStat, StatusCursor, StatusEntry,
    MAX_ERROR_TEXT, MAX_METRICS_TEXT, MAX_PROCESS_NAME, MAX_RING_STATS, MAX_RING_STATS_V1,
    MAX_STATUS_PAGE, MAX_STAT_NAME,
};

use crate::conntrack;
use crate::metrics::{self, ring_index, Snapshot};
use crate::netns::NetNs;
use crate::registry::{
    offer_key, Cred, Limits, Link, ListenerKey, NewOffer, OfferId, Outcome, PeerEvent, RegError,
    Registry, Report, Scope, SessionId,
};

#[cfg(test)]
mod tests;

/// What a listening-socket proof established.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListenerProof {
    pub addr: SocketAddr,
    pub dual_stack: bool,
}

/// What a client-socket proof established: its bound address and, when it
/// is already connected, its peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientProof {
    pub local: SocketAddr,
    pub peer: Option<SocketAddr>,
}

/// The daemon's view of descriptors: real sockets in production
/// ([`crate::proof::SysEnv`]), fakes in tests and fuzzing. Each check
/// answers `Err(why)` when the descriptor does not prove anything.
pub trait Env {
    type Fd;
    type Ring;
    /// A listening TCP socket: its bound address.
    fn listener(&mut self, fd: &Self::Fd) -> Result<ListenerProof, String>;
    /// A TCP socket that is not listening: its local (and peer) address.
    fn client(&mut self, fd: &Self::Fd) -> Result<ClientProof, String>;
    /// A connected TCP socket: (local, peer).
    fn accepted(&mut self, fd: &Self::Fd) -> Result<(SocketAddr, SocketAddr), String>;
    /// The network namespace socket `fd` belongs to, when the kernel says
    /// (it may not tell an unprivileged daemon).
    fn netns(&mut self, fd: &Self::Fd) -> Option<NetNs>;
    /// The daemon's own network namespace: where its `is_local_ip` looks,
    /// and where offers from other hosts arrive.
    fn own_netns(&mut self) -> Option<NetNs>;
    /// The addresses of namespace `netns`, read through process `pid`,
    /// which must be in it now; None when that cannot be told.
    fn netns_addrs(&mut self, pid: u32, netns: NetNs) -> Option<Vec<IpAddr>>;
    /// The connection-tracking entry of the daemon's namespace whose reply
    /// tuple is `reply`, if any. Fakes track nothing.
    fn conntrack_by_reply(&mut self, _reply: &conntrack::Tuple) -> Option<conntrack::Entry> {
        None
    }
    /// The tracked connections of the daemon's namespace whose destination
    /// was translated. Fakes track nothing.
    fn conntrack_translated(&mut self) -> Vec<conntrack::Entry> {
        Vec::new()
    }
    /// Takes a ring memfd for status reporting.
    fn open_ring(&mut self, fd: Self::Fd) -> Self::Ring;
    /// Counters of a ring for status.
    fn ring_stats(&self, ring: &Self::Ring) -> Vec<RingStat>;
    /// Whether `ip` is an address of this host (offers for other hosts are
    /// forwarded to the ctl there). Fakes keep everything local.
    fn is_local_ip(&mut self, _ip: IpAddr) -> bool {
        true
    }
    /// A descriptor of the offer table the processes read, for a
    /// `HelloOk` (`ringsock_proto::offers`); none where there is no table.
    fn offer_table(&mut self) -> Option<Self::Fd> {
        None
    }
    /// What `ps` calls process `pid` of this daemon's pid namespace (its
    /// comm), if it can be read. Fakes know no names.
    fn process_name(&self, _pid: u32) -> Option<String> {
        None
    }
}

/// An offer for a server on another host: registered here as `offer_id`,
/// to be sent to the ctl of `server`'s host. Until that ctl answers, the
/// offering session's reply waits (the reply's `msg` is what it gets if the
/// other host cannot be asked).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forward {
    pub offer_id: OfferId,
    pub client: SocketAddr,
    pub server: SocketAddr,
    pub payload: Vec<u8>,
}

/// An offer as a process sent it, before the daemon knows its namespace.
struct Offered<F> {
    client: SocketAddr,
    server: SocketAddr,
    payload: Vec<u8>,
    fds: Vec<F>,
}

/// A reply and the descriptors that travel with it.
#[derive(Debug)]
pub struct Reply<F> {
    pub msg: Msg,
    pub fds: Vec<F>,
    /// Set for an offer to another host: the reply is deferred (see
    /// [`Forward`]).
    pub forward: Option<Forward>,
}

impl<F> Reply<F> {
    fn plain(msg: Msg) -> Self {
        Reply::with_fds(msg, Vec::new())
    }

    /// A reply without descriptors (for the event loop's deferred replies).
    pub fn plain_reply(msg: Msg) -> Self {
        Reply::plain(msg)
    }

    fn with_fds(msg: Msg, fds: Vec<F>) -> Self {
        Reply {
            msg,
            fds,
            forward: None,
        }
    }
}

/// A protocol violation: the session must be closed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// The frame did not decode (or carried the wrong number of fds).
    Proto(ProtoError),
    /// A reply kind sent to the daemon.
    NotARequest(&'static str),
    /// A request before Hello.
    NoHello(&'static str),
    /// A ctl-to-ctl message this end of the connection does not take.
    OutOfProtocol(&'static str),
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::Proto(e) => write!(f, "malformed message: {e}"),
            Fault::NotARequest(k) => write!(f, "sent reply kind {k} to the daemon"),
            Fault::NoHello(k) => write!(f, "sent {k} before Hello"),
            Fault::OutOfProtocol(k) => write!(f, "sent {k}, which this side does not accept"),
        }
    }
}

pub struct Handler<E: Env> {
    env: E,
    /// `Env::own_netns`, read once.
    own_netns: Option<NetNs>,
    /// Namespaces' addresses as last read, and when.
    ns_addrs: HashMap<NetNs, (Vec<IpAddr>, Instant)>,
    /// The non-loopback addresses listeners take connections to, and
    /// the namespaces of those listeners (DESIGN "Namespaces").
    served: HashMap<SocketAddr, Vec<NetNs>>,
    /// When `served` was last computed.
    served_at: Option<Instant>,
    /// Addresses that the daemon's connection tracking showed translated
    /// (DNAT) to listeners of other namespaces (a service's replicas: one
    /// address, several targets).
    translated: HashMap<SocketAddr, Vec<Translation>>,
    /// When the connection tracking was last read (at most once every
    /// `ADDRS_FRESH`, however often the served set is recomputed).
    tracked_at: Option<Instant>,
    reg: Registry<E::Fd, E::Ring>,
    daemon_version: String,
    host_id: u64,
    /// Bytes of rings whose last end on this host closed, by ring
    /// transport (`metrics::RING_TRANSPORTS` order).
    closed_ring_bytes: [u64; 2],
}

fn error<F>(code: ErrorCode, text: impl fmt::Display) -> Reply<F> {
    let text = text.to_string();
    Reply::plain(Msg::Error {
        code,
        text: truncate_utf8(&text, MAX_ERROR_TEXT).to_owned(),
    })
}

fn reg_error<F>(e: RegError, what: fmt::Arguments<'_>) -> Reply<F> {
    let code = match e {
        RegError::NotFound => ErrorCode::NotFound,
        RegError::NotOwner => ErrorCode::NotOwner,
        RegError::BadState => ErrorCode::BadState,
        RegError::Limit => ErrorCode::Limit,
    };
    error(code, format_args!("{what}: {e}"))
}

fn ok_or<F>(r: Result<(), RegError>, what: fmt::Arguments<'_>) -> Reply<F> {
    match r {
        Ok(()) => Reply::plain(Msg::Ok),
        Err(e) => reg_error(e, what),
    }
}

impl<E: Env> Handler<E> {
    pub fn new(mut env: E, limits: Limits, host_id: u64) -> Self {
        Handler {
            own_netns: env.own_netns(),
            ns_addrs: HashMap::new(),
            served: HashMap::new(),
            served_at: None,
            translated: HashMap::new(),
            tracked_at: None,
            env,
            reg: Registry::new(limits),
            daemon_version: env!("CARGO_PKG_VERSION").to_owned(),
            host_id,
            closed_ring_bytes: [0; 2],
        }
    }

    pub fn registry(&self) -> &Registry<E::Fd, E::Ring> {
        &self.reg
    }

    /// Shares the live offers with the processes through `table`.
    pub fn share_offers(&mut self, table: ringsock_proto::offers::Table<'static>) {
        self.reg.share_offers(table);
    }

    pub fn registry_mut(&mut self) -> &mut Registry<E::Fd, E::Ring> {
        &mut self.reg
    }

    /// The offer timeout (what remote offers are told they have).
    pub fn offer_timeout(&self) -> std::time::Duration {
        self.reg.limits().offer_timeout
    }

    /// What other hosts must hear about since the last call.
    pub fn take_peer_events(&mut self, now: Instant) -> Vec<PeerEvent<E::Fd>> {
        self.reg.take_events(now)
    }

    pub fn open_session(&mut self, id: SessionId, cred: Cred) {
        self.reg.open_session(id, cred);
    }

    pub fn close_session(&mut self, id: SessionId, now: Instant) {
        self.reg.close_session(id, now);
        self.retire_rings();
        self.refresh_served(now, true);
    }

    pub fn tick(&mut self, now: Instant) -> usize {
        self.refresh_served(now, false);
        self.reg.tick(now)
    }

    pub fn next_deadline(&self) -> Option<Instant> {
        // While listeners of other namespaces may be translation targets,
        // the translations are looked for every `ADDRS_FRESH`.
        let learn = self
            .served_at
            .filter(|_| self.learns_translations())
            .map(|t| t + ADDRS_FRESH);
        match (self.reg.next_deadline(), learn) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Decodes one received frame (with the descriptors that came with it)
    /// and handles it. On a fault the descriptors are dropped, i.e. closed.
    pub fn handle_frame(
        &mut self,
        id: SessionId,
        bytes: &[u8],
        fds: Vec<E::Fd>,
        now: Instant,
    ) -> Result<Reply<E::Fd>, Fault> {
        let msg = frame::decode_with_fds(bytes, fds.len()).map_err(Fault::Proto)?;
        self.handle(id, msg, fds, now)
    }

    /// Handles one decoded request. `fds.len()` must already fit the kind.
    pub fn handle(
        &mut self,
        id: SessionId,
        msg: Msg,
        fds: Vec<E::Fd>,
        now: Instant,
    ) -> Result<Reply<E::Fd>, Fault> {
        let reply = self.dispatch(id, msg, fds, now);
        self.retire_rings();
        reply
    }

    fn dispatch(
        &mut self,
        id: SessionId,
        msg: Msg,
        fds: Vec<E::Fd>,
        now: Instant,
    ) -> Result<Reply<E::Fd>, Fault> {
        if !msg.is_request() {
            return Err(Fault::NotARequest(msg.name()));
        }
        msg.check_fds(fds.len()).map_err(Fault::Proto)?;
        if !matches!(msg, Msg::Hello { .. }) && !self.reg.has_said_hello(id) {
            return Err(Fault::NoHello(msg.name()));
        }
        debug!("session {id}: {}", msg.name());
        let mut fds = fds.into_iter();
        Ok(match msg {
            Msg::Hello { pid, exe } => {
                self.reg.hello(id, pid, exe);
                Reply::with_fds(
                    Msg::HelloOk {
                        daemon_version: self.daemon_version.clone(),
                        host_id: self.host_id,
                    },
                    self.env.offer_table().into_iter().collect(),
                )
            }
            Msg::ListenerAdd { addr } => match fds.next() {
                Some(proof) => {
                    let r = self.listener_add(id, addr, proof);
                    self.refresh_served(now, true);
                    r
                }
                None => error(ErrorCode::BadProof, "no listening socket passed"),
            },
            Msg::ListenerRemove { addr } => {
                let r = self.reg.remove_listener(id, addr);
                self.refresh_served(now, true);
                ok_or(r, format_args!("listener {addr}"))
            }
            Msg::Offer {
                client,
                server,
                payload,
            } => {
                let proof = fds.next();
                let new = Offered {
                    client,
                    server,
                    payload,
                    fds: fds.collect(),
                };
                match proof {
                    Some(p) => self.offer(id, new, p, now),
                    None => {
                        self.reg.count_refused(RefuseReason::Invalid);
                        Reply::plain(Msg::OfferRefused {
                            reason: RefuseReason::Invalid,
                        })
                    }
                }
            }
            Msg::Claim => match fds.next() {
                Some(proof) => self.claim(id, proof, now),
                None => Reply::plain(Msg::NoOffer),
            },
            Msg::Answer { offer_id, payload } => {
                if fds.len() > 0 && self.reg.is_from_peer(offer_id) {
                    return Ok(error(
                        ErrorCode::BadRequest,
                        format_args!(
                            "offer {offer_id} is from another host: descriptors cannot cross hosts"
                        ),
                    ));
                }
                ok_or(
                    self.reg.answer(id, offer_id, payload, fds.collect(), now),
                    format_args!("offer {offer_id}"),
                )
            }
            Msg::Decline { offer_id, reason } => ok_or(
                self.reg.decline(id, offer_id, reason, now),
                format_args!("offer {offer_id}"),
            ),
            Msg::Collect { offer_id } => match self.reg.collect(id, offer_id) {
                Ok(Outcome::Pending) => Reply::plain(Msg::Pending),
                Ok(Outcome::Answered { payload, fds }) => {
                    Reply::with_fds(Msg::Answered { payload }, fds)
                }
                Ok(Outcome::Declined { reason }) => Reply::plain(Msg::Declined { reason }),
                Ok(Outcome::Expired) => Reply::plain(Msg::Expired),
                Err(e) => reg_error(e, format_args!("offer {offer_id}")),
            },
            Msg::Cancel { offer_id } => ok_or(
                self.reg.cancel(id, offer_id),
                format_args!("offer {offer_id}"),
            ),
            Msg::ConnReport {
                fd,
                local,
                peer,
                transport,
                reason,
                ring,
            } => {
                let ring_obj = fds.next().map(|f| self.env.open_ring(f));
                let report = Report {
                    local,
                    peer,
                    transport,
                    reason,
                    ring,
                    ring_obj,
                };
                ok_or(
                    self.reg.report(id, fd, report),
                    format_args!("report of fd {fd}"),
                )
            }
            Msg::ConnClosed { fd, local, peer } => ok_or(
                self.reg.report_closed(id, fd, local, peer),
                format_args!("report of fd {fd}"),
            ),
            Msg::Status { after } => Reply::plain(self.status(id, after, Listing::V1)),
            Msg::StatusAll { after } => Reply::plain(self.status(id, after, Listing::All)),
            Msg::StatusNamed { after } => Reply::plain(self.status(id, after, Listing::Named)),
            Msg::Metrics => {
                let text = metrics::render(&self.snapshot(id));
                if text.len() > MAX_METRICS_TEXT {
                    // Not reachable with the render bounds (unit test); a
                    // cut text would not parse, so say why instead.
                    error(ErrorCode::Limit, "metrics text exceeds a reply")
                } else {
                    Reply::plain(Msg::MetricsReply { text })
                }
            }
            // Replies were refused above; listed to keep the match total.
            reply => return Err(Fault::NotARequest(reply.name())),
        })
    }

    /// The namespace of socket `fd` held by session `id`: the kernel's
    /// word on the socket, else the namespace the session's process was in
    /// when it connected (a process cannot make sockets of a namespace it
    /// could not enter).
    fn socket_netns(&mut self, id: SessionId, fd: &E::Fd) -> Option<NetNs> {
        match self.env.netns(fd) {
            Some(ns) => {
                // A process the daemon cannot see (another pid namespace)
                // is listed under the namespace of its sockets.
                self.reg.learn_netns(id, ns);
                Some(ns)
            }
            None => self.reg.cred_of(id).and_then(|c| c.netns),
        }
    }

    fn listener_add(&mut self, id: SessionId, addr: SocketAddr, proof: E::Fd) -> Reply<E::Fd> {
        let checked = self.env.listener(&proof);
        let netns = self.socket_netns(id, &proof);
        // Holding the listener would keep the socket alive after its owner
        // closed it: the proof is released before anything else happens.
        drop(proof);
        let Some(netns) = netns else {
            return error(ErrorCode::BadProof, NO_NETNS);
        };
        match checked {
            Ok(p) if canonical(p.addr) == canonical(addr) => ok_or(
                self.reg.add_listener(
                    id,
                    ListenerKey {
                        addr: p.addr,
                        dual_stack: p.dual_stack,
                        netns,
                    },
                ),
                format_args!("listener {addr}"),
            ),
            Ok(p) => error(
                ErrorCode::BadProof,
                format_args!("socket is bound to {}, not {addr}", p.addr),
            ),
            Err(why) => error(ErrorCode::BadProof, why),
        }
    }

    /// Checks the client-socket proof, then registers the offer (or, for a
    /// server on another host, registers it and asks for it to be
    /// forwarded).
    fn offer(
        &mut self,
        id: SessionId,
        new: Offered<E::Fd>,
        proof: E::Fd,
        now: Instant,
    ) -> Reply<E::Fd> {
        let refused = |reason| Reply::plain(Msg::OfferRefused { reason });
        let (client, server) = (new.client, new.server);
        let checked = self.env.client(&proof);
        let netns = self.socket_netns(id, &proof);
        // The daemon must not keep the client's socket alive.
        drop(proof);
        let checked = checked.and_then(|c| netns.map(|ns| (c, ns)).ok_or_else(|| NO_NETNS.into()));
        let netns = match check_offer(client, server, checked.map(|(c, _)| c)) {
            Ok(()) => netns.expect("checked above"),
            Err(why) => {
                debug!("session {id}: offer {client} -> {server} refused: {why}");
                self.reg.count_refused(RefuseReason::Invalid);
                return refused(RefuseReason::Invalid);
            }
        };
        let Offered { payload, fds, .. } = new;
        let here = if self.is_local_server(netns, server) {
            Some(netns)
        } else {
            self.other_netns_server(id, netns, client, server, now)
        };
        let translated = here == Some(NetNs::TRANSLATED);
        let new = NewOffer {
            client,
            server,
            netns: here.unwrap_or(netns),
            client_netns: netns,
            payload,
            fds,
        };
        if here.is_some() {
            let link = if translated {
                Link::Translated
            } else {
                Link::Local
            };
            return match self.reg.offer(id, new, link, now) {
                Ok(offer_id) => Reply::plain(Msg::OfferOk { offer_id }),
                Err(reason) => refused(reason),
            };
        }
        // Another host: only the payload can travel, not descriptors.
        if !new.fds.is_empty() {
            debug!(
                "session {id}: offer {client} -> {server} refused: {} descriptors for a remote host",
                new.fds.len()
            );
            self.reg.count_refused(RefuseReason::Invalid);
            return refused(RefuseReason::Invalid);
        }
        let NewOffer { payload, .. } = new;
        let registered = NewOffer {
            client,
            server,
            netns,
            client_netns: netns,
            payload: Vec::new(),
            fds: Vec::new(),
        };
        match self.reg.offer_forwarded(id, registered, now) {
            Ok(offer_id) => Reply {
                msg: Msg::OfferRefused {
                    reason: RefuseReason::NoListener,
                },
                fds: Vec::new(),
                forward: Some(Forward {
                    offer_id,
                    client,
                    server,
                    payload,
                }),
            },
            Err(reason) => refused(reason),
        }
    }

    /// Whether a client socket of namespace `netns` connecting to `server`
    /// reaches a server of that same namespace: loopback, an address a
    /// listener there is bound to, or, in the daemon's own namespace, any
    /// address of this host.
    fn is_local_server(&mut self, netns: NetNs, server: SocketAddr) -> bool {
        let ip = canonical(server).ip();
        ip.is_loopback()
            || self.reg.has_exact_listener(netns, server)
            || (Some(netns) == self.own_netns && self.env.is_local_ip(ip))
    }

    /// A request from the ctl of another host on a connection it opened to
    /// us (`source`: its address). Returns the reply to send back, if any;
    /// a fault closes that connection.
    pub fn peer_request(
        &mut self,
        peer: SessionId,
        source: IpAddr,
        msg: Msg,
        now: Instant,
    ) -> Result<Option<Msg>, Fault> {
        match msg {
            Msg::RemoteOffer {
                offer_ref,
                client,
                server,
                payload,
            } => {
                let refused = |reason| Ok(Some(Msg::RemoteRefused { offer_ref, reason }));
                // DESIGN: an offer is only for a client address equal to the
                // source of the ctl connection that carried it.
                let source = canonical(SocketAddr::new(source, 0)).ip();
                let (c, s) = (canonical(client), canonical(server));
                if c.ip() != source {
                    debug!("peer {peer}: offer {client} -> {server} refused: not from {source}");
                    return refused(RefuseReason::Invalid);
                }
                if c.port() == 0 || s.port() == 0 || c.is_ipv4() != s.is_ipv4() {
                    return refused(RefuseReason::Invalid);
                }
                // Our loopback cannot be reached from another host; its
                // connections arrive in the daemon's own namespace.
                let Some(netns) = self.own_netns else {
                    return refused(RefuseReason::NoListener);
                };
                if s.ip().is_loopback() || !self.env.is_local_ip(s.ip()) {
                    return refused(RefuseReason::NoListener);
                }
                let new = NewOffer {
                    client: c,
                    server: s,
                    netns,
                    client_netns: netns,
                    payload,
                    fds: Vec::new(),
                };
                Ok(Some(
                    match self.reg.offer_from_peer(peer, offer_ref, new, now) {
                        Ok(_) => Msg::RemoteOfferOk {
                            offer_ref,
                            expires_ms: millis(self.offer_timeout()),
                        },
                        Err(reason) => Msg::RemoteRefused { offer_ref, reason },
                    },
                ))
            }
            Msg::RemoteCancel { offer_ref } => {
                self.reg.cancel_from_peer(peer, offer_ref);
                Ok(None)
            }
            other => Err(Fault::OutOfProtocol(other.name())),
        }
    }

    fn claim(&mut self, id: SessionId, proof: E::Fd, now: Instant) -> Reply<E::Fd> {
        let checked = self.env.accepted(&proof);
        let netns = self.socket_netns(id, &proof);
        drop(proof);
        let (local, peer) = match checked {
            Ok(t) => t,
            Err(why) => return error(ErrorCode::BadProof, why),
        };
        let Some(netns) = netns else {
            return error(ErrorCode::BadProof, NO_NETNS);
        };
        let (addrs, from) = (&self.ns_addrs, canonical(peer).ip());
        let mut claimed = self
            .reg
            .claim_checked(id, netns, local, peer, now, |client_ns| {
                client_ns == netns || only_in(addrs, from, client_ns, netns)
            });
        if claimed.is_none() {
            claimed = self.claim_translated(id, netns, local, peer, now);
        }
        match claimed {
            Some(c) => Reply::with_fds(
                Msg::ClaimOk {
                    offer_id: c.offer_id,
                    client_pid: c.client_pid,
                    payload: c.payload,
                },
                c.fds,
            ),
            None => Reply::plain(Msg::NoOffer),
        }
    }

    /// Adds the last byte counts of rings whose reports just closed to the
    /// running total, once per ring: an end whose ring another live end on
    /// this host still shows (both ends of a same-host connection read
    /// one segment) is left to that end.
    fn retire_rings(&mut self) {
        for r in self.reg.take_retired() {
            let (Some(i), Some(ring)) = (ring_index(r.transport), r.ring_obj.as_ref()) else {
                continue;
            };
            let shared = r.ring.is_some()
                && self.reg.ends().any(|e| {
                    e.ring_obj.is_some() && e.transport == r.transport && e.ring == r.ring
                });
            if !shared {
                let bytes = metrics::ring_bytes(&self.env.ring_stats(ring));
                self.closed_ring_bytes[i] = self.closed_ring_bytes[i].wrapping_add(bytes);
            }
        }
    }

    /// What the metrics show now; `asking` is the session that asks (not
    /// counted among the processes).
    pub fn snapshot(&self, asking: SessionId) -> Snapshot {
        let mut s = Snapshot {
            counters: self.reg.counters(),
            sessions: self.reg.process_sessions(asking),
            offers_live: self.reg.offer_count(),
            listeners: self.reg.listener_count(),
            ring_bytes: self.closed_ring_bytes,
            ..Snapshot::default()
        };
        // Live rings, each counted once: the largest count any of its ends
        // on this host shows.
        let mut live: HashMap<(usize, Option<u64>, usize), u64> = HashMap::new();
        for (n, e) in self.reg.ends().enumerate() {
            s.add_end(e.transport, &e.reason);
            if let (Some(i), Some(ring)) = (ring_index(e.transport), e.ring_obj.as_ref()) {
                // An end without a ring id is a ring of its own.
                let key = (i, e.ring, if e.ring.is_some() { 0 } else { n });
                let bytes = metrics::ring_bytes(&self.env.ring_stats(ring));
                let v = live.entry(key).or_insert(0);
                *v = (*v).max(bytes);
            }
        }
        for ((i, _, _), bytes) in live {
            s.ring_bytes[i] = s.ring_bytes[i].wrapping_add(bytes);
        }
        s
    }

    /// One page of the listing in the shape `listing` asks for. Replies to
    /// `Status` carry at most `MAX_RING_STATS_V1` counters per entry (the
    /// first ones: providers list the counters older CLIs knew first); only
    /// `StatusNamed` gets process names, read now: a process renames itself
    /// (prctl, exec) while its session lives.
    fn status(&self, id: SessionId, after: Option<StatusCursor>, listing: Listing) -> Msg {
        let max_stats = match listing {
            Listing::V1 => MAX_RING_STATS_V1,
            Listing::All | Listing::Named => MAX_RING_STATS,
        };
        let (rows, next) = self
            .reg
            .status_page(after, MAX_STATUS_PAGE, self.scope_of(id));
        let entries = rows
            .into_iter()
            .map(|r| StatusEntry {
                session: r.session,
                pid: r.pid,
                uid: r.uid,
                exe: r.exe.to_owned(),
                // A pid the kernel did not give us (another pid namespace)
                // names nothing in our /proc.
                name: match listing {
                    Listing::Named if r.pid_from_kernel => self
                        .env
                        .process_name(r.pid)
                        .map(|n| truncate_utf8(&n, MAX_PROCESS_NAME).to_owned())
                        .unwrap_or_default(),
                    _ => String::new(),
                },
                fd: r.fd,
                local: r.report.local,
                peer: r.report.peer,
                transport: r.report.transport,
                reason: r.report.reason.clone(),
                ring: r.report.ring,
                ring_stats: r
                    .report
                    .ring_obj
                    .as_ref()
                    .map(|ring| bounded_stats(self.env.ring_stats(ring), max_stats))
                    .unwrap_or_default(),
            })
            .collect();
        match listing {
            Listing::Named => Msg::StatusNamedReply { entries, next },
            Listing::V1 | Listing::All => Msg::StatusReply { entries, next },
        }
    }
}

/// Whether `ip`, the address a connection in namespace `server_ns` came
/// from, is an address of `client_ns` and of no other namespace read
/// (`server_ns` included): then the connection is the offering client's,
/// across the two namespaces. An address two namespaces have, or one
/// whose namespaces are unknown, pairs nothing.
fn only_in(
    addrs: &HashMap<NetNs, (Vec<IpAddr>, Instant)>,
    ip: IpAddr,
    client_ns: NetNs,
    server_ns: NetNs,
) -> bool {
    let has = |ns: &NetNs| addrs.get(ns).is_some_and(|(a, _)| a.contains(&ip));
    !ip.is_loopback()
        && !ip.is_unspecified()
        && has(&client_ns)
        && !has(&server_ns)
        && addrs.keys().filter(|ns| has(ns)).count() == 1
}

/// A translation the daemon's connection tracking showed: connections to
/// the address it is keyed by went to listener address `to` of `netns`,
/// last seen at `seen`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Translation {
    to: SocketAddr,
    netns: NetNs,
    seen: Instant,
}

/// How long a translation is kept after its last tracked connection is
/// gone: connections to it still pair only through their own tracking
/// entries, so a translation changed meanwhile costs at most a claim wait.
const TRANSLATION_KEPT: std::time::Duration = std::time::Duration::from_secs(600);

/// How long a namespace's addresses, and the served set built from them,
/// are taken as they were read.
const ADDRS_FRESH: std::time::Duration = std::time::Duration::from_secs(1);

impl<E: Env> Handler<E> {
    /// The addresses of namespace `netns` (read through `pid`, a process
    /// in it, when those known are older than `ADDRS_FRESH`).
    fn addrs_of(&mut self, netns: NetNs, pid: u32, now: Instant) -> Option<&Vec<IpAddr>> {
        let fresh = self
            .ns_addrs
            .get(&netns)
            .is_some_and(|(_, at)| now.saturating_duration_since(*at) < ADDRS_FRESH);
        if !fresh && pid != 0 {
            if let Some(mut a) = self.env.netns_addrs(pid, netns) {
                for ip in &mut a {
                    *ip = canonical(SocketAddr::new(*ip, 0)).ip();
                }
                self.ns_addrs.insert(netns, (a, now));
            }
        }
        self.ns_addrs.get(&netns).map(|(a, _)| a)
    }

    /// Recomputes the served addresses (`force`, or when older than
    /// `ADDRS_FRESH`) and shares them: every listener's own address, and
    /// for a wildcard listener each address of its namespace of its
    /// family, but loopback, which no other namespace reaches.
    fn refresh_served(&mut self, now: Instant, force: bool) {
        if !force
            && self
                .served_at
                .is_some_and(|t| now.saturating_duration_since(t) < ADDRS_FRESH)
        {
            return;
        }
        let mut served: HashMap<SocketAddr, Vec<NetNs>> = HashMap::new();
        for (key, pid) in self.reg.listeners_with_pid() {
            let (ip, port) = (key.addr.ip(), key.addr.port());
            // Read for every listener's namespace: `only_in` looks at all.
            let addrs = self.addrs_of(key.netns, pid, now);
            let ips: Vec<IpAddr> = if ip.is_unspecified() {
                let Some(addrs) = addrs else {
                    continue;
                };
                addrs
                    .iter()
                    .filter(|a| a.is_ipv4() == ip.is_ipv4() || (a.is_ipv4() && key.dual_stack))
                    .copied()
                    .collect()
            } else if addrs.is_some_and(|a| !a.contains(&canonical(key.addr).ip())) {
                // Bound to an address its namespace does not have
                // (IP_FREEBIND): it serves nobody else.
                continue;
            } else {
                vec![ip]
            };
            for ip in ips.into_iter().filter(|ip| !ip.is_loopback()) {
                let v = served.entry(SocketAddr::new(ip, port)).or_default();
                if !v.contains(&key.netns) {
                    v.push(key.netns);
                }
            }
        }
        if self.own_netns.is_some()
            && served
                .values()
                .flatten()
                .any(|ns| Some(*ns) != self.own_netns)
        {
            self.learn_translations(&served, now);
        }
        self.translated.retain(|_, ts| {
            ts.retain(|t| now.saturating_duration_since(t.seen) < TRANSLATION_KEPT);
            !ts.is_empty()
        });
        // A translated address is offered for while one of its targets is
        // served, and those targets' servers ask about their accepts.
        let mut keys: std::collections::HashSet<_> = served
            .keys()
            .map(ringsock_proto::offers::served_key)
            .collect();
        for (from, ts) in &self.translated {
            let mut live = ts
                .iter()
                .filter(|t| served.get(&t.to).is_some_and(|v| v.contains(&t.netns)))
                .peekable();
            if live.peek().is_some() {
                keys.insert(ringsock_proto::offers::served_key(from));
            }
            keys.extend(live.map(|t| ringsock_proto::offers::target_key(&t.to)));
        }
        self.reg.set_served(&keys);
        self.served = served;
        self.served_at = Some(now);
        // Namespaces nobody asked about for a while are forgotten.
        let served = &self.served;
        self.ns_addrs.retain(|ns, (_, at)| {
            now.saturating_duration_since(*at) < 60 * ADDRS_FRESH
                || served.values().any(|v| v.contains(ns))
        });
    }

    /// Whether listeners of namespaces other than the daemon's own exist,
    /// whose addresses translations (DNAT in the daemon's namespace) may
    /// lead to.
    fn learns_translations(&self) -> bool {
        self.served
            .values()
            .flatten()
            .any(|ns| Some(*ns) != self.own_netns)
    }

    /// Whether connections to `server` are translated to a listener that
    /// is served now.
    fn translation_live(&self, server: SocketAddr) -> bool {
        self.translated.get(&server).is_some_and(|ts| {
            ts.iter()
                .any(|t| self.served.get(&t.to).is_some_and(|v| v.contains(&t.netns)))
        })
    }

    /// Learns from the daemon's connection tracking which addresses are
    /// translated to which listeners of other namespaces: a tracked
    /// connection whose reply comes from a served address of exactly one
    /// namespace (an address two namespaces serve tells nothing).
    fn learn_translations(&mut self, served: &HashMap<SocketAddr, Vec<NetNs>>, now: Instant) {
        if self
            .tracked_at
            .is_some_and(|t| now.saturating_duration_since(t) < ADDRS_FRESH)
        {
            return;
        }
        self.tracked_at = Some(now);
        for e in self.env.conntrack_translated() {
            let (from, to) = (canonical(e.orig.dst), canonical(e.reply.src));
            let Some(&[netns]) = served.get(&to).map(Vec::as_slice) else {
                continue;
            };
            if Some(netns) == self.own_netns {
                continue;
            }
            let ts = self.translated.entry(from).or_default();
            match ts.iter_mut().find(|t| t.to == to && t.netns == netns) {
                Some(t) => t.seen = now,
                None => ts.push(Translation {
                    to,
                    netns,
                    seen: now,
                }),
            }
        }
    }

    /// A claim for an accepted socket (`local`, `peer`) of namespace
    /// `netns` that no offer names as it is: if the daemon's connection
    /// tracking has it as the reply of a translated connection (its
    /// destination translated to this very listener, its source
    /// masqueraded, or both), the offer for the original tuple, when the
    /// client's address there is the offering namespace's alone.
    fn claim_translated(
        &mut self,
        id: SessionId,
        netns: NetNs,
        local: SocketAddr,
        peer: SocketAddr,
        now: Instant,
    ) -> Option<crate::registry::Claimed<E::Fd>> {
        self.own_netns?;
        let (local, peer) = (canonical(local), canonical(peer));
        let e = self.env.conntrack_by_reply(&conntrack::Tuple {
            src: local,
            dst: peer,
        })?;
        let (c0, d0) = (canonical(e.orig.src), canonical(e.orig.dst));
        if (c0, d0) == (peer, local) {
            // Not translated: the offer, if any, was already asked for.
            return None;
        }
        // Only the source translated: the offer is in this namespace.
        // The destination translated to this very listener: the offer
        // waits in no namespace for the tracking entry to name one.
        let offered_in = if d0 == local {
            netns
        } else if self
            .translated
            .get(&d0)
            .is_some_and(|ts| ts.iter().any(|t| t.to == local && t.netns == netns))
        {
            NetNs::TRANSLATED
        } else {
            return None;
        };
        let addrs = &self.ns_addrs;
        self.reg
            .claim_checked(id, offered_in, d0, c0, now, |client_ns| {
                client_ns != netns && only_in(addrs, c0.ip(), client_ns, netns)
            })
    }

    /// For a client socket of namespace `client_ns` connecting to `server`,
    /// an address its namespace does not have: the one other namespace
    /// whose listener takes connections to it (or, for an address the
    /// daemon saw translated to served listeners, `NetNs::TRANSLATED`:
    /// the claim's tracking entry names the namespace), when the client's
    /// address (if it is bound to one) is `client_ns`'s alone. None when
    /// no namespace or several do, or anything is unknown: then the offer
    /// goes the other-host way.
    fn other_netns_server(
        &mut self,
        id: SessionId,
        client_ns: NetNs,
        client: SocketAddr,
        server: SocketAddr,
        now: Instant,
    ) -> Option<NetNs> {
        self.refresh_served(now, false);
        let s = canonical(server);
        let server_ns = match self.served.get(&s) {
            Some(v) => {
                let candidates: Vec<NetNs> =
                    v.iter().filter(|ns| **ns != client_ns).copied().collect();
                let [server_ns] = candidates[..] else {
                    return None;
                };
                server_ns
            }
            None if self.translation_live(s) => NetNs::TRANSLATED,
            None => return None,
        };
        let pid = self
            .reg
            .cred_of(id)
            .filter(|c| c.netns == Some(client_ns))
            .map_or(0, |c| c.pid);
        if self.addrs_of(client_ns, pid, now)?.contains(&s.ip()) {
            return None;
        }
        let c = canonical(client).ip();
        if !c.is_unspecified() && !only_in(&self.ns_addrs, c, client_ns, server_ns) {
            return None;
        }
        Some(server_ns)
    }
}

/// What the handler says when the kernel names no namespace for a socket.
const NO_NETNS: &str = "cannot learn the socket's network namespace";

impl<E: Env> Handler<E> {
    /// Whose connections session `id` may list: root with CAP_SYS_ADMIN
    /// (who could enter every namespace anyway), or with CAP_NET_ADMIN in
    /// the daemon's own namespace (the daemon's administrator: a
    /// DaemonSet's container), sees every namespace's; anyone else (root
    /// of a container too) only those of the namespace it is in, and
    /// nothing when that is unknown.
    fn scope_of(&self, id: SessionId) -> Scope {
        match self.reg.cred_of(id) {
            Some(Cred {
                uid: 0,
                caps,
                netns,
                ..
            }) if caps.sys_admin
                || (caps.net_admin && netns.is_some() && netns == self.own_netns) =>
            {
                Scope::Host
            }
            Some(Cred {
                netns: Some(ns), ..
            }) => Scope::Netns(ns),
            _ => Scope::Nowhere,
        }
    }
}

/// Which listing request is answered.
#[derive(Clone, Copy)]
enum Listing {
    V1,
    All,
    Named,
}

/// Same-host security rule: an offer is only for the address of a socket
/// the offering process holds (the proof), towards a concrete server.
fn check_offer(
    client: SocketAddr,
    server: SocketAddr,
    proof: Result<ClientProof, String>,
) -> Result<(), String> {
    let proof = proof?;
    if client.port() == 0 || server.port() == 0 {
        return Err("port 0".into());
    }
    if server.ip().is_unspecified() {
        return Err("unspecified server address".into());
    }
    let (c, s) = offer_key(client, server);
    if c.is_ipv4() != s.is_ipv4() {
        return Err("client and server address families differ".into());
    }
    if canonical(proof.local) != canonical(client) {
        return Err(format!("socket is bound to {}, not {client}", proof.local));
    }
    match proof.peer {
        Some(peer) if canonical(peer) != s => Err(format!("socket is connected to {peer}")),
        _ => Ok(()),
    }
}

/// A duration in whole milliseconds for the wire (saturating).
pub fn millis(d: std::time::Duration) -> u32 {
    d.as_millis().min(u128::from(u32::MAX)) as u32
}

/// Stats from a provider, cut to what a status entry can carry (`max`, at
/// most `MAX_RING_STATS`): a misbehaving provider must not make the reply
/// unencodable.
fn bounded_stats(mut stats: Vec<RingStat>, max: usize) -> Vec<RingStat> {
    stats.truncate(max.min(MAX_RING_STATS));
    for s in &mut stats {
        let keep = truncate_utf8(&s.name, MAX_STAT_NAME).len();
        s.name.truncate(keep);
    }
    stats
}
