//! ringsock-ctl: the per-host control daemon and its CLI.
//!
//! Layers, each testable alone:
//! - [`registry`]: the pure state machine (sessions, listeners, offers,
//!   reports), no I/O;
//! - [`handler`]: one request in, one reply out; descriptor proofs through
//!   an [`Env`] ([`proof::SysEnv`] for real sockets);
//! - [`server`]: the single-threaded epoll loop; [`daemon`]: start-up and
//!   shutdown; [`sys`]: the daemon's system calls;
//! - [`cli`], [`status`], [`run`]: the commands.

pub mod cli;
pub mod conntrack;
pub mod daemon;
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;
pub mod handler;
pub mod hostid;
pub mod logger;
pub mod metrics;
pub mod netns;
pub mod offer_table;
pub mod peer;
pub mod proof;
pub mod registry;
pub mod ring;
pub mod run;
pub mod server;
pub mod service;
pub mod status;
pub mod sys;

pub use handler::{Env, Handler};
