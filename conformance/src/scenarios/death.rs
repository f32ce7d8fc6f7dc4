//! The peer going away at every stage: close with unread data (a reset),
//! SIGKILL with and without unread data, SO_LINGER {1,0}, exit and _exit
//! right after writing, shutdown(SHUT_WR) and carrying on, a close or reset
//! while this end is blocked in recv, poll, epoll_wait or send; EPIPE with
//! SIGPIPE caught, SIGPIPE at its default (the process dies of it) and
//! MSG_NOSIGNAL.

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::ops;
use crate::role::Role;
use crate::scenario::{sc, Scenario};
use crate::scenarios::options::fill;
use crate::scenarios::readiness::reset_close;

pub fn list() -> Vec<Scenario> {
    vec![
        sc("peer_close_unread_data", "peer closes with our bytes unread: POLLERR|POLLHUP, recv ECONNRESET then 0, send EPIPE", close_unread),
        sc("peer_close_unread_after_fin", "peer shuts down, then closes with our bytes unread: recv stays 0, SO_ERROR EPIPE, send EPIPE", close_unread_after_fin),
        sc("peer_sigkill_unread_data", "peer SIGKILLed with our bytes unread: a reset, as for close", sigkill_unread),
        sc("peer_sigkill_idle", "peer SIGKILLed with nothing unread: EOF, the first send accepted, the next EPIPE", sigkill_idle),
        sc("peer_reset_with_our_data_unread", "peer sends then resets (SO_LINGER {1,0}): what recv returns of its bytes, then the error", reset_with_unread),
        sc("peer_exit_after_write", "peer writes 300000 bytes and exit()s with the socket open: all arrive, then EOF", |r| exit_after_write(r, Ending::Exit)),
        sc("peer_underscore_exit_after_write", "peer writes 300000 bytes and _exit()s with the socket open: all arrive, then EOF", |r| exit_after_write(r, Ending::UnderscoreExit)),
        sc("peer_killed_after_write", "peer writes 300000 bytes and is SIGKILLed: all arrive, then EOF", |r| exit_after_write(r, Ending::Kill)),
        sc("peer_shutdown_wr_then_more", "peer shutdown(SHUT_WR), reads our reply, shuts again, then cannot send", shutdown_wr_then_more),
        sc("peer_close_while_recv_blocked", "a recv blocked on an idle connection returns 0 when the peer closes", |r| blocked(r, Wait::Recv, false)),
        sc("peer_reset_while_recv_blocked", "a recv blocked on an idle connection fails ECONNRESET when the peer resets", |r| blocked(r, Wait::Recv, true)),
        sc("peer_close_while_poll_blocked", "poll(POLLIN|POLLRDHUP, -1) blocked on an idle connection wakes when the peer closes", |r| blocked(r, Wait::Poll, false)),
        sc("peer_reset_while_poll_blocked", "poll(POLLIN, -1) blocked on an idle connection wakes when the peer resets", |r| blocked(r, Wait::Poll, true)),
        sc("peer_close_while_epoll_blocked", "epoll_wait(-1) blocked on an idle connection wakes when the peer closes", |r| blocked(r, Wait::Epoll, false)),
        sc("peer_reset_while_send_blocked", "a send blocked on a full connection fails when the peer resets", send_blocked_reset),
        sc("epipe_sigpipe_caught", "after the peer closed: a send is accepted, the next EPIPE with one SIGPIPE (caught)", epipe_caught),
        sc("epipe_sigpipe_default_kills", "after the peer closed, SIGPIPE at its default disposition kills the sender", epipe_kills),
        sc("epipe_msg_nosignal", "after the peer closed, send(MSG_NOSIGNAL) is EPIPE and the sender lives", epipe_nosignal),
        sc("epipe_write_sigpipe", "after the peer closed, write(2) raises SIGPIPE as send does (caught)", epipe_write),
    ]
}

const ALL: i16 = libc::POLLIN | libc::POLLPRI | libc::POLLOUT | libc::POLLRDHUP;

/// The dying role: passes `dying` and SIGKILLs itself.
fn die(r: &Role) -> ! {
    r.barrier("dying");
    // SAFETY: raising a signal at ourselves.
    unsafe { libc::raise(libc::SIGKILL) };
    unreachable!("SIGKILL returned");
}

/// The surviving role: passes `dying`, then `dead`, which the runner
/// answers once the other role's processes are gone.
fn outlive(r: &Role) {
    r.barrier("dying");
    r.barrier("dead");
}

/// What the survivor sees after the peer's reset: poll, SO_ERROR,
/// receives, a send.
fn after_reset(r: &Role, fd: RawFd) {
    r.await_reset(fd);
    r.call(ops::poll(&[(fd, ALL)], 0));
    r.call(ops::recv(fd, 100, 0));
    r.call(ops::recv(fd, 100, 0));
    r.call(ops::send(fd, b"x", libc::MSG_NOSIGNAL));
    r.call(ops::so_error(fd));
    r.call(ops::poll(&[(fd, ALL)], 0));
}

fn close_unread(r: &mut Role) {
    let fd = r.open();
    if r.is_server() {
        r.call(ops::send(fd, b"unread", 0));
        r.barrier("closed");
        after_reset(r, fd);
    } else {
        r.await_bytes(fd, 6);
        r.call(ops::close(fd));
        r.barrier("closed");
    }
}

/// The peer's reset finds this end in CLOSE_WAIT: the kernel keeps EPIPE
/// as the socket's error, and a receive after the FIN returns 0 without
/// taking it.
fn close_unread_after_fin(r: &mut Role) {
    let fd = r.open();
    if r.is_server() {
        r.await_eof(fd);
        r.call(ops::send(fd, b"unread", 0));
        r.barrier("closed");
        r.await_events(fd, libc::POLLERR);
        r.call(ops::poll(&[(fd, ALL)], 0));
        r.call(ops::recv(fd, 100, 0));
        r.call(ops::recv(fd, 100, 0));
        r.call(ops::so_error(fd));
        r.call(ops::send(fd, b"x", libc::MSG_NOSIGNAL));
        r.call(ops::poll(&[(fd, ALL)], 0));
    } else {
        r.call(ops::shutdown(fd, libc::SHUT_WR));
        r.await_bytes(fd, 6);
        r.call(ops::close(fd));
        r.barrier("closed");
    }
}

fn sigkill_unread(r: &mut Role) {
    let fd = r.open();
    if r.is_server() {
        r.call(ops::send(fd, b"unread", 0));
        outlive(r);
        after_reset(r, fd);
    } else {
        r.await_bytes(fd, 6);
        die(r);
    }
}

fn sigkill_idle(r: &mut Role) {
    let fd = r.open();
    if r.is_server() {
        outlive(r);
        r.await_eof(fd);
        r.call(ops::poll(&[(fd, ALL)], 0));
        r.call(ops::recv(fd, 100, 0));
        r.call(ops::send(fd, b"first", libc::MSG_NOSIGNAL));
        r.await_events(fd, libc::POLLERR | libc::POLLHUP);
        r.call(ops::poll(&[(fd, ALL)], 0));
        r.call(ops::send(fd, b"second", libc::MSG_NOSIGNAL));
        r.call(ops::recv(fd, 100, 0));
    } else {
        die(r);
    }
}

fn reset_with_unread(r: &mut Role) {
    let fd = r.open();
    if r.is_server() {
        r.barrier("sent");
        r.await_bytes(fd, 12);
        r.barrier("reset");
        r.await_events(fd, libc::POLLERR | libc::POLLHUP | libc::POLLRDHUP);
        r.call(ops::poll(&[(fd, ALL)], 0));
        r.call(ops::ioctl_int(fd, libc::FIONREAD, "FIONREAD"));
        r.call(ops::recv(fd, 100, 0));
        r.call(ops::recv(fd, 100, 0));
        r.call(ops::recv(fd, 100, 0));
    } else {
        r.call(ops::send(fd, b"before reset", 0));
        r.barrier("sent");
        reset_close(r, fd);
        r.barrier("reset");
    }
}

enum Ending {
    Exit,
    UnderscoreExit,
    Kill,
}

fn exit_after_write(r: &mut Role, how: Ending) {
    let fd = r.open();
    if r.is_server() {
        r.barrier("written");
        r.recv_to_end(fd, 1 << 20);
        r.call(ops::recv(fd, 100, 0));
    } else {
        r.send_all(fd, 300_000, 40, 0);
        r.barrier("written");
        match how {
            Ending::Exit => std::process::exit(0),
            // SAFETY: ending the process at once is the point.
            Ending::UnderscoreExit => unsafe { libc::_exit(0) },
            Ending::Kill => {
                // SAFETY: raising a signal at ourselves.
                unsafe { libc::raise(libc::SIGKILL) };
            }
        }
    }
}

fn shutdown_wr_then_more(r: &mut Role) {
    let fd = r.open();
    if r.is_server() {
        r.barrier("shut");
        r.await_eof(fd);
        r.call(ops::recv(fd, 100, 0));
        r.call(ops::send(fd, b"reply", 0));
        r.barrier("replied");
        r.barrier("again");
        r.call(ops::send(fd, b"more", 0));
        r.barrier("more");
        r.call(ops::recv(fd, 100, libc::MSG_DONTWAIT));
    } else {
        r.call(ops::shutdown(fd, libc::SHUT_WR));
        r.barrier("shut");
        r.barrier("replied");
        r.await_bytes(fd, 5);
        r.call(ops::recv(fd, 100, 0));
        r.call(ops::shutdown(fd, libc::SHUT_WR));
        r.call(ops::send(fd, b"x", libc::MSG_NOSIGNAL));
        r.call(ops::poll(&[(fd, ALL)], 0));
        r.barrier("again");
        r.barrier("more");
        r.await_bytes(fd, 4);
        r.call(ops::recv(fd, 100, 0));
    }
}

#[derive(Clone, Copy)]
enum Wait {
    Recv,
    Poll,
    Epoll,
}

/// The server blocks in `wait` on an idle connection; the client closes
/// (or resets) it at the release.
fn blocked(r: &mut Role, wait: Wait, reset: bool) {
    let fd = r.open();
    if r.is_server() {
        match wait {
            Wait::Recv => r.blocking_until("close", move || ops::recv(fd, 100, 0).0),
            Wait::Poll => {
                let ev = libc::POLLIN | if reset { 0 } else { libc::POLLRDHUP };
                r.blocking_until("close", move || ops::poll(&[(fd, ev)], -1).0)
            }
            Wait::Epoll => {
                let ep = r.call(ops::epoll_create()).v as RawFd;
                r.call(ops::epoll_ctl(
                    ep,
                    libc::EPOLL_CTL_ADD,
                    fd,
                    (libc::EPOLLIN | libc::EPOLLRDHUP) as u32,
                ));
                r.blocking_until("close", move || ops::epoll_wait(ep, 8, -1).0);
            }
        }
        r.call(ops::recv(fd, 100, libc::MSG_DONTWAIT));
    } else {
        r.barrier("close");
        if reset {
            reset_close(r, fd);
        } else {
            r.call(ops::close(fd));
        }
    }
}

fn send_blocked_reset(r: &mut Role) {
    let fd = r.open();
    if r.is_server() {
        fill(r, fd);
        r.blocking_until("reset", move || ops::send(fd, b"x", libc::MSG_NOSIGNAL).0);
        r.call(ops::send(fd, b"x", libc::MSG_NOSIGNAL));
    } else {
        r.barrier("reset");
        reset_close(r, fd);
    }
}

static SIGPIPES: AtomicUsize = AtomicUsize::new(0);

extern "C" fn count_sigpipe(_: i32) {
    SIGPIPES.fetch_add(1, Ordering::SeqCst);
}

/// Catches SIGPIPE (counting) with SA_RESTART.
fn catch_sigpipe(r: &Role) {
    // SAFETY: installing an async-signal-safe handler (one atomic add).
    let ret = unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = count_sigpipe as *const () as usize;
        sa.sa_flags = libc::SA_RESTART;
        libc::sigaction(libc::SIGPIPE, &sa, std::ptr::null_mut())
    };
    r.note(format!("sigaction(SIGPIPE, counter) = {ret}"));
}

fn sigpipes(r: &Role) {
    r.note(format!(
        "SIGPIPE caught {} time(s)",
        SIGPIPES.load(Ordering::SeqCst)
    ));
}

/// The client closes its idle end; the server (after `setup`) sends into
/// the closed connection three times with `flags`.
fn send_after_close(r: &mut Role, flags: i32, setup: fn(&Role), write: bool) {
    let fd = r.open();
    if r.is_server() {
        setup(r);
        r.barrier("closed");
        r.await_eof(fd);
        let send = |r: &Role, what: &[u8]| {
            if write {
                r.call(ops::write(fd, what));
            } else {
                r.call(ops::send(fd, what, flags));
            }
        };
        send(r, b"first");
        r.await_events(fd, libc::POLLERR | libc::POLLHUP);
        sigpipes(r);
        send(r, b"second");
        sigpipes(r);
        send(r, b"third");
        sigpipes(r);
    } else {
        r.call(ops::close(fd));
        r.barrier("closed");
    }
}

fn epipe_caught(r: &mut Role) {
    send_after_close(r, 0, catch_sigpipe, false);
}

fn epipe_kills(r: &mut Role) {
    send_after_close(r, 0, |_| {}, false);
}

fn epipe_nosignal(r: &mut Role) {
    send_after_close(r, libc::MSG_NOSIGNAL, |_| {}, false);
}

fn epipe_write(r: &mut Role) {
    send_after_close(r, 0, catch_sigpipe, true);
}
