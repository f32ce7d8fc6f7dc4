//! Which descriptor numbers the shim holds for itself.
//!
//! Without the shim these numbers would be free, so the program must find
//! them free: its close, close_range, closefrom, dup2 and fcntl on one of
//! them behave as on a free number (hooks/fd.rs). This is the record the
//! hooks consult: one bit per number in a zeroed static (untouched pages
//! cost nothing), set when a descriptor of ours gets its final number and
//! cleared before the shim closes it, so a set bit always names an open
//! descriptor of ours. A fork child inherits the bits with the descriptors
//! (memory is copied); exec drops both (ours are close-on-exec).
//!
//! Only the process that owns this memory writes it (`process::owns_memory`:
//! a vfork child shares its parent's memory but has a fd table of its own).
//!
//! A few per-process descriptors can be moved when the program dup2s onto
//! their number; their holders leave a mover here (`set_mover`).

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicI32, AtomicU64, AtomicUsize, Ordering};

use crate::process;

/// Numbers at or above this are never recorded. The shim's range starts at
/// most at 2^16 (`MAX_BASE`), so the descriptors it places stay below.
const LIMIT: usize = 1 << 20;
const WORDS: usize = LIMIT / 64;

static BITS: [AtomicU64; WORDS] = [const { AtomicU64::new(0) }; WORDS];

/// Records `fd` as the shim's.
pub fn own(fd: RawFd) {
    if fd >= 0 && (fd as usize) < LIMIT && process::owns_memory() {
        BITS[fd as usize / 64].fetch_or(1 << (fd % 64), Ordering::Release);
    }
}

/// Forgets `fd` (it is about to be closed or replaced). Any number may be
/// passed: whatever the shim closes is no longer its own.
pub fn disown(fd: RawFd) {
    if is_own(fd) && process::owns_memory() {
        BITS[fd as usize / 64].fetch_and(!(1 << (fd % 64)), Ordering::Release);
        forget_mover(fd);
    }
}

/// True if `fd` is recorded as the shim's.
#[inline]
pub fn is_own(fd: RawFd) -> bool {
    fd >= 0
        && (fd as usize) < LIMIT
        && BITS[fd as usize / 64].load(Ordering::Acquire) & (1 << (fd % 64)) != 0
}

/// The lowest number of ours in `lo..=hi`, if any.
pub fn next_own(lo: u32, hi: u32) -> Option<RawFd> {
    let hi = (hi as usize).min(LIMIT - 1);
    let mut n = lo as usize;
    while n <= hi {
        let word = BITS[n / 64].load(Ordering::Acquire) >> (n % 64);
        if word != 0 {
            let fd = n + word.trailing_zeros() as usize;
            return (fd <= hi).then_some(fd as RawFd);
        }
        n = (n / 64 + 1) * 64;
    }
    None
}

/// Moves the holder's descriptor away from `fd` (a copy at another number
/// of ours, the holder switched to it); false if it could not.
pub type Mover = fn(RawFd) -> bool;

const MOVERS: usize = 8;
static MOVER_FD: [AtomicI32; MOVERS] = [const { AtomicI32::new(-1) }; MOVERS];
static MOVER_FN: [AtomicUsize; MOVERS] = [const { AtomicUsize::new(0) }; MOVERS];

/// `fd` (already `own`ed) can be moved by `m`. A handful of per-process
/// descriptors use this; when the table is full the descriptor simply
/// stays unmovable.
pub fn set_mover(fd: RawFd, m: Mover) {
    if !process::owns_memory() {
        return;
    }
    for i in 0..MOVERS {
        // -2 reserves the slot while its function is stored.
        if MOVER_FD[i]
            .compare_exchange(-1, -2, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            MOVER_FN[i].store(m as usize, Ordering::Release);
            MOVER_FD[i].store(fd, Ordering::Release);
            return;
        }
    }
}

fn forget_mover(fd: RawFd) {
    for slot in &MOVER_FD {
        let _ = slot.compare_exchange(fd, -1, Ordering::AcqRel, Ordering::Acquire);
    }
}

/// The mover left for `fd`, if any.
pub fn mover(fd: RawFd) -> Option<Mover> {
    for i in 0..MOVERS {
        if MOVER_FD[i].load(Ordering::Acquire) == fd {
            let f = MOVER_FN[i].load(Ordering::Acquire);
            if f != 0 {
                // SAFETY: only `set_mover` stores here, and it stores a
                // `Mover` cast to usize.
                return Some(unsafe { std::mem::transmute::<usize, Mover>(f) });
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bits_follow_own_and_disown() {
        let fd = 70_001;
        assert!(!is_own(fd));
        own(fd);
        assert!(is_own(fd));
        assert_eq!(next_own(70_000, 70_100), Some(fd));
        assert_eq!(next_own(70_002, 70_100), None);
        assert_eq!(next_own(0, 70_000), None);
        disown(fd);
        assert!(!is_own(fd));
        assert_eq!(next_own(70_000, 70_100), None);
    }

    #[test]
    fn next_own_crosses_words_and_stops_at_hi() {
        own(80_130);
        own(80_200);
        assert_eq!(next_own(80_000, u32::MAX), Some(80_130));
        assert_eq!(next_own(80_131, u32::MAX), Some(80_200));
        assert_eq!(next_own(80_131, 80_199), None);
        disown(80_130);
        disown(80_200);
    }

    fn never(_: RawFd) -> bool {
        false
    }

    #[test]
    fn movers_go_with_their_number() {
        let fd = 90_000;
        own(fd);
        set_mover(fd, never);
        assert!(mover(fd).is_some());
        disown(fd);
        assert!(mover(fd).is_none());
    }
}
