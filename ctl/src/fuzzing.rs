//! Test and fuzz support: a fake descriptor environment and a driver that
//! plays arbitrary bytes as a script of session events against the
//! [`Handler`]. Used by `fuzz/fuzz_targets/ctl_decode.rs`, by a proptest,
//! and by the handler's unit tests.
//!
//! After every step the driver checks the registry's invariants and that
//! exactly the fake descriptors the registry claims to hold are alive: a
//! leak or a double release anywhere in the state machine fails loudly.

use std::cell::Cell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use ringsock_proto::{
    frame, Msg, RingStat, StatusCursor, Transport, MAX_EXE, MAX_FDS, MAX_PAYLOAD, MAX_REASON,
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

    fn ring_stats(&self, ring: &FakeFd) -> Vec<RingStat> {
        let size = match ring.sock {
            FakeSock::Memfd { size } => size,
            _ => 0,
        };
        vec![RingStat {
            name: "memfd_size".into(),
            value: size,
        }]
    }
}

/// Addresses the script picks from: few, so that offers, listeners and
/// claims collide often, with wildcard, v6 and v4-mapped forms.
pub const ADDRS: [&str; 8] = [
    "127.0.0.1:80",
    "127.0.0.1:5000",
    "0.0.0.0:80",
    "[::]:80",
    "[::ffff:127.0.0.1]:5000",
    "127.0.0.1:5001",
    "[::1]:80",
    "0.0.0.0:5000",
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

    fn bytes(&mut self, max: usize) -> Vec<u8> {
        let n = (usize::from(self.u16()) % (max + 1)).min(self.data.len());
        let (b, rest) = self.data.split_at(n);
        self.data = rest;
        b.to_vec()
    }

    fn text(&mut self, max: usize) -> String {
        String::from_utf8_lossy(&self.bytes(max / 3)).into_owned()
    }
}

const SESSIONS: u8 = 4;

/// Drives a handler through the events encoded in `data`. Panics only if
/// an invariant breaks (which is the point).
pub fn run_script(data: &[u8]) {
    let env = FakeEnv::default();
    let limits = Limits {
        offer_timeout: Duration::from_millis(100),
        max_offers_per_session: 8,
        max_listeners_per_session: 8,
        max_reports_per_session: 8,
        max_held_fds: 48,
    };
    let mut h = Handler::new(env.clone(), limits, 7);
    let mut open = [false; SESSIONS as usize];
    let mut now = Instant::now();
    let mut s = Script { data };
    while !s.done() {
        let op = s.u8();
        let sid = op / 8 % SESSIONS;
        let id = SessionId::from(sid);
        let slot = usize::from(sid);
        match op % 8 {
            0 => {
                if open[slot] {
                    h.close_session(id, now);
                }
                let pid = u32::from(s.u8());
                h.open_session(
                    id,
                    Cred {
                        pid,
                        uid: 0,
                        gid: 0,
                    },
                );
                open[slot] = true;
            }
            1 => {
                h.close_session(id, now);
                open[slot] = false;
            }
            2 => {
                now += Duration::from_millis(u64::from(s.u8()) * 4);
                h.tick(now);
            }
            3 | 4 if open[slot] => {
                let (bytes, fds) = if op % 8 == 3 {
                    (s.bytes(4096), fake_fds(&env, &mut s))
                } else {
                    let msg = message(&mut s);
                    // Mostly a legal descriptor count, sometimes any count.
                    let (lo, hi) = msg.fd_range();
                    let r = usize::from(s.u8());
                    let n = if r & 0x80 != 0 {
                        r % (MAX_FDS + 1)
                    } else {
                        lo + r % (hi - lo + 1)
                    };
                    let fds = (0..n).map(|_| fake_fd(&env, &mut s)).collect();
                    (frame::encode(&msg).unwrap_or_default(), fds)
                };
                match h.handle_frame(id, &bytes, fds, now) {
                    // The reply (and its relayed fds) goes out and is gone.
                    Ok(reply) => assert!(frame::encode(&reply.msg).is_ok(), "unencodable reply"),
                    Err(_) => {
                        h.close_session(id, now);
                        open[slot] = false;
                    }
                }
            }
            _ => {}
        }
        h.registry().check_invariants();
        assert_eq!(
            env.live(),
            h.registry().held_fds(),
            "fake fds alive vs held by the registry"
        );
    }
}

fn fake_fds(env: &FakeEnv, s: &mut Script<'_>) -> Vec<FakeFd> {
    let n = usize::from(s.u8()) % (MAX_FDS + 1);
    (0..n).map(|_| fake_fd(env, s)).collect()
}

fn fake_fd(env: &FakeEnv, s: &mut Script<'_>) -> FakeFd {
    let kind = s.u8();
    let ab = s.u8();
    let (x, y) = (addr(ab & 7), addr(ab >> 3));
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
/// the state machine without having to discover the wire format first).
fn message(s: &mut Script<'_>) -> Msg {
    match s.u8() % 12 {
        0 => Msg::Hello {
            pid: u32::from(s.u8()),
            exe: s.text(MAX_EXE),
        },
        1 => Msg::ListenerAdd { addr: addr(s.u8()) },
        2 => Msg::ListenerRemove { addr: addr(s.u8()) },
        3 => Msg::Offer {
            client: addr(s.u8()),
            server: addr(s.u8()),
            payload: s.bytes(MAX_PAYLOAD),
        },
        4 => Msg::Claim,
        5 => Msg::Answer {
            offer_id: s.u64(),
            payload: s.bytes(MAX_PAYLOAD),
        },
        6 => Msg::Decline {
            offer_id: s.u64(),
            reason: s.text(MAX_REASON),
        },
        7 => Msg::Collect { offer_id: s.u64() },
        8 => Msg::Cancel { offer_id: s.u64() },
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
        _ => Msg::Status {
            after: (s.u8() & 1 == 1).then(|| StatusCursor {
                session: s.u64() % 4,
                fd: i32::from(s.u8()),
            }),
        },
    }
}
