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
#[cfg(all(feature = "verbs", not(loom)))]
pub mod verbs;
pub mod verbs_stats;

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

/// The medium under one end of a ring.
pub trait Transport {
    /// Make slots `[first, first + count)` of this end's copy visible in the
    /// peer's copy. `first + count <= slots`: the protocol never asks for a
    /// range that wraps. Ordered before any later `write_word`.
    fn write_slots(&mut self, first: u32, count: u32) -> Result<(), RingError>;

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

    /// Ring the peer's doorbell (it announced it sleeps).
    fn kick_peer(&mut self) -> Result<(), RingError>;
}
