//! The text exposition format, version 0.0.4: per metric a `# HELP` and a
//! `# TYPE` line, then its samples; counters end in `_total`, the
//! histogram has `_bucket{le=...}` (cumulative, ending in `+Inf`), `_sum`
//! and `_count`.

use std::fmt::Write;

use ringsock_proto::{Transport, MAX_REASON};

use super::{Snapshot, LATENCY_BUCKETS, REFUSE_REASONS, RING_TRANSPORTS};

/// Most distinct TCP reasons given a label of their own; the others are
/// summed under `(other)`. Reasons come from processes: without a bound a
/// process could make the text arbitrarily long.
pub const MAX_REASON_LABELS: usize = 32;

/// The label value that sums the reasons beyond [`MAX_REASON_LABELS`].
pub const OTHER_REASON: &str = "(other)";

/// A label value escaped as the format requires (backslash, double quote,
/// line feed).
fn escape(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

struct Text(String);

impl Text {
    fn head(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.0, "# HELP {name} {help}");
        let _ = writeln!(self.0, "# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl std::fmt::Display) {
        self.0.push_str(name);
        if !labels.is_empty() {
            self.0.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.0.push(',');
                }
                let _ = write!(self.0, "{k}=\"{}\"", escape(v));
            }
            self.0.push('}');
        }
        let _ = writeln!(self.0, " {value}");
    }

    fn single(&mut self, name: &str, kind: &str, help: &str, value: impl std::fmt::Display) {
        self.head(name, kind, help);
        self.sample(name, &[], value);
    }

    /// A counter with one sample per ring transport (`values` in
    /// `RING_TRANSPORTS` order).
    fn per_ring_transport(&mut self, name: &str, help: &str, values: &[u64]) {
        self.head(name, "counter", help);
        for (tr, v) in RING_TRANSPORTS.iter().zip(values) {
            self.sample(name, &[("transport", tr.as_str())], v);
        }
    }
}

/// The whole exposition. Its length is bounded whatever the processes
/// report (at most `MAX_REASON_LABELS` reason labels of at most
/// `MAX_REASON` bytes), below `MAX_METRICS_TEXT` (unit test).
pub fn render(s: &Snapshot) -> String {
    let c = &s.counters;
    let mut t = Text(String::with_capacity(8192));
    t.single(
        "ringsock_sessions",
        "gauge",
        "Processes connected to the daemon (sessions that said Hello), not counting the one asking.",
        s.sessions,
    );
    t.head(
        "ringsock_connection_ends",
        "gauge",
        "Connection ends reported live by shimmed processes, by transport.",
    );
    for tr in [Transport::Shm, Transport::Rdma, Transport::Tcp] {
        let n = s.ends.get(tr.as_str()).copied().unwrap_or(0);
        t.sample("ringsock_connection_ends", &[("transport", tr.as_str())], n);
    }
    t.head(
        "ringsock_tcp_connection_ends",
        "gauge",
        "Live connection ends on plain TCP, by the reason their process reported.",
    );
    let mut other = 0u64;
    for (i, (reason, n)) in s.tcp_reasons.iter().enumerate() {
        if i < MAX_REASON_LABELS {
            let r = ringsock_proto::client::truncate_utf8(reason, MAX_REASON);
            t.sample("ringsock_tcp_connection_ends", &[("reason", r)], n);
        } else {
            other = other.saturating_add(*n);
        }
    }
    if other > 0 {
        t.sample(
            "ringsock_tcp_connection_ends",
            &[("reason", OTHER_REASON)],
            other,
        );
    }
    t.per_ring_transport(
        "ringsock_ring_setups_total",
        "Connection ends first reported on a ring, by transport, since the daemon started.",
        &c.ring_setups,
    );
    t.single(
        "ringsock_fallbacks_total",
        "counter",
        "Connection ends reported on a ring and later on TCP (ring to TCP fallback), since start.",
        c.fallbacks,
    );
    t.per_ring_transport(
        "ringsock_ring_bytes_total",
        "Bytes carried by rings (both directions, once per ring), live rings plus closed ones, by transport.",
        &s.ring_bytes,
    );
    t.single(
        "ringsock_offers_made_total",
        "counter",
        "Ring offers registered since start.",
        c.offers_made,
    );
    t.single(
        "ringsock_offers_claimed_total",
        "counter",
        "Offers claimed by a server process of this host since start.",
        c.offers_claimed,
    );
    t.single(
        "ringsock_offers_answered_total",
        "counter",
        "Claims answered (the server took the ring) since start.",
        c.offers_answered,
    );
    t.single(
        "ringsock_offers_declined_total",
        "counter",
        "Claims declined by the server since start.",
        c.offers_declined,
    );
    t.head(
        "ringsock_offers_refused_total",
        "counter",
        "Offers refused since start, by reason.",
    );
    for (i, r) in REFUSE_REASONS.iter().enumerate() {
        t.sample(
            "ringsock_offers_refused_total",
            &[("reason", r.as_str())],
            c.offers_refused[i],
        );
    }
    t.single(
        "ringsock_offers_expired_total",
        "counter",
        "Offers not claimed or not answered in time, since start.",
        c.offers_expired,
    );
    t.single(
        "ringsock_offers",
        "gauge",
        "Offers the daemon holds now, in any state.",
        s.offers_live,
    );
    t.single(
        "ringsock_listeners",
        "gauge",
        "Distinct listening addresses registered by shimmed processes.",
        s.listeners,
    );
    let h = &c.setup_latency;
    let name = "ringsock_setup_latency_seconds";
    t.head(
        name,
        "histogram",
        "Time from an offer's registration to the claimer's answer, for answered offers.",
    );
    let bucket = format!("{name}_bucket");
    for (le, n) in h.cumulative() {
        t.sample(&bucket, &[("le", &le.to_string())], n);
    }
    t.sample(&bucket, &[("le", "+Inf")], h.count());
    t.sample(&format!("{name}_sum"), &[], h.sum());
    t.sample(&format!("{name}_count"), &[], h.count());
    debug_assert!(LATENCY_BUCKETS.len() == h.cumulative().count());
    t.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringsock_proto::MAX_METRICS_TEXT;
    use std::time::Duration;

    #[test]
    fn worst_case_fits_a_reply() {
        let mut s = Snapshot::default();
        for i in 0..(MAX_REASON_LABELS * 4) {
            // Every byte of the longest reason doubles when escaped.
            let reason = format!("{i:04}{}", "\"".repeat(MAX_REASON - 4));
            s.tcp_reasons.insert(reason, u64::MAX);
        }
        s.counters.offers_refused = [u64::MAX; 4];
        s.counters
            .setup_latency
            .observe(Duration::from_secs(u64::MAX / 2));
        let text = render(&s);
        assert!(text.len() < MAX_METRICS_TEXT, "{}", text.len());
        let reasons = text
            .lines()
            .filter(|l| l.starts_with("ringsock_tcp_connection_ends{"))
            .count();
        assert_eq!(reasons, MAX_REASON_LABELS + 1);
        assert!(text.contains("reason=\"(other)\""));
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape("a\\b\"c\nd"), "a\\\\b\\\"c\\nd");
        let mut s = Snapshot::default();
        s.add_end(Transport::Tcp, "server said \"no\"");
        s.add_end(Transport::Shm, "");
        let text = render(&s);
        assert!(
            text.contains("ringsock_tcp_connection_ends{reason=\"server said \\\"no\\\"\"} 1\n")
        );
        assert!(text.contains("ringsock_connection_ends{transport=\"shm\"} 1\n"));
        assert!(text.contains("ringsock_setup_latency_seconds_bucket{le=\"0.00001\"} 0\n"));
        assert!(text.contains("ringsock_setup_latency_seconds_bucket{le=\"+Inf\"} 0\n"));
        assert!(text.ends_with("ringsock_setup_latency_seconds_count 0\n"));
    }
}
