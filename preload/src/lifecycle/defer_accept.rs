//! TCP_DEFER_ACCEPT on a listener that ring clients may reach.
//!
//! The option makes the kernel hold a connection back from accept until
//! data arrives on it. A ring client sends its first bytes into the ring,
//! never over TCP, so the kernel would hold its connection until the client
//! gave up waiting for the server's claim (RINGSOCK_CLAIM_WAIT_MS) and
//! resent them over TCP: every connection to apache (which sets the option
//! on Linux by default) or to nginx's `listen ... deferred` would cost a
//! claim wait and end on TCP. So the shim keeps the program's value itself
//! (as the kernel would report it) and leaves the kernel socket's off; an
//! accept may then return a connection whose first bytes are still coming,
//! which the option never promised against (its timeout hands over such
//! connections too). The kernel socket never gets it back: other processes
//! (forked workers, an exec'ed image that inherited it) may share the
//! listener with this one, whose ring clients it would hold back again.

use libc::{c_int, c_void, socklen_t};

use crate::fdtable::{self, FdRef, Kind};
use crate::{attached, config, process, sockaddr};

const INT_LEN: socklen_t = std::mem::size_of::<c_int>() as socklen_t;

fn is_option(level: c_int, name: c_int) -> bool {
    level == libc::IPPROTO_TCP && name == libc::TCP_DEFER_ACCEPT
}

/// The socket whose TCP_DEFER_ACCEPT the shim keeps in place of the
/// kernel's: a listener, or a socket not yet connected nor listening,
/// whose port may get rings (a port the filters exclude never does).
fn keeper(fd: c_int) -> Option<FdRef> {
    if process::sandbox_begun() || !process::owns_memory() || attached::attacher().is_none() {
        return None;
    }
    let st = fdtable::get(fd)?;
    let eligible = match st.kind() {
        Some(Kind::Listener) => true,
        Some(Kind::Tcp) => st.is_preconnect() && !st.conn_attached(),
        _ => false,
    };
    if !eligible {
        return None;
    }
    let port = sockaddr::query(fd, false).map_or(0, |a| a.port());
    (port == 0 || config::get().allows_port(port).is_ok()).then_some(st)
}

/// Sets the kernel socket's TCP_DEFER_ACCEPT to `v` seconds.
fn set_kernel(fd: c_int, v: c_int) -> c_int {
    // SAFETY: v is an int of ours, passed with its size.
    unsafe {
        crate::real::setsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_DEFER_ACCEPT,
            (&v as *const c_int).cast::<c_void>(),
            INT_LEN,
        )
    }
}

/// The socket state to keep TCP_DEFER_ACCEPT in, when setsockopt(level,
/// name) on `fd` sets that option on a socket whose value the shim keeps;
/// the caller passes the call to the kernel, then to `set` if it succeeded.
pub fn keeps(fd: c_int, level: c_int, name: c_int) -> Option<FdRef> {
    if is_option(level, name) {
        keeper(fd)
    } else {
        None
    }
}

/// The kernel just took the program's TCP_DEFER_ACCEPT on `fd` (it judged
/// the value, EINVAL for a short one, and stored it as seconds rounded up
/// to its retransmission steps): keep what it stored, and turn the kernel
/// socket's off.
pub fn set(fd: c_int, st: &FdRef) {
    let saved = crate::sys::errno();
    let kept =
        crate::sys::getsockopt_int(fd, libc::IPPROTO_TCP, libc::TCP_DEFER_ACCEPT).unwrap_or(0);
    if kept != 0 && set_kernel(fd, 0) == 0 {
        st.set_defer_accept(kept);
    } else {
        st.set_defer_accept(0);
    }
    crate::sys::set_errno(saved);
}

/// getsockopt(level, name) on `fd`: the kept value, written as the kernel
/// writes an int option (at most `*len` bytes of it, `*len` set to what
/// was written); `None` when the kernel answers.
///
/// # Safety
/// `val` and `len` as getsockopt's contract asks (checked for null).
pub unsafe fn get(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *mut c_void,
    len: *mut socklen_t,
) -> Option<c_int> {
    if !is_option(level, name) || val.is_null() || len.is_null() || !fdtable::is_tracked(fd) {
        return None;
    }
    let kept = fdtable::get(fd)?.defer_accept();
    if kept == 0 {
        return None;
    }
    // SAFETY: len is valid per the contract (non-null, checked above).
    let n = unsafe { *len }.min(INT_LEN);
    // SAFETY: val has room for `*len` bytes per the contract, and n is no
    // more than that nor than the int's size.
    unsafe {
        std::ptr::copy_nonoverlapping(
            (&kept as *const c_int).cast::<u8>(),
            val.cast::<u8>(),
            n as usize,
        );
        *len = n;
    }
    Some(0)
}
