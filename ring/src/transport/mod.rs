//! What the protocol needs from the medium that carries a ring.
//!
//! The protocol (`Sender`, `Receiver`) builds records in *its own copy* of
//! the ring (`RingMem`) and asks the transport to make ranges of slots and
//! single control words visible in the *peer's copy*. On shared memory the
//! two copies are the same memory: slot transmission costs nothing and a
//! word write is a release store. On RDMA verbs the copies are two
//! registered regions: slot transmission is an RDMA WRITE, a word write is a
//! (possibly inline) WRITE, both ordered by the RC queue pair, and
//! visibility is known only when a signaled work request completes.

pub mod shm;
pub mod verbs;

pub use crate::sleep::flags::Ring;

use crate::error::RingError;

/// The control words one end writes into the other end's copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerWord {
    /// sender -> receiver: the published tail (tail sync).
    LocalTail,
    /// receiver -> sender: the pushed head (head sync).
    LocalHead,
    /// receiver -> sender: "I sleep; ring my doorbell after your next tail".
    RxWaiting,
    /// sender -> receiver: "I wait for space; ring my doorbell after a push".
    TxWaiting,
    /// receiver -> sender: the reader closed its end.
    RxClosed,
}

/// When a word write becomes visible to the peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Visibility {
    /// Already visible (shared memory: the store is done).
    Now,
    /// Visible once the signaled write completes (verbs): the caller learns
    /// it from `poll_completions`.
    AtCompletion,
}

/// A payload in the program's own memory, registered with the transport's
/// device (`lkey`), for a zero-copy record (`Transport::write_external`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExternalSrc {
    pub addr: u64,
    pub len: u32,
    pub lkey: u32,
}

/// The medium under one end of a ring.
pub trait Transport {
    /// Make slots `[first, first + count)` of this end's copy visible in the
    /// peer's copy. `first + count <= slots`: the protocol never asks for a
    /// range that wraps. Ordered before any later `write_word`. Only the
    /// first `last_bytes` bytes of the range's last slot hold record bytes
    /// (`1..=slot_size`); the rest of that slot is never read, so a
    /// transport that copies may leave it out.
    fn write_slots(&mut self, first: u32, count: u32, last_bytes: u32) -> Result<(), RingError>;

    /// Write one control word into the peer's copy, ordered after every
    /// earlier `write_slots`/`write_word` of this end. `signaled` asks for a
    /// completion (verbs: a signaled work request; shm: completes at once).
    fn write_word(
        &mut self,
        word: PeerWord,
        value: u64,
        signaled: bool,
    ) -> Result<Visibility, RingError>;

    /// Number of signaled writes that completed since the last call.
    fn poll_completions(&mut self) -> Result<u32, RingError>;

    /// Ring the peer's doorbell (it announced it sleeps). `ring` tells it
    /// whether this ring ends its standing flag (verbs; shm ignores it).
    fn kick_peer(&mut self, ring: Ring) -> Result<(), RingError>;

    /// Whether a word write that rings the doorbell itself
    /// (`write_word_kicking`) saves the peer time. On verbs a kick that
    /// waits for the word's completion costs a network round trip more
    /// before a sleeping peer wakes; on shared memory the store is visible
    /// at once and the kick follows it immediately anyway.
    fn kicks_with_word(&self) -> bool {
        false
    }

    /// Whether the sender should batch a stream into large transmissions
    /// (`Sender`: "Streaming batches"). On verbs every WRITE costs the
    /// device a packet train, an acknowledgement and its headers, and a
    /// record that fills whole packets; on shared memory a transmission is
    /// a store, and the receiver sees data sooner in small batches.
    fn batches_streams(&self) -> bool {
        false
    }

    /// `write_word`, then ring the peer's doorbell such that the ring
    /// reaches the peer only after the word is in its copy (verbs: one
    /// WRITE_WITH_IMM, solicited, or a kick queued behind the word on the
    /// same queue pair). A peer that sleeps on its doorbell wakes to see
    /// the word. Signaled like `write_word(.., true)`.
    fn write_word_kicking(
        &mut self,
        word: PeerWord,
        value: u64,
        ring: Ring,
    ) -> Result<Visibility, RingError> {
        let vis = self.write_word(word, value, true)?;
        self.kick_peer(ring)?;
        Ok(vis)
    }

    /// Receiver end: whether it may announce a *standing* sleep flag
    /// (`crate::sleep::flags`): the peer's sender honours them and this end's
    /// doorbell has room for their rings. Verbs only: there an
    /// announcement costs a network round trip.
    fn standing_waits(&self) -> bool {
        false
    }

    /// Receiver end: whether the ring ending the standing flag of `epoch`
    /// was reaped from the doorbell (`Ring::EndsStanding`).
    fn standing_ended(&self, _epoch: u32) -> bool {
        true
    }

    /// Receiver end, before it loads `local_tail` from its copy: a
    /// transport that fetches the data itself (verbs pull mode: RDMA READ
    /// of the sender's published tail, then of slots `[known, tail)` into
    /// this end's copy) returns that tail, which the receiver validates
    /// as any other; `None`: the sender writes `local_tail` into this
    /// end's copy (push), load it from there. `head`/`known` are the
    /// receiver's head and last validated tail.
    fn fetch_tail(&mut self, head: u64, known: u64) -> Result<Option<u64>, RingError> {
        let _ = (head, known);
        Ok(None)
    }

    /// Zero-copy record: writes `header` (the record header, already in
    /// this end's copy at slot `first`) to the peer's slot `first`, then
    /// the payload straight from `src` (the program's memory) to the bytes
    /// after it, ordered before any later write. `[first, first + count)`
    /// must be the record's slots and hold `src.len` bytes after the
    /// header; this end's copy of those slots does NOT hold the payload.
    /// Returns a token for `wait_external`. Shared memory has no use for it
    /// (the copy is the transmission): the default says unsupported.
    fn write_external(
        &mut self,
        first: u32,
        count: u32,
        header: u64,
        src: ExternalSrc,
    ) -> Result<u64, RingError> {
        let _ = (first, count, header, src);
        Err(RingError::Unsupported("zero-copy writes on this transport"))
    }

    /// Waits until the device no longer reads the memory of the external
    /// write `token` and every one before it (verbs: its signaled WRITE
    /// completed). An error means the connection is dead.
    fn wait_external(&mut self, token: u64) -> Result<(), RingError> {
        let _ = token;
        Ok(())
    }
}
