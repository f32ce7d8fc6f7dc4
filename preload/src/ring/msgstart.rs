//! Which sends start a message, and go out at once instead of waiting in
//! a batch.
//!
//! A send starts a message when the program waited since its last send
//! (the process blocked: `background::blocks` moved) or read from the
//! connection since: it answers a request, or asks again after the last
//! answer. The program then usually waits for the answer, which would
//! flush the batch anyway, so publishing it at once costs nothing, like
//! the segment that Nagle's algorithm lets out when nothing is in flight.
//! Held, every message of a request/response program would post a flush
//! to the background thread and, where the thread sleeps, wake it: an
//! eventfd write in the send and a context switch on the round trip's
//! path. Writes that follow without a wait or a read are a stream: they
//! coalesce (RB2 batching, `Sender::end_stream`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::background;

/// One connection's view of it.
pub struct MessageStart {
    /// The process's block count at the last send.
    blocks_seen: AtomicU64,
    /// The program took bytes from the connection since its last send.
    read: AtomicBool,
}

impl MessageStart {
    pub const fn new() -> Self {
        MessageStart {
            blocks_seen: AtomicU64::new(0),
            read: AtomicBool::new(false),
        }
    }

    /// The program took bytes from the connection (not a peek).
    pub fn note_read(&self) {
        // A load first: a reader that streams in writes the line once.
        if !self.read.load(Ordering::Relaxed) {
            self.read.store(true, Ordering::Relaxed);
        }
    }

    /// At a send, under the connection's sender lock (plain loads and
    /// stores do): whether it starts a message, and from now on the
    /// sends that follow do not.
    pub fn starts_message(&self) -> bool {
        self.starts_message_at(background::blocks())
    }

    /// `starts_message` with the process's block count `blocks`.
    fn starts_message_at(&self, blocks: u64) -> bool {
        let waited = self.blocks_seen.load(Ordering::Relaxed) != blocks;
        if waited {
            self.blocks_seen.store(blocks, Ordering::Relaxed);
        }
        let read = self.read.load(Ordering::Relaxed);
        if read {
            self.read.store(false, Ordering::Relaxed);
        }
        waited || read
    }
}

#[cfg(test)]
mod tests {
    use super::MessageStart;

    // The process-wide block count moves under other tests' feet: these
    // pass their own.
    #[test]
    fn a_read_starts_the_next_message_once() {
        let m = MessageStart::new();
        assert!(!m.starts_message_at(0), "no wait and no read yet");
        m.note_read();
        m.note_read();
        assert!(m.starts_message_at(0), "the send after a read answers it");
        assert!(!m.starts_message_at(0), "the send after that continues it");
    }

    #[test]
    fn a_wait_of_the_process_starts_the_next_message_once() {
        let m = MessageStart::new();
        assert!(m.starts_message_at(3), "the process blocked since");
        assert!(!m.starts_message_at(3));
        assert!(m.starts_message_at(4));
        m.note_read();
        assert!(m.starts_message_at(5), "both at once: one message start");
        assert!(!m.starts_message_at(5));
    }
}
