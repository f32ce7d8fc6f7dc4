//! Every message kind survives encode -> decode unchanged, and the size
//! limits hold at their extremes.

use std::collections::HashSet;
use std::net::SocketAddr;

use ringsock_proto::msg::{fd_range, kind, kind_name};
use ringsock_proto::*;

fn a(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn entry(i: u64) -> StatusEntry {
    StatusEntry {
        session: i,
        pid: 42,
        uid: 1000,
        exe: "/usr/bin/redis-check-rdb".into(),
        name: String::new(),
        fd: 7,
        local: a("127.0.0.1:6379"),
        peer: a("[::1]:40000"),
        transport: Transport::Shm,
        reason: "peer shim answered".into(),
        ring: Some(9),
        ring_stats: vec![RingStat {
            name: "memfd_size".into(),
            value: 1 << 20,
        }],
    }
}

/// One instance of every message kind.
fn examples() -> Vec<Msg> {
    vec![
        Msg::Hello {
            pid: 1234,
            exe: "/usr/bin/nginx".into(),
        },
        Msg::ListenerAdd {
            addr: a("0.0.0.0:80"),
        },
        Msg::ListenerRemove {
            addr: a("[::]:443"),
        },
        Msg::Offer {
            client: a("127.0.0.1:50000"),
            server: a("127.0.0.1:80"),
            payload: vec![1, 2, 3],
        },
        Msg::Claim,
        Msg::Answer {
            offer_id: 77,
            payload: b"rkey".to_vec(),
        },
        Msg::Decline {
            offer_id: 78,
            reason: "no ring memory".into(),
        },
        Msg::Collect { offer_id: 79 },
        Msg::Cancel { offer_id: 80 },
        Msg::ConnReport {
            fd: 12,
            local: a("127.0.0.1:80"),
            peer: a("127.0.0.1:50000"),
            transport: Transport::Rdma,
            reason: "rdma device mlx5_0".into(),
            ring: None,
        },
        Msg::ConnClosed {
            fd: 12,
            local: a("127.0.0.1:80"),
            peer: a("127.0.0.1:50000"),
        },
        Msg::Status { after: None },
        Msg::StatusAll {
            after: Some(StatusCursor { session: 3, fd: -1 }),
        },
        Msg::StatusNamed { after: None },
        Msg::Metrics,
        Msg::HelloOk {
            daemon_version: "0.1.0".into(),
            host_id: 0xfeed,
        },
        Msg::Ok,
        Msg::Error {
            code: ErrorCode::NotOwner,
            text: "offer 3 was claimed by another session".into(),
        },
        Msg::OfferOk { offer_id: 1 },
        Msg::OfferRefused {
            reason: RefuseReason::NoListener,
        },
        Msg::ClaimOk {
            offer_id: 1,
            client_pid: 99,
            payload: vec![0; MAX_PAYLOAD],
        },
        Msg::NoOffer,
        Msg::Pending,
        Msg::Answered { payload: vec![] },
        Msg::Declined {
            reason: "server refused".into(),
        },
        Msg::Expired,
        Msg::StatusReply {
            entries: vec![entry(1), entry(2)],
            next: Some(StatusCursor { session: 2, fd: 7 }),
        },
        Msg::StatusNamedReply {
            entries: vec![named(1), entry(2)],
            next: None,
        },
        Msg::MetricsReply {
            text: "# TYPE ringsock_sessions gauge\nringsock_sessions 1\n".into(),
        },
        Msg::RemoteOffer {
            offer_ref: 5,
            client: a("10.0.0.1:50000"),
            server: a("10.0.0.2:80"),
            payload: b"qpn".to_vec(),
        },
        Msg::RemoteCancel { offer_ref: 5 },
        Msg::RemoteOfferOk {
            offer_ref: 5,
            expires_ms: 10_000,
        },
        Msg::RemoteRefused {
            offer_ref: 6,
            reason: RefuseReason::Duplicate,
        },
        Msg::RemoteClaimed {
            offer_ref: 5,
            expires_ms: 9_000,
        },
        Msg::RemoteAnswer {
            offer_ref: 5,
            payload: vec![7; MAX_PAYLOAD],
        },
        Msg::RemoteDecline {
            offer_ref: 7,
            reason: "no device".into(),
        },
        Msg::RemoteExpired { offer_ref: 8 },
    ]
}

#[test]
fn every_kind_round_trips() {
    let mut kinds = HashSet::new();
    for m in examples() {
        let bytes = encode(&m).unwrap();
        assert_eq!(decode(&bytes).unwrap(), m, "{}", m.name());
        assert_ne!(kind_name(m.kind()), "unknown");
        kinds.insert(m.kind());
    }
    // 15 requests + 14 replies + 8 ctl-to-ctl: the list above misses none.
    assert_eq!(kinds.len(), 37);
}

#[test]
fn every_truncation_is_an_error_never_a_panic() {
    for m in examples() {
        let bytes = encode(&m).unwrap();
        for cut in 0..bytes.len() {
            assert!(decode(&bytes[..cut]).is_err(), "{} cut at {cut}", m.name());
        }
    }
}

#[test]
fn request_and_reply_classes() {
    for m in examples() {
        let peer = m.kind() & kind::PEER_BIT != 0;
        assert_eq!(m.is_peer(), peer);
        assert_eq!(m.is_request(), !peer && m.kind() & kind::REPLY_BIT == 0);
        assert_eq!(m.is_reply(), !peer && m.kind() & kind::REPLY_BIT != 0);
        assert_eq!(m.is_peer_request(), peer && m.kind() & kind::REPLY_BIT == 0);
        if peer {
            assert_eq!(m.fd_range(), (0, 0), "{}", m.name());
        }
    }
    assert!(Msg::Claim.is_request());
    assert!(!Msg::NoOffer.is_request());
    assert!(Msg::NoOffer.is_reply());
    assert!(!Msg::RemoteCancel { offer_ref: 1 }.is_request());
    assert!(Msg::RemoteCancel { offer_ref: 1 }.is_peer_request());
    assert!(!Msg::RemoteExpired { offer_ref: 1 }.is_reply());
}

#[test]
fn fd_arity() {
    assert_eq!(fd_range(kind::OFFER), (1, MAX_FDS));
    assert_eq!(fd_range(kind::CLAIM), (1, 1));
    assert_eq!(fd_range(kind::LISTENER_ADD), (1, 1));
    assert_eq!(fd_range(kind::CLAIM_OK), (0, MAX_FDS - 1));
    assert_eq!(fd_range(kind::STATUS), (0, 0));
    assert_eq!(fd_range(kind::STATUS_ALL), (0, 0));
    assert_eq!(fd_range(kind::STATUS_NAMED), (0, 0));
    assert!(Msg::Claim.check_fds(0).is_err());
    assert!(Msg::Claim.check_fds(1).is_ok());
    assert!(Msg::Ok.check_fds(1).is_err());
}

#[test]
fn field_limits_are_refused_at_encode_time() {
    let too_long = Msg::Hello {
        pid: 1,
        exe: "x".repeat(MAX_EXE + 1),
    };
    assert!(matches!(
        encode(&too_long),
        Err(ProtoError::FieldTooLong { field: "exe", .. })
    ));
    let big_page = Msg::StatusReply {
        entries: (0..MAX_STATUS_PAGE as u64 + 1).map(entry).collect(),
        next: None,
    };
    assert!(encode(&big_page).is_err());
}

#[test]
fn a_full_page_of_maximal_entries_fits_in_a_frame() {
    let max_entry = StatusEntry {
        session: u64::MAX,
        pid: u32::MAX,
        uid: u32::MAX,
        exe: "é".repeat(MAX_EXE / 2),
        name: "n".repeat(MAX_PROCESS_NAME),
        fd: i32::MAX,
        local: a("[ffff::1%4294967295]:65535"),
        peer: a("[ffff::2%4294967295]:65535"),
        transport: Transport::Tcp,
        reason: "r".repeat(MAX_REASON),
        ring: Some(u64::MAX),
        ring_stats: (0..MAX_RING_STATS)
            .map(|_| RingStat {
                name: "n".repeat(MAX_STAT_NAME),
                value: u64::MAX,
            })
            .collect(),
    };
    let page = Msg::StatusNamedReply {
        entries: vec![max_entry; MAX_STATUS_PAGE],
        next: Some(StatusCursor {
            session: u64::MAX,
            fd: i32::MAX,
        }),
    };
    let bytes = encode(&page).unwrap();
    assert!(bytes.len() <= MAX_FRAME_TOTAL);
    assert_eq!(decode(&bytes).unwrap(), page);
}

/// `entry(i)` with the name `ps` gives the process.
fn named(i: u64) -> StatusEntry {
    StatusEntry {
        name: "redis-server".into(),
        ..entry(i)
    }
}

#[test]
fn only_the_named_reply_carries_names() {
    let cursor = Some(StatusCursor { session: 2, fd: 7 });
    let plain = Msg::StatusReply {
        entries: vec![named(1)],
        next: cursor,
    };
    // What a CLI that asked `StatusAll` decodes: no name, nothing else lost.
    assert_eq!(
        decode(&encode(&plain).unwrap()).unwrap(),
        Msg::StatusReply {
            entries: vec![entry(1)],
            next: cursor,
        }
    );
    let long = Msg::StatusNamedReply {
        entries: vec![StatusEntry {
            name: "n".repeat(MAX_PROCESS_NAME + 1),
            ..entry(1)
        }],
        next: None,
    };
    assert!(matches!(
        encode(&long),
        Err(ProtoError::FieldTooLong { field: "name", .. })
    ));
}

/// An entry with `n` counters, each with a distinct value.
fn entry_with_stats(n: usize) -> StatusEntry {
    let mut e = entry(1);
    e.transport = Transport::Rdma;
    e.ring_stats = (0..n)
        .map(|i| RingStat {
            name: format!("counter_{i}"),
            value: 1000 + i as u64,
        })
        .collect();
    e
}

#[test]
fn ring_stats_limit_is_32_and_strict() {
    assert_eq!(MAX_RING_STATS, 32);
    // What CLIs built before `StatusAll` decode; the daemon cuts replies
    // to `Status` to it.
    assert_eq!(MAX_RING_STATS_V1, 16);
    let full = Msg::StatusReply {
        entries: vec![entry_with_stats(MAX_RING_STATS)],
        next: None,
    };
    let bytes = encode(&full).unwrap();
    assert_eq!(decode(&bytes).unwrap(), full);
    // One more is refused when encoding...
    let over = Msg::StatusReply {
        entries: vec![entry_with_stats(MAX_RING_STATS + 1)],
        next: None,
    };
    assert_eq!(
        encode(&over),
        Err(ProtoError::FieldTooLong {
            field: "ring_stats",
            len: MAX_RING_STATS + 1,
            max: MAX_RING_STATS,
        })
    );
    // ...and when decoding a frame that carries it anyway: the 32-stat
    // frame with one more counter spliced in and the count raised.
    let extra = {
        let mut v = Vec::new();
        v.extend_from_slice(&9u32.to_le_bytes());
        v.extend_from_slice(b"counter_x");
        v.extend_from_slice(&7u64.to_le_bytes());
        v
    };
    // The entry is the page's only one and its counters come last, before
    // the one-byte cursor: the count sits just before the first counter.
    let stats_len: usize = (0..MAX_RING_STATS)
        .map(|i| 4 + format!("counter_{i}").len() + 8)
        .sum();
    let count_at = bytes.len() - 1 - stats_len - 2;
    assert_eq!(
        u16::from_le_bytes([bytes[count_at], bytes[count_at + 1]]),
        MAX_RING_STATS as u16
    );
    let mut forged = bytes.clone();
    forged[count_at..count_at + 2].copy_from_slice(&(MAX_RING_STATS as u16 + 1).to_le_bytes());
    forged.splice(bytes.len() - 1..bytes.len() - 1, extra);
    let len = (forged.len() - 4) as u32;
    forged[..4].copy_from_slice(&len.to_le_bytes());
    let err = decode(&forged).unwrap_err();
    assert_eq!(
        err,
        ProtoError::FieldTooLong {
            field: "ring_stats",
            len: MAX_RING_STATS + 1,
            max: MAX_RING_STATS,
        }
    );
    assert!(err.to_string().contains("ring_stats"), "{err}");
}

#[test]
fn bad_enum_values_are_typed_errors() {
    let mut f = encode(&Msg::OfferRefused {
        reason: RefuseReason::Invalid,
    })
    .unwrap();
    *f.last_mut().unwrap() = 99;
    assert!(matches!(
        decode(&f),
        Err(ProtoError::BadValue {
            field: "refuse_reason",
            value: 99
        })
    ));
    let e = decode(&f).unwrap_err();
    assert!(e.to_string().contains("refuse_reason"));
}

#[test]
fn frame_len_for_streams() {
    let f = encode(&Msg::Collect { offer_id: 5 }).unwrap();
    assert_eq!(frame_len(&f[..3]), Ok(None));
    assert_eq!(frame_len(&f), Ok(Some(f.len())));
}

#[test]
fn transport_names_round_trip() {
    for t in [Transport::Shm, Transport::Rdma, Transport::Tcp] {
        assert_eq!(Transport::from_name(t.as_str()), Some(t));
    }
    assert_eq!(Transport::from_name("SHM"), None);
    assert_eq!(Transport::from_name(""), None);
}

#[test]
fn metrics_text_limit_fits_a_frame_and_is_strict() {
    let full = Msg::MetricsReply {
        text: "x".repeat(MAX_METRICS_TEXT),
    };
    let bytes = encode(&full).unwrap();
    assert!(bytes.len() <= MAX_FRAME_TOTAL);
    assert_eq!(decode(&bytes).unwrap(), full);
    let over = Msg::MetricsReply {
        text: "x".repeat(MAX_METRICS_TEXT + 1),
    };
    assert_eq!(
        encode(&over),
        Err(ProtoError::FieldTooLong {
            field: "text",
            len: MAX_METRICS_TEXT + 1,
            max: MAX_METRICS_TEXT,
        })
    );
    // A frame that carries one byte more anyway is refused on decoding:
    // the full frame with its length fields raised by one and a byte added.
    let mut long = bytes.clone();
    long.push(b'x');
    let frame_len = u32::from_le_bytes(long[..4].try_into().unwrap()) + 1;
    long[..4].copy_from_slice(&frame_len.to_le_bytes());
    long[8..12].copy_from_slice(&((MAX_METRICS_TEXT + 1) as u32).to_le_bytes());
    assert_eq!(
        decode(&long),
        Err(ProtoError::FieldTooLong {
            field: "text",
            len: MAX_METRICS_TEXT + 1,
            max: MAX_METRICS_TEXT,
        })
    );
    // Only a reply kind carries text; the request has no body.
    assert_eq!(Msg::Metrics.fd_range(), (0, 0));
    assert!(Msg::Metrics.is_request() && full.is_reply());
}
