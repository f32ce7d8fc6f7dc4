//! Data basics: sizes from 1 B to 8 MiB with fingerprints, peek,
//! MSG_WAITALL, MSG_DONTWAIT, blocking reads, half-close, when the peer's
//! bytes and end of stream become visible, many connections, IPv6.

use std::net::Ipv6Addr;

use crate::addr;
use crate::ops;
use crate::role::Role;
use crate::scenario::{sc, Scenario};

pub fn list() -> Vec<Scenario> {
    vec![
        sc("echo_small", "a short request and reply with blocking recv on both ends", echo_small),
        sc("size_1b", "1 byte each way (fingerprints)", |r| sizes(r, 1)),
        sc("size_1000b", "1000 bytes each way (fingerprints)", |r| sizes(r, 1000)),
        sc("size_64k", "64 KiB each way (fingerprints)", |r| sizes(r, 64 << 10)),
        sc("size_odd_100003", "100003 bytes each way, not a multiple of any slot size", |r| sizes(r, 100_003)),
        sc("size_1m", "1 MiB each way (fingerprints)", |r| sizes(r, 1 << 20)),
        sc("size_8m", "8 MiB each way (fingerprints)", |r| sizes(r, 8 << 20)),
        sc("both_ways_at_once_4m", "4 MiB sent by both ends at the same time, each reading while it writes", both_ways_at_once),
        sc("many_small_sends", "1000 sends of 10 bytes arrive as one stream in order", many_small_sends),
        sc("peek_then_read", "MSG_PEEK shorter and longer than the data, then reads consume it", peek_then_read),
        sc("waitall_blocks_for_rest", "recv(MSG_WAITALL) with half the bytes there blocks until the rest comes", waitall_blocks),
        sc("waitall_short_at_eof", "recv(MSG_WAITALL) returns what there is when the peer shuts down", waitall_eof),
        sc("peek_waitall_blocks_for_rest", "recv(MSG_PEEK|MSG_WAITALL) with half the bytes there blocks until the rest comes in two sends, and takes nothing", peek_waitall_blocks),
        sc("peek_waitall_short_at_eof", "recv(MSG_PEEK|MSG_WAITALL) blocks, then returns what there is when the peer shuts down", peek_waitall_eof),
        sc("peek_iovecs", "recvmsg(MSG_PEEK) into three buffers fills them in turn; with MSG_WAITALL it blocks until all are full", peek_iovecs),
        sc("peek_trunc_waitall", "recv(MSG_PEEK|MSG_TRUNC|MSG_WAITALL) counts without copying and blocks until the length is there", peek_trunc_waitall),
        sc("dontwait_empty_then_data", "MSG_DONTWAIT on an empty socket is EAGAIN, then returns the bytes", dontwait),
        sc("recv_blocks_until_data", "a blocking recv blocks until the peer sends", recv_blocks),
        sc("data_visible_after_send", "bytes are readable (MSG_DONTWAIT) as soon as the peer's send returned", visible_after_send),
        sc("eof_visible_after_close", "end of stream is readable (MSG_DONTWAIT) as soon as the peer's close returned", eof_after_close),
        sc("half_close_client", "client shutdown(SHUT_WR): server reads EOF and still replies; the client's later send is EPIPE", |r| half_close(r, true)),
        sc("half_close_server", "server shutdown(SHUT_WR): client reads EOF and still sends; the server's later send is EPIPE", |r| half_close(r, false)),
        sc("many_connections_64", "64 connections open at once, each carrying its own bytes", many_connections),
        sc("accept_order_fifo", "three connections made before accept are accepted in connect order", accept_order),
        sc("ipv6_loopback", "a connection over ::1: addresses, data both ways", ipv6_loopback),
        sc("ipv4_mapped_dual_stack", "an IPv4 client accepted by a dual-stack [::] listener (mapped address)", ipv4_mapped),
    ]
}

fn echo_small(r: &mut Role) {
    let fd = r.open();
    if r.is_server() {
        r.call(ops::recv(fd, 100, 0));
        r.call(ops::send(fd, b"pong", 0));
    } else {
        r.call(ops::send(fd, b"ping", 0));
        r.call(ops::recv(fd, 100, 0));
    }
}

fn sizes(r: &mut Role, n: usize) {
    let fd = r.open();
    if r.is_server() {
        r.recv_all(fd, n);
        r.send_all(fd, n, 2, 0);
    } else {
        r.send_all(fd, n, 1, 0);
        r.recv_all(fd, n);
    }
}

fn both_ways_at_once(r: &mut Role) {
    let fd = r.open();
    let n = 4 << 20;
    let seed = if r.is_server() { 3 } else { 4 };
    let sender = std::thread::spawn(move || ops::send_all(fd, n, seed, 0).0);
    r.recv_all(fd, n);
    let line = sender.join().expect("sender thread");
    r.note(line);
}

fn many_small_sends(r: &mut Role) {
    let fd = r.open();
    if r.is_server() {
        r.recv_all(fd, 10_000);
    } else {
        let data = crate::role::payload(10_000, 5);
        let mut sent = 0;
        for chunk in data.chunks(10) {
            sent += ops::send(fd, chunk, 0).1.n();
        }
        r.note(format!("1000 sends of 10 bytes: {sent} sent"));
    }
}

fn peek_then_read(r: &mut Role) {
    let fd = r.open();
    if r.is_server() {
        r.barrier("sent");
        r.await_bytes(fd, 11);
        r.call(ops::recv(fd, 4, libc::MSG_PEEK));
        r.call(ops::recv(fd, 100, libc::MSG_PEEK));
        r.call(ops::recv(fd, 5, 0));
        r.call(ops::recv(fd, 100, libc::MSG_PEEK | libc::MSG_DONTWAIT));
        r.call(ops::recv(fd, 100, 0));
        r.call(ops::recv(fd, 100, libc::MSG_PEEK | libc::MSG_DONTWAIT));
    } else {
        r.call(ops::send(fd, b"hello world", 0));
        r.barrier("sent");
    }
}

fn waitall_blocks(r: &mut Role) {
    let fd = r.open();
    if r.is_server() {
        r.barrier("half");
        r.await_bytes(fd, 500);
        r.blocking_until("more", move || ops::recv(fd, 1000, libc::MSG_WAITALL).0);
    } else {
        r.send_all(fd, 500, 6, 0);
        r.barrier("half");
        r.barrier("more");
        r.send_all(fd, 500, 7, 0);
    }
}

fn waitall_eof(r: &mut Role) {
    let fd = r.open();
    if r.is_server() {
        r.barrier("shut");
        r.await_bytes(fd, 300);
        r.await_eof(fd);
        r.call(ops::recv(fd, 1000, libc::MSG_WAITALL));
        r.call(ops::recv(fd, 1000, libc::MSG_WAITALL));
    } else {
        r.send_all(fd, 300, 8, 0);
        r.call(ops::shutdown(fd, libc::SHUT_WR));
        r.barrier("shut");
    }
}

const PEEK_WAITALL: i32 = libc::MSG_PEEK | libc::MSG_WAITALL;

fn peek_waitall_blocks(r: &mut Role) {
    let fd = r.open();
    if r.is_server() {
        r.barrier("half");
        r.await_bytes(fd, 500);
        r.blocking_until("more", move || ops::recv(fd, 1000, PEEK_WAITALL).0);
        r.call(ops::recv(fd, 1000, libc::MSG_PEEK | libc::MSG_DONTWAIT));
        r.recv_all(fd, 1000);
    } else {
        r.send_all(fd, 500, 6, 0);
        r.barrier("half");
        r.barrier("more");
        // Each send alone leaves the peek short: it must sleep again with
        // bytes it has already seen in the queue.
        r.send_all(fd, 250, 7, 0);
        std::thread::sleep(std::time::Duration::from_millis(100));
        r.send_all(fd, 250, 8, 0);
    }
}

fn peek_waitall_eof(r: &mut Role) {
    let fd = r.open();
    if r.is_server() {
        r.barrier("sent");
        r.await_bytes(fd, 300);
        r.blocking_until("shut", move || ops::recv(fd, 1000, PEEK_WAITALL).0);
        r.call(ops::recv(fd, 1000, libc::MSG_WAITALL));
        r.call(ops::recv(fd, 1000, PEEK_WAITALL));
    } else {
        r.send_all(fd, 300, 8, 0);
        r.barrier("sent");
        r.barrier("shut");
        r.call(ops::shutdown(fd, libc::SHUT_WR));
    }
}

fn peek_iovecs(r: &mut Role) {
    let fd = r.open();
    if r.is_server() {
        r.barrier("sent");
        r.await_bytes(fd, 6);
        r.call(ops::recvmsg(fd, &[2, 3, 100], libc::MSG_PEEK));
        r.blocking_until("more", move || ops::recvmsg(fd, &[4, 4, 4], PEEK_WAITALL).0);
        r.call(ops::recvmsg(fd, &[4, 4, 4], 0));
    } else {
        r.call(ops::send(fd, b"abcdef", 0));
        r.barrier("sent");
        r.barrier("more");
        r.call(ops::send(fd, b"ghijkl", 0));
    }
}

fn peek_trunc_waitall(r: &mut Role) {
    let fd = r.open();
    if r.is_server() {
        r.barrier("sent");
        r.await_bytes(fd, 5);
        let flags = PEEK_WAITALL | libc::MSG_TRUNC;
        r.blocking_until("more", move || ops::recv(fd, 10, flags).0);
        r.call(ops::recv(fd, 100, 0));
    } else {
        r.call(ops::send(fd, b"12345", 0));
        r.barrier("sent");
        r.barrier("more");
        r.call(ops::send(fd, b"67890", 0));
    }
}

fn dontwait(r: &mut Role) {
    let fd = r.open();
    if r.is_server() {
        r.call(ops::recv(fd, 100, libc::MSG_DONTWAIT));
        r.barrier("empty");
        r.barrier("sent");
        r.await_bytes(fd, 5);
        r.call(ops::recv(fd, 100, libc::MSG_DONTWAIT));
        r.call(ops::recv(fd, 100, libc::MSG_DONTWAIT));
    } else {
        r.barrier("empty");
        r.call(ops::send(fd, b"later", 0));
        r.barrier("sent");
    }
}

fn recv_blocks(r: &mut Role) {
    let fd = r.open();
    if r.is_server() {
        r.blocking_until("go", move || ops::recv(fd, 100, 0).0);
    } else {
        r.barrier("go");
        r.call(ops::send(fd, b"late", 0));
    }
}

fn visible_after_send(r: &mut Role) {
    let fd = r.open();
    if r.is_server() {
        r.barrier("sent");
        r.call(ops::recv(fd, 100, libc::MSG_DONTWAIT));
    } else {
        r.call(ops::send(fd, b"now", 0));
        r.barrier("sent");
    }
}

fn eof_after_close(r: &mut Role) {
    let fd = r.open();
    if r.is_server() {
        r.barrier("closed");
        r.call(ops::recv(fd, 100, libc::MSG_DONTWAIT));
    } else {
        r.call(ops::close(fd));
        r.barrier("closed");
    }
}

/// One end (`client_shuts`: the client) shuts its sending side; the other
/// reads the end of stream and still replies; the shut end then cannot
/// send.
fn half_close(r: &mut Role, client_shuts: bool) {
    let fd = r.open();
    if r.is_server() != client_shuts {
        r.call(ops::send(fd, b"last", 0));
        r.call(ops::shutdown(fd, libc::SHUT_WR));
        r.barrier("shut");
        r.barrier("replied");
        r.await_bytes(fd, 5);
        r.call(ops::recv(fd, 100, 0));
        r.call(ops::send(fd, b"x", libc::MSG_NOSIGNAL));
        r.call(ops::shutdown(fd, libc::SHUT_WR));
    } else {
        r.barrier("shut");
        r.await_bytes(fd, 4);
        r.await_eof(fd);
        r.call(ops::recv(fd, 100, libc::MSG_DONTWAIT));
        r.call(ops::recv(fd, 100, libc::MSG_DONTWAIT));
        r.call(ops::recv(fd, 100, libc::MSG_DONTWAIT));
        r.call(ops::send(fd, b"reply", 0));
        r.barrier("replied");
    }
}

/// Descriptor numbers stay out of these lines (fd_numbers_lowest_free
/// checks them): one line per connection says whether its bytes came.
fn many_connections(r: &mut Role) {
    const N: usize = 64;
    let sa = r.server_addr();
    if r.is_server() {
        let l = r.listen();
        r.barrier("listening");
        let fds: Vec<i32> = (0..N).map(|_| ops::accept(l, None).1.v as i32).collect();
        r.note(format!(
            "accepted {} of {N}",
            fds.iter().filter(|&&f| f >= 0).count()
        ));
        r.ring("connected", N as u32);
        for (i, &fd) in fds.iter().enumerate() {
            let got = ops::recv_all(fd, 1000).1;
            let want = crate::role::payload(1000, 100 + i as u64);
            let ok = if got == want {
                "its bytes"
            } else {
                "WRONG bytes"
            };
            let sent = ops::send(fd, &[i as u8], 0).1;
            r.note(format!("connection {i}: {ok}, reply sent {sent}"));
        }
    } else {
        r.barrier("listening");
        let fds: Vec<i32> = (0..N)
            .map(|_| {
                let fd = ops::socket(libc::AF_INET, libc::SOCK_STREAM).1.v as i32;
                ops::connect(fd, &sa);
                fd
            })
            .collect();
        r.ring("connected", N as u32);
        for (i, &fd) in fds.iter().enumerate() {
            let sent = ops::send_all(fd, 1000, 100 + i as u64, 0).1;
            r.note(format!("connection {i}: sent {sent}"));
        }
        for (i, &fd) in fds.iter().enumerate() {
            let got = ops::recv(fd, 10, 0).1;
            r.note(format!("connection {i}: reply {got}"));
        }
    }
}

fn accept_order(r: &mut Role) {
    if r.is_server() {
        let l = r.listen();
        r.barrier("listening");
        r.barrier("connected");
        for _ in 0..3 {
            let fd = r.accept(l);
            r.await_bytes(fd, 1);
            r.call(ops::recv(fd, 10, 0));
        }
        r.ring("accepted", 3);
    } else {
        r.barrier("listening");
        for i in 0..3u8 {
            let fd = r.connect();
            r.call(ops::send(fd, &[b'0' + i], 0));
        }
        r.barrier("connected");
        r.ring("accepted", 3);
    }
}

fn names(r: &Role, fd: i32) {
    r.call(ops::name(fd, false));
    r.call(ops::name(fd, true));
}

fn ipv6_loopback(r: &mut Role) {
    let fd = if r.is_server() {
        let l = r.listen_at(libc::AF_INET6, &r.server_addr6());
        r.barrier("listening");
        let fd = r.accept(l);
        r.ring("connected", 1);
        fd
    } else {
        r.barrier("listening");
        let fd = r.connect_to(libc::AF_INET6, &r.server_addr6());
        r.ring("connected", 1);
        fd
    };
    names(r, fd);
    if r.is_server() {
        r.recv_all(fd, 5000);
        r.send_all(fd, 5000, 10, 0);
    } else {
        r.send_all(fd, 5000, 9, 0);
        r.recv_all(fd, 5000);
    }
}

fn ipv4_mapped(r: &mut Role) {
    let fd = if r.is_server() {
        let l = r.listen_at(libc::AF_INET6, &addr::v6(Ipv6Addr::UNSPECIFIED, r.port));
        r.barrier("listening");
        let fd = r.accept(l);
        r.ring("connected", 1);
        fd
    } else {
        r.barrier("listening");
        let fd = r.connect();
        r.ring("connected", 1);
        fd
    };
    names(r, fd);
    if r.is_server() {
        r.recv_all(fd, 5000);
        r.send_all(fd, 5000, 12, 0);
    } else {
        r.send_all(fd, 5000, 11, 0);
        r.recv_all(fd, 5000);
    }
}
