//! ringbench: the ring between two pinned processes against kernel TCP
//! loopback, measured in the same run (runs alternate ring, tcp, ring,
//! tcp...). Prints Markdown tables; `--csv FILE` also writes every row.
//!
//! Suites: `throughput` (64 B..1 MiB one-way), `latency` (ping-pong at
//! the `--msg` sizes, default 64 B), `ablation` (RB2's optimizations
//! switched off in turn), `sweep` (the defaults' neighbourhood), `floor`
//! (the ring's ping-pong against two processes bouncing one cache line,
//! with and without copying the message each way; only when named).
//! `--quick` shortens every run.

mod floor;
mod proc;
mod ring;
mod tcp;
mod workload;

use ringsock_ring::RingConfig;
use std::fmt::Write as _;
use std::io;
use std::time::Duration;
use workload::{summarize, Latency, Summary};

struct Opts {
    quick: bool,
    reps: usize,
    suites: Vec<String>,
    csv: Option<String>,
    spin: Duration,
    msgs: Vec<usize>,
}

const SUITES: [&str; 5] = ["throughput", "latency", "ablation", "sweep", "floor"];

fn parse_args() -> Result<Opts, String> {
    let mut o = Opts {
        quick: false,
        reps: 5,
        suites: vec!["throughput".into(), "latency".into(), "ablation".into()],
        csv: None,
        spin: Duration::from_micros(50),
        msgs: vec![64],
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = |name: &str| args.next().ok_or(format!("{name} needs a value"));
        match a.as_str() {
            "--quick" => o.quick = true,
            "--reps" => o.reps = val("--reps")?.parse().map_err(|_| "--reps: not a number")?,
            "--suites" => o.suites = val("--suites")?.split(',').map(str::to_owned).collect(),
            "--csv" => o.csv = Some(val("--csv")?),
            "--msg" => {
                o.msgs = val("--msg")?
                    .split(',')
                    .map(|m| m.parse().ok().filter(|&n: &usize| n > 0))
                    .collect::<Option<_>>()
                    .ok_or("--msg: a comma list of positive byte counts")?
            }
            "--spin-us" => {
                o.spin = Duration::from_micros(
                    val("--spin-us")?
                        .parse()
                        .map_err(|_| "--spin-us: not a number")?,
                )
            }
            "-h" | "--help" => {
                println!(
                    "usage: ringbench [--quick] [--reps N] [--suites throughput,latency,ablation,sweep,floor] \
                     [--msg 64,4096] [--csv FILE] [--spin-us N]"
                );
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other:?} (try --help)")),
        }
    }
    if o.reps == 0 {
        return Err("--reps must be at least 1".into());
    }
    for s in &o.suites {
        if !SUITES.contains(&s.as_str()) {
            return Err(format!("unknown suite {s:?}"));
        }
    }
    Ok(o)
}

struct Bench {
    o: Opts,
    csv: String,
}

impl Bench {
    fn dur(&self) -> Duration {
        Duration::from_millis(if self.o.quick { 150 } else { 600 })
    }

    fn iters(&self) -> usize {
        if self.o.quick {
            20_000
        } else {
            200_000
        }
    }

    fn reps(&self) -> usize {
        if self.o.quick {
            self.o.reps.min(3)
        } else {
            self.o.reps
        }
    }

    fn row(&mut self, suite: &str, case: &str, system: &str, metric: &str, s: Summary) {
        let _ = writeln!(
            self.csv,
            "{suite},{case},{system},{metric},{:.3},{:.3},{:.3}",
            s.median, s.min, s.max
        );
    }

    /// Throughput (MB/s) of ring and TCP, alternating, `reps` times each.
    fn thr_pair(&self, cfg: RingConfig, msg: usize) -> io::Result<(Summary, Summary)> {
        let (mut r, mut t) = (vec![], vec![]);
        for _ in 0..self.reps() {
            r.push(ring::throughput(cfg, self.o.spin, msg, self.dur())?.mbps());
            t.push(tcp::throughput(msg, self.dur())?.mbps());
        }
        Ok((summarize(r), summarize(t)))
    }

    fn throughput(&mut self) -> io::Result<()> {
        println!(
            "\n### One-way throughput, two pinned processes (MB/s, median of {} runs, min..max)\n",
            self.reps()
        );
        println!(
            "| message | ringsock shm | kernel TCP loopback | ratio | ring Mmsg/s | TCP Mmsg/s |"
        );
        println!("|---|---|---|---|---|---|");
        for msg in [64, 512, 4096, 65536, 1 << 20] {
            let (r, t) = self.thr_pair(RingConfig::default(), msg)?;
            let m = |mbps: f64| mbps * 1e6 / msg as f64 / 1e6;
            println!(
                "| {} | {:.0} ({:.0}..{:.0}) | {:.0} ({:.0}..{:.0}) | {:.1}x | {:.2} | {:.2} |",
                size(msg),
                r.median,
                r.min,
                r.max,
                t.median,
                t.min,
                t.max,
                r.median / t.median,
                m(r.median),
                m(t.median)
            );
            self.row("throughput", &size(msg), "ring", "MB/s", r);
            self.row("throughput", &size(msg), "tcp", "MB/s", t);
        }
        Ok(())
    }

    fn latency(&mut self) -> io::Result<()> {
        for msg in self.o.msgs.clone() {
            self.latency_at(msg)?;
        }
        Ok(())
    }

    fn latency_at(&mut self, msg: usize) -> io::Result<()> {
        let (mut r, mut t) = (vec![], vec![]);
        for _ in 0..self.reps() {
            r.push(ring::ping_pong(
                RingConfig::default(),
                self.o.spin,
                msg,
                self.iters(),
            )?);
            t.push(tcp::ping_pong(msg, self.iters())?);
        }
        println!(
            "\n### {} ping-pong round trip (µs; {} round trips per run, median over {} runs of each percentile)\n",
            size(msg),
            self.iters(),
            self.reps()
        );
        println!("| system | median | p99 | p99.9 |");
        println!("|---|---|---|---|");
        let mut med = [0.0; 2];
        for (i, (name, v)) in [("ringsock shm", &r), ("kernel TCP loopback", &t)]
            .into_iter()
            .enumerate()
        {
            let sys = if i == 0 { "ring" } else { "tcp" };
            med[i] = self.latency_rows("latency", &format!("{msg}B"), sys, name, v);
        }
        println!("\nmedian RTT ratio (TCP / ring): {:.1}x", med[1] / med[0]);
        Ok(())
    }

    /// Prints one system's row of a latency table and records its CSV
    /// rows; returns the median of the runs' medians.
    fn latency_rows(
        &mut self,
        suite: &str,
        case: &str,
        sys: &str,
        name: &str,
        v: &[Latency],
    ) -> f64 {
        let m = summarize(v.iter().map(|l| l.median_us).collect());
        let p99 = summarize(v.iter().map(|l| l.p99_us).collect());
        let p999 = summarize(v.iter().map(|l| l.p999_us).collect());
        println!(
            "| {name} | {:.3} | {:.3} | {:.3} |",
            m.median, p99.median, p999.median
        );
        self.row(suite, case, sys, "median_us", m);
        self.row(suite, case, sys, "p99_us", p99);
        self.row(suite, case, sys, "p999_us", p999);
        m.median
    }

    /// The ring's ping-pong against the floor: a bare cache-line bounce,
    /// and the bounce with the message copied into and out of shared
    /// memory each way, runs alternating.
    fn floor(&mut self) -> io::Result<()> {
        let msgs = self.o.msgs.clone();
        let mut bounce = vec![];
        let mut ring_runs = vec![vec![]; msgs.len()];
        let mut floor_runs = vec![vec![]; msgs.len()];
        for _ in 0..self.reps() {
            bounce.push(floor::ping_pong(0, self.iters())?);
            for (i, &msg) in msgs.iter().enumerate() {
                ring_runs[i].push(ring::ping_pong(
                    RingConfig::default(),
                    self.o.spin,
                    msg,
                    self.iters(),
                )?);
                floor_runs[i].push(floor::ping_pong(msg, self.iters())?);
            }
        }
        println!(
            "\n### The ring against the floor: ping-pong round trip between cores 0 and 1 \
             (µs; {} round trips per run, median over {} runs of each percentile)\n",
            self.iters(),
            self.reps()
        );
        println!("| system | median | p99 | p99.9 |");
        println!("|---|---|---|---|");
        self.latency_rows(
            "floor",
            "bounce",
            "floor",
            "floor: one cache line bounced, no payload",
            &bounce,
        );
        for (i, &msg) in msgs.iter().enumerate() {
            let case = format!("{msg}B");
            self.latency_rows(
                "floor",
                &case,
                "floor",
                &format!("floor: bounce + {} copied in and out each way", size(msg)),
                &floor_runs[i],
            );
            self.latency_rows(
                "floor",
                &case,
                "ring",
                &format!("ring library, {}", size(msg)),
                &ring_runs[i],
            );
        }
        Ok(())
    }

    fn ablation(&mut self) -> io::Result<()> {
        let d = RingConfig::default();
        let variants = [
            ("all optimizations (default)", d),
            ("all batching off", d.unbatched()),
            (
                "no sync-ahead transmission",
                RingConfig {
                    sync_ahead: false,
                    ..d
                },
            ),
            (
                "no elastic threshold",
                RingConfig {
                    elastic: false,
                    ..d
                },
            ),
            ("no lazy push (gamma = 1)", RingConfig { gamma: 1, ..d }),
            (
                "no coalescing",
                RingConfig {
                    coalesce: false,
                    ..d
                },
            ),
        ];
        println!("\n### RB2 ablation on the shm ring (MB/s, median of {} runs; kernel TCP in the same run)\n", self.reps());
        println!("| variant | 64 B | 4 KiB |");
        println!("|---|---|---|");
        let mut tcp_row = [0.0; 2];
        for (name, cfg) in variants {
            let mut cells = vec![];
            for (j, msg) in [64usize, 4096].into_iter().enumerate() {
                let (r, t) = self.thr_pair(cfg, msg)?;
                self.row(
                    "ablation",
                    &format!("{name} {}", size(msg)),
                    "ring",
                    "MB/s",
                    r,
                );
                tcp_row[j] = t.median;
                cells.push(format!("{:.0}", r.median));
            }
            println!("| {name} | {} | {} |", cells[0], cells[1]);
        }
        println!(
            "| kernel TCP loopback | {:.0} | {:.0} |",
            tcp_row[0], tcp_row[1]
        );
        Ok(())
    }

    fn sweep(&mut self) -> io::Result<()> {
        let d = RingConfig::default();
        let mut variants: Vec<(String, RingConfig)> = vec![("default".into(), d)];
        for s in [64u32, 128, 512, 1024] {
            variants.push((format!("slot_size {s}"), RingConfig { slot_size: s, ..d }));
        }
        for n in [1024u32, 16384] {
            variants.push((format!("slots {n}"), RingConfig { slots: n, ..d }));
        }
        for (a, b) in [(4u32, 2u32), (64, 32)] {
            variants.push((
                format!("alpha {a} beta {b}"),
                RingConfig {
                    alpha: a,
                    beta: b,
                    ..d
                },
            ));
        }
        for g in [8u32, 512] {
            variants.push((format!("gamma {g}"), RingConfig { gamma: g, ..d }));
        }
        for m in [32u32, 1024] {
            variants.push((
                format!("max_record_slots {m}"),
                RingConfig {
                    max_record_slots: m,
                    ..d
                },
            ));
        }
        println!(
            "\n### Defaults sweep (one knob changed at a time; MB/s and µs, median of {} runs)\n",
            self.reps()
        );
        println!("| config | 64 B MB/s | 64 KiB MB/s | 64 B RTT µs |");
        println!("|---|---|---|---|");
        for (name, cfg) in variants {
            let reps = self.reps();
            let (mut a, mut b, mut l) = (vec![], vec![], vec![]);
            for _ in 0..reps {
                a.push(ring::throughput(cfg, self.o.spin, 64, self.dur())?.mbps());
                b.push(ring::throughput(cfg, self.o.spin, 65536, self.dur())?.mbps());
                l.push(ring::ping_pong(cfg, self.o.spin, 64, self.iters() / 4)?.median_us);
            }
            let (a, b, l) = (summarize(a), summarize(b), summarize(l));
            println!(
                "| {name} | {:.0} | {:.0} | {:.2} |",
                a.median, b.median, l.median
            );
            self.row("sweep", &name, "ring", "64B MB/s", a);
            self.row("sweep", &name, "ring", "64KiB MB/s", b);
            self.row("sweep", &name, "ring", "64B rtt_us", l);
        }
        Ok(())
    }
}

fn size(b: usize) -> String {
    match b {
        b if b >= 1 << 20 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

fn main() {
    let o = match parse_args() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("ringbench: {e}");
            std::process::exit(2);
        }
    };
    println!(
        "ringbench: {} cores, {}, spin budget {:?}, default {:?}",
        proc::num_cpus(),
        if proc::num_cpus() >= 2 {
            "processes pinned to cores 0 and 1"
        } else {
            "unpinned (1 core)"
        },
        o.spin,
        RingConfig::default()
    );
    let mut b = Bench {
        o,
        csv: "suite,case,system,metric,median,min,max\n".into(),
    };
    let suites = b.o.suites.clone();
    for s in suites {
        let r = match s.as_str() {
            "throughput" => b.throughput(),
            "latency" => b.latency(),
            "ablation" => b.ablation(),
            "floor" => b.floor(),
            _ => b.sweep(),
        };
        if let Err(e) = r {
            eprintln!("ringbench: {s}: {e}");
            std::process::exit(1);
        }
    }
    if let Some(path) = &b.o.csv {
        if let Err(e) = std::fs::write(path, &b.csv) {
            eprintln!("ringbench: writing {path}: {e}");
            std::process::exit(1);
        }
    }
}
