//! Errors of the ring protocol and its transports.

use std::fmt;

/// What can go wrong on a ring. `Corrupt` is sticky: once a ring has seen
/// an impossible value it refuses all further traffic.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RingError {
    /// Nothing to read / no space to write right now.
    WouldBlock,
    /// The reader closed its end; writing is pointless (EPIPE).
    PeerClosed,
    /// This end was already closed (write after close).
    Closed,
    /// The peer (or a stray writer) put impossible contents in the ring.
    Corrupt(Corruption),
    /// A configuration value is out of range.
    Config(&'static str),
    /// A system call failed (errno).
    Os(i32),
}

/// Which invariant the ring contents broke, and the offending value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Corruption {
    /// The published tail moved backwards or ran more than N slots ahead.
    Tail { head: u64, tail: u64 },
    /// The published head moved backwards or past the tail.
    Head { head: u64, tail: u64 },
    /// A record header had a bad magic or unknown flags.
    Header { slot: u64, raw: u64 },
    /// A record claimed more bytes than were published or than fit before the
    /// end of the ring.
    Length { slot: u64, len: u32 },
    /// A shared segment's header did not describe a valid ring.
    Segment(&'static str),
    /// A stream position the peer named lies outside `[low, high]`.
    Position { pos: u64, low: u64, high: u64 },
}

impl fmt::Display for RingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RingError::WouldBlock => write!(f, "ring would block"),
            RingError::PeerClosed => write!(f, "peer closed its end of the ring"),
            RingError::Closed => write!(f, "ring already closed"),
            RingError::Corrupt(c) => write!(f, "corrupt ring: {c}"),
            RingError::Config(what) => write!(f, "invalid ring configuration: {what}"),
            RingError::Os(errno) => write!(f, "{}", std::io::Error::from_raw_os_error(*errno)),
        }
    }
}

impl fmt::Display for Corruption {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Corruption::Tail { head, tail } => write!(f, "tail {tail} impossible for head {head}"),
            Corruption::Head { head, tail } => write!(f, "head {head} impossible for tail {tail}"),
            Corruption::Header { slot, raw } => {
                write!(f, "bad record header {raw:#018x} at slot {slot}")
            }
            Corruption::Length { slot, len } => {
                write!(
                    f,
                    "record at slot {slot} claims {len} bytes beyond what was published"
                )
            }
            Corruption::Segment(what) => write!(f, "bad shared segment: {what}"),
            Corruption::Position { pos, low, high } => {
                write!(f, "stream position {pos} outside {low}..={high}")
            }
        }
    }
}

impl std::error::Error for RingError {}

impl RingError {
    /// The errno a socket layer should report for this error.
    pub fn errno(&self) -> i32 {
        match self {
            RingError::WouldBlock => libc::EAGAIN,
            RingError::PeerClosed | RingError::Closed => libc::EPIPE,
            RingError::Corrupt(_) => libc::ECONNRESET,
            RingError::Config(_) => libc::EINVAL,
            RingError::Os(e) => *e,
        }
    }

    /// The last OS error as a `RingError`.
    pub fn last_os() -> Self {
        RingError::Os(
            std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO),
        )
    }
}

impl From<RingError> for std::io::Error {
    fn from(e: RingError) -> Self {
        match e {
            RingError::Os(errno) => std::io::Error::from_raw_os_error(errno),
            RingError::WouldBlock => std::io::ErrorKind::WouldBlock.into(),
            other => std::io::Error::other(other),
        }
    }
}
