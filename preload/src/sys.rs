//! Raw system calls for the shim's own use.
//!
//! Every libc entry point the shim interposes (read, write, close, ...)
//! resolves to our own hook when called from inside `libringsock.so`,
//! because the preloaded library comes first in the global symbol scope.
//! The few things the shim does for itself at awkward moments (logging,
//! finding its pid, raising SIGPIPE) therefore go straight to the kernel
//! through `syscall(2)`, which is never interposed.

use libc::{c_int, c_long, pid_t};

/// The calling thread's errno.
pub fn errno() -> c_int {
    // SAFETY: __errno_location always returns a valid pointer to this
    // thread's errno.
    unsafe { *libc::__errno_location() }
}

/// Sets the calling thread's errno.
pub fn set_errno(e: c_int) {
    // SAFETY: as in `errno`.
    unsafe { *libc::__errno_location() = e }
}

/// getpid(2) straight from the kernel (glibc does not cache it, and the
/// shim must see the truth in a vfork child).
pub fn getpid() -> pid_t {
    // SAFETY: getpid takes no arguments and cannot fail.
    unsafe { crate::sys::sys_call!(libc::SYS_getpid) as pid_t }
}

/// gettid(2).
pub fn gettid() -> pid_t {
    // SAFETY: gettid takes no arguments and cannot fail.
    unsafe { crate::sys::sys_call!(libc::SYS_gettid) as pid_t }
}

/// Sends `sig` to the calling thread only, as the kernel does for SIGPIPE.
pub fn raise_on_this_thread(sig: c_int) {
    // SAFETY: tgkill with our own pid/tid and a valid signal number.
    unsafe {
        crate::sys::sys_call!(
            libc::SYS_tgkill,
            getpid() as c_long,
            gettid() as c_long,
            sig as c_long,
        );
    }
}

/// Whether `len` more bytes written to `fd` stay within the process's
/// file size limit (RLIMIT_FSIZE). A write past it sends SIGXFSZ, which
/// kills a program that never expected one (sshd's pre-authentication
/// child sets the limit to 0); only a regular file has the limit.
pub fn within_fsize_limit(fd: c_int, len: usize) -> bool {
    let mut lim = libc::rlimit64 {
        rlim_cur: libc::RLIM64_INFINITY,
        rlim_max: libc::RLIM64_INFINITY,
    };
    // SAFETY: prlimit64 on ourselves (pid 0) only reads into `lim`, a valid
    // rlimit64.
    let r = unsafe {
        crate::sys::sys_call!(
            libc::SYS_prlimit64,
            0,
            libc::RLIMIT_FSIZE,
            std::ptr::null::<libc::rlimit64>(),
            &mut lim as *mut libc::rlimit64,
        )
    };
    if r < 0 || lim.rlim_cur == libc::RLIM64_INFINITY {
        return true;
    }
    // SAFETY: an all-zero stat is a valid value for fstat to overwrite.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat writes into `st`, valid for its size.
    if unsafe { crate::sys::sys_call!(libc::SYS_fstat, fd, &mut st as *mut libc::stat) } < 0 {
        return false;
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return true;
    }
    // Without O_APPEND the write lands at the offset, with it at the end;
    // the larger of the two is the bound.
    // SAFETY: lseek with SEEK_CUR and offset 0 only reads the offset.
    let pos = unsafe { crate::sys::sys_call!(libc::SYS_lseek, fd, 0, libc::SEEK_CUR) };
    let end = (st.st_size.max(0) as u64).max(pos.max(0) as u64);
    end.saturating_add(len as u64) <= lim.rlim_cur
}

/// Writes all of `buf` to `fd`, retrying on EINTR and short writes; gives up
/// silently on any other error (this is the logger's last resort, there is
/// nobody to report to).
pub fn write_all(fd: c_int, mut buf: &[u8]) {
    while !buf.is_empty() {
        // SAFETY: buf is a valid, initialised slice for its whole length.
        let n = unsafe { crate::sys::sys_call!(libc::SYS_write, fd, buf.as_ptr(), buf.len()) };
        if n < 0 {
            if errno() == libc::EINTR {
                continue;
            }
            return;
        }
        if n == 0 {
            return;
        }
        buf = &buf[n as usize..];
    }
}

/// openat(AT_FDCWD, path, flags, mode) without going through libc's `open`.
/// `path` must be NUL-terminated. Returns the fd or the errno.
pub fn open(path: &[u8], flags: c_int, mode: libc::mode_t) -> Result<c_int, c_int> {
    if path.last() != Some(&0) {
        return Err(libc::EINVAL);
    }
    // SAFETY: path is NUL-terminated (checked above) and outlives the call.
    let fd = unsafe {
        crate::sys::sys_call!(
            libc::SYS_openat,
            libc::AT_FDCWD,
            path.as_ptr(),
            flags as c_long,
            mode as c_long,
        )
    };
    if fd < 0 {
        Err(errno())
    } else {
        Ok(fd as c_int)
    }
}

/// fcntl(2) without going through libc's (hooked) `fcntl`.
pub fn fcntl(fd: c_int, cmd: c_int, arg: c_long) -> Result<c_int, c_int> {
    // SAFETY: fcntl with an integer argument touches no memory of ours.
    let r = unsafe { crate::sys::sys_call!(libc::SYS_fcntl, fd, cmd, arg) };
    if r < 0 {
        Err(errno())
    } else {
        Ok(r as c_int)
    }
}

/// Whether `fd` is closed by an exec (FD_CLOEXEC); false for a bad fd.
pub fn cloexec(fd: c_int) -> bool {
    fcntl(fd, libc::F_GETFD, 0).is_ok_and(|f| f & libc::FD_CLOEXEC != 0)
}

/// close(2) without going through libc's (hooked) `close`.
pub fn close(fd: c_int) {
    // SAFETY: closing an fd the caller owns.
    unsafe {
        crate::sys::sys_call!(libc::SYS_close, fd);
    }
}

/// The socket's SO_RCVLOWAT (a program may set it before a ring exists).
pub fn rcvlowat(fd: c_int) -> usize {
    getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_RCVLOWAT).map_or(1, |v| v.max(1) as usize)
}

/// An int-valued socket option of `fd`, None if the kernel refuses.
pub fn getsockopt_int(fd: c_int, level: c_int, name: c_int) -> Option<c_int> {
    let mut v: c_int = 0;
    let mut len = std::mem::size_of::<c_int>() as libc::socklen_t;
    // SAFETY: v and len describe an int of our own.
    let r = unsafe {
        crate::sys::sys_call!(
            libc::SYS_getsockopt,
            fd,
            level,
            name,
            &mut v as *mut c_int,
            &mut len as *mut libc::socklen_t,
        )
    };
    (r == 0).then_some(v)
}

/// Sleeps about a millisecond (ppoll without descriptors; a signal may end
/// it early): the pause of a bounded wait for another thread.
pub fn pause_1ms() {
    let ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 1_000_000,
    };
    // SAFETY: no descriptors, a valid timeout, no signal mask.
    unsafe {
        crate::sys::sys_call!(
            libc::SYS_ppoll,
            std::ptr::null_mut::<libc::pollfd>(),
            0,
            &ts as *const libc::timespec,
            std::ptr::null::<libc::sigset_t>(),
            8,
        )
    };
}

/// CLOCK_MONOTONIC in nanoseconds.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid out-pointer; clock_gettime is not interposed.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The CPUs this process may run on (sched_getaffinity), at least 1.
pub fn cpus_allowed() -> u32 {
    // SAFETY: an all-zero cpu_set_t is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: set is a valid out-pointer of the size passed.
    let r = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if r != 0 {
        return 1;
    }
    // SAFETY: the kernel filled the set.
    (unsafe { libc::CPU_COUNT(&set) } as u32).max(1)
}

/// The inode number of an open descriptor (fstat(2)).
pub fn inode_of(fd: c_int) -> Option<u64> {
    stat_of(fd).map(|st| st.st_ino)
}

/// The inode number and size of an open descriptor (fstat(2)).
pub fn inode_and_size(fd: c_int) -> Option<(u64, u64)> {
    stat_of(fd).map(|st| (st.st_ino, u64::try_from(st.st_size).unwrap_or(0)))
}

fn stat_of(fd: c_int) -> Option<libc::stat> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: `st` is a writable stat buffer; fstat fills it on success,
    // which is checked before it is read.
    let rc = unsafe { crate::sys::sys_call!(libc::SYS_fstat, fd, st.as_mut_ptr()) };
    if rc != 0 {
        return None;
    }
    // SAFETY: fstat succeeded, so it initialised `st`.
    Some(unsafe { st.assume_init() })
}

/// A raw system call with up to six arguments: the result, or -1 with
/// errno set, as libc's `syscall` gives it. The shim's own system calls
/// come here: libc's `syscall` is interposed (`hooks::syscall`), and the
/// program's calls through it are the program's.
///
/// # Safety
/// The system call's contract for `args`.
#[inline]
pub unsafe fn syscall6(n: c_long, args: [c_long; 6]) -> c_long {
    let ret: c_long;
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the `syscall` instruction with the Linux x86-64 convention;
    // it clobbers rcx and r11 only, and the caller holds the contract.
    unsafe {
        core::arch::asm!(
            "syscall",
            inlateout("rax") n => ret,
            in("rdi") args[0],
            in("rsi") args[1],
            in("rdx") args[2],
            in("r10") args[3],
            in("r8") args[4],
            in("r9") args[5],
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    #[cfg(target_arch = "aarch64")]
    // SAFETY: `svc 0` with the Linux AArch64 convention (number in x8,
    // result in x0); the caller holds the contract.
    unsafe {
        core::arch::asm!(
            "svc 0",
            in("x8") n,
            inlateout("x0") args[0] => ret,
            in("x1") args[1],
            in("x2") args[2],
            in("x3") args[3],
            in("x4") args[4],
            in("x5") args[5],
            options(nostack),
        );
    }
    if (-4095..0).contains(&ret) {
        set_errno(-ret as c_int);
        return -1;
    }
    ret
}

/// `syscall(NUMBER, args...)` through `syscall6`, each argument cast to a
/// register's width (integers and pointers alike).
macro_rules! sys_call {
    ($n:expr $(, $a:expr)* $(,)?) => {
        $crate::sys::syscall6(
            $n as libc::c_long,
            $crate::sys::pad([$($a as libc::c_long),*]),
        )
    };
}
pub(crate) use sys_call;

/// The argument registers a call does not use, zeroed.
#[inline]
pub fn pad<const N: usize>(a: [c_long; N]) -> [c_long; 6] {
    let mut out = [0; 6];
    out[..N].copy_from_slice(&a);
    out
}
