//! What the ring layer hears when the last fd of a tracked object goes in
//! this process: an attached connection is released (as its owner's, as an
//! inherited copy, or as stale), a listener's address is forgotten, a
//! plain-TCP connection leaves the status report, and the epoll sets that
//! hold the connection drop it.

use std::sync::OnceLock;

use super::state::{FdState, Kind};
use crate::attached::{self, ReleaseKind};
use crate::interpose::guard;
use crate::sockaddr;

/// The last fd of `st` (number `fd`) was removed from the table; `stale`:
/// it had been closed behind the shim's back and its number reused.
pub(super) fn last_fd_gone(fd: i32, st: &FdState, stale: bool) {
    if !stale {
        tell_attacher(fd, st);
    }
    if let Some(conn) = st.conn() {
        let kind = if stale {
            ReleaseKind::Stale
        } else if st.claimed_here() {
            ReleaseKind::Owner
        } else {
            ReleaseKind::Inherited
        };
        {
            let _g = guard::enter();
            conn.release(fd, kind);
        }
        // Only a ring is added to epoll sets as one (`note_epoll_home`),
        // and its connection stays attached until the state is recycled.
        if let Some(drop_closed) = EPOLL_DROP.get() {
            for epfd in st.take_epoll_homes() {
                drop_closed(epfd, st);
            }
        }
    }
}

/// Fd `fd` of `st` was removed from the table while another fd still
/// refers to it (dup, then close of the first): an attached connection
/// reported under `fd` moves its status row to a number that holds it,
/// before the program can reuse `fd` for another connection.
pub(super) fn one_fd_gone(fd: i32, st: &FdState) {
    if super::holds(fd, st) {
        // dup2 of one of its fds onto another: the number still holds it.
        return;
    }
    if let Some(conn) = st.conn() {
        let _g = guard::enter();
        conn.fd_closed(fd, &|| super::fd_of(st));
    }
}

/// How an epoll instance drops a closed file (set by the epoll layer).
static EPOLL_DROP: OnceLock<fn(i32, &FdState)> = OnceLock::new();

/// Installs what the last close of a socket calls for each epoll fd its
/// ring was added to (`FdState::note_epoll_home`); the first call wins.
pub fn on_close_in_epoll(f: fn(i32, &FdState)) {
    let _ = EPOLL_DROP.set(f);
}

/// Tells the ring layer that the last fd of a listener or of a decided
/// plain-TCP connection is about to be closed.
fn tell_attacher(fd: i32, st: &FdState) {
    let Some(a) = attached::attacher() else {
        return;
    };
    let _g = guard::enter();
    match st.kind() {
        Some(Kind::Listener) => {
            if let Some(addr) = sockaddr::query(fd, false) {
                a.listener_closed(addr);
            }
        }
        Some(Kind::Tcp) if !st.is_preconnect() && st.conn().is_none() => {
            a.tcp_closed(fd, st.tcp_memo())
        }
        _ => {}
    }
}
