//! The RB2 distributed ring buffer, as a byte stream.
//!
//! One ring carries one direction of a connection: N fixed-size,
//! cache-line-aligned slots; the sender appends records (small writes
//! coalesce into one record, large ones become a few large records), sends
//! them to the receiver's copy in batches of `beta` slots (sync-ahead), and
//! publishes its tail every `alpha` slots with a second write after the data
//! (write twice), deferring that write while the previous one is
//! unacknowledged (elastic threshold). The receiver hands space back lazily
//! every `gamma` slots. Either end may sleep on a doorbell without a lost
//! wakeup (`Sender::prepare_wait`, `Receiver::prepare_wait`).
//!
//! The protocol (`sender`, `receiver`) drives a `transport::Transport`;
//! `transport::shm` runs it over memory shared by two processes.


pub mod backoff;
pub mod config;
pub mod error;
pub mod headerless;
pub mod layout;
pub mod memory;
pub mod notify;
pub mod park;
pub mod receiver;
pub mod record;
pub mod sender;
mod sync;
pub mod tail_hint;
pub mod transport;
pub mod wait;
pub mod waiting;

pub use config::RingConfig;
pub use error::{Corruption, RingError};
pub use layout::{RingControl, RingStats};
pub use memory::RingMem;
pub use notify::Notify;
pub use receiver::Receiver;
pub use sender::Sender;
pub use transport::shm::ShmTransport;
pub use transport::{PeerWord, Transport, Visibility};

#[cfg(not(loom))]
pub use notify::EventFd;
#[cfg(not(loom))]
pub use transport::shm::Segment;
#[cfg(all(feature = "verbs", not(loom)))]
pub use transport::verbs::{Device, Doorbell, QpParams, VerbsConn, VerbsTransport};
#[cfg(not(loom))]
pub use wait::SpinBudget;

/// A sender/receiver pair over one ring in private memory, for two threads
/// of one process (tests, benchmarks).
pub fn heap_pair(
    cfg: RingConfig,
    rx_bell: Option<Box<dyn Notify>>,
    tx_bell: Option<Box<dyn Notify>>,
) -> Result<(Sender<ShmTransport>, Receiver<ShmTransport>), RingError> {
    let mem = RingMem::heap(&cfg);
    let tx = Sender::new(mem.clone(), ShmTransport::new(mem.clone(), rx_bell), cfg)?;
    let rx = Receiver::new(mem.clone(), ShmTransport::new(mem, tx_bell), cfg)?;
    Ok((tx, rx))
}
