//! The interface between the hooks and the ring data path.
//!
//! A socket the shim tracks is a kernel TCP socket. Once the ring layer has
//! set up a ring channel for it (on `connect` or `accept`, through the
//! registered `Attacher`), it is *attached*: the fd table holds an
//! `Arc<dyn AttachedConn>` for it, and every data hook on any fd that refers
//! to it (dup'd fds included) dispatches to that object instead of the
//! kernel. The kernel socket stays open underneath as the control
//! connection (docs/design.md, "Control plane").
//!
//! An `AttachedConn` is a *non-blocking* object. Blocking semantics (O_NONBLOCK,
//! MSG_DONTWAIT, SO_RCVTIMEO/SO_SNDTIMEO, MSG_WAITALL, EINTR, SIGPIPE and
//! MSG_NOSIGNAL, spin-then-sleep) are implemented once, in `dispatch`, on top
//! of `try_recv`/`try_send`, `readiness` and the wait protocol
//! (`arm` → sleep on `wait_fds` → `disarm`), so every transport gets them
//! right by construction. poll/select/epoll use the same primitives.
//!
//! Thread-safety: all methods take `&self` and may be called concurrently
//! from several threads (a program may read on one thread and write on
//! another, or close on a third). `release` may run while another thread is
//! still inside `try_recv`; the object itself stays alive (Arc) until the
//! last call returns.

use std::io::{IoSlice, IoSliceMut};
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::{Arc, OnceLock};

use libc::c_int;

/// An errno value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Errno(pub c_int);

/// Readiness bits, with poll(2)'s values: `READ` = POLLIN, `WRITE` =
/// POLLOUT, `RDHUP` = POLLRDHUP (peer shut down its sending side; reads
/// return what is left, then EOF), `HUP` = POLLHUP (both directions are
/// finished), `ERR` = POLLERR (`take_error` has something), `PRI` = POLLPRI.
/// As TCP's poll does, a connection reports `RDNORM` with every `READ`
/// and `WRNORM` with every `WRITE`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ready(pub u32);

impl Ready {
    pub const NONE: Ready = Ready(0);
    pub const READ: Ready = Ready(libc::POLLIN as u32);
    pub const PRI: Ready = Ready(libc::POLLPRI as u32);
    pub const WRITE: Ready = Ready(libc::POLLOUT as u32);
    pub const ERR: Ready = Ready(libc::POLLERR as u32);
    pub const HUP: Ready = Ready(libc::POLLHUP as u32);
    pub const RDHUP: Ready = Ready(libc::POLLRDHUP as u32);
    pub const RDNORM: Ready = Ready(libc::POLLRDNORM as u32);
    pub const WRNORM: Ready = Ready(libc::POLLWRNORM as u32);
    /// Readable, as TCP reports it.
    pub const IN: Ready = Ready((libc::POLLIN | libc::POLLRDNORM) as u32);
    /// Writable, as TCP reports it.
    pub const OUT: Ready = Ready((libc::POLLOUT | libc::POLLWRNORM) as u32);
    /// Interest bits a reader waits for.
    pub const INPUT: Ready =
        Ready((libc::POLLIN | libc::POLLRDNORM | libc::POLLRDHUP | libc::POLLPRI) as u32);
    /// Interest bits a writer waits for.
    pub const OUTPUT: Ready = Ready((libc::POLLOUT | libc::POLLWRNORM) as u32);

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    pub fn intersects(self, other: Ready) -> bool {
        self.0 & other.0 != 0
    }

    pub fn contains(self, other: Ready) -> bool {
        self.0 & other.0 == other.0
    }
}

impl std::ops::BitOr for Ready {
    type Output = Ready;
    fn bitor(self, rhs: Ready) -> Ready {
        Ready(self.0 | rhs.0)
    }
}

impl std::ops::BitAnd for Ready {
    type Output = Ready;
    fn bitand(self, rhs: Ready) -> Ready {
        Ready(self.0 & rhs.0)
    }
}

/// One fd to sleep on while waiting for a connection, with poll(2) events.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaitFd {
    pub fd: RawFd,
    pub events: i16,
}

/// Up to three fds a waiter sleeps on: typically the doorbell (an eventfd
/// the peer writes after publishing, or a verbs completion channel), on
/// verbs also an eventfd of the connection's own (the end of its
/// handshake), and the kernel TCP socket (its EOF/RST tells that the peer
/// process died).
pub type WaitFds = [Option<WaitFd>; 3];

/// How the last fd of a connection went away in this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReleaseKind {
    /// Closed by the process that uses the connection (it claimed it in the
    /// current fork generation): mirror end-of-stream into the ring, then let
    /// the kernel socket be closed.
    Owner,
    /// Closed by a process that never used it since the last fork (redis'
    /// save child, the parent of a pre-forking server after handing the
    /// connection to a worker): drop this process's mapping only; the user
    /// of the connection carries on.
    Inherited,
    /// The fd had already been closed behind the shim's back (close_range
    /// with a raw syscall, fclose of an fdopen'd socket) and its number
    /// reused; nothing can be sent on it any more.
    Stale,
}

/// What a blocking read's look found (`AttachedConn::recv_look`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Look {
    /// The read's answer, as `try_recv` gives it.
    Done(Result<usize, Errno>),
    /// Nothing to read, and nothing else for a reader to see.
    Empty,
    /// The look cannot tell (the connection is not plainly on its ring):
    /// `readiness` and `try_recv` decide.
    Unsure,
}

/// A ring-attached connection. See the module documentation for the
/// threading and blocking contract. `fd` arguments name the kernel TCP
/// socket the call came in on (any dup of it).
pub trait AttachedConn: Send + Sync {
    /// Copies received bytes into `bufs` without blocking. `Ok(n > 0)`:
    /// bytes copied (and consumed unless `peek`). `Ok(0)`: end of stream
    /// (only meaningful when the buffers are not empty). `Err(EAGAIN)`:
    /// nothing available now. Any other error is returned to the program.
    fn try_recv(&self, bufs: &mut [IoSliceMut<'_>], peek: bool) -> Result<usize, Errno>;

    /// A blocking read's look at the connection, before and while it
    /// waits: reads what is there as `try_recv` (no peek), so that a look
    /// that finds bytes takes them under the same lock, and otherwise says
    /// whether the waiter may keep waiting without asking `readiness`. An
    /// empty look asks nothing beyond the ring (the wait's arm asks the
    /// rest before any sleep). The default cannot tell.
    fn recv_look(&self, bufs: &mut [IoSliceMut<'_>]) -> Look {
        let _ = bufs;
        Look::Unsure
    }

    /// Queues bytes for the peer without blocking. `Ok(n)`: n bytes
    /// accepted (may be short). `Err(EAGAIN)`: no room now. `Err(EPIPE)`:
    /// this side was shut down or the peer is gone (the dispatcher raises
    /// SIGPIPE unless MSG_NOSIGNAL).
    fn try_send(&self, bufs: &[IoSlice<'_>]) -> Result<usize, Errno>;

    /// Pushes out anything batched but not yet visible to the peer. Called
    /// before the calling thread can block (docs/design.md, "Data plane").
    fn flush(&self);

    /// Current readiness, without blocking and without arming anything.
    fn readiness(&self) -> Ready;

    /// `readiness` as a waiter for `interest` needs it: exact for
    /// `interest`, ERR and HUP, other bits possibly missing (a side nobody
    /// asked about need not be looked at).
    fn readiness_for(&self, interest: Ready) -> Ready {
        let _ = interest;
        self.readiness()
    }

    /// Readiness for a reader that waits until `need` bytes are readable
    /// (a peek for more than is there): as `readiness_for(READ | RDHUP)`,
    /// but READ only from `need` bytes on, or once the stream has ended
    /// (RDHUP), failed (ERR) or hung up (HUP).
    fn readiness_needing(&self, need: usize) -> Ready {
        let r = self.readiness_for(Ready::READ | Ready::RDHUP);
        if r.intersects(Ready::RDHUP | Ready::HUP | Ready::ERR) || self.available() >= need {
            r
        } else {
            Ready(r.0 & !Ready::IN.0)
        }
    }

    /// `arm(READ | RDHUP)` for a reader that needs `need` bytes: the
    /// peer's next bytes must wake it also while fewer than `need` are
    /// readable (a plain arm asks for nothing while any are). Returns
    /// `readiness_needing(need)` as seen after arming; ended as `arm` is.
    fn arm_needing(&self, need: usize) -> Ready {
        let _ = self.arm(Ready::READ | Ready::RDHUP);
        self.readiness_needing(need)
    }

    /// Looks at `readiness` a spinning waiter takes back to back before it
    /// yields the CPU between looks (`ringsock_ring::sleep::backoff::CompletionWait`).
    /// Fewer than `SPIN_TURNS` says the medium's own progress may need this
    /// CPU (a software RDMA device's kernel work): a yield that runs
    /// something else then carries the data, and is no sign of an
    /// oversubscribed machine (`dispatch::wait::spin`).
    fn spin_looks(&self) -> u32 {
        ringsock_ring::sleep::backoff::SPIN_TURNS
    }

    /// Asks to be woken through `wait_fds` when any of `interest` may have
    /// become true (publishes the "sleeping" flag), then re-checks and
    /// returns the readiness seen *after* arming (as `readiness_for`
    /// `interest`). If that intersects
    /// `interest` the caller does not sleep. Must be paired with
    /// `disarm_waiter` with the same `level`. `level`: the waiter sleeps in
    /// a level-triggered poll on the wait fds (`arm`); otherwise it watches
    /// them edge-triggered (epoll with EPOLLET) and may keep the arm across
    /// many calls (`arm_edge`): the connection need not keep the fds
    /// readable for it, so a doorbell can be drained by other waiters
    /// without losing its wake-up.
    fn arm_waiter(&self, interest: Ready, level: bool) -> Ready;

    /// Ends a wait started by `arm_waiter` (clears the flag, drains the
    /// doorbell).
    fn disarm_waiter(&self, interest: Ready, level: bool);

    /// `arm_waiter` for a level-triggered waiter.
    fn arm(&self, interest: Ready) -> Ready {
        self.arm_waiter(interest, true)
    }

    /// Ends an `arm`.
    fn disarm(&self, interest: Ready) {
        self.disarm_waiter(interest, true)
    }

    /// Ends an `arm` whose sleep returned with `woke`: those of its
    /// `wait_fds` (with their revents; none if it did not sleep). Only a
    /// doorbell among them can have rung, only the kernel socket among them
    /// can have news, so the others need no drain and no look. A ring that
    /// comes after the sleep's look stays in its doorbell and wakes the
    /// next sleep, which drains it.
    fn disarm_after(&self, interest: Ready, woke: &[libc::pollfd]) {
        let _ = woke;
        self.disarm(interest)
    }

    /// `arm_waiter` for an edge-triggered waiter.
    fn arm_edge(&self, interest: Ready) -> Ready {
        self.arm_waiter(interest, false)
    }

    /// Ends an `arm_edge`.
    fn disarm_edge(&self, interest: Ready) {
        self.disarm_waiter(interest, false)
    }

    /// The kernel socket among `wait_fds`, or -1: an epoll set watches it
    /// edge-triggered under its own tag and calls `socket_fired` whenever
    /// it fires, so an edge arm need not look at it.
    fn watched_socket(&self) -> RawFd {
        -1
    }

    /// `watched_socket` fired in an epoll set: looks at it now (the
    /// peer's EOF or reset, its leave header), as a level waiter that
    /// woke on it does.
    fn socket_fired(&self) {}

    /// The fds to sleep on after `arm(interest)`; they become readable (or
    /// report an error/hangup) when the connection's readiness may have
    /// changed. The set must not change during the life of the connection
    /// for a given `interest` (epoll registers it once).
    fn wait_fds(&self, fd: RawFd, interest: Ready) -> WaitFds;

    /// A number that changes whenever new data or new space may have
    /// arrived (edge-triggered epoll reports a registration again when it
    /// changes, as the kernel reports every arrival). 0 if not tracked.
    fn event_seq(&self) -> u64 {
        0
    }

    /// Bytes that a read would return now (FIONREAD).
    fn available(&self) -> usize;

    /// shutdown(2): SHUT_RD, SHUT_WR or SHUT_RDWR, mirrored as end-of-stream
    /// in the ring; the implementation shuts down the kernel socket `fd`
    /// as it sees fit.
    fn shutdown(&self, fd: RawFd, how: c_int) -> Result<(), Errno>;

    /// The pending socket error (SO_ERROR), cleared by the call; 0 if none.
    fn take_error(&self) -> c_int;

    /// Called before the first use of the connection by this process in the
    /// current fork generation (see fdtable/state.rs). `Err` refuses the use
    /// (an RDMA connection cannot be used from a forked child): the program
    /// gets that errno, and the implementation logs why.
    fn claim(&self) -> Result<(), Errno>;

    /// The last fd referring to the connection in this process was closed
    /// (`close`, `dup2` over it, ...). Called before the kernel socket `fd`
    /// is closed.
    fn release(&self, fd: RawFd, kind: ReleaseKind);

    /// Fd `fd` was closed while another fd of this process still refers
    /// to the connection; `other` finds one (a scan of the fd table).
    fn fd_closed(&self, _fd: RawFd, _other: &dyn Fn() -> Option<RawFd>) {}

    /// The process is exiting (`exit`, `_exit`) with the connection open:
    /// the kernel would still deliver what was written, so push out what
    /// is batched and, where the transport dies with the process (a verbs
    /// queue pair), wait until `deadline_ns` (monotonic) at most for it to
    /// be acknowledged. Must not block on a lock: `_exit` may run in a
    /// signal handler that interrupted a thread holding one.
    fn drain_at_exit(&self, _deadline_ns: u64) {}

    /// Just before a fork, in the forking thread: no other thread may be
    /// inside the connection while the child's copy is taken. Paired with
    /// `fork_finish` in parent and child.
    fn fork_prepare(&self) {}

    /// After the fork, in parent and child.
    fn fork_finish(&self) {}

    /// SO_RCVLOWAT: readable (poll) and a blocking read's minimum only
    /// from this many bytes on.
    fn set_rcvlowat(&self, _bytes: usize) {}

    /// The SO_RCVLOWAT minimum (1 when unset).
    fn rcvlowat(&self) -> usize {
        1
    }

    /// The TCP state TCP_INFO reports (`libc::TCP_*`), where the ring's
    /// end-of-stream marks decide it rather than the kernel socket's;
    /// `None`: the kernel socket answers.
    fn tcp_state(&self) -> Option<u8> {
        None
    }

    /// SIOCATMARK: `Some(false)` while bytes of the stream that precede the
    /// kernel socket's (in the ring) are unread; `None`: the kernel socket
    /// answers.
    fn at_mark(&self) -> Option<bool> {
        None
    }

    /// The connection must go on where the ring cannot follow it (its
    /// descriptor goes to another process, an exec, urgent data): move it
    /// to the kernel socket at a byte offset both ends agree on, and send
    /// what the ring still owes it. `hand_over`: the descriptor goes where
    /// the shim may not be (another process, an exec), so no word from the
    /// peer's shim may arrive after this returns (it waits, a bounded time,
    /// for the peer's acknowledgement). True when plain calls on the kernel
    /// socket are exact from now on.
    fn leave_ring(&self, _hand_over: bool) -> bool {
        false
    }

    /// Whether a socket named `local` (and `peer`, where it has one) may
    /// be this connection's kernel socket (asked where the table does not
    /// follow the process's descriptors: a vfork child). Yes unless the
    /// connection can tell otherwise.
    fn may_be_socket(&self, _local: SocketAddr, _peer: Option<SocketAddr>) -> bool {
        true
    }
}

/// Why a tracked socket stays on kernel TCP (shown by `ringsock-ctl status`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum TcpReason {
    /// Not decided yet (before connect/accept).
    Undecided = 0,
    /// RINGSOCK_DISABLE=1.
    Disabled = 1,
    /// The port is excluded by RINGSOCK_INCLUDE_PORTS/EXCLUDE_PORTS.
    ExcludedPort = 2,
    /// The address is excluded by RINGSOCK_INCLUDE_NETS/EXCLUDE_NETS.
    ExcludedNet = 3,
    /// No ring transport is available in this process.
    NoTransport = 4,
    /// The transport declined (no ctl, no peer shim, timeout, ...).
    Declined = 5,
    /// The address family is not one a ring can carry.
    Family = 6,
    /// No memory or descriptors for a ring's segment and doorbells.
    NoResources = 7,
    /// This process's recent connections to the address were short: a
    /// ring would cost them more than it saves (`ring::policy`).
    ShortLived = 8,
}

impl TcpReason {
    pub fn from_u8(v: u8) -> TcpReason {
        match v {
            1 => TcpReason::Disabled,
            2 => TcpReason::ExcludedPort,
            3 => TcpReason::ExcludedNet,
            4 => TcpReason::NoTransport,
            5 => TcpReason::Declined,
            6 => TcpReason::Family,
            7 => TcpReason::NoResources,
            8 => TcpReason::ShortLived,
            _ => TcpReason::Undecided,
        }
    }
}

/// What the ring layer keeps of a connection it left on plain TCP, for
/// the close of its last fd (`Attacher::tcp_closed`). Kept in the
/// socket's own state (fdtable/state.rs), it spares the layer a table
/// keyed by fd to insert into at connect and search at close.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TcpMemo {
    /// A connection the policy kept off the ring (ring/policy.rs): its
    /// destination and when it was connected (monotonic ns).
    pub skipped: Option<(SocketAddr, u64)>,
    /// The ticket of its open's status report, which close cancels while
    /// it is still queued (0: none was queued).
    pub report: u64,
}

/// What the transport decided for one connection.
pub enum Decision {
    /// Attach this ring channel to the socket.
    Ring(Arc<dyn AttachedConn>),
    /// Stay plain kernel TCP, for this reason.
    Tcp(TcpReason),
}

/// The ring layer's entry points, registered once per process with
/// `register_attacher`. Called with the shim's re-entrancy guard held: any
/// socket call it makes goes straight to libc.
pub trait Attacher: Send + Sync {
    /// connect() on a tracked TCP socket whose destination passed the
    /// include/exclude filters. The implementation does its handshake
    /// preparation (bind, offer through ctl), then calls `connect` exactly
    /// once to let the kernel connect happen (it returns the real connect's
    /// result, EINPROGRESS included), and returns that result together with
    /// its decision. Bytes must never be lost or reordered whatever it
    /// decides (docs/design.md, "Control plane", 4). On a `Decision::Tcp`
    /// it may fill `memo`, which `tcp_closed` gets back.
    fn connect(
        &self,
        fd: RawFd,
        dest: SocketAddr,
        nonblocking: bool,
        connect: &mut dyn FnMut() -> Result<(), Errno>,
        memo: &mut TcpMemo,
    ) -> (Result<(), Errno>, Decision);

    /// A connection accepted on a tracked listener, before accept() returns
    /// it to the program; `local` is the address it was accepted on. On a
    /// `Decision::Tcp` it may fill `memo`, as `connect`.
    fn accept(
        &self,
        listener: RawFd,
        fd: RawFd,
        local: SocketAddr,
        peer: SocketAddr,
        memo: &mut TcpMemo,
    ) -> Decision;

    /// Flushes every attached connection with batched, unpublished bytes.
    /// Called before the process blocks in poll/select/epoll.
    fn flush_all(&self);

    /// listen() succeeded on tracked socket `fd`, bound to `addr`.
    fn listening(&self, _fd: RawFd, _addr: SocketAddr) {}

    /// The last fd of a tracked listener bound to `addr` is being closed in
    /// this process.
    fn listener_closed(&self, _addr: SocketAddr) {}

    /// A tracked connection `fd` stays plain TCP, for `reason`; `peer`
    /// where the caller knows it (a connect still in progress has no peer
    /// the socket would tell yet). Returns what `tcp_closed` gets back.
    fn tcp_decided(&self, _fd: RawFd, _peer: Option<SocketAddr>, _reason: TcpReason) -> TcpMemo {
        TcpMemo::default()
    }

    /// The last fd of a tracked plain-TCP connection is being closed;
    /// `memo` is what connect, accept or `tcp_decided` left with it.
    fn tcp_closed(&self, _fd: RawFd, _memo: TcpMemo) {}

    /// The process is about to put itself under a seccomp filter, its
    /// connections left and forgotten: whatever the layer still owes goes
    /// out now, and it stops every thread of its own, so that nothing it
    /// does later makes a system call (the filter may forbid any).
    fn sandboxed(&self) {}
}

static ATTACHER: OnceLock<&'static dyn Attacher> = OnceLock::new();

/// Installs the process's ring layer. Returns false if one was already
/// installed (the first one stays).
pub fn register_attacher(a: &'static dyn Attacher) -> bool {
    ATTACHER.set(a).is_ok()
}

/// The registered ring layer, if any.
pub fn attacher() -> Option<&'static dyn Attacher> {
    ATTACHER.get().copied()
}
