//! Shutting down and closing: SHUT_RD and SHUT_WR on the ring, the close
//! that ends a side (with a reset where TCP would send one), the flush
//! before the process exits, and the TCP states a half-closed ring shows.

use std::sync::atomic::Ordering;

use libc::c_int;

use super::fork;
use super::{RingConn, Wire, MODE_PENDING, MODE_RING, MODE_TCP};
use crate::attached::{Errno, ReleaseKind};
use crate::ring::sockio::lock;
use crate::ring::{background, policy, watch};
use crate::sys;

/// TCP states as TCP_INFO's `tcpi_state` numbers them (include/net/tcp_states.h).
mod tcp_state {
    pub const FIN_WAIT2: u8 = 5;
    pub const CLOSE: u8 = 7;
    pub const CLOSE_WAIT: u8 = 8;
}

impl<W: Wire> RingConn<W> {
    /// Whether the program left bytes of the peer's unread: closing then
    /// resets the connection, as TCP does.
    fn unread_at_close(&self) -> bool {
        if !lock(&self.rx_spill).is_empty() {
            return true;
        }
        self.mode() == MODE_RING
            && self
                .rx
                .lock()
                .as_mut()
                .is_some_and(|rx| rx.available().unwrap_or(0) > 0)
    }

    /// Whether the program asked for a reset on close (SO_LINGER {1, 0}).
    fn linger_zero(&self) -> bool {
        let mut l = libc::linger {
            l_onoff: 0,
            l_linger: 0,
        };
        let mut len = std::mem::size_of::<libc::linger>() as libc::socklen_t;
        // SAFETY: l and len describe a linger struct of our own.
        let r = unsafe {
            crate::sys::sys_call!(
                libc::SYS_getsockopt,
                self.tcp_fd(),
                libc::SOL_SOCKET,
                libc::SO_LINGER,
                &mut l as *mut libc::linger,
                &mut len as *mut libc::socklen_t,
            )
        };
        r == 0 && l.l_onoff != 0 && l.l_linger == 0
    }

    /// Closes with a reset: SO_LINGER {1, 0} on the kernel socket, whose
    /// last close then sends RST; the ring gets no end-of-stream mark, so
    /// the peer reads what we sent, then ECONNRESET.
    fn close_with_reset(&self) {
        let l = libc::linger {
            l_onoff: 1,
            l_linger: 0,
        };
        // SAFETY: l describes a linger struct of our own.
        unsafe {
            crate::sys::sys_call!(
                libc::SYS_setsockopt,
                self.tcp_fd(),
                libc::SOL_SOCKET,
                libc::SO_LINGER,
                &l as *const libc::linger,
                std::mem::size_of::<libc::linger>() as libc::socklen_t,
            )
        };
    }

    /// Records written into this connection's rings, by us and by the
    /// peer (the peer's count is its own word in the segment: it only
    /// steers the policy).
    fn records_carried(&self) -> u64 {
        let sent = self.tx.lock().as_ref().map_or(0, |t| t.records_written());
        let got = self.rx.lock().as_ref().map_or(0, |r| r.stats().tx_records);
        sent.saturating_add(got)
    }

    /// `AttachedConn::shutdown`: on the ring, SHUT_RD ends reads where
    /// they would wait and SHUT_WR sends the end-of-stream mark.
    pub(super) fn shutdown_sides(&self, how: c_int) -> Result<(), Errno> {
        if !matches!(how, libc::SHUT_RD | libc::SHUT_WR | libc::SHUT_RDWR) {
            return Err(Errno(libc::EINVAL));
        }
        if self.settle() == MODE_TCP {
            return self.tcp_shutdown(how);
        }
        let rd = how != libc::SHUT_WR;
        if rd {
            // Reads return what is (or later arrives) in the ring, then 0
            // where they would wait: the peer may still send, as on TCP.
            self.rd_shut.store(true, Ordering::Release);
        }
        // Both halves are set before a waiter is woken: one woken by
        // SHUT_RDWR sees HUP, as on TCP.
        let wr = how != libc::SHUT_RD && !self.wr_shut.swap(true, Ordering::AcqRel);
        let mut res = Ok(());
        if wr {
            // The kernel socket stays untouched: its FIN would read as the
            // peer process dying. The end-of-stream mark says it instead;
            // a wire without a sender yet carries it on when it gets one.
            let mut tx = self.tx.lock();
            if tx.is_some() && self.mode() != MODE_TCP {
                self.eos_owed.store(true, Ordering::Release);
                self.flush_locked(&mut tx);
            } else if self.mode() == MODE_TCP {
                drop(tx);
                res = self.tcp_shutdown(libc::SHUT_WR);
            }
        }
        if rd || wr {
            self.wire.ring_own_bell();
        }
        res
    }

    /// `AttachedConn::drain_at_exit`: what the process wrote goes out
    /// before it exits, by `deadline_ns` at most.
    pub(super) fn drain_before_exit(&self, deadline_ns: u64) {
        // The kernel delivers what a process wrote to a socket it leaves
        // open; an open batch would be lost with the process, and where the
        // wire dies with it (a verbs queue pair) so would requests not yet
        // sent: flush, then wait for the last word write's report. Only the
        // process using the connection flushes (a forked copy of the batch
        // state would send bytes twice). Never a blocking lock: `_exit` may
        // run in a signal handler that interrupted a thread holding it.
        self.count_out();
        if !W::is_user(self) {
            return;
        }
        if self.mode() == MODE_TCP {
            self.push_tx_spill_until(deadline_ns);
            return;
        }
        if self.mode() != MODE_RING {
            return;
        }
        let mut guard = loop {
            match self.tx.try_lock() {
                Some(g) => break g,
                None => {
                    if sys::monotonic_ns() >= deadline_ns {
                        return;
                    }
                    std::thread::yield_now();
                }
            }
        };
        let Some(tx) = guard.as_mut() else {
            return;
        };
        let _ = tx.flush();
        if !W::REAPS_COMPLETIONS {
            return;
        }
        let mut wait = ringsock_ring::sleep::backoff::CompletionWait::new();
        while W::words_pending(tx.transport_mut()) && sys::monotonic_ns() < deadline_ns {
            if tx.poll().is_err() || self.peer_gone() {
                return;
            }
            wait.relax();
        }
    }

    /// `AttachedConn::release`: this process's last descriptor for the
    /// connection went away; the side ends where no holder is left.
    pub(super) fn release_end(&self, kind: ReleaseKind) {
        if self.released.swap(true, Ordering::AcqRel) {
            return;
        }
        let mut ends = kind == ReleaseKind::Owner && W::is_user(self);
        if ends && self.initiated && !self.turned_down.load(Ordering::Acquire) {
            let lifetime = sys::monotonic_ns().saturating_sub(self.born_ns);
            policy::ring_closed(self.peer, lifetime, self.records_carried());
        }
        let mut shared = None;
        if self.forked.load(Ordering::Acquire) && kind != ReleaseKind::Stale {
            // A side other processes still hold stays open for them, as a
            // socket does until its last descriptor closes; the last holder
            // ends it, whoever used it.
            self.count_out();
            ends = false;
            if self
                .wire
                .share()
                .is_some_and(|s| s.holders.load(Ordering::Acquire) == 0)
            {
                match self.enter_shared(None) {
                    fork::Entered::Shared(s) => {
                        shared = Some(s);
                        ends = true;
                    }
                    fork::Entered::Alone => ends = true,
                    fork::Entered::Left => ends = true,
                }
            }
        }
        if ends && self.mode() == MODE_PENDING {
            W::await_decision(self, true);
        }
        if ends && self.mode() == MODE_TCP {
            // What the ring owed the kernel socket goes out before the
            // program's close (bounded, as a lingering close would).
            let limit = u64::from(crate::config::get().connect_timeout_ms) * 1_000_000;
            let deadline = sys::monotonic_ns() + limit;
            // Bytes the peer's answer to our leave names go out first.
            self.settle_leaving_until(deadline);
            self.push_tx_spill_until(deadline);
            if self.unread_at_close() {
                self.close_with_reset();
            }
        } else if ends {
            let reset = self.unread_at_close() || self.linger_zero();
            if reset {
                self.close_with_reset();
            }
            // Our reader is closed before the mark goes out: a peer that
            // sees our end of stream and writes finds us closed, as TCP's
            // FIN comes from a socket that takes no more data.
            if let Some(rx) = self.rx.lock().as_mut() {
                let _ = rx.close();
            }
            if let Some(tx) = self.tx.lock().as_mut() {
                if !reset
                    && (!self.wr_shut.swap(true, Ordering::AcqRel)
                        || self.eos_owed.load(Ordering::Acquire))
                {
                    // A full ring leaves no room for the mark: the peer then
                    // sees our kernel socket close, which reads the same.
                    let _ = tx.close();
                    self.eos_owed.store(false, Ordering::Release);
                }
                let _ = tx.flush();
            }
            // The mark and the closed flag must land before the wire goes
            // away with the last reference. A client still pending keeps
            // its early bytes (and the mark, where they wait in the ring)
            // for a server that is merely slow to take the ring.
            self.settle_words();
        }
        if let Some(s) = shared {
            self.exit_shared(s, None, None);
        }
        watch::unwatch(self, self.tcp_fd());
        // The kernel socket is let go now (its last close is what the peer
        // sees); the number stays ours while a thread that read it may
        // still use it (`retired_tcp`).
        let fd = self.tcp.swap(-1, Ordering::AcqRel);
        if fd >= 0 {
            if crate::fdspace::retire(fd) {
                self.retired_tcp.store(fd, Ordering::Release);
            } else {
                crate::fdspace::close(fd);
            }
        }
        // Status forgets the connection whichever way its last fd went.
        if let Some(me) = self.this() {
            background::note_closed(me);
        }
    }

    /// `AttachedConn::tcp_state`: the state the ring's end-of-stream marks
    /// give; `None` where the kernel socket answers.
    pub(super) fn ring_tcp_state(&self) -> Option<u8> {
        if self.settle() == MODE_TCP {
            return None;
        }
        let fin = self
            .rx
            .lock()
            .as_mut()
            .is_some_and(|rx| rx.eos_published().unwrap_or(false));
        let ours = self.wr_shut() && !self.eos_owed.load(Ordering::Acquire);
        // On loopback the peer's ACK comes at once: FIN_WAIT1 and LAST_ACK
        // pass before a program can look.
        Some(match (fin, ours) {
            (false, false) => return None,
            (true, false) => tcp_state::CLOSE_WAIT,
            (false, true) => tcp_state::FIN_WAIT2,
            // Both ways shut: an open socket is CLOSE whichever went first
            // (the kernel keeps TIME_WAIT in a separate socket).
            (true, true) => tcp_state::CLOSE,
        })
    }
}
