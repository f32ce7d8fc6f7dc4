//! A fixed-capacity set of owned file descriptors that closes whatever it
//! still holds when dropped.
//!
//! Received descriptors land here first, so an early return on a bad
//! message can never leak them. No heap: the shim may use it anywhere.

use std::fmt;
use std::os::fd::{FromRawFd, IntoRawFd, OwnedFd, RawFd};

use crate::{io, MAX_FDS};

/// Up to [`MAX_FDS`] owned descriptors, in the order they were sent.
pub struct Fds {
    fds: [RawFd; MAX_FDS],
    len: usize,
}

impl Fds {
    pub const fn new() -> Self {
        Fds {
            fds: [-1; MAX_FDS],
            len: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The raw numbers, still owned by `self`.
    pub fn as_raw(&self) -> &[RawFd] {
        &self.fds[..self.len]
    }

    /// Takes ownership of `fd`; gives it back when the set is full.
    pub fn push(&mut self, fd: OwnedFd) -> Result<(), OwnedFd> {
        if self.len == MAX_FDS {
            return Err(fd);
        }
        self.fds[self.len] = fd.into_raw_fd();
        self.len += 1;
        Ok(())
    }

    /// Takes ownership of a raw descriptor just installed by the kernel;
    /// closes it when the set is full.
    pub(crate) fn push_raw(&mut self, fd: RawFd) {
        if self.len == MAX_FDS {
            io::close_fd(fd);
            return;
        }
        self.fds[self.len] = fd;
        self.len += 1;
    }

    /// Hands the descriptors over as `OwnedFd`s.
    pub fn into_owned(self) -> Vec<OwnedFd> {
        let (raw, len) = self.into_raw();
        raw[..len]
            .iter()
            // SAFETY: each number was owned by the set and ownership moves
            // out exactly once (into_raw disarmed the destructor).
            .map(|&fd| unsafe { OwnedFd::from_raw_fd(fd) })
            .collect()
    }

    /// Hands the raw numbers over; the caller now owns and must close them.
    pub fn into_raw(mut self) -> ([RawFd; MAX_FDS], usize) {
        let out = (self.fds, self.len);
        self.len = 0;
        out
    }
}

impl Default for Fds {
    fn default() -> Self {
        Fds::new()
    }
}

impl Drop for Fds {
    fn drop(&mut self) {
        for &fd in &self.fds[..self.len] {
            io::close_fd(fd);
        }
    }
}

impl fmt::Debug for Fds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.as_raw()).finish()
    }
}
