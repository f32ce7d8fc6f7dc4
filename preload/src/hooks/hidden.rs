//! The shim's own descriptors as the program sees them: free numbers.
//!
//! Without the shim the numbers of its descriptors (fdspace) would be
//! free, so the program's calls on them get what a free number gets: close,
//! fcntl, ioctl and dup fail with EBADF, close_range and closefrom succeed
//! and leave ours open, and dup2/dup3 onto one succeed after ours moved to
//! another number. The hooks ask `program` (interpose::caller) only once the
//! number is one of ours, so the shim's own calls keep working on them.

use libc::{c_int, c_uint};

use crate::{fdspace, process, sys};

/// True if `fd` is one of the shim's descriptors and `program` says the
/// program made the call. A recorded number whose descriptor lost its
/// FD_CLOEXEC (ours never do) is not ours any more: forgotten, false.
pub fn hidden(fd: c_int, program: impl FnOnce() -> bool) -> bool {
    fdspace::is_own(fd) && program() && still_ours(fd)
}

fn still_ours(fd: c_int) -> bool {
    if sys::cloexec(fd) {
        return true;
    }
    fdspace::disown(fd);
    false
}

/// A failure with EBADF, as on a free number.
pub fn ebadf() -> c_int {
    sys::set_errno(libc::EBADF);
    -1
}

/// Runs `close(lo, hi)` on each piece of `first..=last` between the
/// shim's descriptors; 0, or the first failing piece's result (errno set).
pub fn around(
    first: c_uint,
    last: c_uint,
    mut close: impl FnMut(c_uint, c_uint) -> c_int,
) -> c_int {
    let mut lo = first;
    let mut from = first;
    loop {
        let Some(fd) = fdspace::next_own(from, last) else {
            return close(lo, last);
        };
        let fd = fd as c_uint;
        if still_ours(fd as c_int) {
            if fd > lo {
                let r = close(lo, fd - 1);
                if r < 0 {
                    return r;
                }
            }
            lo = fd + 1;
        }
        if fd == last {
            // `last` was ours (else the piece ends with it).
            return if lo > last { 0 } else { close(lo, last) };
        }
        from = fd + 1;
    }
}

/// Before the program's dup2/dup3 of `old` onto `new`: EBADF if `old` is
/// one of ours (a free number to the program); if `new` is, ours moves
/// away first (`make_room`). Ok(true): ours was moved, and the old copy
/// left at `new` is the call's to replace (`after_dup`). Err holds the
/// hook's result.
pub fn before_dup(old: c_int, new: c_int, program: impl Fn() -> bool) -> Result<bool, c_int> {
    if hidden(old, &program) {
        return Err(ebadf());
    }
    if !fdspace::is_own(new) {
        return Ok(false);
    }
    if !program() {
        // The shim replacing a descriptor of its own: no longer ours.
        fdspace::disown(new);
        return Ok(false);
    }
    if !still_ours(new) || !process::owns_memory() {
        // A vfork child's table is its own: its copy of ours goes, the
        // parent's stays, and the record (shared memory) is the parent's.
        return Ok(false);
    }
    if sys::fcntl(old, libc::F_GETFD, 0).is_err() {
        return Err(ebadf());
    }
    make_room(new).map(|()| true)
}

/// After the dup2/dup3 (result `r`) that `before_dup` moved ours away
/// for: if it failed, the old copy still sits at `new`, a number the
/// program sees free: it goes.
pub fn after_dup(moved: bool, new: c_int, r: c_int) {
    if moved && r < 0 {
        let e = sys::errno();
        sys::close(new);
        sys::set_errno(e);
    }
}

/// Moves the shim's descriptor at `fd` to another number, so that the
/// program's dup2/dup3 can take `fd`. Only holders that leave a mover can
/// be moved safely (the daemon session, under its lock; the background
/// thread's wake eventfd): a ring's doorbells, duplicate socket and
/// memory descriptors and the private epoll sets are used by their number
/// from several threads without a lock, and a thread that read the old
/// number just before the program's dup2 would then write a doorbell's
/// count into the program's file. For those the call fails with EBUSY
/// (which dup2 may return on Linux) and nothing is changed.
fn make_room(fd: c_int) -> Result<(), c_int> {
    match fdspace::mover(fd) {
        Some(m) if m(fd) => Ok(()),
        _ => {
            sys::set_errno(libc::EBUSY);
            Err(-1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pieces `around` asks for, with the numbers `own` recorded.
    fn pieces(own: &[c_int], first: c_uint, last: c_uint) -> Vec<(c_uint, c_uint)> {
        let fds: Vec<c_int> = own
            .iter()
            .map(|_| {
                // SAFETY: plain eventfd creation; closed below.
                unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) }
            })
            .collect();
        // Put each at the wanted number (above the test's own fds).
        for (&want, &got) in own.iter().zip(&fds) {
            // SAFETY: dup3 of our eventfd onto a number nothing uses.
            assert_eq!(unsafe { libc::dup3(got, want, libc::O_CLOEXEC) }, want);
            sys::close(got);
            fdspace::own(want);
        }
        let mut out = Vec::new();
        let r = around(first, last, |a, b| {
            out.push((a, b));
            0
        });
        assert_eq!(r, 0);
        for &fd in own {
            fdspace::close(fd);
        }
        out
    }

    #[test]
    fn pieces_skip_ours() {
        assert_eq!(
            pieces(&[950, 952], 3, c_uint::MAX),
            vec![(3, 949), (951, 951), (953, c_uint::MAX)]
        );
        assert_eq!(pieces(&[960, 961], 960, 961), vec![]);
        assert_eq!(pieces(&[970], 965, 970), vec![(965, 969)]);
        assert_eq!(pieces(&[975], 975, 979), vec![(976, 979)]);
    }

    #[test]
    fn a_stale_number_is_closed_with_its_piece() {
        // Recorded, but no descriptor there: the program's to close.
        fdspace::own(985);
        let mut out = Vec::new();
        around(980, 990, |a, b| {
            out.push((a, b));
            0
        });
        assert_eq!(out, vec![(980, 990)]);
        assert!(!fdspace::is_own(985));
    }
}
