//! The doorbell of a connection end: draining the rings on the receive
//! CQ's completion channel, and blocking on it.

use super::super::call_failed;
use super::super::ibv::{ibv_ack_cq_events, ibv_get_cq_event};
use crate::error::RingError;
use rdma_sys::*;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use super::{lock, Doorbell};

impl Doorbell {
    /// The region header's `user` words (`VerbsHeader::user`).
    pub fn user_words(&self) -> &[AtomicU64; 8] {
        &self.shared.region.header().user
    }

    pub fn fd(&self) -> std::os::fd::RawFd {
        // SAFETY: `channel` is live while `shared` is (destroyed only on
        // its drop). A plain field read.
        unsafe { (*self.shared.channel).fd }
    }

    /// Consumes pending rings; returns whether there were any. Leaves the
    /// CQ armed, so a ring arriving after this returns makes `fd()`
    /// readable.
    pub fn drain(&self) -> Result<bool, RingError> {
        let s = &*self.shared;
        let _g = lock(&s.rq);
        let mut events = 0u32;
        loop {
            let mut cq = std::ptr::null_mut();
            let mut ctx = std::ptr::null_mut();
            // SAFETY: channel valid and non-blocking: fails with EAGAIN
            // when no event is pending.
            if unsafe { ibv_get_cq_event(s.channel, &mut cq, &mut ctx) } != 0 {
                break;
            }
            events += 1;
        }
        if events > 0 {
            // SAFETY: acks exactly the events just received on recv_cq.
            unsafe { ibv_ack_cq_events(s.recv_cq, events) };
        }
        let mut got = self.shared.poll_recv()?;
        // SAFETY: `recv_cq` is live while `shared` is; 1 = solicited
        // events only.
        let rc = unsafe { ibv_req_notify_cq(s.recv_cq, 1) };
        if rc != 0 {
            return Err(call_failed("ibv_req_notify_cq", rc));
        }
        // A ring that completed between the poll and the arm raised no
        // event: look once more.
        got += self.shared.poll_recv()?;
        // An event whose completion the receiver already reaped (its
        // check before looking at the tail, `fetch_tail`) still rings:
        // the ring may have been for this end's other waiter.
        Ok(got > 0 || events > 0)
    }

    /// Blocks until rung or `timeout` passes (`None`: forever). Returns
    /// whether it was rung.
    pub fn wait(&self, timeout: Option<Duration>) -> Result<bool, RingError> {
        if self.drain()? {
            return Ok(true);
        }
        let mut pfd = libc::pollfd {
            fd: self.fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ts = timeout.map(|d| libc::timespec {
            tv_sec: d.as_secs().min(i32::MAX as u64) as _,
            tv_nsec: d.subsec_nanos() as _,
        });
        // SAFETY: one valid pollfd; ts (if any) lives across the call.
        let r = unsafe {
            libc::syscall(
                libc::SYS_ppoll,
                &mut pfd as *mut libc::pollfd,
                1,
                ts.as_ref()
                    .map_or(std::ptr::null(), |t| t as *const libc::timespec),
                std::ptr::null::<libc::sigset_t>(),
                8,
            )
        };
        if r < 0 && RingError::last_os() != RingError::Os(libc::EINTR) {
            return Err(RingError::last_os());
        }
        self.drain()
    }
}
