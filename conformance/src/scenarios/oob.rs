//! Urgent data (MSG_OOB): the mark (SIOCATMARK), POLLPRI and select's
//! exceptional set, recv(MSG_OOB) once then EINVAL, peeking the urgent
//! byte, epoll's EPOLLPRI, and SO_OOBINLINE.

use std::os::fd::RawFd;

use crate::ops;
use crate::role::Role;
use crate::scenario::{sc, Scenario};

pub fn list() -> Vec<Scenario> {
    vec![
        sc("oob_urgent_byte", "abc, urgent !, def: POLLPRI, reads stop at the mark, SIOCATMARK, recv(MSG_OOB) then EINVAL", urgent),
        sc("oob_select_except", "the urgent byte puts the socket in select's exceptional set", select_except),
        sc("oob_peek", "recv(MSG_OOB|MSG_PEEK) twice, then recv(MSG_OOB)", peek),
        sc("oob_epollpri", "EPOLLPRI reports the urgent byte", epollpri),
        sc("oob_inline", "SO_OOBINLINE: the urgent byte stays in the stream, recv(MSG_OOB) is EINVAL", inline),
        sc("oob_sender_view", "send(MSG_OOB) returns the length and the connection carries on both ways", sender_view),
        sc("oob_after_peek", "bytes peeked, then send(MSG_OOB): a read at once returns the peeked bytes", after_peek),
    ]
}

/// Once the server has looked (barrier `ready`), the client sends abc,
/// urgent !, def; the server waits for the urgent byte (POLLPRI) and the
/// bytes before the mark.
fn urgent_stream(r: &Role, fd: RawFd) {
    r.barrier("ready");
    if r.is_server() {
        r.barrier("sent");
        r.await_events(fd, libc::POLLPRI);
        r.await_bytes(fd, 3);
    } else {
        r.call(ops::send(fd, b"abc", 0));
        r.call(ops::send(fd, b"!", libc::MSG_OOB));
        r.call(ops::send(fd, b"def", 0));
        r.barrier("sent");
    }
}

/// recv(1, flags) with MSG_OOB, which the kernel never blocks in.
fn oob_recv(r: &Role, fd: RawFd, flags: i32) {
    r.immediate("recv(MSG_OOB)", move || ops::recv(fd, 1, flags).0);
}

fn mark(r: &Role, fd: RawFd) {
    r.call(ops::ioctl_int(fd, ops::SIOCATMARK, "SIOCATMARK"));
}

fn urgent(r: &mut Role) {
    let fd = r.open();
    urgent_stream(r, fd);
    if r.is_server() {
        r.call(ops::poll(
            &[(fd, libc::POLLIN | libc::POLLPRI | libc::POLLRDBAND)],
            0,
        ));
        mark(r, fd);
        r.call(ops::recv(fd, 100, libc::MSG_DONTWAIT));
        mark(r, fd);
        oob_recv(r, fd, libc::MSG_OOB);
        oob_recv(r, fd, libc::MSG_OOB);
        r.call(ops::poll(&[(fd, libc::POLLIN | libc::POLLPRI)], 0));
        r.await_bytes(fd, 3);
        r.call(ops::recv(fd, 100, libc::MSG_DONTWAIT));
        mark(r, fd);
    }
}

fn select_except(r: &mut Role) {
    let fd = r.open();
    let sets = ops::Sets {
        r: vec![fd],
        w: vec![],
        e: vec![fd],
    };
    if r.is_server() {
        r.call(ops::select(&sets, Some(0)));
    }
    urgent_stream(r, fd);
    if r.is_server() {
        r.call(ops::select(&sets, Some(0)));
        oob_recv(r, fd, libc::MSG_OOB);
        r.call(ops::select(&sets, Some(0)));
    }
}

fn peek(r: &mut Role) {
    let fd = r.open();
    urgent_stream(r, fd);
    if r.is_server() {
        oob_recv(r, fd, libc::MSG_OOB | libc::MSG_PEEK);
        oob_recv(r, fd, libc::MSG_OOB | libc::MSG_PEEK);
        oob_recv(r, fd, libc::MSG_OOB);
        r.call(ops::recv(fd, 100, libc::MSG_DONTWAIT));
    }
}

fn epollpri(r: &mut Role) {
    let fd = r.open();
    let ep = r.is_server().then(|| {
        let ep = r.call(ops::epoll_create()).v as RawFd;
        r.call(ops::epoll_ctl(
            ep,
            libc::EPOLL_CTL_ADD,
            fd,
            libc::EPOLLPRI as u32,
        ));
        r.call(ops::epoll_wait(ep, 8, 0));
        ep
    });
    urgent_stream(r, fd);
    if let Some(ep) = ep {
        r.call(ops::epoll_wait(ep, 8, 0));
        oob_recv(r, fd, libc::MSG_OOB);
        r.call(ops::epoll_wait(ep, 8, 0));
    }
}

fn inline(r: &mut Role) {
    let fd = r.open();
    if r.is_server() {
        r.call(ops::setsockopt_int(
            fd,
            libc::SOL_SOCKET,
            libc::SO_OOBINLINE,
            "SO_OOBINLINE",
            1,
        ));
    }
    urgent_stream(r, fd);
    if r.is_server() {
        mark(r, fd);
        oob_recv(r, fd, libc::MSG_OOB);
        r.call(ops::recv(fd, 100, libc::MSG_DONTWAIT));
        mark(r, fd);
        r.await_bytes(fd, 4);
        r.call(ops::recv(fd, 100, libc::MSG_DONTWAIT));
    }
}

fn sender_view(r: &mut Role) {
    let fd = r.open();
    if r.is_server() {
        r.barrier("sent");
        r.await_events(fd, libc::POLLPRI);
        r.await_bytes(fd, 2);
        oob_recv(r, fd, libc::MSG_OOB);
        r.call(ops::recv(fd, 100, libc::MSG_DONTWAIT));
        r.call(ops::send(fd, b"back", 0));
    } else {
        r.call(ops::send(fd, b"xyz", libc::MSG_OOB));
        r.barrier("sent");
        r.call(ops::recv(fd, 100, 0));
    }
}

/// Bytes a reader has seen stay readable: a connection that leaves its
/// ring (urgent data) must not hide what a peek returned.
fn after_peek(r: &mut Role) {
    let fd = r.open();
    let data: Vec<u8> = (0..6000u32).map(|i| (i * 7 % 251) as u8).collect();
    if r.is_server() {
        r.barrier("sent");
        r.await_bytes(fd, data.len());
        r.call(ops::recv(
            fd,
            data.len(),
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        ));
        r.call(ops::send(fd, b"!", libc::MSG_OOB));
        r.call(ops::recv(fd, 2 * data.len(), libc::MSG_DONTWAIT));
        r.barrier("read");
    } else {
        r.call(ops::send(fd, &data, 0));
        r.barrier("sent");
        r.barrier("read");
    }
}
