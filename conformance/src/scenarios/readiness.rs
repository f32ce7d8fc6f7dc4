//! poll and select masks: what a fresh connection reports, POLLRDNORM /
//! POLLWRNORM asked alone, POLLRDHUP when the FIN arrives (before the
//! program read the end of stream), POLLHUP once both directions are shut
//! (including a poller in another thread woken by shutdown), POLLERR |
//! POLLHUP after a reset, select's three sets, waits that block until the
//! peer acts.

use std::os::fd::RawFd;

use crate::ops::{self, Sets};
use crate::role::Role;
use crate::scenario::{sc, Scenario};
use crate::scenarios::options::fill;

pub fn list() -> Vec<Scenario> {
    vec![
        sc("poll_fresh_connection", "poll for everything on an idle connection: POLLOUT|POLLWRNORM only, both ends", fresh),
        sc("poll_rdnorm_wrnorm_only", "POLLRDNORM, POLLWRNORM, POLLRDBAND asked alone report only what was asked", rdnorm_only),
        sc("poll_rdhup_on_fin", "peer shutdown(SHUT_WR): POLLIN|POLLRDHUP before the end of stream is read, and after", rdhup_on_fin),
        sc("poll_rdhup_with_data_pending", "peer sends then shuts down: POLLRDHUP reported while its bytes are still unread", rdhup_with_data),
        sc("poll_hup_after_both_shut", "both ends shutdown(SHUT_WR): POLLHUP on both", hup_both_shut),
        sc("poll_hup_own_shut_rdwr", "shutdown(SHUT_RDWR) on this end: POLLHUP here, POLLRDHUP at the peer", hup_own_rdwr),
        sc("shutdown_rdwr_wakes_poller", "a thread blocked in poll(POLLIN) is woken by shutdown(SHUT_RDWR) from another", shutdown_wakes_poller),
        sc("shutdown_rd_wakes_recv", "a thread blocked in recv is woken by shutdown(SHUT_RD) from another and reads 0", shutdown_wakes_recv),
        sc("shutdown_rd_then_peer_sends", "after shutdown(SHUT_RD), recv is 0 at once, yet the peer's later bytes are still delivered", shutdown_rd_then_send),
        sc("poll_err_hup_after_reset", "peer resets (SO_LINGER {1,0}): POLLERR|POLLHUP, recv ECONNRESET, then 0, send EPIPE", err_hup_after_reset),
        sc("select_sets_idle_and_ready", "select's read, write and except sets on an idle connection, with data, at end of stream", select_sets),
        sc("select_blocks_until_data", "select on the read set blocks until the peer sends", select_blocks),
        sc("poll_blocks_until_data", "poll(POLLIN, -1) blocks until the peer sends", poll_blocks),
        sc("poll_pollout_after_full", "a full connection is not POLLOUT; poll(POLLOUT) blocks until the peer reads", pollout_after_full),
        sc("poll_pollout_needs_room", "a full connection stays not POLLOUT while the peer reads 64 KiB, and is POLLOUT once it drains", pollout_needs_room),
        sc("poll_two_fds_one_ready", "poll on the connection and a pipe: only the ready one reports", poll_two_fds),
    ]
}

const ALL: i16 = libc::POLLIN | libc::POLLPRI | libc::POLLOUT | libc::POLLRDHUP;

fn poll1(r: &Role, fd: RawFd, events: i16) {
    r.call(ops::poll(&[(fd, events)], 0));
}

fn fresh(r: &mut Role) {
    let fd = r.open();
    poll1(
        r,
        fd,
        ALL | libc::POLLRDNORM | libc::POLLWRNORM | libc::POLLRDBAND,
    );
    poll1(r, fd, ALL);
}

fn rdnorm_only(r: &mut Role) {
    let fd = r.open();
    if r.is_server() {
        r.barrier("sent");
        r.await_bytes(fd, 1);
        poll1(r, fd, libc::POLLRDNORM);
        poll1(r, fd, libc::POLLWRNORM);
        poll1(r, fd, libc::POLLRDBAND);
        poll1(r, fd, libc::POLLRDNORM | libc::POLLWRNORM);
    } else {
        r.call(ops::send(fd, b"x", 0));
        r.barrier("sent");
    }
}

fn rdhup_on_fin(r: &mut Role) {
    let fd = r.open();
    if r.is_server() {
        r.barrier("shut");
        r.await_eof(fd);
        poll1(r, fd, ALL);
        poll1(r, fd, libc::POLLIN);
        r.call(ops::recv(fd, 100, 0));
        poll1(r, fd, ALL);
    } else {
        r.call(ops::shutdown(fd, libc::SHUT_WR));
        r.barrier("shut");
    }
}

fn rdhup_with_data(r: &mut Role) {
    let fd = r.open();
    if r.is_server() {
        r.barrier("shut");
        r.await_bytes(fd, 4);
        r.await_eof(fd);
        poll1(r, fd, ALL);
        r.call(ops::recv(fd, 100, libc::MSG_DONTWAIT));
        poll1(r, fd, ALL);
        r.call(ops::recv(fd, 100, libc::MSG_DONTWAIT));
    } else {
        r.call(ops::send(fd, b"data", 0));
        r.call(ops::shutdown(fd, libc::SHUT_WR));
        r.barrier("shut");
    }
}

fn hup_both_shut(r: &mut Role) {
    let fd = r.open();
    if r.is_server() {
        r.barrier("client shut");
        r.await_eof(fd);
        r.call(ops::shutdown(fd, libc::SHUT_WR));
        poll1(r, fd, ALL);
        r.barrier("server shut");
    } else {
        r.call(ops::shutdown(fd, libc::SHUT_WR));
        r.barrier("client shut");
        r.barrier("server shut");
        r.await_eof(fd);
        poll1(r, fd, ALL);
    }
}

fn hup_own_rdwr(r: &mut Role) {
    let fd = r.open();
    if r.is_server() {
        r.call(ops::shutdown(fd, libc::SHUT_RDWR));
        poll1(r, fd, ALL);
        r.call(ops::recv(fd, 100, 0));
        r.call(ops::send(fd, b"x", libc::MSG_NOSIGNAL));
        r.barrier("shut");
    } else {
        r.barrier("shut");
        r.await_eof(fd);
        poll1(r, fd, ALL);
    }
}

fn shutdown_wakes_poller(r: &mut Role) {
    let fd = r.open();
    if r.is_server() {
        r.blocking(
            move || ops::poll(&[(fd, libc::POLLIN)], -1).0,
            |r| {
                r.call(ops::shutdown(fd, libc::SHUT_RDWR));
            },
        );
        r.barrier("shut");
    } else {
        r.barrier("shut");
    }
}

fn shutdown_wakes_recv(r: &mut Role) {
    let fd = r.open();
    if r.is_server() {
        r.blocking(
            move || ops::recv(fd, 100, 0).0,
            |r| {
                r.call(ops::shutdown(fd, libc::SHUT_RD));
            },
        );
        r.barrier("shut");
    } else {
        r.barrier("shut");
    }
}

fn shutdown_rd_then_send(r: &mut Role) {
    let fd = r.open();
    if r.is_server() {
        r.call(ops::shutdown(fd, libc::SHUT_RD));
        r.call(ops::recv(fd, 100, 0));
        poll1(r, fd, ALL);
        r.barrier("shut");
        r.barrier("sent");
        // A peek reads 0 after SHUT_RD: wait for the queued count instead.
        r.await_queued(fd, 5);
        r.call(ops::recv(fd, 100, 0));
        r.call(ops::recv(fd, 100, 0));
        r.call(ops::send(fd, b"reply", 0));
    } else {
        r.barrier("shut");
        r.call(ops::send(fd, b"after", 0));
        r.barrier("sent");
        r.call(ops::recv(fd, 100, 0));
    }
}

/// Makes this end's close send a reset (SO_LINGER {1,0}) and closes.
pub fn reset_close(r: &Role, fd: RawFd) {
    let l = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    r.call(ops::setsockopt_raw(
        fd,
        libc::SOL_SOCKET,
        libc::SO_LINGER,
        "SO_LINGER {1,0}",
        &l,
    ));
    r.call(ops::close(fd));
}

fn err_hup_after_reset(r: &mut Role) {
    let fd = r.open();
    if r.is_server() {
        r.barrier("reset");
        r.await_reset(fd);
        poll1(r, fd, ALL);
        r.call(ops::so_error(fd));
        poll1(r, fd, ALL);
        r.call(ops::recv(fd, 100, 0));
        r.call(ops::recv(fd, 100, 0));
        r.call(ops::send(fd, b"x", libc::MSG_NOSIGNAL));
        poll1(r, fd, ALL);
    } else {
        reset_close(r, fd);
        r.barrier("reset");
    }
}

fn select_sets(r: &mut Role) {
    let fd = r.open();
    let all = Sets {
        r: vec![fd],
        w: vec![fd],
        e: vec![fd],
    };
    if r.is_server() {
        r.call(ops::select(&all, Some(0)));
        r.barrier("idle");
        r.barrier("sent");
        r.await_bytes(fd, 3);
        r.call(ops::select(&all, Some(0)));
        r.call(ops::recv(fd, 100, 0));
        r.call(ops::select(&all, Some(0)));
        r.barrier("read");
        r.barrier("shut");
        r.await_eof(fd);
        r.call(ops::select(&all, Some(0)));
    } else {
        r.barrier("idle");
        r.call(ops::send(fd, b"abc", 0));
        r.barrier("sent");
        r.barrier("read");
        r.call(ops::shutdown(fd, libc::SHUT_WR));
        r.barrier("shut");
    }
}

fn select_blocks(r: &mut Role) {
    let fd = r.open();
    if r.is_server() {
        let set = Sets {
            r: vec![fd],
            ..Default::default()
        };
        r.blocking_until("go", move || ops::select(&set, None).0);
        r.call(ops::recv(fd, 100, 0));
    } else {
        r.barrier("go");
        r.call(ops::send(fd, b"wake", 0));
    }
}

fn poll_blocks(r: &mut Role) {
    let fd = r.open();
    if r.is_server() {
        r.blocking_until("go", move || ops::poll(&[(fd, libc::POLLIN)], -1).0);
        r.call(ops::recv(fd, 100, 0));
    } else {
        r.barrier("go");
        r.call(ops::send(fd, b"wake", 0));
    }
}

fn pollout_after_full(r: &mut Role) {
    let fd = r.open();
    if r.is_server() {
        r.barrier("full");
        r.barrier("drain");
        r.call(ops::drain(fd));
    } else {
        fill(r, fd);
        poll1(r, fd, libc::POLLOUT | libc::POLLWRNORM);
        r.barrier("full");
        r.blocking_until("drain", move || ops::poll(&[(fd, libc::POLLOUT)], -1).0);
        r.call(ops::shutdown(fd, libc::SHUT_WR));
    }
}

/// TCP reports room only once a third of the send buffer is free, so a
/// poller of a full connection sleeps through the peer's small reads.
fn pollout_needs_room(r: &mut Role) {
    let fd = r.open();
    if r.is_server() {
        r.barrier("full");
        r.barrier("small");
        r.call(ops::recv(fd, 65536, libc::MSG_WAITALL));
        r.barrier("drain");
        r.call(ops::drain(fd));
    } else {
        fill(r, fd);
        r.barrier("full");
        // Longer than the grace before "small", so the read comes while
        // the poll waits.
        r.blocking(
            move || ops::poll(&[(fd, libc::POLLOUT)], 4000).0,
            |r| r.barrier("small"),
        );
        r.blocking_until("drain", move || ops::poll(&[(fd, libc::POLLOUT)], -1).0);
        r.call(ops::shutdown(fd, libc::SHUT_WR));
    }
}

fn poll_two_fds(r: &mut Role) {
    let fd = r.open();
    let mut p = [0; 2];
    // SAFETY: pipe fills two fds that this role owns.
    unsafe { libc::pipe(p.as_mut_ptr()) };
    if r.is_server() {
        r.barrier("sent");
        r.await_bytes(fd, 1);
        r.call(ops::poll(&[(p[0], libc::POLLIN), (fd, libc::POLLIN)], 0));
        r.call(ops::write(p[1], b"p"));
        r.call(ops::recv(fd, 100, 0));
        r.call(ops::poll(&[(p[0], libc::POLLIN), (fd, libc::POLLIN)], 0));
    } else {
        r.call(ops::send(fd, b"s", 0));
        r.barrier("sent");
    }
}
