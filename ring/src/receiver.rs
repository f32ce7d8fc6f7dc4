//! The receiving end of a ring.
//!
//! Nothing read from the ring is trusted: the published tail must move
//! forward by at most N slots beyond our head, every record header must
//! carry the magic and known flags, and every record must fit inside what
//! was published and before the end of the ring. A violation fails this
//! ring (sticky `Corrupt` error); it never panics or touches memory outside
//! the ring.

use crate::config::RingConfig;
use crate::error::{Corruption, RingError};
use crate::layout::{bump, RingControl};
use crate::memory::RingMem;
use crate::record::{self, Header, HEADER_BYTES};
use crate::sleep::backoff::{CompletionWait, WORD_LIMIT};
use crate::sleep::flags;
use crate::sync::{fence, Ordering};
use crate::transport::{PeerWord, Transport, Visibility};

pub struct Receiver<T: Transport> {
    mem: RingMem,
    transport: T,
    cfg: RingConfig,
    slots: u64,
    slot_size: usize,
    /// First slot of the current record.
    head: u64,
    /// The current record's header, once validated, and payload bytes of it
    /// already consumed.
    current: Option<Header>,
    consumed: usize,
    /// Our copy of the published tail.
    local_tail: u64,
    synced_head: u64,
    /// The last head whose WRITE carried a kick (0: none).
    kicked_head: u64,
    /// The epoch of our standing sleep flag while the sender honours it
    /// (`sleep::flags`: placed, and its ending ring not reaped yet).
    standing: Option<u32>,
    /// The epoch of the last standing flag announced.
    epoch: u32,
    eof: bool,
    failed: Option<RingError>,
    /// Payload bytes consumed so far (the stream position of `head` plus
    /// `consumed`).
    consumed_bytes: u64,
    /// Where the scan for a published end-of-stream mark got to
    /// (`eos_published`).
    eos_scan: u64,
    eos_seen: bool,
}

/// Where a read cursor stands; `peek` walks a copy of it.
#[derive(Clone, Copy)]
struct Cursor {
    head: u64,
    current: Option<Header>,
    consumed: usize,
}

impl<T: Transport> Receiver<T> {
    pub fn new(mem: RingMem, transport: T, cfg: RingConfig) -> Result<Self, RingError> {
        mem.check(&cfg)?;
        Ok(Receiver {
            mem,
            transport,
            slots: cfg.slots as u64,
            slot_size: cfg.slot_size as usize,
            cfg,
            head: 0,
            current: None,
            consumed: 0,
            local_tail: 0,
            synced_head: 0,
            kicked_head: 0,
            standing: None,
            epoch: 0,
            eof: false,
            failed: None,
            consumed_bytes: 0,
            eos_scan: 0,
            eos_seen: false,
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

    fn fail(&mut self, e: RingError) -> RingError {
        if matches!(e, RingError::Corrupt(_) | RingError::Os(_)) {
            self.failed = Some(e.clone());
        }
        e
    }

    /// Re-reads the published tail and validates it.
    fn refresh_tail(&mut self) -> Result<(), RingError> {
        // Verbs pull mode fetches the tail (and the slots) itself.
        let tail = match self.transport.fetch_tail(self.head, self.local_tail) {
            Ok(Some(t)) => t,
            Ok(None) => self.ctrl().local_tail.value.load(Ordering::Acquire),
            Err(e) => {
                let e = self.fail(e);
                // A transport failure that corrupts nothing (verbs: the
                // receive queue flushed in error once the peer's queue
                // pair went away) leaves the bytes the peer placed in our
                // copy, and the tail it published there, as they were:
                // deliver those first. The error comes back from the call
                // that finds nothing more, so a peer that exited right
                // after its last send loses nothing.
                let placed = self.ctrl().local_tail.value.load(Ordering::Acquire);
                if self.failed.is_some() || placed <= self.local_tail {
                    return Err(e);
                }
                placed
            }
        };
        if tail < self.local_tail || tail - self.head > self.slots {
            return Err(self.fail(RingError::Corrupt(Corruption::Tail {
                head: self.head,
                tail,
            })));
        }
        self.local_tail = tail;
        Ok(())
    }

    /// The record starting at `head`, validated against the published tail.
    fn record_at(&mut self, head: u64) -> Result<Header, RingError> {
        let off = (head % self.slots) as usize * self.slot_size;
        let raw = self.mem.slots().read_word(off);
        let Some(h) = Header::decode(raw) else {
            return Err(self.fail(RingError::Corrupt(Corruption::Header { slot: head, raw })));
        };
        let n = record::slots_for(h.len as usize, self.slot_size) as u64;
        if n > self.local_tail - head || head % self.slots + n > self.slots {
            return Err(self.fail(RingError::Corrupt(Corruption::Length {
                slot: head,
                len: h.len,
            })));
        }
        Ok(h)
    }

    /// Copies available bytes into `buf`, consuming them when `consume`.
    /// Returns bytes copied and whether the end-of-stream mark was reached.
    fn transfer(&mut self, buf: &mut [u8], consume: bool) -> Result<(usize, bool), RingError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let mut cur = Cursor {
            head: self.head,
            current: self.current,
            consumed: self.consumed,
        };
        let mut done = 0;
        let mut eos = self.eof;
        let mut refreshed = false;
        while done < buf.len() && !eos {
            let h = match cur.current {
                Some(h) => h,
                None => {
                    if cur.head == self.local_tail {
                        if refreshed {
                            break;
                        }
                        match self.refresh_tail() {
                            Ok(()) => {}
                            // Bytes copied in this call are delivered; the
                            // error repeats at the next one.
                            Err(_) if done > 0 && self.failed.is_none() => break,
                            Err(e) => return Err(e),
                        }
                        refreshed = true;
                        continue;
                    }
                    let h = self.record_at(cur.head)?;
                    cur.current = Some(h);
                    h
                }
            };
            if h.is_eos() {
                eos = true;
                if consume {
                    self.advance(&mut cur, 1);
                }
                break;
            }
            let off =
                (cur.head % self.slots) as usize * self.slot_size + HEADER_BYTES + cur.consumed;
            let n = (h.len as usize - cur.consumed).min(buf.len() - done);
            self.mem.slots().read(off, &mut buf[done..done + n]);
            done += n;
            cur.consumed += n;
            if cur.consumed == h.len as usize {
                let slots = record::slots_for(h.len as usize, self.slot_size) as u64;
                if consume {
                    self.advance(&mut cur, slots);
                } else {
                    cur = Cursor {
                        head: cur.head + slots,
                        current: None,
                        consumed: 0,
                    };
                }
            }
        }
        if consume {
            bump(&self.ctrl().rx_stats.bytes, done as u64);
            self.consumed_bytes += done as u64;
            self.head = cur.head;
            self.current = cur.current;
            self.consumed = cur.consumed;
            self.eof = eos;
            if let Err(e) = self.maybe_push() {
                // The bytes are copied and consumed: deliver them. A
                // transport that failed (a verbs peer that went away) says
                // so again at the next call that needs it.
                if done == 0 && !eos {
                    return Err(e);
                }
            }
        }
        Ok((done, eos))
    }

    /// Moves past the current record of `cur`.
    fn advance(&mut self, cur: &mut Cursor, slots: u64) {
        *cur = Cursor {
            head: cur.head + slots,
            current: None,
            consumed: 0,
        };
        let s = &self.ctrl().rx_stats;
        bump(&s.records, 1);
        bump(&s.slots, slots);
    }

    /// Reads into `buf`: `Ok(n > 0)` bytes, `Ok(0)` at end of stream (or for
    /// an empty `buf`), `Err(WouldBlock)` when nothing is there yet.
    pub fn read(&mut self, buf: &mut [u8]) -> Result<usize, RingError> {
        if buf.is_empty() {
            return Ok(0);
        }
        let (n, eos) = self.transfer(buf, true)?;
        if n == 0 && !eos {
            bump(&self.ctrl().rx_stats.empty, 1);
            // Going idle: the lazy rule as in `prepare_wait`, which says
            // why a sender cannot be stranded by less than gamma unpushed.
            // (Every consumed slot pushed here cost verbs a WRITE per
            // message of a ping-pong.)
            self.maybe_push()?;
            return Err(RingError::WouldBlock);
        }
        Ok(n)
    }

    /// Like `read` but leaves the bytes in the ring (MSG_PEEK).
    pub fn peek(&mut self, buf: &mut [u8]) -> Result<usize, RingError> {
        if buf.is_empty() {
            return Ok(0);
        }
        match self.transfer(buf, false)? {
            (0, false) => Err(RingError::WouldBlock),
            (n, _) => Ok(n),
        }
    }

    /// Bytes readable right now (FIONREAD).
    pub fn available(&mut self) -> Result<usize, RingError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        self.refresh_tail()?;
        let mut total = 0usize;
        let mut pos = self.head;
        let mut skip = self.consumed;
        while pos < self.local_tail {
            let h = self.record_at(pos)?;
            if h.is_eos() {
                break;
            }
            total += h.len as usize - skip;
            skip = 0;
            pos += record::slots_for(h.len as usize, self.slot_size) as u64;
        }
        Ok(total)
    }

    /// Whether a read would not block (data or end of stream).
    pub fn readable(&mut self) -> Result<bool, RingError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        if self.eof || self.current.is_some() || self.head != self.local_tail {
            return Ok(true);
        }
        self.refresh_tail()?;
        Ok(self.head != self.local_tail)
    }

    /// Payload bytes consumed so far: the exact stream position a reader
    /// that leaves the ring hands to the sender (`Sender::take_after`).
    pub fn bytes_consumed(&self) -> u64 {
        self.consumed_bytes
    }

    /// Consumes payload into `out` until `end` bytes of the stream were
    /// consumed (the sender's last ring byte before it left). `Ok(true)`
    /// once there; `Ok(false)` while the bytes before `end` are not all
    /// published yet. Never reads past `end`; an end-of-stream mark or a
    /// position already passed is corruption.
    pub fn drain_to(&mut self, end: u64, out: &mut Vec<u8>) -> Result<bool, RingError> {
        if end < self.consumed_bytes {
            return Err(self.fail(RingError::Corrupt(Corruption::Position {
                pos: end,
                low: self.consumed_bytes,
                high: u64::MAX,
            })));
        }
        while self.consumed_bytes < end {
            let want = (end - self.consumed_bytes).min(64 * 1024) as usize;
            let start = out.len();
            out.resize(start + want, 0);
            let r = self.transfer(&mut out[start..], true);
            match r {
                Ok((n, eos)) => {
                    out.truncate(start + n);
                    if eos {
                        return Err(self.fail(RingError::Corrupt(Corruption::Position {
                            pos: end,
                            low: 0,
                            high: self.consumed_bytes,
                        })));
                    }
                    if n == 0 {
                        return Ok(false);
                    }
                }
                Err(e) => {
                    out.truncate(start);
                    return Err(e);
                }
            }
        }
        Ok(true)
    }

    /// Whether the end-of-stream mark is published (it may still have data
    /// before it): the ring's FIN has arrived. Each record is looked at once
    /// over the calls.
    pub fn eos_published(&mut self) -> Result<bool, RingError> {
        if self.eof || self.eos_seen {
            return Ok(true);
        }
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        self.refresh_tail()?;
        let mut pos = self.eos_scan.max(self.head);
        while pos < self.local_tail {
            let h = self.record_at(pos)?;
            if h.is_eos() {
                self.eos_seen = true;
                return Ok(true);
            }
            pos += record::slots_for(h.len as usize, self.slot_size) as u64;
        }
        self.eos_scan = pos;
        Ok(false)
    }

    /// Whether the end-of-stream mark was consumed.
    pub fn at_eof(&self) -> bool {
        self.eof
    }

    /// Lazy push: hand space back every gamma slots, or at once when the
    /// head reaches the one a waiting sender announced (`Sender::prepare_wait`).
    fn maybe_push(&mut self) -> Result<(), RingError> {
        let pending = self.head - self.synced_head;
        if pending == 0 {
            return Ok(());
        }
        let waiting = self.ctrl().tx_waiting.value.load(Ordering::Relaxed);
        if pending >= self.cfg.gamma as u64 || (waiting != 0 && waiting <= self.head) {
            self.push_head()?;
        }
        Ok(())
    }

    /// Head sync. Pairs with `Sender::prepare_wait` exactly like the tail
    /// and `rx_waiting` pair (see `Sender::tail_visible`).
    fn push_head(&mut self) -> Result<(), RingError> {
        // As `Sender::sync_tail`: a sender known to wait for space gets
        // its doorbell with the head itself.
        let early = self.transport.kicks_with_word() && self.take_flag_tx_waiting(self.head);
        let vis = if early {
            bump(&self.ctrl().rx_stats.kicks, 1);
            self.kicked_head = self.head;
            self.transport
                .write_word_kicking(PeerWord::LocalHead, self.head, flags::Ring::Plain)
        } else {
            self.transport
                .write_word(PeerWord::LocalHead, self.head, false)
        }
        .map_err(|e| self.fail(e))?;
        self.synced_head = self.head;
        let c = self.ctrl();
        c.head.value.store(self.head, Ordering::Relaxed);
        c.synced_head
            .value
            .store(self.synced_head, Ordering::Relaxed);
        bump(&c.rx_stats.head_pushes, 1);
        if vis == Visibility::Now {
            self.head_visible()?;
        }
        Ok(())
    }

    fn head_visible(&mut self) -> Result<(), RingError> {
        if self.synced_head <= self.kicked_head {
            // That head carried its kick (`push_head`).
            return Ok(());
        }
        fence(Ordering::SeqCst);
        if self.take_flag_tx_waiting(self.synced_head) {
            bump(&self.ctrl().rx_stats.kicks, 1);
            self.transport
                .kick_peer(flags::Ring::Plain)
                .map_err(|e| self.fail(e))?;
        }
        Ok(())
    }

    /// Clears the sender's "I wait for space" flag if it waits without
    /// having seen `head`; true then (we owe it a kick). See `sleep::flags`.
    fn take_flag_tx_waiting(&self, head: u64) -> bool {
        flags::take_if_unseen(&self.ctrl().tx_waiting.value, head)
    }

    /// Reaps transport completions (verbs head pushes).
    pub fn poll(&mut self) -> Result<(), RingError> {
        if self
            .transport
            .poll_completions()
            .map_err(|e| self.fail(e))?
            > 0
        {
            self.head_visible()?;
        }
        Ok(())
    }

    /// Before sleeping on an empty ring: announce it (`rx_waiting`), then
    /// look at the tail once more (see `Sender::tail_visible` for why this
    /// order cannot lose a wakeup). Returns true when it is safe to block
    /// on our doorbell; false when data (or the end mark) arrived;
    /// `Err(WouldBlock)` when the flag's WRITE went unreported for
    /// `WORD_LIMIT` (the peer is slow or gone, and may ring no bell): sleep
    /// a bounded time, then look again.
    ///
    /// With a standing flag still honoured (`sleep::flags`) there is nothing to
    /// announce: it was placed before an earlier look at the tail, so the
    /// sender rings the doorbell for any tail this look misses, and the
    /// ring that ends the flag, if not reaped before this call (the
    /// doorbell is drained and armed before it), wakes us too.
    pub fn prepare_wait(&mut self) -> Result<bool, RingError> {
        if self.readable()? {
            return Ok(false);
        }
        self.announce_then_look()
    }

    /// `prepare_wait` for a reader that needs `need` bytes (a peek for
    /// more than is there, SO_RCVLOWAT): true also while fewer bytes sit
    /// in the ring, its flag then naming the tail it saw, so that the next
    /// tail published wakes it as a tail on an empty ring does. False once
    /// `need` bytes or the end-of-stream mark are there.
    pub fn prepare_wait_for(&mut self, need: usize) -> Result<bool, RingError> {
        if need <= 1 {
            return self.prepare_wait();
        }
        if self.eos_published()? || self.available()? >= need {
            return Ok(false);
        }
        self.announce_then_look()
    }

    /// The sleep announcement after a look at `local_tail` found too
    /// little: true when no tail came after it.
    fn announce_then_look(&mut self) -> Result<bool, RingError> {
        let seen = self.local_tail;
        // The lazy rule, not a push of every consumed slot: on verbs a
        // push is a WRITE whose completion the process waits for before
        // it sleeps, once per message in a ping-pong. Less than gamma
        // (at most half the ring) unpushed leaves the sender room (it
        // waits only for a third of the ring free, `Sender::write_space`),
        // so it cannot be blocked on space before it publishes a tail we
        // have not seen, and that tail wakes us (its ring, or our flag's
        // check) to push by this rule again.
        self.maybe_push()?;
        if let Some(epoch) = self.standing {
            if self.transport.standing_ended(epoch) {
                self.standing = None;
            }
        }
        if self.standing.is_none() {
            self.announce()?;
        }
        fence(Ordering::SeqCst);
        self.refresh_tail()?;
        if self.local_tail != seen {
            if self.standing.is_none() {
                self.transport
                    .write_word(PeerWord::RxWaiting, 0, false)
                    .map_err(|e| self.fail(e))?;
            }
            return Ok(false);
        }
        bump(&self.ctrl().rx_stats.sleeps, 1);
        Ok(true)
    }

    /// R1 and R2 of the wakeup argument: WRITE the flag (standing where
    /// the transport allows it) and wait until it is placed.
    fn announce(&mut self) -> Result<(), RingError> {
        let standing = self.transport.standing_waits();
        let value = if standing {
            self.epoch = flags::next_epoch(self.epoch);
            flags::announce_standing(self.epoch)
        } else {
            flags::announce(self.local_tail)
        };
        let vis = self
            .transport
            .write_word(PeerWord::RxWaiting, value, true)
            .map_err(|e| self.fail(e))?;
        if vis == Visibility::AtCompletion {
            let mut wait = CompletionWait::new();
            while self
                .transport
                .poll_completions()
                .map_err(|e| self.fail(e))?
                == 0
            {
                if !wait.relax_within(WORD_LIMIT) {
                    // Unconfirmed: the caller sleeps a bounded time and
                    // looks again; the report is reaped by a later poll.
                    return Err(RingError::WouldBlock);
                }
            }
            // That report also covers a head push made just above: run its
            // doorbell check, which `poll` will not see any more (verbs).
            self.head_visible()?;
        }
        if standing {
            self.standing = Some(self.epoch);
        }
        Ok(())
    }

    /// After waking (or timing out) from a wait that `prepare_wait` allowed.
    /// A standing flag stays: that is what saves the next sleep its
    /// announcement.
    pub fn finish_wait(&mut self, woken: bool) -> Result<(), RingError> {
        if woken {
            bump(&self.ctrl().rx_stats.wakeups, 1);
        }
        if self.standing.is_none() {
            self.transport
                .write_word(PeerWord::RxWaiting, 0, false)
                .map_err(|e| self.fail(e))?;
        }
        Ok(())
    }

    /// Counters and pointers of this ring.
    pub fn stats(&self) -> crate::layout::RingStats {
        self.ctrl().stats()
    }

    /// Records spin iterations spent waiting for data.
    pub fn note_spins(&self, n: u64) {
        bump(&self.ctrl().rx_stats.spins, n);
    }

    /// The reader goes away: writers get EPIPE from now on.
    pub fn close(&mut self) -> Result<(), RingError> {
        self.transport
            .write_word(PeerWord::RxClosed, 1, false)
            .map(|_| ())
    }
}
