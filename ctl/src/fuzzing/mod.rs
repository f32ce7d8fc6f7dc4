//! Test and fuzz support, built only for tests and with the `fuzzing`
//! feature (the fuzz crate enables it): a fake descriptor environment and
//! a driver that plays arbitrary bytes as a script of session events
//! against the [`Handler`]. Used by `fuzz/fuzz_targets/ctl_decode.rs`, by
//! a proptest, and by the handler's unit tests.
//!
//! After every step the driver checks the registry's invariants and that
//! exactly the fake descriptors the registry claims to hold are alive: a
//! leak or a double release anywhere in the state machine fails loudly.

mod fake;
mod requests;
mod script;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use ringsock_proto::{frame, Msg, MAX_FRAME_TOTAL, MAX_REASON};

pub use fake::{FakeEnv, FakeFd, FakeSock};
use requests::{fake_fds, fds_for, message, Memory};
use script::Script;
pub use script::{addr, ADDRS};

use crate::handler::Handler;
use crate::registry::{Cred, Limits, SessionId};

const SESSIONS: u8 = 4;

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
                    netns: Some(crate::netns::NetNs::FAKE),
                    caps: crate::netns::Caps::NONE,
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
                            netns: Some(crate::netns::NetNs::FAKE),
                            caps: crate::netns::Caps::NONE,
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
