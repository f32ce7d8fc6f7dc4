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
