//! The offer table: each offer's life from registration to collection, with
//! its deadline, the 4-tuple index used by claims, and the count of relayed
//! descriptors held.
//!
//! ```text
//!  Open --claim--> Claimed --answer--> Answered --collect--> (gone)
//!    |                |  \--decline--> Declined --collect--> (gone)
//!    +--deadline------+----> Expired ---collect/deadline---> (gone)
//! ```
//! Every state has a deadline: Open waits for a claim, Claimed for an
//! answer, and the final states wait for the offerer to collect; when a
//! final state's deadline passes the record is dropped so a process that
//! never collects cannot pin memory or descriptors.
//!
//! An offer lives in the network namespace of the server it is for: two
//! namespaces may have the same 4-tuple live at once, and a claim matches
//! only an offer of its accepted socket's namespace.
//!
//! Offers between hosts ([`Link`]): on the offering host a `Forwarded`
//! offer stands for the one registered at the server's host (it is never
//! claimed here; the remote ctl reports its fate); on the server's host a
//! `FromPeer` offer is owned by the session of the ctl-to-ctl connection
//! that carried it. Transitions the other host must hear about are queued
//! as [`TableEvent`]s.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::{Duration, Instant};

use ringsock_proto::offers::{self, Table};

use super::SessionId;
use crate::netns::NetNs;

pub type OfferId = u64;

/// Where an offer stands. `F` is the descriptor type (OwnedFd in the
/// daemon): dropping a state drops, hence closes, the descriptors it holds.
#[derive(Debug)]
pub enum OfferState<F> {
    /// Registered, waiting for the server's claim; holds the client's fds.
    Open {
        payload: Vec<u8>,
        fds: Vec<F>,
    },
    /// Claimed by session `by`; the client's fds went to the claimer.
    Claimed {
        by: SessionId,
    },
    /// Answered by the claimer; holds the server's fds for the offerer.
    Answered {
        payload: Vec<u8>,
        fds: Vec<F>,
    },
    Declined {
        reason: String,
    },
    /// Not claimed or not answered in time.
    Expired,
}

impl<F> OfferState<F> {
    fn held_fds(&self) -> usize {
        match self {
            OfferState::Open { fds, .. } | OfferState::Answered { fds, .. } => fds.len(),
            _ => 0,
        }
    }

    /// Open or Claimed: still waiting for a decision.
    pub fn is_live_state(&self) -> bool {
        self.is_live()
    }

    /// Open and Claimed offers own their 4-tuple: a second offer for it is a
    /// duplicate, and only Open ones can be claimed.
    fn is_live(&self) -> bool {
        matches!(self, OfferState::Open { .. } | OfferState::Claimed { .. })
    }
}

/// Where an offer came from, for offers that span two hosts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Link {
    /// Offer and claim on this host.
    Local,
    /// Offer and claim on this host, for an address translated (DNAT) to
    /// the claimer's.
    Translated,
    /// Made here, registered at the server's host; not claimable here.
    Forwarded,
    /// Made on another host; `offer_ref` is its id there.
    FromPeer { offer_ref: u64 },
}

/// A transition another host must learn about (drained by the registry).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TableEvent {
    /// A `FromPeer` offer was claimed.
    Claimed(OfferId),
    /// A `FromPeer` offer reached a final state.
    Settled(OfferId),
    /// A live `Forwarded` offer was cancelled, dropped or expired here.
    Withdrawn(OfferId),
}

#[derive(Debug)]
pub struct Offer<F> {
    pub owner: SessionId,
    pub owner_pid: u32,
    /// Canonical client address (may have an unspecified IP: socket bound to
    /// the wildcard before connect; then only the port identifies it).
    pub client: SocketAddr,
    /// Canonical server address.
    pub server: SocketAddr,
    /// The namespace of the server the offer is for.
    pub netns: NetNs,
    /// The namespace of the offering client's socket (another than
    /// `netns` for a ring between two namespaces).
    pub client_netns: NetNs,
    pub state: OfferState<F>,
    pub link: Link,
    /// When it was registered (the start of its setup latency).
    pub created: Instant,
    deadline: Instant,
}

/// An offer as requested: addresses, opaque payload, relayed descriptors.
#[derive(Debug)]
pub struct NewOffer<F> {
    pub client: SocketAddr,
    pub server: SocketAddr,
    /// The namespace of the server it is for (the caller's finding).
    pub netns: NetNs,
    /// The namespace of the client's socket.
    pub client_netns: NetNs,
    pub payload: Vec<u8>,
    pub fds: Vec<F>,
}

/// What a claim hands to the claimer.
#[derive(Debug)]
pub struct Claimed<F> {
    pub offer_id: OfferId,
    pub client_pid: u32,
    pub payload: Vec<u8>,
    pub fds: Vec<F>,
}

/// What Collect tells the offerer.
#[derive(Debug)]
pub enum Outcome<F> {
    Pending,
    Answered { payload: Vec<u8>, fds: Vec<F> },
    Declined { reason: String },
    Expired,
}

#[derive(Debug)]
pub struct OfferTable<F> {
    offers: HashMap<OfferId, Offer<F>>,
    /// (namespace, client, server) of live offers.
    by_tuple: HashMap<Tuple, OfferId>,
    deadlines: BTreeSet<(Instant, OfferId)>,
    by_owner: HashMap<SessionId, HashSet<OfferId>>,
    /// Offers in state Claimed, per claiming session.
    by_claimer: HashMap<SessionId, HashSet<OfferId>>,
    /// `FromPeer` offers by (carrying session, remote id).
    by_ref: HashMap<(SessionId, u64), OfferId>,
    events: Vec<TableEvent>,
    held_fds: usize,
    /// Live offers whose deadline passed, since the table was made.
    expired: u64,
    next_id: OfferId,
    timeout: Duration,
    /// The live offers' 4-tuples, mirrored for the local processes
    /// (`ringsock_proto::offers`), with whether each found room there.
    shared: Option<Shared>,
    /// Keys of what listeners of this host take from other namespaces
    /// (`offers::served_key`, `offers::target_key`), with whether each is
    /// in the shared table (false until it is shared, or without room).
    served: HashMap<offers::Key, bool>,
}

/// The offer table the daemon shares with its processes.
struct Shared {
    table: Table<'static>,
    stored: HashMap<Tuple, bool>,
}

/// A live offer's index key. The shared table leaves the namespace out: a
/// server there may find another namespace's offer for its 4-tuple, and
/// then asks the daemon, which answers by the namespace (a round trip,
/// never a wrong ring).
type Tuple = (NetNs, SocketAddr, SocketAddr);

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Shared {{ {} entries }}", self.stored.len())
    }
}

/// Reason recorded when the claimer's session ends before it answered.
pub const CLAIMER_GONE: &str = "claiming process closed its control session";

fn unspecified(addr: SocketAddr) -> SocketAddr {
    let ip = match addr.ip() {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    };
    SocketAddr::new(ip, addr.port())
}

impl<F> OfferTable<F> {
    pub fn new(timeout: Duration) -> Self {
        OfferTable {
            offers: HashMap::new(),
            by_tuple: HashMap::new(),
            deadlines: BTreeSet::new(),
            by_owner: HashMap::new(),
            by_claimer: HashMap::new(),
            by_ref: HashMap::new(),
            events: Vec::new(),
            held_fds: 0,
            expired: 0,
            next_id: 1,
            timeout,
            shared: None,
            served: HashMap::new(),
        }
    }

    /// Mirrors the live offers' 4-tuples into `table` from now on (and
    /// those live already).
    pub fn share(&mut self, table: Table<'static>) {
        let mut stored = HashMap::new();
        for &(netns, client, server) in self.by_tuple.keys() {
            stored.insert(
                (netns, client, server),
                table.insert(&offers::key(&client, &server)),
            );
        }
        for (k, stored) in &mut self.served {
            *stored = table.insert(k);
        }
        self.shared = Some(Shared { table, stored });
    }

    /// Makes `keys` the served keys the shared table lists.
    pub fn set_served(&mut self, keys: &HashSet<offers::Key>) {
        let table = self.shared.as_ref().map(|sh| sh.table);
        self.served.retain(|k, stored| {
            let keep = keys.contains(k);
            if let (false, Some(t)) = (keep, table) {
                t.remove(k, *stored);
            }
            keep
        });
        for k in keys {
            self.served
                .entry(*k)
                .or_insert_with(|| table.is_some_and(|t| t.insert(k)));
        }
    }

    fn tuple_live(&mut self, t: Tuple) {
        if let Some(sh) = &mut self.shared {
            let stored = sh.table.insert(&offers::key(&t.1, &t.2));
            sh.stored.insert(t, stored);
        }
    }

    fn tuple_gone(&mut self, t: Tuple) {
        if let Some(sh) = &mut self.shared {
            if let Some(stored) = sh.stored.remove(&t) {
                sh.table.remove(&offers::key(&t.1, &t.2), stored);
            }
        }
    }

    /// Live offers that expired so far.
    pub fn expired_count(&self) -> u64 {
        self.expired
    }

    pub fn len(&self) -> usize {
        self.offers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.offers.is_empty()
    }

    /// Relayed descriptors currently held (Open and Answered offers).
    pub fn held_fds(&self) -> usize {
        self.held_fds
    }

    pub fn owned_by(&self, session: SessionId) -> usize {
        self.by_owner.get(&session).map_or(0, HashSet::len)
    }

    pub fn get(&self, id: OfferId) -> Option<&Offer<F>> {
        self.offers.get(&id)
    }

    pub fn next_deadline(&self) -> Option<Instant> {
        self.deadlines.first().map(|&(t, _)| t)
    }

    pub fn has_live_tuple(&self, netns: NetNs, client: SocketAddr, server: SocketAddr) -> bool {
        self.by_tuple.contains_key(&(netns, client, server))
    }

    /// The `FromPeer` offer a ctl-to-ctl session knows as `offer_ref`.
    pub fn by_ref(&self, session: SessionId, offer_ref: u64) -> Option<OfferId> {
        self.by_ref.get(&(session, offer_ref)).copied()
    }

    /// Transitions queued for other hosts since the last call.
    pub fn take_events(&mut self) -> Vec<TableEvent> {
        std::mem::take(&mut self.events)
    }

    pub fn deadline_of(&self, id: OfferId) -> Instant {
        self.offers
            .get(&id)
            .map_or_else(Instant::now, |o| o.deadline)
    }

    /// Moves a deadline (remote offers follow the other host's timers).
    pub fn extend(&mut self, id: OfferId, deadline: Instant) {
        self.set_deadline(id, deadline);
    }

    /// Registers an Open offer (canonical addresses). The caller checked
    /// duplicates and limits.
    pub fn insert(
        &mut self,
        owner: SessionId,
        owner_pid: u32,
        new: NewOffer<F>,
        link: Link,
        now: Instant,
    ) -> OfferId {
        let NewOffer {
            client,
            server,
            netns,
            client_netns,
            payload,
            fds,
        } = new;
        let id = self.next_id;
        self.next_id += 1;
        let deadline = now + self.timeout;
        self.held_fds += fds.len();
        self.by_tuple.insert((netns, client, server), id);
        self.tuple_live((netns, client, server));
        self.deadlines.insert((deadline, id));
        self.by_owner.entry(owner).or_default().insert(id);
        if let Link::FromPeer { offer_ref } = link {
            self.by_ref.insert((owner, offer_ref), id);
        }
        self.offers.insert(
            id,
            Offer {
                owner,
                owner_pid,
                client,
                server,
                netns,
                client_netns,
                state: OfferState::Open { payload, fds },
                link,
                created: now,
                deadline,
            },
        );
        id
    }

    /// The Open offer for an accepted connection of namespace `netns`
    /// (`peer` = client side, `local` = server side, both canonical): exact
    /// client address first, then a client bound to the wildcard address
    /// with the same port.
    pub fn find_open(&self, netns: NetNs, peer: SocketAddr, local: SocketAddr) -> Option<OfferId> {
        [peer, unspecified(peer)]
            .iter()
            .filter_map(|&c| self.by_tuple.get(&(netns, c, local)).copied())
            .find(|id| {
                self.offers.get(id).is_some_and(|o| {
                    matches!(o.state, OfferState::Open { .. }) && o.link != Link::Forwarded
                })
            })
    }

    fn set_deadline(&mut self, id: OfferId, deadline: Instant) {
        if let Some(o) = self.offers.get_mut(&id) {
            self.deadlines.remove(&(o.deadline, id));
            o.deadline = deadline;
            self.deadlines.insert((deadline, id));
        }
    }

    /// Swaps an offer's state, keeping the fd count, tuple index and claimer
    /// index in step. Returns the previous state.
    fn transition(&mut self, id: OfferId, new: OfferState<F>) -> Option<OfferState<F>> {
        let o = self.offers.get_mut(&id)?;
        self.held_fds = self.held_fds - o.state.held_fds() + new.held_fds();
        if let OfferState::Claimed { by } = o.state {
            remove_from(&mut self.by_claimer, by, id);
        }
        if let OfferState::Claimed { by } = new {
            self.by_claimer.entry(by).or_default().insert(id);
        }
        let gone = (o.state.is_live() && !new.is_live()).then_some((o.netns, o.client, o.server));
        let old = std::mem::replace(&mut o.state, new);
        if let Some(t) = gone {
            self.by_tuple.remove(&t);
            self.tuple_gone(t);
        }
        Some(old)
    }

    /// Open -> Claimed by `by`; hands the client's payload and fds over.
    pub fn claim(&mut self, id: OfferId, by: SessionId, now: Instant) -> Option<Claimed<F>> {
        let o = self.offers.get(&id)?;
        if !matches!(o.state, OfferState::Open { .. }) {
            return None;
        }
        let client_pid = o.owner_pid;
        if matches!(o.link, Link::FromPeer { .. }) {
            self.events.push(TableEvent::Claimed(id));
        }
        let old = self.transition(id, OfferState::Claimed { by })?;
        self.set_deadline(id, now + self.timeout);
        match old {
            OfferState::Open { payload, fds } => Some(Claimed {
                offer_id: id,
                client_pid,
                payload,
                fds,
            }),
            // Checked Open above.
            _ => None,
        }
    }

    /// Claimed -> a final state (Answered or Declined), giving the offerer
    /// `timeout` to collect it.
    pub fn settle(&mut self, id: OfferId, outcome: OfferState<F>, now: Instant) {
        if self
            .offers
            .get(&id)
            .is_some_and(|o| matches!(o.link, Link::FromPeer { .. }))
        {
            self.events.push(TableEvent::Settled(id));
        }
        self.transition(id, outcome);
        self.set_deadline(id, now + self.timeout);
    }

    /// For Collect: final states are removed and returned; live ones are
    /// Pending.
    pub fn take_outcome(&mut self, id: OfferId) -> Option<Outcome<F>> {
        let o = self.offers.get(&id)?;
        if o.state.is_live() {
            return Some(Outcome::Pending);
        }
        let o = self.remove(id)?;
        Some(match o.state {
            OfferState::Answered { payload, fds } => Outcome::Answered { payload, fds },
            OfferState::Declined { reason } => Outcome::Declined { reason },
            _ => Outcome::Expired,
        })
    }

    /// Drops an offer entirely (its descriptors close with it).
    pub fn remove(&mut self, id: OfferId) -> Option<Offer<F>> {
        // Going through `transition` releases the fd count and the tuple
        // and claimer indexes; the real previous state goes to the caller.
        let old = self.transition(id, OfferState::Expired)?;
        let mut o = self.offers.remove(&id)?;
        self.deadlines.remove(&(o.deadline, id));
        remove_from(&mut self.by_owner, o.owner, id);
        match o.link {
            Link::FromPeer { offer_ref } => {
                self.by_ref.remove(&(o.owner, offer_ref));
            }
            Link::Forwarded if old.is_live() => self.events.push(TableEvent::Withdrawn(id)),
            _ => {}
        }
        o.state = old;
        Some(o)
    }

    /// Applies every deadline that passed: live offers expire (dropping the
    /// relayed fds they hold), final ones are forgotten.
    pub fn expire(&mut self, now: Instant) -> usize {
        let mut n = 0;
        while let Some(&(t, id)) = self.deadlines.first() {
            if t > now {
                break;
            }
            n += 1;
            let live = self.offers.get(&id).filter(|o| o.state.is_live());
            if let Some(o) = live {
                match o.link {
                    Link::FromPeer { .. } => self.events.push(TableEvent::Settled(id)),
                    Link::Forwarded => self.events.push(TableEvent::Withdrawn(id)),
                    Link::Local | Link::Translated => {}
                }
                self.transition(id, OfferState::Expired);
                self.set_deadline(id, now + self.timeout);
                self.expired += 1;
            } else {
                self.remove(id);
            }
        }
        n
    }

    /// A session ended: its own offers vanish (a later claim finds nothing,
    /// a claimer's answer gets NotFound); offers it had claimed but not
    /// answered become Declined so their offerers learn it at once.
    pub fn close_session(&mut self, session: SessionId, now: Instant) {
        for id in self.by_owner.remove(&session).unwrap_or_default() {
            self.remove(id);
        }
        for id in self.by_claimer.remove(&session).unwrap_or_default() {
            self.settle(
                id,
                OfferState::Declined {
                    reason: CLAIMER_GONE.to_owned(),
                },
                now,
            );
        }
    }

    /// Recomputes every index from scratch and compares (tests, fuzzing).
    pub fn check_invariants(&self) {
        let held: usize = self.offers.values().map(|o| o.state.held_fds()).sum();
        assert_eq!(held, self.held_fds, "held fd count");
        assert_eq!(self.deadlines.len(), self.offers.len(), "deadline index");
        for (id, o) in &self.offers {
            assert!(self.deadlines.contains(&(o.deadline, *id)));
            assert!(self.by_owner.get(&o.owner).is_some_and(|s| s.contains(id)));
            assert_eq!(
                o.state.is_live(),
                self.by_tuple.get(&(o.netns, o.client, o.server)) == Some(id),
                "tuple index of offer {id}"
            );
            if let OfferState::Claimed { by } = o.state {
                assert!(self.by_claimer.get(&by).is_some_and(|s| s.contains(id)));
            }
        }
        assert!(self
            .by_tuple
            .values()
            .all(|id| self.offers.contains_key(id)));
        let refs = self
            .offers
            .values()
            .filter(|o| matches!(o.link, Link::FromPeer { .. }))
            .count();
        assert_eq!(refs, self.by_ref.len(), "remote ref index");
        for (&(session, _), id) in &self.by_ref {
            assert_eq!(self.offers.get(id).map(|o| o.owner), Some(session));
        }
        let owned: usize = self.by_owner.values().map(HashSet::len).sum();
        assert_eq!(owned, self.offers.len(), "owner index");
        for ids in self.by_claimer.values() {
            for id in ids {
                assert!(matches!(
                    self.offers.get(id).map(|o| &o.state),
                    Some(OfferState::Claimed { .. })
                ));
            }
        }
    }
}

fn remove_from(map: &mut HashMap<SessionId, HashSet<OfferId>>, key: SessionId, id: OfferId) {
    if let Some(set) = map.get_mut(&key) {
        set.remove(&id);
        if set.is_empty() {
            map.remove(&key);
        }
    }
}
