//! The daemon's event counters since start, kept by the registry where the
//! events happen (plain integers: the registry is single-threaded), and the
//! setup latency histogram.

use std::time::Duration;

use ringsock_proto::{RefuseReason, Transport};

/// Upper bounds (seconds) of the setup latency buckets, 10 µs to 1 s; the
/// `+Inf` bucket is implied.
pub const LATENCY_BUCKETS: [f64; 16] = [
    0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025,
    0.05, 0.1, 0.25, 0.5, 1.0,
];

/// Every refuse reason, in wire order (label values of the refused counter).
pub const REFUSE_REASONS: [RefuseReason; 4] = [
    RefuseReason::NoListener,
    RefuseReason::Duplicate,
    RefuseReason::TooMany,
    RefuseReason::Invalid,
];

/// The ring transports (label values of the per-transport ring counters).
pub const RING_TRANSPORTS: [Transport; 2] = [Transport::Shm, Transport::Rdma];

/// A histogram with the fixed [`LATENCY_BUCKETS`]: per-bucket (not
/// cumulative) counts, the last one for values above every bound.
#[derive(Debug, Clone, PartialEq)]
pub struct Histogram {
    counts: [u64; LATENCY_BUCKETS.len() + 1],
    sum: f64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: [0; LATENCY_BUCKETS.len() + 1],
            sum: 0.0,
        }
    }
}

impl Histogram {
    pub fn observe(&mut self, d: Duration) {
        let v = d.as_secs_f64();
        let i = LATENCY_BUCKETS
            .iter()
            .position(|&b| v <= b)
            .unwrap_or(LATENCY_BUCKETS.len());
        self.counts[i] += 1;
        self.sum += v;
    }

    /// (upper bound, cumulative count) per finite bucket, as exposed.
    pub fn cumulative(&self) -> impl Iterator<Item = (f64, u64)> + '_ {
        LATENCY_BUCKETS
            .iter()
            .zip(self.counts.iter().scan(0u64, |acc, c| {
                *acc += c;
                Some(*acc)
            }))
            .map(|(&b, c)| (b, c))
    }

    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    pub fn sum(&self) -> f64 {
        self.sum
    }
}

/// Events since the daemon started.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Counters {
    /// Offers registered (local, forwarded to another host, or from one).
    pub offers_made: u64,
    /// Offers refused, indexed like [`REFUSE_REASONS`].
    pub offers_refused: [u64; 4],
    /// Offers claimed by a server process of this host.
    pub offers_claimed: u64,
    /// Claims answered (the server took the ring) or declined.
    pub offers_answered: u64,
    pub offers_declined: u64,
    /// Open or claimed offers whose deadline passed.
    pub offers_expired: u64,
    /// Connection ends first reported on a ring, indexed like
    /// [`RING_TRANSPORTS`].
    pub ring_setups: [u64; 2],
    /// Connection ends reported on a ring, then re-reported on TCP.
    pub fallbacks: u64,
    /// Offer registration to the claimer's answer, for answered offers.
    pub setup_latency: Histogram,
}

impl Counters {
    pub fn refused(&mut self, reason: RefuseReason) {
        let i = REFUSE_REASONS
            .iter()
            .position(|&r| r == reason)
            .unwrap_or(REFUSE_REASONS.len() - 1);
        self.offers_refused[i] += 1;
    }

    /// A connection end reported as `now`, which replaces `before` (its
    /// transport) when the same connection was reported already.
    pub fn reported(&mut self, before: Option<Transport>, now: Transport) {
        let was_ring = before.is_some_and(|t| t != Transport::Tcp);
        match ring_index(now) {
            Some(i) if !was_ring => self.ring_setups[i] += 1,
            Some(_) => {}
            None if was_ring => self.fallbacks += 1,
            None => {}
        }
    }
}

/// Position of a ring transport in [`RING_TRANSPORTS`]; None for TCP.
pub fn ring_index(t: Transport) -> Option<usize> {
    RING_TRANSPORTS.iter().position(|&r| r == t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative_and_inclusive() {
        let mut h = Histogram::default();
        h.observe(Duration::from_micros(10));
        h.observe(Duration::from_micros(11));
        h.observe(Duration::from_millis(1));
        h.observe(Duration::from_secs(2));
        let c: Vec<(f64, u64)> = h.cumulative().collect();
        assert_eq!(c.len(), LATENCY_BUCKETS.len());
        assert_eq!(c[0], (0.000_01, 1));
        assert_eq!(c[1], (0.000_025, 2));
        assert_eq!(c[6], (0.001, 3));
        assert_eq!(c.last(), Some(&(1.0, 3)));
        assert_eq!(h.count(), 4);
        assert!((h.sum() - 2.001_021).abs() < 1e-9);
    }

    #[test]
    fn setups_and_fallbacks_follow_report_changes() {
        let mut c = Counters::default();
        c.reported(None, Transport::Shm);
        c.reported(Some(Transport::Shm), Transport::Shm);
        c.reported(None, Transport::Tcp);
        c.reported(Some(Transport::Tcp), Transport::Rdma);
        c.reported(Some(Transport::Shm), Transport::Tcp);
        c.reported(Some(Transport::Tcp), Transport::Tcp);
        assert_eq!(c.ring_setups, [1, 1]);
        assert_eq!(c.fallbacks, 1);
        c.refused(RefuseReason::TooMany);
        assert_eq!(c.offers_refused, [0, 0, 1, 0]);
    }
}
