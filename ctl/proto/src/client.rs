//! Blocking request/reply helpers for processes talking to the daemon.
//!
//! The daemon answers every request with exactly one reply, in order, so a
//! call is one send and one receive. Timeouts come from SO_RCVTIMEO /
//! SO_SNDTIMEO ([`crate::io::set_timeouts`]), which a shim must set so a
//! stuck daemon can only ever delay it, never hang it.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::time::Duration;

use crate::{frame, io, Error, Fds, Msg, MAX_FRAME_TOTAL};

/// Encodes `msg` and sends it with `fds` on `sock`.
pub fn send_msg(sock: RawFd, msg: &Msg, fds: &[RawFd]) -> Result<(), Error> {
    msg.check_fds(fds.len())?;
    let bytes = frame::encode(msg)?;
    io::send_frame(sock, &bytes, fds, 0)?;
    Ok(())
}

/// Receives and decodes one message (descriptor count checked) using `buf`
/// as scratch space (at least [`MAX_FRAME_TOTAL`] bytes for any message).
/// The peer closing is [`Error::Closed`].
pub fn recv_msg(sock: RawFd, buf: &mut [u8]) -> Result<(Msg, Fds), Error> {
    match io::recv_frame(sock, buf, 0)? {
        None => Err(Error::Closed),
        Some((n, fds)) => {
            // On a decode error `fds` drops here and closes what came.
            let msg = frame::decode_with_fds(&buf[..n], fds.len())?;
            Ok((msg, fds))
        }
    }
}

/// A connection to the daemon.
pub struct Client {
    sock: OwnedFd,
    buf: Vec<u8>,
}

impl Client {
    /// Connects to the daemon socket at `path`, with send/receive timeouts.
    pub fn connect(path: &Path, timeout: Option<Duration>) -> Result<Client, Error> {
        let sock = io::connect_unix(path)?;
        if let Some(t) = timeout {
            io::set_timeouts(sock.as_raw_fd(), t)?;
        }
        Ok(Client::from_fd(sock))
    }

    /// Wraps an already connected SOCK_SEQPACKET socket.
    pub fn from_fd(sock: OwnedFd) -> Client {
        Client {
            sock,
            buf: vec![0; MAX_FRAME_TOTAL],
        }
    }

    /// Sends a request with its descriptors and waits for the reply.
    /// Anything but a reply kind means a confused peer and is an error.
    pub fn call(&mut self, msg: &Msg, fds: &[RawFd]) -> Result<(Msg, Fds), Error> {
        send_msg(self.sock.as_raw_fd(), msg, fds)?;
        let (reply, rfds) = recv_msg(self.sock.as_raw_fd(), &mut self.buf)?;
        if !reply.is_reply() {
            return Err(Error::Proto(crate::ProtoError::UnknownKind {
                kind: reply.kind(),
            }));
        }
        Ok((reply, rfds))
    }

    /// The mandatory first exchange; returns (daemon version, host id).
    pub fn hello(&mut self, exe: &str) -> Result<(String, u64), Error> {
        self.hello_with_offers(exe).map(|(v, h, _)| (v, h))
    }

    /// `hello`, keeping the descriptor of the daemon's offer table that
    /// comes with the reply (`crate::offers`), if any.
    pub fn hello_with_offers(
        &mut self,
        exe: &str,
    ) -> Result<(String, u64, Option<OwnedFd>), Error> {
        let exe = truncate_utf8(exe, crate::MAX_EXE);
        let req = Msg::Hello {
            pid: std::process::id(),
            exe: exe.to_owned(),
        };
        match self.call(&req, &[])? {
            (
                Msg::HelloOk {
                    daemon_version,
                    host_id,
                },
                fds,
            ) => Ok((daemon_version, host_id, fds.into_owned().pop())),
            (other, _) => Err(Error::Proto(crate::ProtoError::UnknownKind {
                kind: other.kind(),
            })),
        }
    }

    pub fn as_raw_fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }

    pub fn into_fd(self) -> OwnedFd {
        self.sock
    }
}

/// The longest prefix of `s` of at most `max` bytes that ends on a char
/// boundary (so long paths are shortened instead of refused).
pub fn truncate_utf8(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncation_respects_char_boundaries() {
        assert_eq!(truncate_utf8("abc", 5), "abc");
        assert_eq!(truncate_utf8("aé", 2), "a");
        assert_eq!(truncate_utf8("aé", 3), "aé");
    }
}
