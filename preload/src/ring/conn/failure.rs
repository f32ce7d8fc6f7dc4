//! Failures: a ring call's error turned into the errno TCP would give, a
//! connection that cannot go on (`fail_hard`), and a failed wire (verbs)
//! noted under the ring ends' locks and left for the kernel socket once no
//! lock of ours is held (`lose_wire`).

use std::sync::atomic::Ordering;

use libc::c_int;
use ringsock_ring::RingError;

use super::{RingConn, Wire, MODE_RING, MODE_TCP};
use crate::attached::Errno;
use crate::ring::sockio::{self, lock, ring_errno};

impl<W: Wire> RingConn<W> {
    /// The connection cannot go on: the program gets `errno`, and the peer
    /// gets a reset on our kernel socket (its ring layer reads that as
    /// this end gone), so it neither sleeps forever on a ring nobody
    /// writes nor takes a cut stream for a whole one.
    pub fn fail_hard(&self, errno: c_int) {
        self.error.store(errno, Ordering::Release);
        self.reset.store(true, Ordering::Release);
        if !self.peer_gone.swap(true, Ordering::AcqRel) {
            self.rd_shut.store(true, Ordering::Release);
            let fd = self.tcp_fd();
            if fd >= 0 {
                sockio::abort(fd);
            }
        }
        self.wire.ring_own_bell();
    }

    /// The errno for a failed ring call. A failure after the peer process
    /// closed its socket is that close seen from the ring: the caller then
    /// behaves as after the peer's EOF. Corruption (and on a wire whose
    /// failures are fatal, anything) ends the connection.
    pub fn ring_failed(&self, e: &RingError, what: &str) -> Errno {
        match e {
            RingError::WouldBlock => return Errno(libc::EAGAIN),
            RingError::PeerClosed | RingError::Closed => return Errno(libc::EPIPE),
            _ => {}
        }
        self.check_tcp();
        if self.peer_gone() {
            log::debug!("{what} on {}: {e} after the peer closed", self.ends());
            return Errno(libc::EPIPE);
        }
        if W::FAILURES_ARE_FATAL && matches!(e, RingError::Verbs(_)) {
            self.wire_lost(e);
            if self.mode() == MODE_TCP && !self.reset.load(Ordering::Acquire) {
                // Carried on over the kernel socket: the caller goes there.
                return Errno(libc::EAGAIN);
            }
            if self.peer_gone() {
                return Errno(if self.reset.load(Ordering::Acquire) {
                    libc::ECONNRESET
                } else {
                    libc::EPIPE
                });
            }
        }
        let errno = match e {
            RingError::Config(_) | RingError::Verbs(_) => {
                log::error!("{what} on {}: {e}; the connection is reset", self.ends());
                Errno(libc::ECONNRESET)
            }
            other => ring_errno(other, what),
        };
        if W::FAILURES_ARE_FATAL || matches!(e, RingError::Corrupt(_)) {
            self.fail_hard(errno.0);
        }
        errno
    }

    /// Records `e` if it says the wire failed (`wire_failed`): the ring is
    /// left by whoever next holds none of our locks (`lose_wire`), and a
    /// waiter looks again. Returns whether it did.
    pub(super) fn note_wire_failure(&self, e: &RingError) -> bool {
        if !(W::FAILURES_ARE_FATAL && matches!(e, RingError::Verbs(_))) {
            return false;
        }
        lock(&self.wire_error).get_or_insert_with(|| e.clone());
        self.wire_failed.store(true, Ordering::Release);
        self.wire.ring_own_bell();
        true
    }

    /// The background thread's look for a failed wire (`watch::check_wires`)
    /// on a connection no thread of the program may be looking at: reaps
    /// the completions of both ends, skipping one in use, and leaves the
    /// ring if they tell of a failure. A device need not wake a sleeping
    /// end when its queue pair fails, and both ends may sleep, each
    /// waiting for the other.
    pub(super) fn check_wire(&self) {
        if !W::REAPS_COMPLETIONS || self.mode() != MODE_RING || !W::is_user(self) {
            return;
        }
        if let Some(mut tx) = self.tx.try_lock() {
            let polled = tx.as_mut().map(|tx| {
                tx.poll()
                    .and_then(|()| W::check_stalled(tx.transport_mut()))
            });
            if let Some(Err(e)) = polled {
                self.note_wire_failure(&e);
            }
        }
        if let Some(mut rx) = self.rx.try_lock() {
            if let Some(Err(e)) = rx.as_mut().map(|rx| rx.poll()) {
                self.note_wire_failure(&e);
            }
        }
        self.lose_wire();
    }

    /// Leaves the ring if a flush found its wire failed (`wire_failed`).
    /// The caller holds none of our locks.
    #[inline]
    pub(super) fn lose_wire(&self) {
        // One plain load on the way of every send and receive.
        if self.wire_failed.load(Ordering::Relaxed) {
            self.lose_failed_wire();
        }
    }

    /// `lose_wire` once the flag showed.
    #[cold]
    #[inline(never)]
    fn lose_failed_wire(&self) {
        if self.wire_failed.swap(false, Ordering::AcqRel) {
            // `wire_error` is a leaf lock: taken under the ring ends' locks
            // (`note_wire_failure`), so not held while leaving takes them.
            let e = lock(&self.wire_error).take();
            if let Some(e) = e {
                self.wire_lost(&e);
            }
        }
    }
}
