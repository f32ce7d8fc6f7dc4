//! Socket options and ioctls: getsockopt basics, buffer sizes, TCP_INFO's
//! state, SO_LINGER, SO_RCVTIMEO/SO_SNDTIMEO expiring, SO_RCVLOWAT, FIONREAD,
//! SIOCINQ, SIOCOUTQ, getsockname/getpeername agreeing between the ends.

use std::os::fd::RawFd;

use crate::ops;
use crate::role::Role;
use crate::scenario::{sc, Scenario};

pub fn list() -> Vec<Scenario> {
    vec![
        sc("sockopt_basics", "SO_TYPE, SO_DOMAIN, SO_PROTOCOL, SO_ACCEPTCONN, SO_ERROR, TCP_NODELAY, SO_KEEPALIVE get and set", sockopt_basics),
        sc("sockopt_buffers", "SO_SNDBUF/SO_RCVBUF set then read back (the kernel doubles them)", sockopt_buffers),
        sc("tcp_info_established", "getsockopt(TCP_INFO)'s state through both half-closes: ESTABLISHED, FIN_WAIT2 / CLOSE_WAIT, TIME_WAIT / CLOSE", tcp_info),
        sc("so_linger_get_set", "SO_LINGER default, set {1,5}, read back", so_linger),
        sc("so_rcvtimeo_expires", "SO_RCVTIMEO: a recv with nothing coming blocks, then fails with EAGAIN", rcvtimeo),
        sc("so_sndtimeo_full", "SO_SNDTIMEO: a send on a full connection blocks, then fails with EAGAIN", sndtimeo),
        sc("so_rcvlowat", "SO_RCVLOWAT 10 with 5 bytes there: poll, select not readable, recv blocks until 10", rcvlowat),
        sc("so_rcvtimeo_peek_waitall", "SO_RCVTIMEO: recv(MSG_PEEK|MSG_WAITALL) blocks, then fails with EAGAIN with nothing there, or returns the 5 bytes there", rcvtimeo_peek_waitall),
        sc("so_rcvlowat_peek", "SO_RCVLOWAT 10 with 5 bytes there: recv(MSG_PEEK) blocks until 10 and takes nothing", rcvlowat_peek),
        sc("so_rcvlowat_poll_blocks", "SO_RCVLOWAT 10 with 5 bytes there: poll blocks through 3 more bytes until 10", |r| rcvlowat_waits(r, false)),
        sc("so_rcvlowat_epoll_blocks", "SO_RCVLOWAT 10 with 5 bytes there: epoll_wait blocks through 3 more bytes until 10", |r| rcvlowat_waits(r, true)),
        sc("so_rcvlowat_dontwait", "SO_RCVLOWAT 10 with 5 bytes there: recv(MSG_DONTWAIT) and FIONREAD", rcvlowat_dontwait),
        sc("fionread_siocinq", "FIONREAD and SIOCINQ after the peer's 100 bytes arrived, and after reading 30", fionread),
        sc("siocoutq_idle", "SIOCOUTQ and SIOCOUTQNSD are 0 on an idle connection", siocoutq),
        sc("names_agree", "getsockname/getpeername on both ends: each end's local address is the other's peer", names_agree),
        sc("fionbio_ioctl", "ioctl(FIONBIO) on and off: recv EAGAIN, then a blocking recv", fionbio),
    ]
}

fn get(r: &Role, fd: RawFd, level: i32, opt: i32, name: &str) {
    r.call(ops::getsockopt_int(fd, level, opt, name));
}

fn sockopt_basics(r: &mut Role) {
    let fd = r.open();
    let sol = libc::SOL_SOCKET;
    get(r, fd, sol, libc::SO_TYPE, "SO_TYPE");
    get(r, fd, sol, libc::SO_DOMAIN, "SO_DOMAIN");
    get(r, fd, sol, libc::SO_PROTOCOL, "SO_PROTOCOL");
    get(r, fd, sol, libc::SO_ACCEPTCONN, "SO_ACCEPTCONN");
    r.call(ops::so_error(fd));
    get(r, fd, libc::IPPROTO_TCP, libc::TCP_NODELAY, "TCP_NODELAY");
    r.call(ops::setsockopt_int(
        fd,
        libc::IPPROTO_TCP,
        libc::TCP_NODELAY,
        "TCP_NODELAY",
        1,
    ));
    get(r, fd, libc::IPPROTO_TCP, libc::TCP_NODELAY, "TCP_NODELAY");
    get(r, fd, sol, libc::SO_KEEPALIVE, "SO_KEEPALIVE");
    r.call(ops::setsockopt_int(
        fd,
        sol,
        libc::SO_KEEPALIVE,
        "SO_KEEPALIVE",
        1,
    ));
    get(r, fd, sol, libc::SO_KEEPALIVE, "SO_KEEPALIVE");
    get(r, fd, sol, libc::SO_OOBINLINE, "SO_OOBINLINE");
    get(r, fd, sol, libc::SO_RCVLOWAT, "SO_RCVLOWAT");
    get(r, fd, sol, libc::SO_SNDLOWAT, "SO_SNDLOWAT");
    r.call(ops::get_timeval(fd, libc::SO_RCVTIMEO, "SO_RCVTIMEO"));
}

fn sockopt_buffers(r: &mut Role) {
    let fd = r.open();
    let sol = libc::SOL_SOCKET;
    r.call(ops::setsockopt_int(
        fd,
        sol,
        libc::SO_SNDBUF,
        "SO_SNDBUF",
        65536,
    ));
    get(r, fd, sol, libc::SO_SNDBUF, "SO_SNDBUF");
    r.call(ops::setsockopt_int(
        fd,
        sol,
        libc::SO_RCVBUF,
        "SO_RCVBUF",
        65536,
    ));
    get(r, fd, sol, libc::SO_RCVBUF, "SO_RCVBUF");
    if r.is_server() {
        r.recv_all(fd, 300_000);
    } else {
        r.send_all(fd, 300_000, 30, 0);
    }
}

/// tcpi_state of TCP_INFO by name.
fn tcp_state(r: &Role, fd: RawFd) {
    let look = || {
        // SAFETY: all-zero is a valid tcp_info.
        let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
        // SAFETY: info and len are ours and sized as declared.
        let ret = ops::Ret::of(i64::from(unsafe {
            libc::getsockopt(
                fd,
                libc::IPPROTO_TCP,
                libc::TCP_INFO,
                (&mut info as *mut libc::tcp_info).cast(),
                &mut len,
            )
        }));
        (ret, info)
    };
    // FIN_WAIT1 and LAST_ACK last until the peer's ACK of our FIN, which
    // the kernel may delay: look again (bounded) until it came.
    let end = std::time::Instant::now() + std::time::Duration::from_secs(2);
    let (mut ret, mut info) = look();
    while matches!(info.tcpi_state, 4 | 9) && std::time::Instant::now() < end {
        std::thread::sleep(std::time::Duration::from_millis(5));
        (ret, info) = look();
    }
    let state = match info.tcpi_state {
        1 => "ESTABLISHED".to_string(),
        4 => "FIN_WAIT1".to_string(),
        5 => "FIN_WAIT2".to_string(),
        6 => "TIME_WAIT".to_string(),
        7 => "CLOSE".to_string(),
        8 => "CLOSE_WAIT".to_string(),
        9 => "LAST_ACK".to_string(),
        n => format!("{n}"),
    };
    r.note(format!("getsockopt({fd}, TCP_INFO) = {ret} state={state}"));
}

fn tcp_info(r: &mut Role) {
    let fd = r.open();
    tcp_state(r, fd);
    r.barrier("looked");
    if r.is_server() {
        r.barrier("shut");
        r.await_eof(fd);
        tcp_state(r, fd);
        r.barrier("seen");
        r.barrier("looked again");
        r.call(ops::shutdown(fd, libc::SHUT_WR));
        r.barrier("both");
        tcp_state(r, fd);
    } else {
        r.call(ops::shutdown(fd, libc::SHUT_WR));
        r.barrier("shut");
        r.barrier("seen");
        tcp_state(r, fd);
        r.barrier("looked again");
        r.await_eof(fd);
        r.barrier("both");
        tcp_state(r, fd);
    }
}

fn so_linger(r: &mut Role) {
    let fd = r.open();
    let show = |r: &Role| {
        let mut l = libc::linger {
            l_onoff: -1,
            l_linger: -1,
        };
        let mut len = std::mem::size_of::<libc::linger>() as libc::socklen_t;
        // SAFETY: l and len are ours and sized as declared.
        let ret = ops::Ret::of(i64::from(unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_LINGER,
                (&mut l as *mut libc::linger).cast(),
                &mut len,
            )
        }));
        r.note(format!(
            "getsockopt({fd}, SO_LINGER) = {ret} {{{}, {}}}",
            l.l_onoff, l.l_linger
        ));
    };
    show(r);
    let l = libc::linger {
        l_onoff: 1,
        l_linger: 5,
    };
    r.call(ops::setsockopt_raw(
        fd,
        libc::SOL_SOCKET,
        libc::SO_LINGER,
        "SO_LINGER {1,5}",
        &l,
    ));
    show(r);
}

/// A timeval option of `secs`.
fn set_timeo(r: &Role, fd: RawFd, opt: i32, name: &str, secs: i64) {
    let tv = libc::timeval {
        tv_sec: secs,
        tv_usec: 0,
    };
    r.call(ops::setsockopt_raw(
        fd,
        libc::SOL_SOCKET,
        opt,
        &format!("{name} {secs}s"),
        &tv,
    ));
    r.call(ops::get_timeval(fd, opt, name));
}

fn rcvtimeo(r: &mut Role) {
    let fd = r.open();
    if r.is_server() {
        set_timeo(r, fd, libc::SO_RCVTIMEO, "SO_RCVTIMEO", 3);
        r.blocking_until("waited", move || ops::recv(fd, 100, 0).0);
        r.call(ops::send(fd, b"done", 0));
    } else {
        r.barrier("waited");
        r.call(ops::recv(fd, 100, 0));
    }
}

fn rcvtimeo_peek_waitall(r: &mut Role) {
    let fd = r.open();
    let flags = libc::MSG_PEEK | libc::MSG_WAITALL;
    if r.is_server() {
        set_timeo(r, fd, libc::SO_RCVTIMEO, "SO_RCVTIMEO", 3);
        r.blocking_until("empty waited", move || ops::recv(fd, 100, flags).0);
        r.barrier("empty done");
        r.barrier("five");
        r.await_bytes(fd, 5);
        r.blocking_until("five waited", move || ops::recv(fd, 100, flags).0);
        r.call(ops::recv(fd, 100, 0));
    } else {
        r.barrier("empty waited");
        r.barrier("empty done");
        r.call(ops::send(fd, b"12345", 0));
        r.barrier("five");
        r.barrier("five waited");
    }
}

/// Fills the connection from this end with non-blocking sends until
/// EAGAIN (the peer does not read); one line, without the count (the
/// kernel's buffer sizes are its own).
pub fn fill(r: &Role, fd: RawFd) {
    let chunk = vec![0x5au8; 65536];
    // Until EAGAIN, then again after a pause, until a pause frees no room:
    // kernel TCP moves queued bytes to the receiver (and grows its
    // buffers) after the first EAGAIN, which would let the next send in.
    let mut last = None;
    for _ in 0..50 {
        let mut sent_any = false;
        for _ in 0..100_000 {
            let (_, ret) = ops::send(fd, &chunk, libc::MSG_DONTWAIT);
            if !ret.ok() {
                last = Some(ret);
                break;
            }
            sent_any = true;
        }
        if last.is_some() && !sent_any {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    match last {
        Some(ret) => r.note(format!("filled: send(MSG_DONTWAIT) ends with {ret}")),
        None => r.note("filled: never got EAGAIN"),
    }
}

fn sndtimeo(r: &mut Role) {
    let fd = r.open();
    if r.is_server() {
        r.barrier("waited");
    } else {
        set_timeo(r, fd, libc::SO_SNDTIMEO, "SO_SNDTIMEO", 3);
        fill(r, fd);
        r.blocking_until("waited", move || ops::send(fd, b"x", 0).0);
    }
}

/// SO_RCVLOWAT 10 on the server; the client sends 5 bytes, which the
/// server waits for after the barrier `five`.
fn lowat_five(r: &Role, fd: RawFd) {
    if r.is_server() {
        let (sol, opt) = (libc::SOL_SOCKET, libc::SO_RCVLOWAT);
        r.call(ops::setsockopt_int(fd, sol, opt, "SO_RCVLOWAT", 10));
        r.barrier("five");
        r.await_bytes(fd, 5);
    } else {
        r.call(ops::send(fd, b"12345", 0));
        r.barrier("five");
    }
}

fn rcvlowat(r: &mut Role) {
    let fd = r.open();
    lowat_five(r, fd);
    if r.is_server() {
        r.call(ops::poll(&[(fd, libc::POLLIN | libc::POLLRDNORM)], 0));
        let set = ops::Sets {
            r: vec![fd],
            ..Default::default()
        };
        r.call(ops::select(&set, Some(0)));
        r.blocking_until("more", move || ops::recv(fd, 100, 0).0);
    } else {
        r.barrier("more");
        r.call(ops::send(fd, b"67890", 0));
    }
}

fn rcvlowat_peek(r: &mut Role) {
    let fd = r.open();
    lowat_five(r, fd);
    if r.is_server() {
        r.blocking_until("more", move || ops::recv(fd, 100, libc::MSG_PEEK).0);
        r.call(ops::recv(fd, 100, 0));
    } else {
        r.barrier("more");
        r.call(ops::send(fd, b"67890", 0));
    }
}

/// A blocking poll (or epoll_wait) for the server's 10-byte low mark with
/// 5 bytes there: 3 more leave it asleep, 2 more wake it. Its timeout is
/// longer than the probe waits after the release: a wait that sleeps
/// through the last bytes until it times out shows as one that never
/// returned.
fn rcvlowat_waits(r: &mut Role, epoll: bool) {
    let fd = r.open();
    lowat_five(r, fd);
    if r.is_server() {
        let release = |r: &Role| {
            r.barrier("more");
            r.barrier("eight");
        };
        if epoll {
            let ep = r.call(ops::epoll_create()).v as RawFd;
            r.call(ops::epoll_ctl(
                ep,
                libc::EPOLL_CTL_ADD,
                fd,
                libc::EPOLLIN as u32,
            ));
            r.blocking(move || ops::epoll_wait(ep, 8, 20_000).0, release);
        } else {
            let events = libc::POLLIN | libc::POLLRDNORM;
            r.blocking(move || ops::poll(&[(fd, events)], 20_000).0, release);
        }
        // 8 bytes here would say the wait ended before the last send.
        r.call(ops::recv(fd, 100, libc::MSG_DONTWAIT));
    } else {
        r.barrier("more");
        r.call(ops::send(fd, b"678", 0));
        r.barrier("eight");
        std::thread::sleep(std::time::Duration::from_millis(200));
        r.call(ops::send(fd, b"90", 0));
    }
}

fn rcvlowat_dontwait(r: &mut Role) {
    let fd = r.open();
    lowat_five(r, fd);
    if r.is_server() {
        r.call(ops::ioctl_int(fd, libc::FIONREAD, "FIONREAD"));
        r.call(ops::recv(fd, 100, libc::MSG_DONTWAIT));
    }
}

fn fionread(r: &mut Role) {
    let fd = r.open();
    if r.is_server() {
        r.call(ops::ioctl_int(fd, libc::FIONREAD, "FIONREAD"));
        r.barrier("empty");
        r.barrier("sent");
        r.await_bytes(fd, 100);
        r.call(ops::ioctl_int(fd, libc::FIONREAD, "FIONREAD"));
        r.call(ops::ioctl_int(fd, ops::SIOCINQ, "SIOCINQ"));
        r.call(ops::recv(fd, 30, 0));
        r.call(ops::ioctl_int(fd, libc::FIONREAD, "FIONREAD"));
        r.recv_all(fd, 70);
        r.call(ops::ioctl_int(fd, libc::FIONREAD, "FIONREAD"));
    } else {
        r.barrier("empty");
        r.send_all(fd, 100, 31, 0);
        r.barrier("sent");
    }
}

fn siocoutq(r: &mut Role) {
    let fd = r.open();
    r.call(ops::ioctl_int(fd, ops::SIOCOUTQ, "SIOCOUTQ"));
    r.call(ops::ioctl_int(fd, libc::SIOCOUTQNSD, "SIOCOUTQNSD"));
}

fn names_agree(r: &mut Role) {
    let fd = r.open();
    r.call(ops::name(fd, false));
    r.call(ops::name(fd, true));
    let (local, peer) = raw_names(fd);
    let theirs = r.exchange("names", &format!("{local} {peer}"));
    let agree = theirs == format!("{peer} {local}");
    r.note(format!(
        "the peer's local and peer addresses are my peer and local ones: {}",
        if agree { "yes" } else { "no" }
    ));
}

/// This end's local and peer addresses with their real ports.
fn raw_names(fd: RawFd) -> (String, String) {
    let get = |peer: bool| {
        // SAFETY: all-zero is a valid sockaddr_storage.
        let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        let sa = (&mut ss as *mut libc::sockaddr_storage).cast();
        // SAFETY: ss and len are ours and sized as declared.
        unsafe {
            if peer {
                libc::getpeername(fd, sa, &mut len);
            } else {
                libc::getsockname(fd, sa, &mut len);
            }
        }
        // SAFETY: the kernel filled a sockaddr_in for this IPv4 socket.
        let sin = unsafe { &*(&ss as *const _ as *const libc::sockaddr_in) };
        format!(
            "{}:{}",
            std::net::Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)),
            u16::from_be(sin.sin_port)
        )
    };
    (get(false), get(true))
}

fn fionbio(r: &mut Role) {
    let fd = r.open();
    if r.is_server() {
        let mut on: i32 = 1;
        // SAFETY: FIONBIO reads one int, which `on` is.
        let ret = ops::Ret::of(i64::from(unsafe {
            libc::ioctl(fd, libc::FIONBIO, &mut on)
        }));
        r.note(format!("ioctl({fd}, FIONBIO, 1) = {ret}"));
        r.call(ops::recv(fd, 100, 0));
        r.call(ops::fcntl_get(fd, libc::F_GETFL));
        let mut off: i32 = 0;
        // SAFETY: as above.
        let ret = ops::Ret::of(i64::from(unsafe {
            libc::ioctl(fd, libc::FIONBIO, &mut off)
        }));
        r.note(format!("ioctl({fd}, FIONBIO, 0) = {ret}"));
        r.call(ops::fcntl_get(fd, libc::F_GETFL));
        r.blocking_until("go", move || ops::recv(fd, 100, 0).0);
    } else {
        r.barrier("go");
        r.call(ops::send(fd, b"now", 0));
    }
}
