//! Re-entrancy guard: is this thread running shim code right now?
//!
//! Inside `libringsock.so`, a call to `close`, `read`, `connect`... binds to
//! our own hook (the preloaded library is first in the symbol scope). When
//! that happens on a socket the shim tracks (the ring layer closing an fd,
//! the attacher calling `connect` on the socket it is attaching), the hook
//! must go straight to libc instead of dispatching again. Hooks consult
//! `active()` only on their slow path (tracked fds, socket creation), so the
//! pass-through fast path never touches thread-local storage.
//!
//! The flag lives in `ThreadState`, a `const`-initialised thread-local
//! without a destructor: its access never allocates and registers nothing
//! at thread exit. A shared library's thread-locals are reached through
//! `__tls_get_addr` (the general-dynamic model: about a dozen instructions
//! a look), so a scope keeps the address it found on entry, and its exit
//! (and any per-thread note the data path keeps in `ThreadState`) uses
//! that instead of looking again.
//!
//! A program's signal handler never runs inside a scope (defer.rs): it is
//! deferred to the end of the exported entry point that entered the scope
//! (`defer::flush` in the hook epilogues, after every value of the call is
//! dropped, so a handler that longjmps skips nothing of the shim's), or to
//! a sleep inside one.

use std::cell::Cell;

/// What the shim keeps per thread on the data path, in one thread-local so
/// that one TLS lookup reaches all of it (see the module docs).
pub struct ThreadState {
    /// Inside a `Shim` scope.
    in_shim: Cell<bool>,
}

thread_local! {
    static THREAD: ThreadState = const {
        ThreadState {
            in_shim: Cell::new(false),
        }
    };
}

/// True while the current thread is inside a `Shim` scope.
#[inline]
pub fn active() -> bool {
    THREAD.with(|t| t.in_shim.get())
}

/// Marks the current thread as running shim code until dropped. Nested
/// scopes are fine: the outermost one restores "not in shim".
///
/// Holds a pointer to the thread's `ThreadState`, which makes it neither
/// `Send` nor `Sync`: it lives and drops on the thread that entered.
#[must_use = "the guard only lasts as long as the value"]
pub struct Shim {
    was: bool,
    thread: *const ThreadState,
}

/// Enters a shim scope.
#[inline]
pub fn enter() -> Shim {
    THREAD.with(|t| Shim {
        was: t.in_shim.replace(true),
        thread: t,
    })
}

impl Shim {
    /// The entering thread's state, without another TLS lookup.
    #[inline]
    pub fn thread(&self) -> &ThreadState {
        // SAFETY: `thread` is the address of the entering thread's
        // ThreadState, and only that thread holds this !Send guard. The
        // thread-local is const-initialised and has no destructor, so its
        // storage is valid, and never torn down, for as long as the thread
        // runs any code, this guard's drop included (a forked child's copy
        // of the thread has it at the same address). Cells are only
        // touched from their own thread, so the shared borrow is sound.
        unsafe { &*self.thread }
    }
}

impl Drop for Shim {
    #[inline]
    fn drop(&mut self) {
        let was = self.was;
        self.thread().in_shim.set(was);
    }
}

/// Leaves the shim scope for a blocking sleep (a ppoll or epoll_wait that
/// waits for a ring or socket), until dropped. A signal handler the
/// program installed may run on this thread while it sleeps, and its
/// calls are the program's, not ours: iperf3's SIGTERM handler writes
/// CLIENT_TERMINATE on its control socket while the main thread sleeps in
/// select, and that write must go through the ring, not straight to the
/// kernel socket underneath it. The sleeping thread holds no lock of the
/// shim's, so the handler's call cannot deadlock on one.
///
/// Signals deferred earlier in the call must interrupt the sleep, as a
/// signal that arrived during a kernel call interrupts its wait: the sleep
/// passes `Sleep::mask` to its ppoll or epoll_pwait, which unblocks them
/// for the wait only.
pub fn sleeping() -> Sleep {
    let was = THREAD.with(|t| t.in_shim.replace(false));
    Sleep {
        was,
        deferred: super::defer::requeue_for_sleep(),
        // SAFETY: an all-zero sigset_t is the empty set.
        mask: unsafe { std::mem::zeroed() },
    }
}

/// A sleeping scope (see `sleeping`).
#[must_use = "the scope only lasts as long as the value"]
pub struct Sleep {
    was: bool,
    /// Signals deferred before the sleep, queued again and still blocked.
    deferred: u64,
    /// The wait's mask when it must differ from the program's.
    mask: libc::sigset_t,
}

impl Sleep {
    /// The signal mask for the wait, given the program's (None: the
    /// thread's). The pointer is valid while `self` lives.
    pub fn mask(&mut self, program: Option<*const libc::sigset_t>) -> *const libc::sigset_t {
        match program {
            // The program's wait mask is exactly what the wait would have
            // had; a deferred signal it blocks waits for `drop`.
            Some(p) => p,
            None if self.deferred == 0 => std::ptr::null(),
            None => {
                let set = crate::signals::mask::current() & !self.deferred;
                // SAFETY: a sigset_t is at least 8 bytes and 8-aligned; the
                // kernel reads its first 8 (_NSIG / 8), our set's bits.
                unsafe { *(&mut self.mask as *mut libc::sigset_t).cast::<u64>() = set };
                &self.mask
            }
        }
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        // Those the wait's mask kept blocked are delivered here.
        crate::signals::mask::unblock(self.deferred);
        let was = self.was;
        THREAD.with(|t| t.in_shim.set(was));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sleeping_leaves_and_restores() {
        let _a = enter();
        {
            let _s = sleeping();
            assert!(!active());
            {
                // A signal handler's hooked call during the sleep.
                let _h = enter();
                assert!(active());
            }
            assert!(!active());
        }
        assert!(active());
    }

    #[test]
    fn nests_and_restores() {
        assert!(!active());
        {
            let _a = enter();
            assert!(active());
            {
                let _b = enter();
                assert!(active());
            }
            assert!(active());
        }
        assert!(!active());
    }
}
