//! A lock for process-wide shim state that survives `fork`.
//!
//! A `std::sync::Mutex` held by another thread at the moment of a fork
//! stays locked forever in the child (the holder does not exist there), and
//! the shim cannot know when a program forks from a multi-threaded state.
//! `PLock` records the holder's pid instead of a bare flag: a process that
//! finds the lock held by *another* pid is a child of the holder, takes the
//! lock over and resets the data (what the vanished holder was doing may be
//! half done). Within one process it is a futex lock: a short spin, then
//! a sleep on the holder word until the holder lets go, so a waiter never
//! burns the CPU its preempted holder needs (sched_yield does not hand
//! the CPU to the holder); every critical section here is short or
//! bounded by a timeout.

use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicI32, Ordering};

use crate::process;

/// Set in `holder` while a thread may sleep on it (pids stay below 2^22).
const WAITERS: i32 = 1 << 30;
/// Spins before a waiter sleeps: the sections are a few hundred ns.
const SPINS: u32 = 100;
/// A sleeping waiter looks again after this long even without a wake.
const SLEEP_NS: i64 = 1_000_000;

pub struct PLock<T> {
    /// 0 when free, else the pid of the process whose thread holds it,
    /// with WAITERS while a thread may be asleep on it.
    holder: AtomicI32,
    data: UnsafeCell<T>,
    reset: fn() -> T,
}

// SAFETY: access to `data` is serialised by `holder` (one guard at a time
// per process; a forked child starts with its own copy of the memory).
unsafe impl<T: Send> Sync for PLock<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Send for PLock<T> {}

pub struct PGuard<'a, T> {
    lock: &'a PLock<T>,
}

impl<T> PLock<T> {
    pub const fn new(value: T, reset: fn() -> T) -> Self {
        PLock {
            holder: AtomicI32::new(0),
            data: UnsafeCell::new(value),
            reset,
        }
    }

    pub fn lock(&self) -> PGuard<'_, T> {
        let me = process::pid();
        // Once this thread has slept, it takes the lock with WAITERS set:
        // others may still sleep, and the release must wake one.
        let mut take = me;
        let mut spins = 0u32;
        loop {
            let cur = self.holder.load(Ordering::Relaxed);
            if cur == 0 {
                if self
                    .holder
                    .compare_exchange_weak(0, take, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
                {
                    return PGuard { lock: self };
                }
                continue;
            }
            if cur & !WAITERS != me {
                if let Some(g) = self.take_over(cur, me) {
                    return g;
                }
                continue;
            }
            if spins < SPINS {
                spins += 1;
                std::hint::spin_loop();
                continue;
            }
            if cur & WAITERS == 0
                && self
                    .holder
                    .compare_exchange(cur, cur | WAITERS, Ordering::Relaxed, Ordering::Relaxed)
                    .is_err()
            {
                continue;
            }
            futex_wait(&self.holder, cur | WAITERS);
            take = me | WAITERS;
        }
    }

    /// `cur` names another pid: our parent held the lock when it forked,
    /// and nobody will release it (a child has no other thread that could
    /// be asleep on it).
    fn take_over(&self, cur: i32, me: i32) -> Option<PGuard<'_, T>> {
        self.holder
            .compare_exchange(cur, me, Ordering::Acquire, Ordering::Relaxed)
            .ok()?;
        let fresh = (self.reset)();
        // SAFETY: we hold the lock now; the old value may be inconsistent,
        // so it is forgotten, not dropped.
        unsafe { std::mem::forget(std::ptr::replace(self.data.get(), fresh)) };
        Some(PGuard { lock: self })
    }
}

/// Sleeps while `word` holds `val`, for at most SLEEP_NS.
fn futex_wait(word: &AtomicI32, val: i32) {
    let ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: SLEEP_NS as libc::c_long,
    };
    // SAFETY: the futex word is a live AtomicI32 of ours; a valid relative
    // timeout.
    unsafe {
        crate::sys::sys_call!(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            val,
            &ts as *const libc::timespec,
        )
    };
}

/// Wakes one thread asleep on `word`.
fn futex_wake(word: &AtomicI32) {
    // SAFETY: the futex word is a live AtomicI32 of ours.
    unsafe {
        crate::sys::sys_call!(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            1,
        )
    };
}

impl<T> PLock<T> {
    /// The lock if it is free right now (or held by the parent we were
    /// forked from, as `lock`); None while a thread of this process holds
    /// it, which may be the caller itself, interrupted by a signal.
    pub fn try_lock(&self) -> Option<PGuard<'_, T>> {
        let me = process::pid();
        let cur = self.holder.load(Ordering::Relaxed);
        if cur & !WAITERS == me {
            return None;
        }
        if cur == 0 {
            // `then`, not `then_some`: a guard built for a failed attempt
            // would release the winner's lock when dropped.
            return self
                .holder
                .compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
                .then(|| PGuard { lock: self });
        }
        // Held by our parent at fork time: taken over as `lock` does.
        Some(self.lock())
    }
}

impl<T> Deref for PGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the guard proves exclusive access.
        unsafe { &*self.lock.data.get() }
    }
}

impl<T> DerefMut for PGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the guard proves exclusive access.
        unsafe { &mut *self.lock.data.get() }
    }
}

impl<T> Drop for PGuard<'_, T> {
    fn drop(&mut self) {
        if self.lock.holder.swap(0, Ordering::Release) & WAITERS != 0 {
            futex_wake(&self.lock.holder);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn serialises_threads() {
        static L: PLock<u64> = PLock::new(0, || 0);
        let hs: Vec<_> = (0..4)
            .map(|_| {
                std::thread::spawn(|| {
                    for _ in 0..10_000 {
                        *L.lock() += 1;
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        assert_eq!(*L.lock(), 40_000);
    }

    #[test]
    fn a_waiter_sleeps_until_the_holder_lets_go() {
        static L: PLock<u32> = PLock::new(0, || 0);
        let g = L.lock();
        let t = std::thread::spawn(|| *L.lock() += 1);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while L.holder.load(Ordering::Relaxed) & WAITERS == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "the waiter never slept"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        drop(g);
        t.join().unwrap();
        assert_eq!(*L.lock(), 1);
        assert_eq!(L.holder.load(Ordering::Relaxed), 0, "released");
    }

    #[test]
    fn a_failed_try_lock_leaves_the_holder_alone() {
        let l = PLock::new(0u32, || 0);
        l.holder.store(process::pid() | WAITERS, Ordering::Relaxed);
        assert!(l.try_lock().is_none(), "held here, with a sleeper");
        assert_eq!(l.holder.load(Ordering::Relaxed), process::pid() | WAITERS);
    }

    #[test]
    fn try_lock_fails_only_while_held_here() {
        let l = PLock::new(7u32, || 0);
        let g = l.try_lock().expect("free");
        assert!(l.try_lock().is_none(), "held by this process");
        drop(g);
        assert_eq!(*l.try_lock().expect("free again"), 7);
        l.holder
            .store(process::pid() + 1_000_000, Ordering::Relaxed);
        assert_eq!(*l.try_lock().expect("a parent's hold is taken over"), 0);
    }

    #[test]
    fn foreign_holder_is_taken_over_and_reset() {
        let l = Arc::new(PLock::new(vec![1, 2, 3], Vec::new));
        // Pretend a thread of our parent held it at fork time.
        l.holder
            .store(process::pid() + 1_000_000, Ordering::Relaxed);
        assert!(l.lock().is_empty());
    }
}
