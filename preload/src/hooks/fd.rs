//! fd lifetime hooks: close, close_range, closefrom, dup, dup2, dup3,
//! fcntl, fcntl64, ioctl.
//!
//! The shim's own descriptors are free numbers to the program (hidden.rs):
//! these hooks are the ones that tell its calls from the shim's
//! (`caller_hooks!`).
//!
//! Table changes are made only by the process that owns this memory
//! (`process::owns_memory`, which rules out a vfork child sharing it), and
//! in an order that keeps the table right under concurrency: a slot is
//! cleared *before* close releases the fd number (so a racing socket() that
//! gets the number cannot be clobbered), and set *after* dup2/dup3/F_DUPFD
//! succeeded (the target number stays occupied throughout).
//!
//! # Variadic functions
//! `fcntl(int, int, ...)` and `ioctl(int, unsigned long, ...)` are variadic
//! in C, and stable Rust cannot define a variadic function. They are defined
//! here with one fixed extra `usize` argument instead. That is sound on the
//! x86-64 System V and AArch64 Linux ABIs: a variadic caller passes the
//! first variadic argument in the same register as a fixed third argument
//! (rdx / x2), an int argument is passed in that register too (upper bits
//! unspecified, which is why F_SETFL/FIONBIO values are truncated to c_int
//! before use), and a caller that passes no third argument (F_GETFL) leaves
//! an unspecified but harmless value there that we only forward. Forwarding
//! to libc's variadic definition through a non-variadic pointer type is
//! likewise ABI-identical on these targets (on x86-64 `al` is only an upper
//! bound on vector registers used, and libc's fcntl/ioctl read none).

use libc::{c_int, c_uint, c_ulong};

use super::define::caller_hooks;
use super::hidden;
use crate::interpose::guard;
use crate::{fdspace, fdtable};
use crate::{log as shim_log, process, sys};

#[cfg(not(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
)))]
compile_error!("fcntl/ioctl hooks rely on the x86-64 or AArch64 Linux calling convention");

/// Makes `new` refer to what `old` refers to in the table (after a
/// successful dup-family call).
fn mirror_dup(old: c_int, new: c_int) {
    if !(fdtable::is_tracked(old) || fdtable::is_tracked(new)) || !process::owns_memory() {
        return;
    }
    match fdtable::get(old) {
        Some(st) => fdtable::install_dup(new, &st),
        None => fdtable::untrack(new),
    }
}

caller_hooks! {
    /// close(2): one of the shim's descriptors is a free number to the
    /// program (EBADF); otherwise untracks first, and an attached
    /// connection whose last fd this was is released (end-of-stream if
    /// this process owns it).
    fn close(fd: c_int) -> c_int as close_from; ret(rsi, x1);
    |next, program| {
        if fdspace::is_own(fd) {
            if hidden::hidden(fd, program) {
                return hidden::ebadf();
            }
            fdspace::disown(fd);
        }
        shim_log::on_fd_closed(fd);
        if fdtable::is_tracked(fd) && process::owns_memory() {
            let saved = sys::errno();
            fdtable::untrack(fd);
            sys::set_errno(saved);
        }
        next()
    }

    /// close_range(2): closes the pieces of the range around the shim's
    /// descriptors, untracking every tracked fd in it first (unless
    /// CLOSE_RANGE_CLOEXEC, which closes nothing now and leaves ours as
    /// they are: close-on-exec already).
    fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int as close_range_from;
        ret(rcx, x3);
        fallback(crate::sys::sys_call!(libc::SYS_close_range, first, last, flags) as c_int)
    |next, program| {
        let cloexec_only = flags as c_uint & libc::CLOSE_RANGE_CLOEXEC != 0;
        if !cloexec_only && first <= last && process::owns_memory() {
            shim_log::on_range_closed(first, last);
            fdtable::untrack_range(first, last);
        }
        if cloexec_only || first > last || fdspace::next_own(first, last).is_none() || !program() {
            return next();
        }
        hidden::around(first, last, |lo, hi| {
            // SAFETY: the program's call, narrowed to a piece of its range.
            unsafe { close_range::next(lo, hi, flags) }
        })
    }

    /// closefrom(3): as close_range up to the last number.
    fn closefrom(lowfd: c_int) -> () as closefrom_from; ret(rsi, x1);
        fallback({ crate::sys::sys_call!(libc::SYS_close_range, lowfd.max(0), c_uint::MAX, 0); })
    |next, program| {
        let lo = lowfd.max(0) as c_uint;
        if process::owns_memory() {
            shim_log::on_range_closed(lo, c_uint::MAX);
            fdtable::untrack_range(lo, c_uint::MAX);
        }
        let Some(mut top) = fdspace::next_own(lo, c_uint::MAX).filter(|_| program()) else {
            return next();
        };
        while let Some(fd) = fdspace::next_own(top as c_uint + 1, c_uint::MAX) {
            top = fd;
        }
        hidden::around(lo, top as c_uint, |a, b| {
            // SAFETY: the program's call, narrowed to a piece of its range.
            let r = unsafe { close_range::next(a, b, 0) };
            if r < 0 && sys::errno() == libc::ENOSYS {
                for fd in a..=b {
                    sys::close(fd as c_int);
                }
                return 0;
            }
            r
        });
        // SAFETY: the program's call, above the last descriptor of ours
        // (`around` closed the rest, `top` included if it was not ours).
        unsafe { closefrom::next(top + 1) }
    }

    /// dup(2): the new fd shares the state; a descriptor of the shim's is
    /// a free number to the program.
    fn dup(fd: c_int) -> c_int as dup_from; ret(rsi, x1);
    |next, program| {
        if hidden::hidden(fd, program) {
            return hidden::ebadf();
        }
        let r = next();
        if r >= 0 {
            mirror_dup(fd, r);
        }
        r
    }

    /// dup2(2): `new` now refers to `old`'s state; what `new` was is
    /// released as if closed. A descriptor of the shim's at `new` is moved
    /// away first (`hidden::make_room`).
    fn dup2(old: c_int, new: c_int) -> c_int as dup2_from; ret(rdx, x2);
        fallback(crate::sys::sys_call!(libc::SYS_dup2, old, new) as c_int)
    |next, program| {
        let moved = match hidden::before_dup(old, new, program) {
            Ok(m) => m,
            Err(r) => return r,
        };
        let r = next();
        hidden::after_dup(moved, new, r);
        if r >= 0 && old != new {
            shim_log::on_fd_replaced(new);
            mirror_dup(old, new);
        }
        r
    }

    /// dup3(2).
    fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int as dup3_from; ret(rcx, x3);
        fallback(crate::sys::sys_call!(libc::SYS_dup3, old, new, flags) as c_int)
    |next, program| {
        // dup3 onto itself is EINVAL, whatever the number: the kernel says so.
        let moved = match (old != new).then(|| hidden::before_dup(old, new, program)) {
            Some(Err(r)) => return r,
            Some(Ok(m)) => m,
            None => false,
        };
        let r = next();
        hidden::after_dup(moved, new, r);
        if r >= 0 {
            shim_log::on_fd_replaced(new);
            mirror_dup(old, new);
        }
        r
    }

    /// fcntl(2); see the module docs for the fixed third argument.
    fn fcntl(fd: c_int, cmd: c_int, arg: usize) -> c_int as fcntl_from; ret(rcx, x3);
    |next, program| {
        if hidden::hidden(fd, program) {
            return hidden::ebadf();
        }
        let r = next();
        after_fcntl(fd, cmd, arg, r);
        r
    }

    /// fcntl64: the name glibc's headers redirect fcntl to under
    /// _FILE_OFFSET_BITS=64 (glibc >= 2.28).
    fn fcntl64(fd: c_int, cmd: c_int, arg: usize) -> c_int as fcntl64_from; ret(rcx, x3);
        fallback(crate::sys::sys_call!(libc::SYS_fcntl, fd, cmd, arg) as c_int)
    |next, program| {
        if hidden::hidden(fd, program) {
            return hidden::ebadf();
        }
        let r = next();
        after_fcntl(fd, cmd, arg, r);
        r
    }

    /// ioctl(2): FIONBIO is mirrored; FIONREAD on a ring counts ring bytes.
    fn ioctl(fd: c_int, request: c_ulong, arg: usize) -> c_int as ioctl_from; ret(rcx, x3);
    |next, program| {
        if hidden::hidden(fd, program) {
            return hidden::ebadf();
        }
        if request == libc::FIONREAD && arg != 0 {
            if let Some(st) = fdtable::attached(fd).filter(|_| !guard::active()) {
                if let Some(conn) = st.conn() {
                    let n = conn.available().min(c_int::MAX as usize) as c_int;
                    // SAFETY: FIONREAD's argument is an int* per ioctl_tty(2);
                    // non-null checked above.
                    unsafe { std::ptr::write_unaligned(arg as *mut c_int, n) };
                    return 0;
                }
            }
        }
        if request == SIOCATMARK && arg != 0 {
            let mark = fdtable::attached(fd)
                .filter(|_| !guard::active())
                .and_then(|st| st.conn().and_then(|c| c.at_mark()));
            if let Some(m) = mark {
                // SAFETY: SIOCATMARK's argument is an int*; non-null
                // checked above.
                unsafe { std::ptr::write_unaligned(arg as *mut c_int, c_int::from(m)) };
                return 0;
            }
        }
        let r = next();
        if r == 0 && request == libc::FIONBIO && arg != 0 && fdtable::is_tracked(fd) {
            // SAFETY: FIONBIO's argument is a const int*; the kernel just
            // read it successfully.
            let on = unsafe { std::ptr::read_unaligned(arg as *const c_int) } != 0;
            mirror_nonblocking(fd, on);
        }
        r
    }
}

/// ioctl request: whether the read position is at the urgent mark
/// (asm-generic/sockios.h).
const SIOCATMARK: c_ulong = 0x8905;

fn after_fcntl(fd: c_int, cmd: c_int, arg: usize, r: c_int) {
    if r < 0 || !fdtable::is_tracked(fd) {
        return;
    }
    match cmd {
        libc::F_DUPFD | libc::F_DUPFD_CLOEXEC => {
            let saved = sys::errno();
            mirror_dup(fd, r);
            sys::set_errno(saved);
        }
        // The int argument arrives in the low 32 bits.
        libc::F_SETFL => mirror_nonblocking(fd, arg as c_int & libc::O_NONBLOCK != 0),
        _ => {}
    }
}

/// Mirrors O_NONBLOCK into the state of `fd`, where it is ever read: a
/// socket before its connect decision (the ring layer's connect) and a
/// ring's (its blocking calls, `dispatch::io`). A connection decided plain
/// TCP never gets a ring (one is attached only at connect or accept), so
/// its flag is never read and its fcntl takes no reference.
fn mirror_nonblocking(fd: c_int, on: bool) {
    if let Some(st) = fdtable::get_if(fd, |s| s.is_preconnect() || s.conn_attached()) {
        st.set_nonblocking(on);
    }
}
