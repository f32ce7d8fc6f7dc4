//! Creating a connection end: its region registered, its completion queues
//! and queue pair sized to the device (what `VerbsConn` reports before it
//! connects), and the teardown of every verbs object.

use super::super::device::Device;
use super::super::fdplace;
use super::super::ibv::{
    ibv_create_comp_channel, ibv_create_cq, ibv_create_qp, ibv_dereg_mr, ibv_destroy_comp_channel,
    ibv_destroy_cq, ibv_destroy_qp, ibv_reg_mr,
};
use super::super::pull::PullKnobs;
use super::super::stats::VerbsCounters;
use super::super::{call_failed, errno};
use crate::config::RingConfig;
use crate::error::{RingError, VerbsError};
use rdma_sys::*;
use std::os::fd::OwnedFd;
use std::sync::atomic::AtomicU32;
use std::sync::{Arc, Mutex};

use super::region::init_header;
use super::{
    Layout, Region, Remote, Shared, SqState, VerbsConn, INLINE_SLOT_BYTES, RQ_DEPTH, SQ_DEPTH,
};

impl VerbsConn {
    /// Allocates and registers this end's two ring copies (`out_cfg`: the
    /// ring we send on, `in_cfg`: the ring we receive on) and creates the
    /// queue pair. This end's sender follows `knobs` (pull mode); its
    /// receiver follows whatever mode the peer's sender is in. A user that
    /// cannot keep a ring's unfetched data alive until the peer has READ
    /// it (the shim: a process may exit without closing) passes
    /// `PullKnobs::default()`, which always pushes.
    pub fn new(
        dev: &Arc<Device>,
        out_cfg: RingConfig,
        in_cfg: RingConfig,
        knobs: PullKnobs,
    ) -> Result<VerbsConn, RingError> {
        out_cfg.validate()?;
        in_cfg.validate()?;
        let layout = Layout::new(&out_cfg, &in_cfg);
        let region = Arc::new(Region::new(layout.total)?);
        init_header(&region, &layout, &out_cfg, &in_cfg, dev);
        let sq_depth = SQ_DEPTH.min(dev.max_qp_wr).min(dev.max_cqe).max(2);
        let rq_cap = dev.max_qp_wr.min(dev.max_cqe);
        let (rq_depth, tail_credits) = receive_queue_depth(in_cfg.slots, rq_cap);
        // Built field by field; Drop frees whatever was created if a later
        // step fails.
        let mut s = Shared {
            dev: dev.clone(),
            region,
            layout,
            out_slot_size: out_cfg.slot_size as u64,
            in_slots: u64::from(in_cfg.slots),
            in_slot_size: in_cfg.slot_size as usize,
            mr: std::ptr::null_mut(),
            channel: std::ptr::null_mut(),
            send_cq: std::ptr::null_mut(),
            recv_cq: std::ptr::null_mut(),
            qp: std::ptr::null_mut(),
            sq_depth,
            rq_depth,
            tail_credits,
            max_inline: 0,
            psn: random_psn(),
            remote: Remote::default(),
            sq: Mutex::new(SqState::default()),
            rq: Mutex::new(()),
            standing_ended: AtomicU32::new(0),
        };
        // REMOTE_READ for pull mode (the receiver READs our sender copy):
        // it exposes what the rkey already reaches for WRITE, our two
        // ring copies and the staging words, all bytes the peer sent us
        // or that we send it (see the module documentation).
        let access = (ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
            | ibv_access_flags::IBV_ACCESS_REMOTE_WRITE
            | ibv_access_flags::IBV_ACCESS_REMOTE_READ)
            .0 as i32;
        // Everything but the header page: the peer's rkey must not reach
        // the counters, and nothing is sent from there.
        let (mr_off, mr_len) = (layout.out_ctrl, s.region.len - layout.out_ctrl);
        // SAFETY: pd is open; the range lies inside the region, which
        // outlives the registration (Shared holds the Arc, Drop deregisters).
        s.mr = unsafe { ibv_reg_mr(dev.pd, s.region.base.add(mr_off).cast(), mr_len, access) };
        if s.mr.is_null() {
            // `s` (and with it the region: mapping and memfd) is released
            // on return; nothing else was created yet.
            return Err(VerbsError::Register {
                bytes: mr_len,
                errno: errno(),
            }
            .into());
        }
        // SAFETY: `dev.ctx` is an open context (Device keeps it open
        // while `s.dev` holds it); a null result is handled below.
        s.channel = unsafe { ibv_create_comp_channel(dev.ctx) };
        if s.channel.is_null() {
            return Err(call_failed("ibv_create_comp_channel", errno()));
        }
        // SAFETY: `s.channel` is the live channel just created (non-null)
        // and not shared yet; no CQ names its descriptor yet, and
        // ibv_get_cq_event and ibv_destroy_comp_channel read the field.
        let fd = unsafe {
            (*s.channel).fd = fdplace::place((*s.channel).fd);
            (*s.channel).fd
        };
        // Non-blocking, so that `Doorbell::drain` never blocks.
        // SAFETY: F_GETFL on the channel's descriptor, integer arguments.
        let fl = unsafe { libc::syscall(libc::SYS_fcntl, fd, libc::F_GETFL) };
        if fl < 0
            // SAFETY: F_SETFL on the same descriptor, integer arguments.
            || unsafe {
                libc::syscall(
                    libc::SYS_fcntl,
                    fd,
                    libc::F_SETFL,
                    fl | libc::O_NONBLOCK as i64,
                )
            } < 0
        {
            return Err(RingError::last_os());
        }
        // SAFETY: `dev.ctx` is open (as above); null channel and context
        // pointers are allowed (the send CQ is polled, not waited on); a
        // null result is handled below.
        s.send_cq = unsafe {
            ibv_create_cq(
                dev.ctx,
                sq_depth as i32,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
        };
        if s.send_cq.is_null() {
            return Err(call_failed("ibv_create_cq", errno()));
        }
        // SAFETY: `dev.ctx` is open and `s.channel` is the live channel
        // created on it above; a null result is handled below.
        s.recv_cq =
            unsafe { ibv_create_cq(dev.ctx, rq_depth as i32, std::ptr::null_mut(), s.channel, 0) };
        if s.recv_cq.is_null() {
            return Err(call_failed("ibv_create_cq", errno()));
        }
        // A device may refuse the receive queue that covers every slot
        // while its limits allowed it: then the doorbell's alone, and the
        // peer writes tail words (no FEATURE_TAIL_CREDITS).
        let small_rq = doorbell_depth(rq_cap);
        // Inline: a small message's slot write (up to 256 B: one slot of
        // the default geometry) is copied into the request at post time,
        // as rsocket inlines its small sends; a device that refuses that
        // much is asked for 64 B (control words), then none.
        let tries = [
            (INLINE_SLOT_BYTES, rq_depth),
            (64u32, rq_depth),
            (0, rq_depth),
            (INLINE_SLOT_BYTES, small_rq),
            (64, small_rq),
            (0, small_rq),
        ];
        for (inline, rq) in tries {
            // SAFETY: zeroed is a valid init attr; the fields we need are set.
            let mut ia: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
            ia.send_cq = s.send_cq;
            ia.recv_cq = s.recv_cq;
            ia.qp_type = ibv_qp_type::IBV_QPT_RC;
            ia.sq_sig_all = 0;
            ia.cap.max_send_wr = sq_depth;
            ia.cap.max_recv_wr = rq;
            ia.cap.max_send_sge = 1;
            ia.cap.max_recv_sge = 1;
            ia.cap.max_inline_data = inline;
            // SAFETY: pd open, attr valid; on success the caps are updated.
            s.qp = unsafe { ibv_create_qp(dev.pd, &mut ia) };
            if !s.qp.is_null() {
                s.max_inline = ia.cap.max_inline_data;
                s.rq_depth = rq;
                s.tail_credits = tail_credits && rq == rq_depth;
                break;
            }
        }
        if s.qp.is_null() {
            return Err(call_failed("ibv_create_qp", errno()));
        }
        Ok(VerbsConn {
            shared: s,
            out_cfg,
            in_cfg,
            knobs,
        })
    }

    /// Whether the rings landed on huge pages.
    pub fn huge_pages(&self) -> bool {
        self.shared.region.huge
    }

    /// The fd of the doorbell `connect` will return (the completion
    /// channel): known before the connection is, so a caller can hand a
    /// fixed set of fds to pollers from the start.
    pub fn doorbell_fd(&self) -> std::os::fd::RawFd {
        // SAFETY: `channel` is the live completion channel `create` made;
        // Shared destroys it only on drop. A plain field read.
        unsafe { (*self.shared.channel).fd }
    }

    /// A close-on-exec duplicate of the region's memfd, for the ctl daemon:
    /// it maps the header read-only and reads the counters
    /// (`transport::verbs::stats`). The memfd is sealed against shrinking
    /// and growing, so a mapping of it can never fault.
    pub fn share_fd(&self) -> Result<OwnedFd, RingError> {
        self.shared.share_fd()
    }

    /// This end's verbs counters (also readable through `share_fd`).
    pub fn verbs_counters(&self) -> VerbsCounters {
        self.shared.region.header().counters()
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // SAFETY: each object was created once by the matching call and is
        // destroyed once, children first; every CQ event was acked.
        unsafe {
            if !self.qp.is_null() {
                ibv_destroy_qp(self.qp);
            }
            if !self.send_cq.is_null() {
                ibv_destroy_cq(self.send_cq);
            }
            if !self.recv_cq.is_null() {
                ibv_destroy_cq(self.recv_cq);
            }
            if !self.channel.is_null() {
                ibv_destroy_comp_channel(self.channel);
            }
            if !self.mr.is_null() {
                ibv_dereg_mr(self.mr);
            }
        }
    }
}

/// The receive queue for an end whose incoming ring has `in_slots` slots
/// on a device that allows `cap` entries (the lesser of its queue pair
/// and CQ limits): the doorbell's `RQ_DEPTH` plus one per slot where it
/// fits, which lets the peer carry every small batch's tail in an
/// immediate (`FEATURE_TAIL_CREDITS`, true then); the doorbell's alone
/// otherwise.
fn receive_queue_depth(in_slots: u32, cap: u32) -> (u32, bool) {
    let covering = u64::from(in_slots) + u64::from(RQ_DEPTH);
    if covering <= u64::from(cap) {
        (covering as u32, true)
    } else {
        (doorbell_depth(cap), false)
    }
}

/// The doorbell's receives alone, within the device's `cap`.
fn doorbell_depth(cap: u32) -> u32 {
    RQ_DEPTH.min(cap).max(1)
}

/// A 24-bit initial packet sequence number, different per connection.
fn random_psn() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0),
    );
    (h.finish() as u32) & 0x00ff_ffff
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_receive_queue_covers_the_ring_where_the_device_allows() {
        // rxe allows 16384 work requests: a receive per default slot fits.
        assert_eq!(receive_queue_depth(4096, 16384), (4096 + RQ_DEPTH, true));
        assert_eq!(receive_queue_depth(4096, 4096 + RQ_DEPTH), (4160, true));
        // One short: the doorbell's receives only, no credits claimed.
        assert_eq!(
            receive_queue_depth(4096, 4096 + RQ_DEPTH - 1),
            (RQ_DEPTH, false)
        );
        assert_eq!(receive_queue_depth(u32::MAX, u32::MAX), (RQ_DEPTH, false));
        // A tiny device still gets a queue.
        assert_eq!(receive_queue_depth(4096, 16), (16, false));
        assert_eq!(receive_queue_depth(4096, 0), (1, false));
    }
}
