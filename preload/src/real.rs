//! libc's definitions of the interposed functions that the shim calls
//! itself: from inside the library, `libc::connect` would land in our own
//! hook. Each is the next definition after ours, resolved lazily through
//! dlsym, or the raw system call it wraps when dlsym finds nothing.
//!
//! The hooks of these functions forward here (hooks/define.rs); the hook
//! of any other function declares its next definition in place. `fcntl`
//! and `ioctl` take their variadic third argument as a fixed `usize`
//! (hooks/fd.rs explains why that is sound).

use libc::{
    c_int, c_ulong, c_void, epoll_event, iovec, msghdr, nfds_t, pollfd, sigset_t, size_t, sockaddr,
    socklen_t, ssize_t, timespec,
};

use crate::interpose::libc_fns;

libc_fns! {
    fn socket(domain: c_int, ty: c_int, protocol: c_int) -> c_int;
        fallback(crate::sys::sys_call!(libc::SYS_socket, domain, ty, protocol) as c_int)
    fn bind(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int;
        fallback(crate::sys::sys_call!(libc::SYS_bind, fd, addr, len) as c_int)
    fn listen(fd: c_int, backlog: c_int) -> c_int;
        fallback(crate::sys::sys_call!(libc::SYS_listen, fd, backlog) as c_int)
    fn accept4(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t, flags: c_int) -> c_int;
        fallback(crate::sys::sys_call!(libc::SYS_accept4, fd, addr, len, flags) as c_int)
    fn connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int;
        fallback(crate::sys::sys_call!(libc::SYS_connect, fd, addr, len) as c_int)
    fn shutdown(fd: c_int, how: c_int) -> c_int;
        fallback(crate::sys::sys_call!(libc::SYS_shutdown, fd, how) as c_int)
    fn getsockopt(fd: c_int, level: c_int, name: c_int, val: *mut c_void, len: *mut socklen_t) -> c_int;
        fallback(crate::sys::sys_call!(libc::SYS_getsockopt, fd, level, name, val, len) as c_int)
    fn setsockopt(fd: c_int, level: c_int, name: c_int, val: *const c_void, len: socklen_t) -> c_int;
        fallback(crate::sys::sys_call!(libc::SYS_setsockopt, fd, level, name, val, len) as c_int)
    fn getpeername(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int;
        fallback(crate::sys::sys_call!(libc::SYS_getpeername, fd, addr, len) as c_int)
    fn getsockname(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int;
        fallback(crate::sys::sys_call!(libc::SYS_getsockname, fd, addr, len) as c_int)
    fn read(fd: c_int, buf: *mut c_void, count: size_t) -> ssize_t;
        fallback(crate::sys::sys_call!(libc::SYS_read, fd, buf, count) as ssize_t)
    fn write(fd: c_int, buf: *const c_void, count: size_t) -> ssize_t;
        fallback(crate::sys::sys_call!(libc::SYS_write, fd, buf, count) as ssize_t)
    fn readv(fd: c_int, iov: *const iovec, iovcnt: c_int) -> ssize_t;
        fallback(crate::sys::sys_call!(libc::SYS_readv, fd, iov, iovcnt) as ssize_t)
    fn writev(fd: c_int, iov: *const iovec, iovcnt: c_int) -> ssize_t;
        fallback(crate::sys::sys_call!(libc::SYS_writev, fd, iov, iovcnt) as ssize_t)
    fn recv(fd: c_int, buf: *mut c_void, len: size_t, flags: c_int) -> ssize_t;
        fallback(crate::sys::sys_call!(libc::SYS_recvfrom, fd, buf, len, flags, 0usize, 0usize) as ssize_t)
    fn send(fd: c_int, buf: *const c_void, len: size_t, flags: c_int) -> ssize_t;
        fallback(crate::sys::sys_call!(libc::SYS_sendto, fd, buf, len, flags, 0usize, 0usize) as ssize_t)
    fn recvmsg(fd: c_int, msg: *mut msghdr, flags: c_int) -> ssize_t;
        fallback(crate::sys::sys_call!(libc::SYS_recvmsg, fd, msg, flags) as ssize_t)
    fn sendmsg(fd: c_int, msg: *const msghdr, flags: c_int) -> ssize_t;
        fallback(crate::sys::sys_call!(libc::SYS_sendmsg, fd, msg, flags) as ssize_t)
    fn close(fd: c_int) -> c_int;
        fallback(crate::sys::sys_call!(libc::SYS_close, fd) as c_int)
    fn dup(fd: c_int) -> c_int;
        fallback(crate::sys::sys_call!(libc::SYS_dup, fd) as c_int)
    fn fcntl(fd: c_int, cmd: c_int, arg: usize) -> c_int;
        fallback(crate::sys::sys_call!(libc::SYS_fcntl, fd, cmd, arg) as c_int)
    fn ioctl(fd: c_int, request: c_ulong, arg: usize) -> c_int;
        fallback(crate::sys::sys_call!(libc::SYS_ioctl, fd, request, arg) as c_int)
    fn poll(fds: *mut pollfd, nfds: nfds_t, timeout: c_int) -> c_int;
        fallback(crate::sys::sys_call!(libc::SYS_poll, fds, nfds, timeout) as c_int)
    fn ppoll(fds: *mut pollfd, nfds: nfds_t, timeout: *const timespec, mask: *const sigset_t) -> c_int;
        fallback(crate::sys::sys_call!(libc::SYS_ppoll, fds, nfds, timeout, mask, 8usize) as c_int)
    fn epoll_create1(flags: c_int) -> c_int;
        fallback(crate::sys::sys_call!(libc::SYS_epoll_create1, flags) as c_int)
    fn epoll_ctl(epfd: c_int, op: c_int, fd: c_int, event: *mut epoll_event) -> c_int;
        fallback(crate::sys::sys_call!(libc::SYS_epoll_ctl, epfd, op, fd, event) as c_int)
    fn epoll_wait(epfd: c_int, events: *mut epoll_event, maxevents: c_int, timeout: c_int) -> c_int;
        fallback(crate::sys::sys_call!(libc::SYS_epoll_wait, epfd, events, maxevents, timeout) as c_int)
    // glibc always defines sigaction; the kernel's rt_sigaction takes
    // another layout (and a restorer on x86-64), so no raw fallback stands
    // in for it: without libc's, installs fail with ENOSYS.
    fn sigaction(sig: c_int, act: *const libc::sigaction, old: *mut libc::sigaction) -> c_int;
        fallback({
            let _ = (sig, act, old);
            crate::sys::set_errno(libc::ENOSYS);
            -1
        })
    fn epoll_pwait(epfd: c_int, events: *mut epoll_event, maxevents: c_int, timeout: c_int, mask: *const sigset_t) -> c_int;
        fallback(crate::sys::sys_call!(libc::SYS_epoll_pwait, epfd, events, maxevents, timeout, mask, 8usize) as c_int)
}
