//! One connection used by two processes, table-driven: a fork, a fork
//! and exec (the exec'd image inherits the fd), an exec in place, or the
//! fd passed over SCM_RIGHTS to another process (the sender keeping or
//! closing its copy). Each case is a list of steps: who acts (process A
//! that accepted or connected, process B that got the fd, or the peer)
//! and what it does (read, write, close, shut down, exit, look for the end
//! of stream). A and B pass a baton over a private AF_UNIX socketpair, so
//! exactly one of them acts (and talks to the runner) at a time, and the
//! log's order is the steps' order.

use std::os::fd::RawFd;
use std::time::{Duration, Instant};

use crate::ops::{self, Ret};
use crate::role::{Role, Side};
use crate::scenario::{Body, Scenario};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Who {
    A,
    B,
    Peer,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Act {
    /// Sends n seeded bytes (the seed is the step's index).
    Send(usize),
    /// Reads exactly n bytes (bounded: logs what came if they never do).
    Recv(usize),
    Close,
    ShutWr,
    /// Exits with the socket open (after passing the baton on).
    Exit,
    /// A replaces its image with B's (exec in place), baton in hand.
    Exec,
    /// The end of stream arrives: a read returns 0.
    Eof,
    /// Nothing arrives: a non-blocking read is EAGAIN, poll says nothing.
    NoEof,
}

/// How B gets the connection.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Hand {
    /// A forks after the connection is up; B is the child.
    Fork,
    /// A forks and the child execs `conform helper share`.
    ForkExec,
    /// A execs `conform helper share` itself (there is no other process).
    InPlace,
    /// B is exec'd before the connection exists; A sends it the fd over
    /// SCM_RIGHTS and keeps its copy.
    ScmKeep,
    /// As ScmKeep, and A closes its copy right after sending it.
    ScmClose,
    /// As ScmKeep with B forked (not exec'd) before the connection.
    ScmForked,
}

pub struct Case {
    pub name: &'static str,
    pub about: &'static str,
    /// The role whose processes share the connection.
    pub side: Side,
    pub hand: Hand,
    pub steps: &'static [(Who, Act)],
}

use Act::*;
use Hand::*;
use Who::*;

const S: Side = Side::Server;
const C: Side = Side::Client;

pub const CASES: &[Case] = &[
    Case { name: "fork_child_reads_part_parent_rest", about: "fork: the child reads part of the peer's bytes, the parent the rest", side: S, hand: Fork,
        steps: &[(Peer, Send(200)), (B, Recv(100)), (A, Recv(100))] },
    Case { name: "fork_parent_reads_part_child_rest", about: "fork: the parent reads part of the peer's bytes, the child the rest", side: S, hand: Fork,
        steps: &[(Peer, Send(200)), (A, Recv(100)), (B, Recv(100))] },
    Case { name: "fork_child_writes_exits_parent_writes", about: "fork: the child writes and exits, then the parent writes; the peer gets both in order", side: S, hand: Fork,
        steps: &[(B, Send(64)), (B, Exit), (A, Send(64)), (Peer, Recv(128))] },
    Case { name: "fork_alternate_writes", about: "fork: parent and child write in turn; the peer gets the four parts in order", side: S, hand: Fork,
        steps: &[(A, Send(10)), (B, Send(10)), (A, Send(10)), (B, Send(10)), (Peer, Recv(40))] },
    Case { name: "fork_alternate_reads", about: "fork: parent and child read the peer's messages in turn", side: S, hand: Fork,
        steps: &[(Peer, Send(10)), (A, Recv(10)), (Peer, Send(10)), (B, Recv(10)), (Peer, Send(10)), (A, Recv(10))] },
    Case { name: "fork_child_reads_parent_writes", about: "fork: the child reads requests, the parent writes replies", side: S, hand: Fork,
        steps: &[(Peer, Send(10)), (B, Recv(10)), (A, Send(10)), (Peer, Recv(10)), (Peer, Send(10)), (B, Recv(10)), (A, Send(10)), (Peer, Recv(10))] },
    Case { name: "fork_child_closes_parent_continues", about: "fork: the child closes its copy and exits; no EOF at the peer; the parent carries on", side: S, hand: Fork,
        steps: &[(B, Close), (B, Exit), (Peer, NoEof), (A, Send(10)), (Peer, Recv(10)), (Peer, Send(10)), (A, Recv(10)), (A, Close), (Peer, Eof)] },
    Case { name: "fork_parent_closes_child_continues", about: "fork: the parent closes its copy; no EOF at the peer; the child carries on and closes", side: S, hand: Fork,
        steps: &[(A, Close), (Peer, NoEof), (B, Send(10)), (Peer, Recv(10)), (Peer, Send(10)), (B, Recv(10)), (B, Close), (Peer, Eof)] },
    Case { name: "fork_child_exits_parent_continues", about: "fork: the child exits with the socket open; no EOF; the parent carries on", side: S, hand: Fork,
        steps: &[(B, Exit), (Peer, NoEof), (A, Send(10)), (Peer, Recv(10)), (Peer, Send(10)), (A, Recv(10)), (A, Close), (Peer, Eof)] },
    Case { name: "fork_parent_exits_child_continues", about: "fork: the parent exits with the socket open; no EOF; the child carries on", side: S, hand: Fork,
        steps: &[(A, Exit), (Peer, NoEof), (B, Send(10)), (Peer, Recv(10)), (Peer, Send(10)), (B, Recv(10)), (B, Close), (Peer, Eof)] },
    Case { name: "fork_child_shutdown_wr", about: "fork: the child's shutdown(SHUT_WR) ends the stream for both; both still read", side: S, hand: Fork,
        steps: &[(B, ShutWr), (Peer, Eof), (Peer, Send(10)), (A, Recv(10)), (Peer, Send(5)), (B, Recv(5))] },
    Case { name: "fork_child_exits_after_write", about: "fork: the child writes 100000 bytes and exits at once; all arrive", side: S, hand: Fork,
        steps: &[(B, Send(100_000)), (B, Exit), (Peer, Recv(100_000)), (A, Close), (Peer, Eof)] },
    Case { name: "fork_both_close", about: "fork: the parent closes (no EOF yet), then the child closes (EOF)", side: S, hand: Fork,
        steps: &[(A, Close), (Peer, NoEof), (B, Close), (Peer, Eof)] },
    Case { name: "fork_peer_shutdown_both_see_eof", about: "fork: the peer shuts down; child and parent both read EOF; the parent still writes", side: S, hand: Fork,
        steps: &[(Peer, ShutWr), (B, Eof), (A, Eof), (A, Send(10)), (Peer, Recv(10))] },
    Case { name: "fork_client_child_writes_parent_reads", about: "fork on the client side: the child writes, the parent reads the replies", side: C, hand: Fork,
        steps: &[(B, Send(50)), (Peer, Recv(50)), (Peer, Send(20)), (A, Recv(20)), (B, Send(5)), (Peer, Recv(5))] },
    Case { name: "fork_client_child_exits_parent_closes", about: "fork on the client side: the child writes and exits, the parent closes: EOF after the bytes", side: C, hand: Fork,
        steps: &[(B, Send(1000)), (B, Exit), (Peer, Recv(1000)), (Peer, NoEof), (A, Close), (Peer, Eof)] },
    Case { name: "exec_inherited_reads", about: "fork+exec: the exec'd image reads from the inherited fd, then the parent reads", side: S, hand: ForkExec,
        steps: &[(Peer, Send(100)), (B, Recv(100)), (Peer, Send(50)), (A, Recv(50))] },
    Case { name: "exec_inherited_writes", about: "fork+exec: the exec'd image writes on the inherited fd, then the parent writes", side: S, hand: ForkExec,
        steps: &[(B, Send(100)), (Peer, Recv(100)), (A, Send(50)), (Peer, Recv(50))] },
    Case { name: "exec_inherited_reads_and_writes", about: "fork+exec: the exec'd image reads a request and writes the reply", side: S, hand: ForkExec,
        steps: &[(Peer, Send(30)), (B, Recv(30)), (B, Send(30)), (Peer, Recv(30))] },
    Case { name: "exec_parent_closes_exec_continues", about: "fork+exec: the parent closes its copy; the exec'd image carries on, its close ends the stream", side: S, hand: ForkExec,
        steps: &[(A, Close), (Peer, NoEof), (B, Send(10)), (Peer, Recv(10)), (Peer, Send(10)), (B, Recv(10)), (B, Close), (Peer, Eof)] },
    Case { name: "exec_child_exits_parent_continues", about: "fork+exec: the exec'd image writes and exits; no EOF; the parent carries on", side: S, hand: ForkExec,
        steps: &[(B, Send(10)), (B, Exit), (Peer, Recv(10)), (Peer, NoEof), (A, Send(10)), (Peer, Recv(10)), (A, Close), (Peer, Eof)] },
    Case { name: "exec_in_place_reads_and_writes", about: "exec in place: the new image reads the rest of a request and replies on the same fd", side: S, hand: InPlace,
        steps: &[(Peer, Send(20)), (A, Recv(10)), (A, Exec), (B, Recv(10)), (B, Send(20)), (Peer, Recv(20)), (B, Close), (Peer, Eof)] },
    Case { name: "exec_in_place_writes", about: "exec in place: the old image writes, the new one writes more and reads", side: S, hand: InPlace,
        steps: &[(A, Send(20)), (A, Exec), (B, Send(20)), (Peer, Recv(40)), (Peer, Send(10)), (B, Recv(10))] },
    Case { name: "exec_in_place_client", about: "exec in place on the client side: the new image reads the reply to the old one's request", side: C, hand: InPlace,
        steps: &[(A, Send(10)), (A, Exec), (Peer, Recv(10)), (Peer, Send(10)), (B, Recv(10)), (B, Send(10)), (Peer, Recv(10))] },
    Case { name: "scm_sender_keeps_receiver_reads", about: "SCM_RIGHTS to another process (sender keeps its copy): the receiver reads, then the sender", side: S, hand: ScmKeep,
        steps: &[(Peer, Send(100)), (B, Recv(100)), (Peer, Send(50)), (A, Recv(50))] },
    Case { name: "scm_sender_keeps_receiver_writes", about: "SCM_RIGHTS (sender keeps its copy): the receiver writes, then the sender", side: S, hand: ScmKeep,
        steps: &[(B, Send(100)), (Peer, Recv(100)), (A, Send(10)), (Peer, Recv(10))] },
    Case { name: "scm_sender_keeps_both_close", about: "SCM_RIGHTS (sender keeps its copy): the sender closes (no EOF), the receiver writes and closes (EOF)", side: S, hand: ScmKeep,
        steps: &[(A, Close), (Peer, NoEof), (B, Send(10)), (Peer, Recv(10)), (B, Close), (Peer, Eof)] },
    Case { name: "scm_sender_closes_receiver_reads", about: "SCM_RIGHTS, sender closes its copy: the receiver reads and writes", side: S, hand: ScmClose,
        steps: &[(Peer, NoEof), (Peer, Send(100)), (B, Recv(100)), (B, Send(10)), (Peer, Recv(10))] },
    Case { name: "scm_sender_closes_receiver_writes", about: "SCM_RIGHTS, sender closes its copy: the receiver writes and closes", side: S, hand: ScmClose,
        steps: &[(B, Send(100)), (Peer, Recv(100)), (B, Close), (Peer, Eof)] },
    Case { name: "scm_sender_closes_receiver_exits", about: "SCM_RIGHTS, sender closes its copy: the receiver writes and exits with the socket open", side: S, hand: ScmClose,
        steps: &[(B, Send(10)), (B, Exit), (Peer, Recv(10)), (Peer, Eof)] },
    Case { name: "scm_client_sender_closes", about: "SCM_RIGHTS on the client side, sender closes its copy: the receiver talks to the server", side: C, hand: ScmClose,
        steps: &[(B, Send(10)), (Peer, Recv(10)), (Peer, Send(10)), (B, Recv(10))] },
    Case { name: "scm_forked_receiver", about: "SCM_RIGHTS to a process forked before the connection: it reads and writes", side: S, hand: ScmForked,
        steps: &[(Peer, Send(10)), (B, Recv(10)), (B, Send(10)), (Peer, Recv(10)), (A, Send(5)), (Peer, Recv(5))] },
];

pub fn list() -> Vec<Scenario> {
    CASES
        .iter()
        .map(|c| Scenario {
            name: c.name,
            about: c.about,
            body: Box::new(move |r: &mut Role| run(r, c)) as Body,
        })
        .collect()
}

fn case(name: &str) -> &'static Case {
    CASES
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no sharing case `{name}`"))
}

/// How long a step waits for bytes or an end of stream before it logs
/// what it has.
const BOUND: Duration = Duration::from_secs(5);

fn run(r: &mut Role, c: &Case) {
    if r.side != c.side {
        let fd = r.open();
        peer(r, c, fd);
        return;
    }
    r.log = r.log.tagged("A");
    // B exec'd or forked before the connection exists (SCM cases).
    let early = matches!(c.hand, ScmKeep | ScmClose | ScmForked).then(|| spawn_b(r, c, None));
    let fd = r.open();
    let (ctl, b) = match (c.hand, early) {
        (Fork | ForkExec, _) => {
            let (ctl, pid) = spawn_b(r, c, Some(fd));
            (Some(ctl), Some(pid))
        }
        (InPlace, _) => (None, None),
        (_, Some((ctl, pid))) => {
            send_fd(r, ctl, fd);
            if c.hand == ScmClose {
                r.call(ops::close(fd));
            }
            (Some(ctl), Some(pid))
        }
        (_, None) => unreachable!("SCM cases spawn B first"),
    };
    play(r, c, A, fd, ctl, 0);
    if let Some(pid) = b {
        r.wait_child(pid);
    }
}

/// Starts B: forked (Fork, ScmForked) or forked and exec'd (ForkExec,
/// ScmKeep, ScmClose). B gets `fd` (None: it waits for it over the
/// control socket) and its end of the control socketpair; A keeps the
/// other end. Returns (A's control end, B's pid).
fn spawn_b(r: &mut Role, c: &Case, fd: Option<RawFd>) -> (RawFd, libc::pid_t) {
    let mut sv = [0; 2];
    // SAFETY: socketpair fills two fds this role owns.
    let ret = unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_SEQPACKET, 0, sv.as_mut_ptr()) };
    assert_eq!(ret, 0, "control socketpair");
    let pid = r.fork("B");
    if pid > 0 {
        // SAFETY: closing B's end in A.
        unsafe { libc::close(sv[1]) };
        return (sv[0], pid);
    }
    // SAFETY: closing A's end in B.
    unsafe { libc::close(sv[0]) };
    let forked = matches!(c.hand, Fork | ScmForked);
    if forked {
        let fd = fd.unwrap_or_else(|| recv_fd(r, sv[1]));
        play(r, c, B, fd, Some(sv[1]), usize::MAX);
        std::process::exit(0);
    }
    let mut extra = vec![sv[1].to_string()];
    extra.extend(fd.map(|f| f.to_string()));
    r.exec_helper("share", "B", &extra);
}

/// `conform helper share CTL [FD]` (B exec'd by A) and `conform helper
/// share - FD STEP` (A's own image after an exec in place).
pub fn helper(r: &mut Role, extra: &[String]) -> u8 {
    let c = case(&r.scenario);
    if extra.first().map(String::as_str) == Some("-") {
        let fd = super::fd_arg(extra, 1);
        let step = super::fd_arg(extra, 2) as usize;
        play(r, c, B, fd, None, step);
        r.barrier("end");
        return 0;
    }
    let ctl = super::fd_arg(extra, 0);
    let fd = if extra.len() > 1 {
        super::fd_arg(extra, 1)
    } else {
        recv_fd(r, ctl)
    };
    play(r, c, B, fd, Some(ctl), usize::MAX);
    0
}

/// Runs the steps from `start` (usize::MAX: wait for the baton first) as
/// process `me`, passing the baton to the other process over `ctl` when
/// a step is not ours.
fn play(r: &mut Role, c: &Case, me: Who, fd: RawFd, ctl: Option<RawFd>, start: usize) {
    let mut i = start;
    if i == usize::MAX {
        match ctl.and_then(take_baton) {
            Some(Some(k)) => i = k,
            _ => return,
        }
    }
    while let Some(&(who, act)) = c.steps.get(i) {
        if who == Peer {
            r.barrier(&format!("step {i}"));
            r.barrier(&format!("done {i}"));
        } else if who == me {
            match act {
                Exit => {
                    r.note("exit(0) with the socket open");
                    if let Some(ctl) = ctl {
                        give_baton(ctl, i + 1);
                    }
                    std::process::exit(0);
                }
                Exec => {
                    r.note("exec in place");
                    r.exec_helper(
                        "share",
                        "B",
                        &["-".into(), fd.to_string(), (i + 1).to_string()],
                    );
                }
                _ => act_on(r, fd, act, i),
            }
        } else {
            let Some(ctl) = ctl else {
                r.note(format!("step {i} is {who:?}'s, and there is no {who:?}"));
                return;
            };
            give_baton(ctl, i);
            match take_baton(ctl) {
                Some(Some(k)) => {
                    i = k;
                    continue;
                }
                Some(None) => return,
                None => {
                    r.note(format!("{who:?} went away at step {i}"));
                    return;
                }
            }
        }
        i += 1;
    }
    if let Some(ctl) = ctl {
        end_baton(ctl);
    }
}

/// The peer role: its steps between the sharing role's barriers.
fn peer(r: &mut Role, c: &Case, fd: RawFd) {
    for (i, &(who, act)) in c.steps.iter().enumerate() {
        if who == Peer {
            r.barrier(&format!("step {i}"));
            act_on(r, fd, act, i);
            r.barrier(&format!("done {i}"));
        }
    }
}

fn act_on(r: &Role, fd: RawFd, act: Act, i: usize) {
    match act {
        Send(n) => {
            r.send_all(fd, n, i as u64, 0);
        }
        Recv(n) => {
            r.call(recv_within(fd, n));
        }
        Close => {
            r.call(ops::close(fd));
        }
        ShutWr => {
            r.call(ops::shutdown(fd, libc::SHUT_WR));
        }
        Eof => {
            r.await_eof(fd);
            r.call(ops::recv(fd, 100, libc::MSG_DONTWAIT));
        }
        NoEof => {
            r.call(ops::recv(fd, 100, libc::MSG_DONTWAIT));
            r.call(ops::poll(&[(fd, libc::POLLIN | libc::POLLRDHUP)], 0));
        }
        Exit | Exec => r.note(format!("{act:?} is not a peer step")),
    }
}

/// Reads exactly `n` bytes, waiting for them up to BOUND (a shim that
/// lost them makes this a logged difference, not a hang).
fn recv_within(fd: RawFd, n: usize) -> ops::Obs<Vec<u8>> {
    let end = Instant::now() + BOUND;
    let mut data = Vec::new();
    let mut buf = vec![0u8; n.min(1 << 16)];
    let mut how = String::new();
    while data.len() < n {
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            how = " then nothing more came".into();
            break;
        }
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd of ours.
        unsafe { libc::poll(&mut p, 1, left.as_millis().min(100) as i32) };
        let want = (n - data.len()).min(buf.len());
        // SAFETY: receiving into a live buffer within its bounds.
        let got =
            Ret::of(
                unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), want, libc::MSG_DONTWAIT) } as i64,
            );
        match got.v {
            0 => {
                how = " then EOF".into();
                break;
            }
            v if v > 0 => data.extend_from_slice(&buf[..got.n()]),
            _ if got.e == libc::EAGAIN => {}
            _ => {
                how = format!(" then {got}");
                break;
            }
        }
    }
    (
        format!(
            "read({fd}, {n}) = {} {}{how}",
            data.len(),
            crate::obs::show(&data)
        ),
        data,
    )
}

// ----- the baton and the fd over the control socket -----

fn give_baton(ctl: RawFd, step: usize) {
    let msg = format!("baton {step}");
    // SAFETY: sending our own buffer on our control socket.
    unsafe { libc::send(ctl, msg.as_ptr().cast(), msg.len(), libc::MSG_NOSIGNAL) };
}

fn end_baton(ctl: RawFd) {
    // SAFETY: as above.
    unsafe { libc::send(ctl, b"end".as_ptr().cast(), 3, libc::MSG_NOSIGNAL) };
}

/// The next baton: Some(Some(step)), Some(None) for the end, None when
/// the other process is gone. Bounded by the runner's deadline.
fn take_baton(ctl: RawFd) -> Option<Option<usize>> {
    let mut buf = [0u8; 64];
    // SAFETY: receiving into our own buffer.
    let n = unsafe { libc::recv(ctl, buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n <= 0 {
        return None;
    }
    let text = String::from_utf8_lossy(&buf[..n as usize]);
    if text == "end" {
        return Some(None);
    }
    text.strip_prefix("baton ")
        .and_then(|s| s.parse().ok())
        .map(Some)
}

/// A sends `fd` to B with SCM_RIGHTS and waits for B's receipt before it
/// logs, so that B's line about it always comes first.
fn send_fd(r: &Role, ctl: RawFd, fd: RawFd) {
    let data = [b'F'];
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: 1,
    };
    // SAFETY: CMSG_SPACE is a pure size computation.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
    let mut cbuf = vec![0u8; space];
    // SAFETY: all-zero is a valid msghdr; the pointers below are to our
    // live buffers, and the control header is written inside cbuf.
    let ret = unsafe {
        let mut m: libc::msghdr = std::mem::zeroed();
        m.msg_iov = &mut iov;
        m.msg_iovlen = 1;
        m.msg_control = cbuf.as_mut_ptr().cast();
        m.msg_controllen = space;
        let cm = libc::CMSG_FIRSTHDR(&m);
        (*cm).cmsg_level = libc::SOL_SOCKET;
        (*cm).cmsg_type = libc::SCM_RIGHTS;
        (*cm).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as usize;
        std::ptr::write_unaligned(libc::CMSG_DATA(cm).cast::<RawFd>(), fd);
        Ret::of(libc::sendmsg(ctl, &m, 0) as i64)
    };
    let mut ack = [0u8; 8];
    // SAFETY: receiving into our own buffer.
    unsafe { libc::recv(ctl, ack.as_mut_ptr().cast(), ack.len(), 0) };
    r.note(format!("sendmsg(SCM_RIGHTS {fd}) = {ret}"));
}

/// B receives the fd A sends, logs it and acknowledges.
fn recv_fd(r: &Role, ctl: RawFd) -> RawFd {
    let mut data = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: data.as_mut_ptr().cast(),
        iov_len: 1,
    };
    // SAFETY: CMSG_SPACE is a pure size computation.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
    let mut cbuf = vec![0u8; space];
    // SAFETY: all-zero is a valid msghdr; the pointers are to our live
    // buffers; the control data is read only when the kernel put some.
    let (ret, fd) = unsafe {
        let mut m: libc::msghdr = std::mem::zeroed();
        m.msg_iov = &mut iov;
        m.msg_iovlen = 1;
        m.msg_control = cbuf.as_mut_ptr().cast();
        m.msg_controllen = space;
        let ret = Ret::of(libc::recvmsg(ctl, &mut m, 0) as i64);
        let cm = libc::CMSG_FIRSTHDR(&m);
        let fd = if ret.ok() && !cm.is_null() && (*cm).cmsg_type == libc::SCM_RIGHTS {
            std::ptr::read_unaligned(libc::CMSG_DATA(cm).cast::<RawFd>())
        } else {
            -1
        };
        (ret, fd)
    };
    r.note(format!("recvmsg(SCM_RIGHTS) = {ret} fd {fd}"));
    // SAFETY: sending our own buffer on our control socket.
    unsafe { libc::send(ctl, b"ok".as_ptr().cast(), 2, libc::MSG_NOSIGNAL) };
    fd
}
