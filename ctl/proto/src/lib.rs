//! ringsock control protocol, shared by the `ringsock-ctl` daemon and the
//! LD_PRELOAD shim.
//!
//! A frame is `u32 LE length` (of what follows), `u16 version`, `u16 kind`,
//! then the body; at most [`MAX_FRAME`] bytes after the length. Frames travel
//! over an AF_UNIX SOCK_SEQPACKET socket, one frame per datagram, with up to
//! [`MAX_FDS`] descriptors attached (SCM_RIGHTS). See `ctl/README.md` for
//! the message semantics.
//!
//! Module map: [`codec`] field encoding, [`frame`] framing, [`msg`] the
//! messages, [`addr`] socket-address conversions, [`fds`] owned descriptor
//! sets, [`io`] every system call, [`client`] blocking request/reply,
//! [`offers`] the table of live offers a daemon shares with its processes.

pub mod addr;
pub mod client;
pub mod codec;
mod error;
pub mod fds;
pub mod frame;
pub mod io;
pub mod msg;
pub mod offers;

pub use client::{recv_msg, send_msg, Client};
pub use error::{Error, ProtoError};
pub use fds::Fds;
pub use frame::{decode, decode_with_fds, encode, encode_into, frame_len, MAX_FRAME_TOTAL};
pub use msg::{
    ErrorCode, Msg, RefuseReason, RingStat, StatusCursor, StatusEntry, Transport, MAX_ERROR_TEXT,
    MAX_EXE, MAX_METRICS_TEXT, MAX_PAYLOAD, MAX_PROCESS_NAME, MAX_REASON, MAX_RING_STATS,
    MAX_RING_STATS_V1, MAX_STATUS_PAGE, MAX_STAT_NAME, MAX_VERSION,
};

/// Protocol version carried in every frame header.
pub const PROTO_VERSION: u16 = 1;
/// Largest value of the length prefix (version + kind + body).
pub const MAX_FRAME: usize = 64 * 1024;
/// Most descriptors attached to one frame.
pub const MAX_FDS: usize = 8;
