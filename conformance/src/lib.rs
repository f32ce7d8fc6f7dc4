//! ringsock's differential conformance suite: the kernel is the oracle.
//!
//! Each scenario is a small program in two roles (server and client, each
//! a process making raw libc socket calls) that logs one line per
//! observable event (`ops`, `role`). The runner (`runner`) runs it plain
//! and with both roles under `libringsock.so` and a private daemon, and
//! compares the logs; `known` lists the scenarios that differ today and
//! how, `suite` judges a run against it. `runner::hosts` runs the roles
//! on two hosts instead (the Soft-RoCE guest, scripts/softroce-vm.d/
//! conform.sh), where the rings are RDMA verbs rings.

pub mod addr;
pub mod known;
pub mod markdown;
pub mod names;
pub mod obs;
pub mod ops;
pub mod probe;
pub mod role;
pub mod runner;
pub mod scenario;
pub mod scenarios;
pub mod suite;
pub mod sync;
