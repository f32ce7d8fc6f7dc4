//! The connection's mode: a client's `Pending` resolved into `Ring` or
//! `Tcp` (`settle`, `fall_back`, bytes on the kernel socket before the
//! decision), and whether the kernel connect completed meanwhile.

use std::sync::atomic::Ordering;

use super::leave;
use super::{RingConn, Wire, MODE_PENDING, MODE_RING, MODE_TCP};
use crate::ring::sockio::poll_one;
use crate::ring::{background, policy};

impl<W: Wire> RingConn<W> {
    /// Pending -> Ring (the server took the ring). Returns false if the
    /// connection had already left `Pending`.
    pub fn enter_ring(&self) -> bool {
        self.mode
            .compare_exchange(MODE_PENDING, MODE_RING, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Resolves `Pending` where the wire carries the decision itself.
    /// Cheap when already decided: on the ring with nothing owed, three
    /// loads inlined into the data path.
    #[inline]
    pub fn settle(&self) -> u8 {
        let m = self.mode();
        if m == MODE_RING
            && !self.header_early.load(Ordering::Relaxed)
            && !self.forked.load(Ordering::Relaxed)
        {
            return m;
        }
        self.settle_from(m)
    }

    /// `settle`'s work once the mode read `m` is not a plain ring.
    #[inline(never)]
    fn settle_from(&self, m: u8) -> u8 {
        if m == MODE_RING {
            if self.header_early.load(Ordering::Relaxed)
                && self.header_early.swap(false, Ordering::AcqRel)
            {
                self.check_tcp();
            }
            if self.forked.load(Ordering::Relaxed) {
                self.notice_shared_leave();
            }
            return self.mode();
        }
        if m != MODE_PENDING {
            return m;
        }
        W::poll_decision(self);
        if self.mode() == MODE_RING {
            return self.settle();
        }
        self.mode()
    }

    /// Pending -> Tcp: takes back what was sent while pending; it goes
    /// over the kernel socket before anything else.
    pub fn fall_back(&self, why: &str) {
        let mut tx = self.tx.lock();
        if self.mode() != MODE_PENDING {
            return;
        }
        let spill = match W::take_early(self, &mut tx) {
            Ok(b) => b,
            Err(e) => {
                log::error!("falling back to TCP: the early bytes are unreadable ({e:?})");
                self.error.store(libc::ECONNRESET, Ordering::Release);
                Vec::new()
            }
        };
        let early = spill.len();
        self.spill_tx(spill, self.wr_shut());
        self.mode.store(MODE_TCP, Ordering::Release);
        drop(tx);
        self.push_tx_spill();
        if self.initiated {
            self.turned_down.store(true, Ordering::Release);
            policy::turned_down(self.peer);
        }
        log::info!(
            "{}: plain TCP ({why}); {early} early bytes resent",
            self.ends(),
        );
        if let Some(me) = self.this() {
            background::note_fallback(me);
        }
        self.wire.ring_own_bell();
    }

    /// Bytes on the kernel socket before the server's decision reached us.
    /// A leave header means the server took the ring (and left it at
    /// once): its decision is already in the segment, or on its way
    /// through the daemons, and the header is read on the ring. Anything
    /// else is a server that talks TCP: where the wire decides, its
    /// decision word is revoked first (a server that took the ring wins).
    pub(super) fn tcp_while_pending(&self, peeked: &[u8]) {
        if leave::Leave::parse(peeked) != leave::Parsed::Garbage {
            self.header_early.store(true, Ordering::Release);
            self.settle();
            return;
        }
        if !W::revoke(self) {
            self.fall_back("the server answered over TCP");
        }
        self.settle();
    }

    /// While pending: whether the kernel connect completed (a program
    /// waiting for POLLOUT after a non-blocking connect must not be told
    /// "writable" before the kernel would).
    pub fn tcp_connected(&self) -> bool {
        if self.connected.load(Ordering::Relaxed) {
            return true;
        }
        let fd = self.tcp_fd();
        let now = fd >= 0 && poll_one(fd, libc::POLLOUT) & libc::POLLOUT != 0;
        if now {
            // A connected socket stays connected; spinning readers need
            // not ask the kernel again.
            self.connected.store(true, Ordering::Relaxed);
        }
        now
    }
}
