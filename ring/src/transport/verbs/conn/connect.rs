//! Connecting an end: the parameters the peer needs, the queue pair's way
//! from RESET through INIT and RTR to RTS, and the ring ends and doorbell
//! built on it.

use super::super::call_failed;
use super::super::headerless;
use super::super::ibv::ibv_modify_qp;
use super::super::params::{
    QpParams, RingDesc, FEATURE_HEADERLESS, FEATURE_STANDING_WAITS, FEATURE_TAIL_CREDITS,
    FEATURE_TAIL_IN_IMM,
};
use super::super::pull;
use super::super::stats::VerbsCounters;
use crate::error::{RingError, VerbsError};
use crate::memory::RingMem;
use crate::receiver::Receiver;
use crate::sender::Sender;
use rdma_sys::*;
use std::os::fd::OwnedFd;
use std::sync::Arc;

use super::pull_io;
use super::{lock, Connected, Doorbell, Remote, Role, Shared, VerbsConn, VerbsTransport};

impl VerbsConn {
    /// What the peer needs to connect to this end.
    pub fn local_params(&self) -> QpParams {
        let s = &self.shared;
        let r = &s.region;
        let l = &s.layout;
        QpParams {
            gid: s.dev.gid,
            lid: s.dev.lid,
            // SAFETY: `s.qp` is the live queue pair `create` made (it
            // returns no VerbsConn without one); Shared destroys it only
            // on drop. A plain field read.
            qpn: unsafe { (*s.qp).qp_num },
            psn: s.psn,
            mtu: s.dev.mtu,
            features: FEATURE_STANDING_WAITS
                | FEATURE_TAIL_IN_IMM
                | if s.tail_credits {
                    FEATURE_TAIL_CREDITS
                } else {
                    0
                }
                | if s.takes_headerless() {
                    FEATURE_HEADERLESS
                } else {
                    0
                },
            // SAFETY: `s.mr` is the live registration `create` made, as
            // for `qp`. A plain field read.
            rkey: unsafe { (*s.mr).rkey },
            out_ring: RingDesc {
                ctrl_addr: r.addr(l.out_ctrl),
                slots_addr: r.addr(l.out_slots),
                slots: self.out_cfg.slots,
                slot_size: self.out_cfg.slot_size,
            },
            in_ring: RingDesc {
                ctrl_addr: r.addr(l.in_ctrl),
                slots_addr: r.addr(l.in_slots),
                slots: self.in_cfg.slots,
                slot_size: self.in_cfg.slot_size,
            },
        }
    }

    /// Brings the queue pair to RTS towards `peer` (INIT -> RTR -> RTS) and
    /// builds the two ring ends. The peer must use our geometry for the
    /// rings we share: its incoming ring is our outgoing one and vice versa.
    pub fn connect(self, peer: &QpParams) -> Result<Connected, RingError> {
        if !peer.in_ring.matches(&self.out_cfg) || !peer.out_ring.matches(&self.in_cfg) {
            return Err(VerbsError::Params("the peer's ring geometry does not match ours").into());
        }
        let VerbsConn {
            mut shared,
            out_cfg,
            in_cfg,
            knobs,
        } = self;
        // Each feature builds on the one before it: credits need the tail
        // in the immediate, headerless records need the credits.
        let tail_in_imm = peer.features & FEATURE_TAIL_IN_IMM != 0;
        let tail_credits = tail_in_imm && peer.features & FEATURE_TAIL_CREDITS != 0;
        shared.remote = Remote {
            rkey: peer.rkey,
            in_ctrl: peer.in_ring.ctrl_addr,
            in_slots: peer.in_ring.slots_addr,
            out_ctrl: peer.out_ring.ctrl_addr,
            out_slots: peer.out_ring.slots_addr,
            standing: peer.features & FEATURE_STANDING_WAITS != 0,
            tail_in_imm,
            tail_credits,
            headerless: tail_credits
                && peer.features & FEATURE_HEADERLESS != 0
                && peer.in_ring.slots <= headerless::MAX_RING_SLOTS,
        };
        shared.to_init()?;
        {
            let _g = lock(&shared.rq);
            shared.post_recvs(shared.rq_depth)?;
            // SAFETY: `recv_cq` is the live CQ `create` made; 1 arms it for
            // solicited events only.
            let rc = unsafe { ibv_req_notify_cq(shared.recv_cq, 1) };
            if rc != 0 {
                return Err(call_failed("ibv_req_notify_cq", rc));
            }
        }
        shared.to_rtr(peer)?;
        shared.to_rts()?;
        let shared = Arc::new(shared);
        let l = shared.layout;
        let base = shared.region.base;
        let owner = || Box::new(shared.region.clone());
        // SAFETY: both ranges lie inside the region (Layout), control
        // blocks are page-aligned and zeroed (fresh memfd), and
        // the region lives as long as the RingMem's owner Arc.
        let (out_mem, in_mem) = unsafe {
            (
                RingMem::from_raw(
                    base.add(l.out_ctrl),
                    base.add(l.out_slots),
                    l.out_bytes,
                    owner(),
                ),
                RingMem::from_raw(
                    base.add(l.in_ctrl),
                    base.add(l.in_slots),
                    l.in_bytes,
                    owner(),
                ),
            )
        };
        let tx = Sender::new(
            out_mem,
            VerbsTransport {
                shared: shared.clone(),
                role: Role::Sender,
                pull: pull_io::PullState::new(knobs, out_cfg.slots, out_cfg.slot_size),
            },
            out_cfg,
        )?;
        let rx = Receiver::new(
            in_mem,
            VerbsTransport {
                shared: shared.clone(),
                role: Role::Receiver,
                pull: pull_io::PullState::new(knobs, in_cfg.slots, in_cfg.slot_size),
            },
            in_cfg,
        )?;
        Ok(Connected {
            tx,
            rx,
            bell: Doorbell { shared },
        })
    }
}

impl Connected {
    /// See `VerbsConn::share_fd`.
    pub fn share_fd(&self) -> Result<OwnedFd, RingError> {
        self.bell.shared.share_fd()
    }

    /// This end's verbs counters (both rings share one queue pair).
    pub fn verbs_counters(&self) -> VerbsCounters {
        self.bell.shared.region.header().counters()
    }

    /// This end's pull-mode counters (`transport::verbs::pull`).
    pub fn pull_stats(&self) -> pull::PullStats {
        self.bell.shared.pull_counters().snapshot()
    }
}

impl Shared {
    pub(super) fn modify(
        &self,
        attr: &mut ibv_qp_attr,
        mask: ibv_qp_attr_mask,
        what: &'static str,
    ) -> Result<(), RingError> {
        // SAFETY: qp valid, attr initialized for the fields in mask.
        let rc = unsafe { ibv_modify_qp(self.qp, attr, mask.0 as i32) };
        if rc != 0 {
            return Err(call_failed(what, rc));
        }
        Ok(())
    }

    fn to_init(&self) -> Result<(), RingError> {
        // SAFETY: zeroed is a valid ibv_qp_attr.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_INIT;
        a.pkey_index = 0;
        a.port_num = self.dev.port;
        a.qp_access_flags = (ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
            | ibv_access_flags::IBV_ACCESS_REMOTE_WRITE
            | ibv_access_flags::IBV_ACCESS_REMOTE_READ)
            .0;
        use ibv_qp_attr_mask as M;
        self.modify(
            &mut a,
            M::IBV_QP_STATE | M::IBV_QP_PKEY_INDEX | M::IBV_QP_PORT | M::IBV_QP_ACCESS_FLAGS,
            "ibv_modify_qp to INIT",
        )
    }

    fn to_rtr(&self, peer: &QpParams) -> Result<(), RingError> {
        // SAFETY: zeroed is a valid ibv_qp_attr.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_RTR;
        a.path_mtu = self.dev.mtu.min(peer.mtu) as ibv_mtu::Type;
        a.dest_qp_num = peer.qpn;
        a.rq_psn = peer.psn;
        a.max_dest_rd_atomic = 1;
        a.min_rnr_timer = 12;
        a.ah_attr.is_global = 1;
        a.ah_attr.grh.dgid.raw = peer.gid;
        a.ah_attr.grh.sgid_index = self.dev.gid_index;
        a.ah_attr.grh.hop_limit = 64;
        a.ah_attr.dlid = peer.lid;
        a.ah_attr.sl = 0;
        a.ah_attr.port_num = self.dev.port;
        use ibv_qp_attr_mask as M;
        self.modify(
            &mut a,
            M::IBV_QP_STATE
                | M::IBV_QP_AV
                | M::IBV_QP_PATH_MTU
                | M::IBV_QP_DEST_QPN
                | M::IBV_QP_RQ_PSN
                | M::IBV_QP_MAX_DEST_RD_ATOMIC
                | M::IBV_QP_MIN_RNR_TIMER,
            "ibv_modify_qp to RTR",
        )
    }

    fn to_rts(&self) -> Result<(), RingError> {
        // SAFETY: zeroed is a valid ibv_qp_attr.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_RTS;
        // 4.096 us x 2^16 = 268 ms per try (TCP's least retransmission
        // timeout is 200 ms), 7 tries: a stall of about 2 s is ridden out;
        // a longer one fails the queue pair, and the shim carries the
        // connection on over TCP. Not 7 retries: Soft-RoCE takes 7 to mean
        // retry forever.
        a.timeout = 16;
        a.retry_cnt = 6;
        a.rnr_retry = 7;
        a.sq_psn = self.psn;
        a.max_rd_atomic = 1;
        use ibv_qp_attr_mask as M;
        self.modify(
            &mut a,
            M::IBV_QP_STATE
                | M::IBV_QP_TIMEOUT
                | M::IBV_QP_RETRY_CNT
                | M::IBV_QP_RNR_RETRY
                | M::IBV_QP_SQ_PSN
                | M::IBV_QP_MAX_QP_RD_ATOMIC,
            "ibv_modify_qp to RTS",
        )
    }
}
