//! Handshake follow-up: a client whose offer the server neither took nor
//! declined in the segment asks the daemon (`Collect`) and falls back to
//! TCP on `Declined`/`Expired`; offers a server took are collected so the
//! daemon can forget them.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use ringsock_proto::Msg;

use super::{ensure_thread, wake, COLLECT_AFTER_NS};
use crate::plock::PLock;
use crate::process;
use crate::ring::ctl;
use crate::ring::tracked::Tracked;

static PENDING: PLock<Vec<Weak<dyn Tracked>>> = PLock::new(Vec::new(), Vec::new);
/// Pending handshakes among PENDING that only the daemon can settle
/// (verbs): followed up every tick instead of every COLLECT_EVERY_NS.
static URGENT: AtomicUsize = AtomicUsize::new(0);
static COLLECT: PLock<Vec<u64>> = PLock::new(Vec::new(), Vec::new);
/// A client started waiting for the server's decision.
pub fn note_pending(conn: &Arc<dyn Tracked>) {
    {
        let mut pending = PENDING.lock();
        if conn.urgent_follow_up() {
            URGENT.fetch_add(1, Ordering::AcqRel);
        }
        pending.push(Arc::downgrade(conn));
    }
    // The connection's report (`note_ring`, right after) wakes the thread
    // too; only an urgent follow-up needs it before the report delay.
    if conn.urgent_follow_up() {
        ensure_thread();
        wake();
    }
}

/// The server took the ring: let the daemon forget the offer.
pub fn note_accepted(offer_id: u64) {
    COLLECT.lock().push(offer_id);
    // No report follows: a thread asleep without a deadline must learn
    // that it has a collect to make.
    ensure_thread();
    wake();
}

/// Asks the daemon about each pending handshake that is due.
pub(super) fn follow_pending(now: u64) {
    let list: Vec<Weak<dyn Tracked>> = std::mem::take(&mut *PENDING.lock());
    let mut keep = Vec::new();
    for w in list {
        let Some(c) = w.upgrade() else { continue };
        if !c.still_pending() || c.is_released() {
            continue;
        }
        let urgent = c.urgent_follow_up();
        let age = now.saturating_sub(c.report_state().born_ns());
        if age < COLLECT_AFTER_NS && !urgent {
            keep.push(w);
            continue;
        }
        if age >= u64::from(crate::config::get().claim_wait_ms) * 1_000_000
            && c.report_state().offer_pid == process::pid()
        {
            // Nobody took the ring in time (an unshimmed process accepted,
            // or one that is slow or stopped). Where the wire decides by
            // itself, it withdraws, and the daemon only forgets the offer.
            if c.revoke() {
                let _ = ctl::call(
                    &Msg::Cancel {
                        offer_id: c.offer_id(),
                    },
                    &[],
                );
                continue;
            }
            // Otherwise withdraw the offer: the daemon refuses while the
            // offer is claimed or answered, so a server that took the ring
            // is never contradicted.
            match ctl::call(
                &Msg::Cancel {
                    offer_id: c.offer_id(),
                },
                &[],
            ) {
                Ok((Msg::Ok, _)) | Err(_) => {
                    c.decline_from_ctl(None);
                    continue;
                }
                // Claimed (or answered) meanwhile: the server took it, so
                // its decision is on the way; ask for it below.
                Ok(_) => {}
            }
        }
        match ctl::call(
            &Msg::Collect {
                offer_id: c.offer_id(),
            },
            &[],
        )
        .ok()
        {
            Some((Msg::Answered { payload }, _)) => {
                if c.answered(&payload) {
                    // A leave header may have come before the answer.
                    c.check_socket();
                } else {
                    keep.push(w);
                }
            }
            Some((Msg::Pending, _)) => keep.push(w),
            Some((Msg::Declined { reason }, _)) if c.report_state().offer_pid == process::pid() => {
                c.decline_from_ctl(Some(&reason))
            }
            Some((Msg::Declined { .. }, _))
            | Some((Msg::Expired, _))
            | Some((Msg::Error { .. }, _)) => {
                if c.report_state().offer_pid == process::pid() {
                    c.decline_from_ctl(None);
                } else {
                    keep.push(w);
                }
            }
            // The session is gone (daemon restart): the offer died with it.
            None => c.decline_from_ctl(None),
            Some(_) => keep.push(w),
        }
    }
    let mut pending = PENDING.lock();
    pending.extend(keep);
    let urgent = pending
        .iter()
        .filter(|w| w.upgrade().is_some_and(|c| c.urgent_follow_up()))
        .count();
    URGENT.store(urgent, Ordering::Release);
}

/// Lets the daemon forget the offers this process's servers took.
pub(super) fn collect_accepted() {
    let ids = std::mem::take(&mut *COLLECT.lock());
    for offer_id in ids {
        let _ = ctl::call(&Msg::Collect { offer_id }, &[]);
    }
}

/// Whether a pending handshake needs following up every tick (`URGENT`).
pub(super) fn urgent() -> bool {
    URGENT.load(Ordering::Acquire) > 0
}

/// Whether a handshake is waiting for the server's decision.
pub(super) fn has_pending() -> bool {
    !PENDING.lock().is_empty()
}

/// Whether a handshake or a collect is still owed to the daemon.
pub(super) fn has_work() -> bool {
    !PENDING.lock().is_empty() || !COLLECT.lock().is_empty()
}
