//! epoll with ring-attached fds.
//!
//! A ring fd has no kernel readiness, so `epoll_ctl` on it does not reach
//! the program's epoll instance. Instead the instance gets an `EpollSet`
//! (fd table kind `Epoll`) holding the ring registrations with the
//! program's events and `epoll_data`, and one private epoll fd, itself
//! registered in the program's instance under a random 64-bit token, into
//! which every registered connection's wait fds go, edge-triggered, with
//! the *connection's key* as their epoll_data (dup'd fds of one connection
//! share the key and the wait fds). An unmodified epoll loop then wakes by
//! itself when a doorbell rings.
//!
//! The private set is the ready queue: the cost of a wait does not grow
//! with the number of idle connections.
//!
//! * Each registration is either on the set's *ready list* (a candidate to
//!   look at, not armed) or off it and *armed*: it holds an
//!   `AttachedConn::arm_edge` for its interest, across any number of
//!   `epoll_wait` calls, until one of its connection's wait fds fires.
//!   (EPOLLONESHOT registrations that fired are neither: disabled until
//!   EPOLL_CTL_MOD.)
//! * EPOLL_CTL_ADD and EPOLL_CTL_MOD put the registration on the list;
//!   while a thread sleeps on the set, one with nothing to report is armed
//!   instead (the kernel wakes no waiter for a quiet fd).
//!   When the private set reports a connection's key, its registrations
//!   are disarmed and put on the list.
//! * `epoll_wait` looks at the ready list only. A registration with
//!   something to report is reported (level-triggered ones stay on the
//!   list; EPOLLET ones report only what is new, as the kernel does, and
//!   stay on the list while they report; EPOLLONESHOT ones are disabled).
//!   One with nothing to report is armed (`arm_edge` re-checks: something
//!   to report then is reported, and the arm given back) and leaves the
//!   list. So an idle connection costs one arm, once, and a wait costs
//!   O(ready registrations + private events), not O(registrations).
//! * Spinning: a set with at most `SPIN_MAX` ring registrations spins over
//!   all of them before it sleeps (a ping-pong on one connection never
//!   arms, never rings a doorbell); a larger one spins over at most
//!   `SPIN_MAX` registrations of its ready list (the recently active
//!   ones), then arms them.
//! * Sleeping: in the program's own instance (kernel fds and the private
//!   fd's token together), without the set's lock. A thread that puts a
//!   registration on the list (EPOLL_CTL_ADD/MOD, a harvest it could not
//!   report) while another thread sleeps wakes it through a private
//!   eventfd ("poke").
//! * The private fd stays in the program's instance from the first ring
//!   registration on, so every wait on a tracked instance goes through
//!   `wait_mixed`, which removes the token. A wait that began in the
//!   kernel before the instance held a ring is counted
//!   (`FdState::kernel_wait_begin`), woken by a poke when the private fd
//!   goes in, and `after_kernel` takes its token out and looks at the ring
//!   registrations, as the kernel wakes a waiter for an fd another thread
//!   adds.
//! * Arms are given back on EPOLL_CTL_DEL, EPOLL_CTL_MOD, when the
//!   registration's file turns out to be gone (every fd closed: found on
//!   the list, on a harvest, or by a sweep that looks at one registration
//!   per call), and when the set is dropped. A forked child forgets the
//!   parent's arms (they are the parent's to give back) and looks at all
//!   its registrations once.
//!
//! * Nesting: an instance added to another epoll instance is *watched*:
//!   the kernel sees it readable only through the private fd, so after
//!   every call a watched set arms its listed
//!   registrations that have nothing to report and, if some have, leaves
//!   the poke readable until its next wait (`Inner::expose`); it holds its
//!   arms across calls whatever its size.
//!
//! Kernel events are merged in the same call. EPOLLERR/EPOLLHUP are always
//! reported.
//!
//! A socket registered in an epoll set *before* its ring was attached
//! (nginx adds upstream sockets before connect) is moved over by `migrate`.

use std::cell::Cell;
use std::collections::VecDeque;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use libc::{c_int, epoll_event};

mod kernel;

pub use kernel::hand_to_kernel;

use super::wait::{fewest_looks, remaining, spin, spin_due, spin_skipped};
use crate::attached::{AttachedConn, Ready, WaitFds};
use crate::fdtable::{self, EpollSlot, FdRef, FdState, Kind};
use crate::interpose::guard;
use crate::keymap::KeyMap;
use crate::{process, real, sys};

/// Sets with at most this many ring registrations spin over all of them
/// before sleeping; larger sets spin over at most this many registrations
/// of their ready list.
pub const SPIN_MAX: usize = 64;

/// Sets with at most this many ring registrations give their arms back
/// after every sleep (see `wait_mixed`): a peer then rings a doorbell only
/// for a waiter that sleeps. Larger sets hold arms across calls, so a wait
/// never looks at idle connections.
pub const HOLD_MIN: usize = 64;

/// epoll_data of the poke eventfd in the private set (connection keys are
/// addresses of fd states, never 0).
const POKE_KEY: u64 = 0;

/// Set in the epoll_data of a connection's kernel socket in the private
/// set (keys are addresses of fd states, so their low bit is free): a
/// harvest that sees it looks at the socket (`AttachedConn::socket_fired`),
/// and arming need not.
const SOCKET_TAG: u64 = 1;

/// Ring registrations of one epoll instance.
pub struct EpollSet {
    inner: Mutex<Inner>,
    /// The instance is itself in another epoll instance (`watch`).
    watched: AtomicBool,
    /// epoll_data under which `private` sits in the program's instance;
    /// fixed for the set's life, so read without the lock.
    token: u64,
}

struct Inner {
    /// Private epoll fd holding the wait fds; -1 until the first ring.
    private: c_int,
    /// Eventfd in `private` that wakes sleeping waiters; -1 with it.
    poke: c_int,
    /// `private` is registered in the program's instance.
    in_program: bool,
    /// Registrations by id (ids are never reused).
    regs: Map<Reg>,
    /// Every registration id, densely (`Reg::pos` is the index).
    all: Vec<u64>,
    /// Connections by key (the fd state's address).
    conns: Map<ConnEntry>,
    /// Registration ids to look at; may hold ids of removed registrations.
    ready: VecDeque<u64>,
    /// Keys of entries kept without registrations (see `remove`); `sweep`
    /// drops them once their file is closed, letting the connection (its
    /// ring and wait fds) go. May hold keys of removed entries.
    idle: VecDeque<u64>,
    next_id: u64,
    /// Where the sweep for registrations of closed files is.
    sweep: usize,
    /// Threads sleeping in the kernel for this set.
    sleepers: u32,
    /// The process whose arms the registrations hold.
    pid: libc::pid_t,
    /// `EpollSet::watch` was called.
    watched: bool,
}

/// One connection's registrations and the wait fds it has in `private`.
struct ConnEntry {
    regs: Vec<u64>,
    /// (wait fd, poll events registered for it).
    waits: Vec<(c_int, u32)>,
    /// The last wait fds `ensure_waits` put in: all are in `waits` with
    /// their events (`waits` only grows), so the same ones again need no
    /// look.
    ensured: WaitFds,
    /// Keeps the fd state (and so the key) from being recycled while the
    /// entry exists: an entry outlives its registrations (see `remove`).
    st: FdRef,
    /// Its key is in `Inner::idle`.
    queued: bool,
}

struct Reg {
    fd: c_int,
    st: FdRef,
    /// The connection's key.
    key: u64,
    /// Index in `Inner::all`.
    pos: usize,
    events: u32,
    data: u64,
    /// EPOLLET: requested events seen at the last look.
    last: u32,
    /// EPOLLET: the connection's `event_seq` at the last look.
    last_seq: u64,
    /// EPOLLONESHOT: reported, waiting for EPOLL_CTL_MOD.
    disabled: bool,
    /// The interest this registration holds armed (off the list).
    armed: Option<Ready>,
    /// On the ready list.
    listed: bool,
}

/// A hash map with u64 keys (ids, addresses).
type Map<V> = KeyMap<u64, V>;

const ALWAYS: u32 = (libc::EPOLLERR | libc::EPOLLHUP) as u32;
const MODE_BITS: u32 =
    (libc::EPOLLET | libc::EPOLLONESHOT | libc::EPOLLEXCLUSIVE | libc::EPOLLWAKEUP) as u32;
const ET: u32 = libc::EPOLLET as u32;
const ONESHOT: u32 = libc::EPOLLONESHOT as u32;

impl EpollSet {
    pub fn new() -> Self {
        EpollSet {
            watched: AtomicBool::new(false),
            token: random_token(),
            inner: Mutex::new(Inner {
                private: -1,
                poke: -1,
                in_program: false,
                regs: Map::default(),
                all: Vec::new(),
                conns: Map::default(),
                ready: VecDeque::new(),
                idle: VecDeque::new(),
                next_id: 1,
                sweep: 0,
                sleepers: 0,
                pid: 0,
                watched: false,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock aborts the process, so poisoning
        // cannot be observed; recover the guard anyway.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The instance was added to another epoll instance, which sees it
    /// readable only through the kernel: from now on the set keeps it
    /// readable while a ring registration has something to report
    /// (`Inner::expose`).
    pub fn watch(&self) {
        self.watched.store(true, Ordering::Release);
        let mut inner = self.lock();
        inner.watched = true;
        inner.expose();
    }
}

/// The fd state of epoll instance `epfd`, tracking it now if needed. None
/// if `epfd` is tracked as something else, or this process may not track
/// (a vfork child).
pub fn instance(epfd: c_int) -> Option<FdRef> {
    if let Some(st) = fdtable::get(epfd) {
        return (st.kind() == Some(Kind::Epoll)).then_some(st);
    }
    if !process::owns_memory() {
        return None;
    }
    fdtable::track_new(epfd, Kind::Epoll, 0, false)
}

/// The last fd of `st` was closed: epoll instance `epfd`, if it still is
/// one, drops its registrations and its kept entry of that file now (the
/// kernel drops a closed file from its instances), letting the connection
/// go rather than holding its ring until a wait happens to sweep it.
pub fn drop_closed(epfd: c_int, st: &FdState) {
    let Some(ep) = fdtable::get(epfd) else {
        return;
    };
    let Some(set) = (ep.kind() == Some(Kind::Epoll))
        .then(|| set_of(&ep))
        .flatten()
    else {
        return;
    };
    let _g = guard::enter();
    let mut inner = set.lock();
    // A forked child's copy must not give back its parent's arms.
    inner.check_fork();
    let key = st as *const FdState as usize as u64;
    let Some(e) = inner.conns.get(&key) else {
        return;
    };
    if e.st.fd_count() > 0 {
        return;
    }
    let ids = e.regs.clone();
    for id in ids {
        inner.remove(id);
    }
    // An entry kept without registrations goes with its last one above;
    // one that had none left goes here.
    inner.conns.remove(&key);
}

/// The ring registrations of epoll instance `st`, created on first use.
pub fn set_or_init(st: &FdState) -> &EpollSet {
    fdtable::on_close_in_epoll(drop_closed);
    downcast(st.epoll_slot_or_init(|| Box::new(EpollSet::new())))
}

/// The ring registrations of epoll instance `st`, if any were ever made.
pub fn set_of(st: &FdState) -> Option<&EpollSet> {
    st.epoll_slot().map(downcast)
}

/// The ring registrations an epoll slot holds.
pub fn set_in(slot: &EpollSlot) -> &EpollSet {
    downcast(slot)
}

fn downcast(slot: &EpollSlot) -> &EpollSet {
    slot.downcast_ref()
        .expect("an epoll slot holds an EpollSet: only set_or_init fills it")
}

impl Default for EpollSet {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for EpollSet {
    fn drop(&mut self) {
        let inner = self.inner.get_mut().unwrap_or_else(|p| p.into_inner());
        if inner.pid == process::pid() {
            for r in inner.regs.values_mut() {
                if let (Some(i), Some(c)) = (r.armed.take(), r.st.conn()) {
                    c.disarm_edge(i);
                }
            }
        }
        for fd in [inner.private, inner.poke] {
            if fd >= 0 {
                crate::fdspace::close(fd);
            }
        }
    }
}

fn random_token() -> u64 {
    let mut v = 0u64;
    // SAFETY: writing 8 bytes into v; getrandom is not interposed.
    let n = unsafe { libc::getrandom((&mut v as *mut u64).cast(), 8, libc::GRND_NONBLOCK) };
    if n != 8 {
        // No entropy yet: any value unlikely to be a program's epoll_data.
        v = 0x7269_6e67_736f_636b ^ sys::monotonic_ns().rotate_left(29);
    }
    v
}

fn fail(e: c_int) -> c_int {
    sys::set_errno(e);
    -1
}

fn interest_of(events: u32) -> Ready {
    Ready(events & !MODE_BITS)
}

/// The key of the connection behind `st`: the fd state's address, stable
/// and unique while a registration holds the reference.
fn key_of(st: &FdRef) -> u64 {
    let p: *const _ = &**st;
    p as usize as u64
}

fn eventfd_write(fd: c_int) {
    let one = 1u64;
    // SAFETY: 8 bytes from a valid u64 to our eventfd.
    unsafe { crate::sys::sys_call!(libc::SYS_write, fd, &one as *const u64, 8) };
}

fn eventfd_drain(fd: c_int) {
    let mut v = 0u64;
    // SAFETY: 8 bytes into a valid u64 from our non-blocking eventfd.
    unsafe { crate::sys::sys_call!(libc::SYS_read, fd, &mut v as *mut u64, 8) };
}

/// Whether readiness `now` (requested bits) is something to report for a
/// registration with `events`; for EPOLLET, bits not seen at the last look
/// or a new arrival (`seq` changed) while ready, and the look is recorded.
fn news(events: u32, last: &mut u32, last_seq: &mut u64, now: Ready, seq: u64) -> bool {
    if events & ET == 0 {
        return !now.is_empty();
    }
    let fresh = now.0 & !*last != 0 || (seq != *last_seq && !now.is_empty());
    *last = now.0;
    *last_seq = seq;
    fresh
}

/// What a look at a listed registration decided.
enum Step {
    /// Report these events.
    Report(u32),
    /// Nothing to report; stays on the list unarmed (it may be spun on).
    Keep,
    /// Leaves the list (armed, or disabled).
    Leave,
}

/// The connection's `event_seq` where `events` asks for edges (`news`
/// reads it only then).
fn seq_for(events: u32, conn: &dyn AttachedConn) -> u64 {
    if events & ET != 0 {
        conn.event_seq()
    } else {
        0
    }
}

/// Looks at listed registration `r`; `arm`: arm it if there is nothing to
/// report. `conns` holds its connection's entry (for the wait fds), looked
/// up only to arm.
fn examine(r: &mut Reg, conns: &mut Map<ConnEntry>, private: c_int, arm: bool) -> Step {
    if r.disabled {
        return Step::Leave;
    }
    let Some(conn) = r.st.conn() else {
        return Step::Leave;
    };
    if let Some(i) = r.armed.take() {
        // Not expected for a listed registration; keep the pairing anyway.
        conn.disarm_edge(i);
    }
    let interest = interest_of(r.events);
    let wanted = Ready(interest.0 | ALWAYS);
    let now = conn.readiness_for(interest) & wanted;
    let seq = seq_for(r.events, conn);
    if news(r.events, &mut r.last, &mut r.last_seq, now, seq) {
        return Step::Report(now.0);
    }
    if !arm {
        return Step::Keep;
    }
    if let Some(e) = conns.get_mut(&r.key) {
        ensure_waits(e, private, r.key, r.fd, conn, interest);
    }
    let now = conn.arm_edge(interest) & wanted;
    let seq = seq_for(r.events, conn);
    if news(r.events, &mut r.last, &mut r.last_seq, now, seq) {
        conn.disarm_edge(interest);
        return Step::Report(now.0);
    }
    r.armed = Some(interest);
    Step::Leave
}

/// Makes sure the wait fds `conn` names for `interest` are in `private`
/// under `key` with at least the events it asks for (a connection that
/// fell back to TCP names its socket with other events).
fn ensure_waits(
    e: &mut ConnEntry,
    private: c_int,
    key: u64,
    fd: c_int,
    conn: &dyn AttachedConn,
    interest: Ready,
) {
    debug_assert_eq!(key & SOCKET_TAG, 0, "fd state addresses are aligned");
    let fds = conn.wait_fds(fd, interest);
    if fds == e.ensured {
        return;
    }
    let socket = conn.watched_socket();
    for w in fds.into_iter().flatten() {
        let ev = u32::from(w.events as u16);
        let data = if w.fd == socket {
            key | SOCKET_TAG
        } else {
            key
        };
        match e.waits.iter_mut().find(|(f, _)| *f == w.fd) {
            Some((_, have)) if *have & ev == ev => {}
            Some((_, have)) => {
                *have |= ev;
                set_wait_fd(private, w.fd, *have, data);
            }
            None => {
                e.waits.push((w.fd, ev));
                set_wait_fd(private, w.fd, ev, data);
            }
        }
    }
    e.ensured = fds;
}

fn set_wait_fd(private: c_int, fd: c_int, events: u32, key: u64) {
    if private < 0 {
        return;
    }
    let mut ev = epoll_event {
        events: events | ET,
        u64: key,
    };
    // SAFETY: ev is valid for the calls. EEXIST: left over from an earlier
    // registration of the connection; take it over.
    unsafe {
        if real::epoll_ctl(private, libc::EPOLL_CTL_ADD, fd, &mut ev) < 0
            && sys::errno() == libc::EEXIST
        {
            real::epoll_ctl(private, libc::EPOLL_CTL_MOD, fd, &mut ev);
        }
    }
}

impl Inner {
    /// After fork the arms belong to the parent: forget them here and look
    /// at every registration again.
    fn check_fork(&mut self) {
        let pid = process::pid();
        if self.pid == pid {
            return;
        }
        self.pid = pid;
        // Threads sleeping at the fork are not in this process.
        self.sleepers = 0;
        for id in &self.all {
            let Some(r) = self.regs.get_mut(id) else {
                continue;
            };
            r.armed = None;
            if !r.disabled && !r.listed {
                r.listed = true;
                self.ready.push_back(*id);
            }
        }
    }

    /// The registration of `fd` on connection `key`.
    fn find(&self, key: u64, fd: c_int) -> Option<u64> {
        let e = self.conns.get(&key)?;
        e.regs
            .iter()
            .copied()
            .find(|id| self.regs.get(id).is_some_and(|r| r.fd == fd))
    }

    /// Forgets registration `id`, giving back its arm; the connection's
    /// wait fds leave `private` with its last registration (if its file is
    /// still open: otherwise the kernel dropped them, or will).
    fn remove(&mut self, id: u64) {
        let Some(r) = self.regs.remove(&id) else {
            return;
        };
        let alive = r.st.fd_count() > 0;
        if let (Some(i), Some(c)) = (r.armed, r.st.conn()) {
            c.disarm_edge(i);
        }
        self.all.swap_remove(r.pos);
        if let Some(&moved) = self.all.get(r.pos) {
            if let Some(m) = self.regs.get_mut(&moved) {
                m.pos = r.pos;
            }
        }
        let Some(e) = self.conns.get_mut(&r.key) else {
            return;
        };
        e.regs.retain(|&x| x != id);
        if !e.regs.is_empty() {
            return;
        }
        if alive {
            // Keep the wait fds in the private set: event loops that DEL
            // and re-ADD a socket around every request (redis' ae, wrk)
            // would otherwise pay three epoll_ctl calls each time. A stray
            // event for an entry without registrations costs a lookup;
            // entries of closed connections are swept when they pile up,
            // and one by one (`sweep_idle`), since each holds its
            // connection's ring and wait fds.
            if !e.queued {
                e.queued = true;
                self.idle.push_back(r.key);
            }
            if self.conns.len() > 2 * self.regs.len() + 64 {
                self.sweep_entries();
            }
            return;
        }
        if let Some(e) = self.conns.remove(&r.key) {
            if alive && self.private >= 0 {
                for (fd, _) in e.waits {
                    // SAFETY: removing a registration from our own set.
                    unsafe {
                        real::epoll_ctl(self.private, libc::EPOLL_CTL_DEL, fd, std::ptr::null_mut())
                    };
                }
            }
        }
    }

    /// Drops the entries that have no registrations left, taking their wait
    /// fds out of the private set (closed ones are gone already).
    fn sweep_entries(&mut self) {
        let private = self.private;
        // Every entry left has registrations: none needs `sweep_idle`.
        self.idle.clear();
        self.conns.retain(|_, e| {
            if !e.regs.is_empty() {
                e.queued = false;
                return true;
            }
            if private >= 0 && e.st.fd_count() > 0 {
                for (fd, _) in &e.waits {
                    // SAFETY: removing a registration from our own set.
                    unsafe {
                        real::epoll_ctl(private, libc::EPOLL_CTL_DEL, *fd, std::ptr::null_mut())
                    };
                }
            }
            false
        });
    }

    /// Looks at one entry kept without registrations: drops it once its
    /// file is closed (the kernel dropped its wait fds from `private`, or
    /// will when the connection goes), forgets it if it has registrations
    /// again, and queues it again while its file is open.
    fn sweep_idle(&mut self) {
        let Some(key) = self.idle.pop_front() else {
            return;
        };
        let Some(e) = self.conns.get_mut(&key) else {
            return;
        };
        e.queued = false;
        if !e.regs.is_empty() {
            return;
        }
        if e.st.fd_count() > 0 {
            e.queued = true;
            self.idle.push_back(key);
            return;
        }
        self.conns.remove(&key);
    }

    /// Disarms registration `id` and puts it on the list (its wait fd
    /// fired, or a spin saw it ready); drops it if its file is gone.
    fn promote(&mut self, id: u64) {
        let Some(r) = self.regs.get_mut(&id) else {
            return;
        };
        if r.st.fd_count() == 0 {
            self.remove(id);
            return;
        }
        if let Some(i) = r.armed.take() {
            if let Some(c) = r.st.conn() {
                c.disarm_edge(i);
            }
        }
        if !r.disabled && !r.listed {
            r.listed = true;
            self.ready.push_back(id);
        }
    }

    /// Promotes every registration of connection `key`. By index, with no
    /// copy of the list: `promote` takes out of it at most the one it is
    /// given (the next then moves into its place), or the whole entry.
    fn promote_conn(&mut self, key: u64) {
        let at =
            |inner: &Self, i: usize| inner.conns.get(&key).and_then(|c| c.regs.get(i).copied());
        let mut i = 0;
        while let Some(id) = at(self, i) {
            self.promote(id);
            if at(self, i) == Some(id) {
                i += 1;
            }
        }
    }

    /// Promotes every registration. By index, with no copy of the list:
    /// `promote` takes out of `all` at most the one it is given, whose
    /// place the last one takes (still to be looked at).
    fn promote_all(&mut self) {
        let mut i = 0;
        while let Some(&id) = self.all.get(i) {
            self.promote(id);
            if self.all.get(i) == Some(&id) {
                i += 1;
            }
        }
    }

    /// Looks at `steps` registrations (round robin) and drops those whose
    /// file is gone: an idle armed registration of a closed fd would
    /// otherwise hold its arm and its fd state until EPOLL_CTL_DEL.
    fn sweep(&mut self, steps: usize) {
        for _ in 0..steps {
            self.sweep_idle();
            if self.all.is_empty() {
                continue;
            }
            self.sweep = (self.sweep + 1) % self.all.len();
            let id = self.all[self.sweep];
            if self.regs.get(&id).is_some_and(|r| r.st.fd_count() == 0) {
                self.remove(id);
            }
        }
    }

    /// Looks at the first `todo` entries of the ready list, writing what
    /// they report to `out[n..]`; returns the new count. Up to `keep` of
    /// those with nothing to report stay on the list unarmed (to be spun
    /// on); the others are armed and leave it. Reported registrations go to
    /// the back (round robin, as the kernel's ready list).
    fn walk(
        &mut self,
        out: &mut [epoll_event],
        mut n: usize,
        mut todo: usize,
        mut keep: usize,
    ) -> usize {
        while todo > 0 && n < out.len() {
            todo -= 1;
            let Some(id) = self.ready.pop_front() else {
                break;
            };
            let Some(r) = self.regs.get_mut(&id) else {
                continue;
            };
            r.listed = false;
            if r.st.fd_count() == 0 {
                self.remove(id);
                continue;
            }
            match examine(r, &mut self.conns, self.private, keep == 0) {
                Step::Report(events) => {
                    out[n] = epoll_event {
                        events,
                        u64: r.data,
                    };
                    n += 1;
                    if r.events & ONESHOT != 0 {
                        r.disabled = true;
                    } else {
                        r.listed = true;
                        self.ready.push_back(id);
                    }
                }
                Step::Keep => {
                    keep -= 1;
                    r.listed = true;
                    self.ready.push_back(id);
                }
                Step::Leave => {}
            }
        }
        n
    }

    /// Reads the private set: the registrations of every connection whose
    /// wait fd fired go on the list. Returns how many entries it added.
    fn harvest(&mut self) -> usize {
        if self.private < 0 {
            return 0;
        }
        let before = self.ready.len();
        // Left uninitialised: only what the kernel wrote is read.
        let mut evs = [MaybeUninit::<epoll_event>::uninit(); 64];
        loop {
            // SAFETY: evs is a writable buffer of 64 events.
            let r = unsafe { real::epoll_wait(self.private, evs.as_mut_ptr().cast(), 64, 0) };
            if r <= 0 {
                break;
            }
            for e in &evs[..r as usize] {
                // SAFETY: the kernel wrote the first r entries.
                let e = unsafe { e.assume_init() };
                if e.u64 == POKE_KEY {
                    eventfd_drain(self.poke);
                    continue;
                }
                let key = e.u64 & !SOCKET_TAG;
                let Some(c) = self.conns.get(&key) else {
                    // A connection that left the set; its wait fds may stay
                    // behind until they are closed.
                    continue;
                };
                if e.u64 & SOCKET_TAG != 0 {
                    // Looked at even without registrations: a later one
                    // arms without looking, and this edge is spent.
                    if let Some(conn) = c.st.conn() {
                        conn.socket_fired();
                    }
                }
                // A connection's few registrations (one per fd of it in the
                // set) are copied out, not looked up again for each.
                let mut few = [0u64; 4];
                match c.regs.len() {
                    n if n <= few.len() => {
                        few[..n].copy_from_slice(&c.regs);
                        for &id in &few[..n] {
                            self.promote(id);
                        }
                    }
                    _ => self.promote_conn(key),
                }
            }
            if (r as usize) < evs.len() {
                break;
            }
        }
        self.ready.len() - before
    }

    /// For a watched set: the program's instance must read readable (to
    /// the instance watching it) while a registration has something to
    /// report, and a registration with nothing must be armed, so that its
    /// doorbell makes the instance readable. Looks at the listed
    /// registrations: arms those with nothing to report, keeps the others
    /// listed with what they saw unchanged (still to be reported), and if
    /// there are any, leaves the poke eventfd readable until a wait reads
    /// the private set.
    fn expose(&mut self) {
        if !self.watched || self.poke < 0 {
            return;
        }
        let mut pending = false;
        for _ in 0..self.ready.len() {
            let Some(id) = self.ready.pop_front() else {
                break;
            };
            let Some(r) = self.regs.get_mut(&id) else {
                continue;
            };
            let seen = (r.last, r.last_seq);
            match examine(r, &mut self.conns, self.private, true) {
                Step::Report(_) => {
                    (r.last, r.last_seq) = seen;
                    pending = true;
                    self.ready.push_back(id);
                }
                Step::Keep => self.ready.push_back(id),
                Step::Leave => r.listed = false,
            }
        }
        if pending {
            eventfd_write(self.poke);
        }
    }

    /// Registration `id`, just added or modified (unarmed), goes where a
    /// wait would put it. While a thread sleeps on the set, one with nothing
    /// to report is armed here, off the list: the kernel wakes no waiter for
    /// an fd added quiet, and a poke would cost the sleeper a wake-up and a
    /// sleep for each hand-over (apache event's worker adds every keep-alive
    /// connection back to its listener's set after each response). One with
    /// something to report, or with no thread asleep, goes on the list;
    /// true then: the sleepers, if any, are to be woken to look at it.
    fn enlist(&mut self, id: u64) -> bool {
        let Some(r) = self.regs.get_mut(&id) else {
            return false;
        };
        if !r.listed {
            if self.sleepers > 0 {
                // A report is left for the waiter: its edge is not spent.
                let seen = (r.last, r.last_seq);
                if let Step::Leave = examine(r, &mut self.conns, self.private, true) {
                    return false;
                }
                (r.last, r.last_seq) = seen;
            }
            r.listed = true;
            self.ready.push_back(id);
        }
        true
    }

    /// Wakes the threads sleeping on this set, if any, to look at the list.
    fn poke_sleepers(&self) {
        if self.sleepers > 0 && self.poke >= 0 {
            eventfd_write(self.poke);
        }
    }

    /// What to spin on, into `out`: every enabled registration of a small
    /// set, or at most `SPIN_MAX` listed ones of a large set.
    fn spin_candidates(&self, out: &mut Vec<Candidate>) {
        let make = |id: &u64| {
            let r = self.regs.get(id)?;
            (!r.disabled).then(|| Candidate {
                id: *id,
                st: r.st.clone(),
                interest: interest_of(r.events),
                seen: Seen {
                    edge: r.events & ET != 0,
                    bits: r.last,
                    seq: r.last_seq,
                },
            })
        };
        if self.all.len() <= SPIN_MAX {
            out.extend(self.all.iter().filter_map(make));
        } else {
            out.extend(self.ready.iter().filter_map(make).take(SPIN_MAX));
        }
    }
}

thread_local! {
    /// This thread's spin candidates' buffer, empty between waits, so that
    /// a wait allocates nothing. (A wait that finds it taken, nested in a
    /// signal handler, makes its own.)
    static SPARE: Cell<Vec<Candidate>> = const { Cell::new(Vec::new()) };
}

/// A registration looked at while spinning, without the set's lock.
struct Candidate {
    id: u64,
    st: FdRef,
    interest: Ready,
    seen: Seen,
}

impl Candidate {
    fn ready(&self) -> bool {
        self.st.conn().is_some_and(|c| {
            let now = c.readiness_for(self.interest) & (self.interest | Ready::ERR | Ready::HUP);
            self.seen.news(now, seq_for(self.seen.edge_bits(), c))
        })
    }
}

/// What an EPOLLET registration saw last: bits and event sequence.
#[derive(Clone, Copy)]
struct Seen {
    edge: bool,
    bits: u32,
    seq: u64,
}

impl Seen {
    /// The registration's mode bit for `seq_for`.
    fn edge_bits(self) -> u32 {
        if self.edge {
            ET
        } else {
            0
        }
    }

    fn news(self, now: Ready, seq: u64) -> bool {
        if !self.edge {
            return !now.is_empty();
        }
        now.0 & !self.bits != 0 || (seq != self.seq && !now.is_empty())
    }
}

/// epoll_ctl(epfd, op, fd, ev) for a ring-attached `fd` (state `st`), with
/// `set` the registrations of `epfd`. C return convention.
///
/// # Safety
/// `ev` is null or valid, as for epoll_ctl.
pub unsafe fn ctl_ring(
    epfd: c_int,
    instance: &FdState,
    set: &EpollSet,
    op: c_int,
    fd: c_int,
    st: FdRef,
    ev: *const epoll_event,
) -> c_int {
    let _g = guard::enter();
    let mut locked = set.lock();
    let inner = &mut *locked;
    inner.check_fork();
    let (events, data) = if ev.is_null() {
        (0, 0)
    } else {
        // SAFETY: non-null and valid per the caller; epoll_event is packed,
        // so copy it out whole.
        let e = unsafe { std::ptr::read_unaligned(ev) };
        (e.events, e.u64)
    };
    let key = key_of(&st);
    let pos = inner.find(key, fd);
    let mut wake = false;
    let ret = match op {
        libc::EPOLL_CTL_ADD => 'add: {
            if pos.is_some() {
                break 'add fail(libc::EEXIST);
            }
            if ev.is_null() {
                break 'add fail(libc::EFAULT);
            }
            if let Err(e) = ensure_private(epfd, instance, inner, set.token) {
                break 'add fail(e);
            }
            let Some(conn) = st.conn() else {
                break 'add fail(libc::EBADF);
            };
            // Amortised clean-up of registrations whose file is gone.
            inner.sweep(2);
            let id = inner.next_id;
            inner.next_id += 1;
            let e = inner.conns.entry(key).or_insert_with(|| ConnEntry {
                regs: Vec::new(),
                waits: Vec::new(),
                ensured: [None; 3],
                st: st.clone(),
                queued: false,
            });
            e.regs.push(id);
            ensure_waits(e, inner.private, key, fd, conn, interest_of(events));
            inner.regs.insert(
                id,
                Reg {
                    fd,
                    st: st.clone(),
                    key,
                    pos: inner.all.len(),
                    events,
                    data,
                    last: 0,
                    last_seq: 0,
                    disabled: false,
                    armed: None,
                    listed: false,
                },
            );
            inner.all.push(id);
            wake = inner.enlist(id);
            st.note_epoll_home(epfd);
            0
        }
        libc::EPOLL_CTL_MOD => 'modify: {
            let Some(id) = pos else {
                break 'modify fail(libc::ENOENT);
            };
            if ev.is_null() {
                break 'modify fail(libc::EFAULT);
            }
            let Some(r) = inner.regs.get_mut(&id) else {
                break 'modify fail(libc::ENOENT);
            };
            if let (Some(i), Some(c)) = (r.armed.take(), r.st.conn()) {
                c.disarm_edge(i);
            }
            r.events = events;
            r.data = data;
            r.last = 0;
            r.last_seq = 0;
            r.disabled = false;
            wake = inner.enlist(id);
            0
        }
        libc::EPOLL_CTL_DEL => match pos {
            Some(id) => {
                inner.remove(id);
                0
            }
            None => fail(libc::ENOENT),
        },
        _ => fail(libc::EINVAL),
    };
    let e = sys::errno();
    inner.expose();
    // Sleepers are woken once the lock is free: a woken one takes it first
    // thing, and would otherwise sleep again on it at once.
    let poke = if wake && inner.sleepers > 0 {
        inner.poke
    } else {
        -1
    };
    drop(locked);
    if poke >= 0 {
        eventfd_write(poke);
    }
    sys::set_errno(e);
    ret
}

/// Creates the private set and its poke eventfd if needed, and makes sure
/// the private set sits in the program's instance (`instance`) under
/// `token`.
fn ensure_private(
    epfd: c_int,
    instance: &FdState,
    inner: &mut Inner,
    token: u64,
) -> Result<(), c_int> {
    if inner.private < 0 {
        // SAFETY: plain syscall wrapper of libc, not ours.
        let p = unsafe { real::epoll_create1(libc::EPOLL_CLOEXEC) };
        if p < 0 {
            return Err(sys::errno());
        }
        let p = crate::fdspace::high(p);
        // SAFETY: plain eventfd creation.
        let k = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if k < 0 {
            let e = sys::errno();
            crate::fdspace::close(p);
            return Err(e);
        }
        let k = crate::fdspace::high(k);
        let mut ev = epoll_event {
            events: (libc::EPOLLIN | libc::EPOLLET) as u32,
            u64: POKE_KEY,
        };
        // SAFETY: ev is valid for the call.
        if unsafe { real::epoll_ctl(p, libc::EPOLL_CTL_ADD, k, &mut ev) } < 0 {
            let e = sys::errno();
            crate::fdspace::close(k);
            crate::fdspace::close(p);
            return Err(e);
        }
        inner.private = p;
        inner.poke = k;
    }
    if !inner.in_program {
        let mut ev = epoll_event {
            events: libc::EPOLLIN as u32,
            u64: token,
        };
        // SAFETY: ev is valid for the call.
        if unsafe { real::epoll_ctl(epfd, libc::EPOLL_CTL_ADD, inner.private, &mut ev) } < 0
            && sys::errno() != libc::EEXIST
        {
            return Err(sys::errno());
        }
        inner.in_program = true;
        // A thread asleep in this instance through the kernel alone (its
        // wait began before the instance held a ring) is woken, so that
        // its hook looks at the new registration (`after_kernel`).
        if instance.kernel_waiters() > 0 {
            eventfd_write(inner.poke);
        }
    }
    Ok(())
}

/// Removes our token's event from `evs[..n]`; returns the new count and
/// whether it was there.
fn strip_token(evs: &mut [epoll_event], n: usize, token: u64) -> (usize, bool) {
    let mut k = 0;
    let mut seen = false;
    for i in 0..n {
        let data = evs[i].u64;
        if data != token {
            evs[k] = evs[i];
            k += 1;
        } else {
            seen = true;
        }
    }
    (k, seen)
}

/// epoll_wait semantics for an instance with ring registrations.
///
/// # Safety
/// `events` is valid for `maxevents` entries, as for epoll_wait.
pub unsafe fn wait_mixed(
    epfd: c_int,
    set: &EpollSet,
    events: *mut epoll_event,
    maxevents: c_int,
    deadline: Option<u64>,
    sigmask: Option<*const libc::sigset_t>,
) -> c_int {
    // SAFETY: the caller's contract, passed on.
    let r = unsafe { wait_ring(epfd, set, events, maxevents, deadline, sigmask) };
    if set.watched.load(Ordering::Acquire) {
        let e = sys::errno();
        let _g = guard::enter();
        set.lock().expose();
        sys::set_errno(e);
    }
    r
}

/// `wait_mixed` before a watched set is exposed.
///
/// # Safety
/// As `wait_mixed`.
unsafe fn wait_ring(
    epfd: c_int,
    set: &EpollSet,
    events: *mut epoll_event,
    maxevents: c_int,
    deadline: Option<u64>,
    sigmask: Option<*const libc::sigset_t>,
) -> c_int {
    if events.is_null() || maxevents <= 0 {
        return fail(libc::EINVAL);
    }
    let _g = guard::enter();
    // SAFETY: valid for maxevents entries per the caller.
    let out = unsafe { std::slice::from_raw_parts_mut(events, maxevents as usize) };
    if let Some(a) = crate::attached::attacher() {
        a.flush_all();
    }
    let token = set.token;
    let mut first = true;
    loop {
        // Spin only before the first sleep: a wake-up with nothing to
        // report (a stray doorbell) is not worth a spin.
        let may_spin = first && deadline.is_none_or(|d| d > sys::monotonic_ns());
        first = false;
        // A zero spin budget would only look once more, and the arms below
        // re-check anyway: the registrations are armed at the first look.
        let spinning = may_spin && spin_due();
        // 1. The ready list; registrations that may be spun on stay
        //    unarmed. Without a spin, what has nothing to report is armed,
        //    and the thread counts as a sleeper under the same hold.
        let (mut n, mut cands) = {
            let mut locked = set.lock();
            let inner = &mut *locked;
            inner.check_fork();
            inner.sweep(1);
            let keep = match spinning {
                false => 0,
                true if inner.all.len() <= SPIN_MAX => usize::MAX,
                true => SPIN_MAX,
            };
            let todo = inner.ready.len();
            let n = inner.walk(out, 0, todo, keep);
            if n == out.len() {
                // A full buffer leaves the kernel side unread: fetch what
                // the private set has so that armed connections get their
                // turn on a later call. A set of one registration has no
                // other to give a turn (what its socket or doorbell posted
                // there waits for the next look, which reads the set).
                if inner.all.len() > 1 {
                    inner.harvest();
                }
                inner.poke_sleepers();
            }
            let mut cands = Vec::new();
            if n == 0 && spinning {
                cands = SPARE.take();
                inner.spin_candidates(&mut cands);
            } else if n == 0 {
                inner.sleepers += 1;
            }
            (n, cands)
        };
        if n == 0 && may_spin && !spinning {
            spin_skipped();
        }
        if n == 0 && spinning {
            // 2. Spin.
            // The busy looks are asked for only when there is a spin.
            let spin_looks = || fewest_looks(cands.iter().filter_map(|c| c.st.conn()));
            if !cands.is_empty()
                && spin(spin_looks(), cands.len(), || {
                    cands.iter().any(Candidate::ready)
                })
            {
                let mut locked = set.lock();
                let inner = &mut *locked;
                for c in &cands {
                    if c.ready() {
                        inner.promote(c.id);
                    }
                }
                let todo = inner.ready.len();
                n = inner.walk(out, 0, todo, usize::MAX);
            }
            // Their references go outside the set's lock (a last one may
            // close a connection, which looks at the set); the buffer is
            // kept.
            cands.clear();
            SPARE.set(cands);
            if n > 0 {
                return finish(set, epfd, out, n, token);
            }
            // 3. Arm what has nothing to report, then sleep.
            let mut locked = set.lock();
            let inner = &mut *locked;
            let todo = inner.ready.len();
            n = inner.walk(out, 0, todo, 0);
            if n == 0 {
                inner.sleepers += 1;
            }
        }
        if n > 0 {
            return finish(set, epfd, out, n, token);
        }
        let r = kernel_events(epfd, out, token, true, deadline, sigmask);
        let errno = sys::errno();
        let mut locked = set.lock();
        let inner = &mut *locked;
        inner.sleepers -= 1;
        if inner.sleepers == 0 && inner.all.len() <= HOLD_MIN && !inner.watched {
            // A small set holds its arms only while it sleeps: once awake,
            // they go back (and the registrations on the list), so a busy
            // connection never makes its peer ring a doorbell for a waiter
            // that is not sleeping. Bounded by HOLD_MIN; larger sets keep
            // their idle connections armed across calls, and so do watched
            // sets (their doorbells make the instance readable).
            inner.promote_all();
        }
        let Ok((k, saw)) = r else {
            drop(locked);
            sys::set_errno(errno);
            return -1;
        };
        let mut m = 0;
        if saw || !inner.ready.is_empty() {
            if saw {
                inner.harvest();
            }
            let todo = inner.ready.len();
            m = inner.walk(&mut out[k..], 0, todo, 0);
            if k + m == out.len() && !inner.ready.is_empty() {
                inner.poke_sleepers();
            }
        }
        if k + m > 0 {
            return (k + m) as c_int;
        }
        drop(locked);
        if let Some(d) = deadline {
            if sys::monotonic_ns() >= d {
                return 0;
            }
        }
    }
}

/// The rest of a wait on `epfd` that went to the kernel alone because the
/// instance held no ring when it began, and returned `r` events: another
/// thread added a ring meanwhile (its set is `set`). Removes the token's
/// event; if it was there, reports what the ring registrations have, or
/// waits on for them until `deadline`.
///
/// # Safety
/// `events` is valid for `maxevents` entries and holds `r` events, as
/// epoll_wait left it.
pub unsafe fn after_kernel(
    epfd: c_int,
    set: &EpollSet,
    events: *mut epoll_event,
    maxevents: c_int,
    r: c_int,
    deadline: Option<u64>,
    sigmask: Option<*const libc::sigset_t>,
) -> c_int {
    if events.is_null() || r <= 0 || maxevents < r {
        return r;
    }
    let n = {
        let _g = guard::enter();
        // SAFETY: valid for maxevents entries per the caller.
        let out = unsafe { std::slice::from_raw_parts_mut(events, maxevents as usize) };
        let mut locked = set.lock();
        let inner = &mut *locked;
        let (k, saw) = strip_token(out, r as usize, set.token);
        if !saw {
            return r;
        }
        inner.check_fork();
        inner.harvest();
        let todo = inner.ready.len();
        let n = inner.walk(out, k, todo, 0);
        inner.expose();
        n
    };
    if n > 0 {
        return n as c_int;
    }
    // SAFETY: the caller's contract, passed on.
    unsafe { wait_mixed(epfd, set, events, maxevents, deadline, sigmask) }
}

/// Adds the kernel side (without sleeping) to `n` ring events in `out`,
/// and what the private set reports meanwhile, if there is room.
fn finish(set: &EpollSet, epfd: c_int, out: &mut [epoll_event], n: usize, token: u64) -> c_int {
    let (k, saw) =
        kernel_events(epfd, &mut out[n..], token, false, None, None).unwrap_or((0, false));
    let mut total = n + k;
    if saw {
        let mut locked = set.lock();
        let inner = &mut *locked;
        // Look at the newly listed registrations only: the others were
        // looked at in this call already.
        let before = inner.ready.len();
        let added = inner.harvest();
        inner.ready.rotate_left(before);
        total = inner.walk(out, total, added, usize::MAX);
        if total == out.len() {
            inner.poke_sleepers();
        }
    }
    total as c_int
}

/// Kernel events of the program's instance, with our token's event
/// removed: the count and whether the token was there. `block` false
/// polls; true waits until `deadline` (None = forever) with the program's
/// signal mask. Err: the call failed (errno is set).
fn kernel_events(
    epfd: c_int,
    out: &mut [epoll_event],
    token: u64,
    block: bool,
    deadline: Option<u64>,
    sigmask: Option<*const libc::sigset_t>,
) -> Result<(usize, bool), ()> {
    if out.is_empty() {
        return Ok((0, false));
    }
    let timeout_ms = if !block {
        0
    } else {
        match remaining(deadline) {
            None => -1,
            Some(ts) => {
                let ms = ts.tv_sec * 1000 + (ts.tv_nsec + 999_999) / 1_000_000;
                ms.min(i32::MAX as i64) as c_int
            }
        }
    };
    // A blocking wait holds no lock: the program's signal handlers may run
    // in it as the program's own code (guard::sleeping).
    let mut asleep = block.then(guard::sleeping);
    let mask = match asleep.as_mut() {
        Some(a) => a.mask(sigmask),
        None => sigmask.unwrap_or(std::ptr::null()),
    };
    // SAFETY: out is valid for out.len() entries; the mask is null, the
    // caller's, or `asleep`'s, alive for the call.
    let r = unsafe {
        real::epoll_pwait(
            epfd,
            out.as_mut_ptr(),
            out.len().min(c_int::MAX as usize) as c_int,
            timeout_ms,
            mask,
        )
    };
    if r < 0 {
        return Err(());
    }
    Ok(strip_token(out, r as usize, token))
}

/// Moves the kernel epoll registrations a socket got before its ring was
/// attached (recorded by the epoll_ctl hook) over to ring registrations of
/// the same instances, with the same events and data.
pub fn migrate(fd: c_int, st: &FdRef) {
    for pre in st.take_pre_epoll() {
        let _g = guard::enter();
        // SAFETY: removing the kernel registration of our own fd.
        unsafe { real::epoll_ctl(pre.epfd, libc::EPOLL_CTL_DEL, fd, std::ptr::null_mut()) };
        let Some(ep) = instance(pre.epfd) else {
            log::warn!(
                "fd {fd}: epoll fd {} cannot be tracked; its events are lost",
                pre.epfd
            );
            continue;
        };
        let ev = epoll_event {
            events: pre.events,
            u64: pre.data,
        };
        // SAFETY: ev is valid for the call.
        if unsafe {
            ctl_ring(
                pre.epfd,
                &ep,
                set_or_init(&ep),
                libc::EPOLL_CTL_ADD,
                fd,
                st.clone(),
                &ev,
            )
        } != 0
        {
            log::warn!(
                "fd {fd}: moving its registration in epoll fd {} failed",
                pre.epfd
            );
        }
    }
}
