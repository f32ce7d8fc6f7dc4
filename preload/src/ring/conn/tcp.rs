//! The kernel-socket path of a connection that left the ring (or never got
//! it): plain system calls on our duplicate of the socket, behind what the
//! ring still owed it. Bytes the peer had put into the ring before it left
//! (`rx_spill`) are read before the socket's; bytes taken back from our
//! ring (`tx_spill`) are sent before anything the program sends now, and a
//! shutdown of the sending side waits for them.

use std::io::{IoSlice, IoSliceMut};
use std::sync::atomic::Ordering;

use libc::c_int;

use super::{RingConn, Wire};
use crate::attached::{Errno, Ready, WaitFd, WaitFds};
use crate::ring::sockio::{self, lock, sys_send};
use crate::sys;

impl<W: Wire> RingConn<W> {
    /// Queues bytes taken back from the ring for the kernel socket, and
    /// the sending side's shutdown after them when `shut` (the ring held
    /// our end-of-stream mark, or it was owed).
    pub(super) fn spill_tx(&self, bytes: Vec<u8>, shut: bool) {
        lock(&self.tx_spill).extend(bytes);
        if shut || self.eos_owed.swap(false, Ordering::AcqRel) {
            self.shut_wr_owed.store(true, Ordering::Release);
        }
    }

    /// Sends what `tx_spill` holds without blocking; true once it is empty
    /// (and the owed shutdown done).
    pub(super) fn push_tx_spill(&self) -> bool {
        let mut spill = lock(&self.tx_spill);
        let fd = self.tcp_fd();
        while !spill.is_empty() && fd >= 0 {
            let (front, _) = spill.as_slices();
            match sys_send(fd, front) {
                Ok(n) => {
                    spill.drain(..n);
                }
                Err(Errno(libc::EAGAIN)) | Err(Errno(libc::EINTR)) => {
                    drop(spill);
                    self.mark_dirty();
                    return false;
                }
                Err(Errno(e)) => {
                    // A reset connection loses them on kernel TCP too.
                    let level = if matches!(e, libc::EPIPE | libc::ECONNRESET) {
                        log::Level::Debug
                    } else {
                        log::Level::Warn
                    };
                    log::log!(
                        level,
                        "{}: {} bytes the ring owed the socket are lost with it (errno {e})",
                        self.ends(),
                        spill.len()
                    );
                    spill.clear();
                    self.error.store(e, Ordering::Release);
                }
            }
        }
        if self.shut_wr_owed.swap(false, Ordering::AcqRel) && fd >= 0 {
            // SAFETY: shutdown on our own duplicate of the socket.
            unsafe { crate::sys::sys_call!(libc::SYS_shutdown, fd, libc::SHUT_WR) };
        }
        true
    }

    /// `push_tx_spill` until empty or `deadline_ns`, waiting for room.
    pub(super) fn push_tx_spill_until(&self, deadline_ns: u64) {
        while !self.push_tx_spill() && sys::monotonic_ns() < deadline_ns {
            poll_one_for(self.tcp_fd(), libc::POLLOUT, 10);
        }
    }

    pub(super) fn tcp_recv(&self, bufs: &mut [IoSliceMut<'_>], peek: bool) -> Result<usize, Errno> {
        {
            // Bytes from the ring come first, whatever the socket holds.
            let mut spill = lock(&self.rx_spill);
            if !spill.is_empty() {
                let mut total = 0;
                for b in bufs.iter_mut() {
                    let n = b.len().min(spill.len() - total);
                    for (i, byte) in spill.range(total..total + n).enumerate() {
                        b[i] = *byte;
                    }
                    total += n;
                    if total == spill.len() {
                        break;
                    }
                }
                let whole = total == spill.len();
                if !peek {
                    spill.drain(..total);
                }
                // The socket's bytes follow the ring's, as one stream: a
                // read or peek with room past the ring's takes them too, as
                // TCP's takes all it holds (a read after a peek gets at
                // least what the peek saw), up to the urgent mark, where
                // TCP's read stops.
                let room = bufs.iter().map(|b| b.len()).sum::<usize>() - total;
                let queued = sockio::fionread(self.tcp_fd()).min(room);
                if whole
                    && queued > 0
                    && !self.reset.load(Ordering::Acquire)
                    && self.leaving_settled()
                    && !sockio::at_urgent_mark(self.tcp_fd())
                {
                    let mut more = vec![0u8; queued];
                    let flags = if peek {
                        libc::MSG_PEEK
                    } else {
                        libc::MSG_DONTWAIT
                    };
                    if let Ok(n) = sockio::sys_recv(self.tcp_fd(), &mut more, flags) {
                        total += sockio::scatter(&more[..n], bufs, total);
                    }
                }
                return Ok(total);
            }
        }
        if !self.leaving_settled() {
            // The peer's own leave header may still come first.
            return Err(Errno(libc::EAGAIN));
        }
        if self.reset.load(Ordering::Acquire) {
            return sockio::take_recv_error(&self.error).map_or(Ok(0), |e| Err(Errno(e)));
        }
        sockio::recv_then_error(self.tcp_fd(), &self.error, bufs, peek)
    }

    pub(super) fn tcp_send(&self, bufs: &[IoSlice<'_>]) -> Result<usize, Errno> {
        // Until the peer answered our leave, what it says we must send
        // again is not known: it goes before anything sent now.
        let r = if !self.leaving_settled() || !self.push_tx_spill() {
            Err(Errno(libc::EAGAIN))
        } else if self.reset.load(Ordering::Acquire) {
            let e = self.error.swap(0, Ordering::AcqRel);
            Err(Errno(if e != 0 { e } else { libc::EPIPE }))
        } else {
            sockio::send_vec(self.tcp_fd(), bufs)
        };
        if r == Err(Errno(libc::EAGAIN)) {
            self.tcp_blocked.fetch_add(1, Ordering::Relaxed);
        }
        r
    }

    /// `event_seq` on the kernel socket: it changes with every arrival of
    /// bytes (as the kernel wakes an edge-triggered waiter for each) and
    /// after every send that found no room (whose room coming back is the
    /// edge a writer waits for), whatever the readiness between two looks.
    pub(super) fn tcp_event_seq(&self) -> u64 {
        sockio::bytes_received(self.tcp_fd()).wrapping_add(self.tcp_blocked.load(Ordering::Relaxed))
    }

    pub(super) fn tcp_readiness(&self) -> Ready {
        let fd = self.tcp_fd();
        let mut r = sockio::tcp_readiness(fd, self.error.load(Ordering::Acquire));
        if !lock(&self.tx_spill).is_empty() {
            r = Ready(r.0 & !Ready::OUT.0);
        }
        if self.reset.load(Ordering::Acquire) {
            r = r | Ready::IN | Ready::RDHUP | Ready::OUT | Ready::HUP;
        }
        if !self.leaving_settled() {
            r = Ready(r.0 & !(Ready::IN.0 | Ready::RDHUP.0 | Ready::OUT.0));
        }
        if !lock(&self.rx_spill).is_empty() {
            r = r | Ready::IN;
        }
        r
    }

    /// `tcp_readiness` for a reader that needs `need` bytes, those the
    /// ring left included: readable from that many on, or at the end.
    pub(super) fn tcp_readiness_needing(&self, need: usize) -> Ready {
        let r = self.tcp_readiness();
        let end = Ready::RDHUP | Ready::HUP | Ready::ERR;
        if need <= 1 || r.intersects(end) || self.tcp_available() >= need {
            r
        } else {
            Ready(r.0 & !Ready::IN.0)
        }
    }

    pub(super) fn tcp_wait_fds(&self, interest: Ready) -> WaitFds {
        // A writer that waits for the peer's answer to our leave waits
        // for its arrival, not for room the socket has.
        let interest = if self.leaving.load(Ordering::Acquire) {
            Ready(interest.0 & !Ready::WRITE.0) | Ready::IN
        } else {
            interest
        };
        let mut fds = sockio::tcp_wait_fds(self.tcp_fd(), interest);
        if let Some(bell) = self.wire.bell_fds()[0] {
            // The end of a leave rings our bell: a reader that waited for
            // the peer's header looks again.
            fds[1] = Some(WaitFd {
                fd: bell,
                events: libc::POLLIN,
            });
        }
        fds
    }

    pub(super) fn tcp_available(&self) -> usize {
        lock(&self.rx_spill).len() + sockio::fionread(self.tcp_fd())
    }

    pub(super) fn tcp_shutdown(&self, how: c_int) -> Result<(), Errno> {
        let settled = self.leaving_settled();
        if how != libc::SHUT_RD && (!settled || !lock(&self.tx_spill).is_empty()) {
            // The kernel's FIN must follow the bytes the ring owed it (also
            // those the peer's answer to our leave is still to name).
            self.wr_shut.store(true, Ordering::Release);
            self.shut_wr_owed.store(true, Ordering::Release);
            if settled {
                self.push_tx_spill();
            }
            if how == libc::SHUT_WR {
                return Ok(());
            }
            return self.tcp_shutdown(libc::SHUT_RD);
        }
        // SAFETY: shutdown on our duplicate of the socket.
        let r = unsafe { crate::sys::sys_call!(libc::SYS_shutdown, self.tcp_fd(), how) };
        if r < 0 {
            Err(Errno(sys::errno()))
        } else {
            Ok(())
        }
    }
}

/// poll(2) on one fd for up to `ms` milliseconds.
pub(super) fn poll_one_for(fd: i32, events: i16, ms: i64) -> i16 {
    if fd < 0 {
        return 0;
    }
    let mut p = libc::pollfd {
        fd,
        events,
        revents: 0,
    };
    // SAFETY: one valid pollfd; bounded timeout; raw syscall.
    let r = unsafe {
        crate::sys::sys_call!(
            libc::SYS_ppoll,
            &mut p as *mut libc::pollfd,
            1,
            &libc::timespec {
                tv_sec: 0,
                tv_nsec: ms * 1_000_000,
            } as *const libc::timespec,
            std::ptr::null::<libc::sigset_t>(),
            8,
        )
    };
    if r > 0 {
        p.revents
    } else {
        0
    }
}
