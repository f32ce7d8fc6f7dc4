//! A worker thread's sleep that no posted job can miss.
//!
//! The shim's background thread (flush timer, status reports, handshake
//! follow-up) sleeps on an eventfd while it has nothing to do, and wakes
//! for work that program threads post (a queue entry, a dirty counter).
//! Writing the eventfd is a system call, so a poster should make it only
//! when the worker may actually be asleep. That is Dekker's pattern again:
//!
//! - worker: take a `ticket`, look for work, then (finding none)
//!   `may_sleep`: W1 store `parked = 1`, W2 SeqCst fence, W3 load
//!   `requests`; sleep only if it still equals the ticket;
//! - poster: post the work, then `request`: P1 bump `requests`, P2 SeqCst
//!   fence, P3 load `parked`; ring the eventfd if it is set.
//!
//! If the worker sleeps and no eventfd write comes, W3 missed P1 and P3
//! missed W1: W3 < P1 and P3 < W1 in the fences' total order, with W1 <
//! W2 < W3 and P1 < P2 < P3, a cycle. A post that happened before the
//! ticket is seen by the worker's look for work (the ticket load reads the
//! bump made after the post). The poster must bump `requests` on every
//! post, not only when it sees `parked`: checking `parked` first loses a
//! post made between the worker's look and its W1; `ring/tests/loom_park.rs`
//! models both.

use crate::sync::{fence, AtomicU64, Ordering};

/// The shared state of one worker's sleep (see the module documentation).
pub struct WorkerPark {
    /// Bumped by every post.
    requests: AtomicU64,
    /// 1 while the worker is, or is about to be, asleep on its eventfd.
    parked: AtomicU64,
}

impl WorkerPark {
    #[cfg(not(loom))]
    pub const fn new() -> Self {
        WorkerPark {
            requests: AtomicU64::new(0),
            parked: AtomicU64::new(0),
        }
    }

    /// loom's atomics cannot be built in a `const fn`.
    #[cfg(loom)]
    pub fn new() -> Self {
        WorkerPark {
            requests: AtomicU64::new(0),
            parked: AtomicU64::new(0),
        }
    }

    /// Worker, before it looks for work.
    pub fn ticket(&self) -> u64 {
        self.requests.load(Ordering::Acquire)
    }

    /// Worker, after finding no work: whether it may sleep. With
    /// `announce`, posters will ring its eventfd until `woke`; without
    /// (a short timed sleep), they will not, and only a post made since
    /// `ticket` keeps it awake.
    pub fn may_sleep(&self, ticket: u64, announce: bool) -> bool {
        if announce {
            self.parked.store(1, Ordering::Relaxed);
        }
        fence(Ordering::SeqCst);
        self.requests.load(Ordering::Relaxed) == ticket
    }

    /// Worker, after its sleep (or after deciding not to sleep).
    pub fn woke(&self) {
        self.parked.store(0, Ordering::Relaxed);
    }

    /// Poster, after posting: whether the worker may be asleep, so that
    /// the caller must ring its eventfd.
    pub fn request(&self) -> bool {
        self.requests.fetch_add(1, Ordering::Release);
        fence(Ordering::SeqCst);
        self.parked.load(Ordering::Relaxed) != 0
    }

    /// The shim's first poster, for the loom model that shows it loses a
    /// wake-up: it looked at `parked` before bumping `requests`.
    #[cfg(loom)]
    #[doc(hidden)]
    pub fn request_if_parked(&self) -> bool {
        fence(Ordering::SeqCst);
        self.parked.load(Ordering::Relaxed) != 0 && self.request()
    }
}

impl Default for WorkerPark {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::WorkerPark;

    #[test]
    fn a_post_after_the_ticket_keeps_the_worker_awake() {
        let p = WorkerPark::new();
        let t = p.ticket();
        assert!(!p.request(), "nobody parked yet: no eventfd write");
        assert!(!p.may_sleep(t, true));
        p.woke();
    }

    #[test]
    fn a_parked_worker_is_rung() {
        let p = WorkerPark::new();
        let t = p.ticket();
        assert!(p.may_sleep(t, true));
        assert!(p.request());
        p.woke();
        assert!(!p.request());
    }

    #[test]
    fn a_timed_sleep_is_not_announced() {
        let p = WorkerPark::new();
        let t = p.ticket();
        assert!(p.may_sleep(t, false));
        assert!(!p.request());
    }
}
