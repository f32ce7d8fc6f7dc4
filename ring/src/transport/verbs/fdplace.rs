//! Where the transport's own descriptors go: a device context's command
//! and async-event fds, each end's completion channel and region memfd.
//!
//! The kernel hands out the lowest free number, so without a say these
//! would take numbers the program's next socket or epoll set gets without
//! the transport. An embedder (the shim) installs a placement that moves a
//! descriptor elsewhere; by default a descriptor stays where it is.

use std::os::fd::{FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::sync::OnceLock;

/// Moves a descriptor the caller owns (close-on-exec kept) and returns its
/// new number, or the same number where it cannot be moved.
pub type Placement = fn(RawFd) -> RawFd;

static PLACEMENT: OnceLock<Placement> = OnceLock::new();

/// Installs the placement for every descriptor opened from now on; the
/// first call wins (false if one was installed already).
pub fn set_fd_placement(p: Placement) -> bool {
    PLACEMENT.set(p).is_ok()
}

/// `fd` where the placement puts it.
pub(super) fn place(fd: RawFd) -> RawFd {
    match PLACEMENT.get() {
        Some(p) if fd >= 0 => p(fd),
        _ => fd,
    }
}

/// `place` for an owned descriptor.
pub(super) fn place_owned(fd: OwnedFd) -> OwnedFd {
    let raw = place(fd.into_raw_fd());
    // SAFETY: the placement returns the descriptor it was handed, moved or
    // not, and ownership comes back with it.
    unsafe { OwnedFd::from_raw_fd(raw) }
}
