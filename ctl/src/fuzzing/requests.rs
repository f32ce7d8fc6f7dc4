//! Well-formed requests and descriptors built from script bytes, so the
//! fuzzer reaches the state machine without having to discover the wire
//! format first; [`Memory`] lets later steps refer to what earlier ones
//! set up.

use std::net::SocketAddr;

use ringsock_proto::{Msg, StatusCursor, Transport, MAX_EXE, MAX_FDS, MAX_PAYLOAD, MAX_REASON};

use super::fake::{FakeEnv, FakeFd, FakeSock};
use super::script::{addr, Script};
use crate::registry::SessionId;

/// What the script has seen, so later steps can refer to it: without this
/// a fuzzer would have to guess a matching 4-tuple or offer id, and would
/// rarely get past "NoOffer".
#[derive(Default)]
pub(super) struct Memory {
    /// (client, server) of offers the daemon accepted.
    pub(super) tuples: Vec<(SocketAddr, SocketAddr)>,
    /// Accepted offers and the session that made each.
    pub(super) ids: Vec<(u64, SessionId)>,
    /// Addresses of listeners the daemon accepted.
    pub(super) listeners: Vec<SocketAddr>,
    /// Offers some session claimed, and which session.
    pub(super) claimed: Vec<(u64, SessionId)>,
    /// Offers forwarded to another host (the driver plays that host).
    pub(super) forwarded: Vec<u64>,
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
    pub(super) fn server(&self, s: &mut Script<'_>) -> SocketAddr {
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

/// Descriptors for a well-formed request: usually a legal count, with the
/// proof (if the kind takes one) usually honest; sometimes anything.
pub(super) fn fds_for(msg: &Msg, env: &FakeEnv, s: &mut Script<'_>, mem: &Memory) -> Vec<FakeFd> {
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

pub(super) fn fake_fds(env: &FakeEnv, s: &mut Script<'_>) -> Vec<FakeFd> {
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
pub(super) fn message(s: &mut Script<'_>, mem: &Memory) -> (Msg, Option<SessionId>) {
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
            // every counter, bit 2 for names too (existing corpus entries
            // keep their shape), bit 3 the metrics instead.
            let b = s.u8();
            if b & 8 == 8 {
                return (Msg::Metrics, speaker);
            }
            let after = (b & 1 == 1).then(|| StatusCursor {
                session: s.u64() % 4,
                fd: i32::from(s.u8()),
            });
            match b & 6 {
                0 => Msg::Status { after },
                2 => Msg::StatusAll { after },
                _ => Msg::StatusNamed { after },
            }
        }
    };
    (msg, speaker)
}
