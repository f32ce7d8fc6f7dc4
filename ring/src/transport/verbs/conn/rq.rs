//! The receive queue: the receives that doorbell rings consume, and what
//! their immediates carry (a standing flag's end, a tail, a headerless
//! record).

use super::super::call_failed;
use super::super::tail_hint;
use crate::error::RingError;
use crate::layout::{bump, RingControl};
use rdma_sys::*;
use std::mem::offset_of;
use std::sync::atomic::Ordering;

use super::sq::wc_error;
use super::{lock, Shared, IMM_CARRIES_TAIL, IMM_ENDS_STANDING, IMM_HEADERLESS};

impl Shared {
    /// Posts `n` zero-length receives (doorbell rings consume them).
    /// Caller holds `rq`.
    pub(super) fn post_recvs(&self, n: u32) -> Result<(), RingError> {
        for _ in 0..n {
            let mut wr = ibv_recv_wr {
                wr_id: 0,
                next: std::ptr::null_mut(),
                sg_list: std::ptr::null_mut(),
                num_sge: 0,
            };
            let mut bad = std::ptr::null_mut();
            // SAFETY: qp valid; a receive without buffers is allowed (the
            // only sends we expect are zero-length WRITE_WITH_IMM).
            let rc = unsafe { ibv_post_recv(self.qp, &mut wr, &mut bad) };
            if rc != 0 {
                return Err(call_failed("ibv_post_recv", rc));
            }
        }
        Ok(())
    }

    /// Reaps receive completions (doorbell rings), learns what their
    /// immediates say (a standing flag's end, a tail) and reposts as many
    /// receives. Caller holds `rq`.
    pub(super) fn poll_recv(&self) -> Result<u32, RingError> {
        // SAFETY: ibv_wc is integers and a union of integers, for which
        // zero is valid.
        let mut wc: [ibv_wc; 16] = unsafe { std::mem::zeroed() };
        let mut total = 0;
        loop {
            // SAFETY: `recv_cq` is live while `self` is; `wc` has room for
            // the 16 completions the call may write.
            let n = unsafe { ibv_poll_cq(self.recv_cq, wc.len() as i32, wc.as_mut_ptr()) };
            if n < 0 {
                // A provider's own code, not an errno.
                return Err(call_failed("ibv_poll_cq", 0));
            }
            for w in &wc[..n as usize] {
                if w.status != ibv_wc_status::IBV_WC_SUCCESS {
                    self.rq_counters()
                        .cq_errors
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    // Kept where every later reap finds it: whoever drained
                    // this completion (a doorbell's waiter, say) may drop
                    // the error, and the queue pair carries nothing more.
                    // The rq -> sq lock order is fetch_tail's.
                    let e = wc_error(w.status);
                    lock(&self.sq).failed.get_or_insert_with(|| e.clone());
                    return Err(e);
                }
                if w.wc_flags & ibv_wc_flags::IBV_WC_WITH_IMM.0 == 0 {
                    continue;
                }
                // SAFETY: the union holds the immediate when the flag says
                // so (and is plain data either way). The peer chose it
                // (`kick_imm`, `post_tail_in_imm`): an epoch is only
                // compared, a tail is validated by the receiver.
                let imm = u32::from_be(unsafe { w.imm_data_invalidated_rkey_union.imm_data });
                if imm & IMM_ENDS_STANDING != 0 {
                    self.standing_ended
                        .store(imm & !IMM_ENDS_STANDING, Ordering::Release);
                } else if imm & IMM_CARRIES_TAIL != 0 {
                    // The ring's WRITE placed the slots before this
                    // completion: raise our copy's tail over them.
                    let tail =
                        self.ctrl_word(self.layout.in_ctrl, offset_of!(RingControl, local_tail));
                    tail_hint::apply(tail, imm & !IMM_CARRIES_TAIL);
                } else if imm & IMM_HEADERLESS != 0 {
                    // The payload is placed; the header is ours to write.
                    self.place_headerless(imm & !IMM_HEADERLESS)?;
                }
            }
            // Under the receive-queue lock: single writer.
            bump(&self.rq_counters().rings_received, n as u64);
            self.post_recvs(n as u32)?;
            total += n as u32;
            if (n as usize) < wc.len() {
                return Ok(total);
            }
        }
    }
}
