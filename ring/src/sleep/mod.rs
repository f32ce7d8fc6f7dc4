//! How an end waits: it spins for a while (`spin`), announces that it
//! sleeps in a flag the other end checks after each publish (`flags`),
//! then blocks on a doorbell the other end rings (`notify`). Completion
//! waits that cannot sleep back off from spinning to yielding
//! (`backoff`); the shim's worker thread sleeps with `park`.

pub mod backoff;
model_visible! {
    mod flags;
}
pub mod notify;
pub mod park;
#[cfg(not(loom))]
pub mod spin;
