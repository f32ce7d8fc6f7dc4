//! The report queue's rules for opens and closes of one connection: the
//! daemon hears a close exactly when it heard the open.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use ringsock_proto::Transport;

use super::{
    cancel_open, claim_open_cell, close_queued_open, closed_in, renumbered_in, take_due,
    taken_over_in, tcp_ticket, Next, Report, OPEN_CELLS, REPORTS, REPORT_DELAY_NS, TCP_OPENS,
    TCP_REPORT_DELAY_NS,
};
use crate::process;
use crate::ring::tracked::{ReportState, Tracked};

struct Fake {
    st: ReportState,
}

impl Tracked for Fake {
    fn offer_id(&self) -> u64 {
        1
    }
    fn local(&self) -> SocketAddr {
        "127.0.0.1:7000".parse().unwrap()
    }
    fn peer(&self) -> SocketAddr {
        "127.0.0.1:41899".parse().unwrap()
    }
    fn report_state(&self) -> &ReportState {
        &self.st
    }
    fn transport(&self) -> Transport {
        Transport::Shm
    }
    fn socket_fd(&self) -> RawFd {
        -1
    }
    fn check_socket(&self) {}
    fn flush_ring(&self) {}
    fn try_flush_ring(&self) -> bool {
        true
    }
    fn is_released(&self) -> bool {
        false
    }
    fn still_pending(&self) -> bool {
        false
    }
    fn decline_from_ctl(&self, _reason: Option<&str>) {}
}

fn conn() -> Arc<dyn Tracked> {
    let c = Fake {
        st: ReportState::new(),
    };
    c.st.fd.store(7, Ordering::Relaxed);
    Arc::new(c)
}

fn open(c: &Arc<dyn Tracked>) -> Report {
    Report::Ring(c.clone(), 7, None)
}

/// What `q` holds, as (kind, same connection as `c`).
fn kinds(q: &VecDeque<(u64, Report)>, c: &Arc<dyn Tracked>) -> Vec<(&'static str, bool)> {
    q.iter()
        .map(|(_, r)| match r {
            Report::Ring(o, _, _) => ("open", Arc::ptr_eq(o, c)),
            Report::Fallback(o) => ("fallback", Arc::ptr_eq(o, c)),
            Report::RingClosed(o) => ("close", Arc::ptr_eq(o, c)),
            Report::Renumbered(o) => ("renumbered", Arc::ptr_eq(o, c)),
            Report::Tcp { .. } => ("tcp", false),
            Report::Closed(..) => ("tcp close", false),
            Report::Cancelled(_) => ("cancelled", false),
        })
        .collect()
}

/// Sends the front report as the thread does once it is due.
fn send_front(q: &mut VecDeque<(u64, Report)>) -> Report {
    match take_due(&REPORTS, q, u64::MAX / 2, REPORT_DELAY_NS) {
        Next::Send(r) => r,
        _ => panic!("nothing due"),
    }
}

#[test]
fn a_renumbered_connection_is_reported_under_its_new_fd() {
    let c = conn();
    let me = process::pid();
    // Its open still queued: the open names the new number, nothing more.
    let mut q = VecDeque::from([(0, open(&c))]);
    assert!(!renumbered_in(&mut q, c.clone(), 7, 9, me, 1));
    assert!(matches!(q[0].1, Report::Ring(_, 9, _)));
    // Its open sent: a report under the new number follows it, and the
    // close after it.
    let _sent = send_front(&mut q);
    assert!(renumbered_in(&mut q, c.clone(), 9, 11, me, 2));
    assert!(closed_in(&mut q, c.clone(), me, 3));
    assert_eq!(kinds(&q, &c), [("renumbered", true), ("close", true)]);
}

#[test]
fn a_close_never_heard_of_is_not_sent() {
    let c = conn();
    let me = process::pid();
    let mut q = VecDeque::from([(0, open(&c))]);
    assert!(!closed_in(&mut q, c.clone(), me, 1));
    assert!(q.is_empty());
}

#[test]
fn a_parent_using_a_shared_ring_before_its_report_queues_one_open() {
    // A fork (redis BGSAVE) made the ring shared while its open was still
    // queued; the parent's next use takes it over again.
    let c = conn();
    let me = process::pid();
    let mut q = VecDeque::from([(0, open(&c))]);
    assert!(taken_over_in(&mut q, c.clone(), me, 1));
    assert_eq!(kinds(&q, &c), [("open", true)]);
    let _sent = send_front(&mut q);
    assert!(q.is_empty());
    // Reported now: a later use queues nothing.
    assert!(!taken_over_in(&mut q, c.clone(), me, 2));
    assert!(closed_in(&mut q, c.clone(), me, 3));
    assert_eq!(kinds(&q, &c), [("close", true)]);
}

#[test]
fn a_close_after_a_sent_open_is_queued_whatever_else_is_queued() {
    let c = conn();
    let other = conn();
    let me = process::pid();
    let mut q = VecDeque::from([(0, open(&c))]);
    let _sent = send_front(&mut q);
    // A fallback's re-report, and another connection's open, queued since.
    q.push_back((1, Report::Fallback(c.clone())));
    q.push_back((2, open(&other)));
    assert!(closed_in(&mut q, c.clone(), me, 3));
    assert_eq!(kinds(&q, &c), [("open", false), ("close", true)]);
}

#[test]
fn a_child_takes_over_with_its_copy_of_the_parents_queue() {
    let c = conn();
    let me = process::pid();
    // The parent's open, queued when it forked: the child sends it as its
    // own rather than a second one.
    let mut q = VecDeque::from([(0, open(&c))]);
    assert!(taken_over_in(&mut q, c.clone(), me, 1));
    assert_eq!(kinds(&q, &c), [("open", true)]);
    // The parent sent its open before the fork: the child queues its own.
    let d = conn();
    d.report_state()
        .reporter_pid
        .store(me + 1, Ordering::Release);
    let mut q = VecDeque::new();
    assert!(taken_over_in(&mut q, d.clone(), me, 1));
    assert_eq!(kinds(&q, &d), [("open", true)]);
    // The child closes what it inherited and never reported: nothing sent.
    let e = conn();
    e.report_state()
        .reporter_pid
        .store(me + 1, Ordering::Release);
    let mut q = VecDeque::new();
    assert!(!closed_in(&mut q, e.clone(), me, 1));
    assert!(q.is_empty());
}

/// A plain-TCP open with `ticket`, for fd `fd`.
fn tcp_open(fd: RawFd, ticket: u64) -> (u64, Report) {
    let peer: SocketAddr = "127.0.0.1:80".parse().unwrap();
    let r = Report::Tcp {
        fd,
        local: None,
        peer,
        reason: crate::attached::TcpReason::ExcludedPort,
        ticket,
    };
    (ticket, r)
}

#[test]
fn a_plain_close_cancels_its_open_by_ticket_and_the_front_is_never_cancelled() {
    let c = conn();
    let mut q: VecDeque<(u64, Report)> = (5..9).map(|t| tcp_open(t as RawFd, t)).collect();
    // The middle one: its place stays, cancelled.
    assert!(cancel_open(&mut q, 6, 6));
    assert_eq!(
        kinds(&q, &c),
        [
            ("tcp", false),
            ("cancelled", false),
            ("tcp", false),
            ("tcp", false)
        ]
    );
    assert!(!cancel_open(&mut q, 6, 6), "cancelled once");
    // The front: it and the cancelled place behind it go.
    assert!(cancel_open(&mut q, 5, 5));
    assert_eq!(kinds(&q, &c), [("tcp", false), ("tcp", false)]);
    // Without a ticket, found by its fd from the back.
    assert!(cancel_open(&mut q, 8, 0));
    assert_eq!(kinds(&q, &c), [("tcp", false), ("cancelled", false)]);
    // Sent: no longer queued, and what stays behind it is not sent.
    let mut sent = Vec::new();
    while let Next::Send(r) = take_due(&TCP_OPENS, &mut q, u64::MAX / 2, TCP_REPORT_DELAY_NS) {
        sent.push(r);
    }
    assert!(matches!(sent[..], [Report::Tcp { ticket: 7, .. }]));
    assert!(q.is_empty());
    assert!(!cancel_open(&mut q, 7, 7));
    super::TCP_ADDRS.lock().remove(&7);
}

#[test]
fn a_plain_close_drops_its_queued_open_through_its_cell() {
    let c = conn();
    let base = 10_000u64;
    let mut q = VecDeque::new();
    for t in base..base + 3 {
        claim_open_cell(t, q.front().and_then(|(_, r)| tcp_ticket(r)));
        q.push_back(tcp_open(t as RawFd, t));
    }
    assert!(close_queued_open(base + 1));
    assert!(!close_queued_open(base + 1), "closed once");
    assert_eq!(kinds(&q, &c).len(), 3, "no lock taken, nothing moved");
    let due = |q: &mut VecDeque<(u64, Report)>| {
        take_due(&TCP_OPENS, q, u64::MAX / 2, TCP_REPORT_DELAY_NS)
    };
    assert!(matches!(due(&mut q), Next::Send(Report::Tcp { ticket, .. }) if ticket == base));
    assert!(!close_queued_open(base), "taken: its close goes after it");
    assert!(close_queued_open(base + 2));
    assert!(
        matches!(due(&mut q), Next::Empty),
        "the closed ones are dropped"
    );
    // A cell whose open is still queued is not taken over.
    let later = base + 1 + OPEN_CELLS as u64;
    claim_open_cell(later, Some(base + 1));
    assert!(!close_queued_open(later), "no cell of its own");
    // Once that open left the queue, it is.
    claim_open_cell(later, None);
    assert!(close_queued_open(later));
    super::TCP_ADDRS.lock().remove(&(base as RawFd));
}
