//! Waiting: arming and disarming sleeping readers and writers (the ring's
//! flags, the waiter counts, who drains the doorbells), and the bell rung
//! again where a waiter may have missed what it waits for.

use std::sync::atomic::Ordering;

use super::{RingConn, Wire, MODE_TCP};
use crate::attached::{AttachedConn, Ready};
use crate::ring::sockio::lock;

impl<W: Wire> RingConn<W> {
    /// Arms a waiter for `interest`; a reader among them needs `need`
    /// bytes (SO_RCVLOWAT, a peek for more than is there): fewer bytes in
    /// the ring still let it sleep, and the peer's next tail wakes it.
    /// Returns the readiness seen after arming, for that need.
    pub(super) fn arm_inner(&self, interest: Ready, level: bool, need: usize) -> Ready {
        if !level && self.forked.load(Ordering::Acquire) {
            // An epoll set looks at the kernel socket whenever it fires in
            // its private set (`socket_fired`), so an edge arm need not.
            // Except on a side a fork shared: the other process may have
            // taken the edge from the set both hold, and not answered it
            // (it is not the side's user), so look now, as the ring side's
            // re-check does after prepare_wait. (Level waiters ppoll the
            // socket itself.)
            self.check_tcp();
        }
        if self.settle() == MODE_TCP {
            if level {
                lock(&self.waiters).level += 1;
            }
            return self.tcp_readiness_needing(need);
        }
        let mut w = lock(&self.waiters);
        W::before_arm(self, &w);
        if level {
            w.level += 1;
        }
        // Counts depend on `interest` alone, so that `disarm` undoes
        // exactly what this did even if the mode changed meanwhile. While
        // pending the server's decision rings our bell whatever the flags
        // say. A peer known gone announces nothing: readiness shows it
        // (read and write both end), and its queue pair may never report
        // a flag WRITE to it. A flag whose report does not come in time
        // (`prepare_wait`'s WouldBlock) leaves the sleep bounded by
        // `settle_words` and the waiter's re-check.
        let gone = self.peer_gone();
        if interest.intersects(Ready::INPUT) {
            w.rx += 1;
            if !gone {
                if let Some(rx) = self.rx.lock().as_mut() {
                    let _ = rx.prepare_wait_for(need);
                }
            }
        }
        if interest.intersects(Ready::OUTPUT) {
            w.tx += 1;
            if !gone {
                if let Some(tx) = self.tx.lock().as_mut() {
                    let _ = tx.prepare_wait();
                }
            }
        }
        drop(w);
        self.settle_words();
        self.readiness_needing_for(interest, need)
    }

    /// `rung`: a doorbell may have rung (else there is nothing to drain);
    /// `socket`: the kernel socket may have news (else no look at it).
    pub(super) fn disarm_inner(&self, interest: Ready, level: bool, rung: bool, socket: bool) {
        {
            let mut w = lock(&self.waiters);
            if level {
                w.level = w.level.saturating_sub(1);
            }
            if interest.intersects(Ready::INPUT) && w.rx > 0 {
                w.rx -= 1;
                if w.rx == 0 {
                    if let Some(rx) = self.rx.lock().as_mut() {
                        let _ = rx.finish_wait(true);
                    }
                }
            }
            if interest.intersects(Ready::OUTPUT) && w.tx > 0 {
                w.tx -= 1;
                if w.tx == 0 {
                    if let Some(tx) = self.tx.lock().as_mut() {
                        let _ = tx.finish_wait(true);
                    }
                }
            }
            // Only the last level-triggered waiter drains (so a later ppoll
            // does not wake for an old ring). Edge waiters never drain: the
            // kernel re-checks an eventfd before epoll reports it, so
            // draining before an epoll set has read its event would swallow
            // that set's wake-up. If edge arms remain after a drain and what
            // they wait for is already there, the ring that told them may
            // just have been drained: ring again.
            if rung && level && w.level == 0 && self.wire.drain_bells() && w.any_armed() {
                let r = self.readiness();
                let rx_ready =
                    w.rx > 0 && r.intersects(Ready::IN | Ready::RDHUP | Ready::HUP | Ready::ERR);
                let tx_ready = w.tx > 0 && r.intersects(Ready::OUT | Ready::HUP | Ready::ERR);
                if rx_ready || tx_ready {
                    self.wire.ring_own_bell();
                }
            }
        }
        if socket {
            self.check_tcp();
        }
        self.settle();
    }

    /// A call found the ring empty (`input`) or full while a waiter is
    /// armed for it: raises our flag now, as the kernel marks a socket
    /// whose call returned EAGAIN, so that the peer's next send (or read)
    /// rings us. The waiter may have armed while the ring still had data
    /// (or room), when no flag was needed, and the program emptied (or
    /// filled) it since without an epoll set looking again: an
    /// edge-triggered set would never hear of the next change.
    pub(super) fn keep_waiters_armed(&self, input: bool) {
        let w = lock(&self.waiters);
        let armed = if input { w.rx > 0 } else { w.tx > 0 };
        if !armed || self.peer_gone() {
            return;
        }
        let raised = if input {
            self.rx.lock().as_mut().map(|rx| rx.prepare_wait())
        } else {
            self.tx.lock().as_mut().map(|tx| tx.prepare_wait())
        };
        drop(w);
        self.settle_words();
        if let Some(Ok(false)) = raised {
            // Data (or room) came meanwhile: the waiter looks again.
            self.wire.ring_own_bell();
        }
    }

    /// Rings our own bell if a waiter is armed for what readiness now
    /// shows: the look a sleeper took while its flag write was unreported
    /// may have missed bytes or space the peer, not seeing the flag yet,
    /// announced to no one.
    pub(super) fn wake_if_ready(&self) {
        let armed = {
            let w = lock(&self.waiters);
            (w.rx > 0, w.tx > 0)
        };
        if armed == (false, false) {
            return;
        }
        let r = self.readiness();
        let rx_ready = armed.0 && r.intersects(Ready::IN | Ready::RDHUP | Ready::HUP | Ready::ERR);
        let tx_ready = armed.1 && r.intersects(Ready::OUT | Ready::HUP | Ready::ERR);
        if rx_ready || tx_ready {
            self.wire.ring_own_bell();
        }
    }
}
