//! Atomics used by the protocol, swapped for loom's under `--cfg loom` so the
//! very same protocol code is model-checked.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicU64};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{fence, AtomicU64};

pub(crate) use std::sync::atomic::Ordering;
