//! Which sockets the shim tracks, and how connect/accept decide between a
//! ring and plain TCP.
//!
//! Only AF_INET/AF_INET6 SOCK_STREAM sockets with protocol 0 or IPPROTO_TCP
//! are ever tracked; UDP, AF_UNIX, netlink, raw, MPTCP... are never looked
//! at again. Sockets created by the shim itself (inside a guard scope) are
//! not tracked either, nor is anything while RINGSOCK_DISABLE=1.

use std::net::SocketAddr;

use libc::c_int;

use crate::attached::{self, Decision, Errno, TcpMemo, TcpReason};
use crate::config::{self, Excluded};
use crate::fdtable::{self, FdRef, Kind};
use crate::interpose::guard;
use crate::{process, sockaddr};

pub mod defer_accept;
mod survivors;

/// True for the sockets a ring could carry.
pub fn is_tcp(domain: c_int, ty: c_int, protocol: c_int) -> bool {
    let base = ty & !(libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC);
    (domain == libc::AF_INET || domain == libc::AF_INET6)
        && base == libc::SOCK_STREAM
        && (protocol == 0 || protocol == libc::IPPROTO_TCP)
}

fn may_track() -> bool {
    !guard::active()
        && !config::get().disable
        && !process::sandbox_begun()
        && process::owns_memory()
}

/// socket() returned `fd` for a TCP socket.
pub fn on_new_socket(fd: c_int, domain: c_int, ty: c_int) {
    if may_track() {
        crate::fdspace::reserve(fd);
        let nonblock = ty & libc::SOCK_NONBLOCK != 0;
        if fdtable::track_new(fd, Kind::Tcp, domain, nonblock).is_none() {
            log::debug!("fd {fd} not tracked (beyond table capacity)");
        }
    }
}

/// epoll_create/epoll_create1 returned `fd`. Tracked from the start, so
/// that its duplicates share one state (a ring added through one number is
/// reported through every other, as they are one instance), and a slot
/// left at the number by an fd closed behind our back goes.
pub fn on_new_epoll(fd: c_int) {
    if fd >= 0 && may_track() && fdtable::track_new(fd, Kind::Epoll, 0, false).is_none() {
        log::debug!("epoll fd {fd} not tracked (beyond table capacity)");
    }
}

fn excluded_reason(e: Excluded) -> TcpReason {
    match e {
        Excluded::Port => TcpReason::ExcludedPort,
        Excluded::Net => TcpReason::ExcludedNet,
    }
}

/// accept()/accept4() on tracked listener `lfd` returned `fd`.
/// `peer` is the address accept gave the program, if it asked for it.
pub fn on_accepted(
    lfd: c_int,
    listener: &FdRef,
    fd: c_int,
    flags: c_int,
    peer: Option<SocketAddr>,
) {
    if !may_track() {
        return;
    }
    // A listener inherited or passed in, never made here.
    crate::fdspace::reserve(fd);
    let nonblock = flags & libc::SOCK_NONBLOCK != 0;
    let Some(st) = fdtable::track_new(fd, Kind::Tcp, listener.family(), nonblock) else {
        return;
    };
    let Some(attacher) = attached::attacher() else {
        st.set_tcp_reason(TcpReason::NoTransport);
        return;
    };
    let (Some(local), Some(peer)) = (
        listener.bound().or_else(|| sockaddr::query(fd, false)),
        peer.or_else(|| sockaddr::query(fd, true)),
    ) else {
        st.set_tcp_reason(TcpReason::Family);
        return;
    };
    if let Err(e) = config::get().allows(peer.ip(), local.port()) {
        stay_tcp(fd, &st, Some(peer), excluded_reason(e));
        return;
    }
    let _g = guard::enter();
    let mut memo = TcpMemo::default();
    let decision = attacher.accept(lfd, fd, local, peer, &mut memo);
    apply(fd, &st, decision, memo);
}

/// connect() on tracked socket `st`: decides, lets the kernel connect
/// happen through `real_connect`, and returns its result.
pub fn connect(
    fd: c_int,
    st: &FdRef,
    dest: Option<SocketAddr>,
    real_connect: &mut dyn FnMut() -> Result<(), Errno>,
) -> Result<(), Errno> {
    let reason = match (dest, attached::attacher()) {
        // Entering a sandbox (another thread): no new ring.
        _ if process::sandbox_begun() => Some(TcpReason::Disabled),
        (None, _) => Some(TcpReason::Family),
        (_, None) => Some(TcpReason::NoTransport),
        (Some(d), Some(_)) => config::get()
            .allows(d.ip(), d.port())
            .err()
            .map(excluded_reason),
    };
    if let Some(r) = reason {
        let res = real_connect();
        if r != TcpReason::Family && matches!(res, Ok(()) | Err(Errno(libc::EINPROGRESS))) {
            // The destination is the peer: a connect still in progress
            // has none to ask the socket for yet.
            stay_tcp(fd, st, dest, r);
        } else {
            st.set_tcp_reason(r);
        }
        return res;
    }
    let (Some(dest), Some(attacher)) = (dest, attached::attacher()) else {
        return real_connect();
    };
    let _g = guard::enter();
    let mut memo = TcpMemo::default();
    let (res, decision) = attacher.connect(fd, dest, st.nonblocking(), real_connect, &mut memo);
    apply(fd, st, decision, memo);
    res
}

/// listen() succeeded on tracked socket `fd`: register it with the ring
/// layer (connections to it may then be offered rings).
pub fn on_listen(fd: c_int, st: &FdRef) {
    let addr = sockaddr::query(fd, false);
    st.set_bound(addr.filter(|a| !a.ip().is_unspecified() && !sockaddr::transparent(fd)));
    let (Some(a), Some(addr)) = (attached::attacher(), addr) else {
        return;
    };
    if config::get().allows(addr.ip(), addr.port()).is_err() {
        return;
    }
    let saved = crate::sys::errno();
    let _g = guard::enter();
    a.listening(fd, addr);
    crate::sys::set_errno(saved);
}

/// Records a plain-TCP decision made before the ring layer was asked, and
/// tells it (for status).
fn stay_tcp(fd: c_int, st: &FdRef, peer: Option<SocketAddr>, r: TcpReason) {
    st.set_tcp_reason(r);
    if let Some(a) = attached::attacher() {
        let _g = guard::enter();
        let memo = a.tcp_decided(fd, peer, r);
        keep_memo(st, memo);
    }
}

/// Keeps the ring layer's memo of a plain-TCP connection for its close.
fn keep_memo(st: &FdRef, memo: TcpMemo) {
    if memo != TcpMemo::default() {
        st.set_tcp_memo(memo);
    }
}

fn apply(fd: c_int, st: &FdRef, decision: Decision, memo: TcpMemo) {
    match decision {
        Decision::Tcp(r) => {
            // Kept before the decision ends the pre-connect window: a
            // close that finds the socket decided finds its memo.
            keep_memo(st, memo);
            st.set_tcp_reason(r);
        }
        Decision::Ring(conn) => {
            if st.attach(conn).is_err() {
                // Only possible if the program raced two connects on one fd.
                log::warn!("fd {fd}: a ring was already attached; keeping the first");
            } else {
                log::debug!("fd {fd}: ring attached");
                crate::dispatch::epoll::migrate(fd, st);
            }
        }
    }
}

/// Longest a process exit waits for its rings' last writes to be
/// acknowledged (verbs; a round trip, far longer only when the peer is
/// unreachable, and then its kernel socket says so).
const EXIT_DRAIN_NS: u64 = 1_000_000_000;

/// The process is exiting (`exit` through the atexit handler, `_exit`,
/// `_Exit`): every ring it uses gets what the kernel gives a socket left
/// open at exit, delivery of what was written (`AttachedConn::
/// drain_at_exit`). Nothing in a vfork child (it shares the parent's
/// table) or with no ring alive.
pub fn drain_at_exit() {
    if process::sandboxed() || fdtable::rings_alive() == 0 || !process::owns_memory() {
        return;
    }
    let _g = guard::enter();
    let deadline = crate::sys::monotonic_ns() + EXIT_DRAIN_NS;
    for fd in 0..fdtable::capacity() as i32 {
        if let Some(r) = fdtable::attached(fd) {
            if let Some(c) = r.conn() {
                c.drain_at_exit(deadline);
            }
        }
    }
}

/// The ring connections behind `fds` leave the ring for their kernel
/// sockets (the descriptors go to another process, which reads and writes
/// the kernel socket).
pub fn leave_rings(fds: &[c_int]) {
    if fdtable::rings_alive() == 0 {
        return;
    }
    let _g = guard::enter();
    for &fd in fds {
        if let Some(c) = fdtable::attached(fd).as_ref().and_then(|r| r.conn()) {
            c.leave_ring(true);
        }
    }
}

/// Before an exec: every ring connection with a descriptor that survives
/// it (no FD_CLOEXEC) leaves the ring, since the new image finds a plain
/// kernel socket there. A vfork child leaves on its parent's behalf: the
/// two share the connections' memory and kernel sockets
/// (`survivors::at_exec` reads such a child's own descriptors).
pub fn leave_before_exec() {
    if fdtable::rings_alive() == 0 {
        return;
    }
    leave_rings(&survivors::at_exec(!process::owns_memory()));
}

/// Before posix_spawn: the connections the child gets once its file
/// `actions` ran leave the ring, as before an exec.
///
/// # Safety
/// `actions` is null or glibc's initialized file actions.
pub unsafe fn leave_before_spawn(actions: *const libc::posix_spawn_file_actions_t) {
    if fdtable::rings_alive() == 0 || !process::owns_memory() {
        leave_before_exec();
        return;
    }
    // SAFETY: per our caller.
    leave_rings(&unsafe { survivors::at_spawn(actions) });
}

/// Before the process puts itself under a seccomp filter (hooks/seccomp.rs):
/// every ring connection leaves its ring as before an exec, whatever its
/// descriptor's FD_CLOEXEC (one that cannot, exactly, is reset: a peer
/// already gone, bytes the kernel socket would not take in time), and
/// every epoll instance gets its ring registrations back as kernel ones;
/// the shim then forgets every fd, tells the daemon its listeners are
/// gone, and the ring layer stops its thread. From then on
/// (`process::sandboxed`) the shim makes no system call of its own: the
/// filter may forbid any. A thread that installs a filter while another
/// is entering waits for it (bounded). A vfork child, which shares our
/// memory, changes nothing: the parent's rings are not its to leave.
pub fn enter_sandbox() {
    if !process::owns_memory() {
        return;
    }
    if !process::begin_sandbox() {
        await_sandbox();
        return;
    }
    let saved = crate::sys::errno();
    let _g = guard::enter();
    let mut rings = 0;
    for fd in 0..fdtable::capacity() as i32 {
        if let Some(c) = fdtable::attached(fd).as_ref().and_then(|r| r.conn()) {
            rings += 1;
            if !(c.leave_ring(true) && c.at_mark().is_none()) {
                reset_for_sandbox(fd);
            }
        }
    }
    let attacher = attached::attacher();
    for fd in 0..fdtable::capacity() as i32 {
        let Some(st) = fdtable::get(fd) else {
            continue;
        };
        match st.kind() {
            Some(Kind::Epoll) => crate::dispatch::epoll::hand_to_kernel(fd, &st),
            Some(Kind::Listener) => {
                if let (Some(a), Some(addr)) = (attacher, sockaddr::query(fd, false)) {
                    a.listener_closed(addr);
                }
            }
            _ => {}
        }
    }
    fdtable::forget_all();
    if let Some(a) = attacher {
        a.sandboxed();
    }
    log::debug!("entering a seccomp sandbox: {rings} ring descriptors left");
    process::finish_sandbox();
    crate::sys::set_errno(saved);
}

/// Waits until another thread's `enter_sandbox` is done: each ring's leave
/// is bounded by the connect timeout, so this waits that long per ring at
/// most, then a second (and lets the filter in regardless).
fn await_sandbox() {
    let limit_ns = u64::from(config::get().connect_timeout_ms) * 1_000_000;
    let rings = fdtable::rings_alive() as u64 + 1;
    let deadline = crate::sys::monotonic_ns() + limit_ns * rings + 1_000_000_000;
    while !process::sandboxed() && crate::sys::monotonic_ns() < deadline {
        crate::sys::pause_1ms();
    }
}

/// A connection that could not leave its ring exactly (bytes of the stream
/// the shim still holds, which plain calls will never see) is reset, as
/// the kernel resets one that cannot go on: connect(AF_UNSPEC) sends the
/// peer a RST, and the program's next call on `fd` fails with ECONNRESET.
/// Never a stream that goes on with bytes missing.
fn reset_for_sandbox(fd: c_int) {
    log::error!("fd {fd}: cannot leave its ring exactly before the sandbox; resetting it");
    let unspec = libc::sockaddr {
        sa_family: libc::AF_UNSPEC as libc::sa_family_t,
        sa_data: [0; 14],
    };
    // SAFETY: connect reads one sockaddr of ours.
    unsafe {
        crate::sys::sys_call!(
            libc::SYS_connect,
            fd,
            &unspec as *const libc::sockaddr,
            std::mem::size_of::<libc::sockaddr>() as libc::socklen_t,
        )
    };
}

thread_local! {
    /// The connections the forking thread holds across a fork.
    static FORK_HELD: std::cell::RefCell<Vec<std::sync::Arc<dyn attached::AttachedConn>>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// Just before a fork (the atfork prepare handler, or the `_Fork` hook):
/// every ring connection is held, published and marked shared
/// (`AttachedConn::fork_prepare`), so the child's copy is consistent.
pub fn fork_prepare() {
    if process::sandboxed() || fdtable::rings_alive() == 0 || !process::owns_memory() {
        return;
    }
    let _g = guard::enter();
    let mut held: Vec<std::sync::Arc<dyn attached::AttachedConn>> = Vec::new();
    for fd in 0..fdtable::capacity() as i32 {
        if let Some(c) = fdtable::attached(fd).and_then(|r| r.conn_arc()) {
            if !held.iter().any(|h| std::sync::Arc::ptr_eq(h, &c)) {
                c.fork_prepare();
                held.push(c);
            }
        }
    }
    FORK_HELD.with(|h| *h.borrow_mut() = held);
}

/// Right after the fork, in parent and child alike.
pub fn fork_finish() {
    let held = FORK_HELD.with(|h| std::mem::take(&mut *h.borrow_mut()));
    for c in held {
        c.fork_finish();
    }
}

extern "C" fn atfork_prepare() {
    fork_prepare();
}

extern "C" fn atfork_done() {
    fork_finish();
}

/// Registers the fork handlers that hold the connections across a fork
/// (every fork through glibc runs them, our `fork` hook's included).
pub fn register_fork_handlers() {
    // SAFETY: the handlers are plain extern "C" functions; they take the
    // connections' own locks and allocate before glibc takes malloc's.
    let rc =
        unsafe { libc::pthread_atfork(Some(atfork_prepare), Some(atfork_done), Some(atfork_done)) };
    if rc != 0 {
        log::warn!("pthread_atfork failed ({rc}); a fork may copy a ring mid-operation");
    }
}
