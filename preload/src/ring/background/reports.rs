//! Status reports: connections are reported to the daemon for
//! `ringsock-ctl status` from the background thread, off the
//! connect/accept path, in the order they were queued; a connection opened
//! and closed within `REPORT_DELAY_NS` (a plain-TCP one: within
//! `TCP_REPORT_DELAY_NS`) never costs the daemon anything.

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ringsock_proto::{Msg, Transport};

use super::{ensure_thread, wake};
use crate::attached::TcpReason;
use crate::interpose::guard;
use crate::plock::PLock;
use crate::ring::ctl;
use crate::ring::tracked::Tracked;
use crate::{process, sockaddr, sys};

/// Reports wait this long before they are sent: a connection opened and
/// closed within it never costs the daemon anything (short-lived
/// connections are the common case of a busy server, and status only
/// lists live ones).
const REPORT_DELAY_NS: u64 = 5_000_000;
/// A plain-TCP connection's open waits as long as the policy's short
/// connections live (`RINGSOCK_SHORT_MS`'s default): the many that carry a
/// request or two and wait on a database or a busy CPU would otherwise
/// each cost two round trips to the daemon (open and close), as much as
/// the rest of the shim costs them.
const TCP_REPORT_DELAY_NS: u64 = 50_000_000;
/// A report still queued this many times its delay is sent by the program
/// itself, ahead (no wait for the reply), the next time it is about to
/// block (`flush_all`): the thread may not have run yet (it starts with
/// the first report of a process, and a CPU-bound machine can keep a new
/// thread waiting for most of a second) or may have failed to start, and
/// a connection the program uses must not stay out of status meanwhile.
const OVERDUE_DELAYS: u64 = 4;

enum Report {
    Ring(Arc<dyn Tracked>, RawFd, Option<OwnedFd>),
    RingClosed(Arc<dyn Tracked>),
    /// The connection was reported under a number the program closed
    /// while another still holds it: told again under the new one
    /// (`ReportState::fd`), which moves its row (the daemon matches the
    /// addresses and the ring).
    Renumbered(Arc<dyn Tracked>),
    Fallback(Arc<dyn Tracked>),
    /// `local` is learnt when the report is sent (`tcp_local`): most
    /// plain connections close before that and never ask for it.
    Tcp {
        fd: RawFd,
        local: Option<SocketAddr>,
        peer: SocketAddr,
        reason: TcpReason,
        /// Its place in TCP_OPENS (`TCP_TICKETS`).
        ticket: u64,
    },
    /// Without a local address the daemon never heard of the connection.
    Closed(RawFd, Option<SocketAddr>, SocketAddr),
    /// A plain-TCP open whose connection closed while it was queued: it
    /// keeps its ticket's place, so that the tickets of TCP_OPENS stay
    /// consecutive, and is never sent. Never at the front of the queue
    /// (`drop_closed`).
    Cancelled(u64),
}

/// The addresses of each plain-TCP socket whose open report was taken to
/// be sent, by fd (entered under TCP_OPENS' lock, by `mark_taken`): once
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
/// Reports waiting to be sent, with the time each was queued; each is
/// sent once it waited `delay_ns`.
struct Queue {
    items: PLock<VecDeque<(u64, Report)>>,
    /// When the report at the front was queued, 0 while there is none:
    /// `flush_all` sees with one load per queue whether one is overdue.
    oldest: AtomicU64,
    delay_ns: u64,
}

impl Queue {
    const fn new(delay_ns: u64) -> Queue {
        Queue {
            items: PLock::new(VecDeque::new(), VecDeque::new),
            oldest: AtomicU64::new(0),
            delay_ns,
        }
    }

    /// Publishes when the front of `q` (this queue's items, held) was
    /// queued.
    fn set_oldest(&self, q: &VecDeque<(u64, Report)>) {
        self.oldest
            .store(q.front().map_or(0, |(t, _)| *t), Ordering::Release);
    }
}

/// Every report but plain-TCP opens: opens, fallbacks and closes of rings,
/// and the closes of plain-TCP connections whose open was sent.
static REPORTS: Queue = Queue::new(REPORT_DELAY_NS);
/// Plain-TCP opens (`Report::Tcp`). A connection's close is queued (in
/// REPORTS) only once its open was taken from here to be sent, so the
/// daemon hears the two in order.
static TCP_OPENS: Queue = Queue::new(TCP_REPORT_DELAY_NS);
/// The next plain-TCP open's ticket, taken under TCP_OPENS' lock: the
/// tickets in that queue are consecutive from its front's, so a close
/// finds its connection's open by subtraction (`tcp_queued_at`).
static TCP_TICKETS: AtomicU64 = AtomicU64::new(1);
/// What became of the queued plain-TCP opens, without a lock: cell
/// `ticket % OPEN_CELLS` holds `ticket << 2 | state` (`OPEN_QUEUED`,
/// `OPEN_CLOSED`, `OPEN_TAKEN`) for the open that claimed it (`note_tcp`).
/// A close turns its open's QUEUED into CLOSED with one compare-exchange
/// (`note_tcp_closed`), and whoever takes the open off the queue turns it
/// into TAKEN or, finding CLOSED, drops it unsent (`mark_taken`): one of
/// the two wins. The next open queued drops the closed ones at the front
/// (`drop_closed`), under the lock it holds anyway. An open claims its
/// cell only once the open that held it has left the queue; one that
/// finds it held (more than `OPEN_CELLS` opens queued) goes without, and
/// its close looks in the queue under the lock instead.
const OPEN_CELLS: usize = 4096;
static OPEN_STATE: [AtomicU64; OPEN_CELLS] = [const { AtomicU64::new(0) }; OPEN_CELLS];
const OPEN_QUEUED: u64 = 0;
const OPEN_CLOSED: u64 = 1;
const OPEN_TAKEN: u64 = 2;

fn open_cell(ticket: u64) -> &'static AtomicU64 {
    &OPEN_STATE[(ticket % OPEN_CELLS as u64) as usize]
}

/// The open with `ticket` is queued behind the open with ticket `front`
/// (None: the queue was empty), TCP_OPENS held: it claims its cell if the
/// open that held it has left the queue.
fn claim_open_cell(ticket: u64, front: Option<u64>) {
    let cell = open_cell(ticket);
    let held = cell.load(Ordering::Acquire);
    let gone = held == 0 || held & 3 == OPEN_TAKEN || front.is_none_or(|f| held >> 2 < f);
    if gone {
        cell.store(ticket << 2 | OPEN_QUEUED, Ordering::Release);
    }
}

/// The connection of the queued open with `ticket` closed: true if its
/// cell now says so (the open is then never sent), false if the open was
/// taken to be sent or has no cell.
fn close_queued_open(ticket: u64) -> bool {
    open_cell(ticket)
        .compare_exchange(
            ticket << 2 | OPEN_QUEUED,
            ticket << 2 | OPEN_CLOSED,
            Ordering::AcqRel,
            Ordering::Relaxed,
        )
        .is_ok()
}

/// The queued open with `ticket` is taken to be sent: false if its
/// connection closed meanwhile (`close_queued_open`). An open without a
/// cell of its own is sent (its close, if any, cancelled it in the queue).
fn take_queued_open(ticket: u64) -> bool {
    match open_cell(ticket).compare_exchange(
        ticket << 2 | OPEN_QUEUED,
        ticket << 2 | OPEN_TAKEN,
        Ordering::AcqRel,
        Ordering::Acquire,
    ) {
        Ok(_) => true,
        Err(held) => held != ticket << 2 | OPEN_CLOSED,
    }
}
/// Held from taking a report off a queue until it is sent, by the thread
/// or by the program (`send_overdue`): reports reach the daemon in the
/// order they were queued (an open before its close).
static SENDING: PLock<()> = PLock::new((), || ());

impl Report {
    /// Whether this is an open (or a fallback's re-report) of `conn`.
    fn opens(&self, conn: &Arc<dyn Tracked>) -> bool {
        matches!(self, Report::Ring(o, _, _) | Report::Fallback(o) if Arc::ptr_eq(o, conn))
    }
}

/// Queues `r` in REPORTS (plain-TCP opens go to TCP_OPENS, `note_tcp`).
fn report(r: Report) {
    queue_with(|q, _, now| {
        q.push_back((now, r));
        set_oldest(q);
        true
    });
}

/// Runs `f` on REPORTS (with this process's pid and the time) and wakes
/// the thread if `f` says it queued something to send.
fn queue_with(f: impl FnOnce(&mut VecDeque<(u64, Report)>, i32, u64) -> bool) {
    queue_in(&REPORTS, f)
}

fn queue_in(queue: &Queue, f: impl FnOnce(&mut VecDeque<(u64, Report)>, i32, u64) -> bool) {
    let queued = f(&mut queue.items.lock(), process::pid(), sys::monotonic_ns());
    if queued {
        ensure_thread();
        wake();
    }
}

/// Publishes when the front of `q` (REPORTS' items, held) was queued.
fn set_oldest(q: &VecDeque<(u64, Report)>) {
    REPORTS.set_oldest(q);
}

/// A report taken off its queue to be sent: an open one counts as this
/// process's from now on (with its queue held, so `note_closed` and
/// `note_tcp_closed`, which look under that lock, either still find it
/// queued or send the close after it). False for a plain-TCP open whose
/// connection closed while it was queued: it is dropped unsent.
fn mark_taken(r: &Report) -> bool {
    match r {
        Report::Ring(conn, _, _) if !conn.is_released() => {
            let st = conn.report_state();
            st.reported.store(true, Ordering::Release);
            st.reporter_pid.store(process::pid(), Ordering::Release);
        }
        Report::Tcp {
            fd,
            local,
            peer,
            ticket,
            ..
        } => {
            if !take_queued_open(*ticket) {
                return false;
            }
            TCP_ADDRS.lock().insert(*fd, (*local, *peer));
        }
        _ => {}
    }
    true
}

/// What the front of the queue asks for, reports queued at least `delay`
/// ago being due.
enum Next {
    Send(Report),
    /// The front is due in this many ns.
    Wait(u64),
    Empty,
}

/// Takes the front report off `q` (`queue`'s items, held) if it is due
/// (see `Next`); plain-TCP opens whose connections closed meanwhile are
/// dropped on the way.
fn take_due(queue: &Queue, q: &mut VecDeque<(u64, Report)>, now: u64, delay: u64) -> Next {
    loop {
        let Some((t, _)) = q.front() else {
            return Next::Empty;
        };
        let waited = now.saturating_sub(*t);
        if waited < delay {
            return Next::Wait(delay - waited);
        }
        let Some((_, r)) = q.pop_front() else {
            return Next::Empty;
        };
        drop_closed(q);
        let send = mark_taken(&r);
        queue.set_oldest(q);
        // Otherwise an open whose connection closed meanwhile: the next.
        if send {
            return Next::Send(r);
        }
    }
}

/// The program is about to block: reports the thread left queued past
/// `OVERDUE_DELAYS` times their delay go to the daemon now, sent ahead on
/// this process's session. Nothing is waited for: a session or queue in
/// use (by the thread, or by this very thread in a signal handler) leaves
/// them to the thread. Two atomic loads when none is overdue.
pub(super) fn send_overdue() {
    let now = sys::monotonic_ns();
    let overdue = |queue: &Queue| {
        let oldest = queue.oldest.load(Ordering::Acquire);
        oldest != 0 && now.saturating_sub(oldest) >= OVERDUE_DELAYS * queue.delay_ns
    };
    if !overdue(&REPORTS) && !overdue(&TCP_OPENS) {
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
    // Remembered once the session is let go: `stale` takes the
    // session's lock while it holds LIVE's.
    let mut told = Vec::new();
    'queues: for queue in [&REPORTS, &TCP_OPENS] {
        loop {
            let next = match queue.items.try_lock() {
                Some(mut q) => take_due(
                    queue,
                    &mut q,
                    sys::monotonic_ns(),
                    OVERDUE_DELAYS * queue.delay_ns,
                ),
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
                break 'queues;
            }
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
    crate::ring::watch::watch(&conn, conn.socket_fd());
    report(Report::Ring(conn, fd, memfd));
}

/// A forked child took over a ring its parent reported: status lists it
/// under the child (without the ring's memfd, which went to the daemon
/// with the parent's report: the row shows no counters).
pub fn note_taken_over(conn: Arc<dyn Tracked>) {
    queue_with(|q, me, now| taken_over_in(q, conn, me, now));
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

/// Fd `old` of `conn` was closed while another fd of this process still
/// holds it (`other` finds one): if the connection is reported under
/// `old`, its report moves to that fd, or the program's next socket on
/// `old` would take the row of a connection that is still open.
pub fn note_renumbered(conn: Arc<dyn Tracked>, old: RawFd, other: &dyn Fn() -> Option<RawFd>) {
    let st = conn.report_state();
    if st.fd.load(Ordering::Relaxed) != old {
        return;
    }
    let Some(new) = other().filter(|&n| n != old) else {
        return;
    };
    if st
        .fd
        .compare_exchange(old, new, Ordering::Relaxed, Ordering::Relaxed)
        .is_err()
    {
        return;
    }
    queue_with(|q, me, now| renumbered_in(q, conn, old, new, me, now));
}

/// Points the open of `conn` still queued in `q` at fd `new`, and queues
/// a report under `new` if process `me` sent its open under `old` (under
/// the same lock as `mark_taken`). Returns whether a report was queued.
fn renumbered_in(
    q: &mut VecDeque<(u64, Report)>,
    conn: Arc<dyn Tracked>,
    old: RawFd,
    new: RawFd,
    me: i32,
    now: u64,
) -> bool {
    for (_, r) in q.iter_mut() {
        if let Report::Ring(c, fd, _) = r {
            if Arc::ptr_eq(c, &conn) {
                *fd = new;
            }
        }
    }
    let st = conn.report_state();
    let sent = st.reporter_pid.load(Ordering::Acquire) == me;
    if sent {
        if conn.transport() == Transport::Tcp {
            // A row without a ring never moves (the daemon's `report`):
            // the old number's goes first.
            let old = Report::Closed(old, Some(st.local_or(conn.local())), conn.peer());
            q.push_back((now, old));
        }
        q.push_back((now, Report::Renumbered(conn)));
        set_oldest(q);
    }
    sent
}

/// A pending client fell back to TCP.
pub fn note_fallback(conn: Arc<dyn Tracked>) {
    report(Report::Fallback(conn));
}

/// The connection's last fd in this process is gone.
pub fn note_closed(conn: Arc<dyn Tracked>) {
    queue_with(|q, me, now| closed_in(q, conn, me, now));
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
/// Returns the report's ticket, for its close (`note_tcp_closed`), and
/// when it was queued; None when no report was queued (no peer).
pub fn note_tcp(
    fd: RawFd,
    local: Option<SocketAddr>,
    peer: Option<SocketAddr>,
    reason: TcpReason,
) -> Option<(u64, u64)> {
    let peer = peer.or_else(|| sockaddr::query(fd, true))?;
    let mut noted = (0, 0);
    queue_in(&TCP_OPENS, |q, _, now| {
        drop_closed(q);
        let ticket = TCP_TICKETS.fetch_add(1, Ordering::Relaxed);
        claim_open_cell(ticket, q.front().and_then(|(_, r)| tcp_ticket(r)));
        q.push_back((
            now,
            Report::Tcp {
                fd,
                local,
                peer,
                reason,
                ticket,
            },
        ));
        TCP_OPENS.set_oldest(q);
        noted = (ticket, now);
        true
    });
    Some(noted)
}

/// The ticket of a plain-TCP open or of its cancelled place.
fn tcp_ticket(r: &Report) -> Option<u64> {
    match r {
        Report::Tcp { ticket, .. } | Report::Cancelled(ticket) => Some(*ticket),
        _ => None,
    }
}

/// Where in TCP_OPENS (`q`, held) the open with `ticket` waits, if it
/// does: tickets there are consecutive from the front's.
fn tcp_queued_at(q: &VecDeque<(u64, Report)>, ticket: u64) -> Option<usize> {
    let first = tcp_ticket(&q.front()?.1)?;
    let i = usize::try_from(ticket.checked_sub(first)?).ok()?;
    matches!(q.get(i), Some((_, Report::Tcp { ticket: t, .. })) if *t == ticket).then_some(i)
}

/// Drops the opens at the front of TCP_OPENS (`q`, held) whose
/// connections closed (cancelled in the queue, or through their cells):
/// its front is then a report to send, whose time `oldest` tells.
fn drop_closed(q: &mut VecDeque<(u64, Report)>) {
    while let Some((_, r)) = q.front() {
        let closed = match r {
            Report::Cancelled(_) => true,
            Report::Tcp { ticket, .. } => {
                open_cell(*ticket).load(Ordering::Acquire) == ticket << 2 | OPEN_CLOSED
            }
            _ => false,
        };
        if !closed {
            return;
        }
        q.pop_front();
    }
}

/// Cancels the open of plain-TCP socket `fd` (`ticket`, 0 for none) in
/// TCP_OPENS' items `q` (held) if it is still queued; returns whether it
/// was.
fn cancel_open(q: &mut VecDeque<(u64, Report)>, fd: RawFd, ticket: u64) -> bool {
    let queued = if ticket != 0 {
        tcp_queued_at(q, ticket)
    } else {
        // No ticket: its open is the last queued report for `fd` if any;
        // search from the back, where a short connection's is.
        q.iter()
            .rposition(|(_, r)| matches!(r, Report::Tcp { fd: f, .. } if *f == fd))
    };
    let Some(i) = queued else {
        return false;
    };
    if let Some(t) = tcp_ticket(&q[i].1) {
        q[i].1 = Report::Cancelled(t);
    }
    drop_closed(q);
    true
}

/// A tracked plain-TCP socket's last fd is being closed: its open report
/// (`ticket`, from `note_tcp`; 0 for none) is cancelled if still queued
/// (most short connections), or its close is queued after it.
pub fn note_tcp_closed(fd: RawFd, ticket: u64) {
    if ticket != 0 && close_queued_open(ticket) {
        // Still queued: whoever takes it drops it unsent, and the daemon
        // never hears of the connection.
        return;
    }
    let mut q = TCP_OPENS.items.lock();
    if cancel_open(&mut q, fd, ticket) {
        TCP_OPENS.set_oldest(&q);
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
        Report::Renumbered(conn) => {
            let st = conn.report_state();
            // Sent even if the connection closed since: its close, queued
            // after this, names the new number.
            if !st.reported.load(Ordering::Acquire)
                || st.reporter_pid.load(Ordering::Acquire) != process::pid()
            {
                return None;
            }
            // As the row it moves says: the ring's, or TCP after a
            // fallback (`Report::Fallback`).
            let ring = conn.transport() != Transport::Tcp;
            (
                Msg::ConnReport {
                    fd: st.fd.load(Ordering::Relaxed),
                    local: st.local_or(conn.local()),
                    peer: conn.peer(),
                    transport: conn.transport(),
                    reason: if ring {
                        conn.ring_detail()
                    } else {
                        "server declined the ring".into()
                    },
                    ring: ring.then(|| conn.offer_id()),
                },
                None,
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
            ..
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
        Report::Closed(_, None, _) | Report::Cancelled(_) => return None,
        Report::Closed(fd, Some(local), peer) => (Msg::ConnClosed { fd, local, peer }, None),
    })
}

/// Keeps what the daemon was told of each live connection (`LIVE`), with
/// the session that heard it (0: none did). Never called with the
/// session's lock held (see `send_overdue`).
fn remember(msg: Msg, session: u64) {
    let mut live = LIVE.lock();
    match msg {
        Msg::ConnReport {
            fd,
            local,
            peer,
            ring,
            ..
        } => {
            // The same connection under another number (`Renumbered`):
            // the daemon moved its row, and a resend must not bring the
            // old number back.
            live.retain(|f, (_, m)| {
                *f == fd
                    || !matches!(m, Msg::ConnReport { local: l, peer: p, ring: r, .. }
                        if *l == local && *p == peer && *r == ring)
            });
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
pub(super) fn resend() {
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
pub(super) fn stale() -> bool {
    let live = LIVE.lock();
    match ctl::current_session() {
        None => !live.is_empty(),
        Some(n) => live.values().any(|(s, _)| *s != n),
    }
}

/// Sends the reports that are due (the thread); returns in how many ns
/// the next one is due, if one is queued.
pub(super) fn send_due() -> Option<u64> {
    let mut wait: Option<u64> = None;
    for queue in [&REPORTS, &TCP_OPENS] {
        loop {
            let _sending = SENDING.lock();
            let next = take_due(
                queue,
                &mut queue.items.lock(),
                sys::monotonic_ns(),
                queue.delay_ns,
            );
            match next {
                Next::Send(r) => send_report(r),
                Next::Wait(ns) => {
                    wait = Some(wait.map_or(ns, |w| w.min(ns)));
                    break;
                }
                Next::Empty => break,
            }
        }
    }
    wait
}

/// Sends every queued report now, due or not (before a sandbox).
pub(super) fn send_queued() {
    let _sending = SENDING.lock();
    for queue in [&REPORTS, &TCP_OPENS] {
        let queued = {
            let mut q = queue.items.lock();
            let mut all = std::mem::take(&mut *q);
            all.retain(|(_, r)| mark_taken(r));
            queue.set_oldest(&q);
            all
        };
        for (_, r) in queued {
            send_report(r);
        }
    }
}

#[cfg(test)]
mod tests;
