//! epoll: level-triggered, edge-triggered (a new arrival reports again),
//! EPOLLONESHOT (silent until EPOLL_CTL_MOD), EPOLLRDHUP, EPOLLOUT,
//! errors and hang-ups after a reset, a wait that blocks until the peer
//! sends, registrations that outlive a dup'd fd's close, two sets,
//! epoll_ctl's errors, an ADD that wakes another thread's wait, a set used
//! through its dup, and a set inside another set.

use std::os::fd::RawFd;

use crate::ops;
use crate::role::Role;
use crate::scenario::{sc, Scenario};
use crate::scenarios::readiness::reset_close;

pub fn list() -> Vec<Scenario> {
    vec![
        sc(
            "epoll_level_triggered",
            "EPOLLIN level-triggered: nothing, then reported on every wait until read",
            level,
        ),
        sc(
            "epoll_edge_new_arrival",
            "EPOLLET: reported once; a new arrival reports again though the first bytes are unread",
            edge,
        ),
        sc(
            "epoll_edge_partial_read",
            "EPOLLET: a partial read does not report again; new bytes do",
            edge_partial,
        ),
        sc(
            "epoll_oneshot",
            "EPOLLONESHOT: one report, silent after new data, re-armed by EPOLL_CTL_MOD",
            oneshot,
        ),
        sc(
            "epoll_rdhup",
            "EPOLLIN|EPOLLRDHUP when the peer shuts down, before the end of stream is read",
            rdhup,
        ),
        sc(
            "epoll_in_and_out",
            "EPOLLIN|EPOLLOUT: EPOLLOUT alone when idle, both with data",
            in_and_out,
        ),
        sc(
            "epoll_err_hup_after_reset",
            "a registered connection reset by the peer reports EPOLLERR|EPOLLHUP",
            err_hup,
        ),
        sc(
            "epoll_blocks_until_data",
            "epoll_wait(-1) blocks until the peer sends",
            blocks,
        ),
        sc(
            "epoll_survives_close_of_dup",
            "a registration stays while a dup of its fd is open; DEL by the closed number is EBADF",
            survives_dup_close,
        ),
        sc(
            "epoll_two_sets",
            "one connection in two epoll sets: both report its data",
            two_sets,
        ),
        sc(
            "epoll_ctl_errors",
            "ADD twice is EEXIST, MOD and DEL of an unregistered fd ENOENT",
            ctl_errors,
        ),
        sc(
            "epoll_mod_to_out",
            "EPOLL_CTL_MOD from EPOLLIN to EPOLLOUT and back changes what is reported",
            mod_to_out,
        ),
        sc(
            "epoll_add_wakes_a_waiter",
            "a thread asleep on an empty set wakes when another thread adds a ready connection",
            add_wakes,
        ),
        sc(
            "epoll_dup_of_a_set",
            "a registration made through an epoll fd is reported, and removed, through its dup",
            dup_of_set,
        ),
        sc(
            "epoll_set_in_a_set",
            "a set inside another set makes it readable while a registration has data",
            set_in_set,
        ),
    ]
}

/// An epoll set with `fd` registered for `events`.
fn set(r: &Role, fd: RawFd, events: u32) -> RawFd {
    let ep = r.call(ops::epoll_create()).v as RawFd;
    r.call(ops::epoll_ctl(ep, libc::EPOLL_CTL_ADD, fd, events));
    ep
}

fn wait(r: &Role, ep: RawFd) {
    r.call(ops::epoll_wait(ep, 8, 0));
}

const IN: u32 = libc::EPOLLIN as u32;
const OUT: u32 = libc::EPOLLOUT as u32;
const ET: u32 = libc::EPOLLET as u32;
const RDHUP: u32 = libc::EPOLLRDHUP as u32;

/// Once the server has looked (barrier `name`), the client sends `what`;
/// after `NAME sent` the server waits for the bytes (`total` so far).
fn step(r: &Role, fd: RawFd, name: &str, what: &[u8], total: usize) {
    r.barrier(name);
    if !r.is_server() {
        r.call(ops::send(fd, what, 0));
    }
    r.barrier(&format!("{name} sent"));
    if r.is_server() {
        r.await_bytes(fd, total);
    }
}

fn level(r: &mut Role) {
    let fd = r.open();
    let ep = r.is_server().then(|| set(r, fd, IN));
    if let Some(ep) = ep {
        wait(r, ep);
    }
    step(r, fd, "sent", b"abc", 3);
    if let Some(ep) = ep {
        wait(r, ep);
        wait(r, ep);
        r.call(ops::recv(fd, 100, 0));
        wait(r, ep);
    }
}

fn edge(r: &mut Role) {
    let fd = r.open();
    let ep = r.is_server().then(|| set(r, fd, IN | ET));
    step(r, fd, "first", b"a", 1);
    if let Some(ep) = ep {
        wait(r, ep);
        wait(r, ep);
    }
    step(r, fd, "second", b"b", 2);
    if let Some(ep) = ep {
        wait(r, ep);
        wait(r, ep);
        r.call(ops::recv(fd, 100, 0));
        wait(r, ep);
    }
}

fn edge_partial(r: &mut Role) {
    let fd = r.open();
    let ep = r.is_server().then(|| set(r, fd, IN | ET));
    step(r, fd, "first", b"0123456789", 10);
    if let Some(ep) = ep {
        wait(r, ep);
        r.call(ops::recv(fd, 5, 0));
        wait(r, ep);
    }
    step(r, fd, "second", b"x", 6);
    if let Some(ep) = ep {
        wait(r, ep);
        r.call(ops::recv(fd, 100, 0));
        wait(r, ep);
    }
}

fn oneshot(r: &mut Role) {
    let fd = r.open();
    let ep = r
        .is_server()
        .then(|| set(r, fd, IN | libc::EPOLLONESHOT as u32));
    step(r, fd, "first", b"a", 1);
    if let Some(ep) = ep {
        wait(r, ep);
        wait(r, ep);
    }
    step(r, fd, "second", b"b", 2);
    if let Some(ep) = ep {
        wait(r, ep);
        r.call(ops::epoll_ctl(
            ep,
            libc::EPOLL_CTL_MOD,
            fd,
            IN | libc::EPOLLONESHOT as u32,
        ));
        wait(r, ep);
        wait(r, ep);
    }
}

fn rdhup(r: &mut Role) {
    let fd = r.open();
    if r.is_server() {
        let ep = set(r, fd, IN | RDHUP);
        wait(r, ep);
        r.barrier("idle");
        r.barrier("shut");
        r.await_eof(fd);
        wait(r, ep);
        r.call(ops::recv(fd, 100, 0));
        wait(r, ep);
    } else {
        r.barrier("idle");
        r.call(ops::shutdown(fd, libc::SHUT_WR));
        r.barrier("shut");
    }
}

fn in_and_out(r: &mut Role) {
    let fd = r.open();
    let ep = r.is_server().then(|| set(r, fd, IN | OUT));
    if let Some(ep) = ep {
        wait(r, ep);
    }
    step(r, fd, "sent", b"abc", 3);
    if let Some(ep) = ep {
        wait(r, ep);
    }
}

fn err_hup(r: &mut Role) {
    let fd = r.open();
    if r.is_server() {
        let ep = set(r, fd, IN | RDHUP);
        r.barrier("reset");
        r.await_reset(fd);
        wait(r, ep);
        r.call(ops::recv(fd, 100, 0));
        wait(r, ep);
    } else {
        reset_close(r, fd);
        r.barrier("reset");
    }
}

fn blocks(r: &mut Role) {
    let fd = r.open();
    if r.is_server() {
        let ep = set(r, fd, IN);
        r.blocking_until("go", move || ops::epoll_wait(ep, 8, -1).0);
        r.call(ops::recv(fd, 100, 0));
    } else {
        r.barrier("go");
        r.call(ops::send(fd, b"wake", 0));
    }
}

fn survives_dup_close(r: &mut Role) {
    let fd = r.open();
    if r.is_server() {
        let copy = r.call(ops::dup(fd)).v as RawFd;
        let ep = set(r, fd, IN);
        r.call(ops::close(fd));
        r.barrier("sent");
        r.await_bytes(copy, 4);
        wait(r, ep);
        r.call(ops::epoll_ctl(ep, libc::EPOLL_CTL_DEL, fd, 0));
        r.call(ops::recv(copy, 100, 0));
        wait(r, ep);
    } else {
        r.call(ops::send(fd, b"data", 0));
        r.barrier("sent");
    }
}

fn two_sets(r: &mut Role) {
    let fd = r.open();
    let eps = r.is_server().then(|| (set(r, fd, IN), set(r, fd, IN | ET)));
    step(r, fd, "sent", b"abc", 3);
    if let Some((a, b)) = eps {
        wait(r, a);
        wait(r, b);
        wait(r, a);
        wait(r, b);
    }
}

fn ctl_errors(r: &mut Role) {
    let fd = r.open();
    let ep = r.call(ops::epoll_create()).v as RawFd;
    r.call(ops::epoll_ctl(ep, libc::EPOLL_CTL_MOD, fd, IN));
    r.call(ops::epoll_ctl(ep, libc::EPOLL_CTL_DEL, fd, 0));
    r.call(ops::epoll_ctl(ep, libc::EPOLL_CTL_ADD, fd, IN));
    r.call(ops::epoll_ctl(ep, libc::EPOLL_CTL_ADD, fd, IN));
    r.call(ops::epoll_ctl(ep, libc::EPOLL_CTL_DEL, fd, 0));
    r.call(ops::epoll_ctl(ep, libc::EPOLL_CTL_DEL, fd, 0));
}

fn mod_to_out(r: &mut Role) {
    let fd = r.open();
    let ep = r.is_server().then(|| set(r, fd, IN));
    step(r, fd, "sent", b"abc", 3);
    if let Some(ep) = ep {
        wait(r, ep);
        r.call(ops::epoll_ctl(ep, libc::EPOLL_CTL_MOD, fd, OUT));
        wait(r, ep);
        r.call(ops::epoll_ctl(ep, libc::EPOLL_CTL_MOD, fd, IN | ET));
        wait(r, ep);
        wait(r, ep);
    }
}

fn add_wakes(r: &mut Role) {
    let fd = r.open();
    step(r, fd, "sent", b"abc", 3);
    if r.is_server() {
        let ep = r.call(ops::epoll_create()).v as RawFd;
        r.blocking(
            move || ops::epoll_wait(ep, 8, -1).0,
            |r| {
                r.call(ops::epoll_ctl(ep, libc::EPOLL_CTL_ADD, fd, IN));
            },
        );
    }
}

fn dup_of_set(r: &mut Role) {
    let fd = r.open();
    let eps = r.is_server().then(|| {
        let ep = r.call(ops::epoll_create()).v as RawFd;
        (ep, r.call(ops::dup(ep)).v as RawFd)
    });
    if let Some((ep, copy)) = eps {
        r.call(ops::epoll_ctl(copy, libc::EPOLL_CTL_ADD, fd, IN));
        wait(r, ep);
    }
    step(r, fd, "sent", b"abc", 3);
    if let Some((ep, copy)) = eps {
        wait(r, ep);
        wait(r, copy);
        r.call(ops::epoll_ctl(ep, libc::EPOLL_CTL_DEL, fd, 0));
        wait(r, copy);
        r.call(ops::epoll_ctl(copy, libc::EPOLL_CTL_DEL, fd, 0));
    }
}

/// `fd` in an inner set (level-triggered), the inner set in an outer one.
fn nested(r: &Role, fd: RawFd) -> (RawFd, RawFd) {
    let inner = set(r, fd, IN);
    (inner, set(r, inner, IN))
}

fn set_in_set(r: &mut Role) {
    let fd = r.open();
    let sets = r.is_server().then(|| nested(r, fd));
    if let Some((_, outer)) = sets {
        wait(r, outer);
    }
    step(r, fd, "sent", b"abc", 3);
    if let Some((inner, outer)) = sets {
        // Bounded, not 0: the sender may ring the doorbell a little after
        // its bytes are readable (a background flush).
        r.call(ops::epoll_wait(outer, 8, 5000));
        wait(r, inner);
        wait(r, outer);
        wait(r, inner);
        r.call(ops::recv(fd, 100, 0));
        wait(r, inner);
        wait(r, outer);
    }
}
