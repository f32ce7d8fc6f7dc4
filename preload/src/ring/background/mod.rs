//! The shim's one background thread per process, and the lists it serves.
//!
//! * Flush timer (here): a `send` may leave bytes in an open batch (RB2
//!   adaptive batching). They are pushed out before this process can block
//!   (every recv/poll/epoll_wait/select flushes, `flush_all`), and, for a
//!   program that computes for a while after sending, by this thread within
//!   `FLUSH_NS`: no byte waits for a batch to fill.
//! * Handshake follow-up (`follow`): pending clients and accepted offers
//!   the daemon must settle or forget.
//! * Status reports (`reports`): what the daemon shows in `ringsock-ctl
//!   status`, sent from here, off the connect/accept path.
//! * Socket watch and wire check (`watch`): a peer's leave, close or
//!   death on the kernel socket, answered at once; a failed RDMA queue
//!   pair, looked for every `WIRE_CHECK_NS`.
//!
//! The thread sleeps on an eventfd when it has nothing to do, so an idle
//! program costs nothing (one look a second while it holds RDMA
//! connections); it is started lazily, and again in a forked child
//! (threads do not survive fork).

use std::os::fd::RawFd;
use std::os::unix::thread::JoinHandleExt;
use std::sync::atomic::{AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use ringsock_ring::sleep::park::WorkerPark;

use super::ctl;
use super::tracked::Tracked;
use crate::interpose::guard;
use crate::plock::PLock;
use crate::{process, sys};

mod follow;
mod reports;

pub use follow::{note_accepted, note_pending};
pub use reports::{
    note_closed, note_fallback, note_renumbered, note_ring, note_taken_over, note_tcp,
    note_tcp_closed,
};

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
/// How often the thread looks for a failed RDMA wire (`watch::check_wires`)
/// while the process has one: a queue pair gives up after about 2 s, so a
/// failure is noticed within half as long again.
const WIRE_CHECK_NS: u64 = 1_000_000_000;

/// Connections with bytes or completions owed, with when they were queued.
static FLUSH: PLock<Vec<(u64, Arc<dyn Tracked>)>> = PLock::new(Vec::new(), Vec::new);
static DIRTY: AtomicUsize = AtomicUsize::new(0);

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
        ctl::tend(reports::stale());
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
    reports::send_queued();
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
    reports::send_overdue();
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

fn run() {
    let _g = guard::enter();
    // `stop` clears THREAD_PID and wakes us: we then return at once.
    let me = process::pid();
    let mut next_collect = 0u64;
    let mut next_wire_check = 0u64;
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
        let report_wait = reports::send_due();
        let now = sys::monotonic_ns();
        if now >= next_collect {
            if reports::stale() {
                reports::resend();
            }
            follow::collect_accepted();
            if follow::has_pending() {
                follow::follow_pending(now);
            }
            next_collect = now + COLLECT_EVERY_NS;
        } else if follow::urgent() {
            follow::follow_pending(now);
        }
        let wires = super::watch::has_wires();
        if wires && now >= next_wire_check {
            super::watch::check_wires();
            next_wire_check = now + WIRE_CHECK_NS;
        }
        let follow_up = follow::has_work();
        if follow::urgent() {
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
            let stale = reports::stale();
            // Pending handshakes are followed up at their own, shorter
            // period whatever else is waited for.
            let timeout = if follow_up {
                Some(COLLECT_AFTER_NS)
            } else if ctl::wants_session(stale) || stale {
                Some(DAEMON_RETRY_NS)
            } else {
                None
            };
            let timeout = if wires {
                let due = next_wire_check.saturating_sub(now).max(FLUSH_NS);
                Some(timeout.map_or(due, |t| t.min(due)))
            } else {
                timeout
            };
            park(seen, timeout, true);
            if ctl::wants_session(stale) {
                ctl::tend(stale);
            }
        }
    }
}
