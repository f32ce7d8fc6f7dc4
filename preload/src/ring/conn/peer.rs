//! What the kernel socket underneath tells of the peer: its EOF, its reset
//! or its leave header (`check_tcp`), and the resets TCP would have shown
//! the program for them.

use std::sync::atomic::Ordering;

use libc::c_int;

use super::leave;
use super::{RingConn, Wire, MODE_PENDING, MODE_RING, MODE_TCP};
use crate::attached::Errno;
use crate::ring::sockio::{self, poll_one, sys_recv};

impl<W: Wire> RingConn<W> {
    /// Looks at the kernel socket of a connection on the ring (or pending):
    /// EOF or reset means the peer process is gone; a leave header means
    /// the peer left (`stay`); other data while pending means the server
    /// talks TCP (it turned the ring down without a word), and on a ring
    /// that something is badly wrong.
    pub fn check_tcp(&self) {
        let fd = self.tcp_fd();
        let mode = self.mode();
        if fd >= 0 && mode != MODE_TCP && self.peer_gone.load(Ordering::Relaxed) {
            // The reset that answers a send after the peer's close: waiters
            // look again (readiness shows it), once.
            if !self.reset.load(Ordering::Acquire)
                && poll_one(fd, 0) & libc::POLLERR != 0
                && !self.socket_error_seen.swap(true, Ordering::AcqRel)
            {
                self.wire.ring_own_bell();
            }
            return;
        }
        if fd < 0 || mode == MODE_TCP || self.leaving.load(Ordering::Acquire) {
            // (A side that sent its leave header reads the peer's answer
            // in `leave` itself.)
            return;
        }
        if self.forked.load(Ordering::Relaxed) {
            self.notice_shared_leave();
            if self.mode() == MODE_TCP {
                return;
            }
        }
        if poll_one(fd, libc::POLLIN | libc::POLLRDHUP) == 0 {
            return;
        }
        if !W::is_user(self) {
            // The process using the connection answers (a forked copy
            // that took the header would strand the user).
            return;
        }
        let mut b = [0u8; leave::HEADER_BYTES];
        match sys_recv(fd, &mut b, libc::MSG_PEEK) {
            // A reset's error goes to one reader only: a thread that looked
            // at the same moment as another (the background thread's watch,
            // the program's) reads EOF, and the state tells the two apart.
            // On the ring our side never sends its FIN, so CLOSE is a reset
            // (while pending it may be a refused connect, whose own error
            // the other reader reports).
            Ok(0) if mode == MODE_RING && sockio::reset_state(fd) => self.reset_as_tcp_would(),
            Ok(0) => self.peer_closed_socket(),
            Ok(n) if mode == MODE_PENDING => self.tcp_while_pending(&b[..n]),
            Ok(_) => self.header_arrived(),
            Err(Errno(libc::EAGAIN)) => {}
            Err(Errno(libc::ECONNRESET)) => self.reset_as_tcp_would(),
            Err(Errno(e)) => self.reset_by_peer(e),
        }
    }

    /// The kernel socket's EOF: the peer process closed it or died. Kernel
    /// TCP would have reset the connection if the peer left bytes of ours
    /// unread; where the wire can tell, so does this.
    fn peer_closed_socket(&self) {
        log::debug!("{}: the peer closed its socket", self.ends());
        let unread = {
            let tx = self.tx.lock();
            tx.as_ref()
                .is_some_and(|tx| W::peer_left_unread(self, tx.bytes_written()))
        };
        self.peer_gone.store(true, Ordering::Release);
        if unread {
            self.reset_as_tcp_would();
        }
        self.wire.ring_own_bell();
    }

    /// The reset the peer's kernel would have sent (it closed with bytes
    /// of ours unread): after its FIN TCP reports it as EPIPE (the socket
    /// was in CLOSE_WAIT), before it as ECONNRESET. A ring that fails shows
    /// no FIN.
    pub(super) fn reset_as_tcp_would(&self) {
        let fin = self
            .rx
            .lock()
            .as_mut()
            .is_none_or(|rx| rx.eos_published().unwrap_or(false));
        let errno = if fin && !self.wr_shut() {
            libc::EPIPE
        } else {
            libc::ECONNRESET
        };
        self.reset_by_peer(errno);
    }

    /// The peer reset the connection (or, gone with our bytes unread,
    /// would have): reads return what the ring holds, then the error once,
    /// then EOF; writes fail; poll shows ERR and HUP.
    fn reset_by_peer(&self, errno: c_int) {
        if self.reset.swap(true, Ordering::AcqRel) {
            return;
        }
        self.error.store(errno, Ordering::Release);
        self.peer_gone.store(true, Ordering::Release);
        self.wire.ring_own_bell();
    }
}
