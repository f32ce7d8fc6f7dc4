//! A lock for process-wide shim state that survives `fork`.
//!
//! A `std::sync::Mutex` held by another thread at the moment of a fork
//! stays locked forever in the child (the holder does not exist there), and
//! the shim cannot know when a program forks from a multi-threaded state.
//! `PLock` records the holder's pid instead of a bare flag: a process that
//! finds the lock held by *another* pid is a child of the holder, takes the
//! lock over and resets the data (what the vanished holder was doing may be
//! half done). Within one process it is a plain lock with spin-then-yield
//! waiting; every critical section here is short or bounded by a timeout.

use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicI32, Ordering};

use crate::process;

pub struct PLock<T> {
    /// 0 when free, else the pid of the process whose thread holds it.
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
        let mut spins = 0u32;
        loop {
            match self
                .holder
                .compare_exchange_weak(0, me, Ordering::Acquire, Ordering::Relaxed)
            {
                Ok(_) => return PGuard { lock: self },
                Err(0) => continue,
                Err(other) if other != me => {
                    // Held by our parent at fork time: nobody will release it.
                    if self
                        .holder
                        .compare_exchange(other, me, Ordering::Acquire, Ordering::Relaxed)
                        .is_ok()
                    {
                        let fresh = (self.reset)();
                        // SAFETY: we hold the lock now; the old value may be
                        // inconsistent, so it is forgotten, not dropped.
                        unsafe { std::mem::forget(std::ptr::replace(self.data.get(), fresh)) };
                        return PGuard { lock: self };
                    }
                }
                Err(_) => {}
            }
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                // SAFETY: plain syscall.
                unsafe { libc::sched_yield() };
            }
        }
    }
}

impl<T> PLock<T> {
    /// The lock if it is free right now (or held by the parent we were
    /// forked from, as `lock`); None while a thread of this process holds
    /// it, which may be the caller itself, interrupted by a signal.
    pub fn try_lock(&self) -> Option<PGuard<'_, T>> {
        let me = process::pid();
        let cur = self.holder.load(Ordering::Relaxed);
        if cur == me {
            return None;
        }
        if cur == 0 {
            return self
                .holder
                .compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
                .then_some(PGuard { lock: self });
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
        self.lock.holder.store(0, Ordering::Release);
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
