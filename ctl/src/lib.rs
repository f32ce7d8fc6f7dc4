//! ringsock-ctl: the per-host control daemon and its CLI.
//!
//! Layers, each testable alone: [`registry`] (pure state machine),
//! [`handler`] (one request in, one reply out, proofs through an [`Env`]),
//! [`server`] (epoll event loop), [`cli`] (commands).

pub mod handler;
pub mod proof;
pub mod registry;
pub mod ring;

pub use handler::{Env, Handler};
#[doc(hidden)]
pub mod fuzzing;
