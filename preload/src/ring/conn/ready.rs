//! Readiness on the ring (or while pending), as TCP's poll computes it,
//! and the event count from the ring ends where the wire keeps none.

use std::sync::atomic::Ordering;

use super::{RingConn, Wire, MODE_PENDING, MODE_TCP};
use crate::attached::Ready;
use crate::ring::sockio::poll_one;

impl<W: Wire> RingConn<W> {
    /// Readiness while on the ring (or pending), as TCP's poll computes it,
    /// for a waiter that wants `interest`: exact for `interest`, ERR and
    /// HUP; the other bits may be missing. A side that is not asked about
    /// is not locked: the receive side matters to reading interest, and to
    /// HUP once the sending side is shut; the sending side to writing
    /// interest, and on a wire that reaps completions on every look.
    pub(super) fn ring_readiness(&self, interest: Ready) -> Ready {
        self.ring_readiness_needing(interest, self.rcvlowat.load(Ordering::Relaxed))
    }

    /// `ring_readiness` for a reader that needs `need` bytes (SO_RCVLOWAT,
    /// or a peek for more than is there): readable from `need` bytes on.
    pub(super) fn ring_readiness_needing(&self, interest: Ready, need: usize) -> Ready {
        if self.wire_failed.load(Ordering::Relaxed) {
            // The next send or receive leaves the ring (`lose_wire`).
            return Ready(interest.0 & (Ready::IN.0 | Ready::OUT.0));
        }
        let gone = self.peer_gone();
        let reset = self.reset.load(Ordering::Acquire);
        let snd_shut = reset || self.wr_shut.load(Ordering::Acquire);
        let look_rx = interest.intersects(Ready::INPUT) || snd_shut;
        let look_tx = interest.intersects(Ready::OUTPUT) || W::REAPS_COMPLETIONS;
        let (data, fin) = if !look_rx {
            (false, false)
        } else {
            let mut rx = self.rx.lock();
            match rx.as_mut() {
                Some(rx) => {
                    if need <= 1 {
                        match rx.readable() {
                            // The ring holds no record, so no end-of-stream
                            // mark either: this look at the tail is the
                            // snapshot.
                            Ok(false) => (false, false),
                            // IN is set either way: the mark matters only
                            // to RDHUP, and to HUP once we shut sending.
                            Ok(true) if !interest.intersects(Ready::RDHUP) && !snd_shut => {
                                (true, false)
                            }
                            Ok(true) => (true, rx.eos_published().unwrap_or(true)),
                            Err(e) => (
                                !self.note_wire_failure(&e),
                                rx.eos_published().unwrap_or(true),
                            ),
                        }
                    } else {
                        let data = rx.available().map_or(true, |n| n >= need);
                        (data, rx.eos_published().unwrap_or(true))
                    }
                }
                None => (false, false),
            }
        };
        let rcv_shut = fin || gone || reset || self.rd_shut.load(Ordering::Acquire);
        let mut r = Ready::NONE;
        if data || rcv_shut {
            r = r | Ready::IN;
        }
        if rcv_shut {
            r = r | Ready::RDHUP;
        }
        let writable = if !look_tx {
            false
        } else if self.mode() == MODE_PENDING {
            W::pending_room(self) > 0 && self.tcp_connected()
        } else {
            match self.tx.lock().as_mut() {
                Some(tx) => {
                    // Reaping on every look, whatever the interest: a tail
                    // WRITE that completed may owe the peer its doorbell
                    // (it began to sleep after the WRITE was posted), and
                    // left to this end's own arming the doorbell would
                    // wait out our spin while the peer oversleeps.
                    if W::REAPS_COMPLETIONS {
                        if let Err(e) = tx.poll() {
                            self.note_wire_failure(&e);
                        }
                    }
                    !matches!(tx.write_space(), Ok(false))
                }
                None => true,
            }
        };
        if self.wire_failed.load(Ordering::Relaxed) {
            // A look above found the wire failed.
            return Ready(interest.0 & (Ready::IN.0 | Ready::OUT.0));
        }
        if snd_shut || gone || writable {
            r = r | Ready::OUT;
        }
        if rcv_shut && snd_shut {
            r = r | Ready::HUP;
        }
        if self.error.load(Ordering::Acquire) != 0 {
            r = r | Ready::ERR;
        }
        if gone && !reset {
            // After the peer's close our sends go on the kernel socket,
            // and the reset that answers them arrives there.
            let k = poll_one(self.tcp_fd(), 0);
            if k & libc::POLLERR != 0 {
                r = r | Ready::ERR;
            }
            if k & libc::POLLHUP != 0 {
                r = r | Ready::HUP;
            }
        }
        r
    }

    /// `readiness_for(interest)` for a reader that needs `need` bytes.
    pub(super) fn readiness_needing_for(&self, interest: Ready, need: usize) -> Ready {
        match self.settle() {
            MODE_TCP => self.tcp_readiness_needing(need),
            _ => self.ring_readiness_needing(interest, need),
        }
    }

    /// `event_seq` from the ring ends themselves, where the wire keeps no
    /// cheaper count: the stream position the peer's bytes reached (bytes
    /// consumed plus readable) and the head it handed back, both only
    /// growing, so their sum changes with every arrival of data or space.
    pub(super) fn ring_seq(&self) -> u64 {
        let tx = self.tx.lock();
        let mut rx = self.rx.lock();
        let head = tx.as_ref().map_or(0, |t| t.head_seen());
        let arrived = rx.as_mut().map_or(0, |r| {
            r.bytes_consumed() + r.available().unwrap_or(0) as u64
        });
        arrived.wrapping_add(head)
    }
}
