//! The messages of protocol version 1 and their body encoding.
//!
//! Every request from a process gets exactly one reply from the daemon, in
//! order, so a client never has to match replies to requests. Requests use
//! kinds `0x0001..`, replies `0x8001..`; a daemon that receives a reply kind
//! (or a process that receives a request kind) is talking to a confused peer.
//!
//! Between hosts, ctl daemons speak the same framing over TCP with their own
//! kinds (`0x4001..` from the connecting ctl, `0xc001..` from the accepting
//! one, see [`kind::PEER_BIT`]); those never appear on the local socket.

use std::net::SocketAddr;

use crate::codec::{Decoder, Encoder};
use crate::{ProtoError, MAX_FDS};

/// Longest executable path carried by `Hello`.
pub const MAX_EXE: usize = 256;
/// Largest opaque payload of an offer or an answer (ring parameters, QPN...).
pub const MAX_PAYLOAD: usize = 4096;
/// Longest human-readable reason (decline reason, connection report reason).
pub const MAX_REASON: usize = 128;
/// Longest error text in `Error`.
pub const MAX_ERROR_TEXT: usize = 256;
/// Longest daemon version string in `HelloOk`.
pub const MAX_VERSION: usize = 64;
/// Most entries in one `StatusReply` page. With every field at its limit a
/// page still fits in a frame (checked by a unit test).
pub const MAX_STATUS_PAGE: usize = 32;
/// Most counters a ring-stats provider may attach to one status entry (a
/// `StatusReply` carrying more is refused by the decoder). With every
/// field at its limit a full page still fits in a frame (unit test).
pub const MAX_RING_STATS: usize = 32;
/// Most counters per entry in a reply to the original `Status` request:
/// the limit of CLIs built before `StatusAll`, whose decoder refuses a
/// longer list. The daemon cuts what it sends to that request to this.
pub const MAX_RING_STATS_V1: usize = 16;
/// Longest counter name.
pub const MAX_STAT_NAME: usize = 32;
/// Longest process name in a `StatusNamedReply` entry: the kernel's comm
/// is at most 15 bytes.
pub const MAX_PROCESS_NAME: usize = 16;
/// Longest metrics text in `MetricsReply`: what fits in one frame with room
/// to spare. The daemon bounds its label sets so its text stays below.
pub const MAX_METRICS_TEXT: usize = 60 * 1024;

/// How a reported connection carries its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    /// Same-host shared-memory ring.
    Shm,
    /// RDMA ring.
    Rdma,
    /// Plain kernel TCP (fallback); the report's reason says why.
    Tcp,
}

impl Transport {
    pub fn as_str(self) -> &'static str {
        match self {
            Transport::Shm => "shm",
            Transport::Rdma => "rdma",
            Transport::Tcp => "tcp",
        }
    }

    /// The transport `as_str` names (`shm`, `rdma`, `tcp`).
    pub fn from_name(name: &str) -> Option<Self> {
        [Transport::Shm, Transport::Rdma, Transport::Tcp]
            .into_iter()
            .find(|t| t.as_str() == name)
    }

    fn code(self) -> u8 {
        match self {
            Transport::Shm => 1,
            Transport::Rdma => 2,
            Transport::Tcp => 3,
        }
    }

    fn from_code(v: u8) -> Result<Self, ProtoError> {
        match v {
            1 => Ok(Transport::Shm),
            2 => Ok(Transport::Rdma),
            3 => Ok(Transport::Tcp),
            _ => Err(ProtoError::BadValue {
                field: "transport",
                value: u64::from(v),
            }),
        }
    }
}

/// Why an offer was not registered; the client then stays on plain TCP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RefuseReason {
    /// No shimmed listener for the server address on this host.
    NoListener,
    /// An offer for the same 4-tuple is already open.
    Duplicate,
    /// The session (or the daemon) holds too many offers or descriptors.
    TooMany,
    /// Malformed offer or failed ownership proof.
    Invalid,
}

impl RefuseReason {
    pub fn as_str(self) -> &'static str {
        match self {
            RefuseReason::NoListener => "no-listener",
            RefuseReason::Duplicate => "duplicate",
            RefuseReason::TooMany => "too-many",
            RefuseReason::Invalid => "invalid",
        }
    }

    fn code(self) -> u8 {
        match self {
            RefuseReason::NoListener => 1,
            RefuseReason::Duplicate => 2,
            RefuseReason::TooMany => 3,
            RefuseReason::Invalid => 4,
        }
    }

    fn from_code(v: u8) -> Result<Self, ProtoError> {
        match v {
            1 => Ok(RefuseReason::NoListener),
            2 => Ok(RefuseReason::Duplicate),
            3 => Ok(RefuseReason::TooMany),
            4 => Ok(RefuseReason::Invalid),
            _ => Err(ProtoError::BadValue {
                field: "refuse_reason",
                value: u64::from(v),
            }),
        }
    }
}

/// Class of a failed request, for programs; the text is for humans.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// The request is well-formed but makes no sense (bad address...).
    BadRequest,
    /// No such offer, listener or report (or not visible to this session).
    NotFound,
    /// The object exists but belongs to another session.
    NotOwner,
    /// The passed descriptor does not prove what the request claims.
    BadProof,
    /// A per-session or daemon-wide limit was reached.
    Limit,
    /// The object is not in a state that allows this request.
    BadState,
}

impl ErrorCode {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::BadRequest => "bad-request",
            ErrorCode::NotFound => "not-found",
            ErrorCode::NotOwner => "not-owner",
            ErrorCode::BadProof => "bad-proof",
            ErrorCode::Limit => "limit",
            ErrorCode::BadState => "bad-state",
        }
    }

    fn code(self) -> u16 {
        match self {
            ErrorCode::BadRequest => 1,
            ErrorCode::NotFound => 2,
            ErrorCode::NotOwner => 3,
            ErrorCode::BadProof => 4,
            ErrorCode::Limit => 5,
            ErrorCode::BadState => 6,
        }
    }

    fn from_code(v: u16) -> Result<Self, ProtoError> {
        match v {
            1 => Ok(ErrorCode::BadRequest),
            2 => Ok(ErrorCode::NotFound),
            3 => Ok(ErrorCode::NotOwner),
            4 => Ok(ErrorCode::BadProof),
            5 => Ok(ErrorCode::Limit),
            6 => Ok(ErrorCode::BadState),
            _ => Err(ProtoError::BadValue {
                field: "error_code",
                value: u64::from(v),
            }),
        }
    }
}

/// Position in the status listing: entries are ordered by (session, fd) and
/// a page continues strictly after its cursor, so paging stays correct while
/// connections come and go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StatusCursor {
    pub session: u64,
    pub fd: i32,
}

/// One named counter read from a ring by the daemon's stats provider.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RingStat {
    pub name: String,
    pub value: u64,
}

/// One live connection as reported by a shimmed process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusEntry {
    /// Daemon-local session number of the reporting process.
    pub session: u64,
    /// From SO_PEERCRED, not from what the process claims.
    pub pid: u32,
    pub uid: u32,
    /// From `Hello` (informative only).
    pub exe: String,
    /// What `ps` calls the process (its /proc/PID/comm, which a symlink it
    /// was started through names), read by the daemon as it answers; empty
    /// in replies to `Status` and `StatusAll`, and when it cannot be read.
    pub name: String,
    pub fd: i32,
    pub local: SocketAddr,
    pub peer: SocketAddr,
    pub transport: Transport,
    pub reason: String,
    /// Offer id or ring handle, when the connection has a ring.
    pub ring: Option<u64>,
    /// Counters of the ring, read by the daemon (empty without a ring fd).
    pub ring_stats: Vec<RingStat>,
}

/// A protocol message. Descriptor arity per kind is given by
/// [`Msg::fd_range`]; the descriptors travel beside the bytes (SCM_RIGHTS).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Msg {
    // ---- requests (process -> daemon) ----
    /// First message of every session.
    Hello {
        pid: u32,
        exe: String,
    },
    /// fds[0]: the listening socket, as proof; the daemon closes it at once.
    ListenerAdd {
        addr: SocketAddr,
    },
    ListenerRemove {
        addr: SocketAddr,
    },
    /// fds[0]: the client's TCP socket (proof of `client`); fds[1..]: opaque
    /// descriptors relayed to the claimer.
    Offer {
        client: SocketAddr,
        server: SocketAddr,
        payload: Vec<u8>,
    },
    /// fds[0]: the accepted TCP socket; the daemon reads its 4-tuple.
    Claim,
    /// By the claimer; fds: opaque descriptors relayed to the offerer.
    Answer {
        offer_id: u64,
        payload: Vec<u8>,
    },
    /// By the claimer: the server side will not use the ring.
    Decline {
        offer_id: u64,
        reason: String,
    },
    /// By the offerer: what became of the offer?
    Collect {
        offer_id: u64,
    },
    /// By the offerer: withdraw (e.g. connect failed).
    Cancel {
        offer_id: u64,
    },
    /// fds: optionally the ring memfd, mapped read-only for counters.
    ConnReport {
        fd: i32,
        local: SocketAddr,
        peer: SocketAddr,
        transport: Transport,
        reason: String,
        ring: Option<u64>,
    },
    ConnClosed {
        fd: i32,
        local: SocketAddr,
        peer: SocketAddr,
    },
    /// One page of the connection listing, after `after` (None: from start),
    /// at most `MAX_RING_STATS_V1` counters per entry (what older CLIs
    /// decode).
    Status {
        after: Option<StatusCursor>,
    },
    /// As `Status`, with up to `MAX_RING_STATS` counters per entry. A
    /// request kind of its own, not a new protocol version: the frame
    /// version is shared with the shim and with peer ctls, which must keep
    /// working across builds. A daemon that predates it drops the session
    /// (unknown kind); the CLI then asks again with `Status`.
    StatusAll {
        after: Option<StatusCursor>,
    },
    /// As `StatusAll`, answered with `StatusNamedReply`, whose entries carry
    /// the process `name`. A kind of its own for the same reason; the CLI
    /// falls back to `StatusAll` when the daemon drops the session.
    StatusNamed {
        after: Option<StatusCursor>,
    },
    /// The daemon's counters, answered with `MetricsReply`. A kind of its
    /// own: a daemon that predates it drops the session.
    Metrics,

    // ---- replies (daemon -> process) ----
    HelloOk {
        daemon_version: String,
        host_id: u64,
    },
    Ok,
    Error {
        code: ErrorCode,
        text: String,
    },
    OfferOk {
        offer_id: u64,
    },
    OfferRefused {
        reason: RefuseReason,
    },
    /// fds: the offer's relayed descriptors.
    ClaimOk {
        offer_id: u64,
        client_pid: u32,
        payload: Vec<u8>,
    },
    NoOffer,
    Pending,
    /// fds: the answer's relayed descriptors.
    Answered {
        payload: Vec<u8>,
    },
    Declined {
        reason: String,
    },
    Expired,
    /// `next` is set when more entries follow: send `Status { after: next }`.
    StatusReply {
        entries: Vec<StatusEntry>,
        next: Option<StatusCursor>,
    },
    /// The reply to `StatusNamed`: as `StatusReply`, every entry with its
    /// `name`.
    StatusNamedReply {
        entries: Vec<StatusEntry>,
        next: Option<StatusCursor>,
    },
    /// The reply to `Metrics`: the Prometheus text exposition format
    /// (version 0.0.4), at most `MAX_METRICS_TEXT` bytes.
    MetricsReply {
        text: String,
    },

    // ---- ctl to ctl over TCP: from the connecting (offering) host ----
    /// An offer for a server on the accepting host. `offer_ref` is the
    /// origin's offer id; every later message about it carries it. The
    /// accepting ctl registers it only if `client`'s IP is the source
    /// address of the TCP connection that carried it.
    RemoteOffer {
        offer_ref: u64,
        client: SocketAddr,
        server: SocketAddr,
        payload: Vec<u8>,
    },
    /// The offering process withdrew (or its session ended, or it expired).
    RemoteCancel {
        offer_ref: u64,
    },

    // ---- ctl to ctl over TCP: from the accepting (server) host ----
    /// Registered; unclaimed it expires in `expires_ms`.
    RemoteOfferOk {
        offer_ref: u64,
        expires_ms: u32,
    },
    RemoteRefused {
        offer_ref: u64,
        reason: RefuseReason,
    },
    /// Claimed by the server process; unanswered it expires in `expires_ms`.
    RemoteClaimed {
        offer_ref: u64,
        expires_ms: u32,
    },
    RemoteAnswer {
        offer_ref: u64,
        payload: Vec<u8>,
    },
    RemoteDecline {
        offer_ref: u64,
        reason: String,
    },
    RemoteExpired {
        offer_ref: u64,
    },
}

/// Wire numbers of message kinds.
pub mod kind {
    pub const HELLO: u16 = 0x0001;
    pub const LISTENER_ADD: u16 = 0x0002;
    pub const LISTENER_REMOVE: u16 = 0x0003;
    pub const OFFER: u16 = 0x0004;
    pub const CLAIM: u16 = 0x0005;
    pub const ANSWER: u16 = 0x0006;
    pub const DECLINE: u16 = 0x0007;
    pub const COLLECT: u16 = 0x0008;
    pub const CANCEL: u16 = 0x0009;
    pub const CONN_REPORT: u16 = 0x000a;
    pub const CONN_CLOSED: u16 = 0x000b;
    pub const STATUS: u16 = 0x000c;
    pub const STATUS_ALL: u16 = 0x000d;
    pub const STATUS_NAMED: u16 = 0x000e;
    pub const METRICS: u16 = 0x000f;

    pub const HELLO_OK: u16 = 0x8001;
    pub const OK: u16 = 0x8002;
    pub const ERROR: u16 = 0x8003;
    pub const OFFER_OK: u16 = 0x8004;
    pub const OFFER_REFUSED: u16 = 0x8005;
    pub const CLAIM_OK: u16 = 0x8006;
    pub const NO_OFFER: u16 = 0x8007;
    pub const PENDING: u16 = 0x8008;
    pub const ANSWERED: u16 = 0x8009;
    pub const DECLINED: u16 = 0x800a;
    pub const EXPIRED: u16 = 0x800b;
    pub const STATUS_REPLY: u16 = 0x800c;
    pub const STATUS_NAMED_REPLY: u16 = 0x800d;
    pub const METRICS_REPLY: u16 = 0x800e;

    pub const REMOTE_OFFER: u16 = 0x4001;
    pub const REMOTE_CANCEL: u16 = 0x4002;

    pub const REMOTE_OFFER_OK: u16 = 0xc001;
    pub const REMOTE_REFUSED: u16 = 0xc002;
    pub const REMOTE_CLAIMED: u16 = 0xc003;
    pub const REMOTE_ANSWER: u16 = 0xc004;
    pub const REMOTE_DECLINE: u16 = 0xc005;
    pub const REMOTE_EXPIRED: u16 = 0xc006;

    /// Replies have the high bit set.
    pub const REPLY_BIT: u16 = 0x8000;
    /// ctl-to-ctl messages (TCP between hosts) have this bit set; with the
    /// reply bit they travel from the accepting ctl to the connecting one.
    pub const PEER_BIT: u16 = 0x4000;
}

impl Msg {
    /// The wire kind number.
    pub fn kind(&self) -> u16 {
        use kind::*;
        match self {
            Msg::Hello { .. } => HELLO,
            Msg::ListenerAdd { .. } => LISTENER_ADD,
            Msg::ListenerRemove { .. } => LISTENER_REMOVE,
            Msg::Offer { .. } => OFFER,
            Msg::Claim => CLAIM,
            Msg::Answer { .. } => ANSWER,
            Msg::Decline { .. } => DECLINE,
            Msg::Collect { .. } => COLLECT,
            Msg::Cancel { .. } => CANCEL,
            Msg::ConnReport { .. } => CONN_REPORT,
            Msg::ConnClosed { .. } => CONN_CLOSED,
            Msg::Status { .. } => STATUS,
            Msg::StatusAll { .. } => STATUS_ALL,
            Msg::StatusNamed { .. } => STATUS_NAMED,
            Msg::Metrics => METRICS,
            Msg::HelloOk { .. } => HELLO_OK,
            Msg::Ok => OK,
            Msg::Error { .. } => ERROR,
            Msg::OfferOk { .. } => OFFER_OK,
            Msg::OfferRefused { .. } => OFFER_REFUSED,
            Msg::ClaimOk { .. } => CLAIM_OK,
            Msg::NoOffer => NO_OFFER,
            Msg::Pending => PENDING,
            Msg::Answered { .. } => ANSWERED,
            Msg::Declined { .. } => DECLINED,
            Msg::Expired => EXPIRED,
            Msg::StatusReply { .. } => STATUS_REPLY,
            Msg::StatusNamedReply { .. } => STATUS_NAMED_REPLY,
            Msg::MetricsReply { .. } => METRICS_REPLY,
            Msg::RemoteOffer { .. } => REMOTE_OFFER,
            Msg::RemoteCancel { .. } => REMOTE_CANCEL,
            Msg::RemoteOfferOk { .. } => REMOTE_OFFER_OK,
            Msg::RemoteRefused { .. } => REMOTE_REFUSED,
            Msg::RemoteClaimed { .. } => REMOTE_CLAIMED,
            Msg::RemoteAnswer { .. } => REMOTE_ANSWER,
            Msg::RemoteDecline { .. } => REMOTE_DECLINE,
            Msg::RemoteExpired { .. } => REMOTE_EXPIRED,
        }
    }

    /// Name for logs and errors.
    pub fn name(&self) -> &'static str {
        kind_name(self.kind())
    }

    /// True for messages a process sends to the daemon.
    pub fn is_request(&self) -> bool {
        self.kind() & (kind::REPLY_BIT | kind::PEER_BIT) == 0
    }

    /// True for messages the daemon sends to a process.
    pub fn is_reply(&self) -> bool {
        self.kind() & (kind::REPLY_BIT | kind::PEER_BIT) == kind::REPLY_BIT
    }

    /// True for ctl-to-ctl messages (TCP between hosts).
    pub fn is_peer(&self) -> bool {
        self.kind() & kind::PEER_BIT != 0
    }

    /// True for ctl-to-ctl messages the connecting ctl sends (the accepting
    /// one sends the others).
    pub fn is_peer_request(&self) -> bool {
        self.kind() & (kind::REPLY_BIT | kind::PEER_BIT) == kind::PEER_BIT
    }

    /// How many descriptors this kind of message must carry (inclusive).
    pub fn fd_range(&self) -> (usize, usize) {
        fd_range(self.kind())
    }

    /// Checks the number of descriptors that arrived with this message.
    pub fn check_fds(&self, got: usize) -> Result<(), ProtoError> {
        let (min, max) = self.fd_range();
        if got < min || got > max {
            return Err(ProtoError::FdCount {
                kind: self.name(),
                got,
                min,
                max,
            });
        }
        Ok(())
    }

    /// Appends the body (everything after the kind field).
    pub(crate) fn encode_body(&self, e: &mut Encoder<'_>) -> Result<(), ProtoError> {
        match self {
            Msg::Hello { pid, exe } => {
                e.u32(*pid);
                e.string("exe", exe, MAX_EXE)?;
            }
            Msg::ListenerAdd { addr } | Msg::ListenerRemove { addr } => e.addr(addr),
            Msg::Offer {
                client,
                server,
                payload,
            } => {
                e.addr(client);
                e.addr(server);
                e.bytes("payload", payload, MAX_PAYLOAD)?;
            }
            Msg::Claim | Msg::Ok | Msg::NoOffer | Msg::Pending | Msg::Expired | Msg::Metrics => {}
            Msg::MetricsReply { text } => e.string("text", text, MAX_METRICS_TEXT)?,
            Msg::Answer { offer_id, payload } => {
                e.u64(*offer_id);
                e.bytes("payload", payload, MAX_PAYLOAD)?;
            }
            Msg::Decline { offer_id, reason } => {
                e.u64(*offer_id);
                e.string("reason", reason, MAX_REASON)?;
            }
            Msg::Collect { offer_id } | Msg::Cancel { offer_id } | Msg::OfferOk { offer_id } => {
                e.u64(*offer_id)
            }
            Msg::ConnReport {
                fd,
                local,
                peer,
                transport,
                reason,
                ring,
            } => {
                e.i32(*fd);
                e.addr(local);
                e.addr(peer);
                e.u8(transport.code());
                e.string("reason", reason, MAX_REASON)?;
                e.opt_u64(*ring);
            }
            Msg::ConnClosed { fd, local, peer } => {
                e.i32(*fd);
                e.addr(local);
                e.addr(peer);
            }
            Msg::Status { after } | Msg::StatusAll { after } | Msg::StatusNamed { after } => {
                encode_cursor(e, after)
            }
            Msg::HelloOk {
                daemon_version,
                host_id,
            } => {
                e.string("daemon_version", daemon_version, MAX_VERSION)?;
                e.u64(*host_id);
            }
            Msg::Error { code, text } => {
                e.u16(code.code());
                e.string("text", text, MAX_ERROR_TEXT)?;
            }
            Msg::OfferRefused { reason } => e.u8(reason.code()),
            Msg::ClaimOk {
                offer_id,
                client_pid,
                payload,
            } => {
                e.u64(*offer_id);
                e.u32(*client_pid);
                e.bytes("payload", payload, MAX_PAYLOAD)?;
            }
            Msg::Answered { payload } => e.bytes("payload", payload, MAX_PAYLOAD)?,
            Msg::Declined { reason } => e.string("reason", reason, MAX_REASON)?,
            Msg::StatusReply { entries, next } | Msg::StatusNamedReply { entries, next } => {
                let named = matches!(self, Msg::StatusNamedReply { .. });
                if entries.len() > MAX_STATUS_PAGE {
                    return Err(ProtoError::FieldTooLong {
                        field: "entries",
                        len: entries.len(),
                        max: MAX_STATUS_PAGE,
                    });
                }
                // Bounded by MAX_STATUS_PAGE above.
                e.u16(entries.len() as u16);
                for entry in entries {
                    encode_entry(e, entry, named)?;
                }
                encode_cursor(e, next);
            }
            Msg::RemoteOffer {
                offer_ref,
                client,
                server,
                payload,
            } => {
                e.u64(*offer_ref);
                e.addr(client);
                e.addr(server);
                e.bytes("payload", payload, MAX_PAYLOAD)?;
            }
            Msg::RemoteCancel { offer_ref } | Msg::RemoteExpired { offer_ref } => e.u64(*offer_ref),
            Msg::RemoteOfferOk {
                offer_ref,
                expires_ms,
            }
            | Msg::RemoteClaimed {
                offer_ref,
                expires_ms,
            } => {
                e.u64(*offer_ref);
                e.u32(*expires_ms);
            }
            Msg::RemoteRefused { offer_ref, reason } => {
                e.u64(*offer_ref);
                e.u8(reason.code());
            }
            Msg::RemoteAnswer { offer_ref, payload } => {
                e.u64(*offer_ref);
                e.bytes("payload", payload, MAX_PAYLOAD)?;
            }
            Msg::RemoteDecline { offer_ref, reason } => {
                e.u64(*offer_ref);
                e.string("reason", reason, MAX_REASON)?;
            }
        }
        Ok(())
    }

    /// Decodes the body of a message of kind `kind`; the whole body must be
    /// consumed.
    pub(crate) fn decode_body(kind: u16, body: &[u8]) -> Result<Msg, ProtoError> {
        let mut d = Decoder::new(body);
        let msg = match kind {
            kind::HELLO => Msg::Hello {
                pid: d.u32("pid")?,
                exe: d.string("exe", MAX_EXE)?,
            },
            kind::LISTENER_ADD => Msg::ListenerAdd {
                addr: d.addr("addr")?,
            },
            kind::LISTENER_REMOVE => Msg::ListenerRemove {
                addr: d.addr("addr")?,
            },
            kind::OFFER => Msg::Offer {
                client: d.addr("client")?,
                server: d.addr("server")?,
                payload: d.byte_vec("payload", MAX_PAYLOAD)?,
            },
            kind::CLAIM => Msg::Claim,
            kind::ANSWER => Msg::Answer {
                offer_id: d.u64("offer_id")?,
                payload: d.byte_vec("payload", MAX_PAYLOAD)?,
            },
            kind::DECLINE => Msg::Decline {
                offer_id: d.u64("offer_id")?,
                reason: d.string("reason", MAX_REASON)?,
            },
            kind::COLLECT => Msg::Collect {
                offer_id: d.u64("offer_id")?,
            },
            kind::CANCEL => Msg::Cancel {
                offer_id: d.u64("offer_id")?,
            },
            kind::CONN_REPORT => Msg::ConnReport {
                fd: d.i32("fd")?,
                local: d.addr("local")?,
                peer: d.addr("peer")?,
                transport: Transport::from_code(d.u8("transport")?)?,
                reason: d.string("reason", MAX_REASON)?,
                ring: d.opt_u64("ring")?,
            },
            kind::CONN_CLOSED => Msg::ConnClosed {
                fd: d.i32("fd")?,
                local: d.addr("local")?,
                peer: d.addr("peer")?,
            },
            kind::STATUS => Msg::Status {
                after: decode_cursor(&mut d)?,
            },
            kind::STATUS_ALL => Msg::StatusAll {
                after: decode_cursor(&mut d)?,
            },
            kind::STATUS_NAMED => Msg::StatusNamed {
                after: decode_cursor(&mut d)?,
            },
            kind::METRICS => Msg::Metrics,
            kind::METRICS_REPLY => Msg::MetricsReply {
                text: d.string("text", MAX_METRICS_TEXT)?,
            },
            kind::HELLO_OK => Msg::HelloOk {
                daemon_version: d.string("daemon_version", MAX_VERSION)?,
                host_id: d.u64("host_id")?,
            },
            kind::OK => Msg::Ok,
            kind::ERROR => Msg::Error {
                code: ErrorCode::from_code(d.u16("code")?)?,
                text: d.string("text", MAX_ERROR_TEXT)?,
            },
            kind::OFFER_OK => Msg::OfferOk {
                offer_id: d.u64("offer_id")?,
            },
            kind::OFFER_REFUSED => Msg::OfferRefused {
                reason: RefuseReason::from_code(d.u8("reason")?)?,
            },
            kind::CLAIM_OK => Msg::ClaimOk {
                offer_id: d.u64("offer_id")?,
                client_pid: d.u32("client_pid")?,
                payload: d.byte_vec("payload", MAX_PAYLOAD)?,
            },
            kind::NO_OFFER => Msg::NoOffer,
            kind::PENDING => Msg::Pending,
            kind::ANSWERED => Msg::Answered {
                payload: d.byte_vec("payload", MAX_PAYLOAD)?,
            },
            kind::DECLINED => Msg::Declined {
                reason: d.string("reason", MAX_REASON)?,
            },
            kind::EXPIRED => Msg::Expired,
            kind::STATUS_REPLY | kind::STATUS_NAMED_REPLY => {
                let named = kind == kind::STATUS_NAMED_REPLY;
                let n = d.count("entries", MAX_STATUS_PAGE, MIN_ENTRY_SIZE)?;
                let mut entries = Vec::with_capacity(n);
                for _ in 0..n {
                    entries.push(decode_entry(&mut d, named)?);
                }
                let next = decode_cursor(&mut d)?;
                if named {
                    Msg::StatusNamedReply { entries, next }
                } else {
                    Msg::StatusReply { entries, next }
                }
            }
            kind::REMOTE_OFFER => Msg::RemoteOffer {
                offer_ref: d.u64("offer_ref")?,
                client: d.addr("client")?,
                server: d.addr("server")?,
                payload: d.byte_vec("payload", MAX_PAYLOAD)?,
            },
            kind::REMOTE_CANCEL => Msg::RemoteCancel {
                offer_ref: d.u64("offer_ref")?,
            },
            kind::REMOTE_OFFER_OK => Msg::RemoteOfferOk {
                offer_ref: d.u64("offer_ref")?,
                expires_ms: d.u32("expires_ms")?,
            },
            kind::REMOTE_REFUSED => Msg::RemoteRefused {
                offer_ref: d.u64("offer_ref")?,
                reason: RefuseReason::from_code(d.u8("reason")?)?,
            },
            kind::REMOTE_CLAIMED => Msg::RemoteClaimed {
                offer_ref: d.u64("offer_ref")?,
                expires_ms: d.u32("expires_ms")?,
            },
            kind::REMOTE_ANSWER => Msg::RemoteAnswer {
                offer_ref: d.u64("offer_ref")?,
                payload: d.byte_vec("payload", MAX_PAYLOAD)?,
            },
            kind::REMOTE_DECLINE => Msg::RemoteDecline {
                offer_ref: d.u64("offer_ref")?,
                reason: d.string("reason", MAX_REASON)?,
            },
            kind::REMOTE_EXPIRED => Msg::RemoteExpired {
                offer_ref: d.u64("offer_ref")?,
            },
            other => return Err(ProtoError::UnknownKind { kind: other }),
        };
        d.finish(msg.name())?;
        Ok(msg)
    }
}

/// Name of a kind number ("unknown" for numbers this version lacks).
pub fn kind_name(k: u16) -> &'static str {
    use kind::*;
    match k {
        HELLO => "Hello",
        LISTENER_ADD => "ListenerAdd",
        LISTENER_REMOVE => "ListenerRemove",
        OFFER => "Offer",
        CLAIM => "Claim",
        ANSWER => "Answer",
        DECLINE => "Decline",
        COLLECT => "Collect",
        CANCEL => "Cancel",
        CONN_REPORT => "ConnReport",
        CONN_CLOSED => "ConnClosed",
        STATUS => "Status",
        STATUS_ALL => "StatusAll",
        STATUS_NAMED => "StatusNamed",
        METRICS => "Metrics",
        HELLO_OK => "HelloOk",
        OK => "Ok",
        ERROR => "Error",
        OFFER_OK => "OfferOk",
        OFFER_REFUSED => "OfferRefused",
        CLAIM_OK => "ClaimOk",
        NO_OFFER => "NoOffer",
        PENDING => "Pending",
        ANSWERED => "Answered",
        DECLINED => "Declined",
        EXPIRED => "Expired",
        STATUS_REPLY => "StatusReply",
        STATUS_NAMED_REPLY => "StatusNamedReply",
        METRICS_REPLY => "MetricsReply",
        REMOTE_OFFER => "RemoteOffer",
        REMOTE_CANCEL => "RemoteCancel",
        REMOTE_OFFER_OK => "RemoteOfferOk",
        REMOTE_REFUSED => "RemoteRefused",
        REMOTE_CLAIMED => "RemoteClaimed",
        REMOTE_ANSWER => "RemoteAnswer",
        REMOTE_DECLINE => "RemoteDecline",
        REMOTE_EXPIRED => "RemoteExpired",
        _ => "unknown",
    }
}

/// Descriptor arity of a kind (inclusive range). Proof descriptors are
/// exactly one; relayed sets leave room for the proof within MAX_FDS.
pub fn fd_range(k: u16) -> (usize, usize) {
    use kind::*;
    match k {
        LISTENER_ADD | CLAIM => (1, 1),
        OFFER => (1, MAX_FDS),
        CLAIM_OK => (0, MAX_FDS - 1),
        ANSWER | ANSWERED => (0, MAX_FDS),
        CONN_REPORT | HELLO_OK => (0, 1),
        _ => (0, 0),
    }
}

/// Smallest possible encoded status entry (empty strings, v4 addresses, no
/// ring): bounds the preallocation when decoding a page.
const MIN_ENTRY_SIZE: usize = 8 + 4 + 4 + 4 + 4 + 7 + 7 + 1 + 4 + 1 + 2;

fn encode_cursor(e: &mut Encoder<'_>, c: &Option<StatusCursor>) {
    match c {
        None => e.u8(0),
        Some(c) => {
            e.u8(1);
            e.u64(c.session);
            e.i32(c.fd);
        }
    }
}

fn decode_cursor(d: &mut Decoder<'_>) -> Result<Option<StatusCursor>, ProtoError> {
    match d.u8("cursor")? {
        0 => Ok(None),
        1 => Ok(Some(StatusCursor {
            session: d.u64("cursor")?,
            fd: d.i32("cursor")?,
        })),
        other => Err(ProtoError::BadValue {
            field: "cursor",
            value: u64::from(other),
        }),
    }
}

/// One entry; `named`: with the process name after the exe (the
/// `StatusNamedReply` layout).
fn encode_entry(e: &mut Encoder<'_>, s: &StatusEntry, named: bool) -> Result<(), ProtoError> {
    e.u64(s.session);
    e.u32(s.pid);
    e.u32(s.uid);
    e.string("exe", &s.exe, MAX_EXE)?;
    if named {
        e.string("name", &s.name, MAX_PROCESS_NAME)?;
    }
    e.i32(s.fd);
    e.addr(&s.local);
    e.addr(&s.peer);
    e.u8(s.transport.code());
    e.string("reason", &s.reason, MAX_REASON)?;
    e.opt_u64(s.ring);
    if s.ring_stats.len() > MAX_RING_STATS {
        return Err(ProtoError::FieldTooLong {
            field: "ring_stats",
            len: s.ring_stats.len(),
            max: MAX_RING_STATS,
        });
    }
    // Bounded by MAX_RING_STATS above.
    e.u16(s.ring_stats.len() as u16);
    for st in &s.ring_stats {
        e.string("stat_name", &st.name, MAX_STAT_NAME)?;
        e.u64(st.value);
    }
    Ok(())
}

fn decode_entry(d: &mut Decoder<'_>, named: bool) -> Result<StatusEntry, ProtoError> {
    let session = d.u64("session")?;
    let pid = d.u32("pid")?;
    let uid = d.u32("uid")?;
    let exe = d.string("exe", MAX_EXE)?;
    let name = if named {
        d.string("name", MAX_PROCESS_NAME)?
    } else {
        String::new()
    };
    let fd = d.i32("fd")?;
    let local = d.addr("local")?;
    let peer = d.addr("peer")?;
    let transport = Transport::from_code(d.u8("transport")?)?;
    let reason = d.string("reason", MAX_REASON)?;
    let ring = d.opt_u64("ring")?;
    let n = d.count("ring_stats", MAX_RING_STATS, 4 + 8)?;
    let mut ring_stats = Vec::with_capacity(n);
    for _ in 0..n {
        ring_stats.push(RingStat {
            name: d.string("stat_name", MAX_STAT_NAME)?,
            value: d.u64("stat_value")?,
        });
    }
    Ok(StatusEntry {
        session,
        pid,
        uid,
        exe,
        name,
        fd,
        local,
        peer,
        transport,
        reason,
        ring,
        ring_stats,
    })
}
