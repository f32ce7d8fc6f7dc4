//! Handler tests with fake descriptors: session rules, proof checks, and a
//! whole handshake through encoded frames.

use std::time::Instant;

use proptest::prelude::*;
use ringsock_proto::{frame, ErrorCode, Msg, ProtoError, RefuseReason, Transport};

use super::*;
use crate::fuzzing::{addr, run_script, FakeEnv, FakeSock};

const C: SessionId = 1; // client
const S: SessionId = 2; // server

struct T {
    env: FakeEnv,
    h: Handler<FakeEnv>,
    now: Instant,
}

fn a(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

impl T {
    fn new() -> Self {
        let env = FakeEnv::default();
        let mut h = Handler::new(env.clone(), Limits::default(), 42);
        for (id, pid) in [(C, 10), (S, 20)] {
            h.open_session(
                id,
                Cred {
                    pid,
                    uid: 0,
                    gid: 0,
                    netns: Some(crate::netns::NetNs::FAKE),
                    caps: crate::netns::Caps::ALL,
                },
            );
        }
        let mut t = T {
            env,
            h,
            now: Instant::now(),
        };
        for id in [C, S] {
            let r = t.req(
                id,
                Msg::Hello {
                    pid: 1,
                    exe: "x".into(),
                },
                vec![],
            );
            assert!(matches!(r.msg, Msg::HelloOk { host_id: 42, .. }));
        }
        t
    }

    fn req(&mut self, id: SessionId, m: Msg, fds: Vec<FakeSock>) -> Reply<crate::fuzzing::FakeFd> {
        let fds = fds.into_iter().map(|s| self.env.fd(s)).collect();
        let bytes = frame::encode(&m).unwrap();
        let r = self.h.handle_frame(id, &bytes, fds, self.now).unwrap();
        self.h.registry().check_invariants();
        r
    }

    fn listen(&mut self, s: &str) {
        let r = self.req(
            S,
            Msg::ListenerAdd { addr: a(s) },
            vec![FakeSock::Listener {
                addr: a(s),
                dual_stack: false,
            }],
        );
        assert_eq!(r.msg, Msg::Ok);
    }

    fn offer(&mut self, client: &str, server: &str, proof: FakeSock) -> Msg {
        self.req(
            C,
            Msg::Offer {
                client: a(client),
                server: a(server),
                payload: b"p".to_vec(),
            },
            vec![proof, FakeSock::Memfd { size: 4096 }],
        )
        .msg
    }
}

fn client_sock(s: &str) -> FakeSock {
    FakeSock::Client {
        local: a(s),
        peer: None,
    }
}

#[test]
fn hello_comes_first() {
    let env = FakeEnv::default();
    let mut h = Handler::new(env, Limits::default(), 1);
    h.open_session(
        5,
        Cred {
            pid: 1,
            uid: 0,
            gid: 0,
            netns: Some(crate::netns::NetNs::FAKE),
            caps: crate::netns::Caps::NONE,
        },
    );
    let e = h
        .handle(5, Msg::Status { after: None }, vec![], Instant::now())
        .unwrap_err();
    assert_eq!(e, Fault::NoHello("Status"));
}

#[test]
fn replies_and_bad_frames_are_faults() {
    let mut t = T::new();
    let now = t.now;
    assert_eq!(
        t.h.handle(C, Msg::Ok, vec![], now).unwrap_err(),
        Fault::NotARequest("Ok")
    );
    let mut f = frame::encode(&Msg::Status { after: None }).unwrap();
    f[4] = 9;
    assert_eq!(
        t.h.handle_frame(C, &f, vec![], now).unwrap_err(),
        Fault::Proto(ProtoError::BadVersion { got: 9 })
    );
    // A descriptor on a message that takes none: fault, and it is closed.
    let fd = t.env.fd(FakeSock::Other);
    let f = frame::encode(&Msg::Status { after: None }).unwrap();
    assert!(matches!(
        t.h.handle_frame(C, &f, vec![fd], now),
        Err(Fault::Proto(ProtoError::FdCount { .. }))
    ));
    assert_eq!(t.env.live(), 0);
}

#[test]
fn listener_proof_must_match() {
    let mut t = T::new();
    let r = t.req(
        S,
        Msg::ListenerAdd {
            addr: a("127.0.0.1:80"),
        },
        vec![FakeSock::Listener {
            addr: a("127.0.0.1:81"),
            dual_stack: false,
        }],
    );
    assert!(matches!(
        r.msg,
        Msg::Error {
            code: ErrorCode::BadProof,
            ..
        }
    ));
    let r = t.req(
        S,
        Msg::ListenerAdd {
            addr: a("127.0.0.1:80"),
        },
        vec![client_sock("127.0.0.1:80")],
    );
    assert!(matches!(
        r.msg,
        Msg::Error {
            code: ErrorCode::BadProof,
            ..
        }
    ));
    // The proof is never kept.
    assert_eq!(t.env.live(), 0);
    assert_eq!(t.h.registry().listener_count(), 0);
}

#[test]
fn offer_proof_must_match_the_client_address() {
    let mut t = T::new();
    t.listen("0.0.0.0:80");
    let refused = Msg::OfferRefused {
        reason: RefuseReason::Invalid,
    };
    // Bound elsewhere.
    assert_eq!(
        t.offer(
            "127.0.0.1:5000",
            "127.0.0.1:80",
            client_sock("127.0.0.1:5001")
        ),
        refused
    );
    // Not a client socket.
    assert_eq!(
        t.offer("127.0.0.1:5000", "127.0.0.1:80", FakeSock::Other),
        refused
    );
    // Connected to another server.
    let connected = FakeSock::Client {
        local: a("127.0.0.1:5000"),
        peer: Some(a("127.0.0.1:81")),
    };
    assert_eq!(
        t.offer("127.0.0.1:5000", "127.0.0.1:80", connected),
        refused
    );
    // Unspecified server, port 0.
    assert_eq!(
        t.offer(
            "127.0.0.1:5000",
            "0.0.0.0:80",
            client_sock("127.0.0.1:5000")
        ),
        refused
    );
    assert_eq!(
        t.offer("127.0.0.1:0", "127.0.0.1:80", client_sock("127.0.0.1:0")),
        refused
    );
    assert_eq!(t.env.live(), 0);
    assert!(matches!(
        t.offer(
            "127.0.0.1:5000",
            "127.0.0.1:80",
            client_sock("127.0.0.1:5000")
        ),
        Msg::OfferOk { .. }
    ));
    // The proof was closed, the relayed memfd is held.
    assert_eq!(t.env.live(), 1);
}

#[test]
fn handshake_through_frames() {
    let mut t = T::new();
    t.listen("127.0.0.1:80");
    let Msg::OfferOk { offer_id } = t.offer(
        "127.0.0.1:5000",
        "127.0.0.1:80",
        client_sock("127.0.0.1:5000"),
    ) else {
        panic!("offer refused")
    };
    // Some other connected socket: no offer.
    let wrong = FakeSock::Accepted {
        local: a("127.0.0.1:80"),
        peer: a("127.0.0.1:5999"),
    };
    assert_eq!(t.req(S, Msg::Claim, vec![wrong]).msg, Msg::NoOffer);
    let right = FakeSock::Accepted {
        local: a("127.0.0.1:80"),
        peer: a("127.0.0.1:5000"),
    };
    let r = t.req(S, Msg::Claim, vec![right]);
    assert_eq!(
        r.msg,
        Msg::ClaimOk {
            offer_id,
            client_pid: 10,
            payload: b"p".to_vec()
        }
    );
    assert_eq!(r.fds.len(), 1);
    assert_eq!(r.fds[0].sock, FakeSock::Memfd { size: 4096 });
    drop(r);
    assert_eq!(
        t.req(C, Msg::Collect { offer_id }, vec![]).msg,
        Msg::Pending
    );
    // The client may not answer its own offer.
    let r = t.req(
        C,
        Msg::Answer {
            offer_id,
            payload: vec![],
        },
        vec![],
    );
    assert!(matches!(
        r.msg,
        Msg::Error {
            code: ErrorCode::NotOwner,
            ..
        }
    ));
    let r = t.req(
        S,
        Msg::Answer {
            offer_id,
            payload: b"a".to_vec(),
        },
        vec![FakeSock::Memfd { size: 1 }],
    );
    assert_eq!(r.msg, Msg::Ok);
    let r = t.req(C, Msg::Collect { offer_id }, vec![]);
    assert_eq!(
        r.msg,
        Msg::Answered {
            payload: b"a".to_vec()
        }
    );
    assert_eq!(r.fds[0].sock, FakeSock::Memfd { size: 1 });
    drop(r);
    assert_eq!(t.env.live(), 0);
}

#[test]
fn status_lists_reports_with_ring_stats() {
    let mut t = T::new();
    let report = Msg::ConnReport {
        fd: 9,
        local: a("127.0.0.1:5000"),
        peer: a("127.0.0.1:80"),
        transport: Transport::Shm,
        reason: "ring".into(),
        ring: Some(3),
    };
    assert_eq!(
        t.req(C, report, vec![FakeSock::Memfd { size: 8192 }]).msg,
        Msg::Ok
    );
    let Msg::StatusReply { entries, next } = t.req(S, Msg::Status { after: None }, vec![]).msg
    else {
        panic!()
    };
    assert!(next.is_none());
    assert_eq!(entries.len(), 1);
    let e = &entries[0];
    assert_eq!((e.pid, e.fd, e.ring), (10, 9, Some(3)));
    assert_eq!(e.ring_stats[0].value, 8192);
    t.h.close_session(C, t.now);
    assert_eq!(t.env.live(), 0);
}

#[test]
fn status_cuts_counters_to_what_the_request_kind_allows() {
    let mut t = T::new();
    let report = Msg::ConnReport {
        fd: 9,
        local: a("127.0.0.1:5000"),
        peer: a("127.0.0.1:80"),
        transport: Transport::Rdma,
        reason: String::new(),
        ring: Some(3),
    };
    // The fake provider gives memfd_size and 40 more (one per page), with
    // over-long names.
    let fds = vec![FakeSock::Memfd { size: 40 << 12 }];
    assert_eq!(t.req(C, report, fds).msg, Msg::Ok);
    let mut lists = Vec::new();
    for req in [Msg::Status { after: None }, Msg::StatusAll { after: None }] {
        let Msg::StatusReply { entries, next } = t.req(S, req, vec![]).msg else {
            panic!()
        };
        assert!(next.is_none());
        assert_eq!(entries.len(), 1);
        let stats = entries[0].ring_stats.clone();
        assert!(stats.iter().all(|s| s.name.len() <= MAX_STAT_NAME));
        assert_eq!(stats[0].value, 40 << 12);
        lists.push(stats);
    }
    // An older CLI asks with `Status` and decodes at most 16.
    assert_eq!(lists[0].len(), MAX_RING_STATS_V1);
    assert_eq!(lists[1].len(), MAX_RING_STATS);
    // The same counters first, so the old request sees what it always did.
    assert_eq!(lists[0][..], lists[1][..MAX_RING_STATS_V1]);
    t.h.close_session(C, t.now);
    assert_eq!(t.env.live(), 0);
}

#[test]
fn only_status_named_names_processes_and_only_those_the_kernel_named() {
    let mut t = T::new();
    // A session whose pid the kernel could not give (another pid
    // namespace): its Hello pid names nothing here.
    const N: SessionId = 3;
    t.h.open_session(
        N,
        Cred {
            pid: 0,
            uid: 0,
            gid: 0,
            netns: Some(crate::netns::NetNs::FAKE),
            caps: crate::netns::Caps::NONE,
        },
    );
    let hello = Msg::Hello {
        pid: 7,
        exe: "/usr/bin/redis-check-rdb".into(),
    };
    assert!(matches!(t.req(N, hello, vec![]).msg, Msg::HelloOk { .. }));
    for (id, fd) in [(C, 9), (S, 10), (N, 11)] {
        let report = Msg::ConnReport {
            fd,
            local: a("127.0.0.1:5000"),
            peer: a("127.0.0.1:80"),
            transport: Transport::Tcp,
            reason: "no listener".into(),
            ring: None,
        };
        assert_eq!(t.req(id, report, vec![]).msg, Msg::Ok);
    }
    let names = |m: Msg| match m {
        Msg::StatusReply { entries, .. } | Msg::StatusNamedReply { entries, .. } => entries
            .into_iter()
            .map(|e| (e.pid, e.name))
            .collect::<Vec<_>>(),
        other => panic!("{other:?}"),
    };
    // The fake names pid 10 with 10 p's and pid 20 with 20, cut to the
    // longest name an entry carries.
    assert_eq!(
        names(t.req(C, Msg::StatusNamed { after: None }, vec![]).msg),
        [
            (10, "p".repeat(10)),
            (20, "p".repeat(MAX_PROCESS_NAME)),
            (7, String::new())
        ]
    );
    for old in [Msg::Status { after: None }, Msg::StatusAll { after: None }] {
        let listed = names(t.req(C, old, vec![]).msg);
        assert!(listed.iter().all(|(_, n)| n.is_empty()), "{listed:?}");
    }
}

#[test]
fn fixed_scripts() {
    run_script(&[]);
    run_script(&[0; 64]);
    run_script(&[255; 64]);
    // Open session 0, Hello, listener, offer, claim...
    run_script(&[
        0, 1, 4, 0, 0, 4, 1, 0, 1, 0, 0, 4, 3, 1, 1, 0, 0, 1, 0, 1, 0,
    ]);
}

#[test]
fn scripts_reach_deep_states() {
    // A script that must produce a claim: checks the driver is not vacuous.
    let env = FakeEnv::default();
    let mut h = Handler::new(env.clone(), Limits::default(), 1);
    h.open_session(
        0,
        Cred {
            pid: 1,
            uid: 0,
            gid: 0,
            netns: Some(crate::netns::NetNs::FAKE),
            caps: crate::netns::Caps::NONE,
        },
    );
    let now = Instant::now();
    let hello = Msg::Hello {
        pid: 1,
        exe: String::new(),
    };
    h.handle(0, hello, vec![], now).unwrap();
    let l = env.fd(FakeSock::Listener {
        addr: addr(0),
        dual_stack: false,
    });
    h.handle(0, Msg::ListenerAdd { addr: addr(0) }, vec![l], now)
        .unwrap();
    let proof = env.fd(FakeSock::Client {
        local: addr(1),
        peer: None,
    });
    let offer = Msg::Offer {
        client: addr(1),
        server: addr(0),
        payload: vec![],
    };
    let r = h.handle(0, offer, vec![proof], now).unwrap();
    assert!(matches!(r.msg, Msg::OfferOk { .. }));
}

#[test]
fn random_scripts_reach_every_outcome() {
    // Deterministic pseudo-random scripts (xorshift): the driver must not
    // be vacuous, i.e. random bytes must reach claims, answers and expiry.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut total: std::collections::BTreeMap<&str, usize> = Default::default();
    for _ in 0..300 {
        let script: Vec<u8> = (0..3000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let st = run_script(&script);
        *total.entry("_faults").or_insert(0) += st.faults;
        for (k, v) in st.replies {
            *total.entry(k).or_insert(0) += v;
        }
    }
    for kind in [
        "OfferOk",
        "ClaimOk",
        "Answered",
        "Declined",
        "Expired",
        "Pending",
        "StatusReply",
        "RemoteOfferOk",
        "RemoteRefused",
        "(forwarded)",
    ] {
        assert!(
            total.get(kind).copied().unwrap_or(0) > 0,
            "{kind}: {total:?}"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    #[test]
    fn arbitrary_scripts_keep_invariants(data in proptest::collection::vec(any::<u8>(), 0..400)) {
        run_script(&data);
    }
}

// ---- offers between hosts (192.0.2.0/24 is "another host" for FakeEnv) ----

#[test]
fn offers_for_other_hosts_are_forwarded_without_descriptors() {
    let mut t = T::new();
    let proof = FakeSock::Client {
        local: a("0.0.0.0:5000"),
        peer: None,
    };
    let r = t.req(
        C,
        Msg::Offer {
            client: a("0.0.0.0:5000"),
            server: a("192.0.2.7:80"),
            payload: b"qp".to_vec(),
        },
        vec![proof],
    );
    let fwd = r.forward.expect("forwarded");
    assert_eq!(
        (fwd.client, fwd.server, &fwd.payload[..]),
        (a("0.0.0.0:5000"), a("192.0.2.7:80"), &b"qp"[..])
    );
    // The reply to use when the other host cannot be asked.
    assert_eq!(
        r.msg,
        Msg::OfferRefused {
            reason: RefuseReason::NoListener
        }
    );
    assert!(matches!(
        t.h.registry().offer_state(fwd.offer_id),
        Some(crate::registry::OfferState::Open { .. })
    ));
    // Descriptors besides the proof cannot cross hosts.
    let r = t.req(
        C,
        Msg::Offer {
            client: a("0.0.0.0:5001"),
            server: a("192.0.2.7:80"),
            payload: vec![],
        },
        vec![
            FakeSock::Client {
                local: a("0.0.0.0:5001"),
                peer: None,
            },
            FakeSock::Memfd { size: 4096 },
        ],
    );
    assert!(r.forward.is_none());
    assert_eq!(
        r.msg,
        Msg::OfferRefused {
            reason: RefuseReason::Invalid
        }
    );
    assert_eq!(t.env.live(), t.h.registry().held_fds());
}

#[test]
fn remote_offers_are_checked_against_the_connection_source() {
    let mut t = T::new();
    const P: SessionId = 9;
    t.h.registry_mut().open_peer_session(P);
    t.listen("10.0.0.1:80");
    let src: IpAddr = "10.0.0.9".parse().unwrap();
    let ro = |t: &mut T, r: u64, client: &str, server: &str| {
        t.h.peer_request(
            P,
            src,
            Msg::RemoteOffer {
                offer_ref: r,
                client: a(client),
                server: a(server),
                payload: vec![],
            },
            t.now,
        )
        .unwrap()
        .unwrap()
    };
    let refused = |r, reason| Msg::RemoteRefused {
        offer_ref: r,
        reason,
    };
    assert_eq!(
        ro(&mut t, 1, "10.0.0.8:5000", "10.0.0.1:80"),
        refused(1, RefuseReason::Invalid)
    );
    assert_eq!(
        ro(&mut t, 2, "10.0.0.9:0", "10.0.0.1:80"),
        refused(2, RefuseReason::Invalid)
    );
    assert_eq!(
        ro(&mut t, 3, "10.0.0.9:5000", "127.0.0.1:80"),
        refused(3, RefuseReason::NoListener)
    );
    assert_eq!(
        ro(&mut t, 4, "10.0.0.9:5000", "192.0.2.1:80"),
        refused(4, RefuseReason::NoListener)
    );
    // v4-mapped source and client compare equal to plain IPv4.
    assert!(matches!(
        ro(&mut t, 5, "[::ffff:10.0.0.9]:5000", "10.0.0.1:80"),
        Msg::RemoteOfferOk {
            offer_ref: 5,
            expires_ms: 10_000
        }
    ));
    // Only the owner of the accepted socket claims it.
    let r = t.req(
        S,
        Msg::Claim,
        vec![FakeSock::Accepted {
            local: a("10.0.0.1:80"),
            peer: a("10.0.0.9:5000"),
        }],
    );
    assert!(matches!(r.msg, Msg::ClaimOk { client_pid: 0, .. }));
    // Replies-only kinds on the accepting side close the connection.
    assert!(t
        .h
        .peer_request(P, src, Msg::RemoteExpired { offer_ref: 5 }, t.now)
        .is_err());
    assert_eq!(
        t.h.peer_request(P, src, Msg::RemoteCancel { offer_ref: 77 }, t.now),
        Ok(None)
    );
    // And ctl-to-ctl kinds are faults on the local socket.
    let bytes = frame::encode(&Msg::RemoteCancel { offer_ref: 1 }).unwrap();
    assert!(t.h.handle_frame(C, &bytes, vec![], t.now).is_err());
}

// ---- network namespaces ----

const NS_X: NetNs = NetNs { dev: 4, ino: 100 };
const NS_Y: NetNs = NetNs { dev: 4, ino: 200 };

impl T {
    /// Opens session `id` (pid `pid`, `uid`) of a process in `netns`.
    fn session_in(&mut self, id: SessionId, pid: u32, uid: u32, netns: NetNs) {
        self.h.open_session(
            id,
            Cred {
                pid,
                uid,
                gid: uid,
                netns: Some(netns),
                caps: crate::netns::Caps::NONE,
            },
        );
        let hello = Msg::Hello {
            pid,
            exe: "x".into(),
        };
        assert!(matches!(
            self.req(id, hello, vec![]).msg,
            Msg::HelloOk { .. }
        ));
    }

    /// A request whose descriptors belong to namespace `netns`.
    fn req_in(&mut self, id: SessionId, netns: NetNs, m: Msg, fds: Vec<FakeSock>) -> Msg {
        let fds = fds.into_iter().map(|s| self.env.fd_in(netns, s)).collect();
        let bytes = frame::encode(&m).unwrap();
        let r = self.h.handle_frame(id, &bytes, fds, self.now).unwrap();
        self.h.registry().check_invariants();
        r.msg
    }
}

/// Two namespaces, each with a client (`cx`, `cy`) and a server (`sx`,
/// `sy`) on the same addresses and ports: every offer pairs within its
/// namespace, whatever the order of claims.
#[test]
fn same_tuples_in_two_namespaces_pair_within_each() {
    let mut t = T::new();
    let (cx, sx, cy, sy) = (11, 12, 21, 22);
    t.session_in(cx, 110, 1000, NS_X);
    t.session_in(sx, 120, 1000, NS_X);
    t.session_in(cy, 210, 1000, NS_Y);
    t.session_in(sy, 220, 1000, NS_Y);
    let listener = FakeSock::Listener {
        addr: a("127.0.0.1:80"),
        dual_stack: false,
    };
    let add = Msg::ListenerAdd {
        addr: a("127.0.0.1:80"),
    };
    assert_eq!(t.req_in(sx, NS_X, add.clone(), vec![listener]), Msg::Ok);
    let offer = Msg::Offer {
        client: a("127.0.0.1:5000"),
        server: a("127.0.0.1:80"),
        payload: b"p".to_vec(),
    };
    let csock = client_sock("127.0.0.1:5000");
    // No listener in Y yet: Y's offer is refused although X has one.
    assert_eq!(
        t.req_in(cy, NS_Y, offer.clone(), vec![csock]),
        Msg::OfferRefused {
            reason: RefuseReason::NoListener
        }
    );
    assert_eq!(t.req_in(sy, NS_Y, add, vec![listener]), Msg::Ok);
    let Msg::OfferOk { offer_id: ox } = t.req_in(cx, NS_X, offer.clone(), vec![csock]) else {
        panic!("offer in X refused")
    };
    // The same 4-tuple in Y is no duplicate of X's.
    let Msg::OfferOk { offer_id: oy } = t.req_in(cy, NS_Y, offer.clone(), vec![csock]) else {
        panic!("offer in Y refused")
    };
    assert_ne!(ox, oy);
    let accepted = FakeSock::Accepted {
        local: a("127.0.0.1:80"),
        peer: a("127.0.0.1:5000"),
    };
    // Y's server claims first and gets Y's client, then X's gets X's.
    let Msg::ClaimOk {
        offer_id,
        client_pid,
        ..
    } = t.req_in(sy, NS_Y, Msg::Claim, vec![accepted])
    else {
        panic!("claim in Y failed")
    };
    assert_eq!((offer_id, client_pid), (oy, 210));
    let Msg::ClaimOk {
        offer_id,
        client_pid,
        ..
    } = t.req_in(sx, NS_X, Msg::Claim, vec![accepted])
    else {
        panic!("claim in X failed")
    };
    assert_eq!((offer_id, client_pid), (ox, 110));
    assert_eq!(t.env.live(), 0);
}

/// A process in another namespace cannot claim an offer, even with an
/// accepted socket of the very same addresses, and a session's own
/// namespace does not stand in for its socket's.
#[test]
fn a_claim_from_another_namespace_finds_nothing() {
    let mut t = T::new();
    let (cx, sx, intruder) = (11, 12, 31);
    t.session_in(cx, 110, 1000, NS_X);
    t.session_in(sx, 120, 1000, NS_X);
    // Same uid, even root: the namespace decides.
    t.session_in(intruder, 310, 0, NS_Y);
    let listener = FakeSock::Listener {
        addr: a("127.0.0.1:80"),
        dual_stack: false,
    };
    let add = Msg::ListenerAdd {
        addr: a("127.0.0.1:80"),
    };
    assert_eq!(t.req_in(sx, NS_X, add, vec![listener]), Msg::Ok);
    let offer = Msg::Offer {
        client: a("127.0.0.1:5000"),
        server: a("127.0.0.1:80"),
        payload: b"p".to_vec(),
    };
    let Msg::OfferOk { offer_id } = t.req_in(cx, NS_X, offer, vec![client_sock("127.0.0.1:5000")])
    else {
        panic!("offer refused")
    };
    let accepted = FakeSock::Accepted {
        local: a("127.0.0.1:80"),
        peer: a("127.0.0.1:5000"),
    };
    assert_eq!(
        t.req_in(intruder, NS_Y, Msg::Claim, vec![accepted]),
        Msg::NoOffer
    );
    // A socket of X held by the session in X: its own.
    assert!(matches!(
        t.req_in(sx, NS_X, Msg::Claim, vec![accepted]),
        Msg::ClaimOk { offer_id: o, .. } if o == offer_id
    ));
}

/// A socket the kernel names no namespace for is no proof at all when the
/// session's namespace is unknown too.
#[test]
fn no_namespace_no_proof() {
    let mut t = T::new();
    t.h.open_session(
        40,
        Cred {
            pid: 400,
            uid: 1000,
            gid: 1000,
            netns: None,
            caps: crate::netns::Caps::NONE,
        },
    );
    let hello = Msg::Hello {
        pid: 400,
        exe: "x".into(),
    };
    t.req(40, hello, vec![]);
    // A memfd is no socket: its namespace is unknown to the fake.
    let r = t.req(
        40,
        Msg::ListenerAdd {
            addr: a("127.0.0.1:80"),
        },
        vec![FakeSock::Memfd { size: 1 }],
    );
    assert!(matches!(
        r.msg,
        Msg::Error {
            code: ErrorCode::BadProof,
            ..
        }
    ));
}

/// Status: root in the daemon's namespace sees every namespace's
/// connections; anyone else (root of a container too) only those of its
/// own namespace; a caller whose namespace is unknown sees none.
#[test]
fn status_shows_the_callers_namespace_unless_privileged() {
    let mut t = T::new();
    t.session_in(11, 110, 1000, NS_X);
    t.session_in(21, 210, 1000, NS_Y);
    t.session_in(31, 310, 0, NS_Y);
    t.session_in(41, 410, 1000, NetNs::FAKE);
    t.h.open_session(
        51,
        Cred {
            pid: 510,
            uid: 0,
            gid: 0,
            netns: None,
            caps: crate::netns::Caps::NONE,
        },
    );
    t.req(
        51,
        Msg::Hello {
            pid: 510,
            exe: "x".into(),
        },
        vec![],
    );
    for (id, port) in [(11, 1), (21, 2)] {
        let report = Msg::ConnReport {
            fd: 9,
            local: SocketAddr::from(([127, 0, 0, 1], port)),
            peer: a("127.0.0.1:80"),
            transport: Transport::Tcp,
            reason: "no listener".into(),
            ring: None,
        };
        assert_eq!(t.req(id, report, vec![]).msg, Msg::Ok);
    }
    let pids = |t: &mut T, id| {
        let Msg::StatusReply { entries, .. } =
            t.req(id, Msg::StatusAll { after: None }, vec![]).msg
        else {
            panic!()
        };
        entries.iter().map(|e| e.pid).collect::<Vec<_>>()
    };
    // T::new's sessions are root in the daemon's namespace.
    assert_eq!(pids(&mut t, S), vec![110, 210]);
    assert_eq!(pids(&mut t, 11), vec![110]);
    assert_eq!(pids(&mut t, 21), vec![210]);
    assert_eq!(pids(&mut t, 31), vec![210]);
    assert_eq!(pids(&mut t, 41), Vec::<u32>::new());
    assert_eq!(pids(&mut t, 51), Vec::<u32>::new());
}

// ---- rings between namespaces ----

const NS_Z: NetNs = NetNs { dev: 4, ino: 300 };

impl T {
    /// Server session `id` in `netns` listening on `addr`.
    fn listen_in(&mut self, id: SessionId, netns: NetNs, addr: &str) {
        let l = FakeSock::Listener {
            addr: a(addr),
            dual_stack: false,
        };
        let m = Msg::ListenerAdd { addr: a(addr) };
        assert_eq!(self.req_in(id, netns, m, vec![l]), Msg::Ok);
    }

    /// An offer from client session `id` in `netns`, bound to `client`.
    fn offer_in(&mut self, id: SessionId, netns: NetNs, client: &str, server: &str) -> Msg {
        let m = Msg::Offer {
            client: a(client),
            server: a(server),
            payload: b"p".to_vec(),
        };
        let fds = vec![client_sock(client), FakeSock::Memfd { size: 4096 }];
        self.req_in(id, netns, m, fds)
    }

    fn claim_in(&mut self, id: SessionId, netns: NetNs, local: &str, peer: &str) -> Msg {
        let acc = FakeSock::Accepted {
            local: a(local),
            peer: a(peer),
        };
        self.req_in(id, netns, Msg::Claim, vec![acc])
    }
}

/// X (10.0.0.1) connects to Y's address (10.0.0.2), where Y's server
/// listens on the wildcard: the offer is for Y, and Y's accepted socket
/// claims it only for a peer address that is X's alone.
#[test]
fn a_ring_between_two_namespaces_needs_addresses_of_one_each() {
    let mut t = T::new();
    t.env.set_addrs(NS_X, &["127.0.0.1", "10.0.0.1"]);
    t.env.set_addrs(NS_Y, &["127.0.0.1", "10.0.0.2"]);
    let (cx, sy) = (11, 22);
    t.session_in(cx, 110, 1000, NS_X);
    t.session_in(sy, 220, 1000, NS_Y);
    t.listen_in(sy, NS_Y, "0.0.0.0:80");
    let Msg::OfferOk { offer_id } = t.offer_in(cx, NS_X, "0.0.0.0:5000", "10.0.0.2:80") else {
        panic!("offer across namespaces refused")
    };
    // Another client address, or the right one in the client's namespace:
    // nothing.
    assert_eq!(
        t.claim_in(sy, NS_Y, "10.0.0.2:80", "10.0.0.9:5000"),
        Msg::NoOffer
    );
    assert_eq!(
        t.claim_in(cx, NS_X, "10.0.0.2:80", "10.0.0.1:5000"),
        Msg::NoOffer
    );
    assert!(matches!(
        t.claim_in(sy, NS_Y, "10.0.0.2:80", "10.0.0.1:5000"),
        Msg::ClaimOk { offer_id: o, client_pid: 110, .. } if o == offer_id
    ));
}

/// Anything that could make two namespaces the candidates refuses the
/// ring: the server's address in two namespaces with listeners, or the
/// client's address in two namespaces.
#[test]
fn an_address_two_namespaces_have_pairs_nothing() {
    let mut t = T::new();
    t.env.set_addrs(NS_X, &["10.0.0.1"]);
    t.env.set_addrs(NS_Y, &["10.0.0.2"]);
    t.env.set_addrs(NS_Z, &["10.0.0.2", "10.0.0.1"]);
    let (cx, sy, sz) = (11, 22, 33);
    t.session_in(cx, 110, 1000, NS_X);
    t.session_in(sy, 220, 1000, NS_Y);
    t.session_in(sz, 330, 1000, NS_Z);
    t.listen_in(sy, NS_Y, "0.0.0.0:80");
    t.listen_in(sz, NS_Z, "10.0.0.2:80");
    // Two namespaces take 10.0.0.2:80: no ring (the other-host way, where
    // a ring's descriptors cannot go).
    assert_eq!(
        t.offer_in(cx, NS_X, "0.0.0.0:5000", "10.0.0.2:80"),
        Msg::OfferRefused {
            reason: RefuseReason::Invalid
        }
    );
    // One takes 10.0.0.2:81, but the client's 10.0.0.1 is Z's too.
    t.listen_in(sy, NS_Y, "0.0.0.0:81");
    assert_eq!(
        t.offer_in(cx, NS_X, "10.0.0.1:5001", "10.0.0.2:81"),
        Msg::OfferRefused {
            reason: RefuseReason::Invalid
        }
    );
    // Bound to the wildcard the offer is taken, and the claim sees the
    // address two namespaces have.
    assert!(matches!(
        t.offer_in(cx, NS_X, "0.0.0.0:5002", "10.0.0.2:81"),
        Msg::OfferOk { .. }
    ));
    assert_eq!(
        t.claim_in(sy, NS_Y, "10.0.0.2:81", "10.0.0.1:5002"),
        Msg::NoOffer
    );
    // An address the client's namespace has itself is never another's.
    t.env.set_addrs(NS_X, &["10.0.0.1", "10.0.0.3"]);
    t.listen_in(sy, NS_Y, "10.0.0.3:82");
    t.now += std::time::Duration::from_secs(2);
    assert_eq!(
        t.offer_in(cx, NS_X, "0.0.0.0:5003", "10.0.0.3:82"),
        Msg::OfferRefused {
            reason: RefuseReason::Invalid
        }
    );
}

// ---- through address translation ----

/// The daemon's namespace (FAKE, 10.0.0.254) translates its port 8080 to
/// Y's 10.0.0.2:80. Once its tracking shows that, X's offer for
/// 10.0.0.254:8080 is for Y, and Y's accepted socket claims it through
/// the tracking entry whose reply is that socket; an accepted socket the
/// tracking does not name, or names for another offer, claims nothing.
#[test]
fn a_translated_connection_pairs_through_its_tracking_entry() {
    let mut t = T::new();
    t.env.set_addrs(NetNs::FAKE, &["10.0.0.254"]);
    t.env.set_addrs(NS_X, &["10.0.0.1"]);
    t.env.set_addrs(NS_Y, &["10.0.0.2"]);
    let (cx, sy) = (11, 22);
    t.session_in(cx, 110, 1000, NS_X);
    t.session_in(sy, 220, 1000, NS_Y);
    t.listen_in(sy, NS_Y, "0.0.0.0:80");
    // Not yet known as translated: the other-host way.
    assert_eq!(
        t.offer_in(cx, NS_X, "0.0.0.0:5000", "10.0.0.254:8080"),
        Msg::OfferRefused {
            reason: RefuseReason::Invalid
        }
    );
    // An earlier connection, masqueraded: the daemon learns it.
    t.env.track(
        "10.0.0.1:4999",
        "10.0.0.254:8080",
        "10.0.0.2:80",
        "10.0.0.254:4999",
    );
    t.now += std::time::Duration::from_secs(2);
    t.h.tick(t.now);
    let Msg::OfferOk { offer_id } = t.offer_in(cx, NS_X, "0.0.0.0:5001", "10.0.0.254:8080") else {
        panic!("offer through the translation refused")
    };
    // Y accepts a connection the tracking does not know: nothing.
    assert_eq!(
        t.claim_in(sy, NS_Y, "10.0.0.2:80", "10.0.0.254:6000"),
        Msg::NoOffer
    );
    // The tracked one, whose original tuple is another client port's.
    t.env.track(
        "10.0.0.1:5002",
        "10.0.0.254:8080",
        "10.0.0.2:80",
        "10.0.0.254:6001",
    );
    assert_eq!(
        t.claim_in(sy, NS_Y, "10.0.0.2:80", "10.0.0.254:6001"),
        Msg::NoOffer
    );
    // The offer's own connection.
    t.env.track(
        "10.0.0.1:5001",
        "10.0.0.254:8080",
        "10.0.0.2:80",
        "10.0.0.254:6002",
    );
    assert!(matches!(
        t.claim_in(sy, NS_Y, "10.0.0.2:80", "10.0.0.254:6002"),
        Msg::ClaimOk { offer_id: o, client_pid: 110, .. } if o == offer_id
    ));
}

/// The same tracking entry presented by a process of another namespace
/// (even with a socket of the listener's addresses) claims nothing; an
/// address translated to two listeners pairs with the one its own
/// connection's entry names.
#[test]
fn translations_pair_only_with_their_target() {
    let mut t = T::new();
    t.env.set_addrs(NetNs::FAKE, &["10.0.0.254"]);
    t.env.set_addrs(NS_X, &["10.0.0.1"]);
    t.env.set_addrs(NS_Y, &["10.0.0.2"]);
    t.env.set_addrs(NS_Z, &["10.0.0.3"]);
    let (cx, sy, sz) = (11, 22, 33);
    t.session_in(cx, 110, 1000, NS_X);
    t.session_in(sy, 220, 1000, NS_Y);
    t.session_in(sz, 330, 1000, NS_Z);
    t.listen_in(sy, NS_Y, "0.0.0.0:80");
    t.listen_in(sz, NS_Z, "0.0.0.0:80");
    t.env.track(
        "10.0.0.1:4999",
        "10.0.0.254:8080",
        "10.0.0.2:80",
        "10.0.0.1:4999",
    );
    t.now += std::time::Duration::from_secs(2);
    t.h.tick(t.now);
    let Msg::OfferOk { .. } = t.offer_in(cx, NS_X, "0.0.0.0:5001", "10.0.0.254:8080") else {
        panic!("offer through the translation refused")
    };
    t.env.track(
        "10.0.0.1:5001",
        "10.0.0.254:8080",
        "10.0.0.2:80",
        "10.0.0.1:5001",
    );
    // Z, not the translation's target, with Y's very addresses.
    assert_eq!(
        t.claim_in(sz, NS_Z, "10.0.0.2:80", "10.0.0.1:5001"),
        Msg::NoOffer
    );
    // Port 9090 is translated to Y's and to Z's listener (a service with
    // two replicas): an offer waits for the tracking entry of its
    // connection to name the one that accepted it.
    t.env.track(
        "10.0.0.1:4000",
        "10.0.0.254:9090",
        "10.0.0.2:80",
        "10.0.0.1:4000",
    );
    t.env.track(
        "10.0.0.1:4001",
        "10.0.0.254:9090",
        "10.0.0.3:80",
        "10.0.0.1:4001",
    );
    t.now += std::time::Duration::from_secs(2);
    t.h.tick(t.now);
    let Msg::OfferOk { offer_id } = t.offer_in(cx, NS_X, "0.0.0.0:5003", "10.0.0.254:9090") else {
        panic!("offer to a translated address with two targets refused")
    };
    t.env.track(
        "10.0.0.1:5003",
        "10.0.0.254:9090",
        "10.0.0.3:80",
        "10.0.0.1:5003",
    );
    // Y, whose listener the connection did not reach, with its addresses.
    assert_eq!(
        t.claim_in(sy, NS_Y, "10.0.0.2:80", "10.0.0.1:5003"),
        Msg::NoOffer
    );
    assert!(matches!(
        t.claim_in(sz, NS_Z, "10.0.0.3:80", "10.0.0.1:5003"),
        Msg::ClaimOk { offer_id: o, .. } if o == offer_id
    ));
}

/// A connection between two namespaces whose source the daemon's
/// namespace masquerades (no destination translation): Y's accepted
/// socket shows the hub's address as its peer, which is not X's, so the
/// offer is claimed only through the tracking entry.
#[test]
fn a_masqueraded_connection_pairs_through_its_tracking_entry() {
    let mut t = T::new();
    t.env.set_addrs(NetNs::FAKE, &["10.0.0.254"]);
    t.env.set_addrs(NS_X, &["10.0.0.1"]);
    t.env.set_addrs(NS_Y, &["10.0.0.2"]);
    let (cx, sy) = (11, 22);
    t.session_in(cx, 110, 1000, NS_X);
    t.session_in(sy, 220, 1000, NS_Y);
    t.listen_in(sy, NS_Y, "0.0.0.0:80");
    let Msg::OfferOk { offer_id } = t.offer_in(cx, NS_X, "0.0.0.0:5001", "10.0.0.2:80") else {
        panic!("offer refused")
    };
    // Not tracked: the hub's address is no proof of X.
    assert_eq!(
        t.claim_in(sy, NS_Y, "10.0.0.2:80", "10.0.0.254:5001"),
        Msg::NoOffer
    );
    t.env.track(
        "10.0.0.1:5001",
        "10.0.0.2:80",
        "10.0.0.2:80",
        "10.0.0.254:5001",
    );
    assert!(matches!(
        t.claim_in(sy, NS_Y, "10.0.0.2:80", "10.0.0.254:5001"),
        Msg::ClaimOk { offer_id: o, .. } if o == offer_id
    ));
}

/// A namespace that offers from an address it does not have (a socket
/// bound with IP_FREEBIND) to another namespace's: no ring, whichever
/// namespace has that address.
#[test]
fn an_offer_from_an_address_not_ones_own_pairs_nothing() {
    let mut t = T::new();
    t.env.set_addrs(NS_X, &["10.0.0.1"]);
    t.env.set_addrs(NS_Y, &["10.0.0.2"]);
    t.env.set_addrs(NS_Z, &["10.0.0.3"]);
    let (cx, sy) = (11, 22);
    t.session_in(cx, 110, 1000, NS_X);
    t.session_in(sy, 220, 1000, NS_Y);
    t.listen_in(sy, NS_Y, "0.0.0.0:80");
    for from in ["10.0.0.3:5000", "10.0.0.9:5001"] {
        assert_eq!(
            t.offer_in(cx, NS_X, from, "10.0.0.2:80"),
            Msg::OfferRefused {
                reason: RefuseReason::Invalid
            },
            "{from}"
        );
    }
}

/// CAP_NET_ADMIN counts only in the daemon's own namespace (its
/// administrator), and a process the daemon could not place (pid of
/// another pid namespace) is listed under the namespace of the first
/// socket it proves.
#[test]
fn status_scope_of_net_admins_and_unplaced_processes() {
    let mut t = T::new();
    let net_admin = crate::netns::Caps {
        sys_admin: false,
        net_admin: true,
    };
    let sessions = [
        (61, 0, Some(NetNs::FAKE), net_admin),
        (62, 0, Some(NS_X), net_admin),
        (63, 1000, None, crate::netns::Caps::NONE),
        (64, 1000, Some(NS_Y), crate::netns::Caps::NONE),
    ];
    for (id, uid, netns, caps) in sessions {
        t.h.open_session(
            id,
            Cred {
                pid: 0,
                uid,
                gid: uid,
                netns,
                caps,
            },
        );
        let hello = Msg::Hello {
            pid: id as u32,
            exe: "x".into(),
        };
        t.req(id, hello, vec![]);
    }
    // 63 proves a listener of NS_Y, then reports a connection.
    t.listen_in(63, NS_Y, "0.0.0.0:80");
    let report = Msg::ConnReport {
        fd: 9,
        local: a("10.0.0.2:80"),
        peer: a("10.0.0.1:5000"),
        transport: Transport::Tcp,
        reason: "no ringsock peer".into(),
        ring: None,
    };
    assert_eq!(t.req(63, report, vec![]).msg, Msg::Ok);
    let seen = |t: &mut T, id| {
        let Msg::StatusReply { entries, .. } =
            t.req(id, Msg::StatusAll { after: None }, vec![]).msg
        else {
            panic!()
        };
        entries.len()
    };
    assert_eq!(seen(&mut t, 61), 1, "NET_ADMIN in the daemon's namespace");
    assert_eq!(seen(&mut t, 62), 0, "NET_ADMIN in another namespace");
    assert_eq!(seen(&mut t, 64), 1, "the namespace of 63's socket");
}

/// IPv6 between namespaces, and a dual-stack wildcard listener taking an
/// IPv4 client of another namespace.
#[test]
fn rings_between_namespaces_over_ipv6_and_dual_stack() {
    let mut t = T::new();
    t.env.set_addrs(NS_X, &["fd00::1", "10.0.0.1"]);
    t.env.set_addrs(NS_Y, &["fd00::2", "10.0.0.2"]);
    let (cx, sy) = (11, 22);
    t.session_in(cx, 110, 1000, NS_X);
    t.session_in(sy, 220, 1000, NS_Y);
    let l = FakeSock::Listener {
        addr: a("[::]:80"),
        dual_stack: true,
    };
    let m = Msg::ListenerAdd { addr: a("[::]:80") };
    assert_eq!(t.req_in(sy, NS_Y, m, vec![l]), Msg::Ok);
    // (client bound, server dialled, the accepted socket's local and peer)
    for (client, server, local, peer) in [
        (
            "[::]:5000",
            "[fd00::2]:80",
            "[fd00::2]:80",
            "[fd00::1]:5000",
        ),
        (
            "0.0.0.0:5001",
            "10.0.0.2:80",
            "[::ffff:10.0.0.2]:80",
            "[::ffff:10.0.0.1]:5001",
        ),
    ] {
        let Msg::OfferOk { offer_id } = t.offer_in(cx, NS_X, client, server) else {
            panic!("offer {client} -> {server} refused")
        };
        assert!(
            matches!(
                t.claim_in(sy, NS_Y, local, peer),
                Msg::ClaimOk { offer_id: o, .. } if o == offer_id
            ),
            "{client} -> {server}"
        );
    }
}

/// A listener bound to an address its namespace does not have (Y's,
/// with IP_FREEBIND) does not make that address served from there: X's
/// offer goes to Y's listener alone.
#[test]
fn a_listener_on_another_namespaces_address_serves_nothing() {
    let mut t = T::new();
    t.env.set_addrs(NS_X, &["10.0.0.1"]);
    t.env.set_addrs(NS_Y, &["10.0.0.2"]);
    t.env.set_addrs(NS_Z, &["10.0.0.3"]);
    let (cx, sy, sz) = (11, 22, 33);
    t.session_in(cx, 110, 1000, NS_X);
    t.session_in(sy, 220, 1000, NS_Y);
    t.session_in(sz, 330, 1000, NS_Z);
    t.listen_in(sz, NS_Z, "10.0.0.2:80");
    // Only Z's listener on Y's address: nobody serves it.
    assert_eq!(
        t.offer_in(cx, NS_X, "0.0.0.0:5000", "10.0.0.2:80"),
        Msg::OfferRefused {
            reason: RefuseReason::Invalid
        }
    );
    t.listen_in(sy, NS_Y, "0.0.0.0:80");
    let Msg::OfferOk { offer_id } = t.offer_in(cx, NS_X, "0.0.0.0:5001", "10.0.0.2:80") else {
        panic!("offer refused")
    };
    assert_eq!(
        t.claim_in(sz, NS_Z, "10.0.0.2:80", "10.0.0.1:5001"),
        Msg::NoOffer
    );
    assert!(matches!(
        t.claim_in(sy, NS_Y, "10.0.0.2:80", "10.0.0.1:5001"),
        Msg::ClaimOk { offer_id: o, .. } if o == offer_id
    ));
}
