//! The verbs side of headerless records (`FEATURE_HEADERLESS`): which
//! records may go without their header, the headers re-sent before a tail
//! word, and the header a receiver writes for a record it reaped. The
//! protocol is in the `transport::verbs` module documentation.

use super::super::headerless;
use crate::error::{RingError, VerbsError};
use crate::layout::{bump, RingControl};
use crate::record::{self, Header};
use std::mem::offset_of;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{HeldSlots, Shared, SqState, Src, HEADERLESS_KEPT};

impl Shared {
    /// Whether this end's receiver takes headerless records
    /// (`FEATURE_HEADERLESS`): it reaps an immediate for every small
    /// batch, and its ring is small enough for the immediate's tail bits.
    pub(super) fn takes_headerless(&self) -> bool {
        self.tail_credits && self.in_slots <= u64::from(headerless::MAX_RING_SLOTS)
    }

    /// The word at `off` in one of our ring copies' slots (`base`, `bytes`:
    /// `Layout`'s offset and size of that copy's slots).
    fn slot_word(&self, base: usize, bytes: usize, off: usize) -> &AtomicU64 {
        assert!(
            off.is_multiple_of(8) && off + 8 <= bytes,
            "slot word outside the ring"
        );
        // SAFETY: inside the copy's slots (checked above), which lie in the
        // region (Layout) and are page-aligned, so the word is 8-aligned;
        // the region lives as long as `self`. The peer's device may place
        // bytes there too: an aligned 8-byte word is placed whole (module
        // docs, "What verbs need" 3).
        unsafe { &*self.region.base.add(base + off).cast::<AtomicU64>() }
    }

    /// The immediate's field for the held write `h`, ending at `tail`, if
    /// it may go without its header: the peer takes that, and `h` is
    /// exactly one record (its header's length fills the write to the
    /// byte: a second record would start a slot later).
    pub(super) fn headerless_field(&self, h: &HeldSlots, tail: u64) -> Option<u32> {
        if !self.remote.headerless {
            return None;
        }
        let l = &self.layout;
        let raw = self
            .slot_word(l.out_slots, l.out_bytes, h.off - l.out_slots)
            .load(Ordering::Relaxed);
        let hdr = Header::decode(raw)?;
        if hdr.flags != 0
            || hdr.len == 0
            || u64::from(hdr.len) + record::HEADER_BYTES as u64 != u64::from(h.len)
        {
            return None;
        }
        // The receiver finds the record's first slot from `tail`: the
        // write must end there (the sender sends up to the tail before
        // it writes it; anything else keeps its header).
        let ss = self.out_slot_size as usize;
        let ring = (l.out_bytes / ss) as u64;
        let first = ((h.off - l.out_slots) / ss) as u64;
        if (first + record::slots_for(hdr.len as usize, ss) as u64) % ring != tail % ring {
            return None;
        }
        headerless::encode(hdr.len, tail)
    }

    /// Whether one more record may go without its header: the list of
    /// those the receiver may not have read (after dropping the ones it
    /// has) is below `HEADERLESS_KEPT`. Caller holds `sq`.
    pub(super) fn headerless_room(&self, st: &mut SqState) -> bool {
        self.forget_read_headerless(st);
        st.headerless.len() < HEADERLESS_KEPT
    }

    /// Drops the headerless records the receiver has read: its pushed
    /// head (in our sender copy) reached their end. A slot is rewritten
    /// only after that, so every record left still has its header in our
    /// copy.
    fn forget_read_headerless(&self, st: &mut SqState) {
        let head = self
            .ctrl_word(self.layout.out_ctrl, offset_of!(RingControl, local_head))
            .load(Ordering::Acquire);
        while st.headerless.front().is_some_and(|r| r.end <= head) {
            st.headerless.pop_front();
        }
    }

    /// WRITEs the headers of the headerless records the receiver may not
    /// have read (8 bytes each, inline where the device allows): posted
    /// before a tail word, so a receiver that learns its tail from the
    /// word before it reaped their immediates still finds every header
    /// (module docs, "Headerless records"). Caller holds `sq`.
    pub(super) fn resend_headers(&self, st: &mut SqState) -> Result<(), RingError> {
        self.forget_read_headerless(st);
        let l = &self.layout;
        while let Some(r) = st.headerless.pop_front() {
            let raw = self
                .slot_word(l.out_slots, l.out_bytes, r.off - l.out_slots)
                .load(Ordering::Relaxed);
            self.post(st, Src::Word(raw), r.remote, false)?;
            bump(&self.counters().slot_writes, 1);
            bump(&self.counters().slot_bytes, 8);
            // Under the send-queue lock, as every writer of this counter.
            bump(&self.rq_counters().headers_resent, 1);
        }
        Ok(())
    }

    /// A reaped headerless record (`IMM_HEADERLESS`, its `field`): writes
    /// its header into our receiver copy, then raises the copy's tail
    /// over it. Caller holds `rq`, as every reaper does, and the receiver
    /// loads the tail under it (`fetch_tail`): so a header is never
    /// written here after the receiver read past the record and the
    /// sender reused its slot (module docs, "Headerless records").
    pub(super) fn place_headerless(&self, field: u32) -> Result<(), RingError> {
        if !self.takes_headerless() {
            return Err(VerbsError::Protocol(
                "the peer sent a record without its header, which this end did not offer",
            )
            .into());
        }
        let l = &self.layout;
        let tail = self.ctrl_word(l.in_ctrl, offset_of!(RingControl, local_tail));
        let mut cur = tail.load(Ordering::Acquire);
        loop {
            match headerless::place(cur, field, self.in_slots, self.in_slot_size) {
                headerless::Hint::Stale => return Ok(()),
                headerless::Hint::Bad { len } => {
                    return Err(RingError::Corrupt(crate::error::Corruption::Length {
                        slot: cur,
                        len,
                    }))
                }
                headerless::Hint::Place(p) => {
                    let off = p.slot as usize * self.in_slot_size;
                    self.slot_word(l.in_slots, l.in_bytes, off)
                        .store(p.header, Ordering::Relaxed);
                    // Release: a receiver that loads this tail sees the
                    // header (the device placed the payload before the
                    // completion). A tail word the device placed meanwhile
                    // (after the same header, re-sent) fails the exchange:
                    // look again.
                    match tail.compare_exchange(cur, p.tail, Ordering::AcqRel, Ordering::Acquire) {
                        Ok(_) => return Ok(()),
                        Err(now) => cur = now,
                    }
                }
            }
        }
    }
}
