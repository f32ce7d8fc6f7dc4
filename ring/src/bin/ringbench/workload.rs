//! Results of one run and the statistics over repeated runs.

use std::time::Duration;

/// One throughput run, measured at the receiver from the first byte to the
/// end of the stream.
#[derive(Clone, Copy, Debug)]
pub struct Throughput {
    pub bytes: u64,
    pub secs: f64,
}

impl Throughput {
    pub fn mbps(&self) -> f64 {
        self.bytes as f64 / self.secs / 1e6
    }
}

/// One ping-pong run: round-trip percentiles in microseconds.
#[derive(Clone, Copy, Debug)]
pub struct Latency {
    pub median_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
}

impl Latency {
    pub fn from_samples(mut rtts: Vec<Duration>) -> Latency {
        rtts.sort_unstable();
        let at = |q: f64| {
            let i = ((rtts.len() as f64 - 1.0) * q).round() as usize;
            rtts[i].as_secs_f64() * 1e6
        };
        Latency {
            median_us: at(0.5),
            p99_us: at(0.99),
            p999_us: at(0.999),
        }
    }
}

/// Median of repeated measurements and their spread (min..max).
#[derive(Clone, Copy, Debug)]
pub struct Summary {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

pub fn summarize(mut v: Vec<f64>) -> Summary {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    let median = if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    };
    Summary {
        median,
        min: v[0],
        max: v[n - 1],
    }
}
