//! ctl-to-ctl connections (TCP between hosts): configuration, the
//! per-connection byte buffers and framing, and the negative cache of hosts
//! that could not be reached. The orchestration (which offer travels on
//! which connection, timers) lives in [`crate::server`].
//!
//! Frames are the local protocol's (`u32 LE length`, `u16 version`,
//! `u16 kind`, body, at most `MAX_FRAME` bytes) back to back on the stream;
//! only the ctl-to-ctl kinds are allowed. A reader never buffers more than
//! one frame plus one read, and a writer at most [`MAX_PEER_BUFFERED`]
//! bytes: past that the connection is closed.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use ringsock_proto::{frame, Msg, ProtoError};

use crate::sys;

pub const DEFAULT_PEER_PORT: u16 = 7471;
pub const DEFAULT_PEER_TIMEOUT_MS: u64 = 300;
pub const DEFAULT_PEER_RETRY_MS: u64 = 30_000;
/// Unsent bytes a connection may have queued before it is closed.
pub const MAX_PEER_BUFFERED: usize = 1 << 20;
/// Bytes read per system call.
const READ_CHUNK: usize = 64 * 1024;
/// Reads per wakeup before other connections are served.
const READS_PER_WAKEUP: usize = 8;

/// Inter-host options of the daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerConfig {
    /// TCP port of every host's ctl; 0 turns the inter-host path off (no
    /// listening, offers for other hosts are refused at once).
    pub port: u16,
    /// How long a forwarded offer may wait for the other ctl's answer
    /// (connect included).
    pub timeout: Duration,
    /// How long a host that could not be reached is not tried again.
    pub retry: Duration,
}

impl Default for PeerConfig {
    fn default() -> Self {
        PeerConfig {
            port: DEFAULT_PEER_PORT,
            timeout: Duration::from_millis(DEFAULT_PEER_TIMEOUT_MS),
            retry: Duration::from_millis(DEFAULT_PEER_RETRY_MS),
        }
    }
}

/// Which end of the connection we are: the connecting ctl sends offers, the
/// accepting one answers them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Connecting,
    Accepting,
}

/// What reading produced.
pub enum ReadOutcome {
    /// Complete frames, decoded; more may follow on the next wakeup.
    Frames(Vec<Msg>),
    /// End of stream (after the frames returned before).
    Closed(Vec<Msg>),
}

/// Why a connection must be closed.
#[derive(Debug)]
pub enum PeerFault {
    Io(io::Error),
    Proto(ProtoError),
    Overflow,
}

impl std::fmt::Display for PeerFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PeerFault::Io(e) => write!(f, "I/O error: {e}"),
            PeerFault::Proto(e) => write!(f, "malformed frame: {e}"),
            PeerFault::Overflow => write!(f, "too much unsent data (peer not reading)"),
        }
    }
}

pub struct PeerConn {
    pub sock: OwnedFd,
    pub role: Role,
    /// The other ctl's address (for Connecting: where we connect to).
    pub remote: SocketAddr,
    /// Connect still in progress (Connecting only).
    pub connecting: bool,
    inbuf: Vec<u8>,
    out: Vec<u8>,
    out_pos: usize,
    /// Registered for EPOLLOUT.
    pub writing: bool,
}

impl PeerConn {
    pub fn new(sock: OwnedFd, role: Role, remote: SocketAddr, connecting: bool) -> PeerConn {
        PeerConn {
            sock,
            role,
            remote,
            connecting,
            inbuf: Vec::new(),
            out: Vec::new(),
            out_pos: 0,
            // The server registers a connecting socket for writability.
            writing: connecting,
        }
    }

    /// Our own address on this connection (the source address the kernel
    /// picked to reach the other host).
    pub fn local_ip(&self) -> Option<IpAddr> {
        ringsock_proto::io::local_addr(self.sock.as_raw_fd())
            .ok()
            .map(|a| a.ip())
    }

    pub fn has_output(&self) -> bool {
        self.out_pos < self.out.len()
    }

    /// Appends one frame to the output.
    pub fn queue(&mut self, msg: &Msg) -> Result<(), PeerFault> {
        frame::encode_into(msg, &mut self.out).map_err(PeerFault::Proto)?;
        if self.out.len() - self.out_pos > MAX_PEER_BUFFERED {
            return Err(PeerFault::Overflow);
        }
        Ok(())
    }

    /// Writes what the socket takes (nothing while connecting).
    pub fn flush(&mut self) -> Result<(), PeerFault> {
        if self.connecting {
            return Ok(());
        }
        while self.has_output() {
            match sys::write_some(self.sock.as_raw_fd(), &self.out[self.out_pos..]) {
                Ok(n) => self.out_pos += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(PeerFault::Io(e)),
            }
        }
        if !self.has_output() {
            self.out.clear();
            self.out_pos = 0;
        } else if self.out_pos > READ_CHUNK {
            self.out.drain(..self.out_pos);
            self.out_pos = 0;
        }
        Ok(())
    }

    /// Reads what is there and decodes every complete frame. A frame that
    /// announces more than the limit fails before its body is read.
    pub fn read(&mut self) -> Result<ReadOutcome, PeerFault> {
        let mut msgs = Vec::new();
        for _ in 0..READS_PER_WAKEUP {
            let start = self.inbuf.len();
            self.inbuf.resize(start + READ_CHUNK, 0);
            let r = sys::read_some(self.sock.as_raw_fd(), &mut self.inbuf[start..]);
            let n = match r {
                Ok(n) => n,
                Err(e) => {
                    self.inbuf.truncate(start);
                    if e.kind() == io::ErrorKind::WouldBlock {
                        return Ok(ReadOutcome::Frames(msgs));
                    }
                    return Err(PeerFault::Io(e));
                }
            };
            self.inbuf.truncate(start + n);
            self.decode_into(&mut msgs)?;
            if n == 0 {
                if !self.inbuf.is_empty() {
                    return Err(PeerFault::Proto(ProtoError::Truncated {
                        field: "frame (stream ended)",
                    }));
                }
                return Ok(ReadOutcome::Closed(msgs));
            }
        }
        Ok(ReadOutcome::Frames(msgs))
    }

    fn decode_into(&mut self, msgs: &mut Vec<Msg>) -> Result<(), PeerFault> {
        let mut at = 0;
        while let Some(len) = frame::frame_len(&self.inbuf[at..]).map_err(PeerFault::Proto)? {
            if self.inbuf.len() - at < len {
                break;
            }
            let msg = frame::decode(&self.inbuf[at..at + len]).map_err(PeerFault::Proto)?;
            if !msg.is_peer() {
                return Err(PeerFault::Proto(ProtoError::UnknownKind {
                    kind: msg.kind(),
                }));
            }
            msgs.push(msg);
            at += len;
        }
        self.inbuf.drain(..at);
        Ok(())
    }
}

/// Hosts that could not be reached, until when they are not tried again.
#[derive(Debug, Default)]
pub struct NegativeCache {
    down: HashMap<IpAddr, Instant>,
}

impl NegativeCache {
    pub fn mark(&mut self, host: IpAddr, until: Instant) {
        // Bounded: a burst of unreachable hosts cannot grow it forever.
        if self.down.len() >= 4096 {
            let now = Instant::now();
            self.down.retain(|_, t| *t > now);
        }
        self.down.insert(host, until);
    }

    pub fn is_down(&mut self, host: IpAddr, now: Instant) -> bool {
        match self.down.get(&host) {
            Some(&t) if t > now => true,
            Some(_) => {
                self.down.remove(&host);
                false
            }
            None => false,
        }
    }

    pub fn clear(&mut self, host: IpAddr) {
        self.down.remove(&host);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::FromRawFd;

    fn pair() -> (PeerConn, OwnedFd) {
        let mut p = [0; 2];
        // SAFETY: p is a writable array of two ints.
        let r = unsafe {
            libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
                p.as_mut_ptr(),
            )
        };
        assert_eq!(r, 0);
        // SAFETY: fresh descriptors owned here only.
        let (a, b) = unsafe { (OwnedFd::from_raw_fd(p[0]), OwnedFd::from_raw_fd(p[1])) };
        let conn = PeerConn::new(a, Role::Accepting, "10.0.0.1:7471".parse().unwrap(), false);
        (conn, b)
    }

    fn send(fd: &OwnedFd, b: &[u8]) {
        assert_eq!(sys::write_some(fd.as_raw_fd(), b).unwrap(), b.len());
    }

    #[test]
    fn frames_split_anywhere_are_reassembled() {
        let (mut c, other) = pair();
        let m = Msg::RemoteCancel { offer_ref: 42 };
        let mut bytes = frame::encode(&m).unwrap();
        bytes.extend(frame::encode(&Msg::RemoteExpired { offer_ref: 7 }).unwrap());
        send(&other, &bytes[..3]);
        let ReadOutcome::Frames(v) = c.read().unwrap() else {
            panic!()
        };
        assert!(v.is_empty());
        send(&other, &bytes[3..]);
        let ReadOutcome::Frames(v) = c.read().unwrap() else {
            panic!()
        };
        assert_eq!(v, vec![m, Msg::RemoteExpired { offer_ref: 7 }]);
        drop(other);
        assert!(matches!(c.read().unwrap(), ReadOutcome::Closed(v) if v.is_empty()));
    }

    #[test]
    fn oversized_garbage_and_local_kinds_are_faults() {
        let (mut c, other) = pair();
        send(&other, &u32::MAX.to_le_bytes());
        assert!(matches!(c.read(), Err(PeerFault::Proto(_))));
        let (mut c, other) = pair();
        send(&other, &frame::encode(&Msg::Claim).unwrap());
        assert!(matches!(c.read(), Err(PeerFault::Proto(_))));
        let (mut c, other) = pair();
        send(&other, b"GET / HTTP/1.0\r\n\r\n");
        assert!(c.read().is_err());
        // A stream that ends inside a frame.
        let (mut c, other) = pair();
        send(
            &other,
            &frame::encode(&Msg::RemoteCancel { offer_ref: 1 }).unwrap()[..9],
        );
        drop(other);
        assert!(c.read().is_err());
    }

    #[test]
    fn output_is_bounded() {
        let (mut c, _other) = pair();
        let big = Msg::RemoteAnswer {
            offer_ref: 1,
            payload: vec![0; ringsock_proto::MAX_PAYLOAD],
        };
        let mut failed = false;
        for _ in 0..(MAX_PEER_BUFFERED / 4096 + 2) {
            if c.queue(&big).is_err() {
                failed = true;
                break;
            }
        }
        assert!(failed);
    }

    #[test]
    fn negative_cache_expires() {
        let mut n = NegativeCache::default();
        let ip: IpAddr = "10.1.2.3".parse().unwrap();
        let now = Instant::now();
        n.mark(ip, now + Duration::from_millis(50));
        assert!(n.is_down(ip, now));
        assert!(!n.is_down(ip, now + Duration::from_millis(60)));
        assert!(!n.is_down(ip, now));
    }
}
