//! Registry state-machine tests, with fake descriptors that count how many
//! are alive so every test can also prove nothing leaks.

use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use super::*;

/// A fake descriptor: alive until dropped.
#[derive(Debug)]
struct TFd {
    tag: u32,
    live: Rc<Cell<usize>>,
}

impl Drop for TFd {
    fn drop(&mut self) {
        self.live.set(self.live.get() - 1);
    }
}

struct World {
    reg: Registry<TFd, TFd>,
    live: Rc<Cell<usize>>,
    now: Instant,
}

const A: SessionId = 1; // client process
const B: SessionId = 2; // server process
const C: SessionId = 3; // bystander

/// The namespace everything of these tests is in unless said otherwise.
const NS: NetNs = NetNs::FAKE;

fn a(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn listener(s: &str) -> ListenerKey {
    ListenerKey {
        addr: a(s),
        dual_stack: false,
        netns: NS,
    }
}

impl World {
    fn new() -> Self {
        Self::with_limits(Limits::default())
    }

    fn with_limits(limits: Limits) -> Self {
        let mut reg = Registry::new(limits);
        for (id, pid) in [(A, 100), (B, 200), (C, 300)] {
            reg.open_session(
                id,
                Cred {
                    pid,
                    uid: 1000,
                    gid: 1000,
                    netns: Some(NS),
                    caps: crate::netns::Caps::NONE,
                },
            );
            reg.hello(id, pid, format!("/bin/p{pid}"));
        }
        World {
            reg,
            live: Rc::new(Cell::new(0)),
            now: Instant::now(),
        }
    }

    fn fds(&self, tags: &[u32]) -> Vec<TFd> {
        tags.iter()
            .map(|&tag| {
                self.live.set(self.live.get() + 1);
                TFd {
                    tag,
                    live: self.live.clone(),
                }
            })
            .collect()
    }

    fn offer(&mut self, s: SessionId, client: &str, server: &str) -> Result<OfferId, RefuseReason> {
        let fds = self.fds(&[10, 11]);
        let new = NewOffer {
            client: a(client),
            server: a(server),
            netns: NS,
            client_netns: NS,
            payload: b"ring".to_vec(),
            fds,
        };
        let r = self.reg.offer(s, new, Link::Local, self.now);
        self.check();
        r
    }

    fn advance(&mut self, ms: u64) -> usize {
        self.now += Duration::from_millis(ms);
        let n = self.reg.tick(self.now);
        self.check();
        n
    }

    fn check(&mut self) {
        // Closed rings wait for their last counters to be read (by the
        // handler in the daemon); here they are just dropped.
        drop(self.reg.take_retired());
        self.reg.check_invariants();
        assert_eq!(self.live.get(), self.reg.held_fds(), "live fakes vs held");
    }
}

#[test]
fn full_handshake() {
    let mut w = World::new();
    w.reg.add_listener(B, listener("127.0.0.1:80")).unwrap();
    let id = w.offer(A, "127.0.0.1:5000", "127.0.0.1:80").unwrap();
    assert_eq!(w.reg.held_fds(), 2);
    assert!(matches!(w.reg.collect(A, id), Ok(Outcome::Pending)));

    let c = w
        .reg
        .claim(B, NS, a("127.0.0.1:80"), a("127.0.0.1:5000"), w.now)
        .unwrap();
    assert_eq!(
        (c.offer_id, c.client_pid, &c.payload[..]),
        (id, 100, &b"ring"[..])
    );
    assert_eq!(c.fds.iter().map(|f| f.tag).collect::<Vec<_>>(), [10, 11]);
    drop(c);
    w.check();
    assert!(matches!(w.reg.collect(A, id), Ok(Outcome::Pending)));

    let fds = w.fds(&[20]);
    w.reg.answer(B, id, b"ok".to_vec(), fds, w.now).unwrap();
    w.check();
    match w.reg.collect(A, id).unwrap() {
        Outcome::Answered { payload, fds } => {
            assert_eq!(payload, b"ok");
            assert_eq!(fds[0].tag, 20);
        }
        other => panic!("{other:?}"),
    }
    w.check();
    // Collected results are gone.
    assert_eq!(w.reg.collect(A, id).unwrap_err(), RegError::NotFound);
    assert_eq!(w.reg.offer_count(), 0);
}

#[test]
fn offer_needs_a_listener_exact_or_wildcard() {
    let mut w = World::new();
    assert_eq!(
        w.offer(A, "127.0.0.1:5000", "127.0.0.1:80"),
        Err(RefuseReason::NoListener)
    );
    w.reg.add_listener(B, listener("0.0.0.0:80")).unwrap();
    assert!(w.offer(A, "127.0.0.1:5000", "127.0.0.1:80").is_ok());
    assert_eq!(
        w.offer(A, "127.0.0.1:5001", "127.0.0.1:81"),
        Err(RefuseReason::NoListener)
    );
    w.reg.add_listener(B, listener("[::]:443")).unwrap();
    assert!(w.offer(A, "[::1]:5002", "[::1]:443").is_ok());
    // A v6-only wildcard does not take IPv4.
    assert_eq!(
        w.offer(A, "127.0.0.1:5003", "127.0.0.1:443"),
        Err(RefuseReason::NoListener)
    );
    w.reg
        .add_listener(
            B,
            ListenerKey {
                addr: a("[::]:8443"),
                dual_stack: true,
                netns: NS,
            },
        )
        .unwrap();
    assert!(w.offer(A, "127.0.0.1:5004", "127.0.0.1:8443").is_ok());
}

#[test]
fn v4_mapped_addresses_match_plain_v4() {
    let mut w = World::new();
    w.reg.add_listener(B, listener("127.0.0.1:80")).unwrap();
    let id = w.offer(A, "127.0.0.1:5000", "127.0.0.1:80").unwrap();
    // A dual-stack server socket reports v4 peers as ::ffff:a.b.c.d.
    let c = w
        .reg
        .claim(
            B,
            NS,
            a("[::ffff:127.0.0.1]:80"),
            a("[::ffff:127.0.0.1]:5000"),
            w.now,
        )
        .unwrap();
    assert_eq!(c.offer_id, id);
}

#[test]
fn wildcard_bound_client_matches_by_port() {
    let mut w = World::new();
    w.reg.add_listener(B, listener("0.0.0.0:80")).unwrap();
    let id = w.offer(A, "0.0.0.0:5000", "127.0.0.1:80").unwrap();
    assert!(w
        .reg
        .claim(B, NS, a("127.0.0.1:80"), a("127.0.0.1:5001"), w.now)
        .is_none());
    let c = w
        .reg
        .claim(B, NS, a("127.0.0.1:80"), a("127.0.0.1:5000"), w.now);
    assert_eq!(c.unwrap().offer_id, id);
    w.check();
}

#[test]
fn claim_needs_the_exact_tuple() {
    let mut w = World::new();
    w.reg.add_listener(B, listener("0.0.0.0:80")).unwrap();
    w.offer(A, "127.0.0.1:5000", "127.0.0.1:80").unwrap();
    for (local, peer) in [
        ("127.0.0.1:80", "127.0.0.1:5001"),
        ("127.0.0.2:80", "127.0.0.1:5000"),
        ("127.0.0.1:81", "127.0.0.1:5000"),
    ] {
        assert!(w.reg.claim(B, NS, a(local), a(peer), w.now).is_none());
    }
    w.check();
}

#[test]
fn double_claim_is_refused() {
    let mut w = World::new();
    w.reg.add_listener(B, listener("127.0.0.1:80")).unwrap();
    w.offer(A, "127.0.0.1:5000", "127.0.0.1:80").unwrap();
    let (l, p) = (a("127.0.0.1:80"), a("127.0.0.1:5000"));
    assert!(w.reg.claim(B, NS, l, p, w.now).is_some());
    assert!(w.reg.claim(B, NS, l, p, w.now).is_none());
    assert!(w.reg.claim(C, NS, l, p, w.now).is_none());
    w.check();
}

#[test]
fn duplicate_offer_for_a_live_tuple() {
    let mut w = World::new();
    w.reg.add_listener(B, listener("127.0.0.1:80")).unwrap();
    let id = w.offer(A, "127.0.0.1:5000", "127.0.0.1:80").unwrap();
    assert_eq!(
        w.offer(C, "127.0.0.1:5000", "127.0.0.1:80"),
        Err(RefuseReason::Duplicate)
    );
    w.reg
        .claim(B, NS, a("127.0.0.1:80"), a("127.0.0.1:5000"), w.now)
        .unwrap();
    assert_eq!(
        w.offer(A, "127.0.0.1:5000", "127.0.0.1:80"),
        Err(RefuseReason::Duplicate)
    );
    // Once settled, the tuple is free again (a new connection reusing it).
    w.reg.decline(B, id, "no".into(), w.now).unwrap();
    assert!(w.offer(A, "127.0.0.1:5000", "127.0.0.1:80").is_ok());
}

#[test]
fn answer_and_decline_only_by_the_claimer() {
    let mut w = World::new();
    w.reg.add_listener(B, listener("127.0.0.1:80")).unwrap();
    let id = w.offer(A, "127.0.0.1:5000", "127.0.0.1:80").unwrap();
    // Before the claim: nobody may answer.
    let f = w.fds(&[1]);
    assert_eq!(
        w.reg.answer(A, id, vec![], f, w.now),
        Err(RegError::BadState)
    );
    assert_eq!(
        w.reg.decline(C, id, "x".into(), w.now),
        Err(RegError::NotOwner)
    );
    w.reg
        .claim(B, NS, a("127.0.0.1:80"), a("127.0.0.1:5000"), w.now)
        .unwrap();
    let f = w.fds(&[2]);
    assert_eq!(
        w.reg.answer(C, id, vec![], f, w.now),
        Err(RegError::NotOwner)
    );
    assert_eq!(
        w.reg.decline(A, id, "x".into(), w.now),
        Err(RegError::NotOwner)
    );
    assert_eq!(
        w.reg.answer(B, 999, vec![], vec![], w.now),
        Err(RegError::NotFound)
    );
    w.check();
    w.reg
        .decline(B, id, "no ring memory".into(), w.now)
        .unwrap();
    // Settled once: a second answer is refused.
    let f = w.fds(&[3]);
    assert_eq!(
        w.reg.answer(B, id, vec![], f, w.now),
        Err(RegError::BadState)
    );
    w.check();
    match w.reg.collect(A, id).unwrap() {
        Outcome::Declined { reason } => assert_eq!(reason, "no ring memory"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn collect_and_cancel_only_by_the_offerer() {
    let mut w = World::new();
    w.reg.add_listener(B, listener("127.0.0.1:80")).unwrap();
    let id = w.offer(A, "127.0.0.1:5000", "127.0.0.1:80").unwrap();
    assert_eq!(w.reg.collect(B, id).unwrap_err(), RegError::NotFound);
    assert_eq!(w.reg.cancel(C, id), Err(RegError::NotFound));
    w.reg.cancel(A, id).unwrap();
    w.check();
    assert_eq!(w.reg.offer_count(), 0);
    assert!(w
        .reg
        .claim(B, NS, a("127.0.0.1:80"), a("127.0.0.1:5000"), w.now)
        .is_none());
}

#[test]
fn cancel_after_claim_is_refused_and_the_answer_stands() {
    let mut w = World::new();
    w.reg.add_listener(B, listener("127.0.0.1:80")).unwrap();
    let id = w.offer(A, "127.0.0.1:5000", "127.0.0.1:80").unwrap();
    w.reg
        .claim(B, NS, a("127.0.0.1:80"), a("127.0.0.1:5000"), w.now)
        .unwrap();
    assert_eq!(w.reg.cancel(A, id), Err(RegError::BadState));
    w.check();
    let f = w.fds(&[1]);
    w.reg.answer(B, id, vec![], f, w.now).unwrap();
    assert_eq!(w.reg.cancel(A, id), Err(RegError::BadState));
    assert!(matches!(
        w.reg.collect(A, id).unwrap(),
        Outcome::Answered { .. }
    ));
    w.check();
}

#[test]
fn unclaimed_offers_expire_then_vanish() {
    let mut w = World::new();
    w.reg.add_listener(B, listener("127.0.0.1:80")).unwrap();
    let id = w.offer(A, "127.0.0.1:5000", "127.0.0.1:80").unwrap();
    assert_eq!(w.advance(9_999), 0);
    assert_eq!(w.reg.held_fds(), 2);
    assert_eq!(w.advance(1), 1);
    // Expired: fds released, claim impossible, Collect says Expired once.
    assert_eq!(w.reg.held_fds(), 0);
    assert!(w
        .reg
        .claim(B, NS, a("127.0.0.1:80"), a("127.0.0.1:5000"), w.now)
        .is_none());
    assert!(matches!(w.reg.collect(A, id), Ok(Outcome::Expired)));
    assert_eq!(w.reg.offer_count(), 0);

    // Never collected: the tombstone goes after another timeout.
    w.offer(A, "127.0.0.1:5001", "127.0.0.1:80").unwrap();
    w.advance(10_000);
    assert_eq!(w.reg.offer_count(), 1);
    w.advance(10_000);
    assert_eq!(w.reg.offer_count(), 0);
}

#[test]
fn claimed_but_unanswered_offers_expire() {
    let mut w = World::new();
    w.reg.add_listener(B, listener("127.0.0.1:80")).unwrap();
    let id = w.offer(A, "127.0.0.1:5000", "127.0.0.1:80").unwrap();
    w.advance(9_000);
    w.reg
        .claim(B, NS, a("127.0.0.1:80"), a("127.0.0.1:5000"), w.now)
        .unwrap();
    // The claim restarted the clock.
    w.advance(9_000);
    assert!(matches!(w.reg.collect(A, id), Ok(Outcome::Pending)));
    w.advance(1_000);
    let f = w.fds(&[1]);
    assert_eq!(
        w.reg.answer(B, id, vec![], f, w.now),
        Err(RegError::BadState)
    );
    assert!(matches!(w.reg.collect(A, id), Ok(Outcome::Expired)));
    w.check();
}

#[test]
fn uncollected_answers_are_dropped_with_their_fds() {
    let mut w = World::new();
    w.reg.add_listener(B, listener("127.0.0.1:80")).unwrap();
    let id = w.offer(A, "127.0.0.1:5000", "127.0.0.1:80").unwrap();
    drop(
        w.reg
            .claim(B, NS, a("127.0.0.1:80"), a("127.0.0.1:5000"), w.now),
    );
    let f = w.fds(&[1, 2, 3]);
    w.reg.answer(B, id, vec![], f, w.now).unwrap();
    assert_eq!(w.reg.held_fds(), 3);
    w.advance(10_000);
    assert_eq!(w.reg.held_fds(), 0);
    assert_eq!(w.reg.offer_count(), 0);
}

#[test]
fn session_close_removes_everything_it_registered() {
    let mut w = World::new();
    w.reg.add_listener(B, listener("127.0.0.1:80")).unwrap();
    w.offer(A, "127.0.0.1:5000", "127.0.0.1:80").unwrap();
    w.offer(A, "127.0.0.1:5001", "127.0.0.1:80").unwrap();
    let rings = w.fds(&[7]);
    w.reg
        .report(
            A,
            5,
            Report {
                local: a("127.0.0.1:5000"),
                peer: a("127.0.0.1:80"),
                transport: Transport::Shm,
                reason: String::new(),
                ring: Some(1),
                ring_obj: rings.into_iter().next(),
            },
        )
        .unwrap();
    w.check();
    w.reg.close_session(A, w.now);
    w.check();
    assert_eq!(w.reg.offer_count(), 0);
    assert_eq!(w.live.get(), 0);
    assert_eq!(w.reg.status_page(None, 10, Scope::Host).0.len(), 0);
    // The server's listener dies with the server's session.
    w.reg.close_session(B, w.now);
    assert!(!w.reg.has_listener_for(NS, a("127.0.0.1:80")));
    w.check();
}

#[test]
fn claimer_closing_declines_its_claims() {
    let mut w = World::new();
    w.reg.add_listener(B, listener("127.0.0.1:80")).unwrap();
    let id = w.offer(A, "127.0.0.1:5000", "127.0.0.1:80").unwrap();
    drop(
        w.reg
            .claim(B, NS, a("127.0.0.1:80"), a("127.0.0.1:5000"), w.now),
    );
    w.reg.close_session(B, w.now);
    w.check();
    match w.reg.collect(A, id).unwrap() {
        Outcome::Declined { reason } => assert_eq!(reason, CLAIMER_GONE),
        other => panic!("{other:?}"),
    }
}

#[test]
fn listeners_are_refcounted_per_session() {
    let mut w = World::new();
    let k = listener("0.0.0.0:80");
    w.reg.add_listener(B, k).unwrap();
    w.reg.add_listener(B, k).unwrap();
    w.reg.add_listener(C, k).unwrap();
    w.check();
    w.reg.remove_listener(B, k.addr).unwrap();
    assert!(w.reg.has_listener_for(NS, a("127.0.0.1:80")));
    w.reg.remove_listener(B, k.addr).unwrap();
    assert_eq!(w.reg.remove_listener(B, k.addr), Err(RegError::NotFound));
    assert!(w.reg.has_listener_for(NS, a("127.0.0.1:80")));
    w.reg.close_session(C, w.now);
    assert!(!w.reg.has_listener_for(NS, a("127.0.0.1:80")));
    // Removing someone else's listener is not possible.
    w.reg.add_listener(B, k).unwrap();
    assert_eq!(w.reg.remove_listener(A, k.addr), Err(RegError::NotFound));
    w.check();
}

#[test]
fn limits_refuse_instead_of_growing() {
    let mut w = World::with_limits(Limits {
        max_offers_per_session: 2,
        max_listeners_per_session: 1,
        max_held_fds: 5,
        ..Limits::default()
    });
    w.reg.add_listener(B, listener("0.0.0.0:80")).unwrap();
    assert_eq!(
        w.reg.add_listener(B, listener("0.0.0.0:81")),
        Err(RegError::Limit)
    );
    w.offer(A, "127.0.0.1:1", "127.0.0.1:80").unwrap();
    w.offer(A, "127.0.0.1:2", "127.0.0.1:80").unwrap();
    assert_eq!(
        w.offer(A, "127.0.0.1:3", "127.0.0.1:80"),
        Err(RefuseReason::TooMany)
    );
    // 4 fds held, each offer brings 2: the daemon-wide cap refuses C too.
    assert_eq!(
        w.offer(C, "127.0.0.1:4", "127.0.0.1:80"),
        Err(RefuseReason::TooMany)
    );
    w.check();
}

#[test]
fn reports_replace_and_close_by_tuple() {
    let mut w = World::new();
    let rep = |local: &str, t| Report::<TFd> {
        local: a(local),
        peer: a("127.0.0.1:80"),
        transport: t,
        reason: "r".into(),
        ring: None,
        ring_obj: None,
    };
    w.reg
        .report(A, 5, rep("127.0.0.1:1", Transport::Tcp))
        .unwrap();
    w.reg
        .report(A, 5, rep("127.0.0.1:1", Transport::Shm))
        .unwrap();
    let (rows, next) = w.reg.status_page(None, 10, Scope::Host);
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].report.transport, Transport::Shm);
    assert_eq!((rows[0].pid, rows[0].exe), (100, "/bin/p100"));
    assert!(next.is_none());
    // A stale close for a reused fd number does not remove the new report.
    assert_eq!(
        w.reg
            .report_closed(A, 5, a("127.0.0.1:2"), a("127.0.0.1:80")),
        Err(RegError::NotFound)
    );
    w.reg
        .report_closed(A, 5, a("127.0.0.1:1"), a("127.0.0.1:80"))
        .unwrap();
    assert!(w.reg.status_page(None, 10, Scope::Host).0.is_empty());
}

/// A process that dup()s a ring connection's fd and closes the first
/// number reports it again under the new one: the row moves there with
/// its ring memfd, and the old number is free for the next connection.
#[test]
fn a_ring_reported_under_another_fd_moves_its_row() {
    let mut w = World::new();
    let rep = |local: &str, ring, obj: Option<TFd>| Report::<TFd> {
        local: a(local),
        peer: a("127.0.0.1:80"),
        transport: Transport::Shm,
        reason: String::new(),
        ring,
        ring_obj: obj,
    };
    let obj = w.fds(&[1]).pop();
    w.reg
        .report(A, 4, rep("127.0.0.1:1", Some(7), obj))
        .unwrap();
    w.check();
    w.reg
        .report(A, 5, rep("127.0.0.1:1", Some(7), None))
        .unwrap();
    w.check();
    let (rows, _) = w.reg.status_page(None, 10, Scope::Host);
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].fd, 5);
    assert_eq!(rows[0].report.ring_obj.as_ref().map(|o| o.tag), Some(1));
    // The next connection on number 4 is a row of its own.
    let obj = w.fds(&[2]).pop();
    w.reg
        .report(A, 4, rep("127.0.0.1:2", Some(8), obj))
        .unwrap();
    w.check();
    let fds: Vec<i32> = w
        .reg
        .status_page(None, 10, Scope::Host)
        .0
        .iter()
        .map(|r| r.fd)
        .collect();
    assert_eq!(fds, [4, 5]);
    // The moved end's close names its new number.
    w.reg
        .report_closed(A, 5, a("127.0.0.1:1"), a("127.0.0.1:80"))
        .unwrap();
    w.check();
    // Rows without a ring never merge: one 4-tuple in two namespaces.
    w.reg.report(B, 3, rep("127.0.0.1:3", None, None)).unwrap();
    w.reg.report(B, 6, rep("127.0.0.1:3", None, None)).unwrap();
    // Nor do two ends of one ring with other addresses (a process
    // connected to itself).
    w.reg
        .report(B, 8, rep("127.0.0.1:4", Some(9), None))
        .unwrap();
    w.reg
        .report(B, 9, rep("127.0.0.1:5", Some(9), None))
        .unwrap();
    w.check();
    assert_eq!(w.reg.status_page(None, 10, Scope::Host).0.len(), 5);
}

#[test]
fn status_pages_cover_every_row_once() {
    let mut w = World::new();
    for s in [A, B, C] {
        for fd in 0..5 {
            w.reg
                .report(
                    s,
                    fd,
                    Report {
                        local: a("127.0.0.1:1"),
                        peer: a("127.0.0.1:2"),
                        transport: Transport::Tcp,
                        reason: String::new(),
                        ring: None,
                        ring_obj: None,
                    },
                )
                .unwrap();
        }
    }
    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let (rows, next) = w.reg.status_page(after, 4, Scope::Host);
        seen.extend(rows.iter().map(|r| (r.session, r.fd)));
        match next {
            Some(c) => after = Some(c),
            None => break,
        }
    }
    let want: Vec<_> = [A, B, C]
        .iter()
        .flat_map(|&s| (0..5).map(move |fd| (s, fd)))
        .collect();
    assert_eq!(seen, want);
}

#[test]
fn pid_falls_back_to_hello_when_peercred_has_none() {
    let mut reg: Registry<TFd, TFd> = Registry::new(Limits::default());
    reg.open_session(
        9,
        Cred {
            pid: 0,
            uid: 0,
            gid: 0,
            netns: Some(NS),
            caps: crate::netns::Caps::NONE,
        },
    );
    assert!(!reg.has_said_hello(9));
    reg.hello(9, 4242, "x".into());
    assert!(reg.has_said_hello(9));
    assert_eq!(reg.pid_of(9), 4242);
}

// ---- offers between hosts ----

const P: SessionId = 50; // ctl-to-ctl connection from another host

fn remote(client: &str, server: &str) -> NewOffer<TFd> {
    NewOffer {
        client: a(client),
        server: a(server),
        netns: NS,
        client_netns: NS,
        payload: b"qp".to_vec(),
        fds: Vec::new(),
    }
}

#[test]
fn offers_from_another_host_report_claim_and_outcome() {
    let mut w = World::new();
    w.reg.open_peer_session(P);
    assert!(w.reg.is_peer_session(P) && !w.reg.has_said_hello(P));
    w.reg.add_listener(B, listener("10.0.0.2:80")).unwrap();
    // Same listener rule as local offers.
    assert_eq!(
        w.reg
            .offer_from_peer(P, 7, remote("10.0.0.1:5000", "10.0.0.2:81"), w.now),
        Err(RefuseReason::NoListener)
    );
    let id = w
        .reg
        .offer_from_peer(P, 7, remote("10.0.0.1:5000", "10.0.0.2:80"), w.now)
        .unwrap();
    assert_eq!(
        w.reg
            .offer_from_peer(P, 7, remote("10.0.0.1:5001", "10.0.0.2:80"), w.now),
        Err(RefuseReason::Duplicate)
    );
    assert!(w.reg.is_from_peer(id));
    assert_eq!(w.reg.peer_offer(P, 7), Some(id));
    // Local sessions cannot use the peer entry point, nor peers the local.
    assert_eq!(
        w.reg
            .offer_from_peer(A, 8, remote("10.0.0.1:5002", "10.0.0.2:80"), w.now),
        Err(RefuseReason::Invalid)
    );
    assert!(w.reg.take_events(w.now).is_empty());
    w.check();

    let c = w
        .reg
        .claim(B, NS, a("10.0.0.2:80"), a("10.0.0.1:5000"), w.now)
        .unwrap();
    assert_eq!((c.client_pid, &c.payload[..]), (0, &b"qp"[..]));
    let ev = w.reg.take_events(w.now);
    assert!(
        matches!(ev[..], [PeerEvent::Claimed { peer: P, offer_ref: 7, expires }] if expires == w.reg.limits().offer_timeout),
        "{ev:?}"
    );
    w.reg
        .answer(B, id, b"ok".to_vec(), Vec::new(), w.now)
        .unwrap();
    let ev = w.reg.take_events(w.now);
    assert!(
        matches!(&ev[..], [PeerEvent::Settled { peer: P, offer_ref: 7, outcome: Outcome::Answered { payload, .. } }] if payload == b"ok"),
        "{ev:?}"
    );
    // Delivered to the other host: nothing left here.
    assert_eq!(w.reg.offer_count(), 0);
    assert_eq!(w.reg.peer_offer(P, 7), None);
    w.check();

    // Expiry and a lost claimer are reported too; a cancel is not.
    w.reg
        .offer_from_peer(P, 8, remote("10.0.0.1:5003", "10.0.0.2:80"), w.now)
        .unwrap();
    w.advance(20_000);
    assert!(matches!(
        w.reg.take_events(w.now)[..],
        [PeerEvent::Settled {
            offer_ref: 8,
            outcome: Outcome::Expired,
            ..
        }]
    ));
    w.reg
        .offer_from_peer(P, 9, remote("10.0.0.1:5004", "10.0.0.2:80"), w.now)
        .unwrap();
    w.reg
        .claim(B, NS, a("10.0.0.2:80"), a("10.0.0.1:5004"), w.now)
        .unwrap();
    w.reg.close_session(B, w.now);
    // Drained late, the claim is stale news: only the outcome goes out.
    assert!(matches!(
        w.reg.take_events(w.now)[..],
        [PeerEvent::Settled {
            offer_ref: 9,
            outcome: Outcome::Declined { .. },
            ..
        }]
    ));
    w.reg.add_listener(C, listener("10.0.0.2:80")).unwrap();
    w.reg
        .offer_from_peer(P, 10, remote("10.0.0.1:5005", "10.0.0.2:80"), w.now)
        .unwrap();
    assert!(w.reg.cancel_from_peer(P, 10));
    assert!(!w.reg.cancel_from_peer(P, 10));
    assert!(w.reg.take_events(w.now).is_empty());
    // The connection closing drops what it carried, silently.
    w.reg
        .offer_from_peer(P, 11, remote("10.0.0.1:5006", "10.0.0.2:80"), w.now)
        .unwrap();
    w.reg.close_session(P, w.now);
    assert_eq!(w.reg.offer_count(), 0);
    assert!(w.reg.take_events(w.now).is_empty());
    w.check();
}

#[test]
fn forwarded_offers_follow_the_remote_host() {
    let mut w = World::new();
    // No listener needed here: the server is elsewhere.
    let id = w
        .reg
        .offer_forwarded(A, remote("0.0.0.0:5000", "10.0.0.2:80"), w.now)
        .unwrap();
    assert_eq!(
        w.reg
            .offer_forwarded(A, remote("0.0.0.0:5000", "10.0.0.2:80"), w.now),
        Err(RefuseReason::Duplicate)
    );
    // Never claimable on this host.
    assert!(w
        .reg
        .claim(B, NS, a("10.0.0.2:80"), a("10.0.0.1:5000"), w.now)
        .is_none());
    // The remote deadline (plus grace) replaces ours.
    w.reg.forwarded_extend(id, Duration::from_secs(60), w.now);
    w.advance(30_000);
    assert!(matches!(w.reg.collect(A, id), Ok(Outcome::Pending)));
    w.reg
        .forwarded_claimed(id, P, Duration::from_secs(10), w.now);
    assert_eq!(w.reg.cancel(A, id), Err(RegError::BadState));
    assert!(w.reg.forwarded_settle(
        id,
        OfferState::Declined {
            reason: "nope".into()
        },
        w.now
    ));
    assert!(!w.reg.forwarded_settle(id, OfferState::Expired, w.now));
    assert!(w.reg.take_events(w.now).is_empty());
    assert!(matches!(w.reg.collect(A, id), Ok(Outcome::Declined { .. })));
    w.check();

    // Withdrawn: by Cancel, by the session ending, by expiring here.
    let c1 = w
        .reg
        .offer_forwarded(A, remote("0.0.0.0:5001", "10.0.0.2:80"), w.now)
        .unwrap();
    w.reg.cancel(A, c1).unwrap();
    let c2 = w
        .reg
        .offer_forwarded(C, remote("0.0.0.0:5002", "10.0.0.2:80"), w.now)
        .unwrap();
    w.reg.close_session(C, w.now);
    let c3 = w
        .reg
        .offer_forwarded(A, remote("0.0.0.0:5003", "10.0.0.2:80"), w.now)
        .unwrap();
    w.advance(10_001);
    let ev = w.reg.take_events(w.now);
    let withdrawn: Vec<_> = ev
        .iter()
        .map(|e| match e {
            PeerEvent::Withdrawn { offer } => *offer,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(withdrawn, [c1, c2, c3]);
    assert!(matches!(w.reg.collect(A, c3), Ok(Outcome::Expired)));
    // A failed forward is dropped without a trace.
    let d = w
        .reg
        .offer_forwarded(A, remote("0.0.0.0:5004", "10.0.0.2:80"), w.now)
        .unwrap();
    w.reg.drop_forwarded(d);
    assert!(w.reg.collect(A, d).is_err());
    w.check();
}
