//! syscall(2), libc's generic system call: a program that makes a socket
//! call through it (libuv closes descriptors with `syscall(SYS_close)`)
//! reaches the shim as if it had called the function, so a ring connection
//! is closed, read and written the same way whichever door the program
//! used. Calls on descriptors the shim does not track, and every call the
//! shim makes itself, go straight to the kernel (`sys::syscall6`).
//!
//! `syscall` is variadic in C. It is defined here with six fixed `long`
//! arguments after the number: on the x86-64 and AArch64 Linux ABIs the
//! caller passes variadic integer and pointer arguments where fixed ones
//! go (registers; the sixth on x86-64 in the first stack slot of the
//! caller's frame), so reading six is sound whatever the caller passed,
//! and arguments it did not pass are never used by the call it makes.
//! Poll-style calls with descriptor arrays (poll, ppoll, select, pselect6)
//! made this way are not followed (docs/limits.md). A prctl or seccomp
//! call that installs a filter enters the sandbox first (seccomp.rs).
//! rt_sigaction goes through the sigaction hook (handlers.rs).

use libc::{c_int, c_long, c_uint, c_void, epoll_event, iovec, mmsghdr, msghdr, sigset_t};
use libc::{size_t, sockaddr, socklen_t};

use crate::interpose::caller::PROGRAM;
use crate::interpose::guard;
use crate::sys;
use crate::{fdspace, fdtable};

/// See the module docs.
///
/// # Safety
/// Called by C code with the system call's contract for its arguments.
#[no_mangle]
pub unsafe extern "C" fn syscall(
    n: c_long,
    a1: c_long,
    a2: c_long,
    a3: c_long,
    a4: c_long,
    a5: c_long,
    a6: c_long,
) -> c_long {
    let args = [a1, a2, a3, a4, a5, a6];
    if crate::process::sandboxed() {
        // SAFETY: the program's call, under its contract, to the kernel.
        return unsafe { sys::syscall6(n, args) };
    }
    let bomb = super::define::AbortOnUnwind("syscall");
    super::seccomp::before_syscall(n, &args);
    if makes_shared_child(n, &args) {
        crate::process::before_shared_child();
    }
    // SAFETY: the program's call, under its contract.
    let r = match unsafe { routed(n, args) } {
        Some(r) => r,
        // SAFETY: as above, straight to the kernel.
        None => unsafe { sys::syscall6(n, args) },
    };
    std::mem::forget(bomb);
    // As in `hooks!`: signals deferred during the call run now.
    crate::interpose::defer::flush();
    r
}

/// The program's call through the hook of the function it names, where
/// that call concerns a descriptor the shim tracks (close and close_range
/// always: the shim forgets what a closed descriptor was, and hides its
/// own; dup2/dup3 onto one of the shim's descriptors too). The calls that
/// reach here are the program's (the shim's own go straight to the
/// kernel), which the fd hooks are told with `PROGRAM`.
///
/// # Safety
/// The system call's contract for `a`.
unsafe fn routed(n: c_long, a: [c_long; 6]) -> Option<c_long> {
    if n == libc::SYS_rt_sigaction {
        // SAFETY: rt_sigaction's contract, the caller's.
        let r = unsafe {
            super::handlers::rt_sigaction(
                a[0] as c_int,
                a[1] as usize,
                a[2] as usize,
                a[3] as usize,
            )
        };
        return r.map(|r| r as c_long);
    }
    let fd = a[0] as c_int;
    let tracked = |fd: c_int| fdtable::is_tracked(fd);
    let concerns_us = match n {
        // Waits: an instance may get its first ring while the call sleeps
        // (hooks/epoll.rs, `wait`); a new instance is tracked.
        libc::SYS_close
        | libc::SYS_close_range
        | libc::SYS_epoll_pwait
        | libc::SYS_epoll_pwait2
        | libc::SYS_epoll_create1 => true,
        #[cfg(target_arch = "x86_64")]
        libc::SYS_epoll_wait | libc::SYS_epoll_create => true,
        libc::SYS_dup3 => tracked(fd) || fdspace::is_own(a[1] as c_int),
        #[cfg(target_arch = "x86_64")]
        libc::SYS_dup2 => tracked(fd) || fdspace::is_own(a[1] as c_int),
        libc::SYS_epoll_ctl => tracked(fd) || tracked(a[2] as c_int),
        _ => on_one_fd(n) && tracked(fd),
    };
    if !concerns_us || guard::active() {
        return None;
    }
    use super::{epoll, fd as fds, io, socket};
    // SAFETY: every arm calls the hook of the function the number names,
    // with the program's arguments in that function's types; the caller
    // holds the system call's contract for them, which is the function's.
    let r = unsafe {
        match n {
            libc::SYS_close => fds::close_from(fd, PROGRAM) as c_long,
            libc::SYS_close_range => {
                fds::close_range_from(a[0] as c_uint, a[1] as c_uint, a[2] as c_int, PROGRAM)
                    as c_long
            }
            libc::SYS_dup => fds::dup_from(fd, PROGRAM) as c_long,
            #[cfg(target_arch = "x86_64")]
            libc::SYS_dup2 => fds::dup2_from(fd, a[1] as c_int, PROGRAM) as c_long,
            libc::SYS_dup3 => fds::dup3_from(fd, a[1] as c_int, a[2] as c_int, PROGRAM) as c_long,
            libc::SYS_fcntl => fds::fcntl_from(fd, a[1] as c_int, a[2] as usize, PROGRAM) as c_long,
            libc::SYS_ioctl => {
                fds::ioctl_from(fd, a[1] as libc::c_ulong, a[2] as usize, PROGRAM) as c_long
            }
            libc::SYS_read => io::read(fd, a[1] as *mut c_void, a[2] as size_t) as c_long,
            libc::SYS_write => io::write(fd, a[1] as *const c_void, a[2] as size_t) as c_long,
            libc::SYS_readv => io::readv(fd, a[1] as *const iovec, a[2] as c_int) as c_long,
            libc::SYS_writev => io::writev(fd, a[1] as *const iovec, a[2] as c_int) as c_long,
            libc::SYS_recvfrom => io::recvfrom(
                fd,
                a[1] as *mut c_void,
                a[2] as size_t,
                a[3] as c_int,
                a[4] as *mut sockaddr,
                a[5] as *mut socklen_t,
            ) as c_long,
            libc::SYS_sendto => io::sendto(
                fd,
                a[1] as *const c_void,
                a[2] as size_t,
                a[3] as c_int,
                a[4] as *const sockaddr,
                a[5] as socklen_t,
            ) as c_long,
            libc::SYS_recvmsg => io::recvmsg(fd, a[1] as *mut msghdr, a[2] as c_int) as c_long,
            libc::SYS_sendmsg => io::sendmsg(fd, a[1] as *const msghdr, a[2] as c_int) as c_long,
            libc::SYS_recvmmsg => io::recvmmsg(
                fd,
                a[1] as *mut mmsghdr,
                a[2] as c_uint,
                a[3] as c_int,
                a[4] as *mut libc::timespec,
            ) as c_long,
            libc::SYS_sendmmsg => {
                io::sendmmsg(fd, a[1] as *mut mmsghdr, a[2] as c_uint, a[3] as c_int) as c_long
            }
            libc::SYS_shutdown => socket::shutdown(fd, a[1] as c_int) as c_long,
            libc::SYS_listen => socket::listen(fd, a[1] as c_int) as c_long,
            #[cfg(target_arch = "x86_64")]
            libc::SYS_accept => {
                socket::accept(fd, a[1] as *mut sockaddr, a[2] as *mut socklen_t) as c_long
            }
            libc::SYS_accept4 => socket::accept4(
                fd,
                a[1] as *mut sockaddr,
                a[2] as *mut socklen_t,
                a[3] as c_int,
            ) as c_long,
            libc::SYS_getsockopt => socket::getsockopt(
                fd,
                a[1] as c_int,
                a[2] as c_int,
                a[3] as *mut c_void,
                a[4] as *mut socklen_t,
            ) as c_long,
            libc::SYS_setsockopt => socket::setsockopt(
                fd,
                a[1] as c_int,
                a[2] as c_int,
                a[3] as *const c_void,
                a[4] as socklen_t,
            ) as c_long,
            libc::SYS_getpeername => {
                socket::getpeername(fd, a[1] as *mut sockaddr, a[2] as *mut socklen_t) as c_long
            }
            libc::SYS_getsockname => {
                socket::getsockname(fd, a[1] as *mut sockaddr, a[2] as *mut socklen_t) as c_long
            }
            libc::SYS_epoll_ctl => {
                epoll::epoll_ctl(fd, a[1] as c_int, a[2] as c_int, a[3] as *mut epoll_event)
                    as c_long
            }
            #[cfg(target_arch = "x86_64")]
            libc::SYS_epoll_wait => {
                epoll::epoll_wait(fd, a[1] as *mut epoll_event, a[2] as c_int, a[3] as c_int)
                    as c_long
            }
            libc::SYS_epoll_pwait2 => epoll::epoll_pwait2(
                fd,
                a[1] as *mut epoll_event,
                a[2] as c_int,
                a[3] as *const libc::timespec,
                a[4] as *const sigset_t,
            ) as c_long,
            libc::SYS_epoll_create1 => epoll::epoll_create1(fd) as c_long,
            #[cfg(target_arch = "x86_64")]
            libc::SYS_epoll_create => epoll::epoll_create(fd) as c_long,
            libc::SYS_epoll_pwait => epoll::epoll_pwait(
                fd,
                a[1] as *mut epoll_event,
                a[2] as c_int,
                a[3] as c_int,
                a[4] as *const sigset_t,
            ) as c_long,
            _ => return None,
        }
    };
    Some(r)
}

/// Whether call `n` makes a child that may share our memory, or a fork
/// child that keeps a stale cached pid (none of our fork bookkeeping runs
/// on this door): clone without CLONE_THREAD, clone3, fork, vfork.
fn makes_shared_child(n: c_long, a: &[c_long; 6]) -> bool {
    #[cfg(target_arch = "x86_64")]
    if matches!(n, libc::SYS_fork | libc::SYS_vfork) {
        return true;
    }
    match n {
        libc::SYS_clone => crate::process::clone_makes_process(a[0] as u64),
        // Its flags sit behind a pointer the kernel checks: asked of no one.
        libc::SYS_clone3 => true,
        _ => false,
    }
}

/// The calls of one descriptor (their first argument) `routed` follows.
fn on_one_fd(n: c_long) -> bool {
    #[cfg(target_arch = "x86_64")]
    if matches!(n, libc::SYS_dup2 | libc::SYS_accept) {
        return true;
    }
    matches!(
        n,
        libc::SYS_dup
            | libc::SYS_dup3
            | libc::SYS_fcntl
            | libc::SYS_ioctl
            | libc::SYS_read
            | libc::SYS_write
            | libc::SYS_readv
            | libc::SYS_writev
            | libc::SYS_recvfrom
            | libc::SYS_sendto
            | libc::SYS_recvmsg
            | libc::SYS_sendmsg
            | libc::SYS_recvmmsg
            | libc::SYS_sendmmsg
            | libc::SYS_shutdown
            | libc::SYS_listen
            | libc::SYS_accept4
            | libc::SYS_getsockopt
            | libc::SYS_setsockopt
            | libc::SYS_getpeername
            | libc::SYS_getsockname
    )
}
