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
        exe: "/usr/bin/redis-server".into(),
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
    // 12 requests + 12 replies + 8 ctl-to-ctl: the list above misses none.
    assert_eq!(kinds.len(), 32);
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
    let page = Msg::StatusReply {
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
