//! Descriptors and connection setup in one process: dup/dup2/F_DUPFD and
//! using both numbers, closing one dup, close then EBADF, descriptor
//! numbers, accept4 flags, non-blocking listeners, non-blocking connect
//! (EINPROGRESS, POLLOUT, SO_ERROR), connecting to a closed port.

use std::os::fd::RawFd;

use crate::ops;
use crate::role::Role;
use crate::scenario::{sc, Scenario};

pub fn list() -> Vec<Scenario> {
    vec![
        sc("dup_both_fds_used", "dup: read on one number, write on the other, close the first, go on with the second", dup_both),
        sc("dup2_chosen_number", "dup2 onto a chosen number, then use only that number", dup2_chosen),
        sc("close_one_dup_no_eof", "closing one of two dups sends nothing: the peer sees no EOF until the last close", close_one_dup),
        sc("fcntl_dupfd_cloexec", "F_DUPFD_CLOEXEC above 10: the number, FD_CLOEXEC, and the copy works", dupfd_cloexec),
        sc("close_then_ebadf", "calls on a closed number fail EBADF; close again is EBADF", close_then_ebadf),
        sc("fd_numbers_lowest_free", "new sockets take the lowest free numbers, after closes too", fd_numbers),
        sc("accept4_nonblock_cloexec", "accept4(SOCK_NONBLOCK|SOCK_CLOEXEC): flags on the new fd, recv EAGAIN", accept4_flags),
        sc("accept_nonblocking_listener", "accept on a non-blocking listener: EAGAIN, then a blocking connection", accept_nonblocking),
        sc("nonblocking_connect", "non-blocking connect: EINPROGRESS, POLLOUT, SO_ERROR 0, then data", nonblocking_connect),
        sc("nonblocking_send_recv", "O_NONBLOCK set by fcntl: recv EAGAIN, send accepted, data both ways", nonblocking_io),
        sc("connect_refused", "connect to a bound port with no listener: ECONNREFUSED, twice; SO_ERROR 0 after", connect_refused),
        sc("connect_refused_nonblocking", "non-blocking connect to no listener: POLLOUT|POLLERR|POLLHUP, SO_ERROR ECONNREFUSED once", connect_refused_nb),
    ]
}

fn dup_both(r: &mut Role) {
    let fd = r.open();
    if r.is_server() {
        let copy = r.call(ops::dup(fd)).v as RawFd;
        r.call(ops::recv(fd, 100, 0));
        r.call(ops::send(copy, b"from copy", 0));
        r.call(ops::close(fd));
        r.barrier("closed");
        r.call(ops::recv(copy, 100, 0));
        r.call(ops::send(copy, b"still", 0));
    } else {
        r.call(ops::send(fd, b"first", 0));
        r.call(ops::recv(fd, 100, 0));
        r.barrier("closed");
        r.call(ops::send(fd, b"second", 0));
        r.call(ops::recv(fd, 100, 0));
    }
}

fn dup2_chosen(r: &mut Role) {
    let fd = r.open();
    let n = r.call(ops::dup2(fd, 40)).v as RawFd;
    r.call(ops::close(fd));
    if r.is_server() {
        r.call(ops::recv(n, 100, 0));
        r.call(ops::send(n, b"via 40", 0));
    } else {
        r.call(ops::send(n, b"hello 40", 0));
        r.call(ops::recv(n, 100, 0));
    }
}

fn close_one_dup(r: &mut Role) {
    let fd = r.open();
    if r.is_server() {
        let copy = r.call(ops::dup(fd)).v as RawFd;
        r.call(ops::close(fd));
        r.barrier("one closed");
        r.barrier("looked");
        r.call(ops::send(copy, b"alive", 0));
        r.barrier("sent");
        r.call(ops::close(copy));
        r.barrier("all closed");
    } else {
        r.barrier("one closed");
        r.call(ops::recv(fd, 100, libc::MSG_DONTWAIT));
        r.call(ops::poll(&[(fd, libc::POLLIN | libc::POLLRDHUP)], 0));
        r.barrier("looked");
        r.barrier("sent");
        r.await_bytes(fd, 5);
        r.call(ops::recv(fd, 100, 0));
        r.barrier("all closed");
        r.await_eof(fd);
        r.call(ops::recv(fd, 100, 0));
    }
}

fn dupfd_cloexec(r: &mut Role) {
    let fd = r.open();
    let n = r.call(ops::fcntl_dupfd(fd, 10, true)).v as RawFd;
    r.call(ops::fcntl_get(n, libc::F_GETFD));
    r.call(ops::fcntl_get(fd, libc::F_GETFD));
    if r.is_server() {
        r.call(ops::recv(n, 100, 0));
    } else {
        r.call(ops::send(n, b"via dupfd", 0));
    }
}

fn close_then_ebadf(r: &mut Role) {
    let fd = r.open();
    if r.is_server() {
        r.barrier("closed");
        r.await_eof(fd);
        r.call(ops::recv(fd, 100, 0));
    } else {
        r.call(ops::close(fd));
        r.call(ops::recv(fd, 100, libc::MSG_DONTWAIT));
        r.call(ops::send(fd, b"x", libc::MSG_NOSIGNAL));
        r.call(ops::poll(&[(fd, libc::POLLIN)], 0));
        r.call(ops::ioctl_int(fd, libc::FIONREAD, "FIONREAD"));
        r.call(ops::close(fd));
        r.barrier("closed");
    }
}

fn fd_numbers(r: &mut Role) {
    if r.is_server() {
        let l = r.listen();
        r.barrier("listening");
        let a: Vec<RawFd> = (0..3).map(|_| r.accept(l)).collect();
        r.ring("connected", 3);
        r.call(ops::close(a[1]));
        r.barrier("closed");
        r.accept(l);
        r.ring("reconnected", 3);
    } else {
        r.barrier("listening");
        let c: Vec<RawFd> = (0..3).map(|_| r.connect()).collect();
        r.ring("connected", 3);
        r.call(ops::close(c[1]));
        r.barrier("closed");
        r.connect();
        r.ring("reconnected", 3);
    }
}

fn accept4_flags(r: &mut Role) {
    if r.is_server() {
        let l = r.listen();
        r.barrier("listening");
        let fd = r
            .call(ops::accept(
                l,
                Some(libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC),
            ))
            .v as RawFd;
        r.ring("connected", 1);
        r.call(ops::fcntl_get(fd, libc::F_GETFL));
        r.call(ops::fcntl_get(fd, libc::F_GETFD));
        r.call(ops::recv(fd, 100, 0));
        r.barrier("empty");
        r.barrier("sent");
        r.await_bytes(fd, 2);
        r.call(ops::recv(fd, 100, 0));
    } else {
        r.barrier("listening");
        let fd = r.connect();
        r.ring("connected", 1);
        r.barrier("empty");
        r.call(ops::send(fd, b"hi", 0));
        r.barrier("sent");
    }
}

fn accept_nonblocking(r: &mut Role) {
    if r.is_server() {
        let l = r.listen();
        r.call(ops::set_nonblock(l, true));
        r.call(ops::accept(l, None));
        r.barrier("listening");
        r.barrier("connecting");
        r.await_events(l, libc::POLLIN);
        let fd = r.call(ops::accept(l, None)).v as RawFd;
        r.ring("connected", 1);
        r.call(ops::fcntl_get(fd, libc::F_GETFL));
        r.blocking_until("go", move || ops::recv(fd, 100, 0).0);
    } else {
        r.barrier("listening");
        let fd = r.connect();
        r.barrier("connecting");
        r.ring("connected", 1);
        r.barrier("go");
        r.call(ops::send(fd, b"go", 0));
    }
}

/// A non-blocking socket's connect to `sa`, then POLLOUT and SO_ERROR.
fn connect_nb(r: &Role, sa: &(libc::sockaddr_storage, libc::socklen_t)) -> RawFd {
    let fd = r
        .call(ops::socket(
            libc::AF_INET,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK,
        ))
        .v as RawFd;
    r.call(ops::connect(fd, sa));
    r.call(ops::poll(&[(fd, libc::POLLOUT)], 5000));
    r.call(ops::so_error(fd));
    r.call(ops::so_error(fd));
    fd
}

fn nonblocking_connect(r: &mut Role) {
    if r.is_server() {
        let l = r.listen();
        r.barrier("listening");
        let fd = r.accept(l);
        r.ring("connected", 1);
        r.call(ops::recv(fd, 100, 0));
        r.call(ops::send(fd, b"back", 0));
    } else {
        r.barrier("listening");
        let fd = connect_nb(r, &r.server_addr());
        r.ring("connected", 1);
        r.call(ops::name(fd, true));
        r.call(ops::send(fd, b"there", 0));
        r.await_bytes(fd, 4);
        r.call(ops::recv(fd, 100, 0));
    }
}

fn nonblocking_io(r: &mut Role) {
    let fd = r.open();
    r.call(ops::set_nonblock(fd, true));
    r.call(ops::fcntl_get(fd, libc::F_GETFL));
    r.call(ops::recv(fd, 100, 0));
    r.barrier("empty");
    r.call(ops::send(fd, if r.is_server() { b"S" } else { b"C" }, 0));
    r.barrier("sent");
    r.await_bytes(fd, 1);
    r.call(ops::recv(fd, 100, 0));
    r.call(ops::recv(fd, 100, 0));
}

/// A socket bound to the port without listening, so that nothing else
/// takes the port while the client's connect is refused.
fn hold_port(r: &Role) {
    let s = r.call(ops::socket(libc::AF_INET, libc::SOCK_STREAM)).v as RawFd;
    r.call(ops::setsockopt_int(
        s,
        libc::SOL_SOCKET,
        libc::SO_REUSEADDR,
        "SO_REUSEADDR",
        1,
    ));
    r.call(ops::bind(s, &r.server_addr()));
}

/// The server holds the port without listening while the client runs
/// `client` against it.
fn refused(r: &Role, client: fn(&Role)) {
    if r.is_server() {
        hold_port(r);
    }
    r.barrier("bound");
    if !r.is_server() {
        client(r);
    }
    r.barrier("done");
}

fn connect_refused(r: &mut Role) {
    refused(r, |r| {
        let fd = r.call(ops::socket(libc::AF_INET, libc::SOCK_STREAM)).v as RawFd;
        r.call(ops::connect(fd, &r.server_addr()));
        r.call(ops::so_error(fd));
        r.call(ops::connect(fd, &r.server_addr()));
        r.call(ops::send(fd, b"x", libc::MSG_NOSIGNAL));
        r.call(ops::recv(fd, 10, 0));
    });
}

fn connect_refused_nb(r: &mut Role) {
    refused(r, |r| {
        let fd = connect_nb(r, &r.server_addr());
        r.call(ops::poll(&[(fd, libc::POLLIN | libc::POLLOUT)], 0));
        r.call(ops::recv(fd, 10, 0));
    });
}
