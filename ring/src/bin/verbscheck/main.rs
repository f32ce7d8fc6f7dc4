//! `verbscheck`: two processes run RB2 rings over RDMA verbs (or, for
//! comparison, kernel TCP) and check and time them.
//!
//! ```text
//! verbscheck info                                   device, port, GID chosen
//! verbscheck pick ADDR...                           device chosen by the route to each ADDR
//! verbscheck conn-loop [--iters N]                  create/drop N connection ends, count leaks
//! verbscheck serve     --listen ADDR                verbs server (QP parameters over TCP)
//! verbscheck tcp-serve --listen ADDR                TCP server (raw libc sockets)
//! verbscheck stream    --connect ADDR [--tcp] --mib N [--seed S]
//! verbscheck pingpong  --connect ADDR [--tcp] [--sizes 64,4096,65536] [--iters N]
//!                      [--bw-mib M] [--reps R] [--spin-us U] [--gamma N]
//! verbscheck rpc-serve --listen ADDR                many clients, one polling thread
//! verbscheck rpc       --connect ADDR [--clients N] [--sizes 64,4096] [--secs S]
//! ```
//!
//! `rpc` (`rpc.rs`): N client connections (one thread each) do 64 B
//! request / SIZE reply round trips against one `rpc-serve` process that
//! serves them all from one polling thread: the many-clients-to-one-server
//! shape of the pull mode (`RINGSOCK_VERBS_MODE` in the server's
//! environment picks how its replies travel).
//!
//! The verbs modes pick their device with `Device::open_for` on the
//! control connection's peer address (`--via ADDR`: the route to ADDR
//! instead); `RINGSOCK_DEVICE` / `RINGSOCK_GID_INDEX` override.
//!
//! `stream`: both ends send N MiB of seeded pseudo-random bytes in random
//! write sizes (1 B..64 KiB) at the same time, a ring each way; each end
//! checksums (FNV-1a) what it sent and what it received, and the checksums
//! are compared over the control connection. `pingpong`: median round trip
//! per message size, then one-way throughput (median of R transfers of M
//! MiB, acknowledged by one byte; the clock starts once the connection is
//! up: after the queue pair's setup in verbs mode, after a one-byte
//! "ready" from the server in the TCP modes, since under the shim a
//! connect returns before the ring is set up). Results are
//! `RESULT key=value...` lines.
//! The TCP modes use raw `socket/connect/send/recv` on one socket (no
//! `accept4`, no control connection), so they also run under rsocket's
//! preload library.

mod env;
mod rpc;
mod tcp;
mod vrb;

use std::time::Duration;

pub const MODE_STREAM: u32 = 1;
pub const MODE_PINGPONG: u32 = 2;
pub const MODE_BW: u32 = 3;

/// What a client asks a server to do in one session.
#[derive(Clone, Copy, Debug)]
pub struct Header {
    pub mode: u32,
    pub size: u32,
    pub count: u64,
    pub seed: u64,
}

impl Header {
    pub const LEN: usize = 24;
    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0..4].copy_from_slice(&self.mode.to_le_bytes());
        b[4..8].copy_from_slice(&self.size.to_le_bytes());
        b[8..16].copy_from_slice(&self.count.to_le_bytes());
        b[16..24].copy_from_slice(&self.seed.to_le_bytes());
        b
    }
    pub fn decode(b: &[u8; Self::LEN]) -> Result<Header, String> {
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| {
            let mut x = [0u8; 8];
            x.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(x)
        };
        let h = Header {
            mode: u32_at(0),
            size: u32_at(4),
            count: u64_at(8),
            seed: u64_at(16),
        };
        if !(MODE_STREAM..=MODE_BW).contains(&h.mode)
            || h.size > 1 << 20
            || (h.mode != MODE_STREAM && h.size == 0)
            || h.count > 1 << 40
        {
            return Err(format!("bad session header {h:?}"));
        }
        Ok(h)
    }
}

/// xorshift64*: the byte generator of the stream test and its write sizes.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub fn fill(&mut self, buf: &mut [u8]) {
        for c in buf.chunks_mut(8) {
            let v = self.next_u64().to_le_bytes();
            c.copy_from_slice(&v[..c.len()]);
        }
    }
    /// 1..=max, skewed towards small sizes (half the writes under 256 B).
    pub fn size(&mut self, max: usize) -> usize {
        let r = self.next_u64();
        let cap = if r & 1 == 0 { 256 } else { max };
        1 + (r >> 8) as usize % cap.min(max)
    }
}

pub const FNV_INIT: u64 = 0xcbf2_9ce4_8422_2325;
pub fn fnv(mut h: u64, data: &[u8]) -> u64 {
    for &b in data {
        h ^= b as u64;
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    h
}

pub fn median_us(mut v: Vec<Duration>) -> (f64, f64) {
    if v.is_empty() {
        return (0.0, 0.0);
    }
    v.sort();
    let med = v[v.len() / 2].as_secs_f64() * 1e6;
    let p99 = v[(v.len() * 99 / 100).min(v.len() - 1)].as_secs_f64() * 1e6;
    (med, p99)
}

pub fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

#[derive(Debug)]
pub struct Opts {
    pub addr: String,
    pub tcp: bool,
    pub mib: u64,
    pub seed: u64,
    pub sizes: Vec<u32>,
    pub iters: u64,
    pub bw_mib: u64,
    pub reps: usize,
    pub spin: Duration,
    /// Pick the verbs device by the route to this address.
    pub via: Option<std::net::IpAddr>,
    /// `--tcp` client: bind its socket to this local address first (under
    /// rsocket's preload that picks the RDMA device the connection leaves
    /// from, as `--via` does for the verbs mode).
    pub bind: Option<std::net::Ipv4Addr>,
    /// `rpc`: client connections (threads) and seconds of round trips.
    pub clients: usize,
    pub secs: u64,
    /// `--gamma N`: this end's receiving ring pushes its head every N
    /// consumed slots (`RingConfig::gamma`; the library's default when
    /// absent, the shim's on RDMA is a quarter of the ring).
    pub gamma: Option<u32>,
}

fn parse(args: &[String]) -> Result<Opts, String> {
    let mut o = Opts {
        addr: String::new(),
        tcp: false,
        mib: 16,
        seed: 0x5eed,
        sizes: vec![64, 4096, 65536],
        iters: 1000,
        bw_mib: 8,
        reps: 3,
        spin: Duration::from_micros(2000),
        via: None,
        bind: None,
        clients: 1,
        secs: 3,
        gamma: None,
    };
    let mut i = 0;
    while i < args.len() {
        let a = args[i].as_str();
        let mut val = || {
            i += 1;
            args.get(i).cloned().ok_or(format!("{a} needs a value"))
        };
        let num = |s: String| {
            s.parse::<u64>()
                .map_err(|_| format!("{a}: not a number: {s}"))
        };
        match a {
            "--listen" | "--connect" => o.addr = val()?,
            "--tcp" => o.tcp = true,
            "--via" => {
                let v = val()?;
                o.via = Some(
                    v.parse()
                        .map_err(|_| format!("--via: not an IP address: {v}"))?,
                )
            }
            "--bind" => {
                let v = val()?;
                o.bind = Some(
                    v.parse()
                        .map_err(|_| format!("--bind: not an IPv4 address: {v}"))?,
                )
            }
            "--mib" => o.mib = num(val()?)?,
            "--seed" => o.seed = num(val()?)?,
            "--iters" => o.iters = num(val()?)?,
            "--bw-mib" => o.bw_mib = num(val()?)?,
            "--reps" => o.reps = num(val()?)?.max(1) as usize,
            "--clients" => o.clients = num(val()?)?.clamp(1, 256) as usize,
            "--secs" => o.secs = num(val()?)?.max(1),
            "--spin-us" => o.spin = Duration::from_micros(num(val()?)?),
            "--gamma" => {
                let g = num(val()?)?;
                let half = u64::from(ringsock_ring::RingConfig::default().slots / 2);
                if g == 0 || g > half {
                    return Err(format!("--gamma must be in 1..={half}"));
                }
                o.gamma = Some(g as u32);
            }
            "--sizes" => {
                o.sizes = val()?
                    .split(',')
                    .map(|s| s.trim().parse::<u32>().map_err(|_| format!("bad size {s}")))
                    .collect::<Result<_, _>>()?;
                if o.sizes.iter().any(|&s| s == 0 || s > 1 << 20) {
                    return Err("sizes must be in 1..=1048576".into());
                }
            }
            _ => return Err(format!("unknown argument {a}")),
        }
        i += 1;
    }
    Ok(o)
}

const USAGE: &str =
    "usage: verbscheck info | pick ADDR... | conn-loop [--iters N] | serve --listen ADDR | tcp-serve --listen ADDR | \
stream --connect ADDR [--tcp] [--mib N] [--seed S] | pingpong --connect ADDR [--tcp] \
[--sizes 64,4096,65536] [--iters N] [--bw-mib M] [--reps R] [--spin-us U] [--gamma N] [--via ADDR] [--bind ADDR] | \
rpc-serve --listen ADDR | rpc --connect ADDR [--clients N] [--sizes 64,4096] [--secs S]";

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(cmd) = args.first() else {
        eprintln!("{USAGE}");
        std::process::exit(2);
    };
    if cmd == "pick" {
        if let Err(e) = vrb::pick(&args[1..]) {
            eprintln!("verbscheck pick: {e}");
            std::process::exit(1);
        }
        return;
    }
    let opts = match parse(&args[1..]) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("verbscheck: {e}\n{USAGE}");
            std::process::exit(2);
        }
    };
    let needs_addr = cmd != "info" && cmd != "conn-loop";
    if needs_addr && opts.addr.is_empty() {
        eprintln!("verbscheck: --listen/--connect missing\n{USAGE}");
        std::process::exit(2);
    }
    let r: Result<(), String> = match (cmd.as_str(), opts.tcp) {
        ("info", _) => vrb::info(),
        ("conn-loop", _) => vrb::conn_loop(&opts),
        ("serve", _) => vrb::serve(&opts),
        ("tcp-serve", _) => tcp::serve(&opts),
        ("stream", false) => vrb::stream(&opts),
        ("stream", true) => tcp::stream(&opts),
        ("pingpong", false) => vrb::pingpong(&opts),
        ("pingpong", true) => tcp::pingpong(&opts),
        ("rpc-serve", _) => rpc::serve(&opts),
        ("rpc", _) => rpc::client(&opts),
        _ => Err(format!("unknown command {cmd}\n{USAGE}")),
    };
    if let Err(e) = r {
        eprintln!("verbscheck {cmd}: {e}");
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests {
    use super::parse;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn gamma_is_taken_within_half_the_ring() {
        assert_eq!(parse(&args("--gamma 1024")).unwrap().gamma, Some(1024));
        assert_eq!(parse(&args("--iters 5")).unwrap().gamma, None);
        let half = ringsock_ring::RingConfig::default().slots / 2;
        assert_eq!(
            parse(&args(&format!("--gamma {half}"))).unwrap().gamma,
            Some(half)
        );
    }

    #[test]
    fn gamma_out_of_range_or_garbage_is_refused() {
        let half = ringsock_ring::RingConfig::default().slots / 2;
        for bad in [
            "0".to_string(),
            (half + 1).to_string(),
            "x".into(),
            "-3".into(),
        ] {
            let e = parse(&args(&format!("--gamma {bad}"))).unwrap_err();
            assert!(e.contains("--gamma"), "{bad}: {e}");
        }
        assert!(parse(&args("--gamma"))
            .unwrap_err()
            .contains("needs a value"));
    }
}
