//! Doorbells: how one end wakes the other when it has published a change
//! the other end announced it is sleeping for.

use crate::error::RingError;

/// Something that wakes the peer. Must be cheap and must never block.
pub trait Notify: Send + Sync {
    fn notify(&self) -> Result<(), RingError>;
}

#[cfg(not(loom))]
pub use eventfd::EventFd;

#[cfg(not(loom))]
mod eventfd {
    use super::Notify;
    use crate::error::RingError;
    use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
    use std::time::Duration;

    /// A doorbell over an eventfd. System calls go through `syscall(2)`
    /// directly so that an interposed libc (our own shim) never sees them.
    pub struct EventFd {
        fd: OwnedFd,
    }

    impl EventFd {
        /// A new non-blocking, close-on-exec eventfd.
        pub fn new() -> Result<Self, RingError> {
            // SAFETY: eventfd2 takes two integers and touches no memory of
            // ours; a failure is a negative return, handled below.
            let fd = unsafe {
                libc::syscall(
                    libc::SYS_eventfd2,
                    0,
                    libc::EFD_NONBLOCK | libc::EFD_CLOEXEC,
                )
            };
            if fd < 0 {
                return Err(RingError::last_os());
            }
            // SAFETY: `fd` is a descriptor the kernel just opened for us
            // (checked non-negative above), owned by nothing else yet.
            let fd = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
            Ok(EventFd { fd })
        }

        /// Wraps an eventfd received from elsewhere (e.g. over SCM_RIGHTS).
        pub fn from_owned(fd: OwnedFd) -> Self {
            EventFd { fd }
        }

        pub fn fd(&self) -> RawFd {
            self.fd.as_raw_fd()
        }

        pub fn into_owned(self) -> OwnedFd {
            self.fd
        }

        /// A second handle to the same eventfd (dup with close-on-exec).
        pub fn try_clone(&self) -> Result<Self, RingError> {
            // SAFETY: F_DUPFD_CLOEXEC on a descriptor `self` keeps open
            // takes integers only and touches no memory of ours.
            let fd = unsafe { libc::syscall(libc::SYS_fcntl, self.fd(), libc::F_DUPFD_CLOEXEC, 0) };
            if fd < 0 {
                return Err(RingError::last_os());
            }
            // SAFETY: `fd` is the duplicate the kernel just made (checked
            // non-negative above), owned by nothing else yet.
            let fd = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
            Ok(EventFd { fd })
        }

        /// Clears pending rings; returns whether there were any.
        pub fn drain(&self) -> bool {
            let mut v = 0u64;
            // SAFETY: the kernel writes at most 8 bytes into `v`, a live
            // local u64; the fd is non-blocking, so the call returns.
            let n = unsafe { libc::syscall(libc::SYS_read, self.fd(), &mut v as *mut u64, 8) };
            n == 8
        }

        /// Blocks until rung or `timeout` passes (`None` = forever). Returns
        /// whether it was rung; consumes the ring either way.
        pub fn wait(&self, timeout: Option<Duration>) -> Result<bool, RingError> {
            if self.drain() {
                return Ok(true);
            }
            let ms = timeout.map_or(-1, |d| d.as_millis().min(i32::MAX as u128) as i32);
            let mut pfd = libc::pollfd {
                fd: self.fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: `pfd` is one live pollfd (nfds 1) and the timespec,
            // when given, is a temporary that lives across the call; the
            // sigmask is null.
            let r = unsafe {
                libc::syscall(
                    libc::SYS_ppoll,
                    &mut pfd as *mut libc::pollfd,
                    1,
                    if ms < 0 {
                        std::ptr::null()
                    } else {
                        &libc::timespec {
                            tv_sec: (ms / 1000) as _,
                            tv_nsec: ((ms % 1000) * 1_000_000) as _,
                        } as *const _
                    },
                    std::ptr::null::<libc::sigset_t>(),
                    8,
                )
            };
            if r < 0 {
                let e = RingError::last_os();
                return if e == RingError::Os(libc::EINTR) {
                    Ok(false)
                } else {
                    Err(e)
                };
            }
            Ok(self.drain())
        }
    }

    impl Notify for EventFd {
        fn notify(&self) -> Result<(), RingError> {
            let one = 1u64;
            // SAFETY: the kernel reads exactly 8 bytes from `one`, a live
            // local u64.
            let n = unsafe { libc::syscall(libc::SYS_write, self.fd(), &one as *const u64, 8) };
            // EAGAIN means the counter is saturated: the peer is rung anyway.
            if n == 8 || RingError::last_os() == RingError::Os(libc::EAGAIN) {
                Ok(())
            } else {
                Err(RingError::last_os())
            }
        }
    }

    impl From<EventFd> for OwnedFd {
        fn from(e: EventFd) -> OwnedFd {
            e.fd
        }
    }

    impl IntoRawFd for EventFd {
        fn into_raw_fd(self) -> RawFd {
            self.fd.into_raw_fd()
        }
    }
}

/// Under loom a doorbell is a mutex-protected flag and a condvar: a lost
/// wakeup shows up as a deadlock the model checker reports.
#[cfg(loom)]
pub mod modeled {
    use super::Notify;
    use crate::error::RingError;
    use loom::sync::{Arc, Condvar, Mutex};

    #[derive(Clone, Default)]
    pub struct Bell {
        inner: Arc<(Mutex<bool>, Condvar)>,
    }

    impl Bell {
        pub fn wait(&self) {
            let (lock, cv) = &*self.inner;
            let mut rung = lock.lock().unwrap();
            while !*rung {
                rung = cv.wait(rung).unwrap();
            }
            *rung = false;
        }
    }

    impl Notify for Bell {
        fn notify(&self) -> Result<(), RingError> {
            let (lock, cv) = &*self.inner;
            *lock.lock().unwrap() = true;
            cv.notify_one();
            Ok(())
        }
    }
}
