//! The sending end of a ring.
//!
//! State (all in slot units, monotonically increasing u64 positions):
//! - `tail`: end of the committed records;
//! - the *open record* at `tail`, still growing while small writes coalesce;
//! - `esc_tail`: slots up to here were transmitted to the peer's copy;
//! - `synced_tail`: the tail value last written to the peer (tail sync);
//! - `local_head`: our copy of the receiver's head, refreshed from the
//!   control block only when we run out of space.
//!
//! Invariants: `local_head <= synced_tail <= esc_tail <= tail` after every
//! call returns, except that batching may leave `esc_tail`/`synced_tail`
//! behind `tail`; `flush()` makes them equal. `tail - local_head <= slots`.
//!
//! Streaming batches: on a transport that asks for them
//! (`Transport::batches_streams`, verbs), the batching thresholds `alpha`
//! and `beta` apply to the first transmission after the program last
//! waited (`flush`, or `end_stream` from a caller that knows it waited:
//! the shim counts the process's blocks). A program that transmitted and
//! then wrote again without waiting is streaming: from then on its
//! records coalesce, and go out with their tail, in batches of up to
//! `max_record_slots` slots. A request/response program waits between
//! its messages, so they keep the small thresholds; a stream pays one WRITE
//! and one tail per batch instead of per write. What a stream leaves in a
//! batch is published by the next `flush`: the program's next wait, or the
//! shim's background thread within a millisecond (FLUSH_NS).

use crate::config::RingConfig;
use crate::error::{Corruption, RingError};
use crate::layout::{bump, RingControl};
use crate::memory::RingMem;
use crate::record::{self, Header, FLAG_EOS, HEADER_BYTES};
use crate::sleep::backoff::{CompletionWait, WORD_LIMIT};
use crate::sleep::flags;
use crate::sync::{fence, Ordering};
use crate::transport::{ExternalSrc, PeerWord, Transport, Visibility};

/// Most payload bytes `write_zero_copy` posts before it waits for them: a
/// whole 1 MiB send posted at once is a burst of which Soft-RoCE drops
/// packets and retransmits, and its retry path can fail a WRITE with
/// "remote invalid request"; a window keeps the burst near what the copy
/// path sends.
const ZERO_COPY_WINDOW: usize = 256 * 1024;

pub struct Sender<T: Transport> {
    mem: RingMem,
    transport: T,
    cfg: RingConfig,
    slots: u64,
    slot_size: usize,
    tail: u64,
    /// Where the last committed record ends (the `tail` it left) and its
    /// payload length: a transmission that ends there sends only the
    /// record's bytes of that slot (`send_slots`).
    last_record_end: u64,
    last_record_len: u32,
    open: Option<usize>,
    esc_tail: u64,
    synced_tail: u64,
    local_head: u64,
    tail_in_flight: bool,
    /// A transmission happened since the program last waited (module
    /// docs, "Streaming batches"; it counts only where the transport
    /// batches streams).
    streaming: bool,
    /// The last tail whose WRITE carried a kick (0: none).
    kicked_tail: u64,
    /// Rings given to the receiver's current standing flag (`sleep::flags`).
    standing: flags::StandingKicks,
    /// `publish` is running: a visible tail leaves its sleeper check owed.
    quiet: bool,
    /// A visible tail whose check for a sleeping receiver (`tail_visible`)
    /// has not run yet: the next `flush` runs it.
    check_owed: bool,
    closed: bool,
    failed: Option<RingError>,
    /// Payload bytes of the committed records (the stream position at
    /// `tail`).
    committed_bytes: u64,
    /// The tail after the last zero-copy record: our copy lacks the
    /// payload of records before it (`take_after`).
    zc_tail: u64,
}

/// What `Sender::take_after` hands back.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Taken {
    /// The payload bytes past the given stream position, in order.
    pub bytes: Vec<u8>,
    /// The end-of-stream mark followed them.
    pub eos: bool,
}

impl<T: Transport> Sender<T> {
    /// The sending end over `mem` (this end's copy of the ring) and
    /// `transport`. The geometry in `cfg` must be the ring's.
    pub fn new(mem: RingMem, transport: T, cfg: RingConfig) -> Result<Self, RingError> {
        mem.check(&cfg)?;
        Ok(Sender {
            mem,
            transport,
            slots: cfg.slots as u64,
            slot_size: cfg.slot_size as usize,
            cfg,
            tail: 0,
            last_record_end: 0,
            last_record_len: 0,
            open: None,
            esc_tail: 0,
            synced_tail: 0,
            local_head: 0,
            tail_in_flight: false,
            streaming: false,
            kicked_tail: 0,
            standing: flags::StandingKicks::default(),
            quiet: false,
            check_owed: false,
            closed: false,
            failed: None,
            committed_bytes: 0,
            zc_tail: 0,
        })
    }

    pub fn config(&self) -> &RingConfig {
        &self.cfg
    }

    pub fn transport_mut(&mut self) -> &mut T {
        &mut self.transport
    }

    fn ctrl(&self) -> &RingControl {
        self.mem.ctrl()
    }

    fn check(&self) -> Result<(), RingError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        if self.closed {
            return Err(RingError::Closed);
        }
        Ok(())
    }

    fn fail(&mut self, e: RingError) -> RingError {
        if matches!(e, RingError::Corrupt(_) | RingError::Os(_)) {
            self.failed = Some(e.clone());
        }
        e
    }

    /// Whether the reader has closed its end (a flag that is neither 0 nor
    /// 1 is not a close: `check_peer` fails the ring on it).
    pub fn peer_closed(&self) -> bool {
        self.ctrl().rx_closed.value.load(Ordering::Acquire) == 1
    }

    /// The reader's closed flag, checked: a value the receiver never writes
    /// is corruption, never taken for a close (whose writes would be
    /// dropped as the kernel drops them after the peer's close).
    fn check_peer(&mut self) -> Result<bool, RingError> {
        match self.ctrl().rx_closed.value.load(Ordering::Acquire) {
            0 => Ok(false),
            1 => Ok(true),
            raw => Err(self.fail(RingError::Corrupt(Corruption::ClosedFlag { raw }))),
        }
    }

    /// Re-reads the head the receiver pushed. The value comes from the peer:
    /// it may only move forward and never past what we published.
    fn refresh_head(&mut self) -> Result<(), RingError> {
        let head = self.ctrl().local_head.value.load(Ordering::Acquire);
        if head < self.local_head || head > self.synced_tail {
            return Err(self.fail(RingError::Corrupt(Corruption::Head {
                head,
                tail: self.synced_tail,
            })));
        }
        self.local_head = head;
        Ok(())
    }

    /// Free slots from `tail` on, by our cached head.
    fn free_slots(&self) -> u64 {
        self.slots - (self.tail - self.local_head)
    }

    /// Slots the open record (or a new one at `tail`) may span: bounded by
    /// free space, the end of the ring, and the record size cap.
    fn record_cap(&self) -> u64 {
        let to_end = self.slots - self.tail % self.slots;
        self.free_slots()
            .min(to_end)
            .min(self.cfg.max_record_slots as u64)
    }

    /// Appends as much of `buf` as fits; commits and transmits as batching
    /// says. Returns the bytes taken; `Err(WouldBlock)` when none fit even
    /// after publishing everything (the ring is full).
    pub fn write(&mut self, buf: &[u8]) -> Result<usize, RingError> {
        self.check()?;
        if self.check_peer()? {
            return Err(RingError::PeerClosed);
        }
        if buf.is_empty() {
            return Ok(0);
        }
        let mut done = 0;
        let mut refreshed = false;
        // A transmit that fails once bytes are taken ends the loop (the
        // bytes are in our copy, where `take_after` finds them, so they
        // count); the failure comes with the next call (`check`).
        while done < buf.len() && self.failed.is_none() {
            let n = self.append(&buf[done..]);
            if n > 0 {
                done += n;
                continue;
            }
            // No room in the open record: close it, then look for space.
            if self.open.is_some() {
                self.commit_or_fail();
                continue;
            }
            if refreshed {
                break;
            }
            self.refresh_head()?;
            refreshed = true;
            if self.record_cap() == 0 {
                // Publish everything so the receiver can drain, then look
                // once more: the push may have raced with us.
                self.flush()?;
                self.refresh_head()?;
                if self.record_cap() == 0 {
                    break;
                }
            }
        }
        if done == 0 {
            self.check()?;
            bump(&self.ctrl().tx_stats.full, 1);
            return Err(RingError::WouldBlock);
        }
        if !self.cfg.coalesce {
            self.commit_or_fail();
        }
        Ok(done)
    }

    /// Zero-copy write: as much of `buf` as fits goes out in records whose
    /// payload the transport WRITEs straight from `buf` (registered under
    /// `lkey`, `Transport::write_external`) instead of a copy into the
    /// ring. Byte order is kept: the open record is committed and every
    /// slot before these records transmitted first. The tail advances and
    /// is published as for `write` (batching rules). Returns only once the
    /// device no longer reads `buf` (the caller may reuse it), with the
    /// bytes taken; `Err(WouldBlock)` when none fit.
    ///
    /// Our copy of these records' slots holds only their headers, never
    /// the payload: nothing on the verbs path reads the sender's copy back
    /// (`take_unconsumed` serves the shm handshake only).
    pub fn write_zero_copy(&mut self, buf: &[u8], lkey: u32) -> Result<usize, RingError> {
        self.check()?;
        if self.check_peer()? {
            return Err(RingError::PeerClosed);
        }
        if buf.is_empty() {
            return Ok(0);
        }
        self.commit()?;
        // The zero-copy records' slots must never go out from our copy
        // (`send_slots` sends [esc_tail, tail)): send what precedes them
        // now, and move esc_tail past each of them as it is posted.
        self.send_slots()?;
        let mut done = 0;
        let mut last = None;
        let mut unwaited = 0;
        let mut refreshed = false;
        while done < buf.len() {
            if unwaited >= ZERO_COPY_WINDOW {
                // Bound what the device reads from the program at once
                // (see ZERO_COPY_WINDOW).
                if let Some(token) = last {
                    self.transport
                        .wait_external(token)
                        .map_err(|e| self.fail(e))?;
                }
                unwaited = 0;
            }
            let cap_slots = self.record_cap();
            if cap_slots == 0 {
                if refreshed {
                    break;
                }
                refreshed = true;
                self.refresh_head()?;
                if self.record_cap() == 0 {
                    self.flush()?;
                    self.refresh_head()?;
                }
                continue;
            }
            let cap_bytes =
                (cap_slots as usize * self.slot_size - HEADER_BYTES).min(u32::MAX as usize);
            let n = (buf.len() - done).min(cap_bytes);
            let first = (self.tail % self.slots) as u32;
            let h = Header {
                flags: 0,
                len: n as u32,
            };
            let count = record::slots_for(n, self.slot_size) as u32;
            let src = ExternalSrc {
                addr: buf[done..].as_ptr() as u64,
                len: n as u32,
                lkey,
            };
            let token = self
                .transport
                .write_external(first, count, h.encode(), src)
                .map_err(|e| self.fail(e))?;
            last = Some(token);
            self.put_record(h);
            self.zc_tail = self.tail;
            bump(&self.ctrl().tx_stats.bytes, n as u64);
            self.esc_tail = self.tail;
            bump(&self.ctrl().tx_stats.batches, 1);
            done += n;
            unwaited += n;
        }
        if let Some(token) = last {
            // Publish per the batching rules, then wait for the payload
            // WRITEs (a tail WRITE posted here travels behind them).
            let r = self.transmit(false);
            self.transport
                .wait_external(token)
                .map_err(|e| self.fail(e))?;
            r?;
        }
        if done == 0 {
            bump(&self.ctrl().tx_stats.full, 1);
            return Err(RingError::WouldBlock);
        }
        Ok(done)
    }

    /// Copies into the open record (opening one if needed); returns bytes
    /// taken, 0 if the record (or the ring) has no room.
    fn append(&mut self, src: &[u8]) -> usize {
        let cap_slots = self.record_cap();
        if cap_slots == 0 {
            return 0;
        }
        let cap_bytes = (cap_slots as usize * self.slot_size - HEADER_BYTES).min(u32::MAX as usize);
        let used = self.open.unwrap_or(0);
        let n = src.len().min(cap_bytes - used);
        if n == 0 {
            return 0;
        }
        let start = (self.tail % self.slots) as usize * self.slot_size;
        self.mem
            .slots()
            .write(start + HEADER_BYTES + used, &src[..n]);
        let len = used + n;
        self.open = Some(len);
        if record::slots_for(len, self.slot_size) as u64 >= self.beta() {
            self.commit_or_fail();
        }
        n
    }

    /// `commit` for `write`: a transmit failure is kept (`failed`) for the
    /// next call, the record staying in our copy.
    fn commit_or_fail(&mut self) {
        if let Err(e) = self.commit() {
            self.failed = Some(e);
        }
    }

    /// Closes the open record: writes its header and moves `tail` past it.
    fn commit(&mut self) -> Result<(), RingError> {
        if !self.close_open() {
            return Ok(());
        }
        self.transmit(false)
    }

    /// Ends the open record in our copy of the ring (not transmitted);
    /// false if there was none.
    fn close_open(&mut self) -> bool {
        let Some(len) = self.open.take() else {
            return false;
        };
        self.put_record(Header {
            flags: 0,
            len: len as u32,
        });
        bump(&self.ctrl().tx_stats.bytes, len as u64);
        true
    }

    fn put_record(&mut self, h: Header) {
        let start = (self.tail % self.slots) as usize * self.slot_size;
        self.mem.slots().write_word(start, h.encode());
        let n = record::slots_for(h.len as usize, self.slot_size) as u64;
        self.tail += n;
        self.last_record_end = self.tail;
        self.last_record_len = h.len;
        self.committed_bytes += u64::from(h.len);
        let s = &self.ctrl().tx_stats;
        bump(&s.records, 1);
        bump(&s.slots, n);
    }

    /// The batch, in slots, that publishes a tail (module docs).
    fn alpha(&self) -> u64 {
        self.batch(self.cfg.alpha)
    }

    /// The batch, in slots, that closes a record and transmits slots.
    fn beta(&self) -> u64 {
        self.batch(self.cfg.beta)
    }

    /// `base`, or a whole record's worth while a stream runs on a
    /// transport that batches streams (module docs).
    fn batch(&self, base: u32) -> u64 {
        if self.streaming && self.transport.batches_streams() {
            u64::from(self.cfg.max_record_slots.max(base))
        } else {
            u64::from(base)
        }
    }

    /// Sends committed slots to the peer's copy and advances the tail, as
    /// often as alpha/beta say, or everything when `force`.
    fn transmit(&mut self, force: bool) -> Result<(), RingError> {
        if self.cfg.sync_ahead && self.tail - self.esc_tail >= self.beta() {
            self.send_slots()?;
        }
        let unsynced = self.tail - self.synced_tail;
        if unsynced == 0 || (!force && unsynced < self.alpha()) {
            return Ok(());
        }
        if !force {
            self.streaming = true;
        }
        if self.cfg.elastic && self.tail_in_flight && !force {
            self.poll()?;
            if self.tail_in_flight {
                // Elastic threshold: the previous tail is still on its way;
                // let this batch grow instead of queueing another write.
                bump(&self.ctrl().tx_stats.elastic_deferrals, 1);
                return Ok(());
            }
        }
        self.send_slots()?;
        self.sync_tail()
    }

    /// Transmits `[esc_tail, tail)`, split where it wraps. A 64 B message
    /// fills a third of a 256 B slot: the range's last slot goes out only
    /// as far as its record's bytes when that record is the last one
    /// committed (a range that ends at the ring's end, the first half of
    /// a wrapped batch, sends its last slot whole).
    fn send_slots(&mut self) -> Result<(), RingError> {
        while self.esc_tail < self.tail {
            let first = self.esc_tail % self.slots;
            let count = (self.tail - self.esc_tail).min(self.slots - first);
            let last_bytes = if self.esc_tail + count == self.last_record_end {
                record::bytes_in_last_slot(self.last_record_len as usize, self.slot_size) as u32
            } else {
                self.slot_size as u32
            };
            self.transport
                .write_slots(first as u32, count as u32, last_bytes)
                .map_err(|e| self.fail(e))?;
            self.esc_tail += count;
            bump(&self.ctrl().tx_stats.batches, 1);
        }
        Ok(())
    }

    /// Tail sync: the second of the two writes (data, then tail).
    fn sync_tail(&mut self) -> Result<(), RingError> {
        // A receiver already known to sleep gets its doorbell with this
        // tail (verbs: the tail WRITE carries the kick) rather than once
        // the tail's completion is polled: a round trip and a poll less
        // before it wakes. The flag is cleared as `tail_visible` would.
        // The check at the completion is then not needed for this tail:
        // the ring reaches the receiver after the tail, so a receiver
        // that arms before it arrives is woken and one that arms after
        // sees the tail (loom: `tests/loom_early_kick.rs`).
        // A standing flag (`sleep::flags`) is owed a ring with every tail, so
        // on verbs every tail to such a receiver takes this path.
        let early = if self.transport.kicks_with_word() {
            self.take_flag_rx_waiting(self.tail)
        } else {
            None
        };
        let vis = if let Some(ring) = early {
            bump(&self.ctrl().tx_stats.kicks, 1);
            self.kicked_tail = self.tail;
            self.transport
                .write_word_kicking(PeerWord::LocalTail, self.tail, ring)
        } else {
            self.transport
                .write_word(PeerWord::LocalTail, self.tail, self.cfg.elastic)
        }
        .map_err(|e| self.fail(e))?;
        self.synced_tail = self.tail;
        let c = self.ctrl();
        c.tail.value.store(self.tail, Ordering::Relaxed);
        c.esc_tail.value.store(self.esc_tail, Ordering::Relaxed);
        c.synced_tail
            .value
            .store(self.synced_tail, Ordering::Relaxed);
        bump(&c.tx_stats.tail_writes, 1);
        match vis {
            Visibility::Now if self.quiet => {
                self.check_owed = true;
                Ok(())
            }
            Visibility::Now => self.tail_visible(),
            Visibility::AtCompletion => {
                self.tail_in_flight = true;
                Ok(())
            }
        }
    }

    /// Runs once a tail write is visible at the receiver. Pairs with
    /// `Receiver::prepare_wait`: we stored the tail, then (SeqCst fence)
    /// load `rx_waiting`; the receiver stored `rx_waiting`, then (SeqCst
    /// fence) loads the tail. At least one of the two loads sees the other
    /// side's store, so either the receiver sees the data or we see that it
    /// sleeps and ring its doorbell: no lost wakeup.
    fn tail_visible(&mut self) -> Result<(), RingError> {
        // This check covers every tail before `synced_tail` too.
        self.check_owed = false;
        if self.synced_tail <= self.kicked_tail {
            // That tail carried its kick (`sync_tail`).
            return Ok(());
        }
        fence(Ordering::SeqCst);
        if let Some(ring) = self.take_flag_rx_waiting(self.synced_tail) {
            bump(&self.ctrl().tx_stats.kicks, 1);
            self.transport.kick_peer(ring).map_err(|e| self.fail(e))?;
        }
        Ok(())
    }

    /// The ring the receiver is owed for `tail`, if any: it sleeps
    /// without having seen it (the flag is cleared), or its flag is a
    /// standing one (see `sleep::flags`).
    fn take_flag_rx_waiting(&mut self, tail: u64) -> Option<flags::Ring> {
        let mem = &self.mem;
        let flag = &mem.ctrl().rx_waiting.value;
        flags::take_for_tail(flag, tail, &mut self.standing)
    }

    /// Reaps transport completions (verbs); a completed tail write clears
    /// the elastic threshold and triggers the doorbell check.
    pub fn poll(&mut self) -> Result<(), RingError> {
        let done = self
            .transport
            .poll_completions()
            .map_err(|e| self.fail(e))?;
        if done > 0 && self.tail_in_flight {
            self.tail_in_flight = false;
            self.tail_visible()?;
        }
        Ok(())
    }

    /// Makes every byte written so far visible to the receiver. Cheap when
    /// there is nothing pending.
    pub fn flush(&mut self) -> Result<(), RingError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        // Whatever the commit below transmits, the stream ends here.
        let done = self.publish_all();
        self.streaming = false;
        done?;
        if self.check_owed {
            self.check_owed = false;
            self.tail_visible()?;
        }
        Ok(())
    }

    /// Makes every byte written so far visible to the receiver, like
    /// `flush`, but leaves the check for a sleeping receiver (a fence and
    /// a load of its flag, which cost a stream of small writes more than
    /// the writes) to the next `flush`: a receiver that looks finds the
    /// bytes at once, one long asleep is woken now (its flag is visible
    /// without the fence), one that arms meanwhile by that flush.
    /// `has_unflushed` is true until then.
    pub fn publish(&mut self) -> Result<(), RingError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        self.quiet = true;
        let done = self.publish_all();
        self.quiet = false;
        done?;
        // A receiver that went to sleep a while ago shows its flag without
        // the fence: ring it now rather than at the next flush. One that
        // arms this very moment may not show yet; `check_owed` still
        // leaves it to the flush, as above.
        if self.check_owed && self.mem.ctrl().rx_waiting.value.load(Ordering::Relaxed) != 0 {
            self.tail_visible()?;
        }
        Ok(())
    }

    fn publish_all(&mut self) -> Result<(), RingError> {
        if self.open.is_none() && self.synced_tail == self.tail {
            return Ok(());
        }
        self.commit()?;
        bump(&self.ctrl().tx_stats.flushes, 1);
        self.transmit(true)
    }

    /// The program waited since its last write (the shim counts the
    /// blocks of the whole process): the next write is not part of a
    /// stream, and goes out at the small thresholds (module docs).
    pub fn end_stream(&mut self) {
        self.streaming = false;
    }

    /// Whether bytes sit in a batch that is not visible to the receiver yet.
    pub fn has_unflushed(&self) -> bool {
        self.open.is_some() || self.synced_tail != self.tail || self.check_owed
    }

    /// Whether a write would take at least one byte now.
    pub fn writable(&mut self) -> Result<bool, RingError> {
        self.check()?;
        if self.check_peer()? || self.has_room() {
            // A closed peer makes the write report EPIPE, like the kernel.
            return Ok(true);
        }
        self.refresh_head()?;
        Ok(self.has_room())
    }

    /// Whether a writer waiting for space may be woken: the peer closed
    /// (the write fails), or a third of the ring is free. A third is TCP's
    /// rule (`sk_stream_is_writeable`: free space at least half of what is
    /// queued): a writer woken for every record the reader frees would
    /// write a record's worth per wakeup while a slow reader drains.
    pub fn write_space(&mut self) -> Result<bool, RingError> {
        self.check()?;
        if self.check_peer()? || self.has_write_space() {
            return Ok(true);
        }
        self.refresh_head()?;
        Ok(self.has_write_space())
    }

    /// Slots that `write_space` wants free.
    fn write_space_slots(&self) -> u64 {
        self.slots.div_ceil(3)
    }

    /// Slots taken by committed records and the open one, by our cached head.
    fn used_slots(&self) -> u64 {
        let open = self
            .open
            .map_or(0, |len| record::slots_for(len, self.slot_size) as u64);
        (self.tail - self.local_head + open).min(self.slots)
    }

    fn has_write_space(&self) -> bool {
        self.slots - self.used_slots() >= self.write_space_slots()
    }

    /// Room for one more byte: in the open record, or for a new record.
    fn has_room(&self) -> bool {
        match self.open {
            Some(len) => {
                let cap = self.record_cap() as usize * self.slot_size;
                cap > HEADER_BYTES + len
                    || self.free_slots() > record::slots_for(len, self.slot_size) as u64
            }
            None => self.record_cap() > 0,
        }
    }

    /// The head the receiver last handed back (slots, only grows), as seen
    /// at the last look (`writable`, `write`, `poll`).
    pub fn head_seen(&self) -> u64 {
        self.local_head
    }

    /// Slots in use (published or not), for status.
    pub fn occupancy(&self) -> u64 {
        self.tail - self.local_head
    }

    /// Before sleeping on a ring without `write_space`: publish everything,
    /// announce that we wait (`tx_waiting`) for the head that gives that
    /// space, then look at the head once more. Returns true when it is
    /// safe to block on our doorbell (the receiver rings it once its
    /// pushed head reaches the announced one); false when the space
    /// appeared meanwhile; `Err(WouldBlock)` as `Receiver::prepare_wait`.
    pub fn prepare_wait(&mut self) -> Result<bool, RingError> {
        self.flush()?;
        if self.write_space()? {
            return Ok(false);
        }
        // Short of the space by `missing` slots: the head must move that far
        // (`flags::announce` of the position before it).
        let missing = self.write_space_slots() - (self.slots - self.used_slots());
        let want = self.local_head + missing;
        let vis = self
            .transport
            .write_word(PeerWord::TxWaiting, flags::announce(want - 1), true)
            .map_err(|e| self.fail(e))?;
        if vis == Visibility::AtCompletion {
            self.await_completion()?;
        }
        fence(Ordering::SeqCst);
        self.refresh_head()?;
        if self.has_write_space() {
            self.transport
                .write_word(PeerWord::TxWaiting, 0, false)
                .map_err(|e| self.fail(e))?;
            return Ok(false);
        }
        bump(&self.ctrl().tx_stats.sleeps, 1);
        Ok(true)
    }

    /// After waking (or timing out) from a wait that `prepare_wait` allowed.
    pub fn finish_wait(&mut self, woken: bool) -> Result<(), RingError> {
        if woken {
            bump(&self.ctrl().tx_stats.wakeups, 1);
        }
        self.transport
            .write_word(PeerWord::TxWaiting, 0, false)
            .map_err(|e| self.fail(e))?;
        Ok(())
    }

    fn await_completion(&mut self) -> Result<(), RingError> {
        let mut wait = CompletionWait::new();
        loop {
            if self
                .transport
                .poll_completions()
                .map_err(|e| self.fail(e))?
                > 0
            {
                // The report covers every earlier word write, so also a
                // tail still in flight: run its doorbell check now, or the
                // report is lost to `poll` (verbs; shm never gets here).
                if self.tail_in_flight {
                    self.tail_in_flight = false;
                    self.tail_visible()?;
                }
                return Ok(());
            }
            if !wait.relax_within(WORD_LIMIT) {
                // Unconfirmed: as `Receiver::prepare_wait`.
                return Err(RingError::WouldBlock);
            }
        }
    }

    /// Records written so far (for tests and status).
    pub fn records_written(&self) -> u64 {
        self.ctrl().tx_stats.records.load(Ordering::Relaxed)
    }

    /// Counters and pointers of this ring.
    pub fn stats(&self) -> crate::layout::RingStats {
        self.ctrl().stats()
    }

    /// Records spin iterations spent waiting for space.
    pub fn note_spins(&self, n: u64) {
        bump(&self.ctrl().tx_stats.spins, n);
    }

    /// Ends the stream: flushes, then puts an end-of-stream mark in the
    /// ring. `Err(WouldBlock)` if the ring has no slot for the mark yet
    /// (call again when writable); afterwards every write fails.
    pub fn close(&mut self) -> Result<(), RingError> {
        if self.closed {
            return Ok(());
        }
        self.check()?;
        self.commit()?;
        if self.record_cap() == 0 {
            self.flush()?;
            self.refresh_head()?;
            if self.record_cap() == 0 {
                return Err(RingError::WouldBlock);
            }
        }
        self.put_record(Header {
            flags: FLAG_EOS,
            len: 0,
        });
        self.closed = true;
        self.transmit(true)
    }

    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// Payload bytes written so far (the stream position after the last
    /// byte taken by `write`, open record included). After `flush` every
    /// one of them is published.
    pub fn bytes_written(&self) -> u64 {
        self.committed_bytes + self.open.unwrap_or(0) as u64
    }

    /// Leaves the ring: everything written past stream position
    /// `consumed` (what the receiver says it took, exactly), in order, and
    /// whether the end-of-stream mark followed. The ring is dead for this
    /// end afterwards (every write fails with `Closed`). `consumed` must
    /// lie between what the receiver handed back (our head) and what we
    /// wrote: anything else is a lie the ring refuses as corruption. Fails
    /// (`Unsupported`) when a zero-copy record's payload, which our copy lacks,
    /// would be needed.
    pub fn take_after(&mut self, consumed: u64) -> Result<Taken, RingError> {
        // The open record is ended but not transmitted: its bytes go back
        // to the caller, and a wire that failed cannot carry them.
        self.close_open();
        self.refresh_head()?;
        let mut records = Vec::new();
        let mut pos = self.local_head;
        let mut pending = 0u64;
        while pos < self.tail {
            let off = (pos % self.slots) as usize * self.slot_size;
            let raw = self.mem.slots().read_word(off);
            let Some(h) = Header::decode(raw) else {
                return Err(self.fail(RingError::Corrupt(Corruption::Header { slot: pos, raw })));
            };
            let n = record::slots_for(h.len as usize, self.slot_size) as u64;
            if n > self.tail - pos {
                return Err(self.fail(RingError::Corrupt(Corruption::Length {
                    slot: pos,
                    len: h.len,
                })));
            }
            records.push((pos, h));
            pending += u64::from(h.len);
            pos += n;
        }
        let base = self.committed_bytes - pending;
        if consumed < base || consumed > self.committed_bytes {
            return Err(self.fail(RingError::Corrupt(Corruption::Position {
                pos: consumed,
                low: base,
                high: self.committed_bytes,
            })));
        }
        let mut out = Taken::default();
        let mut at = base;
        for (slot, h) in records {
            if h.is_eos() {
                out.eos = true;
                continue;
            }
            let end = at + u64::from(h.len);
            if end > consumed {
                if slot < self.zc_tail {
                    return Err(RingError::Unsupported(
                        "taking back a zero-copy record's payload",
                    ));
                }
                let skip = consumed.saturating_sub(at) as usize;
                let off = (slot % self.slots) as usize * self.slot_size + HEADER_BYTES + skip;
                let start = out.bytes.len();
                out.bytes.resize(start + h.len as usize - skip, 0);
                self.mem.slots().read(off, &mut out.bytes[start..]);
            }
            at = end;
        }
        self.closed = true;
        Ok(out)
    }

    /// Everything written but not yet consumed by the receiver, in order,
    /// and resets the ring to empty. For a handshake the server turned down:
    /// the caller resends these bytes over TCP. Only valid while no receiver
    /// is attached, and never after `write_zero_copy` (our copy does not
    /// hold those records' payload; only the shm handshake calls this).
    pub fn take_unconsumed(&mut self) -> Result<Vec<u8>, RingError> {
        self.commit()?;
        self.refresh_head()?;
        let mut out = Vec::new();
        let mut pos = self.local_head;
        while pos < self.tail {
            let off = (pos % self.slots) as usize * self.slot_size;
            let raw = self.mem.slots().read_word(off);
            let Some(h) = Header::decode(raw) else {
                return Err(self.fail(RingError::Corrupt(Corruption::Header { slot: pos, raw })));
            };
            let n = record::slots_for(h.len as usize, self.slot_size) as u64;
            if n > self.tail - pos || (pos % self.slots) + n > self.slots {
                return Err(self.fail(RingError::Corrupt(Corruption::Length {
                    slot: pos,
                    len: h.len,
                })));
            }
            let start = out.len();
            out.resize(start + h.len as usize, 0);
            self.mem.slots().read(off + HEADER_BYTES, &mut out[start..]);
            pos += n;
        }
        Ok(out)
    }
}
