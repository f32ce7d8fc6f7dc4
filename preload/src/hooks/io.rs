//! Data hooks: read, write, readv, writev, recv, send, recvfrom, sendto,
//! recvmsg, sendmsg, recvmmsg, sendmmsg, sendfile, sendfile64 and the
//! fortified __read_chk, __recv_chk, __recvfrom_chk.
//!
//! Each one asks `fdtable::attached(fd)` first: for every fd without a ring
//! that is one relaxed load of the slot (two for a tracked plain-TCP
//! socket) and then libc. Ring fds go to `dispatch::io`.

use std::io::{IoSlice, IoSliceMut};

use libc::{
    c_int, c_uint, c_void, iovec, mmsghdr, msghdr, off64_t, off_t, size_t, sockaddr, socklen_t,
    ssize_t,
};

use super::define::hooks;
use crate::dispatch::io as ring_io;
use crate::fdtable::{self, FdRef};
use crate::interpose::guard;
use crate::sys;

#[inline]
fn ring(fd: c_int) -> Option<FdRef> {
    fdtable::attached(fd).filter(|_| !guard::active())
}

fn fail(e: c_int) -> ssize_t {
    sys::set_errno(e);
    -1
}

/// One user buffer as an IoSliceMut; None if it is null but non-empty.
///
/// # Safety
/// `buf` is null or valid for writes of `len` bytes for `'a`.
unsafe fn buf_mut<'a>(buf: *mut c_void, len: size_t) -> Option<IoSliceMut<'a>> {
    if len == 0 {
        return Some(IoSliceMut::new(&mut []));
    }
    if buf.is_null() {
        return None;
    }
    // SAFETY: non-null and valid for len bytes per the caller.
    Some(IoSliceMut::new(unsafe {
        std::slice::from_raw_parts_mut(buf.cast::<u8>(), len)
    }))
}

/// One user buffer as an IoSlice; None if it is null but non-empty.
///
/// # Safety
/// `buf` is null or valid for reads of `len` bytes for `'a`.
unsafe fn buf_ref<'a>(buf: *const c_void, len: size_t) -> Option<IoSlice<'a>> {
    if len == 0 {
        return Some(IoSlice::new(&[]));
    }
    if buf.is_null() {
        return None;
    }
    // SAFETY: non-null and valid for len bytes per the caller.
    Some(IoSlice::new(unsafe {
        std::slice::from_raw_parts(buf.cast::<u8>(), len)
    }))
}

/// A user iovec array as IoSliceMuts (std guarantees IoSliceMut is
/// ABI-compatible with struct iovec on Unix).
///
/// # Safety
/// `iov` is valid for `cnt` iovecs whose buffers are valid for `'a`.
unsafe fn iov_mut<'a>(iov: *const iovec, cnt: c_int) -> Result<&'a mut [IoSliceMut<'a>], c_int> {
    if !(0..=libc::UIO_MAXIOV).contains(&cnt) {
        return Err(libc::EINVAL);
    }
    if cnt == 0 {
        return Ok(&mut []);
    }
    if iov.is_null() {
        return Err(libc::EFAULT);
    }
    // SAFETY: iov is valid for cnt entries per the caller.
    let raw = unsafe { std::slice::from_raw_parts(iov, cnt as usize) };
    if raw.iter().any(|v| v.iov_len > 0 && v.iov_base.is_null()) {
        return Err(libc::EFAULT);
    }
    // SAFETY: per the caller, and no entry is a null non-empty buffer; the
    // cast relies on std's ABI guarantee.
    Ok(unsafe { std::slice::from_raw_parts_mut(iov as *mut IoSliceMut<'a>, cnt as usize) })
}

/// As `iov_mut`, read-only.
///
/// # Safety
/// As `iov_mut`.
unsafe fn iov_ref<'a>(iov: *const iovec, cnt: c_int) -> Result<&'a [IoSlice<'a>], c_int> {
    if !(0..=libc::UIO_MAXIOV).contains(&cnt) {
        return Err(libc::EINVAL);
    }
    if cnt == 0 {
        return Ok(&[]);
    }
    if iov.is_null() {
        return Err(libc::EFAULT);
    }
    // SAFETY: iov is valid for cnt entries per the caller.
    let raw = unsafe { std::slice::from_raw_parts(iov, cnt as usize) };
    if raw.iter().any(|v| v.iov_len > 0 && v.iov_base.is_null()) {
        return Err(libc::EFAULT);
    }
    // SAFETY: as above; IoSlice is ABI-compatible with iovec.
    Ok(unsafe { std::slice::from_raw_parts(iov as *const IoSlice<'a>, cnt as usize) })
}

/// recv into one buffer on a ring fd.
///
/// # Safety
/// `buf` valid for `len` bytes.
unsafe fn ring_recv1(
    fd: c_int,
    st: &FdRef,
    buf: *mut c_void,
    len: size_t,
    flags: c_int,
) -> ssize_t {
    // SAFETY: per the caller.
    match unsafe { buf_mut(buf, len) } {
        Some(b) => ring_io::recv(fd, st, &mut [b], flags),
        None => fail(libc::EFAULT),
    }
}

/// send from one buffer on a ring fd.
///
/// # Safety
/// `buf` valid for `len` bytes.
unsafe fn ring_send1(
    fd: c_int,
    st: &FdRef,
    buf: *const c_void,
    len: size_t,
    flags: c_int,
) -> ssize_t {
    // SAFETY: per the caller.
    match unsafe { buf_ref(buf, len) } {
        Some(b) => ring_io::send(fd, st, &[b], flags),
        None => fail(libc::EFAULT),
    }
}

/// The address out-parameter of a read on a connected TCP socket: TCP
/// gives none (the length comes back 0, the buffer untouched).
///
/// # Safety
/// `len` is null or valid, as for recvfrom.
unsafe fn no_address(len: *mut socklen_t) {
    if !len.is_null() {
        // SAFETY: per the caller.
        unsafe { *len = 0 };
    }
}

/// Flags that are about the kernel socket itself, not the byte stream:
/// urgent data (sent only after the connection left the ring, so it is
/// always on the kernel socket) and the error queue.
fn kernel_flags(flags: c_int) -> bool {
    flags & (libc::MSG_OOB | libc::MSG_ERRQUEUE) != 0
}

/// Urgent data must go out on the kernel socket, after every byte sent
/// before it: the connection leaves the ring first. True when the call
/// may go to the kernel.
fn ready_for_oob(st: &FdRef) -> bool {
    let _g = guard::enter();
    st.conn().is_some_and(|c| c.leave_ring(false))
}

/// Descriptors a sendmsg passes (SCM_RIGHTS) leave the ring first: the
/// process that receives them reads and writes the kernel socket.
///
/// # Safety
/// `msg` is null or valid as for sendmsg.
unsafe fn leave_passed(msg: *const msghdr) {
    if msg.is_null() || fdtable::rings_alive() == 0 {
        return;
    }
    // SAFETY: msg valid per the caller.
    let m = unsafe { &*msg };
    if m.msg_control.is_null() || m.msg_controllen < std::mem::size_of::<libc::cmsghdr>() {
        return;
    }
    let mut fds = Vec::new();
    // SAFETY: the control buffer is the caller's, walked with the CMSG
    // macros' bounds.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(m);
        while !c.is_null() {
            let h = &*c;
            if h.cmsg_level == libc::SOL_SOCKET && h.cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c).cast::<c_int>();
                let n = (h.cmsg_len as usize).saturating_sub(libc::CMSG_LEN(0) as usize)
                    / std::mem::size_of::<c_int>();
                for i in 0..n {
                    fds.push(std::ptr::read_unaligned(data.add(i)));
                }
            }
            c = libc::CMSG_NXTHDR(m, c);
        }
    }
    crate::lifecycle::leave_rings(&fds);
}

/// recvmsg on a ring fd: no ancillary data and no truncation on a stream.
///
/// # Safety
/// `msg` valid as for recvmsg.
unsafe fn ring_recvmsg(fd: c_int, st: &FdRef, msg: *mut msghdr, flags: c_int) -> ssize_t {
    if msg.is_null() {
        return fail(libc::EFAULT);
    }
    // SAFETY: msg valid per the caller.
    let m = unsafe { &mut *msg };
    // SAFETY: msg_iov/msg_iovlen describe the caller's buffers.
    let bufs = match unsafe { iov_mut(m.msg_iov, m.msg_iovlen as c_int) } {
        Ok(b) => b,
        Err(e) => return fail(e),
    };
    let r = ring_io::recv(fd, st, bufs, flags);
    if r >= 0 {
        m.msg_controllen = 0;
        m.msg_flags = 0;
        m.msg_namelen = 0;
    }
    r
}

/// sendmsg on a ring fd (msg_name is ignored on a connected stream socket,
/// as TCP does; ancillary data has no meaning on a ring).
///
/// # Safety
/// `msg` valid as for sendmsg.
unsafe fn ring_sendmsg(fd: c_int, st: &FdRef, msg: *const msghdr, flags: c_int) -> ssize_t {
    if msg.is_null() {
        return fail(libc::EFAULT);
    }
    // SAFETY: msg valid per the caller.
    let m = unsafe { &*msg };
    // SAFETY: msg_iov/msg_iovlen describe the caller's buffers.
    match unsafe { iov_ref(m.msg_iov, m.msg_iovlen as c_int) } {
        Ok(b) => ring_io::send(fd, st, b, flags),
        Err(e) => fail(e),
    }
}

/// sendfile with a ring as `out`: read from `in_fd` (a file) and send.
///
/// # Safety
/// `offset` null or valid.
unsafe fn ring_sendfile(
    out: c_int,
    st: &FdRef,
    in_fd: c_int,
    offset: *mut off64_t,
    count: size_t,
) -> ssize_t {
    let mut buf = vec![0u8; count.min(64 * 1024)];
    let mut done = 0usize;
    let mut pos = if offset.is_null() {
        None
    } else {
        // SAFETY: offset is valid per the caller, and not null.
        Some(unsafe { *offset })
    };
    while done < count {
        let want = (count - done).min(buf.len());
        // SAFETY: buf has want bytes of room; libc's read/pread, never ours.
        let n = unsafe {
            match pos {
                Some(p) => libc::pread64(in_fd, buf.as_mut_ptr().cast(), want, p),
                None => crate::real::read(in_fd, buf.as_mut_ptr().cast(), want),
            }
        };
        if n < 0 {
            if done > 0 {
                break;
            }
            return -1;
        }
        if n == 0 {
            break;
        }
        let s = ring_io::send(out, st, &[IoSlice::new(&buf[..n as usize])], 0);
        if s < 0 {
            if done > 0 {
                break;
            }
            return -1;
        }
        done += s as usize;
        if let Some(p) = pos.as_mut() {
            *p += s as off64_t;
        }
        if (s as usize) < n as usize {
            // Short send (non-blocking ring full): report what went, and
            // give back the unsent tail of a non-offset read.
            if pos.is_none() {
                // SAFETY: lseek on the caller's input fd; not interposed.
                unsafe { libc::lseek64(in_fd, s as off64_t - n as off64_t, libc::SEEK_CUR) };
            }
            break;
        }
    }
    if let Some(p) = pos {
        // SAFETY: offset non-null (pos is Some only then).
        unsafe { *offset = p };
    }
    done as ssize_t
}

hooks! {
    /// read(2).
    fn read(fd: c_int, buf: *mut c_void, count: size_t) -> ssize_t;
    |next| {
        if let Some(st) = ring(fd) {
            if count == 0 {
                // A socket's zero-byte read(2) returns at once (recv(2)'s
                // waits).
                return 0;
            }
            // SAFETY: caller's buffer contract.
            return unsafe { ring_recv1(fd, &st, buf, count, 0) };
        }
        next()
    }

    /// write(2).
    fn write(fd: c_int, buf: *const c_void, count: size_t) -> ssize_t;
    |next| {
        if let Some(st) = ring(fd) {
            // SAFETY: caller's buffer contract.
            return unsafe { ring_send1(fd, &st, buf, count, 0) };
        }
        next()
    }

    /// readv(2).
    fn readv(fd: c_int, iov: *const iovec, iovcnt: c_int) -> ssize_t;
    |next| {
        if let Some(st) = ring(fd) {
            // SAFETY: caller's iovec contract.
            return match unsafe { iov_mut(iov, iovcnt) } {
                // A socket's zero-byte readv(2) returns at once.
                Ok(b) if b.iter().all(|b| b.is_empty()) => 0,
                Ok(b) => ring_io::recv(fd, &st, b, 0),
                Err(e) => fail(e),
            };
        }
        next()
    }

    /// writev(2).
    fn writev(fd: c_int, iov: *const iovec, iovcnt: c_int) -> ssize_t;
    |next| {
        if let Some(st) = ring(fd) {
            // SAFETY: caller's iovec contract.
            return match unsafe { iov_ref(iov, iovcnt) } {
                Ok(b) => ring_io::send(fd, &st, b, 0),
                Err(e) => fail(e),
            };
        }
        next()
    }

    /// recv(2).
    fn recv(fd: c_int, buf: *mut c_void, len: size_t, flags: c_int) -> ssize_t;
    |next| {
        if let Some(st) = ring(fd).filter(|_| !kernel_flags(flags)) {
            // SAFETY: caller's buffer contract.
            return unsafe { ring_recv1(fd, &st, buf, len, flags) };
        }
        next()
    }

    /// send(2).
    fn send(fd: c_int, buf: *const c_void, len: size_t, flags: c_int) -> ssize_t;
    |next| {
        if let Some(st) = ring(fd).filter(|st| flags & libc::MSG_OOB == 0 || !ready_for_oob(st)) {
            // SAFETY: caller's buffer contract.
            return unsafe { ring_send1(fd, &st, buf, len, flags) };
        }
        next()
    }

    /// recvfrom(2); on a ring the address is the kernel socket's peer.
    fn recvfrom(fd: c_int, buf: *mut c_void, len: size_t, flags: c_int, addr: *mut sockaddr, alen: *mut socklen_t) -> ssize_t;
        fallback(crate::sys::sys_call!(libc::SYS_recvfrom, fd, buf, len, flags, addr, alen) as ssize_t)
    |next| {
        if let Some(st) = ring(fd).filter(|_| !kernel_flags(flags)) {
            // SAFETY: caller's buffer contract.
            let r = unsafe { ring_recv1(fd, &st, buf, len, flags) };
            if r >= 0 {
                // SAFETY: caller's address contract.
                unsafe { no_address(alen) };
            }
            return r;
        }
        next()
    }

    /// sendto(2); the address is ignored on a connected ring, as on TCP.
    fn sendto(fd: c_int, buf: *const c_void, len: size_t, flags: c_int, addr: *const sockaddr, alen: socklen_t) -> ssize_t;
        fallback(crate::sys::sys_call!(libc::SYS_sendto, fd, buf, len, flags, addr, alen) as ssize_t)
    |next| {
        if let Some(st) = ring(fd).filter(|st| flags & libc::MSG_OOB == 0 || !ready_for_oob(st)) {
            // SAFETY: caller's buffer contract.
            return unsafe { ring_send1(fd, &st, buf, len, flags) };
        }
        next()
    }

    /// recvmsg(2).
    fn recvmsg(fd: c_int, msg: *mut msghdr, flags: c_int) -> ssize_t;
    |next| {
        if let Some(st) = ring(fd).filter(|_| !kernel_flags(flags)) {
            // SAFETY: caller's msghdr contract.
            return unsafe { ring_recvmsg(fd, &st, msg, flags) };
        }
        next()
    }

    /// sendmsg(2).
    fn sendmsg(fd: c_int, msg: *const msghdr, flags: c_int) -> ssize_t;
    |next| {
        if let Some(st) = ring(fd).filter(|st| flags & libc::MSG_OOB == 0 || !ready_for_oob(st)) {
            // SAFETY: caller's msghdr contract.
            return unsafe { ring_sendmsg(fd, &st, msg, flags) };
        }
        if !guard::active() {
            // SAFETY: caller's msghdr contract.
            unsafe { leave_passed(msg) };
        }
        next()
    }

    /// recvmmsg(2): on a ring, one recvmsg per entry; MSG_WAITFORONE makes
    /// entries after the first non-blocking; the timeout is checked after
    /// each entry, as the kernel does.
    fn recvmmsg(fd: c_int, vec: *mut mmsghdr, vlen: c_uint, flags: c_int, timeout: *mut libc::timespec) -> c_int;
        fallback(crate::sys::sys_call!(libc::SYS_recvmmsg, fd, vec, vlen, flags, timeout) as c_int)
    |next| {
        if let Some(st) = ring(fd) {
            if vec.is_null() {
                return fail(libc::EFAULT) as c_int;
            }
            let start = sys::monotonic_ns();
            // SAFETY: caller's timespec, if any.
            let limit = (!timeout.is_null()).then(|| unsafe { *timeout })
                .map(|t| t.tv_sec.max(0) as u64 * 1_000_000_000 + t.tv_nsec.max(0) as u64);
            let mut done = 0u32;
            let mut fl = flags & !libc::MSG_WAITFORONE;
            while done < vlen.min(libc::UIO_MAXIOV as c_uint) {
                // SAFETY: vec has vlen entries per the caller.
                let e = unsafe { &mut *vec.add(done as usize) };
                // SAFETY: the entry's msghdr is the caller's.
                let r = unsafe { ring_recvmsg(fd, &st, &mut e.msg_hdr, fl) };
                if r < 0 {
                    if done == 0 {
                        return -1;
                    }
                    break;
                }
                e.msg_len = r as c_uint;
                done += 1;
                if r == 0 {
                    break;
                }
                if flags & libc::MSG_WAITFORONE != 0 {
                    fl |= libc::MSG_DONTWAIT;
                }
                if limit.is_some_and(|l| sys::monotonic_ns() - start >= l) {
                    break;
                }
            }
            return done as c_int;
        }
        next()
    }

    /// sendmmsg(2): on a ring, one sendmsg per entry.
    fn sendmmsg(fd: c_int, vec: *mut mmsghdr, vlen: c_uint, flags: c_int) -> c_int;
        fallback(crate::sys::sys_call!(libc::SYS_sendmmsg, fd, vec, vlen, flags) as c_int)
    |next| {
        if let Some(st) = ring(fd) {
            if vec.is_null() {
                return fail(libc::EFAULT) as c_int;
            }
            let mut done = 0u32;
            while done < vlen.min(libc::UIO_MAXIOV as c_uint) {
                // SAFETY: vec has vlen entries per the caller.
                let e = unsafe { &mut *vec.add(done as usize) };
                // SAFETY: the entry's msghdr is the caller's.
                let r = unsafe { ring_sendmsg(fd, &st, &e.msg_hdr, flags) };
                if r < 0 {
                    if done == 0 {
                        return -1;
                    }
                    break;
                }
                e.msg_len = r as c_uint;
                done += 1;
            }
            return done as c_int;
        }
        next()
    }

    /// sendfile(2) (64-bit off_t on LP64).
    fn sendfile(out_fd: c_int, in_fd: c_int, offset: *mut off_t, count: size_t) -> ssize_t;
        fallback(crate::sys::sys_call!(libc::SYS_sendfile, out_fd, in_fd, offset, count) as ssize_t)
    |next| {
        if let Some(st) = ring(out_fd) {
            // SAFETY: off_t and off64_t are the same type on LP64 Linux.
            return unsafe { ring_sendfile(out_fd, &st, in_fd, offset.cast(), count) };
        }
        next()
    }

    /// sendfile64: what programs built with _FILE_OFFSET_BITS=64 call.
    fn sendfile64(out_fd: c_int, in_fd: c_int, offset: *mut off64_t, count: size_t) -> ssize_t;
        fallback(crate::sys::sys_call!(libc::SYS_sendfile, out_fd, in_fd, offset, count) as ssize_t)
    |next| {
        if let Some(st) = ring(out_fd) {
            // SAFETY: caller's offset contract.
            return unsafe { ring_sendfile(out_fd, &st, in_fd, offset, count) };
        }
        next()
    }

    /// Fortified read: libc's version calls its internal read, bypassing
    /// our `read`, so ring fds must be caught here.
    fn __read_chk(fd: c_int, buf: *mut c_void, nbytes: size_t, buflen: size_t) -> ssize_t;
        fallback(chk_fallback(nbytes, buflen, || crate::sys::sys_call!(libc::SYS_read, fd, buf, nbytes) as ssize_t))
    |next| {
        if nbytes <= buflen {
            if let Some(st) = ring(fd) {
                // SAFETY: caller's buffer contract.
                return unsafe { ring_recv1(fd, &st, buf, nbytes, 0) };
            }
        }
        next()
    }

    /// Fortified recv.
    fn __recv_chk(fd: c_int, buf: *mut c_void, len: size_t, buflen: size_t, flags: c_int) -> ssize_t;
        fallback(chk_fallback(len, buflen, || crate::sys::sys_call!(libc::SYS_recvfrom, fd, buf, len, flags, 0usize, 0usize) as ssize_t))
    |next| {
        if len <= buflen {
            if let Some(st) = ring(fd).filter(|_| !kernel_flags(flags)) {
                // SAFETY: caller's buffer contract.
                return unsafe { ring_recv1(fd, &st, buf, len, flags) };
            }
        }
        next()
    }

    /// Fortified recvfrom.
    fn __recvfrom_chk(fd: c_int, buf: *mut c_void, len: size_t, buflen: size_t, flags: c_int, addr: *mut sockaddr, alen: *mut socklen_t) -> ssize_t;
        fallback(chk_fallback(len, buflen, || crate::sys::sys_call!(libc::SYS_recvfrom, fd, buf, len, flags, addr, alen) as ssize_t))
    |next| {
        if len <= buflen {
            if let Some(st) = ring(fd).filter(|_| !kernel_flags(flags)) {
                // SAFETY: caller's buffer contract.
                let r = unsafe { ring_recv1(fd, &st, buf, len, flags) };
                if r >= 0 {
                    // SAFETY: caller's address contract.
                    unsafe { no_address(alen) };
                }
                return r;
            }
        }
        next()
    }
}

/// The fortified functions' check, for the raw fallback: a read larger than
/// the destination buffer is a memory-safety bug in the program, and glibc
/// aborts in that case.
fn chk_fallback(len: size_t, buflen: size_t, call: impl FnOnce() -> ssize_t) -> ssize_t {
    if len > buflen {
        crate::log::always(format_args!("*** buffer overflow detected ***: terminated"));
        // SAFETY: abort never returns.
        unsafe { libc::abort() }
    }
    call()
}
