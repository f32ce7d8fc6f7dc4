//! Leaving the ring mid-stream for the kernel socket underneath.
//!
//! A side whose connection must go on where the ring cannot follow (its
//! descriptor goes to another process, an exec, urgent data) *leaves*: it
//! publishes everything it wrote, then sends on the kernel socket, before
//! any byte of its own, a header naming two stream positions:
//! * `consumed`: the bytes of the peer's stream it took from the ring,
//!   exactly. The peer takes back everything it wrote past that point and
//!   sends it on the kernel socket first (`Sender::take_after`).
//! * `end`: the bytes of its own stream it put into the ring. The peer
//!   reads the ring up to there, then the kernel socket after the header
//!   (`Receiver::drain_to`).
//!
//! So each direction switches at one byte offset both ends agree on, and
//! the leaver's successor (which may not load the shim at all) reads and
//! writes plain TCP. The peer acknowledges by closing its end of the
//! leaver's ring once it drained it (the `rx_closed` word the leaver's
//! sender sees); the leaver waits for that, a bounded time, before it
//! hands the descriptor on, so that no header of the peer's can reach the
//! successor. If both sides leave at once, each sees the other's header
//! while it waits: each then resends from the other's `consumed`, and
//! neither drains (neither will read the ring again).
//!
//! A wire that fails (a verbs error: the queue pair is in error, and what
//! it carried last may not have landed) is left the same way, since kernel
//! TCP would carry on: the side that sees the failure sends a header whose
//! `end` is `LOST` and waits for the peer's own header; the peer takes
//! what its ring holds readable, reads nothing more of it and answers with
//! its position. Each side then resends from the other's `consumed`, as
//! when both leave at once.
//!
//! A side that goes on reading in the same process (not a hand-over, no
//! other process sharing the ring) first takes what its ring holds
//! readable into `rx_spill` and counts it in `consumed`: bytes the program
//! could see (a peek, a readiness look) stay readable across the leave.

use std::sync::atomic::Ordering;

use ringsock_ring::Receiver;

use super::lock::OpGuard;
use super::tcp::poll_one_for;
use super::{RingConn, RxSlot, TxSlot, Wire, MODE_PENDING, MODE_RING, MODE_TCP};
use crate::attached::Errno;
use crate::ring::sockio::{lock, send_all_bounded, sys_recv};
use crate::sys;

/// Longest a partial header may wait for the rest of itself.
const HEADER_WAIT_NS: u64 = 1_000_000_000;

/// Bytes of a leave header.
pub const HEADER_BYTES: usize = 24;
const MAGIC: &[u8; 8] = b"RSLEAVE1";
/// The `end` of a header sent because the wire failed: the leaver cannot
/// tell what of its stream reached the peer's ring.
pub const LOST: u64 = u64::MAX;

/// A leave header: the leaver's exact positions in both streams.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Leave {
    /// Bytes of the peer's stream the leaver consumed.
    pub consumed: u64,
    /// Bytes of the leaver's stream that went into the ring.
    pub end: u64,
}

/// What the start of the kernel socket's unread bytes says.
#[derive(Debug, PartialEq, Eq)]
pub enum Parsed {
    Leave(Leave),
    /// A prefix of a header: more is on its way.
    Partial,
    /// Not a header: something is badly wrong with this connection.
    Garbage,
}

impl Leave {
    pub fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut b = [0u8; HEADER_BYTES];
        b[..8].copy_from_slice(MAGIC);
        b[8..16].copy_from_slice(&self.consumed.to_le_bytes());
        b[16..].copy_from_slice(&self.end.to_le_bytes());
        b
    }

    /// Parses what a peek at the kernel socket returned.
    pub fn parse(bytes: &[u8]) -> Parsed {
        let magic = &MAGIC[..bytes.len().min(MAGIC.len())];
        if !bytes.starts_with(magic) {
            return Parsed::Garbage;
        }
        if bytes.len() < HEADER_BYTES {
            return Parsed::Partial;
        }
        let word = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
        Parsed::Leave(Leave {
            consumed: word(8),
            end: word(16),
        })
    }
}

fn limit_ns() -> u64 {
    u64::from(crate::config::get().connect_timeout_ms) * 1_000_000
}

impl<W: Wire> RingConn<W> {
    /// Leaves the ring for the kernel socket (see the module docs). Called
    /// by the process that uses the connection, before the descriptor goes
    /// where the ring cannot follow; `hand_over` waits for the peer's
    /// acknowledgement (bounded by RINGSOCK_CONNECT_TIMEOUT_MS), else the
    /// kernel socket path settles it when it next reads.
    pub fn leave(&self, hand_over: bool) {
        if self.mode() == MODE_PENDING {
            W::await_decision(self, false);
        }
        // A header of the peer's that is already here makes us the side
        // that stays: then there is nothing left to do.
        self.check_tcp();
        if self.mode() != MODE_RING || self.peer_gone() {
            if self.mode() == MODE_RING {
                log::debug!("{}: not leaving a ring whose peer is gone", self.ends());
            }
            return;
        }
        let fd = self.tcp_fd();
        let mut tx = self.tx.lock();
        let mut rx = self.rx.lock();
        if self.mode() != MODE_RING {
            return;
        }
        // Every process holding a shared side follows (`share`).
        let shared = match self.enter_shared(Some(&mut tx)) {
            super::fork::Entered::Alone => None,
            super::fork::Entered::Shared(s) => Some(s),
            super::fork::Entered::Left => return,
        };
        if let Some(s) = &shared {
            s.left.store(1, Ordering::Release);
            s.unlock();
        }
        self.flush_locked(&mut tx);
        if !self.settle_locked(&mut tx, &mut rx, limit_ns()) {
            log::warn!(
                "{}: leaving the ring before its last writes were acknowledged",
                self.ends()
            );
        }
        let (Some(t), Some(r)) = (tx.as_mut(), rx.as_mut()) else {
            return;
        };
        if !hand_over && shared.is_none() {
            self.keep_readable(r);
        }
        let header = Leave {
            consumed: r.bytes_consumed(),
            end: t.bytes_written(),
        };
        let shut = t.is_closed() || self.eos_owed.swap(false, Ordering::AcqRel);
        self.leaving.store(true, Ordering::Release);
        // Other threads wait for the locks we hold, and see the mode
        // change only after the header is out: no plain byte can pass it.
        let sent = send_all_bounded(fd, &header.encode());
        self.mode.store(MODE_TCP, Ordering::Release);
        if let Err(Errno(e)) = sent {
            log::error!(
                "{}: cannot send the leave header (errno {e}); the connection is reset",
                self.ends()
            );
            self.leaving.store(false, Ordering::Release);
            drop(rx);
            drop(tx);
            self.fail_hard(libc::ECONNRESET);
            return;
        }
        if shut {
            // SAFETY: shutdown on our own duplicate of the socket.
            unsafe { crate::sys::sys_call!(libc::SYS_shutdown, fd, libc::SHUT_WR) };
        }
        log::info!(
            "{}: left the ring at {} bytes in, {} out",
            self.ends(),
            header.consumed,
            header.end
        );
        drop(rx);
        drop(tx);
        super::super::watch::unwatch(self, fd);
        // The program's next bytes go on the socket: a header the peer
        // sent at the same moment must be answered (`crossed`) before them.
        if self.await_ack(None) || hand_over {
            self.leaving.store(false, Ordering::Release);
        }
        self.wire.ring_own_bell();
    }

    /// While `leaving`: whether the peer's answer is settled (its
    /// acknowledgement, plain bytes after it, or its own header, which is
    /// taken here), so that the kernel socket carries only the stream.
    pub(super) fn leaving_settled(&self) -> bool {
        if !self.leaving.load(Ordering::Acquire) {
            return true;
        }
        // (The sender's guard ends with this statement: `crossed` below
        // takes the lock again.) A failed wire carries no acknowledgement.
        let acked = !self.lost_pending.load(Ordering::Acquire)
            && self.tx.lock().as_ref().is_none_or(|tx| tx.peer_closed());
        let settled = acked
            || {
                let fd = self.tcp_fd();
                let mut b = [0u8; HEADER_BYTES];
                match sys_recv(fd, &mut b, libc::MSG_PEEK) {
                    Ok(n) if n > 0 => match Leave::parse(&b[..n]) {
                        Parsed::Leave(l) => {
                            let _ = sys_recv(fd, &mut b, 0);
                            self.crossed(l, None, sys::monotonic_ns() + limit_ns());
                            if self.lost_pending.load(Ordering::Acquire) {
                                log::warn!(
                                "{}: the peer answered our leave late; the connection goes on over TCP from byte {} out",
                                self.ends(),
                                l.consumed
                            );
                            }
                            true
                        }
                        Parsed::Garbage => true,
                        Parsed::Partial => false,
                    },
                    Err(Errno(libc::EAGAIN)) => false,
                    _ => true,
                }
            };
        if settled {
            self.lost_pending.store(false, Ordering::Release);
            self.leaving.store(false, Ordering::Release);
        }
        settled
    }

    /// `leaving_settled` until true or `deadline_ns`, waiting for the
    /// peer's answer on the socket.
    pub(super) fn settle_leaving_until(&self, deadline_ns: u64) -> bool {
        loop {
            if self.leaving_settled() {
                return true;
            }
            if sys::monotonic_ns() >= deadline_ns {
                return false;
            }
            poll_one_for(self.tcp_fd(), libc::POLLIN, 10);
        }
    }

    /// After our header went out: waits for the peer to close its end of
    /// our ring (it drained it and will send only plain bytes), or for its
    /// own header (it left at the same moment), or for its end. `held`:
    /// the sender slot when the caller holds its lock, else the slot is
    /// only ever tried (a caller may hold the receiver's lock, which comes
    /// after the sender's), never waited for. False when the wait ended
    /// without an answer.
    pub(super) fn await_ack(&self, mut held: Option<&mut TxSlot<W>>) -> bool {
        let fd = self.tcp_fd();
        let deadline = sys::monotonic_ns() + limit_ns();
        loop {
            let acked = self.with_tx(&mut held, |tx| {
                tx.as_ref().is_none_or(|tx| tx.peer_closed())
            });
            if acked == Some(true) {
                return true;
            }
            let mut b = [0u8; HEADER_BYTES];
            match sys_recv(fd, &mut b, libc::MSG_PEEK) {
                // The peer closed or reset: nobody will send a header.
                Ok(0) => return true,
                Ok(n) => match Leave::parse(&b[..n]) {
                    Parsed::Leave(l) => {
                        let _ = sys_recv(fd, &mut b, 0);
                        self.crossed(l, held, deadline);
                        return true;
                    }
                    // Plain bytes: the peer stays, and they are ours.
                    Parsed::Garbage => return true,
                    Parsed::Partial => {}
                },
                Err(Errno(libc::EAGAIN)) => {}
                // A reset: nobody will send a header either.
                Err(_) => return true,
            }
            if sys::monotonic_ns() >= deadline {
                log::warn!(
                    "{}: the peer did not acknowledge our leaving in time",
                    self.ends()
                );
                return false;
            }
            poll_one_for(fd, libc::POLLIN, 1);
        }
    }

    /// `f` on the sender slot: `held` where the caller holds it, else the
    /// slot if its lock is free now (None if not).
    fn with_tx<R>(
        &self,
        held: &mut Option<&mut TxSlot<W>>,
        f: impl FnOnce(&mut TxSlot<W>) -> R,
    ) -> Option<R> {
        match held {
            Some(tx) => Some(f(tx)),
            None => self.tx.try_lock().map(|mut g| f(&mut g)),
        }
    }

    /// Both sides left at once: each resends from the other's position,
    /// and neither reads the ring again. The sender slot is tried until
    /// `deadline` (see `await_ack`); a leave it cannot finish exactly
    /// resets the connection.
    fn crossed(&self, l: Leave, mut held: Option<&mut TxSlot<W>>, deadline: u64) {
        let taken = loop {
            if let Some(t) = self.with_tx(&mut held, |tx| {
                tx.as_mut().map(|t| t.take_after(l.consumed))
            }) {
                break t;
            }
            if sys::monotonic_ns() >= deadline {
                self.left_broken(&ringsock_ring::RingError::WouldBlock, None);
                return;
            }
            std::thread::yield_now();
        };
        let taken = match taken {
            Some(Ok(t)) => t,
            Some(Err(e)) => {
                self.left_broken(&e, None);
                return;
            }
            None => return,
        };
        log::info!(
            "{}: both sides left the ring; {} bytes go again on the socket",
            self.ends(),
            taken.bytes.len()
        );
        self.spill_tx(taken.bytes, taken.eos);
        self.push_tx_spill_until(sys::monotonic_ns() + limit_ns());
    }

    /// Bytes at the start of the kernel socket of a ring connection: a
    /// leave header (or its first part), else garbage. Looked at again
    /// under both ring locks: threads that saw the same bytes (the
    /// program's and the background thread's) act on them once, and none
    /// takes what follows a header another consumed for garbage.
    pub(super) fn header_arrived(&self) {
        let tx = self.tx.lock();
        let rx = self.rx.lock();
        if self.mode() != MODE_RING {
            return;
        }
        let fd = self.tcp_fd();
        let mut b = [0u8; HEADER_BYTES];
        let n = match sys_recv(fd, &mut b, libc::MSG_PEEK) {
            Ok(n) if n > 0 => n,
            _ => return,
        };
        match Leave::parse(&b[..n]) {
            Parsed::Leave(l) => {
                if sys_recv(fd, &mut b, 0) != Ok(HEADER_BYTES) {
                    drop(rx);
                    drop(tx);
                    self.fail_hard(libc::ECONNRESET);
                    return;
                }
                self.header_since.store(0, Ordering::Release);
                self.stay(l, tx, rx);
            }
            Parsed::Partial => {
                let now = sys::monotonic_ns();
                let since = self.header_since.load(Ordering::Acquire);
                if since == 0 {
                    self.header_since.store(now, Ordering::Release);
                } else if now - since > HEADER_WAIT_NS {
                    drop(rx);
                    drop(tx);
                    log::error!(
                        "{}: an incomplete leave header on the socket; resetting",
                        self.ends()
                    );
                    self.fail_hard(libc::ECONNRESET);
                }
            }
            Parsed::Garbage => {
                drop(rx);
                drop(tx);
                log::error!(
                    "{}: unexpected TCP data on a ring connection; resetting it",
                    self.ends()
                );
                self.fail_hard(libc::ECONNRESET);
            }
        }
    }

    /// The peer left: read its ring to where it ended, acknowledge by
    /// closing our end of it, and send again on the socket what it did not
    /// take from ours. From here every call goes to the kernel socket.
    fn stay(&self, l: Leave, mut tx: OpGuard<'_, TxSlot<W>>, mut rx: OpGuard<'_, RxSlot<W>>) {
        let mut alone = true;
        if let super::fork::Entered::Shared(s) = self.enter_shared(Some(&mut tx)) {
            // Every process holding a shared side follows (`share`).
            s.left.store(1, Ordering::Release);
            s.unlock();
            alone = false;
        }
        if l.end == LOST {
            if alone {
                if let Some(r) = rx.as_mut() {
                    self.keep_readable(r);
                }
            }
            self.answer_lost(l, tx, rx);
            return;
        }
        let mut drained = Vec::new();
        if let Some(r) = rx.as_mut() {
            let deadline = sys::monotonic_ns() + limit_ns();
            let mut wait = ringsock_ring::sleep::backoff::CompletionWait::new();
            loop {
                match r.drain_to(l.end, &mut drained) {
                    Ok(true) => break,
                    Ok(false) if sys::monotonic_ns() < deadline => {
                        let _ = r.poll();
                        wait.relax();
                    }
                    Ok(false) => {
                        lock(&self.rx_spill).extend(drained);
                        self.salvage(r);
                        self.left_broken(&ringsock_ring::RingError::WouldBlock, None);
                        drop(rx);
                        drop(tx);
                        return;
                    }
                    Err(e) => {
                        lock(&self.rx_spill).extend(drained);
                        self.salvage(r);
                        self.left_broken(&e, None);
                        drop(rx);
                        drop(tx);
                        return;
                    }
                }
            }
            let _ = r.close();
        }
        lock(&self.rx_spill).extend(drained);
        let taken = match tx.as_mut().map(|t| t.take_after(l.consumed)) {
            Some(Ok(t)) => t,
            Some(Err(e)) => {
                self.left_broken(&e, None);
                drop(rx);
                drop(tx);
                return;
            }
            None => Default::default(),
        };
        let resent = taken.bytes.len();
        self.spill_tx(taken.bytes, taken.eos || self.wr_shut());
        self.mode.store(MODE_TCP, Ordering::Release);
        super::super::watch::unwatch(self, self.tcp_fd());
        // The acknowledgement (our end of its ring closed) must land.
        let _ = self.settle_locked(&mut tx, &mut rx, limit_ns());
        drop(rx);
        drop(tx);
        log::info!(
            "{}: the peer left the ring (its stream ended at byte {}, ours was read to {}); {resent} bytes go again on the socket",
            self.ends(),
            l.end,
            l.consumed
        );
        self.push_tx_spill();
        self.wire.ring_own_bell();
    }

    /// The peer's wire failed (its header's `end` is `LOST`): read nothing
    /// more of its ring, tell it where we stopped, and resend from where it
    /// stopped; from here every call goes to the kernel socket.
    fn answer_lost(&self, l: Leave, tx: OpGuard<'_, TxSlot<W>>, mut rx: OpGuard<'_, RxSlot<W>>) {
        let Some(consumed) = rx.as_ref().map(|r| r.bytes_consumed()) else {
            self.left_broken(&ringsock_ring::RingError::Closed, None);
            drop(rx);
            drop(tx);
            return;
        };
        let header = Leave {
            consumed,
            end: LOST,
        };
        // Ours goes before any byte we resend.
        if let Err(Errno(e)) = send_all_bounded(self.tcp_fd(), &header.encode()) {
            self.left_broken(&ringsock_ring::RingError::Os(e), Some(&mut rx));
            drop(rx);
            drop(tx);
            return;
        }
        self.resend_after(l.consumed, consumed, "the peer's ring wire failed", tx, rx);
    }

    /// The end of a leave without draining (the wire failed): takes back
    /// everything past the peer's `consumed`, sends it on the kernel socket
    /// ahead of anything else, and switches to it, logging `why` with both
    /// positions (`ours`: what we consumed). A leave that cannot be exact
    /// resets instead.
    fn resend_after(
        &self,
        consumed: u64,
        ours: u64,
        why: &str,
        mut tx: OpGuard<'_, TxSlot<W>>,
        mut rx: OpGuard<'_, RxSlot<W>>,
    ) {
        let taken = match tx.as_mut().map(|t| t.take_after(consumed)) {
            Some(Ok(t)) => t,
            Some(Err(e)) => {
                self.left_broken(&e, Some(&mut rx));
                drop(rx);
                drop(tx);
                return;
            }
            None => Default::default(),
        };
        let resent = taken.bytes.len();
        self.spill_tx(taken.bytes, taken.eos || self.wr_shut());
        self.mode.store(MODE_TCP, Ordering::Release);
        super::super::watch::unwatch(self, self.tcp_fd());
        drop(rx);
        drop(tx);
        self.push_tx_spill();
        self.wire.ring_own_bell();
        log::warn!(
            "{}: {why}; the connection goes on over TCP from byte {ours} in, {consumed} out ({resent} bytes again)",
            self.ends()
        );
    }

    /// Our wire failed (`e`): the connection leaves the ring for the kernel
    /// socket without it (module docs). Both sides stay locked until the
    /// peer's header is here, so that no byte of ours reaches the socket
    /// before what must be resent, and no more of the peer's ring is read
    /// than what was readable when ours went out; other threads wait for
    /// that, a bounded time.
    pub(super) fn wire_lost(&self, e: &ringsock_ring::RingError) {
        let fd = self.tcp_fd();
        let mut tx = self.tx.lock();
        let mut rx = self.rx.lock();
        if self.mode() != MODE_RING || self.peer_gone() || fd < 0 {
            return;
        }
        match self.enter_shared(Some(&mut tx)) {
            super::fork::Entered::Alone => {}
            super::fork::Entered::Shared(s) => {
                // Another process holds the ring too and cannot follow.
                s.unlock();
                self.left_broken(e, None);
                drop(rx);
                drop(tx);
                return;
            }
            super::fork::Entered::Left => return,
        }
        if self.lost_sent.swap(true, Ordering::AcqRel) {
            // An earlier leave sent ours and ended without leaving the ring
            // (the peer's end was gone).
            return;
        }
        let kept = rx.as_mut().is_some_and(|r| {
            let before = r.bytes_consumed();
            self.keep_readable(r);
            r.bytes_consumed() != before
        });
        let Some(consumed) = rx.as_ref().map(|r| r.bytes_consumed()) else {
            self.left_broken(e, None);
            drop(rx);
            drop(tx);
            return;
        };
        let header = Leave {
            consumed,
            end: LOST,
        };
        if send_all_bounded(fd, &header.encode()).is_err() {
            self.left_broken(e, Some(&mut rx));
            drop(rx);
            drop(tx);
            return;
        }
        let deadline = sys::monotonic_ns() + limit_ns();
        let peer = loop {
            let mut b = [0u8; HEADER_BYTES];
            match sys_recv(fd, &mut b, libc::MSG_PEEK) {
                Ok(n) if n > 0 => match Leave::parse(&b[..n]) {
                    Parsed::Leave(l) => {
                        let _ = sys_recv(fd, &mut b, 0);
                        break Some(l);
                    }
                    Parsed::Garbage => break None,
                    Parsed::Partial => {}
                },
                // The peer's end is gone: what it wrote is in the ring or
                // lost with it, as its death shows (`check_tcp` below).
                // Bytes already kept are read from `rx_spill`, so the rest
                // joins them there and the socket's end of stream follows.
                Ok(_) if kept => {
                    if let Some(r) = rx.as_mut() {
                        self.keep_readable(r);
                    }
                    self.mode.store(MODE_TCP, Ordering::Release);
                    super::super::watch::unwatch(self, fd);
                    drop(rx);
                    drop(tx);
                    self.wire.ring_own_bell();
                    return;
                }
                Ok(_) => {
                    drop(rx);
                    drop(tx);
                    self.check_tcp();
                    return;
                }
                Err(Errno(libc::EAGAIN)) => {}
                Err(_) => break None,
            }
            if sys::monotonic_ns() >= deadline {
                // The peer is slow to answer (stopped, descheduled): the
                // connection waits for it on the socket, as TCP waits for
                // a stalled peer, its sends and reads held back until the
                // answer comes (`leaving_settled`).
                self.lost_pending.store(true, Ordering::Release);
                self.leaving.store(true, Ordering::Release);
                self.mode.store(MODE_TCP, Ordering::Release);
                super::super::watch::unwatch(self, fd);
                drop(rx);
                drop(tx);
                log::warn!(
                    "{}: the ring's wire failed ({e}); the peer has not answered yet, the connection waits for it on TCP",
                    self.ends()
                );
                self.wire.ring_own_bell();
                return;
            }
            poll_one_for(fd, libc::POLLIN, 1);
        };
        let Some(l) = peer else {
            self.left_broken(e, Some(&mut rx));
            drop(rx);
            drop(tx);
            return;
        };
        let why = format!("the ring's wire failed ({e})");
        self.resend_after(l.consumed, consumed, &why, tx, rx);
    }

    /// Takes what the ring holds readable now into `rx_spill` (the leave's
    /// `consumed` then counts it): bytes a peek or a readiness look showed
    /// stay readable across the leave, as the kernel keeps what arrived.
    /// Only for a side no other process shares, whose program reads next.
    fn keep_readable(&self, r: &mut Receiver<W::Transport>) {
        let mut kept = Vec::new();
        let mut chunk = [0u8; 16 * 1024];
        while let Ok(n @ 1..) = r.read(&mut chunk) {
            kept.extend_from_slice(&chunk[..n]);
        }
        if !kept.is_empty() {
            lock(&self.rx_spill).extend(kept);
        }
    }

    /// What the peer's ring holds that we have not read, kept for the
    /// program ahead of the reset: a prefix of the peer's stream, which
    /// TCP too delivers before the error. Nothing where the ring fails.
    fn salvage(&self, r: &mut Receiver<W::Transport>) {
        let Ok(n) = r.available() else {
            return;
        };
        let mut b = vec![0u8; n];
        if let Ok(k) = r.peek(&mut b) {
            b.truncate(k);
            lock(&self.rx_spill).extend(b);
        }
    }

    /// A leave that cannot be carried out exactly: the connection is
    /// reset, never continued with bytes lost or repeated; what `rx` (the
    /// receiver, where the caller holds it) has unread is read first.
    /// Called with the ring ends still locked where the caller holds them:
    /// a thread waiting for those locks must find the connection off the
    /// ring, or it would start a leave of its own, whose second header the
    /// peer reads as stream data once it is on the socket.
    fn left_broken(&self, e: &ringsock_ring::RingError, rx: Option<&mut RxSlot<W>>) {
        if let Some(r) = rx.and_then(|rx| rx.as_mut()) {
            self.salvage(r);
        }
        log::error!(
            "{}: the ring cannot be left exactly ({e}); the connection is reset",
            self.ends()
        );
        self.mode.store(MODE_TCP, Ordering::Release);
        self.fail_hard(libc::ECONNRESET);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_and_prefixes_wait() {
        let l = Leave {
            consumed: 7,
            end: u64::MAX - 3,
        };
        let b = l.encode();
        assert_eq!(Leave::parse(&b), Parsed::Leave(l));
        for n in 0..HEADER_BYTES {
            assert_eq!(Leave::parse(&b[..n]), Parsed::Partial, "prefix {n}");
        }
        assert_eq!(Leave::parse(b"GET / HTTP/1.1\r\n"), Parsed::Garbage);
        assert_eq!(Leave::parse(b"RSLEAVE2"), Parsed::Garbage);
    }
}
