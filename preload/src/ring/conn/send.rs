//! Sending on the ring: a write into the sender's slots, on the ring or
//! while pending, and a send once the peer process is gone.

use std::io::IoSlice;
use std::sync::atomic::Ordering;

use ringsock_ring::RingError;

use super::fork;
use super::{RingConn, Wire, MODE_TCP};
use crate::attached::{AttachedConn, Errno};
use crate::ring::sockio;

impl<W: Wire> RingConn<W> {
    /// Writes up to `budget` bytes of `bufs` into the ring, seen in mode
    /// `seen` (Pending or Ring); a call that finds the mode changed under
    /// the sender's lock starts over (a fall-back or a leave moves the
    /// bytes while it holds that lock).
    pub fn send_into_ring(
        &self,
        bufs: &[IoSlice<'_>],
        budget: usize,
        seen: u8,
    ) -> Result<usize, Errno> {
        let mut guard = self.tx.lock();
        if self.mode() != seen {
            drop(guard);
            return self.try_send(bufs);
        }
        let shared = match self.enter_shared(Some(&mut guard)) {
            fork::Entered::Alone => None,
            fork::Entered::Shared(s) => Some(s),
            fork::Entered::Left => {
                drop(guard);
                return self.try_send(bufs);
            }
        };
        let Some(tx) = guard.as_mut() else {
            if let Some(s) = shared {
                self.exit_shared(s, None, None);
            }
            return Err(Errno(libc::EAGAIN));
        };
        // On a shared side every byte is published within the operation,
        // so the positions it leaves are the ring's.
        let starts = self.message.starts_message() || shared.is_some();
        if starts {
            tx.end_stream();
        }
        let mut total = 0;
        let mut failed = None;
        let mut full = false;
        for b in bufs.iter().filter(|b| !b.is_empty()) {
            let chunk = &b[..b.len().min(budget - total)];
            match W::write(tx, chunk) {
                Ok(n) => {
                    total += n;
                    full = n < chunk.len();
                    if n < b.len() || total == budget {
                        break;
                    }
                }
                Err(RingError::WouldBlock) => {
                    full = true;
                    break;
                }
                Err(e) => {
                    if total == 0 {
                        failed = Some(e);
                    }
                    break;
                }
            }
        }
        if !starts && W::PUBLISHES_EACH_SEND {
            // The bytes are readable when the send returns; a sleeping
            // reader is woken by the flush that follows (`Sender::publish`).
            let _ = tx.publish();
        }
        if starts {
            // A message goes out now (`msgstart`); flush_locked queues what
            // it cannot finish.
            self.flush_locked(&mut guard);
            if let Some(s) = shared {
                let written = guard.as_ref().map(|t| t.bytes_written());
                self.exit_shared(s, None, written);
            }
            drop(guard);
        } else {
            let unflushed = tx.has_unflushed();
            drop(guard);
            if unflushed {
                self.mark_dirty();
            }
        }
        if let Some(e) = failed {
            if e == RingError::PeerClosed {
                // The peer closed its socket before its FIN reached us. An
                // EPIPE at once would fail a write TCP accepts (iperf3's
                // cookie write to a server that answered "busy" and closed);
                // the peer's kernel answers that write with a reset.
                let r = sockio::send_after_peer_closed(&self.closed_write_taken, bufs);
                if r.is_ok() {
                    self.reset_as_tcp_would();
                }
                return r;
            }
            let errno = self.ring_failed(&e, "send");
            if self.mode() == MODE_TCP {
                return self.tcp_send(bufs);
            }
            if errno == Errno(libc::EPIPE) && self.peer_gone() {
                return self.send_after_peer_gone(bufs);
            }
            return Err(errno);
        }
        if full {
            self.keep_waiters_armed(false);
        }
        if total == 0 {
            return Err(Errno(libc::EAGAIN));
        }
        Ok(total)
    }

    /// A send once the peer process is gone: after a reset, the error once
    /// and then EPIPE, as TCP; after a plain close, on the kernel socket
    /// (now in CLOSE_WAIT), so the program sees what TCP would show it: the
    /// first write accepted, the peer's reset, then ECONNRESET/EPIPE.
    /// Failing the first write at once is not the same: redis-benchmark
    /// retries a failed write forever when its write handler meets it.
    pub(super) fn send_after_peer_gone(&self, bufs: &[IoSlice<'_>]) -> Result<usize, Errno> {
        if self.reset.load(Ordering::Acquire) {
            let e = self.error.swap(0, Ordering::AcqRel);
            return Err(Errno(if e != 0 { e } else { libc::EPIPE }));
        }
        sockio::send_vec(self.tcp_fd(), bufs)
    }
}
