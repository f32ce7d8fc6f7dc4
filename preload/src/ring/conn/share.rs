//! One side of a connection held by several processes (after a fork).
//!
//! A ring end's state (the sender's tail and batch, the receiver's head and
//! place in a record) is private to a process; the ring itself is shared
//! memory a forked child maps too. So at any moment one process is the
//! side's *user*: it alone moves the ring. Once a fork has made the side
//! shared, every ring operation runs under the side's op lock and leaves
//! in shared words the exact stream positions it reached (bytes consumed,
//! bytes written, all published), and counts itself in `ops`.
//!
//! A process that finds another one recorded as the user:
//! * takes the side over when `ops` has not moved since the fork it knows
//!   of: its private state is then the user's own, copied by the fork;
//! * otherwise leaves the ring on everyone's behalf (`leave.rs`), with the
//!   shared positions: from then on every process holding the socket reads
//!   and writes the kernel socket, as they would on TCP.
//!
//! The op lock holds the holder's thread id; a holder that died (killed
//! inside an operation) is found with kill(tid, 0) and its lock taken
//! over.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::{process, sys};

thread_local! {
    /// This thread's id, with the fork generation it was read in (a forked
    /// child's thread has another id).
    static TID: Cell<(u64, i32)> = const { Cell::new((0, 0)) };
}

fn tid() -> u64 {
    let epoch = process::fork_epoch();
    TID.with(|t| {
        let (e, id) = t.get();
        if e == epoch && id != 0 {
            return id as u64;
        }
        let id = sys::gettid();
        t.set((epoch, id));
        id as u64
    })
}

/// The shared words of one side (the wire keeps them in memory every
/// holder maps).
#[derive(Clone, Copy)]
pub struct Share<'a> {
    /// The process recorded as the side's user.
    pub user: &'a AtomicU64,
    /// Thread id holding the op lock, 0 when free.
    pub lock: &'a AtomicU64,
    /// Operations the users made since the side was first shared.
    pub ops: &'a AtomicU64,
    /// Bytes of the peer's stream consumed, and of ours written (all
    /// published), after the last operation.
    pub consumed: &'a AtomicU64,
    pub written: &'a AtomicU64,
    /// Nonzero once the side left the ring.
    pub left: &'a AtomicU64,
    /// Processes holding the side (counted at forks and closes; a process
    /// killed without closing stays counted).
    pub holders: &'a AtomicU64,
}

fn alive(pid: u64) -> bool {
    // SAFETY: signal 0 only checks existence.
    pid != 0
        && unsafe {
            crate::sys::sys_call!(libc::SYS_kill, pid as i32, 0) == 0 || sys::errno() == libc::EPERM
        }
}

impl Share<'_> {
    /// Takes the op lock (a short wait: operations are short).
    pub fn lock(&self) {
        let me = tid();
        let mut spins = 0u32;
        loop {
            match self
                .lock
                .compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed)
            {
                Ok(_) => return,
                Err(holder) if spins % 1024 == 1023 && !alive(holder) => {
                    if self.steal(holder, me) {
                        return;
                    }
                }
                Err(_) => {}
            }
            spins = spins.wrapping_add(1);
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    fn steal(&self, holder: u64, me: u64) -> bool {
        self.lock
            .compare_exchange(holder, me, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }

    pub fn unlock(&self) {
        self.lock.store(0, Ordering::Release);
    }

    pub fn is_left(&self) -> bool {
        self.left.load(Ordering::Acquire) != 0
    }
}
