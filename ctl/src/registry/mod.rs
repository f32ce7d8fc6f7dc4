//! The daemon's whole state, as a pure state machine: sessions, listeners,
//! offers, connection reports. No I/O happens here; ownership proofs are
//! checked by the caller, time is passed in, and descriptors are an opaque
//! type `F` (rings `R`) so tests and the fuzzer can use fakes.

mod listeners;
mod offers;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::ops::Bound;
use std::time::{Duration, Instant};

use ringsock_proto::addr::canonical;
use ringsock_proto::{RefuseReason, StatusCursor, Transport};

use crate::metrics::Counters;
use crate::netns::NetNs;

pub use listeners::{ListenerKey, ListenerTable};
pub use offers::{
    Claimed, Link, NewOffer, OfferId, OfferState, OfferTable, Outcome, TableEvent, CLAIMER_GONE,
};

/// Daemon-local number of a control connection.
pub type SessionId = u64;

/// Bounds that keep one process from exhausting the daemon.
#[derive(Debug, Clone)]
pub struct Limits {
    /// How long an offer waits for a claim, a claim for an answer, and a
    /// result for its collection.
    pub offer_timeout: Duration,
    /// Offers a session may hold in any state (beyond: TooMany).
    pub max_offers_per_session: usize,
    pub max_listeners_per_session: usize,
    pub max_reports_per_session: usize,
    /// Relayed descriptors and ring memfds held daemon-wide; keeps the
    /// daemon clear of its RLIMIT_NOFILE.
    pub max_held_fds: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            offer_timeout: Duration::from_secs(10),
            max_offers_per_session: 4096,
            max_listeners_per_session: 4096,
            max_reports_per_session: 65536,
            max_held_fds: 16384,
        }
    }
}

/// Who is at the other end of a session (SO_PEERCRED), and what that
/// process was when it connected: its network namespace (its
/// /proc/PID/ns/net, or, when that could not be read, the namespace of the
/// first socket it proved; None until then), and its administrative
/// capabilities (/proc/PID/status).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cred {
    pub pid: u32,
    pub uid: u32,
    pub gid: u32,
    pub netns: Option<NetNs>,
    pub caps: crate::netns::Caps,
}

/// Whose connections a status listing shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Every namespace's (a privileged caller).
    Host,
    /// Those of sessions in this namespace.
    Netns(NetNs),
    /// None (the caller's namespace is unknown).
    Nowhere,
}

/// One live connection reported by a shim.
#[derive(Debug)]
pub struct Report<R> {
    pub local: SocketAddr,
    pub peer: SocketAddr,
    pub transport: Transport,
    pub reason: String,
    pub ring: Option<u64>,
    /// The ring memfd (mapped read-only by the daemon), when passed.
    pub ring_obj: Option<R>,
}

#[derive(Debug)]
struct Session<R> {
    /// A ctl-to-ctl TCP connection rather than a local process.
    peer: bool,
    cred: Cred,
    /// Set by Hello; a session without it may only say Hello.
    hello: Option<Hello>,
    listeners: HashMap<ListenerKey, usize>,
    reports: BTreeMap<i32, Report<R>>,
}

#[derive(Debug, Clone)]
struct Hello {
    pid: u32,
    exe: String,
}

/// Why a request was turned down (mapped to an `Error` reply).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegError {
    NotFound,
    NotOwner,
    BadState,
    Limit,
}

impl fmt::Display for RegError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RegError::NotFound => "no such object for this session",
            RegError::NotOwner => "owned by another session",
            RegError::BadState => "not in a state that allows this",
            RegError::Limit => "session or daemon limit reached",
        })
    }
}

/// The canonical (client, server) key of an offer. A dual-stack client
/// socket bound to `[::]:port` that connects to an IPv4 server shows up on
/// the server side with an IPv4 peer, so its wildcard is keyed as IPv4.
pub fn offer_key(client: SocketAddr, server: SocketAddr) -> (SocketAddr, SocketAddr) {
    let (c, s) = (canonical(client), canonical(server));
    if c.ip().is_unspecified() && c.is_ipv4() != s.is_ipv4() {
        let any = match s.ip() {
            IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
        };
        return (SocketAddr::new(any, c.port()), s);
    }
    (c, s)
}

/// What another host must be told (drained with [`Registry::take_events`]).
#[derive(Debug)]
pub enum PeerEvent<F> {
    /// On the server's host: an offer from `peer`'s host was claimed.
    Claimed {
        peer: SessionId,
        offer_ref: u64,
        expires: Duration,
    },
    /// On the server's host: an offer from `peer`'s host is final; it is
    /// forgotten here (the offering host keeps the outcome for Collect).
    Settled {
        peer: SessionId,
        offer_ref: u64,
        outcome: Outcome<F>,
    },
    /// On the offering host: a live forwarded offer was cancelled, its
    /// session ended, or it expired here.
    Withdrawn { offer: OfferId },
}

/// A status row as the registry sees it.
pub struct Row<'a, R> {
    pub session: SessionId,
    pub pid: u32,
    /// `pid` is SO_PEERCRED's (a pid of the daemon's namespace), not the
    /// one the process claimed in Hello.
    pub pid_from_kernel: bool,
    pub uid: u32,
    pub exe: &'a str,
    pub fd: i32,
    pub report: &'a Report<R>,
}

#[derive(Debug)]
pub struct Registry<F, R> {
    limits: Limits,
    sessions: BTreeMap<SessionId, Session<R>>,
    listeners: ListenerTable,
    offers: OfferTable<F>,
    /// Ring memfds held by reports.
    ring_fds: usize,
    counters: Counters,
    /// Reports with a ring that were closed or replaced, until the owner
    /// of the registry reads their last counters ([`Registry::take_retired`]).
    retired: Vec<Report<R>>,
}

impl<F, R> Registry<F, R> {
    pub fn new(limits: Limits) -> Self {
        Registry {
            offers: OfferTable::new(limits.offer_timeout),
            limits,
            sessions: BTreeMap::new(),
            listeners: ListenerTable::default(),
            ring_fds: 0,
            counters: Counters::default(),
            retired: Vec::new(),
        }
    }

    /// The event counters since start.
    pub fn counters(&self) -> Counters {
        Counters {
            offers_expired: self.offers.expired_count(),
            ..self.counters.clone()
        }
    }

    /// An offer refused before it reached the registry (failed proof...).
    pub fn count_refused(&mut self, reason: RefuseReason) {
        self.counters.refused(reason);
    }

    /// Ring-carrying reports closed or replaced since the last call; their
    /// ring objects are still open so their last counters can be read.
    pub fn take_retired(&mut self) -> Vec<Report<R>> {
        std::mem::take(&mut self.retired)
    }

    /// Sessions of local processes that said Hello, but `except`.
    pub fn process_sessions(&self, except: SessionId) -> usize {
        self.sessions
            .iter()
            .filter(|(&id, s)| id != except && !s.peer && s.hello.is_some())
            .count()
    }

    /// Every live connection end.
    pub fn ends(&self) -> impl Iterator<Item = &Report<R>> {
        self.sessions.values().flat_map(|s| s.reports.values())
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    // ---- sessions ----

    pub fn open_session(&mut self, id: SessionId, cred: Cred) {
        self.sessions.insert(
            id,
            Session {
                peer: false,
                cred,
                hello: None,
                listeners: HashMap::new(),
                reports: BTreeMap::new(),
            },
        );
    }

    /// A ctl-to-ctl connection: it owns the offers it carries, never says
    /// Hello, and shows no reports.
    pub fn open_peer_session(&mut self, id: SessionId) {
        self.sessions.insert(
            id,
            Session {
                peer: true,
                cred: Cred {
                    pid: 0,
                    uid: 0,
                    gid: 0,
                    netns: None,
                    caps: crate::netns::Caps::NONE,
                },
                hello: None,
                listeners: HashMap::new(),
                reports: BTreeMap::new(),
            },
        );
    }

    pub fn is_peer_session(&self, id: SessionId) -> bool {
        self.sessions.get(&id).is_some_and(|s| s.peer)
    }

    /// Records Hello (again, if repeated: the exe may change after exec).
    pub fn hello(&mut self, id: SessionId, pid: u32, exe: String) {
        if let Some(s) = self.sessions.get_mut(&id) {
            s.hello = Some(Hello { pid, exe });
        }
    }

    /// Records `netns`, the namespace of a socket session `id` proved, as
    /// the session's when its process's could not be read.
    pub fn learn_netns(&mut self, id: SessionId, netns: NetNs) {
        if let Some(s) = self.sessions.get_mut(&id) {
            s.cred.netns.get_or_insert(netns);
        }
    }

    /// The session's peer credentials (None for an unknown session).
    pub fn cred_of(&self, id: SessionId) -> Option<Cred> {
        self.sessions.get(&id).map(|s| s.cred)
    }

    pub fn has_said_hello(&self, id: SessionId) -> bool {
        self.sessions
            .get(&id)
            .is_some_and(|s| s.hello.is_some() && !s.peer)
    }

    /// The pid to show for a session: SO_PEERCRED's, unless the kernel
    /// could not name it in our pid namespace (0), then the one from Hello.
    pub fn pid_of(&self, id: SessionId) -> u32 {
        match self.sessions.get(&id) {
            Some(s) if s.cred.pid != 0 => s.cred.pid,
            Some(s) => s.hello.as_ref().map_or(0, |h| h.pid),
            None => 0,
        }
    }

    /// Everything a session registered dies with it.
    pub fn close_session(&mut self, id: SessionId, now: Instant) {
        let Some(s) = self.sessions.remove(&id) else {
            return;
        };
        for (key, n) in s.listeners {
            self.listeners.release(key, n);
        }
        self.ring_fds -= s.reports.values().filter(|r| r.ring_obj.is_some()).count();
        self.retired
            .extend(s.reports.into_values().filter(|r| r.ring_obj.is_some()));
        self.offers.close_session(id, now);
    }

    pub fn session_count(&self) -> usize {
        self.sessions.len()
    }

    // ---- listeners ----

    pub fn add_listener(&mut self, id: SessionId, key: ListenerKey) -> Result<(), RegError> {
        let s = self.sessions.get_mut(&id).ok_or(RegError::NotFound)?;
        let key = ListenerKey {
            addr: canonical(key.addr),
            ..key
        };
        let total: usize = s.listeners.values().sum();
        if total >= self.limits.max_listeners_per_session {
            return Err(RegError::Limit);
        }
        *s.listeners.entry(key).or_insert(0) += 1;
        self.listeners.add(key);
        Ok(())
    }

    /// Drops one reference this session holds on `addr` (dual-stack or not).
    pub fn remove_listener(&mut self, id: SessionId, addr: SocketAddr) -> Result<(), RegError> {
        let s = self.sessions.get_mut(&id).ok_or(RegError::NotFound)?;
        let addr = canonical(addr);
        // Its namespace is the one it was added in: a session rarely
        // listens on one address in two namespaces, and then either
        // reference may go first.
        let key = [true, false]
            .into_iter()
            .find_map(|dual_stack| {
                s.listeners
                    .keys()
                    .find(|k| k.addr == addr && k.dual_stack == dual_stack)
                    .copied()
            })
            .ok_or(RegError::NotFound)?;
        if let Some(n) = s.listeners.get_mut(&key) {
            *n -= 1;
            if *n == 0 {
                s.listeners.remove(&key);
            }
        }
        self.listeners.release(key, 1);
        Ok(())
    }

    /// Whether a listener in `netns` would take a connection to `server`.
    pub fn has_listener_for(&self, netns: NetNs, server: SocketAddr) -> bool {
        self.listeners.matches(netns, canonical(server))
    }

    /// Whether a listener in `netns` is bound to exactly `server`'s
    /// address (a wildcard one says nothing about whether the address is
    /// the namespace's own).
    pub fn has_exact_listener(&self, netns: NetNs, server: SocketAddr) -> bool {
        self.listeners.matches_exact(netns, canonical(server))
    }

    /// Every registered listener once, with the pid of a session holding
    /// it whose process is in the listener's namespace (0 when none is).
    pub fn listeners_with_pid(&self) -> Vec<(ListenerKey, u32)> {
        let mut out: BTreeMap<ListenerKey, u32> = BTreeMap::new();
        for s in self.sessions.values() {
            for key in s.listeners.keys() {
                let pid = if s.cred.netns == Some(key.netns) {
                    s.cred.pid
                } else {
                    0
                };
                let e = out.entry(*key).or_insert(0);
                if *e == 0 {
                    *e = pid;
                }
            }
        }
        out.into_iter().collect()
    }

    /// Makes `keys` (`offers::served_key`, `offers::target_key`) what the
    /// shared table says other namespaces' connections may get rings for.
    pub fn set_served(&mut self, keys: &std::collections::HashSet<ringsock_proto::offers::Key>) {
        self.offers.set_served(keys);
    }

    pub fn listener_count(&self) -> usize {
        self.listeners.len()
    }

    // ---- offers ----

    /// Registers an offer whose proof the caller verified, made on this
    /// host (`Link::Local`, or `Link::Translated`: for an address the
    /// caller found translated (DNAT) to a listener's, so no listener has
    /// it and that check is left out). The checks run in the order a client
    /// can act on: no listener (stay TCP, cache it), duplicate, then
    /// resource limits.
    pub fn offer(
        &mut self,
        id: SessionId,
        new: NewOffer<F>,
        link: Link,
        now: Instant,
    ) -> Result<OfferId, RefuseReason> {
        match self.sessions.get(&id) {
            Some(s) if !s.peer => self.register(id, new, link, now),
            _ => self.refuse(RefuseReason::Invalid),
        }
    }

    /// An offer from another host, carried by the ctl-to-ctl session
    /// `peer` (which checked its client address against the connection's
    /// source); same checks as a local offer.
    pub fn offer_from_peer(
        &mut self,
        peer: SessionId,
        offer_ref: u64,
        new: NewOffer<F>,
        now: Instant,
    ) -> Result<OfferId, RefuseReason> {
        if !self.is_peer_session(peer) {
            return self.refuse(RefuseReason::Invalid);
        }
        if self.offers.by_ref(peer, offer_ref).is_some() {
            return self.refuse(RefuseReason::Duplicate);
        }
        self.register(peer, new, Link::FromPeer { offer_ref }, now)
    }

    /// An offer for a server on another host, registered here (duplicates,
    /// limits, Collect and Cancel work as for local ones) while the ctl
    /// there is asked; the caller drops it with [`Registry::cancel`]-like
    /// [`Registry::drop_forwarded`] if that fails.
    pub fn offer_forwarded(
        &mut self,
        id: SessionId,
        new: NewOffer<F>,
        now: Instant,
    ) -> Result<OfferId, RefuseReason> {
        match self.sessions.get(&id) {
            Some(s) if !s.peer => self.register(id, new, Link::Forwarded, now),
            _ => self.refuse(RefuseReason::Invalid),
        }
    }

    fn register(
        &mut self,
        id: SessionId,
        new: NewOffer<F>,
        link: Link,
        now: Instant,
    ) -> Result<OfferId, RefuseReason> {
        let (client, server) = offer_key(new.client, new.server);
        let listened = matches!(link, Link::Forwarded | Link::Translated)
            || self.listeners.matches(new.netns, server);
        if !listened {
            return self.refuse(RefuseReason::NoListener);
        }
        if self.offers.has_live_tuple(new.netns, client, server) {
            return self.refuse(RefuseReason::Duplicate);
        }
        if self.offers.owned_by(id) >= self.limits.max_offers_per_session
            || self.held_fds() + new.fds.len() > self.limits.max_held_fds
        {
            return self.refuse(RefuseReason::TooMany);
        }
        self.counters.offers_made += 1;
        let pid = self.pid_of(id);
        let new = NewOffer {
            client,
            server,
            ..new
        };
        Ok(self.offers.insert(id, pid, new, link, now))
    }

    fn refuse(&mut self, reason: RefuseReason) -> Result<OfferId, RefuseReason> {
        self.counters.refused(reason);
        Err(reason)
    }

    /// Whether an offer came from another host (its answer cannot carry
    /// descriptors).
    pub fn is_from_peer(&self, offer: OfferId) -> bool {
        self.offers
            .get(offer)
            .is_some_and(|o| matches!(o.link, Link::FromPeer { .. }))
    }

    /// The `FromPeer` offer `peer` knows as `offer_ref`.
    pub fn peer_offer(&self, peer: SessionId, offer_ref: u64) -> Option<OfferId> {
        self.offers.by_ref(peer, offer_ref)
    }

    /// The offering host withdrew an offer it had sent us.
    pub fn cancel_from_peer(&mut self, peer: SessionId, offer_ref: u64) -> bool {
        match self.offers.by_ref(peer, offer_ref) {
            Some(id) => self.offers.remove(id).is_some(),
            None => false,
        }
    }

    /// A forwarded offer whose remote registration failed: forgotten.
    pub fn drop_forwarded(&mut self, offer: OfferId) {
        if self.forwarded_live(offer) {
            self.offers.remove(offer);
        }
    }

    fn forwarded_live(&self, offer: OfferId) -> bool {
        self.offers
            .get(offer)
            .is_some_and(|o| o.link == Link::Forwarded && o.state.is_live_state())
    }

    /// The remote ctl registered (or its server claimed) a forwarded offer
    /// and will decide within `remote`: the offer lives here that long plus
    /// `grace`, so the remote decision always arrives first.
    pub fn forwarded_extend(&mut self, offer: OfferId, remote: Duration, now: Instant) {
        if self.forwarded_live(offer) {
            let grace = self.limits.offer_timeout.min(Duration::from_secs(5));
            self.offers.extend(offer, now + remote + grace);
        }
    }

    /// The server host's process claimed a forwarded offer: Claimed here
    /// too (so Cancel answers BadState, as for a local claim), owned by the
    /// connection `by` that carries it, deciding within `remote`.
    pub fn forwarded_claimed(
        &mut self,
        offer: OfferId,
        by: SessionId,
        remote: Duration,
        now: Instant,
    ) {
        let open = self.offers.get(offer).is_some_and(|o| {
            o.link == Link::Forwarded && matches!(o.state, OfferState::Open { .. })
        });
        if open {
            self.offers.claim(offer, by, now);
            self.forwarded_extend(offer, remote, now);
        }
    }

    /// The remote ctl's final word on a forwarded offer (kept here for the
    /// offering process's Collect). False if the offer is no longer live.
    pub fn forwarded_settle(&mut self, offer: OfferId, state: OfferState<F>, now: Instant) -> bool {
        if !self.forwarded_live(offer) {
            return false;
        }
        self.offers.settle(offer, state, now);
        true
    }

    /// Transitions other hosts must hear about, in order.
    pub fn take_events(&mut self, now: Instant) -> Vec<PeerEvent<F>> {
        let mut out = Vec::new();
        for ev in self.offers.take_events() {
            match ev {
                TableEvent::Withdrawn(offer) => out.push(PeerEvent::Withdrawn { offer }),
                TableEvent::Claimed(id) => {
                    if let Some(o) = self.offers.get(id) {
                        if let (Link::FromPeer { offer_ref }, OfferState::Claimed { .. }) =
                            (o.link, &o.state)
                        {
                            out.push(PeerEvent::Claimed {
                                peer: o.owner,
                                offer_ref,
                                expires: self.offers.deadline_of(id).saturating_duration_since(now),
                            });
                        }
                    }
                }
                TableEvent::Settled(id) => {
                    let Some((peer, Link::FromPeer { offer_ref })) =
                        self.offers.get(id).map(|o| (o.owner, o.link))
                    else {
                        continue;
                    };
                    if let Some(outcome) = self.offers.take_outcome(id) {
                        if !matches!(outcome, Outcome::Pending) {
                            out.push(PeerEvent::Settled {
                                peer,
                                offer_ref,
                                outcome,
                            });
                        }
                    }
                }
            }
        }
        out
    }

    /// Claim by the session holding the accepted socket of namespace
    /// `netns` whose addresses are `local` (server side) and `peer` (client
    /// side).
    pub fn claim(
        &mut self,
        id: SessionId,
        netns: NetNs,
        local: SocketAddr,
        peer: SocketAddr,
        now: Instant,
    ) -> Option<Claimed<F>> {
        self.claim_checked(id, netns, local, peer, now, |_| true)
    }

    /// `claim`, of an offer whose client namespace `check` accepts.
    pub fn claim_checked(
        &mut self,
        id: SessionId,
        netns: NetNs,
        local: SocketAddr,
        peer: SocketAddr,
        now: Instant,
        check: impl FnOnce(NetNs) -> bool,
    ) -> Option<Claimed<F>> {
        if !self.sessions.contains_key(&id) {
            return None;
        }
        let offer = self
            .offers
            .find_open(netns, canonical(peer), canonical(local))?;
        if !check(self.offers.get(offer)?.client_netns) {
            return None;
        }
        let claimed = self.offers.claim(offer, id, now)?;
        self.counters.offers_claimed += 1;
        Some(claimed)
    }

    /// Only the session that claimed the offer may settle it, and only once.
    fn check_claimer(&self, id: SessionId, offer: OfferId) -> Result<(), RegError> {
        let o = self.offers.get(offer).ok_or(RegError::NotFound)?;
        match o.state {
            OfferState::Claimed { by } if by == id => Ok(()),
            OfferState::Claimed { .. } => Err(RegError::NotOwner),
            OfferState::Open { .. } if o.owner == id => Err(RegError::BadState),
            OfferState::Open { .. } => Err(RegError::NotOwner),
            _ => Err(RegError::BadState),
        }
    }

    pub fn answer(
        &mut self,
        id: SessionId,
        offer: OfferId,
        payload: Vec<u8>,
        fds: Vec<F>,
        now: Instant,
    ) -> Result<(), RegError> {
        self.check_claimer(id, offer)?;
        if self.held_fds() + fds.len() > self.limits.max_held_fds {
            return Err(RegError::Limit);
        }
        if let Some(o) = self.offers.get(offer) {
            let latency = now.saturating_duration_since(o.created);
            self.counters.setup_latency.observe(latency);
        }
        self.counters.offers_answered += 1;
        self.offers
            .settle(offer, OfferState::Answered { payload, fds }, now);
        Ok(())
    }

    pub fn decline(
        &mut self,
        id: SessionId,
        offer: OfferId,
        reason: String,
        now: Instant,
    ) -> Result<(), RegError> {
        self.check_claimer(id, offer)?;
        self.counters.offers_declined += 1;
        self.offers
            .settle(offer, OfferState::Declined { reason }, now);
        Ok(())
    }

    /// Offers are visible to their owner only: for anyone else an existing
    /// offer looks the same as a missing one.
    fn check_owner(&self, id: SessionId, offer: OfferId) -> Result<(), RegError> {
        match self.offers.get(offer) {
            Some(o) if o.owner == id => Ok(()),
            _ => Err(RegError::NotFound),
        }
    }

    pub fn collect(&mut self, id: SessionId, offer: OfferId) -> Result<Outcome<F>, RegError> {
        self.check_owner(id, offer)?;
        self.offers.take_outcome(offer).ok_or(RegError::NotFound)
    }

    /// Withdraws an offer nobody claimed yet (or forgets a final result).
    /// A claimed or answered offer cannot be withdrawn (`BadState`): the
    /// server may already use the ring, so the client must wait for its
    /// answer. This is what lets a client that gives up waiting fall back
    /// to TCP without ever disagreeing with the server.
    pub fn cancel(&mut self, id: SessionId, offer: OfferId) -> Result<(), RegError> {
        self.check_owner(id, offer)?;
        if matches!(
            self.offers.get(offer).map(|o| &o.state),
            Some(OfferState::Claimed { .. } | OfferState::Answered { .. })
        ) {
            return Err(RegError::BadState);
        }
        self.offers.remove(offer);
        Ok(())
    }

    /// Mirrors the live offers' 4-tuples into the table the processes
    /// read (`ringsock_proto::offers`).
    pub fn share_offers(&mut self, table: ringsock_proto::offers::Table<'static>) {
        self.offers.share(table);
    }

    pub fn offer_count(&self) -> usize {
        self.offers.len()
    }

    pub fn offer_state(&self, offer: OfferId) -> Option<&OfferState<F>> {
        self.offers.get(offer).map(|o| &o.state)
    }

    // ---- reports ----

    /// Adds or replaces the report for `fd` (a re-report updates it). The
    /// same ring end (ring id and addresses) reported under another fd of
    /// the session moves here: the process closed that number and keeps
    /// the connection under this one; its ring memfd comes along unless
    /// the report brings one. Rows without a ring never move: one process
    /// may hold two connections with one 4-tuple in two namespaces.
    pub fn report(
        &mut self,
        id: SessionId,
        fd: i32,
        mut report: Report<R>,
    ) -> Result<(), RegError> {
        let held = self.held_fds();
        let s = self.sessions.get_mut(&id).ok_or(RegError::NotFound)?;
        let moved = s
            .reports
            .iter()
            .find(|(&f, r)| {
                f != fd
                    && report.ring.is_some()
                    && r.ring == report.ring
                    && canonical(r.local) == canonical(report.local)
                    && canonical(r.peer) == canonical(report.peer)
            })
            .map(|(&f, _)| f);
        let grows = !s.reports.contains_key(&fd) && moved.is_none();
        if grows && s.reports.len() >= self.limits.max_reports_per_session {
            return Err(RegError::Limit);
        }
        let extra = usize::from(report.ring_obj.is_some());
        if held + extra > self.limits.max_held_fds {
            return Err(RegError::Limit);
        }
        let mut before = None;
        if let Some(mut old) = moved.and_then(|f| s.reports.remove(&f)) {
            before = Some(old.transport);
            if report.ring_obj.is_none() {
                report.ring_obj = old.ring_obj.take();
                if report.ring_obj.is_some() {
                    // Counted already; `extra` adds it back.
                    self.ring_fds -= 1;
                }
            }
            if old.ring_obj.is_some() {
                self.ring_fds -= 1;
                self.retired.push(old);
            }
        }
        let (local, peer, transport) = (report.local, report.peer, report.transport);
        let ring_held = usize::from(report.ring_obj.is_some());
        if let Some(old) = s.reports.insert(fd, report) {
            // The same connection re-reported (not a reused fd number).
            let same =
                canonical(old.local) == canonical(local) && canonical(old.peer) == canonical(peer);
            self.counters
                .reported(same.then_some(old.transport).or(before), transport);
            if old.ring_obj.is_some() {
                self.ring_fds -= 1;
                self.retired.push(old);
            }
        } else {
            self.counters.reported(before, transport);
        }
        self.ring_fds += ring_held;
        Ok(())
    }

    /// Removes the report for `fd` if it names the same connection (a
    /// stale close for a reused fd number must not drop the new one).
    pub fn report_closed(
        &mut self,
        id: SessionId,
        fd: i32,
        local: SocketAddr,
        peer: SocketAddr,
    ) -> Result<(), RegError> {
        let s = self.sessions.get_mut(&id).ok_or(RegError::NotFound)?;
        match s.reports.get(&fd) {
            Some(r)
                if canonical(r.local) == canonical(local)
                    && canonical(r.peer) == canonical(peer) =>
            {
                if let Some(old) = s.reports.remove(&fd) {
                    if old.ring_obj.is_some() {
                        self.ring_fds -= 1;
                        self.retired.push(old);
                    }
                }
                Ok(())
            }
            _ => Err(RegError::NotFound),
        }
    }

    /// Up to `max` rows strictly after `after` of the sessions `scope`
    /// shows, ordered by (session, fd), and the cursor of the last row when
    /// more may follow.
    pub fn status_page(
        &self,
        after: Option<StatusCursor>,
        max: usize,
        scope: Scope,
    ) -> (Vec<Row<'_, R>>, Option<StatusCursor>) {
        let mut rows = Vec::new();
        let start = match after {
            Some(c) => Bound::Included(c.session),
            None => Bound::Unbounded,
        };
        let sessions =
            self.sessions
                .range((start, Bound::Unbounded))
                .filter(|(_, s)| match scope {
                    Scope::Host => true,
                    Scope::Netns(ns) => s.cred.netns == Some(ns),
                    Scope::Nowhere => false,
                });
        'outer: for (&sid, s) in sessions {
            let fds = match after {
                Some(c) if c.session == sid => {
                    s.reports.range((Bound::Excluded(c.fd), Bound::Unbounded))
                }
                _ => s.reports.range(..),
            };
            for (&fd, report) in fds {
                if rows.len() == max {
                    break 'outer;
                }
                rows.push(Row {
                    session: sid,
                    pid: self.pid_of(sid),
                    pid_from_kernel: s.cred.pid != 0,
                    uid: s.cred.uid,
                    exe: s.hello.as_ref().map_or("", |h| h.exe.as_str()),
                    fd,
                    report,
                });
            }
        }
        let next = if rows.len() == max {
            rows.last().map(|r| StatusCursor {
                session: r.session,
                fd: r.fd,
            })
        } else {
            None
        };
        (rows, next)
    }

    // ---- time and accounting ----

    /// Applies deadlines; returns how many fired.
    pub fn tick(&mut self, now: Instant) -> usize {
        self.offers.expire(now)
    }

    pub fn next_deadline(&self) -> Option<Instant> {
        self.offers.next_deadline()
    }

    /// Descriptors held on behalf of processes (relayed fds, ring memfds,
    /// retired rings not yet taken).
    pub fn held_fds(&self) -> usize {
        self.offers.held_fds() + self.ring_fds + self.retired.len()
    }

    /// Panics if any index disagrees with the data (tests and fuzzing).
    pub fn check_invariants(&self) {
        self.offers.check_invariants();
        let rings: usize = self
            .sessions
            .values()
            .flat_map(|s| s.reports.values())
            .filter(|r| r.ring_obj.is_some())
            .count();
        assert_eq!(rings, self.ring_fds, "ring fd count");
        let mut refs: HashMap<ListenerKey, usize> = HashMap::new();
        for s in self.sessions.values() {
            for (k, n) in &s.listeners {
                assert!(*n > 0, "zero refcount kept");
                *refs.entry(*k).or_insert(0) += n;
            }
        }
        assert_eq!(refs.len(), self.listeners.len(), "listener keys");
        for k in self.listeners.keys() {
            assert_eq!(refs.get(k).copied(), Some(self.listeners.refs(k)), "refs");
        }
    }
}
