//! Socket lifecycle and option hooks: socket, bind, listen, accept,
//! accept4, connect, shutdown, getsockopt, setsockopt, getpeername,
//! getsockname.

use libc::{c_int, c_void, sockaddr, socklen_t};

use super::define::hooks;
use crate::attached::Errno;
use crate::fdtable::{self, Kind};
use crate::interpose::guard;
use crate::{lifecycle, sockaddr as addr, sys};

/// A ring-attached fd that the calling code is not the shim itself.
#[inline]
fn ring(fd: c_int) -> Option<fdtable::FdRef> {
    fdtable::attached(fd).filter(|_| !guard::active())
}

/// Parses a struct timeval option value into ns (0 = no timeout).
///
/// # Safety
/// `val` is null or valid for `len` bytes.
unsafe fn timeval_ns(val: *const c_void, len: socklen_t) -> Option<u64> {
    if val.is_null() || (len as usize) < std::mem::size_of::<libc::timeval>() {
        return None;
    }
    // SAFETY: len covers a timeval (checked above); unaligned-safe read.
    let tv = unsafe { std::ptr::read_unaligned(val.cast::<libc::timeval>()) };
    if tv.tv_sec < 0 || tv.tv_usec < 0 {
        return None;
    }
    Some(
        (tv.tv_sec as u64)
            .saturating_mul(1_000_000_000)
            .saturating_add(tv.tv_usec as u64 * 1000),
    )
}

hooks! {
    /// Tracks AF_INET/AF_INET6 TCP sockets as ring candidates.
    fn socket(domain: c_int, ty: c_int, protocol: c_int) -> c_int;
    |next| {
        let fd = next();
        if fd >= 0 && lifecycle::is_tcp(domain, ty, protocol) {
            lifecycle::on_new_socket(fd, domain, ty);
        }
        fd
    }

    /// Pass-through: the kernel socket keeps its own address.
    fn bind(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int;
    |next| {
        next()
    }

    /// Marks a tracked socket as a listener: what it accepts is tracked.
    fn listen(fd: c_int, backlog: c_int) -> c_int;
    |next| {
        let r = next();
        if r == 0 && fdtable::is_tracked(fd) && !guard::active() {
            if let Some(st) = fdtable::get(fd) {
                st.set_listener();
                lifecycle::on_listen(fd, &st);
            }
        }
        r
    }

    /// Accepted connections of a tracked listener become candidates.
    fn accept(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int;
        fallback(crate::sys::sys_call!(libc::SYS_accept, fd, addr, len) as c_int)
    |next| {
        let cap = capacity(len);
        let nfd = next();
        after_accept(fd, nfd, 0, addr, len, cap);
        nfd
    }

    /// As accept; SOCK_NONBLOCK is mirrored into the new socket's state.
    fn accept4(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t, flags: c_int) -> c_int;
    |next| {
        let cap = capacity(len);
        let nfd = next();
        after_accept(fd, nfd, flags, addr, len, cap);
        nfd
    }

    /// The point where a ring may be attached to an outgoing connection.
    fn connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int;
    |next| {
        // A socket decided already (a second connect on a non-blocking
        // one, which asks how the first went) takes no reference.
        let Some(st) = fdtable::get_if(fd, |s| s.kind() == Some(Kind::Tcp) && s.is_preconnect()) else {
            return next();
        };
        if guard::active() {
            return next();
        }
        // SAFETY: addr/len come from the caller with connect's contract.
        let dest = unsafe { addr::to_std(addr, len) };
        let mut real = || {
            // SAFETY: our caller's own arguments, valid for the whole hook
            // call, which this closure does not outlive (the attacher only
            // borrows it); connect's contract allows the one call the
            // attacher makes (Attacher::connect).
            if unsafe { connect::next(fd, addr, len) } == 0 {
                Ok(())
            } else {
                Err(Errno(sys::errno()))
            }
        };
        match lifecycle::connect(fd, &st, dest, &mut real) {
            Ok(()) => 0,
            Err(Errno(e)) => {
                sys::set_errno(e);
                -1
            }
        }
    }

    /// Ring: mirrored as end-of-stream by the connection.
    fn shutdown(fd: c_int, how: c_int) -> c_int;
    |next| {
        if let Some(st) = ring(fd) {
            if let Some(conn) = st.conn() {
                let _g = guard::enter();
                return match conn.shutdown(fd, how) {
                    Ok(()) => 0,
                    Err(Errno(e)) => {
                        sys::set_errno(e);
                        -1
                    }
                };
            }
        }
        next()
    }

    /// Ring: SO_ERROR comes from the connection, and TCP_INFO's state from
    /// the ring's end-of-stream marks; a listener's TCP_DEFER_ACCEPT from
    /// the shim (lifecycle/defer_accept.rs); the rest from the kernel
    /// socket underneath.
    fn getsockopt(fd: c_int, level: c_int, name: c_int, val: *mut c_void, len: *mut socklen_t) -> c_int;
    |next| {
        // SAFETY: val and len come from the program, per getsockopt's contract.
        if let Some(r) = unsafe { lifecycle::defer_accept::get(fd, level, name, val, len) } {
            return r;
        }
        if level == libc::SOL_SOCKET && name == libc::SO_ERROR && !val.is_null() && !len.is_null() {
            let ring_err = ring(fd).and_then(|st| st.conn().map(|c| c.take_error()));
            if let Some(e) = ring_err.filter(|&e| e != 0) {
                // SAFETY: len is valid per getsockopt's contract.
                if (unsafe { *len } as usize) < std::mem::size_of::<c_int>() {
                    sys::set_errno(libc::EINVAL);
                    return -1;
                }
                // SAFETY: val has room for an int (checked above).
                unsafe {
                    std::ptr::write_unaligned(val.cast::<c_int>(), e);
                    *len = std::mem::size_of::<c_int>() as socklen_t;
                }
                return 0;
            }
            // No ring error: the kernel socket's SO_ERROR is the answer.
        }
        let r = next();
        if r == 0 && level == libc::IPPROTO_TCP && name == libc::TCP_INFO && !val.is_null() && !len.is_null() {
            // SAFETY: len is valid per getsockopt's contract (just filled).
            let filled = unsafe { *len } as usize;
            if filled >= 1 {
                if let Some(state) = ring(fd).and_then(|st| st.conn().and_then(|c| c.tcp_state())) {
                    // SAFETY: the kernel filled at least one byte of val, the
                    // first of struct tcp_info: tcpi_state.
                    unsafe { val.cast::<u8>().write(state) };
                }
            }
        }
        r
    }

    /// Mirrors SO_RCVTIMEO/SO_SNDTIMEO of tracked sockets (ring waits honour
    /// them); everything also goes to the kernel socket, but a listener's
    /// TCP_DEFER_ACCEPT stays off there (lifecycle/defer_accept.rs).
    fn setsockopt(fd: c_int, level: c_int, name: c_int, val: *const c_void, len: socklen_t) -> c_int;
    |next| {
        // `keeps` looks at level and name first: other options cost two
        // compares.
        let keeper = lifecycle::defer_accept::keeps(fd, level, name).filter(|_| !guard::active());
        let r = next();
        if let (0, Some(st)) = (r, keeper) {
            lifecycle::defer_accept::set(fd, &st);
        }
        if r == 0 && level == libc::SOL_SOCKET && name == libc::SO_RCVLOWAT {
            if let Some(c) = ring(fd).as_ref().and_then(|st| st.conn()) {
                c.set_rcvlowat(sys::rcvlowat(fd));
            }
        }
        if r == 0
            && level == libc::SOL_SOCKET
            && (name == libc::SO_RCVTIMEO || name == libc::SO_SNDTIMEO)
            && fdtable::is_tracked(fd)
        {
            // SAFETY: the kernel just accepted val/len as a timeval.
            let ns = unsafe { timeval_ns(val, len) };
            if let (Some(st), Some(ns)) = (fdtable::get(fd), ns) {
                if name == libc::SO_RCVTIMEO {
                    st.set_timeouts(Some(ns), None);
                } else {
                    st.set_timeouts(None, Some(ns));
                }
            }
        }
        r
    }

    /// Pass-through: the kernel socket has the real 4-tuple.
    fn getpeername(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int;
    |next| {
        next()
    }

    /// Pass-through: the kernel socket has the real 4-tuple.
    fn getsockname(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int;
    |next| {
        next()
    }
}

/// The room the program gave accept for the peer's address (0: none).
fn capacity(len: *const socklen_t) -> socklen_t {
    if len.is_null() {
        0
    } else {
        // SAFETY: accept's contract: a non-null `len` points at the size
        // of the caller's `addr` buffer.
        unsafe { *len }
    }
}

/// The peer address accept wrote for the program, where it fit in the
/// `cap` bytes given (else the new socket is asked).
fn accepted_peer(
    addr: *const sockaddr,
    len: *const socklen_t,
    cap: socklen_t,
) -> Option<std::net::SocketAddr> {
    if addr.is_null() || cap == 0 {
        return None;
    }
    // SAFETY: accept succeeded, so it stored the address's full size in
    // `*len` and, where that is at most `cap`, the whole address in
    // `addr`.
    unsafe {
        let real = *len;
        if real > cap {
            return None;
        }
        addr::to_std(addr, real)
    }
}

fn after_accept(
    lfd: c_int,
    nfd: c_int,
    flags: c_int,
    addr: *const sockaddr,
    len: *const socklen_t,
    cap: socklen_t,
) {
    if nfd < 0 || !fdtable::is_tracked(lfd) {
        return;
    }
    if let Some(l) = fdtable::get(lfd).filter(|l| l.kind() == Some(Kind::Listener)) {
        let saved = sys::errno();
        let peer = accepted_peer(addr, len, cap);
        lifecycle::on_accepted(lfd, &l, nfd, flags, peer);
        sys::set_errno(saved);
    }
}
