//! Property tests: decoding arbitrary bytes never panics, and every valid
//! message survives encode -> decode.

use std::net::SocketAddr;

use proptest::collection::vec;
use proptest::prelude::*;
use ringsock_proto::*;

/// Strings of at most `max` bytes (a char is at most 4 bytes).
fn text(max: usize) -> impl Strategy<Value = String> {
    vec(any::<char>(), 0..=max / 4).prop_map(|c| c.into_iter().collect())
}

fn bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    vec(any::<u8>(), 0..=max)
}

fn addr() -> impl Strategy<Value = SocketAddr> {
    any::<SocketAddr>()
}

fn transport() -> impl Strategy<Value = Transport> {
    prop_oneof![
        Just(Transport::Shm),
        Just(Transport::Rdma),
        Just(Transport::Tcp)
    ]
}

fn cursor() -> impl Strategy<Value = Option<StatusCursor>> {
    proptest::option::of(
        (any::<u64>(), any::<i32>()).prop_map(|(session, fd)| StatusCursor { session, fd }),
    )
}

/// An entry as `StatusReply` carries it (no name); `StatusNamedReply`
/// entries get one in `reply()`.
fn entry() -> impl Strategy<Value = StatusEntry> {
    (
        (any::<u64>(), any::<u32>(), any::<u32>(), text(MAX_EXE)),
        (any::<i32>(), addr(), addr(), transport()),
        (text(MAX_REASON), any::<Option<u64>>()),
        vec(
            (text(MAX_STAT_NAME), any::<u64>()).prop_map(|(name, value)| RingStat { name, value }),
            0..=MAX_RING_STATS,
        ),
    )
        .prop_map(
            |(
                (session, pid, uid, exe),
                (fd, local, peer, transport),
                (reason, ring),
                ring_stats,
            )| {
                StatusEntry {
                    session,
                    pid,
                    uid,
                    exe,
                    name: String::new(),
                    fd,
                    local,
                    peer,
                    transport,
                    reason,
                    ring,
                    ring_stats,
                }
            },
        )
}

fn request() -> impl Strategy<Value = Msg> {
    prop_oneof![
        (any::<u32>(), text(MAX_EXE)).prop_map(|(pid, exe)| Msg::Hello { pid, exe }),
        addr().prop_map(|addr| Msg::ListenerAdd { addr }),
        addr().prop_map(|addr| Msg::ListenerRemove { addr }),
        (addr(), addr(), bytes(MAX_PAYLOAD)).prop_map(|(client, server, payload)| Msg::Offer {
            client,
            server,
            payload
        }),
        Just(Msg::Claim),
        (any::<u64>(), bytes(MAX_PAYLOAD))
            .prop_map(|(offer_id, payload)| Msg::Answer { offer_id, payload }),
        (any::<u64>(), text(MAX_REASON))
            .prop_map(|(offer_id, reason)| Msg::Decline { offer_id, reason }),
        any::<u64>().prop_map(|offer_id| Msg::Collect { offer_id }),
        any::<u64>().prop_map(|offer_id| Msg::Cancel { offer_id }),
        (
            any::<i32>(),
            addr(),
            addr(),
            transport(),
            text(MAX_REASON),
            any::<Option<u64>>()
        )
            .prop_map(
                |(fd, local, peer, transport, reason, ring)| Msg::ConnReport {
                    fd,
                    local,
                    peer,
                    transport,
                    reason,
                    ring
                }
            ),
        (any::<i32>(), addr(), addr()).prop_map(|(fd, local, peer)| Msg::ConnClosed {
            fd,
            local,
            peer
        }),
        cursor().prop_map(|after| Msg::Status { after }),
        cursor().prop_map(|after| Msg::StatusAll { after }),
        cursor().prop_map(|after| Msg::StatusNamed { after }),
        Just(Msg::Metrics),
    ]
}

fn reply() -> impl Strategy<Value = Msg> {
    let code = prop_oneof![
        Just(ErrorCode::BadRequest),
        Just(ErrorCode::NotFound),
        Just(ErrorCode::NotOwner),
        Just(ErrorCode::BadProof),
        Just(ErrorCode::Limit),
        Just(ErrorCode::BadState),
    ];
    let refuse = prop_oneof![
        Just(RefuseReason::NoListener),
        Just(RefuseReason::Duplicate),
        Just(RefuseReason::TooMany),
        Just(RefuseReason::Invalid),
    ];
    prop_oneof![
        (text(MAX_VERSION), any::<u64>()).prop_map(|(daemon_version, host_id)| Msg::HelloOk {
            daemon_version,
            host_id
        }),
        Just(Msg::Ok),
        (code, text(MAX_ERROR_TEXT)).prop_map(|(code, text)| Msg::Error { code, text }),
        any::<u64>().prop_map(|offer_id| Msg::OfferOk { offer_id }),
        refuse.prop_map(|reason| Msg::OfferRefused { reason }),
        (any::<u64>(), any::<u32>(), bytes(MAX_PAYLOAD)).prop_map(
            |(offer_id, client_pid, payload)| Msg::ClaimOk {
                offer_id,
                client_pid,
                payload
            }
        ),
        Just(Msg::NoOffer),
        Just(Msg::Pending),
        bytes(MAX_PAYLOAD).prop_map(|payload| Msg::Answered { payload }),
        text(MAX_REASON).prop_map(|reason| Msg::Declined { reason }),
        Just(Msg::Expired),
        (vec(entry(), 0..=4), cursor())
            .prop_map(|(entries, next)| Msg::StatusReply { entries, next }),
        (vec((entry(), text(MAX_PROCESS_NAME)), 0..=4), cursor()).prop_map(|(named, next)| {
            let entries = named
                .into_iter()
                .map(|(e, name)| StatusEntry { name, ..e })
                .collect();
            Msg::StatusNamedReply { entries, next }
        }),
        text(MAX_METRICS_TEXT).prop_map(|text| Msg::MetricsReply { text }),
    ]
}

fn peer() -> impl Strategy<Value = Msg> {
    let refuse = prop_oneof![
        Just(RefuseReason::NoListener),
        Just(RefuseReason::Duplicate),
        Just(RefuseReason::TooMany),
        Just(RefuseReason::Invalid),
    ];
    prop_oneof![
        (any::<u64>(), addr(), addr(), bytes(MAX_PAYLOAD)).prop_map(
            |(offer_ref, client, server, payload)| Msg::RemoteOffer {
                offer_ref,
                client,
                server,
                payload
            }
        ),
        any::<u64>().prop_map(|offer_ref| Msg::RemoteCancel { offer_ref }),
        (any::<u64>(), any::<u32>()).prop_map(|(offer_ref, expires_ms)| Msg::RemoteOfferOk {
            offer_ref,
            expires_ms
        }),
        (any::<u64>(), refuse)
            .prop_map(|(offer_ref, reason)| Msg::RemoteRefused { offer_ref, reason }),
        (any::<u64>(), any::<u32>()).prop_map(|(offer_ref, expires_ms)| Msg::RemoteClaimed {
            offer_ref,
            expires_ms
        }),
        (any::<u64>(), bytes(MAX_PAYLOAD))
            .prop_map(|(offer_ref, payload)| Msg::RemoteAnswer { offer_ref, payload }),
        (any::<u64>(), text(MAX_REASON))
            .prop_map(|(offer_ref, reason)| Msg::RemoteDecline { offer_ref, reason }),
        any::<u64>().prop_map(|offer_ref| Msg::RemoteExpired { offer_ref }),
    ]
}

fn message() -> impl Strategy<Value = Msg> {
    prop_oneof![request(), reply(), peer()]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn decode_arbitrary_bytes_never_panics(data in bytes(512)) {
        let _ = decode(&data);
        let _ = frame_len(&data);
    }

    /// Arbitrary bodies behind a valid header reach every body decoder.
    #[test]
    fn decode_arbitrary_bodies_never_panics(kind_no in 0u16..0x10, reply_bit in any::<bool>(), peer_bit in any::<bool>(), body in bytes(600)) {
        let kind_no = kind_no | if reply_bit { 0x8000 } else { 0 } | if peer_bit { 0x4000 } else { 0 };
        let mut f = Vec::new();
        f.extend_from_slice(&((body.len() + 4) as u32).to_le_bytes());
        f.extend_from_slice(&PROTO_VERSION.to_le_bytes());
        f.extend_from_slice(&kind_no.to_le_bytes());
        f.extend_from_slice(&body);
        let _ = decode(&f);
    }

    #[test]
    fn encode_decode_round_trip(m in message()) {
        let bytes = encode(&m).unwrap();
        prop_assert!(bytes.len() <= MAX_FRAME_TOTAL);
        prop_assert_eq!(frame_len(&bytes).unwrap(), Some(bytes.len()));
        prop_assert_eq!(decode(&bytes).unwrap(), m);
    }

    /// Flipping any single byte of a valid frame yields an error or some
    /// valid message, never a panic.
    #[test]
    fn mutated_frames_never_panic(m in message(), pos in any::<usize>(), val in any::<u8>()) {
        let mut bytes = encode(&m).unwrap();
        let i = pos % bytes.len();
        bytes[i] = val;
        let _ = decode(&bytes);
    }
}
