//! The side channel between the two roles of a scenario and the runner:
//! an AF_UNIX SOCK_SEQPACKET socket (the shim never tracks AF_UNIX) that
//! the runner hands each role as a descriptor named by `CONFORM_SYNC_FD`.
//!
//! A role reaches a barrier by sending `Arrive` and waiting for the
//! runner's `Go`, which comes when the other role arrives at the barrier
//! of the same name, or at once when the other role is gone (its channel
//! closed by every process holding it and its main process reaped). A
//! barrier may ask the runner to check, in shim mode, that the
//! connections to the scenario's port are on rings (`ring`: how many),
//! and carries a payload handed to the other role (names to compare).

use std::os::fd::RawFd;

/// The environment variable naming a role's channel descriptor.
pub const ENV_FD: &str = "CONFORM_SYNC_FD";

/// A role arrives at barrier `name`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Arrive {
    pub name: String,
    /// Connections to the port that must be on rings here (0: no check).
    pub ring: u32,
    pub payload: String,
}

impl Arrive {
    pub fn encode(&self) -> String {
        format!("B\t{}\t{}\t{}", self.name, self.ring, self.payload)
    }

    pub fn decode(msg: &str) -> Option<Arrive> {
        let mut it = msg.splitn(4, '\t');
        if it.next()? != "B" {
            return None;
        }
        Some(Arrive {
            name: it.next()?.to_string(),
            ring: it.next()?.parse().ok()?,
            payload: it.next()?.to_string(),
        })
    }
}

/// The runner's answer: the other role's payload (empty when alone).
pub fn encode_go(payload: &str) -> String {
    format!("G\t{payload}")
}

/// A role's end of the channel.
#[derive(Clone, Copy)]
pub struct Sync {
    fd: RawFd,
}

impl Sync {
    /// The channel named by `CONFORM_SYNC_FD`; panics without one.
    pub fn from_env() -> Sync {
        let fd = std::env::var(ENV_FD)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{ENV_FD} is not set: roles run under `conform run`"));
        Sync { fd }
    }

    /// Waits at barrier `name`; returns the other role's payload.
    pub fn barrier(&self, name: &str, ring: u32, payload: &str) -> String {
        let msg = Arrive {
            name: name.to_string(),
            ring,
            payload: payload.to_string(),
        }
        .encode();
        // SAFETY: sending our own buffer on our channel descriptor.
        let n = unsafe { libc::send(self.fd, msg.as_ptr().cast(), msg.len(), libc::MSG_NOSIGNAL) };
        if n != msg.len() as isize {
            lost(name);
        }
        let mut buf = [0u8; 4096];
        loop {
            // SAFETY: receiving into our own buffer. The runner bounds the
            // wait: it kills the role when the scenario runs too long.
            let n = unsafe { libc::recv(self.fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            if n <= 0 {
                lost(name);
            }
            let text = String::from_utf8_lossy(&buf[..n as usize]);
            return match text.strip_prefix("G\t") {
                Some(p) => p.to_string(),
                None => lost(name),
            };
        }
    }
}

fn lost(name: &str) -> ! {
    eprintln!("conform: side channel lost at barrier `{name}`");
    std::process::exit(91);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrive_round_trips() {
        let a = Arrive {
            name: "connected".into(),
            ring: 2,
            payload: "AF_INET 127.0.0.1:EPH\tx".into(),
        };
        assert_eq!(Arrive::decode(&a.encode()), Some(a));
        assert_eq!(Arrive::decode("G\tx"), None);
    }
}
