//! Readiness hooks: poll, ppoll, select, pselect, the fortified __poll_chk
//! and __ppoll_chk, and __fdelt_chk.
//!
//! While no ring connection exists in the process (always, in pass-through
//! mode) each of these costs one relaxed load before calling libc. With
//! rings alive, sets that contain a ring fd go to `dispatch::poll`.

use libc::{c_int, c_long, fd_set, nfds_t, pollfd, sigset_t, size_t, timespec, timeval};

use super::define::hooks;
use crate::dispatch::poll::{any_ring, poll_mixed, select_has_ring, select_mixed};
use crate::dispatch::wait::deadline_after;
use crate::fdtable;
use crate::interpose::guard;
use crate::sys;

/// Converts a poll timeout in ms to a deadline (None = forever; 0 = now).
fn ms_deadline(ms: c_int) -> Option<u64> {
    if ms < 0 {
        None
    } else {
        Some(sys::monotonic_ns() + ms as u64 * 1_000_000)
    }
}

/// Converts a timespec timeout to a deadline (null = forever).
///
/// # Safety
/// `ts` null or valid.
unsafe fn ts_deadline(ts: *const timespec) -> Result<Option<u64>, c_int> {
    if ts.is_null() {
        return Ok(None);
    }
    // SAFETY: per the caller.
    let t = unsafe { *ts };
    if t.tv_sec < 0 || !(0..1_000_000_000).contains(&t.tv_nsec) {
        return Err(libc::EINVAL);
    }
    let ns = (t.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(t.tv_nsec as u64);
    Ok(Some(deadline_after(ns).unwrap_or_else(sys::monotonic_ns)))
}

/// The ring path of poll/ppoll, or None to go to libc.
///
/// # Safety
/// `fds` valid for `nfds` entries.
unsafe fn ring_poll(
    fds: *mut pollfd,
    nfds: nfds_t,
    deadline: impl FnOnce() -> Result<Option<u64>, c_int>,
    mask: Option<*const sigset_t>,
) -> Option<c_int> {
    if fdtable::rings_alive() == 0 || fds.is_null() || nfds == 0 || guard::active() {
        return None;
    }
    // SAFETY: per the caller.
    let set = unsafe { std::slice::from_raw_parts_mut(fds, nfds as usize) };
    if !any_ring(set) {
        return None;
    }
    Some(match deadline() {
        Ok(d) => poll_mixed(set, d, mask),
        Err(e) => {
            sys::set_errno(e);
            -1
        }
    })
}

/// The ring path of select/pselect, or None to go to libc.
///
/// # Safety
/// The sets are null or valid.
unsafe fn ring_select(
    nfds: c_int,
    rd: *mut fd_set,
    wr: *mut fd_set,
    ex: *mut fd_set,
    deadline: Option<u64>,
    mask: Option<*const sigset_t>,
) -> Option<c_int> {
    if fdtable::rings_alive() == 0 || guard::active() {
        return None;
    }
    // SAFETY: per the caller.
    if !unsafe { select_has_ring(nfds, rd, wr, ex) } {
        return None;
    }
    // SAFETY: per the caller.
    Some(unsafe { select_mixed(nfds, rd, wr, ex, deadline, mask) })
}

hooks! {
    /// poll(2).
    fn poll(fds: *mut pollfd, nfds: nfds_t, timeout: c_int) -> c_int;
    |next| {
        // SAFETY: caller's array contract.
        if let Some(r) = unsafe { ring_poll(fds, nfds, || Ok(ms_deadline(timeout)), None) } {
            return r;
        }
        next()
    }

    /// ppoll(2).
    fn ppoll(fds: *mut pollfd, nfds: nfds_t, timeout: *const timespec, mask: *const sigset_t) -> c_int;
    |next| {
        // SAFETY: caller's contracts.
        let r = unsafe {
            ring_poll(fds, nfds, || ts_deadline(timeout), (!mask.is_null()).then_some(mask))
        };
        if let Some(r) = r {
            return r;
        }
        next()
    }

    /// Fortified poll: libc's checks the array size, then polls internally.
    fn __poll_chk(fds: *mut pollfd, nfds: nfds_t, timeout: c_int, fdslen: size_t) -> c_int;
        fallback(crate::sys::sys_call!(libc::SYS_poll, fds, nfds, timeout) as c_int)
    |next| {
        let fits = fdslen / std::mem::size_of::<pollfd>() >= nfds as usize;
        if fits {
            // SAFETY: caller's array contract.
            if let Some(r) = unsafe { ring_poll(fds, nfds, || Ok(ms_deadline(timeout)), None) } {
                return r;
            }
        }
        next()
    }

    /// Fortified ppoll.
    fn __ppoll_chk(fds: *mut pollfd, nfds: nfds_t, timeout: *const timespec, mask: *const sigset_t, fdslen: size_t) -> c_int;
        fallback(crate::sys::sys_call!(libc::SYS_ppoll, fds, nfds, timeout, mask, 8usize) as c_int)
    |next| {
        let fits = fdslen / std::mem::size_of::<pollfd>() >= nfds as usize;
        if fits {
            // SAFETY: caller's contracts.
            let r = unsafe {
                ring_poll(fds, nfds, || ts_deadline(timeout), (!mask.is_null()).then_some(mask))
            };
            if let Some(r) = r {
                return r;
            }
        }
        next()
    }

    /// select(2); like Linux, updates the timeout with the time left.
    fn select(nfds: c_int, rd: *mut fd_set, wr: *mut fd_set, ex: *mut fd_set, timeout: *mut timeval) -> c_int;
        fallback(crate::sys::sys_call!(libc::SYS_select, nfds, rd, wr, ex, timeout) as c_int)
    |next| {
        if fdtable::rings_alive() > 0 {
            let deadline = if timeout.is_null() {
                None
            } else {
                // SAFETY: non-null caller timeval.
                let tv = unsafe { *timeout };
                if tv.tv_sec < 0 || tv.tv_usec < 0 {
                    sys::set_errno(libc::EINVAL);
                    return -1;
                }
                let ns = tv.tv_sec as u64 * 1_000_000_000 + tv.tv_usec as u64 * 1000;
                Some(sys::monotonic_ns() + ns)
            };
            // SAFETY: caller's set contract.
            if let Some(r) = unsafe { ring_select(nfds, rd, wr, ex, deadline, None) } {
                if let (Some(d), false) = (deadline, timeout.is_null()) {
                    let left = d.saturating_sub(sys::monotonic_ns());
                    // SAFETY: non-null caller timeval.
                    unsafe {
                        (*timeout).tv_sec = (left / 1_000_000_000) as libc::time_t;
                        (*timeout).tv_usec = ((left % 1_000_000_000) / 1000) as libc::suseconds_t;
                    }
                }
                return r;
            }
        }
        next()
    }

    /// pselect(2).
    fn pselect(nfds: c_int, rd: *mut fd_set, wr: *mut fd_set, ex: *mut fd_set, timeout: *const timespec, mask: *const sigset_t) -> c_int;
        fallback(pselect_raw(nfds, rd, wr, ex, timeout, mask))
    |next| {
        if fdtable::rings_alive() > 0 {
            // SAFETY: caller's timespec.
            let deadline = match unsafe { ts_deadline(timeout) } {
                Ok(d) => d,
                Err(e) => {
                    sys::set_errno(e);
                    return -1;
                }
            };
            let m = (!mask.is_null()).then_some(mask);
            // SAFETY: caller's set contract.
            if let Some(r) = unsafe { ring_select(nfds, rd, wr, ex, deadline, m) } {
                return r;
            }
        }
        next()
    }

    /// FD_SET/FD_ISSET's bounds check under _FORTIFY_SOURCE.
    fn __fdelt_chk(d: c_long) -> c_long;
        fallback(fdelt(d))
    |next| {
        next()
    }
}

/// __fdelt_chk's definition, for the fallback: the word index of fd `d`,
/// aborting on an fd outside an fd_set as glibc does.
fn fdelt(d: c_long) -> c_long {
    if !(0..libc::FD_SETSIZE as c_long).contains(&d) {
        crate::log::always(format_args!("*** buffer overflow detected ***: terminated"));
        // SAFETY: abort never returns.
        unsafe { libc::abort() }
    }
    d / (8 * std::mem::size_of::<c_long>() as c_long)
}

/// The raw pselect6 call: its sixth argument is a {mask, size} pair.
///
/// # Safety
/// As pselect.
unsafe fn pselect_raw(
    nfds: c_int,
    rd: *mut fd_set,
    wr: *mut fd_set,
    ex: *mut fd_set,
    timeout: *const timespec,
    mask: *const sigset_t,
) -> c_int {
    let pair: [usize; 2] = [mask as usize, 8];
    let arg = if mask.is_null() {
        std::ptr::null()
    } else {
        pair.as_ptr()
    };
    // SAFETY: per the caller; the kernel copies the timeout (pselect
    // callers' timespec is const, so pass a copy).
    unsafe {
        let mut t = if timeout.is_null() {
            None
        } else {
            Some(*timeout)
        };
        let tp = t
            .as_mut()
            .map_or(std::ptr::null_mut(), |t| t as *mut timespec);
        crate::sys::sys_call!(libc::SYS_pselect6, nfds, rd, wr, ex, tp, arg) as c_int
    }
}
