//! The lock around a connection's ring ends: a plain futex mutex (the
//! classic three-state one) that a fork can hold open across the fork.
//!
//! A thread inside a ring call at the moment another thread forks would
//! leave the child a lock nobody will release and a ring end caught
//! half-way. So the forking thread takes every connection's locks first
//! (`lock_raw`) and releases them on both sides afterwards (`unlock_raw`),
//! which `std::sync::Mutex` cannot express.

use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU32, Ordering};

const FREE: u32 = 0;
const LOCKED: u32 = 1;
/// Locked, and someone may sleep on the futex.
const CONTENDED: u32 = 2;

pub struct OpLock<T> {
    state: AtomicU32,
    data: UnsafeCell<T>,
}

// SAFETY: `state` serialises every access to `data`: one guard (or one raw
// holder) at a time, as a mutex.
unsafe impl<T: Send> Sync for OpLock<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Send for OpLock<T> {}

pub struct OpGuard<'a, T> {
    lock: &'a OpLock<T>,
}

fn futex(word: &AtomicU32, op: i32, val: u32) {
    // SAFETY: the futex word is a live AtomicU32 of ours; no timeout.
    unsafe {
        crate::sys::sys_call!(
            libc::SYS_futex,
            word.as_ptr(),
            op | libc::FUTEX_PRIVATE_FLAG,
            val,
            std::ptr::null::<libc::timespec>(),
        )
    };
}

impl<T> OpLock<T> {
    pub const fn new(value: T) -> Self {
        OpLock {
            state: AtomicU32::new(FREE),
            data: UnsafeCell::new(value),
        }
    }

    pub fn lock(&self) -> OpGuard<'_, T> {
        self.lock_raw();
        OpGuard { lock: self }
    }

    pub fn try_lock(&self) -> Option<OpGuard<'_, T>> {
        // `then`, not `then_some`: a guard built for a failed attempt
        // would release the holder's lock when dropped.
        self.state
            .compare_exchange(FREE, LOCKED, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
            .then(|| OpGuard { lock: self })
    }

    /// Takes the lock without a guard; `unlock_raw` gives it back.
    pub fn lock_raw(&self) {
        if self
            .state
            .compare_exchange(FREE, LOCKED, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
        {
            return;
        }
        for _ in 0..64 {
            std::hint::spin_loop();
            if self
                .state
                .compare_exchange(FREE, LOCKED, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                return;
            }
        }
        while self.state.swap(CONTENDED, Ordering::Acquire) != FREE {
            futex(&self.state, libc::FUTEX_WAIT, CONTENDED);
        }
    }

    /// Releases a lock taken by `lock_raw` (in a forked child too: the
    /// lock is a word of memory, not tied to a thread).
    ///
    /// # Safety
    /// The caller holds the lock through `lock_raw` and no guard exists.
    pub unsafe fn unlock_raw(&self) {
        if self.state.swap(FREE, Ordering::Release) == CONTENDED {
            futex(&self.state, libc::FUTEX_WAKE, 1);
        }
    }
}

impl<T> Deref for OpGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the guard proves we hold the lock.
        unsafe { &*self.lock.data.get() }
    }
}

impl<T> DerefMut for OpGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the guard proves we hold the lock, exclusively.
        unsafe { &mut *self.lock.data.get() }
    }
}

impl<T> Drop for OpGuard<'_, T> {
    fn drop(&mut self) {
        // SAFETY: this guard holds the lock.
        unsafe { self.lock.unlock_raw() };
    }
}

impl<T> OpLock<T> {
    /// The data, for a caller that holds the lock through `lock_raw`.
    ///
    /// # Safety
    /// The caller holds the lock and no guard exists.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn data_raw(&self) -> &mut T {
        // SAFETY: per the caller, we hold the lock exclusively.
        unsafe { &mut *self.data.get() }
    }

    /// Exclusive access through `&mut self` (Drop).
    pub fn get_mut(&mut self) -> &mut T {
        self.data.get_mut()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn serialises_threads() {
        let l = Arc::new(OpLock::new(0u64));
        let hs: Vec<_> = (0..4)
            .map(|_| {
                let l = l.clone();
                std::thread::spawn(move || {
                    for _ in 0..20_000 {
                        *l.lock() += 1;
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        assert_eq!(*l.lock(), 80_000);
    }

    #[test]
    fn a_failed_try_lock_leaves_the_holder_alone() {
        let l = OpLock::new(0u32);
        let g = l.lock();
        assert!(l.try_lock().is_none());
        assert!(
            l.try_lock().is_none(),
            "the failed attempt released the lock"
        );
        drop(g);
        assert!(l.try_lock().is_some());
    }

    #[test]
    fn try_lock_and_lock_together_serialise() {
        let l = Arc::new(OpLock::new(0u64));
        let hs: Vec<_> = (0..4)
            .map(|i| {
                let l = l.clone();
                std::thread::spawn(move || {
                    let mut done = 0;
                    while done < 20_000 {
                        let g = if i % 2 == 0 {
                            l.try_lock()
                        } else {
                            Some(l.lock())
                        };
                        if let Some(mut g) = g {
                            let v = *g;
                            std::hint::spin_loop();
                            *g = v + 1;
                            done += 1;
                        }
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        assert_eq!(*l.lock(), 80_000);
    }

    #[test]
    fn raw_holder_excludes_guards_until_released() {
        let l = Arc::new(OpLock::new(1u32));
        l.lock_raw();
        assert!(l.try_lock().is_none());
        let l2 = l.clone();
        let t = std::thread::spawn(move || *l2.lock() + 1);
        std::thread::sleep(std::time::Duration::from_millis(20));
        // SAFETY: taken by lock_raw above, no guard exists.
        unsafe { l.unlock_raw() };
        assert_eq!(t.join().unwrap(), 2);
    }
}
