//! The other data calls: readv/writev, sendmsg/recvmsg, recvfrom on a
//! connected socket, read/write, MSG_TRUNC, MSG_ERRQUEUE, MSG_MORE,
//! zero-length calls, sendfile, calls on sockets that are not connected.

use std::os::fd::AsRawFd;

use crate::ops;
use crate::role::{payload, Role};
use crate::scenario::{sc, Scenario};

pub fn list() -> Vec<Scenario> {
    vec![
        sc(
            "readv_writev",
            "writev of three parts, readv into three buffers of other sizes",
            readv_writev,
        ),
        sc(
            "sendmsg_recvmsg",
            "sendmsg of three parts, recvmsg into two: namelen 0, no control data, msg_flags 0",
            sendmsg_recvmsg,
        ),
        sc(
            "recvfrom_connected_no_address",
            "recvfrom with an address buffer on connected TCP: no address, addrlen 0",
            recvfrom_connected,
        ),
        sc(
            "read_write_syscalls",
            "read(2) and write(2) on the connection, both ways",
            read_write,
        ),
        sc(
            "generic_syscall_read_write_close",
            "syscall(SYS_write), syscall(SYS_read) and syscall(SYS_close) on the connection: data both ways, then EOF",
            generic_syscall,
        ),
        sc(
            "msg_trunc_discards",
            "recv(MSG_TRUNC) on TCP discards the bytes without copying them and returns the length",
            msg_trunc,
        ),
        sc(
            "msg_errqueue_eagain",
            "recv and recvmsg with MSG_ERRQUEUE return EAGAIN at once (nothing queued)",
            msg_errqueue,
        ),
        sc(
            "msg_more_then_flush",
            "send(MSG_MORE) then a plain send: the peer gets both, in order",
            msg_more,
        ),
        sc(
            "zero_length_calls",
            "send, read and recv of 0 bytes: recv waits for data as for one byte, read and send return 0",
            zero_length,
        ),
        sc(
            "sendfile_whole_file",
            "sendfile of a 200000-byte file from its position, then the position",
            sendfile_file,
        ),
        sc(
            "sendfile_with_offset",
            "sendfile with an offset: the offset advances, the file position does not",
            sendfile_offset,
        ),
        sc(
            "unconnected_socket_calls",
            "recv, send, getpeername, shutdown on a socket never connected: ENOTCONN / EPIPE",
            unconnected,
        ),
        sc(
            "connect_again_eisconn",
            "connect on a connected socket is EISCONN; the connection still works",
            connect_again,
        ),
    ]
}

fn readv_writev(r: &mut Role) {
    let fd = r.open();
    if r.is_server() {
        r.barrier("sent");
        r.await_bytes(fd, 8);
        r.call(ops::readv(fd, &[2, 3, 10]));
        r.call(ops::writev(fd, &[b"x", b"yz"]));
    } else {
        r.call(ops::writev(fd, &[b"abc", b"defg", b"h"]));
        r.barrier("sent");
        r.await_bytes(fd, 3);
        r.call(ops::readv(fd, &[1, 1, 1, 1]));
    }
}

fn sendmsg_recvmsg(r: &mut Role) {
    let fd = r.open();
    if r.is_server() {
        r.barrier("sent");
        r.await_bytes(fd, 11);
        r.call(ops::recvmsg(fd, &[4, 100], 0));
        r.call(ops::sendmsg(fd, &[b"ok"], 0));
    } else {
        r.call(ops::sendmsg(fd, &[b"hello", b" ", b"world"], 0));
        r.barrier("sent");
        r.call(ops::recvmsg(fd, &[100], 0));
    }
}

fn recvfrom_connected(r: &mut Role) {
    let fd = r.open();
    if r.is_server() {
        r.barrier("sent");
        r.await_bytes(fd, 6);
        r.call(ops::recvfrom(fd, 3, 0, true));
        r.call(ops::recvfrom(fd, 3, 0, false));
        r.call(ops::recvfrom(fd, 3, libc::MSG_DONTWAIT, true));
    } else {
        r.call(ops::send(fd, b"abcdef", 0));
        r.barrier("sent");
    }
}

fn read_write(r: &mut Role) {
    let fd = r.open();
    if r.is_server() {
        r.call(ops::read(fd, 100));
        r.call(ops::write(fd, b"world"));
    } else {
        r.call(ops::write(fd, b"hello"));
        r.call(ops::read(fd, 100));
    }
}

fn generic_syscall(r: &mut Role) {
    let fd = r.open();
    if r.is_server() {
        r.await_bytes(fd, 5);
        r.call(ops::sys_read(fd, 100));
        r.call(ops::sys_write(fd, b"world"));
        r.call(ops::sys_close(fd));
    } else {
        r.call(ops::sys_write(fd, b"hello"));
        r.await_bytes(fd, 5);
        r.call(ops::sys_read(fd, 100));
        r.await_eof(fd);
        r.call(ops::sys_read(fd, 100));
    }
}

fn msg_trunc(r: &mut Role) {
    let fd = r.open();
    if r.is_server() {
        r.barrier("sent");
        r.await_bytes(fd, 10);
        r.call(ops::recv(fd, 4, libc::MSG_TRUNC));
        r.call(ops::recv(fd, 100, libc::MSG_DONTWAIT));
    } else {
        r.call(ops::send(fd, b"abcdefghij", 0));
        r.barrier("sent");
    }
}

fn msg_errqueue(r: &mut Role) {
    let fd = r.open();
    if r.is_server() {
        r.immediate("recv(MSG_ERRQUEUE)", move || {
            ops::recv(fd, 100, libc::MSG_ERRQUEUE).0
        });
        r.immediate("recvmsg(MSG_ERRQUEUE)", move || {
            ops::recvmsg(fd, &[100], libc::MSG_ERRQUEUE).0
        });
        r.barrier("sent");
        r.await_bytes(fd, 4);
        r.immediate("recv(MSG_ERRQUEUE)", move || {
            ops::recv(fd, 100, libc::MSG_ERRQUEUE).0
        });
        r.call(ops::recv(fd, 100, 0));
    } else {
        r.call(ops::send(fd, b"data", 0));
        r.barrier("sent");
    }
}

fn msg_more(r: &mut Role) {
    let fd = r.open();
    if r.is_server() {
        r.recv_all(fd, 6);
    } else {
        r.call(ops::send(fd, b"abc", libc::MSG_MORE));
        r.call(ops::send(fd, b"def", 0));
    }
}

fn zero_length(r: &mut Role) {
    let fd = r.open();
    if r.is_server() {
        r.call(ops::recv(fd, 0, libc::MSG_DONTWAIT));
        // read(2) of nothing returns at once; recv(2) waits for data.
        r.call(ops::read(fd, 0));
        r.blocking_until("send", move || ops::recv(fd, 0, 0).0);
        r.barrier("sent");
        r.await_bytes(fd, 2);
        r.call(ops::recv(fd, 0, 0));
        r.call(ops::recv(fd, 0, libc::MSG_DONTWAIT));
        r.call(ops::recv(fd, 100, 0));
    } else {
        r.call(ops::send(fd, b"", 0));
        r.barrier("send");
        r.call(ops::send(fd, b"hi", 0));
        r.barrier("sent");
    }
}

/// A file of `n` seeded bytes in the run's scratch directory, opened.
fn data_file(r: &Role, n: usize) -> std::fs::File {
    let p = r.dir.join("sendfile.data");
    std::fs::write(&p, payload(n, 20)).expect("writing the data file");
    std::fs::File::open(&p).expect("opening the data file")
}

fn position(r: &Role, fd: i32) {
    // SAFETY: lseek on a file this role opened.
    let pos = unsafe { libc::lseek(fd, 0, libc::SEEK_CUR) };
    r.note(format!("lseek({fd}, 0, SEEK_CUR) = {pos}"));
}

fn sendfile_file(r: &mut Role) {
    const N: usize = 200_000;
    let fd = r.open();
    if r.is_server() {
        let f = data_file(r, N);
        let mut sent = 0;
        let mut calls = 0;
        while sent < N {
            let (_, ret) = ops::sendfile(fd, f.as_raw_fd(), None, N - sent);
            calls += 1;
            if !ret.ok() || ret.v == 0 {
                r.note(format!("sendfile stopped: {ret}"));
                break;
            }
            sent += ret.n();
        }
        r.note(format!(
            "sendfile sent {sent} bytes in {} call(s)",
            if calls == 1 { "one" } else { "several" }
        ));
        position(r, f.as_raw_fd());
        r.call(ops::sendfile(fd, f.as_raw_fd(), None, 10));
    } else {
        let got = r.recv_all(fd, N);
        r.note(format!(
            "the file's bytes: {}",
            if got == payload(N, 20) { "yes" } else { "no" }
        ));
    }
}

fn sendfile_offset(r: &mut Role) {
    let fd = r.open();
    if r.is_server() {
        let f = data_file(r, 5000);
        r.call(ops::sendfile(fd, f.as_raw_fd(), Some(1000), 3000));
        position(r, f.as_raw_fd());
        r.call(ops::sendfile(fd, f.as_raw_fd(), Some(4990), 100));
    } else {
        let got = r.recv_all(fd, 3010);
        let want = payload(5000, 20);
        r.note(format!(
            "bytes 1000..4000 then 4990..5000 of the file: {}",
            if got[..3000] == want[1000..4000] && got[3000..] == want[4990..] {
                "yes"
            } else {
                "no"
            }
        ));
    }
}

fn unconnected(r: &mut Role) {
    if r.is_server() {
        return;
    }
    let fd = r.call(ops::socket(libc::AF_INET, libc::SOCK_STREAM)).v as i32;
    r.call(ops::recv(fd, 10, 0));
    r.call(ops::recv(fd, 10, libc::MSG_DONTWAIT));
    r.call(ops::send(fd, b"x", libc::MSG_NOSIGNAL));
    r.call(ops::name(fd, true));
    r.call(ops::name(fd, false));
    r.call(ops::shutdown(fd, libc::SHUT_RDWR));
    r.call(ops::poll(&[(fd, libc::POLLIN | libc::POLLOUT)], 0));
    r.call(ops::ioctl_int(fd, libc::FIONREAD, "FIONREAD"));
    r.call(ops::so_error(fd));
}

fn connect_again(r: &mut Role) {
    let fd = r.open();
    if r.is_server() {
        r.call(ops::recv(fd, 100, 0));
    } else {
        r.call(ops::connect(fd, &r.server_addr()));
        r.call(ops::send(fd, b"still", 0));
    }
}
