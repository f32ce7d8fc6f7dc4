//! Pushing batched bytes out, by the program's threads and by the
//! background thread's flush list, and settling the control-word writes a
//! wire reports late (verbs) before a thread may sleep.

use std::sync::atomic::Ordering;

use ringsock_ring::RingError;

use super::{RingConn, RxSlot, TxSlot, Wire, MODE_TCP};
use crate::ring::background;
use crate::sys;

/// Longest a thread polls for its control-word writes to be reported (a
/// round trip; far longer only when the peer is unreachable).
const SETTLE_LIMIT_NS: u64 = 200_000_000;

impl<W: Wire> RingConn<W> {
    /// Polls both ends (held by the caller) until no control-word write is
    /// unreported, or the bound runs out. True when settled.
    pub(super) fn settle_locked(
        &self,
        tx: &mut TxSlot<W>,
        rx: &mut RxSlot<W>,
        limit_ns: u64,
    ) -> bool {
        if !W::REAPS_COMPLETIONS {
            return true;
        }
        let start = sys::monotonic_ns();
        let mut wait = ringsock_ring::sleep::backoff::CompletionWait::new();
        loop {
            let tx_owes = tx
                .as_mut()
                .is_some_and(|tx| W::words_pending(tx.transport_mut()) && tx.poll().is_ok());
            let rx_owes = rx
                .as_mut()
                .is_some_and(|rx| W::words_pending(rx.transport_mut()) && rx.poll().is_ok());
            if !tx_owes && !rx_owes {
                return true;
            }
            if self.peer_gone() || sys::monotonic_ns() - start > limit_ns {
                return false;
            }
            wait.relax();
        }
    }

    /// Polls both ends until no control-word write is unreported: every
    /// tail and head this process published has landed and the matching
    /// sleeping-flag check ran (the ring crate's verbs module, "What verbs
    /// need"). Bounded: a peer whose queue pair is gone never acknowledges,
    /// and its death shows on the kernel socket; what is still owed then
    /// is left to the background thread (the connection stays queued).
    pub(super) fn settle_words(&self) {
        if !W::REAPS_COMPLETIONS {
            return;
        }
        let start = sys::monotonic_ns();
        let mut spins = 0u32;
        let mut wait = ringsock_ring::sleep::backoff::CompletionWait::new();
        loop {
            let tx_owes = self
                .tx
                .lock()
                .as_mut()
                .is_some_and(|tx| W::words_pending(tx.transport_mut()) && tx.poll().is_ok());
            let rx_owes = self
                .rx
                .lock()
                .as_mut()
                .is_some_and(|rx| W::words_pending(rx.transport_mut()) && rx.poll().is_ok());
            if !tx_owes && !rx_owes {
                return;
            }
            spins += 1;
            if spins.is_multiple_of(64) {
                self.check_tcp();
                if self.peer_gone() || sys::monotonic_ns() - start > SETTLE_LIMIT_NS {
                    self.settle_owed.store(true, Ordering::Release);
                    self.mark_dirty();
                    return;
                }
            }
            wait.relax();
        }
    }

    /// Pushes batched bytes out (and a deferred end-of-stream mark, and
    /// bytes the ring owes the kernel socket).
    pub(super) fn flush_now(&self) {
        let mut tx = self.tx.lock();
        self.flush_locked(&mut tx);
        drop(tx);
        self.lose_wire();
        self.push_tx_spill();
    }

    /// Background variant: skips a connection another thread is using (it
    /// flushes by itself before it blocks). Returns false if skipped.
    pub(super) fn try_flush(&self) -> bool {
        let Some(mut tx) = self.tx.try_lock() else {
            return false;
        };
        self.flush_locked(&mut tx);
        drop(tx);
        self.lose_wire();
        self.push_tx_spill();
        if W::REAPS_COMPLETIONS {
            // A head push the receiver made (a word write) owes the peer a
            // kick if it waits for space: poll it here too.
            let rx_owes = match self.rx.try_lock() {
                Some(mut rx) => rx.as_mut().is_some_and(|rx| {
                    if let Err(e) = rx.poll() {
                        self.note_wire_failure(&e);
                    }
                    W::words_pending(rx.transport_mut())
                }),
                None => true,
            };
            if rx_owes || self.dirty.load(Ordering::Acquire) {
                self.mark_dirty();
            } else if self.settle_owed.swap(false, Ordering::AcqRel) {
                self.wake_if_ready();
            }
            self.lose_wire();
        }
        true
    }

    /// Flushes with the sender locked; pays a deferred end-of-stream mark.
    pub fn flush_locked(&self, tx: &mut TxSlot<W>) {
        self.dirty.store(false, Ordering::Release);
        if self.mode() == MODE_TCP {
            return;
        }
        let Some(tx) = tx.as_mut() else {
            return;
        };
        if let Err(e) = tx.flush() {
            if self.note_wire_failure(&e) {
                return;
            }
            if e != RingError::Closed {
                log::debug!("flush: {e:?}");
            }
        }
        if self.eos_owed.load(Ordering::Acquire) {
            match tx.close() {
                Ok(()) => self.eos_owed.store(false, Ordering::Release),
                Err(RingError::WouldBlock) => {}
                Err(_) => self.eos_owed.store(false, Ordering::Release),
            }
        }
        let mut owed = false;
        if W::REAPS_COMPLETIONS {
            // The tail WRITE completes later: until it is reported, the
            // check for a sleeping peer has not run, so keep polling.
            let _ = tx.poll();
            owed = W::words_pending(tx.transport_mut());
        }
        if owed || tx.has_unflushed() || self.eos_owed.load(Ordering::Acquire) {
            self.mark_dirty();
        }
    }

    pub fn mark_dirty(&self) {
        if !self.dirty.swap(true, Ordering::AcqRel) {
            if let Some(me) = self.this() {
                background::queue_flush(me);
            }
        }
    }
}
