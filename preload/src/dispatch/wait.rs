//! Waiting for a ring connection: spin for a bounded, adaptive time, then
//! sleep (docs/design.md, "Readiness and sleeping").
//!
//! The lost-wakeup argument lives in the transport: `arm` publishes the
//! "sleeping" flag and re-checks *after* it is visible, and a sender that
//! publishes data checks the flag after its tail write is visible. Here we
//! only keep the order: flush our own batches, spin, arm, re-check the value
//! `arm` returned, sleep in ppoll on the connection's wait fds, disarm.
//!
//! The spin budget adapts per thread (`ringsock_ring::SpinBudget`): a spin
//! that found the connection ready doubles it (up to RINGSOCK_SPIN_US), a
//! spin that ended in sleep halves it, to zero past an eighth of the
//! maximum, and a spin that lost its CPU zeroes it, so a busy ping-pong
//! keeps spinning while an idle program, or any program on an
//! oversubscribed machine, sleeps at once as over kernel TCP. A zero budget
//! probes with a full spin every few waits. At most half as many threads
//! of one process as it has CPUs spin at a time (`SpinSlot`); the others
//! look once and sleep, so that a process's waiting threads never take
//! the CPUs the threads they wait for need.

use std::cell::Cell;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use ringsock_ring::SpinBudget;

use crate::attached::{AttachedConn, Ready};
use crate::interpose::guard;
use crate::{config, real, sys};

thread_local! {
    /// This thread's spin budget; None until its first wait.
    static BUDGET: Cell<Option<SpinBudget>> = const { Cell::new(None) };
}

/// How a wait ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Woke {
    /// The connection's readiness intersects the interest (or has ERR/HUP).
    Ready,
    /// The deadline passed.
    TimedOut,
    /// A signal interrupted the sleep.
    Interrupted,
    /// The sleep itself failed with this errno.
    Failed(i32),
}

/// Longest single sleep of a blocking call on a ring (see `wait_conn`).
const RECHECK_NS: u64 = 1_000_000_000;

/// Converts a relative timeout in ns (0 = none) to an absolute deadline.
pub fn deadline_after(timeout_ns: u64) -> Option<u64> {
    (timeout_ns != 0).then(|| sys::monotonic_ns().saturating_add(timeout_ns))
}

/// Readiness that ends a wait for `interest`: errors and hangups always do.
pub fn wanted(interest: Ready) -> Ready {
    interest | Ready::ERR | Ready::HUP
}

/// Spins until `ready()` returns true or the per-thread budget is spent.
/// True if it became ready. A spin that lost its CPU (`Spun::Descheduled`)
/// zeroes the budget: the machine has more runnable work than CPUs, the
/// answer came only once the peer got a CPU back, and the kernel runs a
/// sleeper's peer sooner than a spinner's. `width`: the connections one
/// call of `ready` looks at (see `spin_for`).
pub fn spin(looks: u32, width: usize, mut ready: impl FnMut() -> bool) -> bool {
    let mut budget = BUDGET.with(|b| {
        b.get().unwrap_or_else(|| {
            waiter_born();
            SpinBudget::new(Duration::from_micros(config::get().spin_us.into()))
        })
    });
    let limit = budget.limit().as_nanos() as u64;
    let slot = (limit != 0).then(SpinSlot::take).flatten();
    let hit = if slot.is_none() {
        // A connection ready at the first look says nothing about spinning.
        ready()
    } else {
        match spin_for(limit, looks, width, &mut ready) {
            Spun::Hit => {
                budget.hit();
                true
            }
            Spun::Missed => {
                budget.miss();
                false
            }
            Spun::Descheduled(ready) => {
                budget.late();
                ready
            }
        }
    };
    drop(slot);
    BUDGET.with(|b| b.set(Some(budget)));
    hit
}

/// Whether this thread's next `spin` would spin: false while its budget
/// is zero and no probe is due, when `spin` only looks once. A waiter that
/// looks again anyway before it sleeps (an epoll set's arm re-checks) may
/// then skip `spin` and call `spin_skipped` instead.
pub fn spin_due() -> bool {
    BUDGET.with(|b| b.get().is_none_or(|b| b.due()))
}

/// A wait for which `spin_due` was false goes to sleep without `spin`:
/// counted as `spin` would count it, towards the next probe.
pub fn spin_skipped() {
    BUDGET.with(|b| {
        if let Some(mut budget) = b.get() {
            let _ = budget.limit();
            b.set(Some(budget));
        }
    });
}

/// This process's spinning threads: its pid in the high half, their count
/// in the low one. A count left by another pid is a parent's, copied by a
/// fork without the threads that spun: zero here.
static SPINNERS: AtomicU64 = AtomicU64::new(0);
/// This process's live threads that have waited on a ring, counted the
/// same way: while they are no more than `max_spinners`, a spin takes no
/// place in SPINNERS (no read-modify-write on a ping-pong's path).
static WAITERS: AtomicU64 = AtomicU64::new(0);
/// Most threads of this process that spin at once (0: not known yet).
static MAX_SPINNERS: AtomicU32 = AtomicU32::new(0);

/// A thread that has waited on a ring: counted in WAITERS until it ends.
struct Waiter {
    pid: u32,
}

impl Drop for Waiter {
    fn drop(&mut self) {
        leave_place(&WAITERS, self.pid);
    }
}

thread_local! {
    static WAITER: std::cell::RefCell<Option<Waiter>> = const { std::cell::RefCell::new(None) };
}

/// The calling thread waits on a ring for the first time.
fn waiter_born() {
    let pid = crate::process::pid() as u32;
    if take_place(&WAITERS, u32::MAX, pid) {
        // A thread already being torn down keeps no count (try_with fails).
        let kept = WAITER.try_with(|w| *w.borrow_mut() = Some(Waiter { pid }));
        if kept.is_err() {
            leave_place(&WAITERS, pid);
        }
    }
}

/// Half the CPUs this process may run on, at least one: more spinners
/// than that take the CPUs their peers need to answer them (threads of
/// one process yielding to each other while the thread they wait for, in
/// another process, waits for a CPU).
fn max_spinners() -> u32 {
    let known = MAX_SPINNERS.load(Ordering::Relaxed);
    if known != 0 {
        return known;
    }
    let n = (sys::cpus_allowed() / 2).max(1);
    MAX_SPINNERS.store(n, Ordering::Relaxed);
    n
}

/// This process's spinner count in `word`.
fn spinners_of(word: u64, pid: u32) -> u32 {
    if (word >> 32) as u32 == pid {
        word as u32
    } else {
        0
    }
}

fn spinners_word(pid: u32, n: u32) -> u64 {
    (u64::from(pid) << 32) | u64::from(n)
}

/// Takes a place among the spinners counted in `word` for `pid`, if
/// fewer than `cap` hold one.
fn take_place(word: &AtomicU64, cap: u32, pid: u32) -> bool {
    word.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |w| {
        let n = spinners_of(w, pid);
        (n < cap).then(|| spinners_word(pid, n + 1))
    })
    .is_ok()
}

fn leave_place(word: &AtomicU64, pid: u32) {
    let _ = word.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |w| {
        let n = spinners_of(w, pid);
        (n > 0).then(|| spinners_word(pid, n - 1))
    });
}

/// Leave to spin: a place among this process's spinners, or none needed
/// while its waiting threads are few enough to all spin.
enum SpinSlot {
    Free,
    Taken { pid: u32 },
}

impl SpinSlot {
    fn take() -> Option<SpinSlot> {
        let pid = crate::process::pid() as u32;
        let cap = max_spinners();
        if spinners_of(WAITERS.load(Ordering::Relaxed), pid) <= cap {
            return Some(SpinSlot::Free);
        }
        take_place(&SPINNERS, cap, pid).then_some(SpinSlot::Taken { pid })
    }
}

impl Drop for SpinSlot {
    fn drop(&mut self) {
        if let SpinSlot::Taken { pid } = *self {
            leave_place(&SPINNERS, pid);
        }
    }
}

/// The busy looks for a spin over several connections: the fewest any of
/// them asks for (`AttachedConn::spin_looks`), the library's default for
/// none.
pub fn fewest_looks<'a>(conns: impl Iterator<Item = &'a dyn AttachedConn>) -> u32 {
    conns
        .map(|c| c.spin_looks())
        .min()
        .unwrap_or(ringsock_ring::sleep::backoff::SPIN_TURNS)
}

/// How a spin ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Spun {
    /// Ready, and the spinner held its CPU throughout.
    Hit,
    /// The budget ran out.
    Missed,
    /// The spinner lost its CPU for longer than `DESCHEDULED_NS` (to a
    /// yield or a preemption) and stopped at once; whether it was ready
    /// at its last look.
    Descheduled(bool),
}

/// A gap between two looks of a spin longer than this means another task
/// ran on our CPU: a look, even a yield that finds nobody else runnable,
/// takes a few microseconds at most.
const DESCHEDULED_NS: u64 = 30_000;

/// Busy looks between two clock reads (a read costs about as much as a
/// look at a shared-memory ring).
const LOOKS_PER_CLOCK: u32 = 16;

/// Polls `ready` for up to `limit_ns`, yielding the CPU between polls
/// after the first `looks`. `looks` and `LOOKS_PER_CLOCK` count looks at
/// one connection: a poll over `width` of them counts as `width` looks, so
/// that a spin over many connections yields, and sees a lost CPU, after as
/// much busy time as a spin over one (else it spins its whole budget
/// without yielding, taking the CPU its peers need on a busy machine).
fn spin_for(limit_ns: u64, looks: u32, width: usize, ready: &mut impl FnMut() -> bool) -> Spun {
    let start = sys::monotonic_ns();
    let mut last = start;
    let mut i = 0u32;
    let (busy, per_clock) = pace(looks, width);
    // After `looks` busy looks the spin yields the CPU between looks: on
    // an oversubscribed machine the peer, or the kernel work that carries
    // the data (a software RDMA device's softirqs), may need this CPU to
    // make the very progress we wait for (`AttachedConn::spin_looks`).
    let mut relax = ringsock_ring::sleep::backoff::CompletionWait::with_spin_turns(busy);
    // Where yields carry the data (fewer looks than the default) a long
    // yield is progress, not a lost CPU, and the clock is read every 64
    // turns, most of them yields: where yields are slow (an emulated
    // machine) such a spin runs past its budget, and catches the replies
    // a spin held to it would sleep through. Elsewhere the clock is read
    // after every yield and every LOOKS_PER_CLOCK busy looks.
    let yields_carry = looks < ringsock_ring::sleep::backoff::SPIN_TURNS;
    loop {
        if ready() {
            return Spun::Hit;
        }
        i = i.wrapping_add(1);
        let read_clock = if yields_carry {
            i.is_multiple_of(64)
        } else {
            i > busy || i.is_multiple_of(per_clock)
        };
        if read_clock {
            let now = sys::monotonic_ns();
            if !yields_carry && now.saturating_sub(last) > DESCHEDULED_NS {
                return Spun::Descheduled(ready());
            }
            if now.saturating_sub(start) >= limit_ns {
                return Spun::Missed;
            }
            last = now;
        }
        relax.relax();
    }
}

/// For a spin whose polls look at `width` connections each: the busy polls
/// before it yields, and the polls between two clock reads (`spin_for`).
fn pace(looks: u32, width: usize) -> (u32, u32) {
    let width = u32::try_from(width.max(1)).unwrap_or(u32::MAX);
    ((looks / width).max(1), (LOOKS_PER_CLOCK / width).max(1))
}

/// Waits until `conn` (reached through kernel socket `fd`) is ready for
/// `interest`, the deadline (absolute, monotonic ns) passes, or a signal
/// arrives.
pub fn wait_conn(fd: i32, conn: &dyn AttachedConn, interest: Ready, deadline: Option<u64>) -> Woke {
    let want = wanted(interest);
    wait_conn_with(fd, conn, interest, deadline, || {
        conn.readiness_for(interest).intersects(want)
    })
}

/// `wait_conn` whose spin calls `look` (true: the wait is over) instead
/// of looking at readiness: a blocking read's look takes the bytes it
/// finds (`AttachedConn::recv_look`). The arm and the looks after a sleep
/// are readiness's, as in `wait_conn`.
pub fn wait_conn_with(
    fd: i32,
    conn: &dyn AttachedConn,
    interest: Ready,
    deadline: Option<u64>,
    look: impl FnMut() -> bool,
) -> Woke {
    let want = wanted(interest);
    conn.flush();
    if spin(conn.spin_looks(), 1, look) {
        return Woke::Ready;
    }
    sleep_until(
        fd,
        conn,
        interest,
        deadline,
        || conn.arm(interest).intersects(want),
        || conn.readiness_for(interest).intersects(want),
        false,
    )
}

/// Waits until `need` bytes are readable on `conn` (or its stream ended,
/// failed or hung up), the deadline passes, or a signal arrives: a peek
/// for more than is there (`AttachedConn::arm_needing`).
pub fn wait_conn_needing(
    fd: i32,
    conn: &dyn AttachedConn,
    need: usize,
    deadline: Option<u64>,
) -> Woke {
    let interest = Ready::READ | Ready::RDHUP;
    let want = wanted(interest);
    conn.flush();
    if spin(conn.spin_looks(), 1, || {
        conn.readiness_needing(need).intersects(want)
    }) {
        return Woke::Ready;
    }
    sleep_until(
        fd,
        conn,
        interest,
        deadline,
        || conn.arm_needing(need).intersects(want),
        || conn.readiness_needing(need).intersects(want),
        true,
    )
}

/// A wake that brought a reader no new byte and left it short of its need
/// is followed by a pause this long before it arms again.
const IDLE_WAKE_PAUSE_NS: u64 = 1_000_000;

/// Sleeps `IDLE_WAKE_PAUSE_NS`, or until the deadline: `Ready` after it,
/// `TimedOut` at the deadline, `Interrupted` by a signal.
pub fn pause(deadline: Option<u64>) -> Woke {
    let now = sys::monotonic_ns();
    if deadline.is_some_and(|d| now >= d) {
        return Woke::TimedOut;
    }
    let end = now.saturating_add(IDLE_WAKE_PAUSE_NS);
    match sleep(&mut [], Some(deadline.map_or(end, |d| d.min(end))), None) {
        Ok(_) => Woke::Ready,
        Err(libc::EINTR) => Woke::Interrupted,
        Err(e) => Woke::Failed(e),
    }
}

/// The sleeping part of a wait: `arm` (true: the wait is over, no sleep),
/// sleep on the connection's wait fds, disarm, `ready` (true: over), until
/// the deadline. `counts_bytes`: a reader waiting for a number of bytes,
/// whose wait fds may stay readable with fewer (the kernel socket under a
/// connection off its ring): a wake that brought no byte pauses, so that
/// such a wait never turns into a busy loop.
fn sleep_until(
    fd: i32,
    conn: &dyn AttachedConn,
    interest: Ready,
    deadline: Option<u64>,
    mut arm: impl FnMut() -> bool,
    mut ready: impl FnMut() -> bool,
    counts_bytes: bool,
) -> Woke {
    loop {
        let before = counts_bytes.then(|| conn.available());
        if arm() {
            conn.disarm_after(interest, &[]);
            return Woke::Ready;
        }
        let mut pfds = [libc::pollfd {
            fd: -1,
            events: 0,
            revents: 0,
        }; 3];
        let mut n = 0;
        for w in conn.wait_fds(fd, interest).into_iter().flatten() {
            pfds[n] = libc::pollfd {
                fd: w.fd,
                events: w.events,
                revents: 0,
            };
            n += 1;
        }
        // Never sleep longer than RECHECK_NS at a time: a ring whose
        // control words were overwritten (a doorbell flag that says nobody
        // sleeps, a garbage tail) rings no bell, and only a fresh look at
        // it finds the damage (then reported as ECONNRESET) or the data.
        let slice = sys::monotonic_ns().saturating_add(RECHECK_NS);
        let r = sleep(
            &mut pfds[..n],
            Some(deadline.map_or(slice, |d| d.min(slice))),
            None,
        );
        match r {
            Ok(_) => conn.disarm_after(interest, &pfds[..n]),
            Err(_) => conn.disarm(interest),
        }
        match r {
            Ok(_) => {}
            Err(libc::EINTR) => return Woke::Interrupted,
            Err(e) => return Woke::Failed(e),
        }
        if ready() {
            return Woke::Ready;
        }
        if let Some(d) = deadline {
            if sys::monotonic_ns() >= d {
                return Woke::TimedOut;
            }
        }
        if matches!(r, Ok(k) if k > 0) && before.is_some_and(|b| conn.available() <= b) {
            match pause(deadline) {
                Woke::Ready | Woke::TimedOut => {}
                other => return other,
            }
        }
    }
}

/// The remaining time before `deadline` as a timespec (None = forever).
pub fn remaining(deadline: Option<u64>) -> Option<libc::timespec> {
    deadline.map(|d| {
        let left = d.saturating_sub(sys::monotonic_ns());
        libc::timespec {
            tv_sec: (left / 1_000_000_000) as libc::time_t,
            tv_nsec: (left % 1_000_000_000) as libc::c_long,
        }
    })
}

/// ppoll on `pfds` until `deadline`, through libc's ppoll (never ours).
/// Returns the number of ready entries or the errno.
pub fn sleep(
    pfds: &mut [libc::pollfd],
    deadline: Option<u64>,
    sigmask: Option<*const libc::sigset_t>,
) -> Result<usize, i32> {
    let ts = remaining(deadline);
    let tsp = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    let mut asleep = guard::sleeping();
    let mask = asleep.mask(sigmask);
    // SAFETY: pfds is a valid array of its length; tsp is null or points to
    // `ts`, alive for the call; the mask is null, the caller's, or
    // `asleep`'s, alive for the call.
    let r = unsafe { real::ppoll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, tsp, mask) };
    if r < 0 {
        Err(sys::errno())
    } else {
        Ok(r as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wide_poll_counts_as_one_look_per_connection() {
        let turns = ringsock_ring::sleep::backoff::SPIN_TURNS;
        assert_eq!(pace(turns, 1), (turns, LOOKS_PER_CLOCK));
        assert_eq!(pace(turns, 0), (turns, LOOKS_PER_CLOCK));
        assert_eq!(pace(turns, 16), (turns / 16, 1));
        // Never fewer than one busy poll, and the clock read on every poll.
        assert_eq!(pace(turns, 100_000), (1, 1));
        assert_eq!(pace(4, 8), (1, LOOKS_PER_CLOCK / 8));
    }

    #[test]
    fn spinners_are_capped_per_process_and_a_parents_count_is_not_ours() {
        let cap = max_spinners();
        assert!(cap >= 1 && cap <= sys::cpus_allowed());
        let word = AtomicU64::new(0);
        let (parent, child) = (1000, 999);
        assert!(take_place(&word, 2, parent) && take_place(&word, 2, parent));
        assert!(!take_place(&word, 2, parent));
        leave_place(&word, parent);
        assert!(take_place(&word, 2, parent));
        // A forked child finds its parent's spinners, which it does not
        // have: its own count starts at zero.
        assert!(take_place(&word, 1, child));
        assert_eq!(spinners_of(word.load(Ordering::Relaxed), child), 1);
        // The parent's leaving does not touch the child's count.
        leave_place(&word, parent);
        assert_eq!(spinners_of(word.load(Ordering::Relaxed), child), 1);
        leave_place(&word, child);
        leave_place(&word, child);
        assert_eq!(spinners_of(word.load(Ordering::Relaxed), child), 0);
    }
}
