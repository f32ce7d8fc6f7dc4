//! The hooks' entry points (`AttachedConn`): each call settles the mode
//! and goes to the ring's code or the kernel socket's (`tcp`).

use std::io::{IoSlice, IoSliceMut};
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use libc::c_int;

use super::fork;
use super::{RingConn, Wire, MODE_PENDING, MODE_RING, MODE_TCP};
use crate::attached::{AttachedConn, Errno, Look, Ready, ReleaseKind, WaitFd, WaitFds};
use crate::ring::sockio::lock;
use crate::ring::tracked::Tracked;
use crate::ring::{background, watch};
use crate::sys;

impl<W: Wire> AttachedConn for RingConn<W> {
    fn try_recv(&self, bufs: &mut [IoSliceMut<'_>], peek: bool) -> Result<usize, Errno> {
        match self.recv_ring(bufs, peek, false) {
            Look::Done(r) => r,
            // Only a quiet look answers these.
            Look::Empty | Look::Unsure => Err(Errno(libc::EAGAIN)),
        }
    }

    fn recv_look(&self, bufs: &mut [IoSliceMut<'_>]) -> Look {
        self.recv_ring(bufs, false, true)
    }

    fn try_send(&self, bufs: &[IoSlice<'_>]) -> Result<usize, Errno> {
        self.lose_wire();
        let mode = self.settle();
        if mode == MODE_TCP {
            return self.tcp_send(bufs);
        }
        if self.wr_shut.load(Ordering::Relaxed) {
            return Err(Errno(libc::EPIPE));
        }
        if self.peer_gone() {
            return self.send_after_peer_gone(bufs);
        }
        if mode == MODE_PENDING {
            if !self.tcp_connected() {
                return Err(Errno(libc::EAGAIN));
            }
            return W::send_pending(self, bufs);
        }
        self.send_into_ring(bufs, usize::MAX, MODE_RING)
    }

    fn flush(&self) {
        background::flush_all();
    }

    fn readiness(&self) -> Ready {
        self.readiness_for(Ready(!0))
    }

    fn readiness_for(&self, interest: Ready) -> Ready {
        match self.settle() {
            MODE_TCP => self.tcp_readiness(),
            _ => self.ring_readiness(interest),
        }
    }

    fn readiness_needing(&self, need: usize) -> Ready {
        self.readiness_needing_for(Ready::READ | Ready::RDHUP, need)
    }

    fn spin_looks(&self) -> u32 {
        self.wire.spin_looks()
    }

    fn arm_waiter(&self, interest: Ready, level: bool) -> Ready {
        self.arm_inner(interest, level, self.rcvlowat.load(Ordering::Relaxed))
    }

    fn arm_needing(&self, need: usize) -> Ready {
        self.arm_inner(Ready::READ | Ready::RDHUP, true, need)
    }

    fn disarm_waiter(&self, interest: Ready, level: bool) {
        // An edge waiter's set calls `socket_fired` when the socket has
        // news (see `arm_inner` for a side a fork shared).
        let socket = level || self.forked.load(Ordering::Acquire);
        self.disarm_inner(interest, level, true, socket)
    }

    fn disarm_after(&self, interest: Ready, woke: &[libc::pollfd]) {
        let fired = |fd: RawFd| woke.iter().any(|p| p.fd == fd && p.revents != 0);
        let rung = self.wire.bell_fds().into_iter().flatten().any(fired);
        let tcp = self.tcp_fd();
        self.disarm_inner(interest, true, rung, tcp >= 0 && fired(tcp))
    }

    fn watched_socket(&self) -> RawFd {
        self.tcp_fd()
    }

    fn socket_fired(&self) {
        self.check_tcp();
    }

    fn wait_fds(&self, _fd: RawFd, interest: Ready) -> WaitFds {
        let tcp = self.tcp_fd();
        if self.settle() == MODE_TCP {
            return self.tcp_wait_fds(interest);
        }
        let mut out: WaitFds = [None; 3];
        let bells = self.wire.bell_fds().into_iter().flatten();
        let socket = (tcp >= 0).then_some(tcp);
        for (slot, fd) in out.iter_mut().zip(bells.chain(socket)) {
            let events = if fd == tcp {
                libc::POLLIN | libc::POLLRDHUP
            } else {
                libc::POLLIN
            };
            *slot = Some(WaitFd { fd, events });
        }
        out
    }

    fn event_seq(&self) -> u64 {
        let mode = self.mode();
        let flags = u64::from(mode) << 60 | u64::from(self.peer_gone()) << 62;
        let seq = if mode == MODE_TCP {
            // The ring's pointers stopped: arrivals are the socket's now.
            self.tcp_event_seq()
        } else {
            self.wire.event_seq().unwrap_or_else(|| self.ring_seq())
        };
        seq ^ flags
    }

    fn available(&self) -> usize {
        match self.settle() {
            MODE_TCP => self.tcp_available(),
            _ => self
                .rx
                .lock()
                .as_mut()
                .map_or(0, |rx| rx.available().unwrap_or(0)),
        }
    }

    fn shutdown(&self, _fd: RawFd, how: c_int) -> Result<(), Errno> {
        self.shutdown_sides(how)
    }

    fn take_error(&self) -> c_int {
        self.error.swap(0, Ordering::AcqRel)
    }

    fn claim(&self) -> Result<(), Errno> {
        // A side a fork made shared is taken over, or left, by the shared
        // rule (`share`); the wire's own rule is for the rest.
        match self.enter_shared(None) {
            fork::Entered::Shared(s) => s.unlock(),
            fork::Entered::Left => return Ok(()),
            fork::Entered::Alone => W::claim(self)?,
        }
        if self.mode() != MODE_TCP {
            if let Some(me) = self.this() {
                let tracked: Arc<dyn Tracked> = me;
                watch::ensure(&tracked);
                background::note_taken_over(tracked);
            }
        }
        Ok(())
    }

    fn drain_at_exit(&self, deadline_ns: u64) {
        self.drain_before_exit(deadline_ns);
    }

    fn release(&self, _fd: RawFd, kind: ReleaseKind) {
        self.release_end(kind);
    }

    fn fd_closed(&self, fd: RawFd, other: &dyn Fn() -> Option<RawFd>) {
        if let Some(me) = self.this() {
            background::note_renumbered(me, fd, other);
        }
    }

    fn may_be_socket(&self, local: SocketAddr, peer: Option<SocketAddr>) -> bool {
        // Only what surely is another socket says no: one bound or
        // connected to other ports (the recorded addresses may be the
        // wildcard or the destination the program named, never the
        // ports; a reset socket has no peer name).
        local.port() == self.local.port() && peer.is_none_or(|p| p.port() == self.peer.port())
    }

    fn leave_ring(&self, hand_over: bool) -> bool {
        self.leave(hand_over);
        if self.mode() != MODE_TCP {
            return false;
        }
        let limit = u64::from(crate::config::get().connect_timeout_ms) * 1_000_000;
        self.push_tx_spill_until(sys::monotonic_ns() + limit);
        lock(&self.tx_spill).is_empty()
    }

    fn fork_prepare(&self) {
        RingConn::fork_prepare(self);
    }

    fn fork_finish(&self) {
        RingConn::fork_finish(self);
    }

    fn set_rcvlowat(&self, bytes: usize) {
        self.rcvlowat.store(bytes.max(1), Ordering::Relaxed);
    }

    fn rcvlowat(&self) -> usize {
        self.rcvlowat.load(Ordering::Relaxed)
    }

    fn tcp_state(&self) -> Option<u8> {
        self.ring_tcp_state()
    }

    fn at_mark(&self) -> Option<bool> {
        match self.mode() {
            MODE_TCP if lock(&self.rx_spill).is_empty() => None,
            _ => Some(false),
        }
    }
}
