//! Zero-copy sends over RDMA (opt-in: RINGSOCK_ZEROCOPY_MIN).
//!
//! A send of at least the threshold takes a registration of the program's
//! buffer from the device's cache (`ringsock_ring::transport::verbs::regcache`)
//! and goes out as RDMA WRITEs straight from it
//! (`Sender::write_zero_copy`), which returns once the device no longer
//! reads the buffer, so send() keeps its contract: the program may reuse
//! the buffer as soon as it returns. When no registration can be had
//! (cache full of buffers in flight, locked-memory limit, memory the
//! device cannot pin) the send takes the copy path.
//!
//! The cache is kept right by the memory hooks (`hooks::memory`); what
//! they cannot see is why this is opt-in (docs/limits.md). Off as well
//! where a fork could make a pinned page copy-on-write under the device
//! (`regcache::fork_safe`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use ringsock_ring::transport::verbs::regcache::{self, Miss};
use ringsock_ring::transport::verbs::VerbsTransport;
use ringsock_ring::{RingError, Sender};

/// The threshold in bytes, 0 when zero-copy is off (decided once).
fn threshold() -> usize {
    static MIN: OnceLock<usize> = OnceLock::new();
    *MIN.get_or_init(|| {
        let min = crate::config::get().zerocopy_min;
        if min == 0 {
            return 0;
        }
        if !regcache::fork_safe() {
            log::warn!(
                "RINGSOCK_ZEROCOPY_MIN={min} ignored: pinned pages are not fork-safe here \
                 (rdma-core's ibv_is_fork_initialized() is not IBV_FORK_UNNEEDED; needs \
                 Linux >= 5.13); zero-copy stays off"
            );
            return 0;
        }
        log::info!(
            "zero-copy on: RDMA sends of at least {min} bytes go out from the program's buffer"
        );
        usize::try_from(min).unwrap_or(usize::MAX)
    })
}

/// Writes `b` into the ring: zero-copy when on, large enough and
/// registrable, else copied (`Sender::write`). Same results as `write`.
pub fn write(tx: &mut Sender<VerbsTransport>, b: &[u8]) -> Result<usize, RingError> {
    let min = threshold();
    if min == 0 || b.len() < min {
        return tx.write(b);
    }
    match tx.transport_mut().zc_lease(b) {
        Ok(lease) => {
            static FIRST: AtomicBool = AtomicBool::new(true);
            if FIRST.swap(false, Ordering::Relaxed) {
                log::info!(
                    "zero-copy: first send of {} bytes straight from the program's buffer",
                    b.len()
                );
            }
            // The lease (and with it the registration) ends after the
            // WRITEs completed: write_zero_copy waits for them.
            tx.write_zero_copy(b, lease.lkey())
        }
        Err(miss) => {
            if let Miss::Failed(e) = miss {
                static SAID: AtomicBool = AtomicBool::new(false);
                if !SAID.swap(true, Ordering::Relaxed) {
                    log::warn!(
                        "zero-copy: cannot register a {}-byte send buffer ({}); such sends \
                         are copied (RLIMIT_MEMLOCK, ulimit -l, is the usual limit)",
                        b.len(),
                        std::io::Error::from_raw_os_error(e)
                    );
                }
            }
            tx.write(b)
        }
    }
}
