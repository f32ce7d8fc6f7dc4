//! Handing an instance's ring registrations back to the kernel, for a
//! process whose connections all left their rings and which from now on
//! waits in the kernel alone (a seccomp sandbox: lifecycle::enter_sandbox).

use libc::{c_int, epoll_event};

use super::{set_of, Inner, Reg, ONESHOT};
use crate::fdtable::{self, FdState};
use crate::real;

/// Puts every ring registration of epoll instance `epfd` (state `st`) into
/// the kernel instance itself, with the program's events and data, and
/// takes the private set out of it, so that the program's epoll_wait,
/// passed straight to the kernel, reports them. Registrations whose file
/// was closed meanwhile are not carried over, as the kernel drops them.
pub fn hand_to_kernel(epfd: c_int, st: &FdState) {
    let Some(set) = set_of(st) else {
        return;
    };
    let mut inner = set.lock();
    if inner.in_program {
        // SAFETY: removing our own fd from the program's instance.
        unsafe {
            real::epoll_ctl(
                epfd,
                libc::EPOLL_CTL_DEL,
                inner.private,
                std::ptr::null_mut(),
            )
        };
        inner.in_program = false;
    }
    let Inner { regs, .. } = &mut *inner;
    for r in regs.values() {
        if fdtable::get(r.fd).is_some_and(|now| now.same(&r.st)) {
            add(epfd, r);
        }
    }
}

/// The kernel registration equal to `r`. A disabled EPOLLONESHOT one goes
/// in without interest (the kernel then reports only an error or hangup,
/// once, where it would report nothing until EPOLL_CTL_MOD).
fn add(epfd: c_int, r: &Reg) {
    let events = if r.disabled {
        r.events & super::MODE_BITS | ONESHOT
    } else {
        r.events
    };
    let mut ev = epoll_event {
        events,
        u64: r.data,
    };
    for op in [libc::EPOLL_CTL_ADD, libc::EPOLL_CTL_MOD] {
        // SAFETY: ev is valid for the call; fd is the program's, still
        // open on the file it registered.
        if unsafe { real::epoll_ctl(epfd, op, r.fd, &mut ev) } == 0 {
            return;
        }
        // Already in the kernel instance (registered before its ring was
        // attached): the registration the program made last is ours.
        if crate::sys::errno() != libc::EEXIST {
            break;
        }
    }
    log::warn!(
        "fd {}: cannot register it in epoll fd {epfd} (errno {}); its events are lost",
        r.fd,
        crate::sys::errno()
    );
}
