//! A connection side shared by processes after a fork (see `share`): the
//! fork itself, the op lock around ring operations, taking a side over,
//! and leaving the ring on behalf of every process that holds the socket.

use std::sync::atomic::Ordering;

use super::leave::Leave;
use super::share::Share;
use super::{RingConn, TxSlot, Wire, MODE_RING, MODE_TCP};
use crate::process;
use crate::ring::sockio::send_all_bounded;

/// What a ring operation found on entering a shared side.
pub(super) enum Entered<'a> {
    /// The side is not shared: go on without the op lock.
    Alone,
    /// The op lock is ours; this process is the side's user.
    Shared(Share<'a>),
    /// The side left the ring: use the kernel socket.
    Left,
}

impl<W: Wire> RingConn<W> {
    /// Before a fork, in the forking thread: holds both ring ends (no
    /// thread of ours is inside one when the child's copy is taken),
    /// publishes everything, and records the positions the child may take
    /// the side over from. `fork_finish` undoes the holding on both sides.
    pub(crate) fn fork_prepare(&self) {
        if self.mode() == super::MODE_PENDING {
            // The shared rule is the ring's: a side still waiting for the
            // server's decision gets it first (bounded by the wire).
            W::await_decision(self, false);
        }
        self.tx.lock_raw();
        self.rx.lock_raw();
        let Some(share) = self.wire.share() else {
            return;
        };
        if self.mode() != MODE_RING || share.is_left() {
            return;
        }
        share.lock();
        if W::is_user(self) {
            // SAFETY: both locks are held (lock_raw above), no guard exists.
            let (tx, rx) = unsafe { (self.tx.data_raw(), self.rx.data_raw()) };
            if let Some(t) = tx.as_mut() {
                let _ = t.flush();
                share.written.store(t.bytes_written(), Ordering::Release);
            }
            if let Some(r) = rx.as_mut() {
                share.consumed.store(r.bytes_consumed(), Ordering::Release);
            }
        }
        // Before the first fork the side has one holder, uncounted.
        if share.holders.load(Ordering::Acquire) == 0 {
            share.holders.store(1, Ordering::Release);
        }
        share.holders.fetch_add(1, Ordering::AcqRel);
        self.forked.store(true, Ordering::Release);
        self.forked_ops
            .store(share.ops.load(Ordering::Acquire), Ordering::Release);
        share.unlock();
    }

    /// After the fork, in parent and child alike.
    pub(crate) fn fork_finish(&self) {
        // SAFETY: fork_prepare took both with lock_raw in this thread (the
        // child's copy of the words says the same), and no guard exists.
        unsafe {
            self.rx.unlock_raw();
            self.tx.unlock_raw();
        }
    }

    /// Enters a ring operation on a side a fork made shared: takes the op
    /// lock and makes sure this process is the side's user, taking it over
    /// or leaving the ring (see `share`). `held` is the sender slot when
    /// the caller holds its lock: a leave waits for the peer's answer
    /// through it (the lock is not taken twice).
    #[inline]
    pub(super) fn enter_shared(&self, held: Option<&mut TxSlot<W>>) -> Entered<'_> {
        if !self.forked.load(Ordering::Relaxed) {
            return Entered::Alone;
        }
        self.enter_forked(held)
    }

    /// `enter_shared` on a side a fork shared.
    #[inline(never)]
    fn enter_forked(&self, held: Option<&mut TxSlot<W>>) -> Entered<'_> {
        let Some(share) = self.wire.share() else {
            return Entered::Alone;
        };
        share.lock();
        if share.is_left() {
            share.unlock();
            self.notice_shared_leave();
            return Entered::Left;
        }
        let me = process::pid() as u64;
        if share.user.load(Ordering::Acquire) != me {
            if share.ops.load(Ordering::Acquire) == self.forked_ops.load(Ordering::Acquire)
                && W::can_take_over(self)
            {
                // Nobody moved the ring since the fork we know of: our
                // state is the user's, copied by that fork.
                share.user.store(me, Ordering::Release);
            } else {
                self.leave_shared(&share, held);
                share.unlock();
                return Entered::Left;
            }
        }
        if share.holders.load(Ordering::Acquire) <= 1 {
            // Every other holder closed its copy: alone again.
            self.forked.store(false, Ordering::Release);
        }
        Entered::Shared(share)
    }

    /// Ends an operation entered as `Shared`, with the positions it
    /// reached.
    pub(super) fn exit_shared(
        &self,
        share: Share<'_>,
        consumed: Option<u64>,
        written: Option<u64>,
    ) {
        if let Some(c) = consumed {
            share.consumed.store(c, Ordering::Release);
        }
        if let Some(w) = written {
            share.written.store(w, Ordering::Release);
        }
        share.ops.fetch_add(1, Ordering::AcqRel);
        share.unlock();
    }

    /// Another process left the ring for the side: this copy of the
    /// connection follows on the kernel socket.
    pub(super) fn notice_shared_leave(&self) {
        if self.wire.share().is_some_and(|s| s.is_left())
            && self
                .mode
                .compare_exchange(MODE_RING, MODE_TCP, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            crate::ring::watch::unwatch(self, self.tcp_fd());
            self.wire.ring_own_bell();
        }
    }

    /// Leaves the ring for a side whose user is another process, with the
    /// positions it published (under the op lock, which the caller holds;
    /// `held` as for `enter_shared`).
    fn leave_shared(&self, share: &Share<'_>, held: Option<&mut TxSlot<W>>) {
        let header = Leave {
            consumed: share.consumed.load(Ordering::Acquire),
            end: share.written.load(Ordering::Acquire),
        };
        share.left.store(1, Ordering::Release);
        self.leaving.store(true, Ordering::Release);
        let sent = send_all_bounded(self.tcp_fd(), &header.encode());
        self.mode.store(MODE_TCP, Ordering::Release);
        log::info!(
            "{}: a second process uses the connection; it leaves the ring at {} bytes in, \
             {} out",
            self.ends(),
            header.consumed,
            header.end
        );
        // Whoever sleeps on the ring (the user included: the bell is the
        // same eventfd in every process) looks again.
        self.wire.ring_own_bell();
        if sent.is_err() {
            self.leaving.store(false, Ordering::Release);
            self.fail_hard(libc::ECONNRESET);
            return;
        }
        let _ = self.await_ack(held);
        self.leaving.store(false, Ordering::Release);
    }

    /// This process closes (or leaves at exit) its copy of a shared side.
    pub(super) fn count_out(&self) {
        if !self.forked.load(Ordering::Relaxed) || self.counted_out.swap(true, Ordering::AcqRel) {
            return;
        }
        if let Some(share) = self.wire.share() {
            let _ = share
                .holders
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |h| h.checked_sub(1));
        }
    }
}
