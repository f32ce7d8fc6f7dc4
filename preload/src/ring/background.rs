//! The shim's one background thread per process, and the lists it serves.
//!
//! * Flush timer: a `send` may leave bytes in an open batch (RB2 adaptive
//!   batching). They are pushed out before this process can block (every
//!   recv/poll/epoll_wait/select flushes, `flush_all`), and, for a program
//!   that computes for a while after sending, by this thread within
//!   `FLUSH_NS`: no byte waits for a batch to fill.
//! * Handshake follow-up: a client whose offer the server neither took nor
//!   declined in the segment asks the daemon (`Collect`) and falls back to
//!   TCP on `Declined`/`Expired`; accepted offers are collected so the
//!   daemon can forget them.
//! * Reports: connections are reported to the daemon for `ringsock-ctl
//!   status` from here, off the connect/accept path.
//!
//! The thread sleeps on an eventfd when it has nothing to do, so an idle
//! program costs nothing; it is started lazily, and again in a forked child
//! (threads do not survive fork).

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::thread::JoinHandleExt;
use std::sync::atomic::{AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use ringsock_proto::{Msg, Transport};
use ringsock_ring::sleep::park::WorkerPark;

use super::ctl;
use super::plock::PLock;
use super::tracked::Tracked;
use crate::attached::TcpReason;
use crate::interpose::guard;
use crate::{process, sockaddr, sys};

/// Longest time a batched byte waits when the program does not block.
const FLUSH_NS: u64 = 1_000_000;
/// The thread leaves a connection queued less than this long alone: a
/// program that sent and is about to block flushes and settles it itself
/// within microseconds, and a tick that takes the connection's locks then
/// makes the program wait for the thread's posts (two context switches on
/// the round trip).
const FLUSH_GRACE_NS: u64 = 250_000;
/// Idle ticks (nothing to flush) before the thread stops ticking.
const IDLE_TICKS: u32 = 100;
/// A pending client asks the daemon after this long, then at this period.
const COLLECT_AFTER_NS: u64 = 20_000_000;
const COLLECT_EVERY_NS: u64 = 50_000_000;
/// How often a process with listeners looks for a daemon that went away.
const DAEMON_RETRY_NS: u64 = 1_000_000_000;
/// Reports wait this long before they are sent: a connection opened and
/// closed within it never costs the daemon anything (short-lived
/// connections are the common case of a busy server, and status only
/// lists live ones).
const REPORT_DELAY_NS: u64 = 5_000_000;
/// A report still queued this long is sent by the program itself, ahead
/// (no wait for the reply), the next time it is about to block
/// (`flush_all`): the thread may not have run yet (it starts with the
/// first report of a process, and a CPU-bound machine can keep a new
/// thread waiting for most of a second) or may have failed to start, and
/// a connection the program uses must not stay out of status meanwhile.
const REPORT_OVERDUE_NS: u64 = 4 * REPORT_DELAY_NS;

enum Report {
    Ring(Arc<dyn Tracked>, RawFd, Option<OwnedFd>),
    RingClosed(Arc<dyn Tracked>),
    Fallback(Arc<dyn Tracked>),
    /// `local` is learnt when the report is sent (`tcp_local`): most
    /// plain connections close before that and never ask for it.
    Tcp {
        fd: RawFd,
        local: Option<SocketAddr>,
        peer: SocketAddr,
        reason: TcpReason,
    },
    /// Without a local address the daemon never heard of the connection.
    Closed(RawFd, Option<SocketAddr>, SocketAddr),
}

/// Connections with bytes or completions owed, with when they were queued.
static FLUSH: PLock<Vec<(u64, Arc<dyn Tracked>)>> = PLock::new(Vec::new(), Vec::new);
static DIRTY: AtomicUsize = AtomicUsize::new(0);
static PENDING: PLock<Vec<Weak<dyn Tracked>>> = PLock::new(Vec::new(), Vec::new);
/// Pending handshakes among PENDING that only the daemon can settle
/// (verbs): followed up every tick instead of every COLLECT_EVERY_NS.
static URGENT: AtomicUsize = AtomicUsize::new(0);
static COLLECT: PLock<Vec<u64>> = PLock::new(Vec::new(), Vec::new);
/// The addresses of each plain-TCP socket whose open report was taken to
/// be sent, by fd (entered under REPORTS' lock, by `mark_taken`): once
/// the peer has reset the connection getpeername fails (ENOTCONN), and
/// the close must still name the connection the daemon knows, or status
/// shows it until the process exits or reuses the fd number. The local
/// address is None until the open report is sent. A connection closed
/// while its open was still queued never enters it.
static TCP_ADDRS: PLock<BTreeMap<RawFd, (Option<SocketAddr>, SocketAddr)>> =
    PLock::new(BTreeMap::new(), BTreeMap::new);
/// What the daemon was last told of each live connection, by fd, with the
/// session that heard it: a restarted daemon knows nothing, so once a new
/// session opens, every entry is told again (without the ring's memfd,
/// which went to the old daemon: those rows show no counters).
static LIVE: PLock<BTreeMap<RawFd, (u64, Msg)>> = PLock::new(BTreeMap::new(), BTreeMap::new);
/// Reports waiting to be sent, with the time they were queued.
static REPORTS: PLock<VecDeque<(u64, Report)>> = PLock::new(VecDeque::new(), VecDeque::new);
/// When the report at the front of REPORTS was queued, 0 while it is
/// empty: `flush_all` sees with one load whether one is overdue.
static OLDEST_REPORT: AtomicU64 = AtomicU64::new(0);
/// Held from taking a report off REPORTS until it is sent, by the thread
/// or by the program (`send_overdue`): reports reach the daemon in the
/// order they were queued (an open before its close).
static SENDING: PLock<()> = PLock::new((), || ());

/// The thread's sleep (`ringsock_ring::sleep::park`, loom-modelled):
/// every post bumps it, and a post rings `WAKE_FD` only while the thread
/// sleeps without a deadline (or a long one). While it ticks (`FLUSH_NS`)
/// posters never make a system call.
static PARK: WorkerPark = WorkerPark::new();
/// The pid whose thread is running (a forked child has none).
static THREAD_PID: AtomicI32 = AtomicI32::new(0);
/// The thread `ensure_thread` started in THREAD_PID's process (pthread_t,
/// 0 for none).
static THREAD: AtomicU64 = AtomicU64::new(0);
/// The eventfd the thread sleeps on (with the daemon session), -1 before
/// the thread exists in this process.
static WAKE_FD: AtomicI32 = AtomicI32::new(-1);
/// How often a thread without WAKE_FD looks for work.
const NO_WAKE_FD_POLL_NS: u64 = 10_000_000;

/// After every post (queue entry, dirty count): the thread sees it before
/// it sleeps, or is woken. Only atomics unless the thread is parked.
fn wake() {
    if PARK.request() {
        let fd = WAKE_FD.load(Ordering::Acquire);
        if fd >= 0 {
            let one = 1u64;
            // SAFETY: 8-byte write from a local to our eventfd.
            unsafe { crate::sys::sys_call!(libc::SYS_write, fd, &one as *const u64, 8) };
        }
    }
}

/// Sleeps until `wake`, the timeout, or news on the daemon session (a
/// reply sent ahead, or the daemon going away). `long` marks a sleep that
/// posters must interrupt (see PARK).
fn park(seen: u64, timeout_ns: Option<u64>, long: bool) {
    let efd = WAKE_FD.load(Ordering::Acquire);
    // Without a wake eventfd (eventfd2 failed: fd limit, seccomp) no writer
    // can interrupt the sleep: look again every 10 ms instead of parking.
    let timeout_ns = if efd < 0 {
        Some(timeout_ns.map_or(NO_WAKE_FD_POLL_NS, |t| t.min(NO_WAKE_FD_POLL_NS)))
    } else {
        timeout_ns
    };
    let ts = timeout_ns.map(|ns| libc::timespec {
        tv_sec: (ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (ns % 1_000_000_000) as libc::c_long,
    });
    let tsp = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    let mut pfds = [
        libc::pollfd {
            fd: efd,
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: ctl::session_fd().unwrap_or(-1),
            events: libc::POLLIN | libc::POLLRDHUP,
            revents: 0,
        },
        libc::pollfd {
            fd: super::watch::fd().unwrap_or(-1),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    if PARK.may_sleep(seen, long) {
        // SAFETY: three valid pollfds (a negative fd is ignored by the
        // kernel) and a valid or null timeout.
        unsafe {
            crate::sys::sys_call!(
                libc::SYS_ppoll,
                pfds.as_mut_ptr(),
                3,
                tsp,
                std::ptr::null::<libc::sigset_t>(),
                8,
            )
        };
    }
    PARK.woke();
    if pfds[0].revents != 0 {
        let mut v = 0u64;
        // SAFETY: 8-byte read into a local from our non-blocking eventfd.
        unsafe { crate::sys::sys_call!(libc::SYS_read, efd, &mut v as *mut u64, 8) };
    }
    if pfds[1].revents != 0 {
        // Replies sent ahead, or the daemon closed the session: either way
        // `tend` reads what is there (and reconnects when it is gone).
        ctl::tend(reports_stale());
    }
    if pfds[2].revents != 0 {
        super::watch::serve();
    }
}

fn ensure_thread() {
    if process::sandbox_begun() {
        return;
    }
    let me = process::pid();
    let cur = THREAD_PID.load(Ordering::Acquire);
    if cur == me {
        return;
    }
    if THREAD_PID
        .compare_exchange(cur, me, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return;
    }
    // SAFETY: plain eventfd creation.
    let efd = unsafe {
        crate::sys::sys_call!(
            libc::SYS_eventfd2,
            0,
            libc::EFD_NONBLOCK | libc::EFD_CLOEXEC,
        )
    };
    if efd >= 0 {
        let old = WAKE_FD.swap(crate::fdspace::high(efd as RawFd), Ordering::AcqRel);
        if old >= 0 {
            // The parent's, inherited through fork.
            crate::fdspace::close(old);
        }
    }
    // Started with every signal blocked, a mask it keeps: the program's
    // signals go to the program's threads (this one never leaves its shim
    // scope, where a handler would wait forever: interpose/defer.rs).
    let spawned = crate::signals::mask::with_all_blocked(|| {
        std::thread::Builder::new()
            .name("ringsock".into())
            .stack_size(256 * 1024)
            .spawn(run)
    });
    match spawned {
        // Kept unjoined (never detached): `stop` may join it.
        Ok(t) => THREAD.store(t.into_pthread_t(), Ordering::Release),
        Err(e) => log::warn!(
            "cannot start the ringsock thread ({e}); batches flush only when the program blocks"
        ),
    }
}

/// Before a seccomp filter (`Attacher::sandboxed`): the reports still
/// queued go to the daemon now, and this process's thread ends; once it
/// has exited (bounded by the connect timeout: it may be in a daemon
/// call), this process makes no system call of the thread's again. A
/// forked child has no thread of its own; none is started after this.
pub fn stop() {
    let queued = {
        let _sending = SENDING.lock();
        let mut q = REPORTS.lock();
        let all = std::mem::take(&mut *q);
        all.iter().for_each(|(_, r)| mark_taken(r));
        set_oldest(&q);
        all
    };
    for (_, r) in queued {
        send_report(r);
    }
    let me = process::pid();
    if THREAD_PID
        .compare_exchange(me, 0, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return;
    }
    let t = THREAD.swap(0, Ordering::AcqRel);
    if t == 0 {
        return;
    }
    wake();
    let limit = u64::from(crate::config::get().connect_timeout_ms) * 1_000_000;
    let deadline = sys::monotonic_ns() + limit + 1_000_000_000;
    loop {
        // SAFETY: `t` is the thread `ensure_thread` started in this process,
        // never detached nor joined before (THREAD is taken once).
        match unsafe { libc::pthread_tryjoin_np(t, std::ptr::null_mut()) } {
            libc::EBUSY if sys::monotonic_ns() < deadline => sys::pause_1ms(),
            0 => return,
            e => {
                log::warn!("the ringsock thread did not end (error {e}); it may be killed by the sandbox's filter");
                return;
            }
        }
    }
}

/// Starts the thread now (a process with listeners must notice a daemon
/// restart even while it has no connection).
pub fn start() {
    ensure_thread();
}

/// Queues `conn` for a timed flush.
pub fn queue_flush(conn: Arc<dyn Tracked>) {
    FLUSH.lock().push((sys::monotonic_ns(), conn));
    if DIRTY.fetch_add(1, Ordering::AcqRel) == 0 {
        ensure_thread();
        // A system call only for a thread that stopped ticking.
        wake();
    }
}

/// Blocks of this process so far (`flush_all` runs before each): a
/// sender that sees it move knows the program waited since its last
/// write (`msgstart`).
static BLOCKS: AtomicU64 = AtomicU64::new(0);

/// The count of this process's blocks (see BLOCKS).
pub fn blocks() -> u64 {
    BLOCKS.load(Ordering::Relaxed)
}

/// Flushes every connection with batched bytes (before this process
/// blocks). Two atomic operations when there is nothing to do.
pub fn flush_all() {
    BLOCKS.fetch_add(1, Ordering::Relaxed);
    send_overdue();
    if DIRTY.load(Ordering::Acquire) == 0 {
        return;
    }
    let list = std::mem::take(&mut *FLUSH.lock());
    DIRTY.fetch_sub(list.len(), Ordering::AcqRel);
    for (_, c) in list {
        c.flush_ring();
    }
}

/// The background variant: never waits for a connection in use.
fn flush_some() {
    let list = std::mem::take(&mut *FLUSH.lock());
    DIRTY.fetch_sub(list.len(), Ordering::AcqRel);
    let now = sys::monotonic_ns();
    for (since, c) in list {
        if c.is_released() {
            continue;
        }
        let young = now.saturating_sub(since) < FLUSH_GRACE_NS;
        if young || !c.try_flush_ring() {
            // Just queued, or in use by the program: the next tick.
            FLUSH.lock().push((since, c));
            DIRTY.fetch_add(1, Ordering::AcqRel);
        }
    }
}

impl Report {
    /// Whether this is an open (or a fallback's re-report) of `conn`.
    fn opens(&self, conn: &Arc<dyn Tracked>) -> bool {
        matches!(self, Report::Ring(o, _, _) | Report::Fallback(o) if Arc::ptr_eq(o, conn))
    }
}

fn report(r: Report) {
    {
        let mut q = REPORTS.lock();
        q.push_back((sys::monotonic_ns(), r));
        set_oldest(&q);
    }
    ensure_thread();
    wake();
}

/// Publishes when the front of `q` was queued (with REPORTS held).
fn set_oldest(q: &VecDeque<(u64, Report)>) {
    OLDEST_REPORT.store(q.front().map_or(0, |(t, _)| *t), Ordering::Release);
}

/// A report taken off the queue to be sent: an open one counts as this
/// process's from now on (with REPORTS held, so `note_closed`, which
/// looks under that lock, either still finds it queued or sends the
/// close after it).
fn mark_taken(r: &Report) {
    match r {
        Report::Ring(conn, _, _) if !conn.is_released() => {
            let st = conn.report_state();
            st.reported.store(true, Ordering::Release);
            st.reporter_pid.store(process::pid(), Ordering::Release);
        }
        Report::Tcp {
            fd, local, peer, ..
        } => {
            TCP_ADDRS.lock().insert(*fd, (*local, *peer));
        }
        _ => {}
    }
}

/// What the front of the queue asks for, reports queued at least `delay`
/// ago being due.
enum Next {
    Send(Report),
    /// The front is due in this many ns.
    Wait(u64),
    Empty,
}

/// Takes the front report off `q` if it is due (see `Next`).
fn take_due(q: &mut VecDeque<(u64, Report)>, now: u64, delay: u64) -> Next {
    match q.front() {
        Some((t, _)) if now.saturating_sub(*t) >= delay => {
            let Some((_, r)) = q.pop_front() else {
                return Next::Empty;
            };
            mark_taken(&r);
            set_oldest(q);
            Next::Send(r)
        }
        Some((t, _)) => Next::Wait(delay - now.saturating_sub(*t)),
        None => Next::Empty,
    }
}

/// The program is about to block: reports the thread left queued past
/// `REPORT_OVERDUE_NS` go to the daemon now, sent ahead on this
/// process's session. Nothing is waited for: a session or queue in use
/// (by the thread, or by this very thread in a signal handler) leaves
/// them to the thread. One atomic load when none is overdue.
fn send_overdue() {
    let oldest = OLDEST_REPORT.load(Ordering::Acquire);
    if oldest == 0 || sys::monotonic_ns().saturating_sub(oldest) < REPORT_OVERDUE_NS {
        return;
    }
    if process::sandbox_begun() {
        return;
    }
    let _g = guard::enter();
    let Some(_sending) = SENDING.try_lock() else {
        return;
    };
    let Some(mut session) = ctl::try_ahead() else {
        return;
    };
    // Remembered once the session is let go: `reports_stale` takes the
    // session's lock while it holds LIVE's.
    let mut told = Vec::new();
    loop {
        let next = match REPORTS.try_lock() {
            Some(mut q) => take_due(&mut q, sys::monotonic_ns(), REPORT_OVERDUE_NS),
            None => break,
        };
        let Next::Send(r) = next else {
            break;
        };
        let Some((msg, memfd)) = prepare(r) else {
            continue;
        };
        let fds: Vec<RawFd> = memfd.iter().map(|f| f.as_raw_fd()).collect();
        let sent = session.send(&msg, &fds).is_ok();
        told.push((msg, if sent { session.session() } else { 0 }));
        if !sent {
            break;
        }
    }
    drop(session);
    for (msg, heard) in told {
        remember(msg, heard);
    }
}

/// A ring was attached to `fd` (client or server side).
/// `memfd` (a descriptor of the ring's segment) goes to the daemon for
/// its counters and is closed once sent.
pub fn note_ring(fd: RawFd, conn: Arc<dyn Tracked>, memfd: Option<OwnedFd>) {
    conn.report_state().fd.store(fd, Ordering::Relaxed);
    super::watch::watch(&conn, conn.socket_fd());
    report(Report::Ring(conn, fd, memfd));
}

/// A forked child took over a ring its parent reported: status lists it
/// under the child (without the ring's memfd, which went to the daemon
/// with the parent's report: the row shows no counters).
pub fn note_taken_over(conn: Arc<dyn Tracked>) {
    let queued = taken_over_in(
        &mut REPORTS.lock(),
        conn,
        process::pid(),
        sys::monotonic_ns(),
    );
    if queued {
        ensure_thread();
        wake();
    }
}

/// Queues `conn`'s open as process `me`'s unless `me` reported it already
/// or its open is still queued here (the parent itself using a ring a
/// fork made shared, a child with its copy of the parent's queue): a
/// second open would outlive the close that cancels the first. Returns
/// whether an open of `conn` waits in `q` for the thread.
fn taken_over_in(
    q: &mut VecDeque<(u64, Report)>,
    conn: Arc<dyn Tracked>,
    me: i32,
    now: u64,
) -> bool {
    let st = conn.report_state();
    if st.reporter_pid.load(Ordering::Acquire) == me {
        return false;
    }
    if !q.iter().any(|(_, r)| r.opens(&conn)) {
        let fd = st.fd.load(Ordering::Relaxed);
        q.push_back((now, Report::Ring(conn, fd, None)));
        set_oldest(q);
    }
    true
}

/// A client started waiting for the server's decision.
pub fn note_pending(conn: &Arc<dyn Tracked>) {
    {
        let mut pending = PENDING.lock();
        if conn.urgent_follow_up() {
            URGENT.fetch_add(1, Ordering::AcqRel);
        }
        pending.push(Arc::downgrade(conn));
    }
    // The connection's report (`note_ring`, right after) wakes the thread
    // too; only an urgent follow-up needs it before the report delay.
    if conn.urgent_follow_up() {
        ensure_thread();
        wake();
    }
}

/// The server took the ring: let the daemon forget the offer.
pub fn note_accepted(offer_id: u64) {
    COLLECT.lock().push(offer_id);
    // No report follows: a thread asleep without a deadline must learn
    // that it has a collect to make.
    ensure_thread();
    wake();
}

/// A pending client fell back to TCP.
pub fn note_fallback(conn: Arc<dyn Tracked>) {
    report(Report::Fallback(conn));
}

/// The connection's last fd in this process is gone.
pub fn note_closed(conn: Arc<dyn Tracked>) {
    let queued = closed_in(
        &mut REPORTS.lock(),
        conn,
        process::pid(),
        sys::monotonic_ns(),
    );
    if queued {
        ensure_thread();
        wake();
    }
}

/// Cancels the reports of `conn` still queued in `q`, and queues its close
/// if process `me` sent its open (`mark_taken`, under the same lock): the
/// daemon heard of it, so it must hear of its end, whatever else of it was
/// still queued. A connection this process never reported costs nothing
/// more (a forked child closing what it inherited often closes the shim's
/// descriptors in the same close_range). Returns whether a close was
/// queued.
fn closed_in(q: &mut VecDeque<(u64, Report)>, conn: Arc<dyn Tracked>, me: i32, now: u64) -> bool {
    q.retain(|(_, r)| !r.opens(&conn));
    let sent = conn.report_state().reporter_pid.load(Ordering::Acquire) == me;
    if sent {
        q.push_back((now, Report::RingClosed(conn)));
    }
    set_oldest(q);
    sent
}

/// A tracked socket stays plain TCP; a peer the caller does not give is
/// asked of the socket, its local address only if the report is sent.
pub fn note_tcp(fd: RawFd, local: Option<SocketAddr>, peer: Option<SocketAddr>, reason: TcpReason) {
    let Some(peer) = peer.or_else(|| sockaddr::query(fd, true)) else {
        return;
    };
    report(Report::Tcp {
        fd,
        local,
        peer,
        reason,
    });
}

/// A tracked plain-TCP socket's last fd is being closed: its open report
/// is cancelled if still queued (most short connections), or its close
/// is queued after it.
pub fn note_tcp_closed(fd: RawFd) {
    let mut q = REPORTS.lock();
    // Its open is the last queued report for `fd` if any: search from the
    // back, where a short connection's is.
    let queued = q
        .iter()
        .rposition(|(_, r)| matches!(r, Report::Tcp { fd: f, .. } if *f == fd));
    if let Some(i) = queued {
        q.remove(i);
        set_oldest(&q);
        return;
    }
    let known = TCP_ADDRS.lock().remove(&fd);
    drop(q);
    // Its open was taken to be sent: the close goes after it.
    if let Some((local, peer)) = known {
        report(Report::Closed(fd, local, peer));
    }
}

/// The local address of plain-TCP socket `fd` connected to `peer`, for
/// its open report: asked of the socket while TCP_ADDRS still lists it
/// (its close takes the entry out before the descriptor goes, so the
/// number cannot name another socket meanwhile), and kept for its close.
/// None once it is closed: then no report is owed.
fn tcp_local(fd: RawFd, peer: SocketAddr) -> Option<SocketAddr> {
    let mut addrs = TCP_ADDRS.lock();
    let entry = addrs.get_mut(&fd).filter(|(_, p)| *p == peer)?;
    if entry.0.is_none() {
        entry.0 = sockaddr::query(fd, false);
    }
    entry.0
}

fn reason_text(r: TcpReason) -> &'static str {
    match r {
        TcpReason::Undecided => "undecided",
        TcpReason::Disabled => "RINGSOCK_DISABLE",
        TcpReason::ExcludedPort => "port excluded",
        TcpReason::ExcludedNet => "address excluded",
        TcpReason::NoTransport => "no ring transport",
        TcpReason::Declined => "no ringsock peer",
        TcpReason::Family => "address family",
        TcpReason::NoResources => "no memory or descriptors for a ring",
        TcpReason::ShortLived => "short-lived connections to this address",
    }
}

/// Sends one report and waits for the daemon's reply (the thread).
fn send_report(r: Report) {
    let Some((msg, memfd)) = prepare(r) else {
        return;
    };
    let fds: Vec<RawFd> = memfd.iter().map(|f| f.as_raw_fd()).collect();
    let sent = ctl::call(&msg, &fds).is_ok();
    let session = if sent {
        ctl::current_session().unwrap_or(0)
    } else {
        0
    };
    remember(msg, session);
}

/// What `r` tells the daemon, with the ring's memfd for an open one;
/// None when there is nothing to tell.
fn prepare(r: Report) -> Option<(Msg, Option<OwnedFd>)> {
    Some(match r {
        Report::RingClosed(conn) => {
            let st = conn.report_state();
            if !st.reported.load(Ordering::Acquire)
                || st.reporter_pid.load(Ordering::Acquire) != process::pid()
            {
                return None;
            }
            (
                Msg::ConnClosed {
                    fd: st.fd.load(Ordering::Relaxed),
                    local: st.local_or(conn.local()),
                    peer: conn.peer(),
                },
                None,
            )
        }
        Report::Ring(conn, fd, memfd) => {
            let st = conn.report_state();
            if conn.is_released() {
                // Closed since it was taken: a close queued meanwhile is
                // not sent either.
                st.reported.store(false, Ordering::Release);
                return None;
            }
            // A client offered from a wildcard address; by now the kernel
            // has picked the real one.
            let local = match sockaddr::query(fd, false) {
                Some(a)
                    if conn.local().ip().is_unspecified() && a.port() == conn.local().port() =>
                {
                    a
                }
                _ => conn.local(),
            };
            *st.local.lock().unwrap_or_else(|p| p.into_inner()) = Some(local);
            (
                Msg::ConnReport {
                    fd,
                    local,
                    peer: conn.peer(),
                    transport: conn.transport(),
                    reason: conn.ring_detail(),
                    ring: Some(conn.offer_id()),
                },
                memfd,
            )
        }
        Report::Fallback(conn) => {
            let st = conn.report_state();
            if !st.reported.load(Ordering::Acquire) {
                return None;
            }
            (
                Msg::ConnReport {
                    fd: st.fd.load(Ordering::Relaxed),
                    local: st.local_or(conn.local()),
                    peer: conn.peer(),
                    transport: Transport::Tcp,
                    reason: "server declined the ring".into(),
                    ring: None,
                },
                None,
            )
        }
        Report::Tcp {
            fd,
            local,
            peer,
            reason,
        } => {
            let local = local.or_else(|| tcp_local(fd, peer))?;
            (
                Msg::ConnReport {
                    fd,
                    local,
                    peer,
                    transport: Transport::Tcp,
                    reason: reason_text(reason).into(),
                    ring: None,
                },
                None,
            )
        }
        Report::Closed(_, None, _) => return None,
        Report::Closed(fd, Some(local), peer) => (Msg::ConnClosed { fd, local, peer }, None),
    })
}

/// Keeps what the daemon was told of each live connection (`LIVE`), with
/// the session that heard it (0: none did). Never called with the
/// session's lock held (see `send_overdue`).
fn remember(msg: Msg, session: u64) {
    let mut live = LIVE.lock();
    match msg {
        Msg::ConnReport { fd, .. } => {
            live.insert(fd, (session, msg));
        }
        Msg::ConnClosed { fd, peer, .. } => {
            if matches!(live.get(&fd), Some((_, Msg::ConnReport { peer: p, .. })) if *p == peer) {
                live.remove(&fd);
            }
        }
        _ => {}
    }
}

/// Tells a daemon that has not heard them (a restarted one, or one that
/// was absent when they were made) the reports of live connections.
fn resend_reports() {
    let Some(session) = ctl::open_session() else {
        return;
    };
    // Held throughout, as every sender holds it: a close sent between the
    // look at LIVE and the resend of its open would let the open reach
    // the daemon last, and status would list the closed end for good.
    let _sending = SENDING.lock();
    let stale: Vec<(RawFd, Msg)> = LIVE
        .lock()
        .iter()
        .filter(|(_, (s, _))| *s != session)
        .map(|(fd, (_, m))| (*fd, m.clone()))
        .collect();
    for (fd, msg) in stale {
        if ctl::call(&msg, &[]).is_err() {
            return;
        }
        if let Some(e) = LIVE.lock().get_mut(&fd) {
            e.0 = session;
        }
    }
}

/// Live connections the current daemon session has not heard of (all of
/// them while there is no session: the daemon is gone or was never seen).
fn reports_stale() -> bool {
    let live = LIVE.lock();
    match ctl::current_session() {
        None => !live.is_empty(),
        Some(n) => live.values().any(|(s, _)| *s != n),
    }
}

fn follow_pending(now: u64) {
    let list: Vec<Weak<dyn Tracked>> = std::mem::take(&mut *PENDING.lock());
    let mut keep = Vec::new();
    for w in list {
        let Some(c) = w.upgrade() else { continue };
        if !c.still_pending() || c.is_released() {
            continue;
        }
        let urgent = c.urgent_follow_up();
        let age = now.saturating_sub(c.report_state().born_ns());
        if age < COLLECT_AFTER_NS && !urgent {
            keep.push(w);
            continue;
        }
        if age >= u64::from(crate::config::get().claim_wait_ms) * 1_000_000
            && c.report_state().offer_pid == process::pid()
        {
            // Nobody took the ring in time (an unshimmed process accepted,
            // or one that is slow or stopped). Where the wire decides by
            // itself, it withdraws, and the daemon only forgets the offer.
            if c.revoke() {
                let _ = ctl::call(
                    &Msg::Cancel {
                        offer_id: c.offer_id(),
                    },
                    &[],
                );
                continue;
            }
            // Otherwise withdraw the offer: the daemon refuses while the
            // offer is claimed or answered, so a server that took the ring
            // is never contradicted.
            match ctl::call(
                &Msg::Cancel {
                    offer_id: c.offer_id(),
                },
                &[],
            ) {
                Ok((Msg::Ok, _)) | Err(_) => {
                    c.decline_from_ctl(None);
                    continue;
                }
                // Claimed (or answered) meanwhile: the server took it, so
                // its decision is on the way; ask for it below.
                Ok(_) => {}
            }
        }
        match ctl::call(
            &Msg::Collect {
                offer_id: c.offer_id(),
            },
            &[],
        )
        .ok()
        {
            Some((Msg::Answered { payload }, _)) => {
                if c.answered(&payload) {
                    // A leave header may have come before the answer.
                    c.check_socket();
                } else {
                    keep.push(w);
                }
            }
            Some((Msg::Pending, _)) => keep.push(w),
            Some((Msg::Declined { reason }, _)) if c.report_state().offer_pid == process::pid() => {
                c.decline_from_ctl(Some(&reason))
            }
            Some((Msg::Declined { .. }, _))
            | Some((Msg::Expired, _))
            | Some((Msg::Error { .. }, _)) => {
                if c.report_state().offer_pid == process::pid() {
                    c.decline_from_ctl(None);
                } else {
                    keep.push(w);
                }
            }
            // The session is gone (daemon restart): the offer died with it.
            None => c.decline_from_ctl(None),
            Some(_) => keep.push(w),
        }
    }
    let mut pending = PENDING.lock();
    pending.extend(keep);
    let urgent = pending
        .iter()
        .filter(|w| w.upgrade().is_some_and(|c| c.urgent_follow_up()))
        .count();
    URGENT.store(urgent, Ordering::Release);
}

fn collect_accepted() {
    let ids = std::mem::take(&mut *COLLECT.lock());
    for offer_id in ids {
        let _ = ctl::call(&Msg::Collect { offer_id }, &[]);
    }
}

fn run() {
    let _g = guard::enter();
    // `stop` clears THREAD_PID and wakes us: we then return at once.
    let me = process::pid();
    let mut next_collect = 0u64;
    let mut idle = IDLE_TICKS;
    loop {
        if THREAD_PID.load(Ordering::Acquire) != me {
            return;
        }
        let seen = PARK.ticket();
        if DIRTY.load(Ordering::Acquire) > 0 {
            flush_some();
            idle = 0;
        }
        let mut now = sys::monotonic_ns();
        let mut report_wait = None;
        loop {
            let _sending = SENDING.lock();
            let next = take_due(&mut REPORTS.lock(), now, REPORT_DELAY_NS);
            match next {
                Next::Send(r) => send_report(r),
                Next::Wait(ns) => {
                    report_wait = Some(ns);
                    break;
                }
                Next::Empty => break,
            }
            now = sys::monotonic_ns();
        }
        if now >= next_collect {
            if reports_stale() {
                resend_reports();
            }
            collect_accepted();
            if !PENDING.lock().is_empty() {
                follow_pending(now);
            }
            next_collect = now + COLLECT_EVERY_NS;
        } else if URGENT.load(Ordering::Acquire) > 0 {
            follow_pending(now);
        }
        let follow_up = !PENDING.lock().is_empty() || !COLLECT.lock().is_empty();
        if URGENT.load(Ordering::Acquire) > 0 {
            park(seen, Some(FLUSH_NS), false);
        } else if idle < IDLE_TICKS {
            // Ticking: batches written meanwhile are flushed at the next
            // tick without anyone waking us.
            idle += 1;
            park(seen, Some(FLUSH_NS), false);
        } else if let Some(wait) = report_wait {
            park(seen, Some(wait.max(FLUSH_NS)), false);
        } else {
            // Without a daemon session, a process with listeners looks for
            // a (restarted) daemon every second to register them again.
            let stale = reports_stale();
            // Pending handshakes are followed up at their own, shorter
            // period whatever else is waited for.
            let timeout = if follow_up {
                Some(COLLECT_AFTER_NS)
            } else if ctl::wants_session(stale) || stale {
                Some(DAEMON_RETRY_NS)
            } else {
                None
            };
            park(seen, timeout, true);
            if ctl::wants_session(stale) {
                ctl::tend(stale);
            }
        }
    }
}

#[cfg(test)]
mod tests;
