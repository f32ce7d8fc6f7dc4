//! `VerbsTransport`, one ring end over the queue pair: slot and word
//! WRITEs, tails carried in immediates, kicks, zero-copy records and the
//! tail fetch, as the ring's `Transport`.

use super::super::stats::VerbsCounters;
use super::super::{regcache, tail_hint};
use crate::error::{RingError, VerbsError};
use crate::layout::{bump, RingControl};
use crate::record;
use crate::sleep::backoff::REQUEST_LIMIT;
use crate::sleep::flags::STANDING_KICKS;
use crate::transport::{ExternalSrc, PeerWord, Ring, Transport, Visibility};
use std::mem::offset_of;
use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering;

use super::{
    lock, HeldSlots, Role, SentHeaderless, Src, VerbsTransport, IMM_CARRIES_TAIL,
    IMM_ENDS_STANDING, IMM_HEADERLESS, TAIL_IN_IMM_MAX_BYTES,
};

impl VerbsTransport {
    /// Whether a control-word write of this end has not been reported by
    /// `poll_completions` yet. Before a process blocks it must poll its
    /// ends until this is false (see the module documentation).
    pub fn words_pending(&self) -> bool {
        lock(&self.shared.sq).unreported[self.role as usize] > 0
    }

    /// Reaps, and fails the connection (`give_up`) if a signaled request
    /// has been outstanding without one completing for `REQUEST_LIMIT`: a device
    /// may retry without end (Soft-RoCE after its link came back, say),
    /// and nothing else bounds a stall no thread waits on. Called now and
    /// then (the shim's background thread, every second or so); each call
    /// compares with the previous one.
    pub fn check_stalled(&self) -> Result<(), RingError> {
        let s = &*self.shared;
        let mut st = lock(&s.sq);
        s.reap(&mut st)?;
        // Only a signaled request reports its completion: the latest one is
        // `unsignaled` posts back.
        let last_signaled = st.posted - u64::from(st.unsignaled);
        if last_signaled <= st.done || st.done != st.stall_done {
            st.stall_done = st.done;
            st.stall_since = None;
            return Ok(());
        }
        let since = *st.stall_since.get_or_insert_with(std::time::Instant::now);
        if since.elapsed() >= REQUEST_LIMIT {
            return Err(s.give_up(&mut st, "WRITE"));
        }
        Ok(())
    }

    /// Whether the rings use huge pages.
    pub fn huge_pages(&self) -> bool {
        self.shared.region.huge
    }

    /// See `VerbsConn::share_fd`.
    pub fn share_fd(&self) -> Result<OwnedFd, RingError> {
        self.shared.share_fd()
    }

    /// The connection's verbs counters (shared by both ends).
    pub fn verbs_counters(&self) -> VerbsCounters {
        self.shared.region.header().counters()
    }

    /// A registration of `buf` for `Sender::write_zero_copy`, from the
    /// device's cache (`regcache`); `Err` when it cannot have one (the
    /// caller copies instead).
    pub fn zc_lease(&self, buf: &[u8]) -> Result<regcache::ZcLease, regcache::Miss> {
        self.shared.dev.zc_cache().acquire(buf)
    }

    /// A word write at `word`'s place in the peer's copy (`post_word`).
    fn post_word_at(&self, word: PeerWord, src: Src) -> Result<Visibility, RingError> {
        let mut st = lock(&self.shared.sq);
        self.post_word(&mut st, self.word_addr(word), src)?;
        Ok(Visibility::AtCompletion)
    }

    /// The immediate a kick from this end carries: the role (1, 2), or
    /// for the ring that ends a standing flag `IMM_ENDS_STANDING` and its
    /// epoch.
    fn kick_imm(&self, ring: Ring) -> u32 {
        match ring {
            Ring::Plain => self.role as u32 + 1,
            Ring::EndsStanding(epoch) => IMM_ENDS_STANDING | epoch,
        }
    }

    /// The tail write of a sender whose slots are held (`write_slots`):
    /// those slots go out as one WRITE_WITH_IMM that carries `tail`
    /// (`verbs::tail_hint`) and, if `ring`, rings the receiver; reported
    /// as this end's word write. `None`: nothing held, write the tail
    /// word.
    fn post_tail_in_imm(&self, tail: u64, ring: bool) -> Result<Option<Visibility>, RingError> {
        let s = &*self.shared;
        let mut st = lock(&s.sq);
        let Some(h) = st.held_slots.take() else {
            return Ok(None);
        };
        // One record alone (the usual small message): its payload only,
        // the header in the immediate (`headerless`), while the
        // list of such records has room.
        let field = s
            .headerless_field(&h, tail)
            .filter(|_| s.headerless_room(&mut st));
        let (off, len, remote, imm) = match field {
            Some(field) => {
                st.headerless.push_back(SentHeaderless {
                    off: h.off,
                    remote: h.remote,
                    end: tail,
                });
                let hb = record::HEADER_BYTES;
                let imm = IMM_HEADERLESS | field;
                // Under the send-queue lock, as every writer of this one.
                bump(&s.rq_counters().headerless_writes, 1);
                (h.off + hb, h.len - hb as u32, h.remote + hb as u64, imm)
            }
            None => {
                let imm = IMM_CARRIES_TAIL | tail_hint::encode(tail);
                (h.off, h.len, h.remote, imm)
            }
        };
        let src = Src::RegionImm {
            off,
            len,
            imm,
            ring,
        };
        self.post_reported(&mut st, remote, src)?;
        Ok(Some(Visibility::AtCompletion))
    }

    pub(super) fn word_addr(&self, word: PeerWord) -> u64 {
        let r = &self.shared.remote;
        match word {
            PeerWord::LocalTail => r.in_ctrl + offset_of!(RingControl, local_tail) as u64,
            PeerWord::TxWaiting => r.in_ctrl + offset_of!(RingControl, tx_waiting) as u64,
            PeerWord::LocalHead => r.out_ctrl + offset_of!(RingControl, local_head) as u64,
            PeerWord::RxWaiting => r.out_ctrl + offset_of!(RingControl, rx_waiting) as u64,
            PeerWord::RxClosed => r.out_ctrl + offset_of!(RingControl, rx_closed) as u64,
        }
    }
}

impl Transport for VerbsTransport {
    fn write_slots(&mut self, first: u32, count: u32, last_bytes: u32) -> Result<(), RingError> {
        let s = &*self.shared;
        let l = &s.layout;
        let ss = s.out_slot_size;
        let off = first as u64 * ss;
        // The last slot's unused bytes stay home: a 64 B message is a
        // 72 B WRITE (inline where the device allows) instead of 256 B.
        let len = (count as u64 * ss).saturating_sub(ss - u64::from(last_bytes).clamp(1, ss));
        if self.role != Role::Sender || off + len > l.out_bytes as u64 || len > u32::MAX as u64 {
            return Err(VerbsError::OutOfRing("slot range outside the ring").into());
        }
        if self.pull.note_slots(first, count) {
            return Ok(());
        }
        let mut st = lock(&s.sq);
        let src_off = l.out_slots + off as usize;
        let remote = s.remote.in_slots + off;
        if s.remote.tail_in_imm && len <= TAIL_IN_IMM_MAX_BYTES as u64 {
            // Held for the tail write that follows (`sync_tail`); an
            // earlier held write (the first half of a wrapped batch) goes
            // out now. Its bytes are counted when it is posted (`fill_wr`):
            // it may go without its header.
            s.post_held_slots(&mut st)?;
            st.held_slots = Some(HeldSlots {
                off: src_off,
                len: len as u32,
                remote,
            });
        } else {
            s.post(
                &mut st,
                Src::Region {
                    off: src_off,
                    len: len as u32,
                },
                remote,
                false,
            )?;
        }
        bump(&s.counters().slot_writes, 1);
        Ok(())
    }

    fn write_word(
        &mut self,
        word: PeerWord,
        value: u64,
        _signaled: bool,
    ) -> Result<Visibility, RingError> {
        // Every word write is signaled: its completion is what makes it
        // "visible" for the wakeup protocol, and words are rare (one per
        // alpha slots) next to slot writes, which are signaled only every
        // sq_depth/2 requests to recycle the send queue.
        if word == PeerWord::LocalTail {
            if let Some(vis) = self.pull_tail(value)? {
                return Ok(vis);
            }
            // A receiver with a receive for every slot takes the tail from
            // the immediate of the small batch's own WRITE: one work
            // request (under Soft-RoCE two packets, the WRITE and its
            // acknowledgement) where the word took two (four).
            if self.shared.remote.tail_credits {
                if let Some(vis) = self.post_tail_in_imm(value, false)? {
                    return Ok(vis);
                }
            }
        }
        self.post_word_at(word, Src::Word(value))
    }

    fn poll_completions(&mut self) -> Result<u32, RingError> {
        let s = &*self.shared;
        let mut st = lock(&s.sq);
        let r = self.role as usize;
        if st.unreported[r] == 0 {
            // Still reap, so the queue recycles and errors surface.
            s.reap(&mut st)?;
            return Ok(0);
        }
        s.reap(&mut st)?;
        if st.done >= st.last_word[r] {
            let n = std::mem::take(&mut st.unreported[r]);
            drop(st);
            // Pull mode: a wakeup check owed to this report.
            self.pull_reported()?;
            Ok(n)
        } else {
            Ok(0)
        }
    }

    fn write_external(
        &mut self,
        first: u32,
        count: u32,
        header: u64,
        src: ExternalSrc,
    ) -> Result<u64, RingError> {
        let s = &*self.shared;
        let ss = s.out_slot_size;
        let off = first as u64 * ss;
        let room = count as u64 * ss;
        if self.role != Role::Sender
            || off + room > s.layout.out_bytes as u64
            || src.len as u64 + 8 > room
        {
            return Err(VerbsError::OutOfRing("zero-copy record outside the ring").into());
        }
        if let Some(token) = self.pull.external(s, first, count, src)? {
            return Ok(token);
        }
        let remote = s.remote.in_slots + off;
        let mut st = lock(&s.sq);
        // The header from our copy's value (inline where the device can),
        // then the payload from the program's memory right after it; the
        // RC queue pair keeps them in order before the tail WRITE that
        // publishes them. Signaled: `wait_external` needs its completion.
        s.post(&mut st, Src::Word(header), remote, false)?;
        let seq = s.post(&mut st, Src::External(src), remote + 8, true)?;
        let c = s.counters();
        // Status has no room for more counters: the record also counts as
        // a slot write (see `RqCounters::zc_writes`).
        bump(&c.slot_writes, 1);
        bump(&c.slot_bytes, src.len as u64 + 8);
        let z = s.rq_counters();
        bump(&z.zc_writes, 1);
        bump(&z.zc_bytes, src.len as u64);
        Ok(seq)
    }

    fn wait_external(&mut self, token: u64) -> Result<(), RingError> {
        let s = &*self.shared;
        let mut wait = crate::sleep::backoff::CompletionWait::new();
        loop {
            {
                let mut st = lock(&s.sq);
                s.reap(&mut st)?;
                if st.done >= token {
                    return Ok(());
                }
            }
            if !wait.relax_within(REQUEST_LIMIT) {
                let mut st = lock(&s.sq);
                s.reap(&mut st)?;
                if st.done >= token {
                    return Ok(());
                }
                return Err(s.give_up(&mut st, "WRITE"));
            }
        }
    }

    fn fetch_tail(&mut self, head: u64, known: u64) -> Result<Option<u64>, RingError> {
        // The receiver learns every tail under the `rq` lock, pull mode's
        // fetch included: a reaper that writes a headerless record's header
        // holds it too, so it never writes one into a slot the receiver
        // already read past (module docs, "Headerless records").
        if self.role != Role::Receiver {
            return Ok(None);
        }
        let s = &*self.shared;
        let _rq = lock(&s.rq);
        let fetched = VerbsTransport::pull_fetch(s, &mut self.pull, head, known)?;
        // Reap the rings before every look at the tail. In push mode a
        // tail may have come in a ring's immediate only (`poll_recv`
        // raises our copy's tail). In either mode each ring takes a
        // posted receive, which only a reap puts back: a receiver that
        // keeps finding data without sleeping (pulling, or spinning
        // to the end of a stream) would otherwise let the queue run
        // dry, and the peer's queue pair then waits on RNR retries
        // with everything behind the ring (a switch back to push
        // among it). The channel's events stay for the doorbell's
        // waiter, and a drain that finds events but no completions
        // still counts as rung (`Doorbell::drain`).
        s.poll_recv()?;
        if fetched.is_none() && s.tail_credits {
            // Push mode, with a receive for every incoming slot
            // (`FEATURE_TAIL_CREDITS`): load the tail here, then reap
            // again. Every immediate whose tail this load covers
            // completed before the word it reads was written (the
            // queue pair keeps order), so after the second reap the
            // receiver has reaped all of them before it can consume
            // past them, and the unreaped ones never outnumber the
            // ring's slots (module docs). A tail the second reap
            // learns is seen at the next look. A tail that has not
            // moved lets nothing new be consumed: no second reap (a
            // spinning look's common case).
            let tail = s
                .ctrl_word(s.layout.in_ctrl, offset_of!(RingControl, local_tail))
                .load(Ordering::Acquire);
            if tail > known {
                s.poll_recv()?;
            }
            return Ok(Some(tail));
        }
        Ok(fetched)
    }

    fn kick_peer(&mut self, ring: Ring) -> Result<(), RingError> {
        let s = &*self.shared;
        let mut st = lock(&s.sq);
        s.post(
            &mut st,
            Src::Imm(self.kick_imm(ring)),
            s.remote.in_ctrl,
            false,
        )?;
        bump(&s.counters().kicks_sent, 1);
        Ok(())
    }

    fn kicks_with_word(&self) -> bool {
        true
    }

    fn batches_streams(&self) -> bool {
        // In pull mode the receiver READs what it wants when it wants it:
        // the sender's batches save no WRITE there.
        !self.pulling()
    }

    fn write_word_kicking(
        &mut self,
        word: PeerWord,
        value: u64,
        ring: Ring,
    ) -> Result<Visibility, RingError> {
        if word == PeerWord::LocalTail {
            if let Some(vis) = self.pull_tail(value)? {
                // Pull mode (or a switch): the tail went where the
                // receiver READs it, or with the mode word; a kick queued
                // after that still reaches it after the tail.
                self.kick_peer(ring)?;
                return Ok(vis);
            }
        }
        if word == PeerWord::LocalTail && ring == Ring::Plain {
            if let Some(vis) = self.post_tail_in_imm(value, true)? {
                bump(&self.shared.counters().kicks_sent, 1);
                return Ok(vis);
            }
        }
        if word == PeerWord::LocalTail && self.shared.remote.tail_credits {
            // The ring that ends a standing flag carries its epoch in the
            // immediate, so not the tail: the held slots carry the tail in
            // their own (unsolicited) immediate and the ring follows, a
            // kick from the doorbell's receives. No tail word, so no
            // header re-send (`resend_headers`) every 16th message.
            if let Some(vis) = self.post_tail_in_imm(value, false)? {
                self.kick_peer(ring)?;
                return Ok(vis);
            }
        }
        let vis = self.post_word_at(word, Src::WordKick(value, self.kick_imm(ring)))?;
        bump(&self.shared.counters().kicks_sent, 1);
        Ok(vis)
    }

    fn standing_waits(&self) -> bool {
        // Every ring of a standing flag takes one of our posted receives
        // until the doorbell is drained: keep the budget a quarter of them.
        self.role == Role::Receiver
            && self.shared.remote.standing
            && self.shared.rq_depth >= 4 * STANDING_KICKS
    }

    fn standing_ended(&self, epoch: u32) -> bool {
        self.shared.standing_ended.load(Ordering::Acquire) == epoch
    }
}
