//! The one error type of the wire protocol: every way a frame can be wrong.
//!
//! Decoding hostile bytes must end in one of these values, never in a panic,
//! so the daemon can log one line and close that session only.

use std::fmt;

/// Why a frame could not be encoded or decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProtoError {
    /// Fewer bytes than the frame header (length + version + kind).
    ShortFrame { len: usize },
    /// The length prefix announces more than [`crate::MAX_FRAME`] bytes.
    TooLarge { len: usize },
    /// The length prefix disagrees with the bytes actually present.
    LengthMismatch { declared: usize, actual: usize },
    /// The peer speaks another protocol version.
    BadVersion { got: u16 },
    /// The kind field names no message of this version.
    UnknownKind { kind: u16 },
    /// The body ended inside a field.
    Truncated { field: &'static str },
    /// The body has bytes left after the last field.
    Trailing { kind: &'static str, extra: usize },
    /// A length-limited field is longer than its limit.
    FieldTooLong {
        field: &'static str,
        len: usize,
        max: usize,
    },
    /// A string field is not valid UTF-8.
    BadUtf8 { field: &'static str },
    /// A tag or enum field has a value this version does not define.
    BadValue { field: &'static str, value: u64 },
    /// A message arrived with a number of file descriptors it cannot carry.
    FdCount {
        kind: &'static str,
        got: usize,
        min: usize,
        max: usize,
    },
    /// Ancillary data was cut by the kernel (more fds than the receive
    /// buffer holds, or the receiver ran out of descriptors).
    FdsTruncated,
    /// The datagram was longer than the receive buffer: over the size limit.
    Oversized,
}

impl fmt::Display for ProtoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProtoError::ShortFrame { len } => {
                write!(f, "frame of {len} bytes is shorter than its header")
            }
            ProtoError::TooLarge { len } => write!(
                f,
                "frame length {len} exceeds the limit of {} bytes",
                crate::MAX_FRAME
            ),
            ProtoError::LengthMismatch { declared, actual } => write!(
                f,
                "length prefix says {declared} bytes but {actual} bytes follow"
            ),
            ProtoError::BadVersion { got } => write!(
                f,
                "protocol version {got} is not supported (expected {})",
                crate::PROTO_VERSION
            ),
            ProtoError::UnknownKind { kind } => write!(f, "unknown message kind {kind:#06x}"),
            ProtoError::Truncated { field } => write!(f, "message truncated in field `{field}`"),
            ProtoError::Trailing { kind, extra } => {
                write!(f, "{extra} trailing bytes after a {kind} message")
            }
            ProtoError::FieldTooLong { field, len, max } => {
                write!(f, "field `{field}` is {len} long, limit is {max}")
            }
            ProtoError::BadUtf8 { field } => write!(f, "field `{field}` is not valid UTF-8"),
            ProtoError::BadValue { field, value } => {
                write!(f, "field `{field}` has invalid value {value}")
            }
            ProtoError::FdCount {
                kind,
                got,
                min,
                max,
            } => write!(
                f,
                "{kind} carries {got} file descriptors, expected {min}..={max}"
            ),
            ProtoError::FdsTruncated => write!(f, "file descriptors were truncated in transit"),
            ProtoError::Oversized => write!(f, "datagram larger than the maximum frame"),
        }
    }
}

impl std::error::Error for ProtoError {}

/// Errors of the blocking client helpers: transport failure, protocol
/// violation, or the daemon hung up.
#[derive(Debug)]
pub enum Error {
    Io(std::io::Error),
    Proto(ProtoError),
    /// The peer closed the connection.
    Closed,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Io(e) => write!(f, "control socket I/O error: {e}"),
            Error::Proto(e) => write!(f, "control protocol error: {e}"),
            Error::Closed => write!(f, "control connection closed by peer"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io(e) => Some(e),
            Error::Proto(e) => Some(e),
            Error::Closed => None,
        }
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::Io(e)
    }
}

impl From<ProtoError> for Error {
    fn from(e: ProtoError) -> Self {
        Error::Proto(e)
    }
}
