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
//! `transport::shm` runs it over memory shared by two processes,
//! `transport::verbs` (feature `verbs`) over RDMA between hosts. `config`
//! holds the geometry and batching knobs, `layout` the shared control
//! block (what `ringsock-ctl status` reads), `sleep` how an end spins,
//! announces that it sleeps, sleeps and is woken. The library reads no
//! environment: every knob comes from the caller.

/// Declares a module private to the crate, except under `--cfg loom` and
/// `--cfg fuzzing`: the loom models (`tests/loom_*.rs`) and the fuzz
/// targets (`fuzz/`) drive its code directly.
macro_rules! model_visible {
    ($(#[$attr:meta])* mod $name:ident;) => {
        #[cfg(any(loom, fuzzing))]
        $(#[$attr])*
        pub mod $name;
        #[cfg(not(any(loom, fuzzing)))]
        $(#[$attr])*
        pub(crate) mod $name;
    };
}

pub mod config;
mod error;
pub mod layout;
mod memory;
mod receiver;
model_visible! {
    mod record;
}
mod sender;
pub mod sleep;
mod sync;
pub mod transport;

pub use config::RingConfig;
pub use error::{ConfigError, Corruption, RingError, VerbsError};
pub use layout::{RingControl, RingStats};
pub use memory::{RingMem, SlotMemory};
pub use receiver::Receiver;
pub use sender::Sender;
pub use sleep::notify::Notify;
pub use transport::shm::ShmTransport;
pub use transport::{PeerWord, Ring, Transport, Visibility};

#[cfg(not(loom))]
pub use sleep::notify::EventFd;
#[cfg(not(loom))]
pub use sleep::spin::SpinBudget;
#[cfg(not(loom))]
pub use transport::shm::Segment;

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
