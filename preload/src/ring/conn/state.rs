//! Building a connection from what its handshake handed over, the plain
//! accessors of its state, and what dropping it releases.

use std::collections::VecDeque;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::lock::{OpGuard, OpLock};
use super::{Parts, RingConn, RxSlot, TxSlot, Waiters, Wire, MODE_PENDING, MODE_RING};
use crate::ring::msgstart::MessageStart;
use crate::ring::tracked::ReportState;
use crate::sys;

impl<W: Wire> RingConn<W> {
    pub fn new(p: Parts<W>) -> Arc<RingConn<W>> {
        let mode = if p.pending { MODE_PENDING } else { MODE_RING };
        let rcvlowat = crate::sys::rcvlowat(p.tcp);
        Arc::new_cyclic(|this| RingConn {
            offer_id: p.offer_id,
            local: p.local,
            peer: p.peer,
            wire: p.wire,
            tx: OpLock::new(p.tx),
            rx: OpLock::new(p.rx),
            rx_spill: Mutex::new(VecDeque::new()),
            tx_spill: Mutex::new(VecDeque::new()),
            shut_wr_owed: AtomicBool::new(false),
            tcp: AtomicI32::new(p.tcp),
            retired_tcp: AtomicI32::new(-1),
            mode: AtomicU8::new(mode),
            peer_gone: AtomicBool::new(false),
            reset: AtomicBool::new(false),
            error: AtomicI32::new(0),
            closed_write_taken: AtomicBool::new(false),
            socket_error_seen: AtomicBool::new(false),
            rd_shut: AtomicBool::new(false),
            wr_shut: AtomicBool::new(false),
            eos_owed: AtomicBool::new(false),
            leaving: AtomicBool::new(false),
            lost_pending: AtomicBool::new(false),
            wire_failed: AtomicBool::new(false),
            wire_error: Mutex::new(None),
            lost_sent: AtomicBool::new(false),
            settle_owed: AtomicBool::new(false),
            header_since: AtomicU64::new(0),
            header_early: AtomicBool::new(false),
            rcvlowat: AtomicUsize::new(rcvlowat),
            tcp_blocked: AtomicU64::new(0),
            forked: AtomicBool::new(false),
            forked_ops: AtomicU64::new(0),
            counted_out: AtomicBool::new(false),
            connected: AtomicBool::new(!p.pending),
            initiated: p.pending,
            born_ns: sys::monotonic_ns(),
            turned_down: AtomicBool::new(false),
            dirty: AtomicBool::new(false),
            message: MessageStart::new(),
            waiters: Mutex::new(Waiters::default()),
            released: AtomicBool::new(false),
            report: ReportState::new(),
            this: this.clone(),
        })
    }

    pub fn this(&self) -> Option<Arc<RingConn<W>>> {
        self.this.upgrade()
    }

    pub fn tcp_fd(&self) -> RawFd {
        self.tcp.load(Ordering::Acquire)
    }

    pub fn mode(&self) -> u8 {
        self.mode.load(Ordering::Acquire)
    }

    pub fn wr_shut(&self) -> bool {
        self.wr_shut.load(Ordering::Acquire)
    }

    /// Marks this side shut for writing without a mark yet (a close while
    /// the wire has no sender: the mark follows the early bytes).
    pub fn set_wr_shut(&self) {
        self.wr_shut.store(true, Ordering::Release);
    }

    pub fn owe_eos(&self) {
        self.eos_owed.store(true, Ordering::Release);
    }

    pub fn peer_gone(&self) -> bool {
        self.peer_gone.load(Ordering::Acquire)
    }

    /// The kernel connection underneath was reset (by the peer, or as TCP
    /// would have been): no server can take a pending ring over it.
    pub fn was_reset(&self) -> bool {
        self.reset.load(Ordering::Acquire)
    }

    /// The locked sender slot (the wire's pending paths and handshake).
    pub fn tx_slot(&self) -> OpGuard<'_, TxSlot<W>> {
        self.tx.lock()
    }

    /// The locked receiver slot.
    pub fn rx_slot(&self) -> OpGuard<'_, RxSlot<W>> {
        self.rx.lock()
    }
}

impl<W: Wire> Drop for RingConn<W> {
    fn drop(&mut self) {
        for fd in [*self.tcp.get_mut(), *self.retired_tcp.get_mut()] {
            if fd >= 0 {
                crate::fdspace::close(fd);
            }
        }
        if !self.wire.owns_ends() {
            std::mem::forget(self.tx.get_mut().take());
            std::mem::forget(self.rx.get_mut().take());
        }
    }
}
