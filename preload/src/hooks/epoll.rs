//! epoll hooks: epoll_create, epoll_create1, epoll_ctl, epoll_wait,
//! epoll_pwait, epoll_pwait2.
//!
//! An epoll instance is tracked (kind `Epoll`) from its creation, so that
//! its duplicates share its state; one the shim did not see made (before
//! the shim loaded, or across exec) is tracked when a ring fd is added to
//! it. Its ring registrations (`EpollSet`) are made at the first ring;
//! until then a wait costs a table look-up plus libc.

use libc::{c_int, epoll_event, sigset_t, timespec};

use super::define::hooks;
use crate::dispatch::epoll::{
    after_kernel, ctl_ring, instance, set_in, set_of, set_or_init, wait_mixed,
};
use crate::dispatch::wait::deadline_after;
use crate::fdtable::{self, FdRef, Kind};
use crate::interpose::guard;
use crate::{lifecycle, sys};

/// The tracked state of epoll fd `epfd`, if any.
fn tracked_epoll(epfd: c_int) -> Option<FdRef> {
    if !fdtable::is_tracked(epfd) || guard::active() {
        return None;
    }
    fdtable::get(epfd).filter(|st| st.kind() == Some(Kind::Epoll))
}

/// An epoll wait. An instance that ever held a ring registration has its
/// private fd in it, so the wait goes through `wait_mixed`, which takes
/// the token out. Any other goes to the kernel (`next`), counted as a
/// kernel waiter (the first ring added meanwhile pokes it awake), then
/// through `after_kernel` if another thread added the instance's first
/// ring meanwhile. `deadline` is asked for only where a ring is involved; after
/// a kernel wait it counts from its return (a wait may last longer than
/// asked, never shorter).
fn wait(
    epfd: c_int,
    events: *mut epoll_event,
    maxevents: c_int,
    deadline: impl Fn() -> Option<u64>,
    mask: *const sigset_t,
    next: impl FnOnce() -> c_int,
) -> c_int {
    let m = (!mask.is_null()).then_some(mask);
    let st = tracked_epoll(epfd);
    let waited = match st.as_deref() {
        Some(ep) => match set_of(ep) {
            Some(set) => Err(set),
            None => {
                let made = ep.kernel_wait_begin();
                let r = match made {
                    // Made meanwhile (a slot stays once made).
                    Some(slot) => Err(set_in(slot)),
                    None => Ok(next()),
                };
                ep.kernel_wait_end();
                r
            }
        },
        None => Ok(next()),
    };
    let r = match waited {
        Ok(r) => r,
        // SAFETY: caller's events contract.
        Err(set) => return unsafe { wait_mixed(epfd, set, events, maxevents, deadline(), m) },
    };
    if r <= 0 {
        return r;
    }
    let Some(st) = st.or_else(|| tracked_epoll(epfd)) else {
        return r;
    };
    let Some(set) = set_of(&st) else {
        return r;
    };
    let saved = sys::errno();
    // SAFETY: caller's events contract; the kernel wrote r events.
    let r = unsafe { after_kernel(epfd, set, events, maxevents, r, deadline(), m) };
    if r >= 0 {
        sys::set_errno(saved);
    }
    r
}

/// After a successful epoll_ctl on tracked `fd`, one look-up for both
/// cases that need one: an epoll instance added to another must make its
/// ring registrations readable there (`EpollSet::watch`), and a
/// pre-connect socket's registration is recorded, so that a ring attached
/// by connect() can take it over (dispatch/epoll.rs, `migrate`). Any other
/// fd (a connection already decided, the common case) takes no reference.
fn after_ctl(epfd: c_int, op: c_int, fd: c_int, event: *const epoll_event) {
    let notes_pre = crate::attached::attacher().is_some();
    let wanted = |s: &fdtable::FdState| match s.kind() {
        Some(Kind::Epoll) => op == libc::EPOLL_CTL_ADD,
        _ => notes_pre && s.is_preconnect(),
    };
    let Some(st) = fdtable::get_if(fd, wanted) else {
        return;
    };
    let saved = sys::errno();
    if st.kind() == Some(Kind::Epoll) {
        if !guard::active() {
            let _g = guard::enter();
            set_or_init(&st).watch();
        }
    } else {
        let (events, data) = if event.is_null() {
            (0, 0)
        } else {
            // SAFETY: the kernel just accepted this event pointer; the
            // struct is packed, so read it unaligned.
            let e = unsafe { std::ptr::read_unaligned(event) };
            (e.events, e.u64)
        };
        st.note_pre_epoll(op, epfd, events, data);
    }
    sys::set_errno(saved);
}

/// `fd`, a new epoll instance, as `lifecycle::on_new_epoll` tracks it.
fn created(fd: c_int) -> c_int {
    if fd >= 0 {
        let saved = sys::errno();
        lifecycle::on_new_epoll(fd);
        sys::set_errno(saved);
    }
    fd
}

fn ms_to_deadline(ms: c_int) -> Option<u64> {
    if ms < 0 {
        None
    } else {
        Some(sys::monotonic_ns() + ms as u64 * 1_000_000)
    }
}

hooks! {
    /// A new instance, tracked (`created`).
    fn epoll_create(size: c_int) -> c_int;
        fallback(crate::sys::sys_call!(libc::SYS_epoll_create1, if size > 0 { 0 } else { -1 }) as c_int)
    |next| {
        created(next())
    }

    /// A new instance, tracked (`created`).
    fn epoll_create1(flags: c_int) -> c_int;
    |next| {
        created(next())
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
                        return unsafe { ctl_ring(epfd, &ep, set, op, fd, st, event) };
                    }
                    None => {
                        // Not an epoll fd we can track: let the kernel say
                        // what is wrong with it (EBADF, EINVAL).
                    }
                }
            }
        }
        let r = next();
        if r == 0 && fdtable::is_tracked(fd) {
            after_ctl(epfd, op, fd, event);
        }
        r
    }

    /// epoll_wait(2).
    fn epoll_wait(epfd: c_int, events: *mut epoll_event, maxevents: c_int, timeout: c_int) -> c_int;
    |next| {
        wait(epfd, events, maxevents, || ms_to_deadline(timeout), std::ptr::null(), next)
    }

    /// epoll_pwait(2).
    fn epoll_pwait(epfd: c_int, events: *mut epoll_event, maxevents: c_int, timeout: c_int, mask: *const sigset_t) -> c_int;
    |next| {
        wait(epfd, events, maxevents, || ms_to_deadline(timeout), mask, next)
    }

    /// epoll_pwait2(2): a timespec timeout.
    fn epoll_pwait2(epfd: c_int, events: *mut epoll_event, maxevents: c_int, timeout: *const timespec, mask: *const sigset_t) -> c_int;
        fallback(crate::sys::sys_call!(libc::SYS_epoll_pwait2, epfd, events, maxevents, timeout, mask, 8usize) as c_int)
    |next| {
        if !timeout.is_null() && tracked_epoll(epfd).as_deref().and_then(set_of).is_some() {
            // SAFETY: non-null caller timespec.
            let t = unsafe { *timeout };
            if t.tv_sec < 0 || !(0..1_000_000_000).contains(&t.tv_nsec) {
                sys::set_errno(libc::EINVAL);
                return -1;
            }
        }
        let deadline = || {
            if timeout.is_null() {
                return None;
            }
            // SAFETY: non-null caller timespec, checked valid above or by
            // the kernel.
            let t = unsafe { *timeout };
            let ns = t.tv_sec.max(0) as u64 * 1_000_000_000 + t.tv_nsec.clamp(0, 999_999_999) as u64;
            Some(deadline_after(ns).unwrap_or_else(sys::monotonic_ns))
        };
        wait(epfd, events, maxevents, deadline, mask, next)
    }
}
