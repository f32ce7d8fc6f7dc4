//! The verbs side of pull mode (a child of `conn`, so it sees the queue
//! pair's internals): the sender's hooks in `write_slots`, `write_word`
//! (tail) and `write_external`, the switch sequences, and the receiver's
//! fetch (`Transport::fetch_tail`). The protocol and its arguments are in
//! the `transport::verbs` module documentation ("Pull mode").

use super::super::call_failed;
use super::super::pull::{
    catchup_start, now_ns, ranges, word_is_pull, LoadMeter, ModeKnob, PullCounters, PullKnobs,
    PullStats, TxMode, COUNTERS_IN_HEADER, MODE_WORD, PUB_TAIL, SCRATCH,
};
use super::{lock, Role, Shared, SqState, Src, VerbsTransport};
use crate::error::{RingError, VerbsError};
use crate::layout::bump;
use crate::layout::RingControl;
use crate::transport::{ExternalSrc, PeerWord, Visibility};
use rdma_sys::*;
use std::mem::offset_of;
use std::sync::atomic::{AtomicU64, Ordering};

/// Most bytes one slot READ fetches (see `pull_fetch`), and one catch-up
/// WRITE carries.
const READ_CHUNK: u64 = 64 * 1024;
/// A going-away catch-up waits for its WRITEs every this many bytes, at
/// most this long each time.
const PACE_BYTES: u64 = 256 * 1024;
const PACE_LIMIT: std::time::Duration = std::time::Duration::from_secs(2);

/// How long a receiver waits for one READ before it fails the connection.
const READ_LIMIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Per-ring pull state of one transport (its role says which half is used).
pub(super) struct PullState {
    knobs: PullKnobs,
    /// Geometry of this transport's ring.
    slots: u64,
    slot_size: u64,
    // Sender half.
    mode: TxMode,
    /// Absolute slots handed to the transport so far (`write_slots` and
    /// `write_external` ranges are consecutive from 0): the sender's
    /// `esc_tail`.
    esc: u64,
    /// The last tail the sender published (in either mode).
    published: u64,
    /// The tail at the last switch to pull: everything before it was
    /// pushed (and landed before the mode word), so neither a READ nor a
    /// catch-up ever touches it again.
    pull_from: u64,
    /// Send sequence of the last switch-back's mode word: a switch to pull
    /// waits until it completed (see `switch_to_push`).
    catchup_seq: u64,
    /// Send sequence of the last switch's mode word (either way).
    mode_seq: u64,
    // Receiver half.
    seen_word: u64,
    pulling: bool,
    /// The stream is ending (`leave_pull`): push from now on.
    closing: bool,
    /// `leave_pull` switched back without a publish behind it: the wakeup
    /// check runs at the report of its words (`pull_reported`).
    check_owed: bool,
}

impl PullState {
    pub(super) fn new(knobs: PullKnobs, slots: u32, slot_size: u32) -> PullState {
        PullState {
            knobs,
            slots: slots as u64,
            slot_size: slot_size as u64,
            mode: TxMode::new(now_ns()),
            esc: 0,
            published: 0,
            pull_from: 0,
            catchup_seq: 0,
            mode_seq: 0,
            seen_word: 0,
            pulling: false,
            closing: false,
            check_owed: false,
        }
    }

    /// `write_slots` hook (sender): counts the range; true when pull mode
    /// handles it (no WRITE: the receiver will READ it).
    pub(super) fn note_slots(&mut self, first: u32, count: u32) -> bool {
        debug_assert_eq!(first as u64, self.esc % self.slots);
        let _ = first;
        self.esc += count as u64;
        self.mode.pull
    }

    /// `write_external` hook (sender): in pull mode the receiver READs our
    /// copy, so the payload is copied into it instead of WRITTEN from the
    /// program's buffer (a token that is already complete); in push mode
    /// only counted.
    pub(super) fn external(
        &mut self,
        s: &Shared,
        first: u32,
        count: u32,
        src: ExternalSrc,
    ) -> Result<Option<u64>, RingError> {
        self.esc += count as u64;
        if !self.mode.pull {
            return Ok(None);
        }
        let off = first as u64 * self.slot_size;
        if off + count as u64 * self.slot_size > s.layout.out_bytes as u64
            || src.len as u64 + 8 > count as u64 * self.slot_size
        {
            return Err(VerbsError::OutOfRing("zero-copy record outside the ring").into());
        }
        // SAFETY: `src` is the caller's live buffer of `src.len` bytes
        // (`Sender::write_zero_copy` holds it across the call); the
        // destination lies inside our sender copy's slots (checked above),
        // which nobody else writes (the peer's rkey covers it, but only
        // for READ by the protocol; a hostile peer WRITing there corrupts
        // its own data) and the receiver has not been told about yet.
        unsafe {
            std::ptr::copy_nonoverlapping(
                src.addr as *const u8,
                s.region.base.add(s.layout.out_slots + off as usize + 8),
                src.len as usize,
            )
        };
        Ok(Some(0))
    }
}

impl Shared {
    /// A word of one of our control pages (`ctrl`: its offset in the
    /// region, `off`: the word's offset in the page).
    pub(super) fn ctrl_word(&self, ctrl: usize, off: usize) -> &AtomicU64 {
        debug_assert!(off.is_multiple_of(8) && off + 8 <= crate::layout::CONTROL_BYTES);
        // SAFETY: the control pages are inside the region, page-aligned,
        // and `off` is 8-aligned within the page; the region lives as long
        // as `self`. The word may also be written by the peer's NIC: an
        // aligned 8-byte placement (see "What verbs need" 3).
        unsafe { &*self.region.base.add(ctrl + off).cast::<AtomicU64>() }
    }

    pub(super) fn pull_counters(&self) -> &PullCounters {
        // SAFETY: the header page is mapped for the region's life, zeroed
        // beyond the VerbsHeader (fresh memfd), and COUNTERS_IN_HEADER is
        // 8-aligned past it (static assertion in pull.rs); PullCounters is
        // all atomics, for which zero bytes are valid.
        unsafe {
            &*self
                .region
                .base
                .add(COUNTERS_IN_HEADER)
                .cast::<PullCounters>()
        }
    }

    /// Posts one signaled RDMA READ of `len` bytes at the peer's `remote`
    /// into our region at `off`. Caller holds `sq`. Returns its sequence.
    fn post_read(
        &self,
        st: &mut SqState,
        off: usize,
        len: u32,
        remote: u64,
    ) -> Result<u64, RingError> {
        // Held slots first: every request goes out in the order it was
        // asked for.
        self.post_held_slots(st)?;
        let seq = self.next_seq(st)?;
        // SAFETY: `mr` is the live registration made before `Shared` was
        // shared; it is deregistered only on drop. A plain field read.
        let lkey = unsafe { (*self.mr).lkey };
        let mut sge = ibv_sge {
            addr: self.region.addr(off),
            length: len,
            lkey,
        };
        // SAFETY: ibv_send_wr is plain data; every field a READ uses is set.
        let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = seq;
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        wr.opcode = ibv_wr_opcode::IBV_WR_RDMA_READ;
        wr.send_flags = ibv_send_flags::IBV_SEND_SIGNALED.0;
        wr.wr.rdma.remote_addr = remote;
        wr.wr.rdma.rkey = self.remote.rkey;
        let mut bad = std::ptr::null_mut();
        // SAFETY: qp valid; wr and sge live across the call; the
        // destination is our registered region, which outlives the request
        // (the caller waits for its completion).
        let rc = unsafe { ibv_post_send(self.qp, &mut wr, &mut bad) };
        if rc != 0 {
            let e = call_failed("ibv_post_send (READ)", rc);
            st.failed = Some(e.clone());
            return Err(e);
        }
        st.posted = seq;
        st.unsignaled = 0;
        let c = self.counters();
        bump(&c.wr_posted, 1);
        bump(&c.wr_signaled, 1);
        Ok(seq)
    }

    /// Spins until request `seq` completed or `limit` passed; returns
    /// whether it completed (a timeout leaves the connection as it is).
    fn wait_seq_for(&self, seq: u64, limit: std::time::Duration) -> Result<bool, RingError> {
        let start = std::time::Instant::now();
        let mut spins = 0u32;
        let mut wait = crate::sleep::backoff::CompletionWait::new();
        loop {
            {
                let mut st = lock(&self.sq);
                self.reap(&mut st)?;
                if st.done >= seq {
                    return Ok(true);
                }
            }
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(64) && start.elapsed() >= limit {
                return Ok(false);
            }
            wait.relax();
        }
    }

    /// Spins until request `seq` (a READ: and every one before it)
    /// completed. Bounded: a peer whose queue pair is gone never answers
    /// (rxe raises no error for it), and a READ we stopped waiting for
    /// could still land later, so past the limit the connection is failed.
    fn wait_seq(&self, seq: u64) -> Result<(), RingError> {
        if self.wait_seq_for(seq, READ_LIMIT)? {
            return Ok(());
        }
        let mut st = lock(&self.sq);
        if st.done >= seq {
            return Ok(());
        }
        let e = RingError::from(VerbsError::Unanswered {
            op: "READ",
            secs: READ_LIMIT.as_secs(),
        });
        st.failed = Some(e.clone());
        Err(e)
    }
}

impl VerbsTransport {
    /// This end's pull-mode counters (both rings).
    pub fn pull_stats(&self) -> PullStats {
        self.shared.pull_counters().snapshot()
    }

    /// Whether this end's outgoing ring is in pull mode now (sender), or
    /// this end fetches its incoming ring (receiver).
    pub fn pulling(&self) -> bool {
        match self.role {
            Role::Sender => self.pull.mode.pull,
            Role::Receiver => self.pull.pulling,
        }
    }

    /// A signaled word WRITE (`Src::Word`, or `Src::WordKick` carrying a
    /// kick) at the peer's `remote`, reported like any word write of this
    /// end (`poll_completions`). Returns its sequence.
    pub(super) fn post_word(
        &self,
        st: &mut SqState,
        remote: u64,
        src: Src,
    ) -> Result<u64, RingError> {
        if self.role == Role::Sender && remote == self.word_addr(PeerWord::LocalTail) {
            // A receiver may take this tail before it reaped the rings of
            // records sent without their header: they go first.
            self.shared.resend_headers(st)?;
        }
        let seq = self.post_reported(st, remote, src)?;
        bump(&self.shared.counters().word_writes, 1);
        Ok(seq)
    }

    /// A signaled WRITE that `poll_completions` reports as this end's
    /// latest word write (a word, or slots carrying the tail in their
    /// ring). Returns its sequence.
    pub(super) fn post_reported(
        &self,
        st: &mut SqState,
        remote: u64,
        src: Src,
    ) -> Result<u64, RingError> {
        let seq = self.shared.post(st, src, remote, true)?;
        let r = self.role as usize;
        st.last_word[r] = seq;
        st.unreported[r] += 1;
        Ok(seq)
    }

    fn pub_tail(&self) -> &AtomicU64 {
        let s = &*self.shared;
        s.ctrl_word(s.layout.out_ctrl, PUB_TAIL)
    }

    /// `write_word(LocalTail)` hook (sender): `None` = push as usual;
    /// `Some(v)` = handled here (pull mode or a switch), `v` says when the
    /// tail is visible to the receiver for the wakeup check.
    pub(super) fn pull_tail(&mut self, tail: u64) -> Result<Option<Visibility>, RingError> {
        self.pull.published = tail;
        let k = self.pull.knobs;
        if k.mode == ModeKnob::Push && !self.pull.mode.pull {
            return Ok(None);
        }
        let now = now_ns();
        let rate = if k.mode == ModeKnob::Adaptive {
            LoadMeter::global().note(now, k.window)
        } else {
            0
        };
        let mut d = self.pull.mode.decide(&k, rate, now, true);
        if d == Some(true) && (self.pull.closing || !self.catchup_landed()?) {
            d = None;
        }
        match (self.pull.mode.pull, d) {
            (false, Some(true)) => self.switch_to_pull(tail, now).map(Some),
            (false, _) => Ok(None),
            (true, Some(false)) => self.switch_to_push(tail, now, false).map(Some),
            (true, _) => {
                // S1: the tail in our own copy, where the receiver READs
                // it; `Sender::tail_visible` then fences (S2) and loads
                // `rx_waiting` (S3).
                self.pub_tail().store(tail, Ordering::SeqCst);
                // The pull word still in flight: the receiver may not know
                // it must READ yet, so the check must (also) run when that
                // word has landed (the Sender runs it at the report, which
                // cannot have come yet). Other unreported words (a sleeping
                // flag) need no such wait.
                let pending = lock(&self.shared.sq).done < self.pull.mode_seq;
                Ok(Some(if pending {
                    Visibility::AtCompletion
                } else {
                    Visibility::Now
                }))
            }
        }
    }

    /// Before the connection goes away (the shim's close): in pull mode
    /// the unread data lives in *our* memory, which is about to be
    /// unregistered, so switch back to push now (catch-up WRITEs of all
    /// the receiver may not have fetched, the tail, the push mode word)
    /// and stay there. Returns whether it switched: then the caller polls
    /// (`Sender::poll`) until `words_pending()` is false, i.e. until all
    /// of it landed, before it drops the connection (the report also
    /// rings a sleeping receiver). A no-op in push mode and on a receiver.
    pub fn leave_pull(&mut self) -> Result<bool, RingError> {
        if self.role != Role::Sender {
            return Ok(false);
        }
        self.pull.closing = true;
        if !self.pull.mode.pull {
            return Ok(false);
        }
        let tail = self.pull.published;
        self.switch_to_push(tail, now_ns(), true)?;
        // No publish is behind this switch, so no `Sender::tail_visible`
        // runs for it: the report of its words runs the check (the caller
        // settles), or a receiver asleep on `pub_tail` is never rung for
        // the data now in its copy. Not waited for here: a peer whose
        // queue pair is gone never acknowledges (rxe), and the caller's
        // settle is bounded.
        self.pull.check_owed = true;
        Ok(true)
    }

    /// `poll_completions` hook: this end's latest word write was reported
    /// (landed). Runs a wakeup check `leave_pull` owes (the push argument:
    /// the words landed, then fence, then the flag).
    pub(super) fn pull_reported(&mut self) -> Result<(), RingError> {
        if !self.pull.check_owed {
            return Ok(());
        }
        self.pull.check_owed = false;
        let s = &*self.shared;
        std::sync::atomic::fence(Ordering::SeqCst);
        let flag = s.ctrl_word(s.layout.out_ctrl, offset_of!(RingControl, rx_waiting));
        if crate::sleep::flags::take_or_ring_standing(flag, self.pull.published) {
            use crate::transport::Transport;
            self.kick_peer(crate::sleep::flags::Ring::Plain)?;
        }
        Ok(())
    }

    /// Whether the last switch back to push (catch-up, tail, mode word)
    /// has completed, i.e. landed in the receiver's copy.
    fn catchup_landed(&self) -> Result<bool, RingError> {
        if self.pull.catchup_seq == 0 {
            return Ok(true);
        }
        let s = &*self.shared;
        let mut st = lock(&s.sq);
        s.reap(&mut st)?;
        Ok(st.done >= self.pull.catchup_seq)
    }

    /// The end of either switch: WRITE the tail, then the mode word `w`
    /// (RC order: a receiver that sees the word has the tail). Returns the
    /// mode word's sequence number. Caller holds `sq`.
    fn post_tail_and_mode(&self, st: &mut SqState, tail: u64, w: u64) -> Result<u64, RingError> {
        self.post_word(st, self.word_addr(PeerWord::LocalTail), Src::Word(tail))?;
        let s = &*self.shared;
        self.post_word(st, s.remote.in_ctrl + MODE_WORD as u64, Src::Word(w))
    }

    /// PUSH -> PULL at a publish of `tail` (all slots before it are
    /// already WRITTEN: `Sender::transmit` sends them before the tail):
    /// publish `tail` in our copy, WRITE the tail and then the pull mode
    /// word (RC order: the receiver sees the word only after the tail
    /// and every pushed slot), and stop pushing.
    fn switch_to_pull(&mut self, tail: u64, now: u64) -> Result<Visibility, RingError> {
        let w = self.pull.mode.switch(true, now);
        self.pull.pull_from = tail;
        self.pub_tail().store(tail, Ordering::SeqCst);
        let s = &*self.shared;
        let seq = self.post_tail_and_mode(&mut lock(&s.sq), tail, w)?;
        self.pull.mode_seq = seq;
        bump(&s.pull_counters().tx_to_pull, 1);
        Ok(Visibility::AtCompletion)
    }

    /// PULL -> PUSH at a publish of `tail`: `pub_tail` freezes (the
    /// receiver's READs can no longer reach past it), the slots the
    /// receiver may not have fetched are WRITTEN again from our copy
    /// (`[start, esc)`, start = its pushed head, never before `pull_from`),
    /// then the tail, then the push mode word. Every slot of that range
    /// still holds its data (the receiver has not released it), so a
    /// catch-up WRITE and a READ of the same slot place the same bytes.
    fn switch_to_push(&mut self, tail: u64, now: u64, pace: bool) -> Result<Visibility, RingError> {
        let w = self.pull.mode.switch(false, now);
        let s = &*self.shared;
        let head = s
            .ctrl_word(s.layout.out_ctrl, offset_of!(RingControl, local_head))
            .load(Ordering::Acquire);
        let p = &self.pull;
        let mut start = catchup_start(head, p.esc, p.slots).max(p.pull_from.min(p.esc));
        if pace
            && s.ctrl_word(s.layout.out_ctrl, offset_of!(RingControl, rx_closed))
                .load(Ordering::Acquire)
                == 1
        {
            // Going away and the peer's reader is gone too: nobody will
            // read what a catch-up would carry.
            start = p.esc;
        }
        let mut pace = pace;
        // WRITEs of at most READ_CHUNK bytes (a catch-up can be a whole
        // ring: one WRITE of it is a burst Soft-RoCE under emulation drops
        // packets of and retries); when `pace` (going away, where waiting
        // is fine), a wait every PACE_BYTES keeps the burst short.
        let chunk = (READ_CHUNK / p.slot_size).max(1);
        let mut st = lock(&s.sq);
        let (mut n, mut unwaited, mut last) = (0, 0, 0);
        for (first, count) in ranges(start, p.esc, p.slots) {
            let mut done = 0;
            while done < count {
                if pace && unwaited >= PACE_BYTES {
                    drop(st);
                    // Bounded: a peer that went away never acknowledges;
                    // then the rest goes out unpaced and the caller's
                    // own bounded wait (which watches the peer) decides.
                    pace = s.wait_seq_for(last, PACE_LIMIT)?;
                    st = lock(&s.sq);
                    unwaited = 0;
                }
                let k = (count - done).min(chunk);
                let off = (first + done) * p.slot_size;
                last = s.post(
                    &mut st,
                    Src::Region {
                        off: s.layout.out_slots + off as usize,
                        len: (k * p.slot_size) as u32,
                    },
                    s.remote.in_slots + off,
                    pace,
                )?;
                bump(&s.counters().slot_writes, 1);
                n += 1;
                unwaited += k * p.slot_size;
                done += k;
            }
        }
        let seq = self.post_tail_and_mode(&mut st, tail, w)?;
        drop(st);
        self.pull.catchup_seq = seq;
        self.pull.mode_seq = seq;
        let c = s.pull_counters();
        bump(&c.tx_to_push, 1);
        bump(&c.catchup_writes, n);
        Ok(Visibility::AtCompletion)
    }

    /// `Transport::fetch_tail` (receiver): follows the mode word; while
    /// pulling, READs the sender's published tail and the slots
    /// `[from, tail)` into our copy, waiting for both, and returns the
    /// tail (the Receiver validates it as ever).
    /// `s` is the connection's shared state and `pull` the receiver's
    /// pull state: a function of the two, not of the transport, so its
    /// caller can hold `s.rq` across it.
    pub(super) fn pull_fetch(
        s: &Shared,
        pull: &mut PullState,
        head: u64,
        known: u64,
    ) -> Result<Option<u64>, RingError> {
        let in_ctrl = s.layout.in_ctrl;
        let w = s.ctrl_word(in_ctrl, MODE_WORD).load(Ordering::Acquire);
        if w != pull.seen_word {
            pull.seen_word = w;
            pull.pulling = word_is_pull(w);
            let c = s.pull_counters();
            bump(
                if pull.pulling {
                    &c.rx_to_pull
                } else {
                    &c.rx_to_push
                },
                1,
            );
        }
        if !pull.pulling {
            return Ok(None);
        }
        // Pushed before the pull word (or after a switch back): already
        // in our copy.
        let local = s
            .ctrl_word(in_ctrl, offset_of!(RingControl, local_tail))
            .load(Ordering::Acquire);
        let from = known.max(local);
        let scratch = s.ctrl_word(in_ctrl, SCRATCH);
        let read = {
            let mut st = lock(&s.sq);
            let seq = s.post_read(
                &mut st,
                in_ctrl + SCRATCH,
                8,
                s.remote.out_ctrl + PUB_TAIL as u64,
            );
            drop(st);
            seq.and_then(|seq| s.wait_seq(seq))
        };
        if let Err(e) = read {
            // A sender that left pull before going away (`leave_pull`)
            // pushed everything and then the push word; a READ that was
            // already on its way fails once its queue pair is gone. The
            // data is in our copy: read on from there (the queue pair is
            // dead, which later writes report).
            let w = s.ctrl_word(in_ctrl, MODE_WORD).load(Ordering::Acquire);
            if w != pull.seen_word && !word_is_pull(w) {
                pull.seen_word = w;
                pull.pulling = false;
                bump(&s.pull_counters().rx_to_push, 1);
                return Ok(None);
            }
            return Err(e);
        }
        let t = scratch.load(Ordering::Acquire);
        let c = s.pull_counters();
        bump(&c.tail_reads, 1);
        if t <= from {
            return Ok(Some(from));
        }
        if t - head > pull.slots || head > from {
            // Not a tail the ring can hold: the Receiver rejects it.
            return Ok(Some(t));
        }
        let ss = pull.slot_size;
        let mut last = 0;
        {
            let mut st = lock(&s.sq);
            // At most READ_CHUNK bytes per READ: one READ of a whole ring
            // is a burst of a thousand response packets, and Soft-RoCE
            // under emulation drops some and then takes its retry path
            // (which can put the queue pair in error). The queue pair
            // allows one READ in flight, so the chunks follow each other.
            let chunk = (READ_CHUNK / ss).max(1);
            for (first, count) in ranges(from, t, pull.slots) {
                let mut done = 0;
                while done < count {
                    let n = (count - done).min(chunk);
                    let off = (first + done) * ss;
                    last = s.post_read(
                        &mut st,
                        s.layout.in_slots + off as usize,
                        (n * ss) as u32,
                        s.remote.out_slots + off,
                    )?;
                    bump(&c.slot_reads, 1);
                    bump(&c.read_bytes, n * ss);
                    done += n;
                }
            }
        }
        s.wait_seq(last)?;
        Ok(Some(t))
    }
}
