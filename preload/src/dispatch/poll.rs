//! poll/ppoll/select/pselect over a set that contains ring-attached fds.
//!
//! Ring fds have no kernel readiness of their own, so their entries are
//! answered from `AttachedConn::readiness`, and the sleep happens in one
//! ppoll over the program's kernel fds plus each connection's wait fds. The
//! loop: answer from the rings; if nothing is ready, arm every ring for the
//! requested events (arm re-checks), sleep, disarm, answer again. Kernel fds
//! are polled with a zero timeout whenever a ring is ready, so one call
//! returns everything that is ready, as the kernel would; and before the
//! rings are spun on or armed, so a ready kernel fd costs one ppoll, as a
//! kernel select does.

use libc::{c_int, pollfd};

use super::few::Few;
use super::wait::{fewest_looks, sleep, spin};
use crate::attached::Ready;
use crate::fdtable::{self, FdRef};
use crate::interpose::guard;
use crate::{attached, sys};

/// True if any entry refers to a ring-attached fd. Costs one or two relaxed
/// loads per entry.
pub fn any_ring(fds: &[pollfd]) -> bool {
    fdtable::rings_alive() > 0 && fds.iter().any(|p| fdtable::attached(p.fd).is_some())
}

/// Revents for a ring entry: the requested events that hold, plus ERR and
/// HUP, which poll always reports.
fn ring_revents(st: &FdRef, events: i16) -> i16 {
    let Some(conn) = st.conn() else {
        return libc::POLLNVAL;
    };
    let interest = Ready(events as u16 as u32) | Ready::ERR | Ready::HUP;
    (conn.readiness_for(interest) & interest).0 as i16
}

/// poll(2) semantics over `fds`, `deadline` absolute monotonic ns (None =
/// forever). Returns the count of entries with revents, or -1/errno.
pub fn poll_mixed(
    fds: &mut [pollfd],
    deadline: Option<u64>,
    sigmask: Option<*const libc::sigset_t>,
) -> c_int {
    let _g = guard::enter();
    let mut found = Few::<Option<FdRef>, FEW>::with_capacity(fds.len(), None);
    for p in fds.iter() {
        found.push(fdtable::attached(p.fd));
    }
    let rings = found.as_slice();
    for st in rings.iter().flatten() {
        if let Some(conn) = st.conn() {
            if let Err(e) = st.claim(conn) {
                sys::set_errno(e.0);
                return -1;
            }
            conn.flush();
        }
    }
    if let Some(a) = attached::attacher() {
        a.flush_all();
    }
    let looks = fewest_looks(rings.iter().flatten().filter_map(|st| st.conn()));
    let has_kernel = rings.iter().any(Option::is_none);
    loop {
        // 1. Rings first; if one is ready, collect the kernel side without
        //    sleeping and return.
        if answer_rings(fds, rings) > 0 {
            return collect_kernel(fds, rings);
        }
        // 2. One look, without sleeping or arming, at everything the sleep
        //    would watch: a ready kernel entry answers the call as it is,
        //    unless a ring's doorbell or socket needs the full wait's
        //    drain and check.
        let mut looked = false;
        if has_kernel {
            let mut set = sleep_set(fds, rings);
            if let Err(e) = sleep(set.set.as_mut_slice(), Some(sys::monotonic_ns()), None) {
                sys::set_errno(e);
                return -1;
            }
            let kernel_ready = scatter(fds, rings, &set);
            let ring_woke = (0..fds.len()).any(|i| rings[i].is_some() && set.woke(i));
            if !ring_woke {
                if kernel_ready > 0 {
                    return kernel_ready as c_int;
                }
                if deadline.is_some_and(|d| d <= sys::monotonic_ns()) {
                    return 0;
                }
            }
            looked = kernel_ready > 0 || ring_woke;
        }
        // 3. Spin on the rings while nothing else is known to be ready.
        let may_spin = !looked && deadline.is_none_or(|d| d > sys::monotonic_ns());
        let width = rings.iter().flatten().count();
        if may_spin && spin(looks, width, || answer_rings(fds, rings) > 0) {
            return collect_kernel(fds, rings);
        }
        // 4. Arm every ring; a ring that turns out ready after arming means
        //    no sleep: disarm and answer from the top.
        let mut armed_ready = false;
        for (p, r) in fds.iter().zip(rings) {
            if let Some(conn) = r.as_ref().and_then(|s| s.conn()) {
                let interest = Ready(p.events as u16 as u32);
                if conn
                    .arm(interest)
                    .intersects(interest | Ready::ERR | Ready::HUP)
                {
                    armed_ready = true;
                }
            }
        }
        if armed_ready {
            for (p, r) in fds.iter().zip(rings) {
                if let Some(conn) = r.as_ref().and_then(|s| s.conn()) {
                    conn.disarm_after(Ready(p.events as u16 as u32), &[]);
                }
            }
            continue;
        }
        // 5. Sleep on the kernel entries plus every ring's wait fds; each
        //    ring learns which of its fds woke the sleep (`disarm_after`).
        let mut set = sleep_set(fds, rings);
        let slept = sleep(set.set.as_mut_slice(), deadline, sigmask);
        if slept.is_ok() {
            scatter(fds, rings, &set);
        }
        for (i, (p, r)) in fds.iter().zip(rings).enumerate() {
            if let Some(conn) = r.as_ref().and_then(|s| s.conn()) {
                let interest = Ready(p.events as u16 as u32);
                match slept {
                    Ok(_) => conn.disarm_after(interest, set.of(i)),
                    Err(_) => conn.disarm(interest),
                }
            }
        }
        if let Err(e) = slept {
            // poll is never restarted after a signal, whatever SA_RESTART
            // says (signal(7)).
            sys::set_errno(e);
            return -1;
        }
        let rings_ready = answer_rings(fds, rings);
        let kernel_ready = fds
            .iter()
            .zip(rings)
            .filter(|(p, r)| r.is_none() && p.revents != 0)
            .count();
        if rings_ready + kernel_ready > 0 {
            return (rings_ready + kernel_ready) as c_int;
        }
        if let Some(d) = deadline {
            if sys::monotonic_ns() >= d {
                return 0;
            }
        }
    }
}

/// The set a wait sleeps on: each kernel entry as it is, each ring entry
/// as its connection's wait fds; with, for each entry, where its pollfds
/// start (`starts[i]..starts[i + 1]`: a ring's fds change when it leaves).
struct SleepSet {
    set: Few<pollfd, { 3 * FEW }>,
    starts: Few<usize, { FEW + 1 }>,
}

/// Sets of this many entries or fewer are kept on the stack (`Few`).
const FEW: usize = 8;

const NO_POLLFD: pollfd = pollfd {
    fd: -1,
    events: 0,
    revents: 0,
};

fn sleep_set(fds: &[pollfd], rings: &[Option<FdRef>]) -> SleepSet {
    let width = fds.len() + 2 * rings.iter().flatten().count();
    let mut set = Few::with_capacity(width, NO_POLLFD);
    let mut starts = Few::with_capacity(fds.len() + 1, 0);
    for (p, r) in fds.iter().zip(rings) {
        starts.push(set.as_slice().len());
        match r {
            None => set.push(pollfd {
                fd: p.fd,
                events: p.events,
                revents: 0,
            }),
            Some(st) => {
                let interest = Ready(p.events as u16 as u32);
                for w in st
                    .conn()
                    .into_iter()
                    .flat_map(|c| c.wait_fds(p.fd, interest))
                    .flatten()
                {
                    set.push(pollfd {
                        fd: w.fd,
                        events: w.events,
                        revents: 0,
                    });
                }
            }
        }
    }
    starts.push(set.as_slice().len());
    SleepSet { set, starts }
}

impl SleepSet {
    /// The pollfds that stand for entry `i`.
    fn of(&self, i: usize) -> &[pollfd] {
        let starts = self.starts.as_slice();
        &self.set.as_slice()[starts[i]..starts[i + 1]]
    }

    /// Whether any pollfd of entry `i` has revents.
    fn woke(&self, i: usize) -> bool {
        self.of(i).iter().any(|q| q.revents != 0)
    }
}

/// After a ppoll of a `SleepSet`: copies the kernel entries' revents back
/// into `fds`; returns how many kernel entries are ready.
fn scatter(fds: &mut [pollfd], rings: &[Option<FdRef>], s: &SleepSet) -> usize {
    let mut kernel_ready = 0;
    for (i, (p, r)) in fds.iter_mut().zip(rings).enumerate() {
        if r.is_none() {
            p.revents = s.of(i).first().map_or(0, |q| q.revents);
            kernel_ready += usize::from(p.revents != 0);
        }
    }
    kernel_ready
}

/// Fills revents of ring entries; returns how many are non-zero.
fn answer_rings(fds: &mut [pollfd], rings: &[Option<FdRef>]) -> usize {
    let mut n = 0;
    for (p, r) in fds.iter_mut().zip(rings) {
        if let Some(st) = r {
            p.revents = ring_revents(st, p.events);
            if p.revents != 0 {
                n += 1;
            }
        }
    }
    n
}

/// Polls the kernel entries with a zero timeout and returns the total count
/// of entries (ring and kernel) with revents.
fn collect_kernel(fds: &mut [pollfd], rings: &[Option<FdRef>]) -> c_int {
    let mut kernel = Few::<pollfd, FEW>::with_capacity(fds.len(), NO_POLLFD);
    for (p, _) in fds.iter().zip(rings).filter(|(_, r)| r.is_none()) {
        kernel.push(pollfd {
            fd: p.fd,
            events: p.events,
            revents: 0,
        });
    }
    if !kernel.as_slice().is_empty() {
        let now = Some(sys::monotonic_ns());
        if let Err(e) = sleep(kernel.as_mut_slice(), now, None) {
            sys::set_errno(e);
            return -1;
        }
    }
    let mut k = kernel.as_slice().iter();
    let mut n = 0;
    for (p, r) in fds.iter_mut().zip(rings) {
        if r.is_none() {
            p.revents = k.next().map_or(0, |q| q.revents);
        }
        if p.revents != 0 {
            n += 1;
        }
    }
    n
}

/// select(2) over sets containing ring fds, by way of `poll_mixed`. Updates
/// the sets in place; returns the number of bits set, or -1/errno.
///
/// # Safety
/// The set pointers are null or valid `fd_set`s covering `nfds`.
pub unsafe fn select_mixed(
    nfds: c_int,
    rd: *mut libc::fd_set,
    wr: *mut libc::fd_set,
    ex: *mut libc::fd_set,
    deadline: Option<u64>,
    sigmask: Option<*const libc::sigset_t>,
) -> c_int {
    // SAFETY: the caller guarantees the sets are valid or null.
    let isset =
        |set: *mut libc::fd_set, fd: c_int| !set.is_null() && unsafe { libc::FD_ISSET(fd, set) };
    let mut pfds = Few::<pollfd, FEW>::new(NO_POLLFD);
    for fd in 0..nfds.clamp(0, libc::FD_SETSIZE as c_int) {
        let mut ev = 0i16;
        if isset(rd, fd) {
            ev |= libc::POLLIN;
        }
        if isset(wr, fd) {
            ev |= libc::POLLOUT;
        }
        if isset(ex, fd) {
            ev |= libc::POLLPRI;
        }
        if ev != 0 {
            pfds.push(pollfd {
                fd,
                events: ev,
                revents: 0,
            });
        }
    }
    let r = poll_mixed(pfds.as_mut_slice(), deadline, sigmask);
    if r < 0 {
        return r;
    }
    for set in [rd, wr, ex] {
        if !set.is_null() {
            // SAFETY: non-null and valid per the caller.
            unsafe { libc::FD_ZERO(set) };
        }
    }
    let mut count = 0;
    for p in pfds.as_slice() {
        if p.revents & libc::POLLNVAL != 0 {
            sys::set_errno(libc::EBADF);
            return -1;
        }
        // What select counts as readable/writable/exceptional (fs/select.c).
        let r_ok = p.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0;
        let w_ok = p.revents & (libc::POLLOUT | libc::POLLERR) != 0;
        let x_ok = p.revents & libc::POLLPRI != 0;
        for (want, ok, set) in [
            (libc::POLLIN, r_ok, rd),
            (libc::POLLOUT, w_ok, wr),
            (libc::POLLPRI, x_ok, ex),
        ] {
            if p.events & want != 0 && ok {
                // SAFETY: the set was requested, so it is non-null and valid.
                unsafe { libc::FD_SET(p.fd, set) };
                count += 1;
            }
        }
    }
    count
}

/// True if any fd set in the select sets is ring-attached.
///
/// # Safety
/// As `select_mixed`.
pub unsafe fn select_has_ring(
    nfds: c_int,
    rd: *mut libc::fd_set,
    wr: *mut libc::fd_set,
    ex: *mut libc::fd_set,
) -> bool {
    if fdtable::rings_alive() == 0 {
        return false;
    }
    for set in [rd, wr, ex] {
        if set.is_null() {
            continue;
        }
        for fd in 0..nfds.clamp(0, libc::FD_SETSIZE as c_int) {
            // SAFETY: valid set per the caller, fd < FD_SETSIZE.
            if unsafe { libc::FD_ISSET(fd, set) } && fdtable::attached(fd).is_some() {
                return true;
            }
        }
    }
    false
}
