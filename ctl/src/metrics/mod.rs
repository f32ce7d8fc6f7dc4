//! The daemon's metrics in the Prometheus text exposition format (0.0.4):
//! what the registry knows now (sessions, live connection ends) and its
//! counters since start. [`render`] is the one writer of the text; the
//! `Metrics` request, `ringsock-ctl metrics` and the HTTP endpoint
//! ([`http`]) all carry its output unchanged.

mod counters;
pub mod fetch;
pub mod http;
mod render;

pub use counters::{
    ring_index, Counters, Histogram, LATENCY_BUCKETS, REFUSE_REASONS, RING_TRANSPORTS,
};
pub use render::{render, MAX_REASON_LABELS};

use std::collections::BTreeMap;

use ringsock_proto::{RingStat, Transport};

/// The ring counters that count payload bytes: each shm end sees both
/// directions of its segment, a verbs end what it sent and received.
pub const BYTE_COUNTERS: [&str; 4] = ["c2s_bytes", "s2c_bytes", "out_bytes", "in_bytes"];

/// Bytes a connection end's ring has carried, both directions.
pub fn ring_bytes(stats: &[RingStat]) -> u64 {
    stats
        .iter()
        .filter(|s| BYTE_COUNTERS.contains(&s.name.as_str()))
        .fold(0u64, |acc, s| acc.wrapping_add(s.value))
}

/// Everything [`render`] writes, gathered by the handler.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    pub counters: Counters,
    /// Local processes with a session (that said Hello), not counting the
    /// one asking.
    pub sessions: usize,
    /// Connection ends live now, by transport.
    pub ends: BTreeMap<&'static str, u64>,
    /// Live TCP ends by the reason their report gives.
    pub tcp_reasons: BTreeMap<String, u64>,
    /// Bytes carried by rings, by ring transport (`RING_TRANSPORTS` order):
    /// rings closed since start plus the live ones.
    pub ring_bytes: [u64; 2],
    /// Offers the daemon holds now, in any state.
    pub offers_live: usize,
    /// Distinct listening addresses shimmed processes registered.
    pub listeners: usize,
}

impl Snapshot {
    /// Counts one live end.
    pub fn add_end(&mut self, transport: Transport, reason: &str) {
        *self.ends.entry(transport.as_str()).or_insert(0) += 1;
        if transport == Transport::Tcp {
            *self.tcp_reasons.entry(reason.to_owned()).or_insert(0) += 1;
        }
    }
}
