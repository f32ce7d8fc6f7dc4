//! The calling thread's signal mask as the kernel keeps it (one 64-bit
//! word), and re-queueing a signal to the calling thread, through raw
//! system calls that leave errno as it was: these run at the end of a
//! hook, after it has set the errno the program will read.

use libc::{c_int, c_long};

use crate::sys;

/// The kernel's sigset size on Linux (64 signals).
const KSET: c_long = 8;

/// The bit of `sig` in a kernel signal set.
pub const fn bit(sig: c_int) -> u64 {
    1u64 << (sig - 1)
}

/// rt_sigprocmask(how, set) with errno preserved; returns the old mask.
fn procmask(how: c_int, set: Option<u64>) -> u64 {
    let e = sys::errno();
    let mut old = 0u64;
    let setp = set.as_ref().map_or(std::ptr::null(), |s| s as *const u64);
    // SAFETY: `setp` is null or points to 8 readable bytes, `old` to 8
    // writable ones, and KSET is the kernel's sigset size.
    unsafe {
        sys::sys_call!(
            libc::SYS_rt_sigprocmask,
            how,
            setp,
            &mut old as *mut u64,
            KSET
        );
    }
    sys::set_errno(e);
    old
}

/// The calling thread's blocked set.
pub fn current() -> u64 {
    procmask(libc::SIG_BLOCK, None)
}

/// Unblocks `bits` on the calling thread; pending ones among them are
/// delivered as this returns.
pub fn unblock(bits: u64) {
    if bits != 0 {
        procmask(libc::SIG_UNBLOCK, Some(bits));
    }
}

/// glibc's own signals, SIGCANCEL (32) and SIGSETXID (33): no thread may
/// block them (pthread_sigmask refuses to), since setuid and its kin in a
/// threaded process signal every thread with SIGSETXID and wait until each
/// has run glibc's handler; one thread that blocks it hangs the caller.
const LIBC_INTERNAL: u64 = bit(32) | bit(33);

/// Every signal a thread may block, blocked on the calling thread until
/// dropped (the kernel leaves SIGKILL and SIGSTOP alone; glibc's own stay
/// open, see `LIBC_INTERNAL`).
pub struct BlockAll(u64);

/// Blocks every signal a thread may block on the calling thread until the
/// value is dropped.
pub fn block_all() -> BlockAll {
    BlockAll(procmask(libc::SIG_SETMASK, Some(!LIBC_INTERNAL)))
}

impl Drop for BlockAll {
    fn drop(&mut self) {
        procmask(libc::SIG_SETMASK, Some(self.0));
    }
}

/// Runs `f` with every signal blocked on the calling thread: a thread it
/// starts inherits that mask and takes none of the program's signals.
pub fn with_all_blocked<R>(f: impl FnOnce() -> R) -> R {
    let _b = block_all();
    f()
}

/// Queues `sig` with `info` (a siginfo_t the kernel gave this thread) to
/// the calling thread again. The kernel takes any si_code from a thread
/// that sends to itself, so the handler sees the sender, code and value it
/// was sent with. If it refuses all the same (out of queue space for a
/// real-time signal), tgkill delivers the signal with the sender's details
/// replaced by ours.
///
/// # Safety
/// `info` points to a readable 128-byte siginfo_t.
pub unsafe fn requeue(sig: c_int, info: *const libc::siginfo_t) {
    let e = sys::errno();
    let (pid, tid) = (sys::getpid(), sys::gettid());
    // SAFETY: our own pid and tid, a valid signal, and a siginfo the
    // caller vouches for.
    let r = unsafe { sys::sys_call!(libc::SYS_rt_tgsigqueueinfo, pid, tid, sig, info) };
    if r < 0 {
        // SAFETY: tgkill on our own thread with a valid signal.
        unsafe { sys::sys_call!(libc::SYS_tgkill, pid, tid, sig) };
    }
    sys::set_errno(e);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_all_restores_the_mask() {
        let before = current();
        {
            let _b = block_all();
            let during = current();
            assert_eq!(during & bit(libc::SIGTERM), bit(libc::SIGTERM));
            // glibc's SIGCANCEL and SIGSETXID stay deliverable.
            assert_eq!(during & (bit(32) | bit(33)), 0);
        }
        assert_eq!(current(), before);
    }
}
