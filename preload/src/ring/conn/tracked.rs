//! The connection as the background thread and the status report see it
//! (`Tracked`): its addresses and transport, the flushes and the looks at
//! its socket and wire made from outside the program's calls.

use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::atomic::Ordering;

use ringsock_proto::Transport as StatusTransport;

use super::{RingConn, Wire, MODE_PENDING, MODE_TCP};
use crate::ring::tracked::{ReportState, Tracked};
use crate::ring::watch;

impl<W: Wire> Tracked for RingConn<W> {
    fn offer_id(&self) -> u64 {
        self.offer_id
    }

    fn local(&self) -> SocketAddr {
        self.local
    }

    fn peer(&self) -> SocketAddr {
        self.peer
    }

    fn report_state(&self) -> &ReportState {
        &self.report
    }

    fn transport(&self) -> StatusTransport {
        if self.mode() == MODE_TCP {
            StatusTransport::Tcp
        } else {
            W::STATUS
        }
    }

    fn ring_detail(&self) -> String {
        self.wire.detail()
    }

    fn socket_fd(&self) -> RawFd {
        self.tcp_fd()
    }

    fn check_socket(&self) {
        self.check_tcp();
        if self.mode() == MODE_TCP {
            watch::unwatch(self, self.tcp_fd());
        }
    }

    fn flush_ring(&self) {
        self.flush_now();
    }

    fn wire_checked(&self) -> bool {
        W::FAILURES_ARE_FATAL
    }

    fn check_wire(&self) {
        RingConn::check_wire(self);
    }

    fn try_flush_ring(&self) -> bool {
        self.try_flush()
    }

    fn is_released(&self) -> bool {
        self.released.load(Ordering::Acquire)
    }

    fn still_pending(&self) -> bool {
        self.check_tcp();
        self.settle() == MODE_PENDING
    }

    fn revoke(&self) -> bool {
        W::revoke(self)
    }

    fn decline_from_ctl(&self, reason: Option<&str>) {
        W::decline_from_ctl(self, reason);
    }

    fn answered(&self, payload: &[u8]) -> bool {
        W::answered(self, payload)
    }

    fn urgent_follow_up(&self) -> bool {
        W::urgent_follow_up(self)
    }
}

/// A connection's two addresses as its log lines name them.
pub struct Ends {
    local: SocketAddr,
    peer: SocketAddr,
}

impl std::fmt::Display for Ends {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} -> {}", self.local, self.peer)
    }
}

impl<W: Wire> RingConn<W> {
    /// The addresses for a log line: a client offered from the wildcard
    /// address, and the kernel picked the real one at connect, which the
    /// status report learnt or the kernel socket tells (a cold path).
    pub fn ends(&self) -> Ends {
        let mut local = self.report.local_or(self.local);
        if local.ip().is_unspecified() {
            if let Some(a) = crate::sockaddr::query(self.tcp_fd(), false) {
                if a.port() == local.port() {
                    local = a;
                }
            }
        }
        Ends {
            local,
            peer: self.peer,
        }
    }
}
