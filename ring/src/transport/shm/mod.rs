//! The shared-memory transport: both ends use one ring in memory mapped by
//! both processes (or shared by two threads), so slot transmission is free
//! and a control-word write is a release store.

mod segment;

#[cfg(not(loom))]
pub use segment::{control_offset, Segment, SegmentHeader, SEGMENT_MAGIC, SEGMENT_VERSION};

use super::{PeerWord, Transport, Visibility};
use crate::error::RingError;
use crate::memory::RingMem;
use crate::sleep::notify::Notify;
use crate::sync::Ordering;
use crate::transport::Ring;

/// One end's view of a shared ring.
pub struct ShmTransport {
    mem: RingMem,
    peer: Option<Box<dyn Notify>>,
    signaled: u32,
}

impl ShmTransport {
    /// `peer` is the doorbell of the other end; `None` for an end that never
    /// needs to wake anyone (benchmarks that only spin).
    pub fn new(mem: RingMem, peer: Option<Box<dyn Notify>>) -> Self {
        ShmTransport {
            mem,
            peer,
            signaled: 0,
        }
    }

    pub fn set_peer(&mut self, peer: Box<dyn Notify>) {
        self.peer = Some(peer);
    }
}

impl Transport for ShmTransport {
    #[inline]
    fn write_slots(&mut self, _first: u32, _count: u32, _last_bytes: u32) -> Result<(), RingError> {
        // The sender built the slots in place in the shared ring; the
        // release store of the tail that follows publishes them.
        Ok(())
    }

    #[inline]
    fn write_word(
        &mut self,
        word: PeerWord,
        value: u64,
        signaled: bool,
    ) -> Result<Visibility, RingError> {
        let c = self.mem.ctrl();
        let line = match word {
            PeerWord::LocalTail => &c.local_tail,
            PeerWord::LocalHead => &c.local_head,
            PeerWord::RxWaiting => &c.rx_waiting,
            PeerWord::TxWaiting => &c.tx_waiting,
            PeerWord::RxClosed => &c.rx_closed,
        };
        // Release: slot bytes written before this store are visible to
        // whoever acquires the word.
        line.value.store(value, Ordering::Release);
        if signaled {
            self.signaled += 1;
        }
        Ok(Visibility::Now)
    }

    #[inline]
    fn poll_completions(&mut self) -> Result<u32, RingError> {
        Ok(std::mem::take(&mut self.signaled))
    }

    fn kick_peer(&mut self, _ring: Ring) -> Result<(), RingError> {
        // No standing flags on shm: the eventfd carries no message.
        match &self.peer {
            Some(bell) => bell.notify(),
            None => Ok(()),
        }
    }
}
