//! Test and fuzz support: a fake descriptor environment and a driver that
//! plays arbitrary bytes as a script of session events against the
//! [`Handler`]. Used by `fuzz/fuzz_targets/ctl_decode.rs`, by a proptest,
//! and by the handler's unit tests.
//!
//! After every step the driver checks the registry's invariants and that
//! exactly the fake descriptors the registry claims to hold are alive: a
//! leak or a double release anywhere in the state machine fails loudly.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use ringsock_proto::{
    frame, Msg, RingStat, StatusCursor, Transport, MAX_EXE, MAX_FDS, MAX_FRAME_TOTAL, MAX_PAYLOAD,
    MAX_REASON, MAX_STAT_NAME,
};

use crate::handler::{ClientProof, Env, Handler, ListenerProof};
use crate::registry::{Cred, Limits, SessionId};

/// What a fake descriptor pretends to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FakeSock {
    Listener {
        addr: SocketAddr,
        dual_stack: bool,
    },
    /// Bound (and maybe connected) client socket.
    Client {
        local: SocketAddr,
        peer: Option<SocketAddr>,
    },
    /// Accepted (connected) socket.
    Accepted {
        local: SocketAddr,
        peer: SocketAddr,
    },
    Memfd {
        size: u64,
    },
    /// Anything else (a pipe, a file...).
    Other,
}

/// A fake descriptor; counts itself alive until dropped.
#[derive(Debug)]
pub struct FakeFd {
    pub sock: FakeSock,
    live: Rc<Cell<usize>>,
}

impl Drop for FakeFd {
    fn drop(&mut self) {
        self.live.set(self.live.get() - 1);
    }
}

/// Hands out fake descriptors and answers proofs from what they pretend.
#[derive(Debug, Default, Clone)]
pub struct FakeEnv {
    live: Rc<Cell<usize>>,
}

impl FakeEnv {
    pub fn fd(&self, sock: FakeSock) -> FakeFd {
        self.live.set(self.live.get() + 1);
        FakeFd {
            sock,
            live: self.live.clone(),
        }
    }

    /// Fake descriptors alive right now.
    pub fn live(&self) -> usize {
        self.live.get()
    }
}

impl Env for FakeEnv {
    type Fd = FakeFd;
    type Ring = FakeFd;

    fn listener(&mut self, fd: &FakeFd) -> Result<ListenerProof, String> {
        match fd.sock {
            FakeSock::Listener { addr, dual_stack } => Ok(ListenerProof { addr, dual_stack }),
            _ => Err("not a listening TCP socket".into()),
        }
    }

    fn client(&mut self, fd: &FakeFd) -> Result<ClientProof, String> {
        match fd.sock {
            FakeSock::Client { local, peer } => Ok(ClientProof { local, peer }),
            FakeSock::Accepted { local, peer } => Ok(ClientProof {
                local,
                peer: Some(peer),
            }),
            _ => Err("not a TCP client socket".into()),
        }
    }

    fn accepted(&mut self, fd: &FakeFd) -> Result<(SocketAddr, SocketAddr), String> {
        match fd.sock {
            FakeSock::Accepted { local, peer } => Ok((local, peer)),
            FakeSock::Client {
                local,
                peer: Some(peer),
            } => Ok((local, peer)),
            _ => Err("not a connected TCP socket".into()),
        }
    }

    fn open_ring(&mut self, fd: FakeFd) -> FakeFd {
        fd
    }

    /// 192.0.2.0/24 (TEST-NET-1) stands for other hosts.
    fn is_local_ip(&mut self, ip: std::net::IpAddr) -> bool {
        !matches!(ip, std::net::IpAddr::V4(v4) if v4.octets()[..3] == [192, 0, 2])
    }

    /// `memfd_size`, then as many more counters as the memfd has pages,
    /// modulo 48, with over-long names: a provider may return more and
    /// longer than an entry carries, and the handler must cut both (a full
    /// page of such entries must still encode).
    fn ring_stats(&self, ring: &FakeFd) -> Vec<RingStat> {
        let size = match ring.sock {
            FakeSock::Memfd { size } => size,
            _ => 0,
        };
        let extra = (size >> 12) % 48;
        std::iter::once(RingStat {
            name: "memfd_size".into(),
            value: size,
        })
        .chain((0..extra).map(|i| RingStat {
            name: format!("{i:02}_{}", "n".repeat(MAX_STAT_NAME)),
            value: u64::MAX - i,
        }))
        .collect()
    }
}

/// Addresses the script picks from: few, so that offers, listeners and
/// claims collide often, with wildcard, v6 and v4-mapped forms.
/// 192.0.2.1 is another host (offers for it are forwarded).
pub const ADDRS: [&str; 16] = [
    "127.0.0.1:80",
    "127.0.0.1:5000",
    "0.0.0.0:80",
    "[::]:80",
    "[::ffff:127.0.0.1]:5000",
    "127.0.0.1:5001",
    "[::1]:80",
    "0.0.0.0:5000",
    "[::1]:5002",
    "[::]:5002",
    "10.0.0.1:80",
    "127.0.0.1:0",
    "[fe80::1%2]:80",
    "[::ffff:127.0.0.1]:80",
    "192.0.2.1:80",
    "10.0.0.1:5003",
];

pub fn addr(i: u8) -> SocketAddr {
    ADDRS[usize::from(i) % ADDRS.len()]
        .parse()
        .unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 1)))
}

/// Reads script bytes; past the end every read is 0, so any input is a
/// complete script.
struct Script<'a> {
    data: &'a [u8],
}

impl Script<'_> {
    fn done(&self) -> bool {
        self.data.is_empty()
    }

    fn u8(&mut self) -> u8 {
        match self.data.split_first() {
            Some((&b, rest)) => {
                self.data = rest;
                b
            }
            None => 0,
        }
    }

    fn u16(&mut self) -> u16 {
        u16::from(self.u8()) | u16::from(self.u8()) << 8
    }

    fn u64(&mut self) -> u64 {
        u64::from(self.u8()) % 16
    }

    fn take(&mut self, n: usize) -> Vec<u8> {
        let (b, rest) = self.data.split_at(n.min(self.data.len()));
        self.data = rest;
        b.to_vec()
    }

    /// Up to `max` bytes; usually short, so one field does not swallow
    /// the rest of the script.
    fn bytes(&mut self, max: usize) -> Vec<u8> {
        let r = self.u8();
        let n = if r == 0xff {
            usize::from(self.u16()) % (max + 1)
        } else {
            usize::from(r % 16).min(max)
        };
        self.take(n)
    }

    fn text(&mut self, max: usize) -> String {
        // Lossy decoding may triple a byte's size: stay under `max`.
        String::from_utf8_lossy(&self.bytes(max / 3)).into_owned()
    }
}

const SESSIONS: u8 = 4;

/// What the script has seen, so later steps can refer to it: without this
/// a fuzzer would have to guess a matching 4-tuple or offer id, and would
/// rarely get past "NoOffer".
#[derive(Default)]
struct Memory {
    /// (client, server) of offers the daemon accepted.
    tuples: Vec<(SocketAddr, SocketAddr)>,
    /// Accepted offers and the session that made each.
    ids: Vec<(u64, SessionId)>,
    /// Addresses of listeners the daemon accepted.
    listeners: Vec<SocketAddr>,
    /// Offers some session claimed, and which session.
    claimed: Vec<(u64, SessionId)>,
    /// Offers forwarded to another host (the driver plays that host).
    forwarded: Vec<u64>,
}

impl Memory {
    /// An offer id for Answer/Decline: usually a claimed one, then sent by
    /// its claimer (the returned session) so answers actually land.
    fn claimed_id(&self, s: &mut Script<'_>) -> (u64, Option<SessionId>) {
        let r = s.u8();
        match self.claimed.get(usize::from(r) % self.claimed.len().max(1)) {
            Some(&(id, by)) if r & 0x80 == 0 => (id, (r & 0x40 == 0).then_some(by)),
            _ => (self.id(s), None),
        }
    }

    /// A server address some listener covers (a wildcard made concrete).
    fn server(&self, s: &mut Script<'_>) -> SocketAddr {
        let r = s.u8();
        match self
            .listeners
            .get(usize::from(r) % self.listeners.len().max(1))
        {
            Some(&l) if r & 0x80 == 0 => {
                let mut a = l;
                if a.ip().is_unspecified() {
                    a.set_ip(match a {
                        SocketAddr::V4(_) => [127, 0, 0, 1].into(),
                        SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
                    });
                }
                a
            }
            _ => addr(r),
        }
    }

    /// An offer id: usually one the daemon handed out, then (usually)
    /// sent by its owner; sometimes any small number.
    fn owned_id(&self, s: &mut Script<'_>) -> (u64, Option<SessionId>) {
        let r = s.u8();
        match self.ids.get(usize::from(r) % self.ids.len().max(1)) {
            Some(&(id, owner)) if r & 0x80 == 0 => (id, (r & 0x40 == 0).then_some(owner)),
            _ => (u64::from(r % 16), None),
        }
    }

    fn id(&self, s: &mut Script<'_>) -> u64 {
        self.owned_id(s).0
    }

    /// The accepted socket that really belongs to a remembered offer: the
    /// server side's view (local = server, peer = client; a client bound to
    /// a wildcard shows up with a concrete address).
    fn accepted(&self, pick: u8) -> Option<FakeSock> {
        let &(client, server) = self
            .tuples
            .get(usize::from(pick) % self.tuples.len().max(1))?;
        let mut peer = client;
        if peer.ip().is_unspecified() {
            peer.set_ip(server.ip());
        }
        Some(FakeSock::Accepted {
            local: server,
            peer,
        })
    }
}

/// How many replies of each kind a script produced, and how many sessions
/// were closed for faults: lets tests check the driver reaches deep states.
#[derive(Debug, Default)]
pub struct ScriptStats {
    pub replies: BTreeMap<&'static str, usize>,
    pub faults: usize,
}

/// Drives a handler through the events encoded in `data`. Panics only if
/// an invariant breaks (which is the point).
pub fn run_script(data: &[u8]) -> ScriptStats {
    let mut stats = ScriptStats::default();
    let env = FakeEnv::default();
    let limits = Limits {
        offer_timeout: Duration::from_millis(500),
        max_offers_per_session: 8,
        max_listeners_per_session: 8,
        max_reports_per_session: 8,
        max_held_fds: 48,
    };
    let mut h = Handler::new(env.clone(), limits, 7);
    let mut open = [false; SESSIONS as usize];
    let mut mem = Memory::default();
    let mut now = Instant::now();
    let mut peer_open = false;
    let mut s = Script { data };
    while !s.done() {
        let op = s.u8();
        let sid = op / 16 % SESSIONS;
        let mut id = SessionId::from(sid);
        let slot = usize::from(sid);
        match op % 16 {
            0 => {
                h.close_session(id, now);
                open[slot] = false;
            }
            1 => {
                if open[slot] {
                    h.close_session(id, now);
                }
                let pid = s.u8();
                let cred = Cred {
                    pid: u32::from(pid),
                    uid: 0,
                    gid: 0,
                };
                h.open_session(id, cred);
                open[slot] = true;
                // Usually say Hello at once: most scripts should get going.
                if pid & 1 == 0 {
                    let hello = Msg::Hello {
                        pid: 1,
                        exe: String::new(),
                    };
                    if h.handle(id, hello, Vec::new(), now).is_err() {
                        panic!("Hello refused");
                    }
                }
            }
            2 => {
                now += Duration::from_millis(u64::from(s.u8()));
                h.tick(now);
            }
            4 => {
                if !peer_open {
                    h.registry_mut().open_peer_session(PEER);
                    peer_open = true;
                }
                if !peer_step(&mut h, &mut s, &mut mem, &mut stats, now) {
                    stats.faults += 1;
                    h.close_session(PEER, now);
                    peer_open = false;
                }
            }
            _ => {
                if !open[slot] {
                    // Talking on a closed session reopens it (after Hello).
                    h.open_session(
                        id,
                        Cred {
                            pid: 9,
                            uid: 0,
                            gid: 0,
                        },
                    );
                    let hello = Msg::Hello {
                        pid: 9,
                        exe: String::new(),
                    };
                    if h.handle(id, hello, Vec::new(), now).is_err() {
                        panic!("Hello refused");
                    }
                    open[slot] = true;
                }
                let (msg, bytes, fds) = if op % 16 == 3 {
                    (None, s.bytes(MAX_FRAME_TOTAL), fake_fds(&env, &mut s))
                } else {
                    let (msg, speaker) = message(&mut s, &mem);
                    if let Some(by) = speaker.filter(|by| open[(by % u64::from(SESSIONS)) as usize])
                    {
                        id = by;
                    }
                    let fds = fds_for(&msg, &env, &mut s, &mem);
                    let bytes = frame::encode(&msg).unwrap_or_default();
                    (Some(msg), bytes, fds)
                };
                match h.handle_frame(id, &bytes, fds, now) {
                    // The reply (and its relayed fds) goes out and is gone.
                    Ok(reply) => {
                        assert!(frame::encode(&reply.msg).is_ok(), "unencodable reply");
                        if let Some(fwd) = &reply.forward {
                            *stats.replies.entry("(forwarded)").or_insert(0) += 1;
                            // The other host registers it, or cannot be asked.
                            if s.u8() & 1 == 0 {
                                let ms = Duration::from_millis(u64::from(s.u8()) * 4);
                                h.registry_mut().forwarded_extend(fwd.offer_id, ms, now);
                                mem.ids.push((fwd.offer_id, id));
                                mem.forwarded.push(fwd.offer_id);
                            } else {
                                h.registry_mut().drop_forwarded(fwd.offer_id);
                            }
                        }
                        *stats.replies.entry(reply.msg.name()).or_insert(0) += 1;
                        match (&msg, &reply.msg) {
                            (
                                Some(Msg::Offer { client, server, .. }),
                                Msg::OfferOk { offer_id },
                            ) => {
                                mem.tuples.push((*client, *server));
                                mem.ids.push((*offer_id, id));
                            }
                            (Some(Msg::ListenerAdd { addr }), Msg::Ok) => mem.listeners.push(*addr),
                            (_, Msg::ClaimOk { offer_id, .. }) => mem.claimed.push((*offer_id, id)),
                            _ => {}
                        }
                    }
                    Err(_) => {
                        stats.faults += 1;
                        h.close_session(id, now);
                        // `id` may be the speaker's, not the script's choice.
                        open[(id % u64::from(SESSIONS)) as usize] = false;
                    }
                }
            }
        }
        // What the server would send to other hosts; delivered and gone.
        drop(h.take_peer_events(now));
        h.registry().check_invariants();
        assert_eq!(
            env.live(),
            h.registry().held_fds(),
            "fake fds alive vs held by the registry"
        );
    }
    stats
}

/// Session id of the one ctl-to-ctl connection the driver plays.
const PEER: SessionId = 100;

/// One ctl-to-ctl event: a message from the other host (as the accepting
/// side sees it), or the other host's news about an offer forwarded there.
/// False if the message was a fault (the connection is then closed).
fn peer_step(
    h: &mut Handler<FakeEnv>,
    s: &mut Script<'_>,
    mem: &mut Memory,
    stats: &mut ScriptStats,
    now: Instant,
) -> bool {
    let pick = |s: &mut Script<'_>, v: &[u64]| v.get(usize::from(s.u8()) % v.len().max(1)).copied();
    match s.u8() % 8 {
        0..=2 => {
            let offer_ref = u64::from(s.u8() % 8);
            let client = addr(s.u8());
            let mut server = mem.server(s);
            // Our loopback is never a remote offer's target: use the one
            // non-loopback local address the listeners may cover.
            if server.ip().is_loopback() && s.u8() & 1 == 0 {
                server.set_ip([10, 0, 0, 1].into());
            }
            // Usually from the client's own address, as the rule wants.
            let source = if s.u8() & 3 != 0 {
                client.ip()
            } else {
                addr(s.u8()).ip()
            };
            let msg = Msg::RemoteOffer {
                offer_ref,
                client,
                server,
                payload: s.bytes(64),
            };
            match h.peer_request(PEER, source, msg, now) {
                Ok(Some(reply)) => {
                    *stats.replies.entry(reply.name()).or_insert(0) += 1;
                    if matches!(reply, Msg::RemoteOfferOk { .. }) {
                        mem.tuples.push((client, server));
                    }
                    true
                }
                Ok(None) => true,
                Err(_) => false,
            }
        }
        3 => {
            let msg = if s.u8() & 7 == 0 {
                // Out of protocol for the accepting side.
                Msg::RemoteExpired {
                    offer_ref: u64::from(s.u8()),
                }
            } else {
                Msg::RemoteCancel {
                    offer_ref: u64::from(s.u8() % 8),
                }
            };
            h.peer_request(PEER, addr(0).ip(), msg, now).is_ok()
        }
        4 => {
            if let Some(id) = pick(s, &mem.forwarded) {
                let ms = Duration::from_millis(u64::from(s.u8()) * 4);
                h.registry_mut().forwarded_claimed(id, PEER + 1, ms, now);
            }
            true
        }
        5 | 6 => {
            if let Some(id) = pick(s, &mem.forwarded) {
                let state = match s.u8() % 3 {
                    0 => crate::registry::OfferState::Answered {
                        payload: s.bytes(16),
                        fds: Vec::new(),
                    },
                    1 => crate::registry::OfferState::Declined {
                        reason: s.text(MAX_REASON),
                    },
                    _ => crate::registry::OfferState::Expired,
                };
                h.registry_mut().forwarded_settle(id, state, now);
            }
            true
        }
        _ => {
            if let Some(id) = pick(s, &mem.forwarded) {
                let ms = Duration::from_millis(u64::from(s.u8()) * 4);
                h.registry_mut().forwarded_extend(id, ms, now);
            }
            true
        }
    }
}

/// Descriptors for a well-formed request: usually a legal count, with the
/// proof (if the kind takes one) usually honest; sometimes anything.
fn fds_for(msg: &Msg, env: &FakeEnv, s: &mut Script<'_>, mem: &Memory) -> Vec<FakeFd> {
    let r = s.u8();
    let (lo, hi) = msg.fd_range();
    let n = if r & 0xf0 == 0xf0 {
        usize::from(r) % (MAX_FDS + 1)
    } else {
        lo + usize::from(r) % (hi - lo + 1)
    };
    let honest = match msg {
        _ if r & 0x0c == 0x0c || n == 0 => None,
        Msg::ListenerAdd { addr } => Some(FakeSock::Listener {
            addr: *addr,
            dual_stack: r & 0x10 != 0,
        }),
        Msg::Offer { client, .. } => Some(FakeSock::Client {
            local: *client,
            peer: None,
        }),
        Msg::Claim => mem.accepted(s.u8()),
        _ => None,
    };
    let mut fds: Vec<FakeFd> = honest.into_iter().map(|p| env.fd(p)).collect();
    while fds.len() < n {
        fds.push(fake_fd(env, s));
    }
    fds
}

fn fake_fds(env: &FakeEnv, s: &mut Script<'_>) -> Vec<FakeFd> {
    let n = usize::from(s.u8()) % (MAX_FDS + 1);
    (0..n).map(|_| fake_fd(env, s)).collect()
}

fn fake_fd(env: &FakeEnv, s: &mut Script<'_>) -> FakeFd {
    let kind = s.u8();
    let ab = s.u8();
    let (x, y) = (addr(ab & 15), addr(ab >> 4));
    env.fd(match kind % 5 {
        0 => FakeSock::Listener {
            addr: x,
            dual_stack: ab & 0x40 != 0,
        },
        1 => FakeSock::Client {
            local: x,
            peer: (ab & 0x40 != 0).then_some(y),
        },
        2 => FakeSock::Accepted { local: x, peer: y },
        3 => FakeSock::Memfd {
            size: u64::from(ab) << 12,
        },
        _ => FakeSock::Other,
    })
}

/// A well-formed request built from script bytes (so the fuzzer reaches
/// the state machine without having to discover the wire format first),
/// and the session that should send it if not the script's choice.
fn message(s: &mut Script<'_>, mem: &Memory) -> (Msg, Option<SessionId>) {
    let mut speaker = None;
    let msg = match s.u8() % 12 {
        0 => Msg::Hello {
            pid: u32::from(s.u8()),
            exe: s.text(MAX_EXE),
        },
        1 => Msg::ListenerAdd { addr: addr(s.u8()) },
        2 => Msg::ListenerRemove { addr: addr(s.u8()) },
        3 => Msg::Offer {
            client: addr(s.u8()),
            server: mem.server(s),
            payload: s.bytes(MAX_PAYLOAD),
        },
        4 => Msg::Claim,
        5 => {
            let (offer_id, by) = mem.claimed_id(s);
            speaker = by;
            Msg::Answer {
                offer_id,
                payload: s.bytes(MAX_PAYLOAD),
            }
        }
        6 => {
            let (offer_id, by) = mem.claimed_id(s);
            speaker = by;
            Msg::Decline {
                offer_id,
                reason: s.text(MAX_REASON),
            }
        }
        7 | 8 => {
            let (offer_id, by) = mem.owned_id(s);
            speaker = by;
            if s.u8() & 3 == 0 {
                Msg::Cancel { offer_id }
            } else {
                Msg::Collect { offer_id }
            }
        }
        9 => Msg::ConnReport {
            fd: i32::from(s.u8()),
            local: addr(s.u8()),
            peer: addr(s.u8()),
            transport: [Transport::Shm, Transport::Rdma, Transport::Tcp][usize::from(s.u8() % 3)],
            reason: s.text(MAX_REASON),
            ring: (s.u8() & 1 == 1).then_some(s.u64()),
        },
        10 => Msg::ConnClosed {
            fd: i32::from(s.u8()),
            local: addr(s.u8()),
            peer: addr(s.u8()),
        },
        _ => {
            // One byte as before: bit 0 a cursor, bit 1 the request for
            // every counter (existing corpus entries keep their shape).
            let b = s.u8();
            let after = (b & 1 == 1).then(|| StatusCursor {
                session: s.u64() % 4,
                fd: i32::from(s.u8()),
            });
            if b & 2 == 0 {
                Msg::Status { after }
            } else {
                Msg::StatusAll { after }
            }
        }
    };
    (msg, speaker)
}
