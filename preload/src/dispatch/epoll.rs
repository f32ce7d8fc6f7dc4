//! epoll with ring-attached fds.
//!
//! A ring fd has no kernel readiness, so `epoll_ctl` on it does not reach
//! the program's epoll instance. Instead the instance gets an `EpollSet`
//! (fd table kind `Epoll`) holding the ring registrations with the
//! program's events and `epoll_data`, and one private epoll fd, itself
//! registered in the program's instance under a random 64-bit token, into
//! which every registered connection's wait fds go (edge-triggered: the
//! rings are re-checked on every wake anyway). An unmodified epoll loop then
//! wakes by itself when a doorbell rings.
//!
//! `epoll_wait` answers the rings from `AttachedConn::readiness`: level-
//! triggered registrations are reported while ready, EPOLLET ones when a
//! requested event appears that was not there at the previous report,
//! EPOLLONESHOT ones once until EPOLL_CTL_MOD; EPOLLERR/EPOLLHUP always.
//! Kernel events are merged in the same call. Cost: O(ring registrations)
//! per call, which is the thing to improve with a ready list fed by the
//! transport when programs with thousands of ring connections need it.
//!
//! A socket registered in an epoll set *before* its ring was attached
//! (nginx adds upstream sockets before connect) is moved over by `migrate`.

use std::sync::Mutex;

use libc::{c_int, epoll_event};

use super::wait::{remaining, spin};
use crate::attached::{Ready, WaitFd};
use crate::fdtable::FdRef;
use crate::hook::guard;
use crate::{real, sys};

/// Ring registrations of one epoll instance.
pub struct EpollSet {
    inner: Mutex<Inner>,
}

struct Inner {
    /// Private epoll fd holding the wait fds; -1 until the first ring.
    private: c_int,
    /// epoll_data under which `private` sits in the program's instance.
    token: u64,
    regs: Vec<Reg>,
}

struct Reg {
    fd: c_int,
    st: FdRef,
    events: u32,
    data: u64,
    /// EPOLLET: requested events seen at the last report.
    last: u32,
    /// EPOLLET: the connection's `event_seq` at the last report.
    last_seq: u64,
    /// EPOLLONESHOT: reported, waiting for EPOLL_CTL_MOD.
    disabled: bool,
}

const ALWAYS: u32 = (libc::EPOLLERR | libc::EPOLLHUP) as u32;
const MODE_BITS: u32 =
    (libc::EPOLLET | libc::EPOLLONESHOT | libc::EPOLLEXCLUSIVE | libc::EPOLLWAKEUP) as u32;

impl EpollSet {
    pub fn new() -> Self {
        EpollSet {
            inner: Mutex::new(Inner {
                private: -1,
                token: random_token(),
                regs: Vec::new(),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock aborts the process, so poisoning
        // cannot be observed; recover the guard anyway.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// True if any ring registration is present.
    pub fn has_rings(&self) -> bool {
        !self.lock().regs.is_empty()
    }
}

impl Default for EpollSet {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for EpollSet {
    fn drop(&mut self) {
        let inner = self.inner.get_mut().unwrap_or_else(|p| p.into_inner());
        if inner.private >= 0 {
            sys::close(inner.private);
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

/// epoll_ctl(epfd, op, fd, ev) for a ring-attached `fd` (state `st`), with
/// `set` the registrations of `epfd`. C return convention.
///
/// # Safety
/// `ev` is null or valid, as for epoll_ctl.
pub unsafe fn ctl_ring(
    epfd: c_int,
    set: &EpollSet,
    op: c_int,
    fd: c_int,
    st: FdRef,
    ev: *const epoll_event,
) -> c_int {
    let _g = guard::enter();
    let mut inner = set.lock();
    // Registrations whose file is gone (every fd closed) vanished in the
    // kernel's eyes; forget them before looking for duplicates.
    inner.regs.retain(|r| r.st.fd_count() > 0);
    let pos = inner.regs.iter().position(|r| r.fd == fd && r.st.same(&st));
    let (events, data) = if ev.is_null() {
        (0, 0)
    } else {
        // SAFETY: non-null and valid per the caller; epoll_event is packed,
        // so copy it out whole.
        let e = unsafe { std::ptr::read_unaligned(ev) };
        (e.events, e.u64)
    };
    match op {
        libc::EPOLL_CTL_ADD => {
            if pos.is_some() {
                return fail(libc::EEXIST);
            }
            if ev.is_null() {
                return fail(libc::EFAULT);
            }
            if let Err(e) = ensure_private(epfd, &mut inner) {
                return fail(e);
            }
            let Some(conn) = st.conn() else {
                return fail(libc::EBADF);
            };
            for w in conn.wait_fds(fd, interest_of(events)).into_iter().flatten() {
                add_wait_fd(inner.private, w);
            }
            inner.regs.push(Reg {
                fd,
                st,
                events,
                data,
                last: 0,
                last_seq: 0,
                disabled: false,
            });
            0
        }
        libc::EPOLL_CTL_MOD => {
            let Some(i) = pos else {
                return fail(libc::ENOENT);
            };
            if ev.is_null() {
                return fail(libc::EFAULT);
            }
            let r = &mut inner.regs[i];
            r.events = events;
            r.data = data;
            r.last = 0;
            r.last_seq = 0;
            r.disabled = false;
            0
        }
        libc::EPOLL_CTL_DEL => {
            let Some(i) = pos else {
                return fail(libc::ENOENT);
            };
            // The wait fds stay in the private set: another registration may
            // share them, and a stray wake-up only costs a re-check.
            inner.regs.swap_remove(i);
            0
        }
        _ => fail(libc::EINVAL),
    }
}

fn ensure_private(epfd: c_int, inner: &mut Inner) -> Result<(), c_int> {
    if inner.private >= 0 {
        return Ok(());
    }
    // SAFETY: plain syscall wrapper of libc, not ours.
    let p = unsafe { real::epoll_create1(libc::EPOLL_CLOEXEC) };
    if p < 0 {
        return Err(sys::errno());
    }
    let p = crate::ring::fdspace::high(p);
    let mut ev = epoll_event {
        events: libc::EPOLLIN as u32,
        u64: inner.token,
    };
    // SAFETY: ev is valid for the call.
    if unsafe { real::epoll_ctl(epfd, libc::EPOLL_CTL_ADD, p, &mut ev) } < 0 {
        let e = sys::errno();
        sys::close(p);
        return Err(e);
    }
    inner.private = p;
    Ok(())
}

fn add_wait_fd(private: c_int, w: WaitFd) {
    let mut ev = epoll_event {
        events: (w.events as u16 as u32) | libc::EPOLLET as u32,
        u64: w.fd as u64,
    };
    // SAFETY: ev is valid for the call. EEXIST (a wait fd shared by dup'd
    // registrations) is fine.
    unsafe { real::epoll_ctl(private, libc::EPOLL_CTL_ADD, w.fd, &mut ev) };
}

/// Writes ready ring registrations into `out`; returns how many.
fn collect(inner: &mut Inner, out: &mut [epoll_event]) -> usize {
    inner.regs.retain(|r| r.st.fd_count() > 0);
    let mut n = 0;
    for r in inner.regs.iter_mut() {
        if n == out.len() {
            break;
        }
        if r.disabled {
            continue;
        }
        let Some(conn) = r.st.conn() else { continue };
        let wanted = interest_of(r.events).0 | ALWAYS;
        let now = conn.readiness().0 & wanted;
        let report = if r.events & libc::EPOLLET as u32 != 0 {
            // A new arrival is an edge even while the bit stays set.
            let seq = conn.event_seq();
            let fresh = now & !r.last != 0 || (seq != r.last_seq && now != 0);
            r.last = now;
            r.last_seq = seq;
            fresh
        } else {
            now != 0
        };
        if report {
            out[n] = epoll_event {
                events: now,
                u64: r.data,
            };
            n += 1;
            if r.events & libc::EPOLLONESHOT as u32 != 0 {
                r.disabled = true;
            }
        }
    }
    n
}

/// Removes our token's event from `evs[..n]`; returns the new count.
fn strip_token(evs: &mut [epoll_event], n: usize, token: u64) -> usize {
    let mut k = 0;
    for i in 0..n {
        let data = evs[i].u64;
        if data != token {
            evs[k] = evs[i];
            k += 1;
        }
    }
    k
}

/// Empties the private set's ready list (edge-triggered, so a read of the
/// events is all it takes).
fn drain_private(private: c_int) {
    let mut tmp = [epoll_event { events: 0, u64: 0 }; 16];
    // SAFETY: tmp is a valid buffer of 16 events.
    while unsafe { real::epoll_wait(private, tmp.as_mut_ptr(), 16, 0) } == 16 {}
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
    if events.is_null() || maxevents <= 0 {
        return fail(libc::EINVAL);
    }
    let _g = guard::enter();
    // SAFETY: valid for maxevents entries per the caller.
    let out = unsafe { std::slice::from_raw_parts_mut(events, maxevents as usize) };
    let (private, token) = {
        let inner = set.lock();
        (inner.private, inner.token)
    };
    if let Some(a) = crate::attached::attacher() {
        a.flush_all();
    }
    loop {
        let mut n = collect(&mut set.lock(), out);
        let may_spin = deadline.is_none_or(|d| d > sys::monotonic_ns());
        if n == 0
            && may_spin
            && spin(|| {
                snapshot(set)
                    .iter()
                    .any(|(st, i, seen)| ready_for(st, *i, *seen))
            })
        {
            n = collect(&mut set.lock(), out);
        }
        if n > 0 {
            return n as c_int
                + kernel_events(epfd, &mut out[n..], private, token, false, None, None).max(0);
        }
        // Arm every ring; if one has something to report after arming, do
        // not sleep. For EPOLLET that means bits not reported before: a
        // socket that stays writable must not keep an edge-triggered
        // waiter from sleeping.
        let snap = snapshot(set);
        let mut ready = false;
        for (st, interest, seen) in &snap {
            if let Some(c) = st.conn() {
                let now = c.arm(*interest) & (*interest | Ready::ERR | Ready::HUP);
                ready |= seen.news(now, c.event_seq());
            }
        }
        let k = if ready {
            0
        } else {
            kernel_events(epfd, out, private, token, true, deadline, sigmask)
        };
        for (st, interest, _) in &snap {
            if let Some(c) = st.conn() {
                c.disarm(*interest);
            }
        }
        if k < 0 {
            return k;
        }
        let k = k as usize;
        let m = collect(&mut set.lock(), &mut out[k..]);
        if k + m > 0 {
            return (k + m) as c_int;
        }
        if let Some(d) = deadline {
            if sys::monotonic_ns() >= d {
                return 0;
            }
        }
    }
}

/// What an EPOLLET registration reported last: bits and event sequence.
#[derive(Clone, Copy)]
struct Seen {
    edge: bool,
    bits: u32,
    seq: u64,
}

impl Seen {
    /// Whether readiness `now` (with the connection's sequence `seq`) is
    /// something to report.
    fn news(self, now: Ready, seq: u64) -> bool {
        if !self.edge {
            return !now.is_empty();
        }
        now.0 & !self.bits != 0 || (seq != self.seq && !now.is_empty())
    }
}

/// Live registrations: state, interest, and what an EPOLLET one reported.
fn snapshot(set: &EpollSet) -> Vec<(FdRef, Ready, Seen)> {
    set.lock()
        .regs
        .iter()
        .filter(|r| !r.disabled)
        .map(|r| {
            let seen = Seen {
                edge: r.events & libc::EPOLLET as u32 != 0,
                bits: r.last,
                seq: r.last_seq,
            };
            (r.st.clone(), interest_of(r.events), seen)
        })
        .collect()
}

fn ready_for(st: &FdRef, interest: Ready, seen: Seen) -> bool {
    st.conn().is_some_and(|c| {
        let now = c.readiness() & (interest | Ready::ERR | Ready::HUP);
        seen.news(now, c.event_seq())
    })
}

/// Kernel events of the program's instance, with our token's event
/// removed. `block` false polls; true waits until `deadline` (None =
/// forever) with the program's signal mask.
fn kernel_events(
    epfd: c_int,
    out: &mut [epoll_event],
    private: c_int,
    token: u64,
    block: bool,
    deadline: Option<u64>,
    sigmask: Option<*const libc::sigset_t>,
) -> c_int {
    if out.is_empty() {
        return 0;
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
    // SAFETY: out is valid for out.len() entries.
    let r = unsafe {
        real::epoll_pwait(
            epfd,
            out.as_mut_ptr(),
            out.len().min(c_int::MAX as usize) as c_int,
            timeout_ms,
            sigmask.unwrap_or(std::ptr::null()),
        )
    };
    if r < 0 {
        return r;
    }
    if private >= 0 {
        drain_private(private);
    }
    strip_token(out, r as usize, token) as c_int
}

/// Moves the kernel epoll registrations a socket got before its ring was
/// attached (recorded by the epoll_ctl hook) over to ring registrations of
/// the same instances, with the same events and data.
pub fn migrate(fd: c_int, st: &FdRef) {
    for pre in st.take_pre_epoll() {
        let _g = guard::enter();
        // SAFETY: removing the kernel registration of our own fd.
        unsafe { real::epoll_ctl(pre.epfd, libc::EPOLL_CTL_DEL, fd, std::ptr::null_mut()) };
        let Some(ep) = crate::hooks::epoll::epoll_state_for(pre.epfd) else {
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
                ep.epoll_set_or_init(),
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
