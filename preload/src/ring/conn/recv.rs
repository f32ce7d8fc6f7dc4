//! Receiving from the ring: reads and peeks, the quiet look of a blocking
//! read's spin, and what an empty or failed ring read means (EAGAIN, EOF
//! or the peer's error).

use std::io::IoSliceMut;
use std::sync::atomic::Ordering;

use ringsock_ring::RingError;

use super::fork;
use super::lock::OpGuard;
#[cfg(test)]
use super::seam;
use super::{RingConn, RxSlot, Wire, MODE_PENDING, MODE_RING, MODE_TCP};
use crate::attached::{Errno, Look};
use crate::ring::sockio;

impl<W: Wire> RingConn<W> {
    /// A ring read that found nothing: the pending error once the
    /// connection was reset, EOF once the peer is gone (its FIN came after
    /// everything it put in the ring) or this side shut reading, else
    /// EAGAIN.
    fn nothing_to_read(&self) -> Result<usize, Errno> {
        if self.peer_gone() || self.reset.load(Ordering::Acquire) {
            return sockio::take_recv_error(&self.error).map_or(Ok(0), |e| Err(Errno(e)));
        }
        if self.rd_shut.load(Ordering::Acquire) {
            return Ok(0);
        }
        Err(Errno(libc::EAGAIN))
    }

    /// `try_recv`, or with `quiet` a blocking read's look (`recv_look`):
    /// the same read under the receiver's lock, but a connection not
    /// plainly on its ring is `Unsure` before anything is read, and an
    /// empty ring is `Empty` without asking the kernel socket, or `Unsure`
    /// where a flag says a reader has more to see (`reader_news`).
    pub(super) fn recv_ring(&self, bufs: &mut [IoSliceMut<'_>], peek: bool, quiet: bool) -> Look {
        self.lose_wire();
        match self.settle() {
            MODE_RING => {}
            _ if quiet => return Look::Unsure,
            MODE_TCP => return Look::Done(self.tcp_recv(bufs, peek)),
            _ => {
                // Pending: nothing can be in our ring before the server
                // decided; TCP data would mean it declined without telling
                // us.
                self.check_tcp();
                if !W::DECISION_IN_SEGMENT
                    && self.peer_gone()
                    && !self.reset.load(Ordering::Acquire)
                    && self.mode() == MODE_PENDING
                {
                    // The server's FIN came ahead of its decision: learn
                    // the decision (one daemon round trip, bounded) before
                    // an empty answer may read as end of stream.
                    W::await_decision(self, false);
                }
                match self.settle() {
                    MODE_TCP => return Look::Done(self.tcp_recv(bufs, peek)),
                    MODE_PENDING => return Look::Done(self.nothing_to_read()),
                    _ => {}
                }
            }
        }
        // An empty ring is the peer's end of stream only if the peer was
        // known gone before we looked: its FIN follows everything it put in
        // the ring, so a FIN seen after the look may have bytes ahead of it.
        if quiet && W::REAPS_COMPLETIONS {
            // As every readiness look does (`ring_readiness`): a completed
            // tail WRITE may owe the peer its doorbell, which must not wait
            // for the end of our spin.
            if let Some(tx) = self.tx.lock().as_mut() {
                if let Err(e) = tx.poll() {
                    self.note_wire_failure(&e);
                }
            }
        }
        let gone_before = self.peer_gone();
        let mut guard = self.rx.lock();
        if self.mode() == MODE_TCP {
            // The peer left while we waited for the lock.
            return self.recv_left(guard, bufs, peek, quiet);
        }
        let shared = match self.enter_shared(None) {
            fork::Entered::Alone => None,
            fork::Entered::Shared(s) => Some(s),
            fork::Entered::Left => return self.recv_left(guard, bufs, peek, quiet),
        };
        let Some(rx) = guard.as_mut() else {
            if let Some(s) = shared {
                self.exit_shared(s, None, None);
            }
            return if quiet {
                Look::Unsure
            } else {
                Look::Done(Err(Errno(libc::EAGAIN)))
            };
        };
        if quiet && matches!(rx.readable(), Ok(false)) {
            // Nothing for the read: the look ends here (the spin's looks
            // are its waiter's delay in seeing the peer's bytes). A failed
            // ring is left to the read, which reports it.
            if let Some(s) = shared {
                self.exit_shared(s, Some(rx.bytes_consumed()), None);
            }
            drop(guard);
            return if gone_before || self.reader_news() {
                Look::Unsure
            } else {
                Look::Empty
            };
        }
        let mut total = 0;
        let mut outcome = None;
        let mut eof = false;
        let gathered = peek && bufs.iter().filter(|b| !b.is_empty()).count() > 1;
        if gathered {
            // A peek looks from the head every time: into several buffers
            // it goes through one gathered copy (no larger than the ring),
            // which fills them in turn as TCP's peek does.
            let room: usize = bufs.iter().map(|b| b.len()).sum();
            let ring = rx.config().slots as usize * rx.config().slot_size as usize;
            let mut whole = vec![0u8; room.min(ring)];
            match rx.peek(&mut whole) {
                Ok(0) => eof = true,
                Ok(n) => total = sockio::scatter(&whole[..n], bufs, 0),
                Err(RingError::WouldBlock) => {}
                Err(e) => outcome = Some(e),
            }
        }
        for b in bufs.iter_mut().filter(|b| !b.is_empty() && !gathered) {
            let r = if peek { rx.peek(b) } else { rx.read(b) };
            match r {
                Ok(0) => {
                    eof = true;
                    break;
                }
                Ok(n) => {
                    total += n;
                    if n < b.len() || peek {
                        break;
                    }
                }
                Err(RingError::WouldBlock) => break,
                Err(e) => {
                    if total == 0 {
                        outcome = Some(e);
                    }
                    break;
                }
            }
        }
        let mut owe = false;
        if W::REAPS_COMPLETIONS {
            // A head push made while reading completes later: the writer
            // may wait for that space, so its kick must not wait for our
            // next call.
            let _ = rx.poll();
            owe = W::words_pending(rx.transport_mut());
        }
        if let Some(s) = shared {
            self.exit_shared(s, Some(rx.bytes_consumed()), None);
        }
        drop(guard);
        if total > 0 && !peek {
            self.message.note_read();
        }
        if owe {
            self.mark_dirty();
        }
        if total > 0 {
            return Look::Done(Ok(total));
        }
        if eof {
            // The peer's FIN: a reset after it leaves its error to the
            // next send or SO_ERROR, as on TCP.
            return Look::Done(Ok(0));
        }
        match outcome {
            None if quiet => {
                if gone_before || self.reader_news() {
                    Look::Unsure
                } else {
                    Look::Empty
                }
            }
            None => {
                #[cfg(test)]
                seam::after_empty_look();
                if gone_before {
                    return Look::Done(self.nothing_to_read());
                }
                // The kernel socket may hold news the ring does not: the
                // peer's FIN or reset, or its leave header.
                self.check_tcp();
                if self.mode() == MODE_TCP {
                    return Look::Done(self.tcp_recv(bufs, peek));
                }
                if self.peer_gone() {
                    // Gone since we looked (seen here or by another
                    // thread): what it wrote before is in the ring now. The
                    // second look ends at `gone_before`.
                    return self.recv_ring(bufs, peek, false);
                }
                let r = self.nothing_to_read();
                if r == Err(Errno(libc::EAGAIN)) {
                    self.keep_waiters_armed(true);
                }
                Look::Done(r)
            }
            Some(e) => Look::Done(self.recv_failed(&e, bufs, peek)),
        }
    }

    /// `recv_ring` once the connection left the ring under it (the rx lock
    /// `guard` held, no shared operation entered).
    fn recv_left(
        &self,
        guard: OpGuard<'_, RxSlot<W>>,
        bufs: &mut [IoSliceMut<'_>],
        peek: bool,
        quiet: bool,
    ) -> Look {
        drop(guard);
        if quiet {
            return Look::Unsure;
        }
        Look::Done(self.tcp_recv(bufs, peek))
    }

    /// Whether a reader that found the ring empty has something else to
    /// see: the peer gone, a reset, our SHUT_RD, a pending error or a
    /// failed wire (what `ring_readiness` reports beyond the ring's data).
    /// Plain loads.
    #[inline]
    fn reader_news(&self) -> bool {
        self.peer_gone()
            || self.reset.load(Ordering::Acquire)
            || self.rd_shut.load(Ordering::Acquire)
            || self.error.load(Ordering::Acquire) != 0
            || self.wire_failed.load(Ordering::Relaxed)
    }

    /// `recv_ring` when the ring read failed with `e` before any byte.
    fn recv_failed(
        &self,
        e: &RingError,
        bufs: &mut [IoSliceMut<'_>],
        peek: bool,
    ) -> Result<usize, Errno> {
        let errno = self.ring_failed(e, "recv");
        if self.mode() == MODE_TCP {
            return self.tcp_recv(bufs, peek);
        }
        if errno == Errno(libc::EPIPE) {
            // The peer closed: what it sent is read, this is EOF, or its
            // reset where it reset.
            match self.nothing_to_read() {
                Err(Errno(libc::EAGAIN)) => Ok(0),
                r => r,
            }
        } else {
            Err(errno)
        }
    }
}
