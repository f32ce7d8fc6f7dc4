//! Errors of the ring protocol and its transports. Each says what failed
//! and why; `RingError::errno` is what a socket layer reports for it.

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
    /// A ring's configuration cannot work.
    Config(ConfigError),
    /// The transport cannot do what was asked of it.
    Unsupported(&'static str),
    /// A system call failed (errno).
    Os(i32),
    /// The RDMA verbs transport failed.
    Verbs(VerbsError),
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
    /// The reader's closed flag held neither 0 nor 1.
    ClosedFlag { raw: u64 },
}

/// Why a ring's configuration cannot work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigError {
    /// A `RingConfig` field is out of range; the text names the field and
    /// its range.
    Field(&'static str),
    /// A segment asked for `rings` rings; it holds `1..=max`.
    SegmentRings { rings: u32, max: u32 },
    /// The ring memory holds `have` slot bytes; the geometry needs `want`.
    Memory { have: usize, want: u64 },
}

/// Why the RDMA verbs transport failed. Any of these during a transfer
/// means the connection is dead.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VerbsError {
    /// A verbs call failed: its name and the errno it reported (0 when it
    /// reported none).
    Call { op: &'static str, errno: i32 },
    /// `ibv_reg_mr` could not register (pin) `bytes` bytes.
    Register { bytes: usize, errno: i32 },
    /// A work request completed in error: its `ibv_wc_status` and what
    /// that status means.
    Completion { status: u32, what: &'static str },
    /// libibverbs cannot be loaded (the message says why).
    NoLibrary(String),
    /// The system has no RDMA device.
    NoDevice,
    /// No RDMA device has this name.
    NoSuchDevice(String),
    /// The device has no active port; or `port`, the one asked for, is
    /// not active.
    NoActivePort { device: String, port: Option<u8> },
    /// The GID at `index` of the port is empty or cannot be read.
    BadGid { device: String, port: u8, index: u8 },
    /// The port has no GID this transport can use.
    NoGid { device: String, port: u8 },
    /// The peer's connection parameters are malformed, or do not fit this
    /// end.
    Params(&'static str),
    /// The peer sent what this end's protocol does not allow.
    Protocol(&'static str),
    /// A request (`op`: an RDMA READ, a WRITE) got no answer within
    /// `secs` seconds: the peer is gone or unreachable.
    Unanswered { op: &'static str, secs: u64 },
    /// The caller asked the transport for a transfer outside its ring.
    OutOfRing(&'static str),
}

impl fmt::Display for RingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RingError::WouldBlock => write!(f, "ring would block"),
            RingError::PeerClosed => write!(f, "peer closed its end of the ring"),
            RingError::Closed => write!(f, "ring already closed"),
            RingError::Corrupt(c) => write!(f, "corrupt ring: {c}"),
            RingError::Config(c) => write!(f, "invalid ring configuration: {c}"),
            RingError::Unsupported(what) => write!(f, "not supported: {what}"),
            RingError::Os(errno) => write!(f, "{}", std::io::Error::from_raw_os_error(*errno)),
            RingError::Verbs(v) => write!(f, "verbs: {v}"),
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
            Corruption::ClosedFlag { raw } => write!(f, "reader's closed flag {raw:#x}"),
            Corruption::Position { pos, low, high } => {
                write!(f, "stream position {pos} outside {low}..={high}")
            }
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::Field(what) => write!(f, "{what}"),
            ConfigError::SegmentRings { rings, max } => {
                write!(f, "a segment holds 1..={max} rings, not {rings}")
            }
            ConfigError::Memory { have, want } => write!(
                f,
                "ring memory of {have} bytes does not match the geometry's {want}"
            ),
        }
    }
}

impl fmt::Display for VerbsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VerbsError::Call { op, errno } => {
                write!(f, "{op} failed")?;
                if *errno != 0 {
                    write!(f, ": {}", OsText(*errno))?;
                }
                match call_hint(op) {
                    Some(hint) => write!(f, " ({hint})"),
                    None => Ok(()),
                }
            }
            VerbsError::Register { bytes, errno } => {
                write!(f, "ibv_reg_mr of {bytes} bytes failed: {}", OsText(*errno))?;
                if is_memlock_errno(*errno) {
                    // Registration pins the pages, which counts against
                    // RLIMIT_MEMLOCK unless the process has CAP_IPC_LOCK.
                    write!(
                        f,
                        "; the usual cause is RLIMIT_MEMLOCK (ulimit -l) below what the rings \
                         pin (raise it, or grant CAP_IPC_LOCK)"
                    )?;
                }
                Ok(())
            }
            VerbsError::Completion { status, what } => {
                write!(f, "{what} (work completion status {status})")
            }
            VerbsError::NoLibrary(why) => write!(f, "cannot load libibverbs: {why}"),
            VerbsError::NoDevice => write!(f, "no RDMA device found"),
            VerbsError::NoSuchDevice(name) => write!(f, "no RDMA device named {name:?}"),
            VerbsError::NoActivePort { device, port: None } => {
                write!(f, "{device} has no active port")
            }
            VerbsError::NoActivePort {
                device,
                port: Some(port),
            } => write!(f, "port {port} of {device} is not active"),
            VerbsError::BadGid {
                device,
                port,
                index,
            } => write!(
                f,
                "GID index {index} of {device} port {port} is empty or invalid"
            ),
            VerbsError::NoGid { device, port } => {
                write!(f, "{device} port {port} has no usable GID")
            }
            VerbsError::Params(what) => write!(f, "bad connection parameters: {what}"),
            VerbsError::Protocol(what) => write!(f, "protocol violation: {what}"),
            VerbsError::Unanswered { op, secs } => {
                write!(
                    f,
                    "an RDMA {op} was not answered within {secs} s (peer gone?)"
                )
            }
            VerbsError::OutOfRing(what) => write!(f, "{what}"),
        }
    }
}

/// The usual cause of a failed verbs call, where one is worth naming.
fn call_hint(op: &str) -> Option<&'static str> {
    match op {
        "ibv_get_device_list" => {
            Some("no RDMA support in this kernel, or no provider library for the device")
        }
        "ibv_modify_qp to RTR" => Some("check the peer's GID, QPN and our GID index"),
        "ibv_post_send" | "ibv_post_send (READ)" => Some("send queue full or QP in error"),
        _ => None,
    }
}

/// Whether a failed registration's errno is what a locked-memory limit
/// gives (RLIMIT_MEMLOCK: ENOMEM; EPERM and EAGAIN on some kernels).
pub(crate) fn is_memlock_errno(errno: i32) -> bool {
    matches!(errno, libc::ENOMEM | libc::EPERM | libc::EAGAIN)
}

/// "Cannot allocate memory (errno 12)": std's text without its
/// " (os error N)", and the errno once.
struct OsText(i32);

impl fmt::Display for OsText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = std::io::Error::from_raw_os_error(self.0).to_string();
        let t = t.split(" (os error").next().unwrap_or_default();
        write!(f, "{t} (errno {})", self.0)
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
            RingError::Unsupported(_) => libc::EOPNOTSUPP,
            RingError::Os(e) => *e,
            // The connection cannot carry on.
            RingError::Verbs(_) => libc::ECONNRESET,
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

impl From<ConfigError> for RingError {
    fn from(e: ConfigError) -> Self {
        RingError::Config(e)
    }
}

impl From<VerbsError> for RingError {
    fn from(e: VerbsError) -> Self {
        RingError::Verbs(e)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reg_mr_errors_name_size_errno_and_memlock() {
        let m = RingError::from(VerbsError::Register {
            bytes: 2_105_344,
            errno: libc::ENOMEM,
        })
        .to_string();
        assert!(m.starts_with("verbs: ibv_reg_mr of 2105344 bytes"), "{m}");
        assert!(m.contains("Cannot allocate memory (errno 12)"), "{m}");
        assert!(
            m.contains("RLIMIT_MEMLOCK") && m.contains("ulimit -l"),
            "{m}"
        );
        let other = VerbsError::Register {
            bytes: 4096,
            errno: libc::EFAULT,
        }
        .to_string();
        assert!(
            other.contains("errno 14") && !other.contains("MEMLOCK"),
            "{other}"
        );
    }

    #[test]
    fn verbs_calls_say_which_call_and_why() {
        let e = VerbsError::Call {
            op: "ibv_create_qp",
            errno: libc::EINVAL,
        };
        assert_eq!(
            RingError::Verbs(e).to_string(),
            "verbs: ibv_create_qp failed: Invalid argument (errno 22)"
        );
        let e = VerbsError::Call {
            op: "ibv_poll_cq",
            errno: 0,
        };
        assert_eq!(e.to_string(), "ibv_poll_cq failed");
        assert_eq!(RingError::Verbs(e).errno(), libc::ECONNRESET);
    }

    #[test]
    fn configuration_errors_are_not_verbs_errors() {
        let e = RingError::from(ConfigError::Field("alpha must be in 1..=slots/2"));
        assert_eq!(
            e.to_string(),
            "invalid ring configuration: alpha must be in 1..=slots/2"
        );
        assert_eq!(e.errno(), libc::EINVAL);
        let e = RingError::from(ConfigError::SegmentRings { rings: 9, max: 8 });
        assert_eq!(
            e.to_string(),
            "invalid ring configuration: a segment holds 1..=8 rings, not 9"
        );
    }
}
