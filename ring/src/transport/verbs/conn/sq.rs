//! The send queue: posting work requests (slot, word and zero-copy
//! WRITEs, held slot writes chained to the next post), the sequence
//! numbers whose completions recycle the queue, and giving up on it.

use super::super::call_failed;
use crate::error::{RingError, VerbsError};
use crate::layout::bump;
use crate::sleep::backoff::REQUEST_LIMIT;
use rdma_sys::*;

use super::{Shared, SqState, Src, INLINE_SLOT_BYTES, STAGING_WORDS};

/// A failed work completion: the connection is dead after any.
pub(super) fn wc_error(status: ibv_wc_status::Type) -> RingError {
    use ibv_wc_status::*;
    let what = match status {
        IBV_WC_REM_ACCESS_ERR => {
            "remote access error (the peer's rkey/address do not cover the write)"
        }
        IBV_WC_RETRY_EXC_ERR => {
            "transport retry count exceeded (peer unreachable or its QP is gone)"
        }
        IBV_WC_RNR_RETRY_EXC_ERR => "receiver-not-ready retries exceeded",
        IBV_WC_WR_FLUSH_ERR => "work request flushed (the queue pair is in error)",
        IBV_WC_LOC_PROT_ERR | IBV_WC_LOC_ACCESS_ERR => {
            "local protection error (source not in the registered region)"
        }
        IBV_WC_LOC_LEN_ERR => "local length error",
        // What Soft-RoCE reports when it cannot route to the peer's GID
        // from its netdev: rxe (Linux 6.1) routes in the initial network
        // namespace only, so an rxe device on a netdev moved into another
        // namespace fails every send this way (scripts/softroce-vm.d/check.sh).
        IBV_WC_LOC_QP_OP_ERR => {
            "local QP operation error (on Soft-RoCE: no route from the device's netdev \
             to the peer's GID address in the initial network namespace)"
        }
        IBV_WC_REM_INV_REQ_ERR => "remote invalid request",
        IBV_WC_REM_OP_ERR => "remote operation error",
        _ => "work request failed",
    };
    VerbsError::Completion { status, what }.into()
}

impl Shared {
    /// Reaps send completions. Caller holds `sq`.
    pub(super) fn reap(&self, st: &mut SqState) -> Result<(), RingError> {
        if let Some(e) = &st.failed {
            return Err(e.clone());
        }
        // SAFETY: ibv_wc is integers and a union of integers, for which
        // zero is valid.
        let mut wc: [ibv_wc; 16] = unsafe { std::mem::zeroed() };
        loop {
            // SAFETY: `send_cq` is live while `self` is; `wc` has room for
            // the 16 completions the call may write.
            let n = unsafe { ibv_poll_cq(self.send_cq, wc.len() as i32, wc.as_mut_ptr()) };
            if n < 0 {
                // A provider's own code, not an errno.
                let e = call_failed("ibv_poll_cq", 0);
                st.failed = Some(e.clone());
                return Err(e);
            }
            for (i, w) in wc[..n as usize].iter().enumerate() {
                if w.status != ibv_wc_status::IBV_WC_SUCCESS {
                    bump(&self.counters().completions, i as u64);
                    self.rq_counters()
                        .cq_errors
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let e = wc_error(w.status);
                    st.failed = Some(e.clone());
                    return Err(e);
                }
                st.done = st.done.max(w.wr_id);
            }
            bump(&self.counters().completions, n as u64);
            if (n as usize) < wc.len() {
                return Ok(());
            }
        }
    }

    /// The sequence number of the next request, once the send queue has
    /// room for `n` more; the connection's error if it failed. Caller
    /// holds `sq`. Reaping makes progress: at least one outstanding
    /// request is signaled (`post` forces one every sq_depth / 2; READs
    /// always are).
    fn next_seq_for(&self, st: &mut SqState, n: u64) -> Result<u64, RingError> {
        if let Some(e) = &st.failed {
            return Err(e.clone());
        }
        let mut wait = crate::sleep::backoff::CompletionWait::new();
        while st.posted + n - st.done > self.sq_depth as u64 {
            self.reap(st)?;
            if !wait.relax_within(REQUEST_LIMIT) {
                return Err(self.give_up(st, "WRITE"));
            }
        }
        Ok(st.posted + 1)
    }

    /// Fails the connection after a request went unanswered for
    /// `REQUEST_LIMIT`. The queue pair goes to the error state, which
    /// flushes every outstanding request: none may still read the
    /// program's memory (a zero-copy WRITE) or land later. Caller holds
    /// `sq`.
    pub(super) fn give_up(&self, st: &mut SqState, op: &'static str) -> RingError {
        // SAFETY: zeroed is a valid ibv_qp_attr.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_ERR;
        // A queue pair that cannot even be moved to the error state is
        // beyond use already; the connection fails either way.
        let _ = self.modify(
            &mut a,
            ibv_qp_attr_mask::IBV_QP_STATE,
            "ibv_modify_qp to ERR",
        );
        let e = RingError::from(VerbsError::Unanswered {
            op,
            secs: REQUEST_LIMIT.as_secs(),
        });
        st.failed = Some(e.clone());
        e
    }

    pub(super) fn next_seq(&self, st: &mut SqState) -> Result<u64, RingError> {
        self.next_seq_for(st, 1)
    }

    /// Posts one WRITE (`imm`: WRITE_WITH_IMM, solicited, no payload),
    /// chained behind the held slot write if there is one: one
    /// `ibv_post_send`, so one system call on Soft-RoCE, for a batch and
    /// its tail. Caller holds `sq`. Returns the request's sequence number.
    pub(super) fn post(
        &self,
        st: &mut SqState,
        src: Src,
        remote: u64,
        signaled: bool,
    ) -> Result<u64, RingError> {
        let held = st.held_slots.take();
        let n = 1 + u64::from(held.is_some());
        let first = self.next_seq_for(st, n)?;
        // SAFETY: ibv_send_wr and ibv_sge are plain data (pointers may be
        // null); `fill_wr` sets every field the opcode uses.
        let mut wrs: [ibv_send_wr; 2] = unsafe { std::mem::zeroed() };
        // SAFETY: ibv_sge is plain integers, for which zero is valid.
        let mut sges: [ibv_sge; 2] = unsafe { std::mem::zeroed() };
        // Inline sources: the library copies them during the post call.
        let mut words = [0u64; 2];
        let mut flags = [0u32; 2];
        let mut unsignaled = st.unsignaled;
        let mut k = 0;
        if let Some(h) = held {
            let held_src = Src::Region {
                off: h.off,
                len: h.len,
            };
            flags[0] = self.fill_wr(
                (&mut wrs[0], &mut sges[0], &mut words[0]),
                held_src,
                h.remote,
                false,
                first,
                &mut unsignaled,
            );
            k = 1;
        }
        flags[k] = self.fill_wr(
            (&mut wrs[k], &mut sges[k], &mut words[k]),
            src,
            remote,
            signaled,
            first + k as u64,
            &mut unsignaled,
        );
        // The arrays stay where they are until the call returns.
        for i in 0..=k {
            if wrs[i].num_sge > 0 {
                wrs[i].sg_list = &mut sges[i];
            }
        }
        if k == 1 {
            let (a, b) = wrs.split_at_mut(1);
            a[0].next = &mut b[0];
        }
        let mut bad = std::ptr::null_mut();
        // SAFETY: qp valid; the requests, their sges and inline words live
        // across the call (an inline source is copied during it); a region
        // source stays valid until the request completes (the protocol
        // does not rewrite transmitted slots before the receiver consumed
        // them).
        let rc = unsafe { ibv_post_send(self.qp, &mut wrs[0], &mut bad) };
        if rc != 0 {
            let e = call_failed("ibv_post_send", rc);
            st.failed = Some(e.clone());
            return Err(e);
        }
        let seq = first + k as u64;
        st.posted = seq;
        st.unsignaled = unsignaled;
        // Under the send-queue lock: single writer (see `bump`).
        let c = self.counters();
        for f in &flags[..=k] {
            bump(&c.wr_posted, 1);
            bump(
                &c.wr_signaled,
                u64::from(f & ibv_send_flags::IBV_SEND_SIGNALED.0 != 0),
            );
            bump(
                &c.wr_inline,
                u64::from(f & ibv_send_flags::IBV_SEND_INLINE.0 != 0),
            );
        }
        Ok(seq)
    }

    /// Fills one work request `seq` for `src` at the peer's `remote`
    /// (sg_list is set by the caller once the arrays are final; an inline
    /// word is copied from `word`, which must stay in place until the
    /// post). `unsignaled`: requests since the last signaled one,
    /// updated. Returns the send flags.
    fn fill_wr(
        &self,
        (wr, sge, word): (&mut ibv_send_wr, &mut ibv_sge, &mut u64),
        src: Src,
        remote: u64,
        signaled: bool,
        seq: u64,
        unsignaled: &mut u32,
    ) -> u32 {
        let force = *unsignaled + 1 >= (self.sq_depth / 2).max(1);
        let signaled = signaled || force;
        *unsignaled = if signaled { 0 } else { *unsignaled + 1 };
        // SAFETY: `mr` is the live registration made before `Shared` was
        // shared; it is deregistered only on drop. A plain field read.
        sge.lkey = unsafe { (*self.mr).lkey };
        let mut flags = if signaled {
            ibv_send_flags::IBV_SEND_SIGNALED.0
        } else {
            0
        };
        let mut opcode = ibv_wr_opcode::IBV_WR_RDMA_WRITE;
        let mut imm = 0u32;
        let mut num_sge = 1;
        if let Src::WordKick(_, v) | Src::RegionImm { imm: v, .. } = src {
            // The peer's receive completes only after the data is placed.
            opcode = ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM;
            imm = v.to_be();
        }
        // A kick is the doorbell: solicited. Slots carrying only their
        // tail are not: a receiver asleep on its doorbell is not woken by
        // them (the sender's check at their completion rings a sleeper).
        if matches!(src, Src::WordKick(..) | Src::RegionImm { ring: true, .. }) {
            flags |= ibv_send_flags::IBV_SEND_SOLICITED.0;
        }
        match src {
            Src::Region { off, len } | Src::RegionImm { off, len, .. } => {
                sge.addr = self.region.addr(off);
                sge.length = len;
                // Every slot write is counted here, as posted: a held one
                // may go without its header (`headerless`).
                bump(&self.counters().slot_bytes, u64::from(len));
                if len <= self.max_inline.min(INLINE_SLOT_BYTES) {
                    // Copied during the post (the caller leaves sge.addr
                    // at the region for region sources).
                    flags |= ibv_send_flags::IBV_SEND_INLINE.0;
                }
            }
            Src::External(x) => {
                // The program's own buffer, registered in the device's
                // zero-copy cache (`regcache`) under `x.lkey`.
                sge.addr = x.addr;
                sge.length = x.len;
                sge.lkey = x.lkey;
            }
            Src::Word(v) | Src::WordKick(v, _) => {
                *word = v;
                if self.max_inline >= 8 {
                    // Inline: the library copies the bytes at post time.
                    flags |= ibv_send_flags::IBV_SEND_INLINE.0;
                    sge.addr = word as *const u64 as u64;
                } else {
                    let off = self.layout.staging + (seq as usize % STAGING_WORDS) * 8;
                    // SAFETY: the staging page is in the region; this word
                    // is not the source of any outstanding request (the
                    // queue holds fewer than STAGING_WORDS).
                    unsafe { std::ptr::write_volatile(self.region.base.add(off).cast::<u64>(), v) };
                    sge.addr = self.region.addr(off);
                }
                sge.length = 8;
            }
            Src::Imm(v) => {
                opcode = ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM;
                flags |= ibv_send_flags::IBV_SEND_SOLICITED.0;
                imm = v.to_be();
                num_sge = 0;
            }
        }
        wr.wr_id = seq;
        wr.num_sge = num_sge;
        wr.opcode = opcode;
        wr.send_flags = flags;
        wr.imm_data_invalidated_rkey_union.imm_data = imm;
        wr.wr.rdma.remote_addr = remote;
        wr.wr.rdma.rkey = self.remote.rkey;
        flags
    }

    /// Posts the held slot write, if any, as a plain unsignaled WRITE.
    /// Caller holds `sq`.
    pub(super) fn post_held_slots(&self, st: &mut SqState) -> Result<(), RingError> {
        if let Some(h) = st.held_slots.take() {
            self.post(
                st,
                Src::Region {
                    off: h.off,
                    len: h.len,
                },
                h.remote,
                false,
            )?;
        }
        Ok(())
    }
}
