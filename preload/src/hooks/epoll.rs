//! epoll hooks: epoll_create, epoll_create1, epoll_ctl, epoll_wait,
//! epoll_pwait, epoll_pwait2.
//!
//! An epoll instance becomes tracked (kind `Epoll`) only when a ring fd is
//! added to it; until then, and always while no ring exists in the process,
//! every call is one relaxed load plus libc.

use libc::{c_int, epoll_event, sigset_t, timespec};

use super::define::hooks;
use crate::dispatch::epoll::{ctl_ring, instance, set_of, set_or_init, wait_mixed};
use crate::dispatch::wait::deadline_after;
use crate::fdtable::{self, FdRef, Kind};
use crate::interpose::guard;
use crate::sys;

/// The tracked state of epoll fd `epfd` if it holds ring registrations.
fn ring_epoll(epfd: c_int) -> Option<FdRef> {
    if fdtable::rings_alive() == 0 || !fdtable::is_tracked(epfd) || guard::active() {
        return None;
    }
    fdtable::get(epfd)
        .filter(|st| st.kind() == Some(Kind::Epoll) && set_of(st).is_some_and(|s| s.has_rings()))
}

/// Records an epoll registration of a pre-connect socket, so that a ring
/// attached by connect() can take it over (dispatch/epoll.rs, `migrate`).
fn note_pre_connect(epfd: c_int, op: c_int, fd: c_int, event: *const epoll_event) {
    let Some(st) = fdtable::get(fd).filter(|s| s.is_preconnect()) else {
        return;
    };
    let (events, data) = if event.is_null() {
        (0, 0)
    } else {
        // SAFETY: the kernel just accepted this event pointer; the struct is
        // packed, so read it unaligned.
        let e = unsafe { std::ptr::read_unaligned(event) };
        (e.events, e.u64)
    };
    st.note_pre_epoll(op, epfd, events, data);
}

fn ms_to_deadline(ms: c_int) -> Option<u64> {
    if ms < 0 {
        None
    } else {
        Some(sys::monotonic_ns() + ms as u64 * 1_000_000)
    }
}

hooks! {
    /// Pass-through.
    fn epoll_create(size: c_int) -> c_int;
        fallback(crate::sys::sys_call!(libc::SYS_epoll_create1, if size > 0 { 0 } else { -1 }) as c_int)
    |next| {
        next()
    }

    /// Pass-through.
    fn epoll_create1(flags: c_int) -> c_int;
    |next| {
        next()
    }

    /// Ring fds are registered with the instance's `EpollSet`; everything
    /// else goes to the kernel.
    fn epoll_ctl(epfd: c_int, op: c_int, fd: c_int, event: *mut epoll_event) -> c_int;
    |next| {
        if fdtable::rings_alive() > 0 && !guard::active() {
            if let Some(st) = fdtable::attached(fd) {
                if epfd == fd {
                    sys::set_errno(libc::EINVAL);
                    return -1;
                }
                match instance(epfd) {
                    Some(ep) => {
                        let set = set_or_init(&ep);
                        // SAFETY: caller's event contract.
                        return unsafe { ctl_ring(epfd, set, op, fd, st, event) };
                    }
                    None => {
                        // Not an epoll fd we can track: let the kernel say
                        // what is wrong with it (EBADF, EINVAL).
                    }
                }
            }
        }
        let r = next();
        if r == 0 && crate::attached::attacher().is_some() && fdtable::is_tracked(fd) {
            note_pre_connect(epfd, op, fd, event);
        }
        r
    }

    /// epoll_wait(2).
    fn epoll_wait(epfd: c_int, events: *mut epoll_event, maxevents: c_int, timeout: c_int) -> c_int;
    |next| {
        if let Some(st) = ring_epoll(epfd) {
            if let Some(set) = set_of(&st) {
                // SAFETY: caller's events contract.
                return unsafe { wait_mixed(epfd, set, events, maxevents, ms_to_deadline(timeout), None) };
            }
        }
        next()
    }

    /// epoll_pwait(2).
    fn epoll_pwait(epfd: c_int, events: *mut epoll_event, maxevents: c_int, timeout: c_int, mask: *const sigset_t) -> c_int;
    |next| {
        if let Some(st) = ring_epoll(epfd) {
            if let Some(set) = set_of(&st) {
                let m = (!mask.is_null()).then_some(mask);
                // SAFETY: caller's events contract.
                return unsafe { wait_mixed(epfd, set, events, maxevents, ms_to_deadline(timeout), m) };
            }
        }
        next()
    }

    /// epoll_pwait2(2): a timespec timeout.
    fn epoll_pwait2(epfd: c_int, events: *mut epoll_event, maxevents: c_int, timeout: *const timespec, mask: *const sigset_t) -> c_int;
        fallback(crate::sys::sys_call!(libc::SYS_epoll_pwait2, epfd, events, maxevents, timeout, mask, 8usize) as c_int)
    |next| {
        if let Some(st) = ring_epoll(epfd) {
            if let Some(set) = set_of(&st) {
                let deadline = if timeout.is_null() {
                    None
                } else {
                    // SAFETY: non-null caller timespec.
                    let t = unsafe { *timeout };
                    if t.tv_sec < 0 || !(0..1_000_000_000).contains(&t.tv_nsec) {
                        sys::set_errno(libc::EINVAL);
                        return -1;
                    }
                    let ns = t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64;
                    Some(deadline_after(ns).unwrap_or_else(sys::monotonic_ns))
                };
                let m = (!mask.is_null()).then_some(mask);
                // SAFETY: caller's events contract.
                return unsafe { wait_mixed(epfd, set, events, maxevents, deadline, m) };
            }
        }
        next()
    }
}
