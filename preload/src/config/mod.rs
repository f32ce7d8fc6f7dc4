//! Knobs: every RINGSOCK_* environment variable, parsed once.
//!
//! `get()` parses the environment the first time it is called (the library
//! constructor calls it, and so does any hook that needs it earlier) and
//! installs the logger. A bad value never stops the program: it produces one
//! line naming the variable, the value and the default used instead, printed
//! whatever the log level.

mod parse;

use std::ffi::OsString;
use std::fmt;
use std::net::IpAddr;
use std::sync::OnceLock;

use log::LevelFilter;

pub use parse::{Cidr, PortSet};

/// Where the control daemon listens by default.
pub const DEFAULT_CTL_SOCK: &str = "/run/ringsock/ctl.sock";

/// The shim's configuration. Field docs name the variable and default.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// RINGSOCK_DISABLE (0): 1 turns the shim into a pure pass-through.
    pub disable: bool,
    /// RINGSOCK_LOG (warn): off, error, warn, info, debug, trace.
    pub log_level: LevelFilter,
    /// RINGSOCK_LOG_FILE (unset = stderr).
    pub log_file: Option<OsString>,
    /// RINGSOCK_CTL_SOCK (/run/ringsock/ctl.sock).
    pub ctl_sock: OsString,
    /// RINGSOCK_INCLUDE_PORTS (empty = every port).
    pub include_ports: PortSet,
    /// RINGSOCK_EXCLUDE_PORTS (empty = none).
    pub exclude_ports: PortSet,
    /// RINGSOCK_INCLUDE_NETS (empty = every address).
    pub include_nets: Vec<Cidr>,
    /// RINGSOCK_EXCLUDE_NETS (empty = none).
    pub exclude_nets: Vec<Cidr>,
    /// RINGSOCK_RING_SLOTS (4096): power of two in 64..=1048576.
    pub ring_slots: u32,
    /// RINGSOCK_SLOT_SIZE (256): multiple of 64 in 64..=65536.
    pub slot_size: u32,
    /// RINGSOCK_ALPHA (16): tail publication interval, 1..=slots/2.
    pub alpha: u32,
    /// RINGSOCK_BETA (8): slot transmission interval, 1..=alpha.
    pub beta: u32,
    /// RINGSOCK_GAMMA (unset: 64 on shared memory, slots/4 on RDMA): lazy
    /// head push interval, 1..=slots/2 (`ring::handshake::config_for`).
    pub gamma: Option<u32>,
    /// RINGSOCK_SPIN_US (50): spin budget before sleeping, 0..=100000.
    pub spin_us: u32,
    /// RINGSOCK_CONNECT_TIMEOUT_MS (1000): ring handshake budget (the
    /// longest a daemon reply is awaited), 1..=60000.
    pub connect_timeout_ms: u32,
    /// RINGSOCK_CLAIM_WAIT_MS (1000): how long a client waits for the
    /// server to take its ring before it withdraws the offer and stays on
    /// TCP, 1..=60000.
    pub claim_wait_ms: u32,
    /// RINGSOCK_SHORT_MS (50): a connection closed within this many
    /// milliseconds of its connect is short, and a destination whose
    /// connections keep being short gets plain TCP (`ring::policy`);
    /// 0 offers every connection a ring. 0..=60000.
    pub short_ms: u32,
    /// RINGSOCK_ZEROCOPY_MIN (0 = off): sends of at least this many bytes
    /// on an RDMA connection go out straight from the program's buffer
    /// (registered, cached; the copy path when it cannot be). 0 or at
    /// least `ZEROCOPY_FLOOR`.
    pub zerocopy_min: u64,
    /// RINGSOCK_DEVICE (unset: the RDMA device the route to the peer
    /// leaves through, else the first with an active port): the device
    /// for connections to other hosts, by name.
    pub rdma_device: Option<String>,
    /// RINGSOCK_GID_INDEX (unset: the route's RoCE v2 GID, else the
    /// port's first IPv4-mapped one): 0..=255. `Err` says why a value
    /// cannot be used: connections to other hosts then stay TCP.
    pub rdma_gid_index: Result<Option<u8>, String>,
    /// RINGSOCK_VERBS_MODE (push): the shim's rdma connections always
    /// push; any other value is kept here to be logged as ignored.
    pub verbs_mode: Option<OsString>,
}

/// Smallest accepted RINGSOCK_ZEROCOPY_MIN: below it a registration lookup
/// and a completion wait per send cost more than the copy they save.
pub const ZEROCOPY_FLOOR: u64 = 16 * 1024;

/// RINGSOCK_ZEROCOPY_MIN's value, shown as "off" when 0 in a diagnostic.
struct ZeroCopyMin(u64);

impl fmt::Debug for ZeroCopyMin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            0 => write!(f, "0 (zero-copy off)"),
            n => write!(f, "{n}"),
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            disable: false,
            log_level: LevelFilter::Warn,
            log_file: None,
            ctl_sock: OsString::from(DEFAULT_CTL_SOCK),
            include_ports: PortSet::default(),
            exclude_ports: PortSet::default(),
            include_nets: Vec::new(),
            exclude_nets: Vec::new(),
            ring_slots: 4096,
            slot_size: 256,
            alpha: 16,
            beta: 8,
            gamma: None,
            spin_us: 50,
            connect_timeout_ms: 1000,
            claim_wait_ms: 1000,
            short_ms: 50,
            zerocopy_min: 0,
            rdma_device: None,
            rdma_gid_index: Ok(None),
            verbs_mode: None,
        }
    }
}

/// One rejected or adjusted value, printed as a single line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diag {
    pub var: &'static str,
    pub value: String,
    pub reason: String,
    pub used: String,
}

impl fmt::Display for Diag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}={} ignored: {}; using {}",
            self.var, self.value, self.reason, self.used
        )
    }
}

/// Shows a hostile value safely: quoted, escaped, at most 64 characters.
fn shown(raw: &OsString) -> String {
    let s = raw.to_string_lossy();
    let mut out: String = s
        .chars()
        .take(64)
        .collect::<String>()
        .escape_debug()
        .collect();
    if s.chars().count() > 64 {
        out.push_str("...");
    }
    format!("\"{out}\"")
}

impl Config {
    /// Builds a configuration from `lookup` (the environment, or a map in
    /// tests). Unset variables take their defaults silently; set but bad
    /// ones take their defaults with a `Diag`.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<OsString>) -> (Config, Vec<Diag>) {
        let mut b = Builder {
            lookup: &lookup,
            diags: Vec::new(),
        };
        let d = Config::default();
        let disable = b.parse("RINGSOCK_DISABLE", d.disable, |s| {
            parse::switch(s).map_err(String::from)
        });
        let log_level = b.parse("RINGSOCK_LOG", d.log_level, |s| {
            parse::level(s).map_err(String::from)
        });
        let log_file = lookup("RINGSOCK_LOG_FILE").filter(|v| !v.is_empty());
        let ctl_sock = lookup("RINGSOCK_CTL_SOCK")
            .filter(|v| !v.is_empty())
            .unwrap_or(d.ctl_sock);
        let include_ports = b.parse("RINGSOCK_INCLUDE_PORTS", PortSet::default(), parse::ports);
        let exclude_ports = b.parse("RINGSOCK_EXCLUDE_PORTS", PortSet::default(), parse::ports);
        let include_nets = b.parse("RINGSOCK_INCLUDE_NETS", Vec::new(), parse::nets);
        let exclude_nets = b.parse("RINGSOCK_EXCLUDE_NETS", Vec::new(), parse::nets);
        let ring_slots = b.parse("RINGSOCK_RING_SLOTS", d.ring_slots, |s| {
            let v = parse::number(s, 64..=1 << 20)?;
            if !v.is_power_of_two() {
                return Err("not a power of two".into());
            }
            Ok(v as u32)
        });
        let slot_size = b.parse("RINGSOCK_SLOT_SIZE", d.slot_size, |s| {
            let v = parse::number(s, 64..=65536)?;
            if v % 64 != 0 {
                return Err("not a multiple of 64".into());
            }
            Ok(v as u32)
        });
        let half = u64::from(ring_slots / 2);
        let alpha = b.parse("RINGSOCK_ALPHA", d.alpha, |s| {
            parse::number(s, 1..=half).map(|v| v as u32)
        });
        let beta = b.parse("RINGSOCK_BETA", d.beta.min(alpha), |s| {
            parse::number(s, 1..=u64::from(alpha)).map(|v| v as u32)
        });
        let gamma = b.parse("RINGSOCK_GAMMA", d.gamma, |s| {
            parse::number(s, 1..=half).map(|v| Some(v as u32))
        });
        let spin_us = b.parse("RINGSOCK_SPIN_US", d.spin_us, |s| {
            parse::number(s, 0..=100_000).map(|v| v as u32)
        });
        let connect_timeout_ms =
            b.parse("RINGSOCK_CONNECT_TIMEOUT_MS", d.connect_timeout_ms, |s| {
                parse::number(s, 1..=60_000).map(|v| v as u32)
            });
        let claim_wait_ms = b.parse("RINGSOCK_CLAIM_WAIT_MS", d.claim_wait_ms, |s| {
            parse::number(s, 1..=60_000).map(|v| v as u32)
        });
        let short_ms = b.parse("RINGSOCK_SHORT_MS", d.short_ms, |s| {
            parse::number(s, 0..=60_000).map(|v| v as u32)
        });
        let zerocopy_min = b
            .parse("RINGSOCK_ZEROCOPY_MIN", ZeroCopyMin(d.zerocopy_min), |s| {
                let v = parse::number(s, 0..=1 << 40)?;
                if v != 0 && v < ZEROCOPY_FLOOR {
                    return Err(format!(
                        "below {ZEROCOPY_FLOOR} bytes (zero-copy pays only for large sends; \
                         0 turns it off)"
                    ));
                }
                Ok(ZeroCopyMin(v))
            })
            .0;
        // Unset, empty or not UTF-8: the device of the route.
        let rdma_device = lookup("RINGSOCK_DEVICE")
            .filter(|v| !v.is_empty())
            .and_then(|v| v.into_string().ok());
        let rdma_gid_index = match lookup("RINGSOCK_GID_INDEX").and_then(|v| v.into_string().ok()) {
            Some(s) if !s.is_empty() => s
                .trim()
                .parse::<u8>()
                .map(Some)
                .map_err(|_| "RINGSOCK_GID_INDEX must be in 0..=255".to_string()),
            _ => Ok(None),
        };
        let verbs_mode = lookup("RINGSOCK_VERBS_MODE").filter(|v| !v.is_empty());
        let cfg = Config {
            disable,
            log_level,
            log_file,
            ctl_sock,
            include_ports,
            exclude_ports,
            include_nets,
            exclude_nets,
            ring_slots,
            slot_size,
            alpha,
            beta,
            gamma,
            spin_us,
            connect_timeout_ms,
            claim_wait_ms,
            short_ms,
            zerocopy_min,
            rdma_device,
            rdma_gid_index,
            verbs_mode,
        };
        (cfg, b.diags)
    }

    /// Whether a connection to or from `port` at `ip` may use a ring, by the
    /// include/exclude lists (exclusions win; an empty include list includes
    /// everything).
    pub fn allows(&self, ip: IpAddr, port: u16) -> Result<(), Excluded> {
        self.allows_port(port)?;
        if self.exclude_nets.iter().any(|n| n.contains(ip)) {
            return Err(Excluded::Net);
        }
        if !self.include_nets.is_empty() && !self.include_nets.iter().any(|n| n.contains(ip)) {
            return Err(Excluded::Net);
        }
        Ok(())
    }

    /// The port half of `allows`.
    pub fn allows_port(&self, port: u16) -> Result<(), Excluded> {
        if self.exclude_ports.contains(port)
            || (!self.include_ports.is_empty() && !self.include_ports.contains(port))
        {
            return Err(Excluded::Port);
        }
        Ok(())
    }
}

/// Why the include/exclude lists keep a connection on TCP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Excluded {
    Port,
    Net,
}

struct Builder<'a> {
    lookup: &'a dyn Fn(&str) -> Option<OsString>,
    diags: Vec<Diag>,
}

impl Builder<'_> {
    /// Parses `var` with `f`; unset or empty keeps `default`.
    fn parse<T: fmt::Debug>(
        &mut self,
        var: &'static str,
        default: T,
        f: impl FnOnce(&str) -> Result<T, String>,
    ) -> T {
        let Some(raw) = (self.lookup)(var) else {
            return default;
        };
        if raw.is_empty() {
            return default;
        }
        let res = match raw.to_str() {
            Some(s) => f(s),
            None => Err("not valid UTF-8".into()),
        };
        match res {
            Ok(v) => v,
            Err(reason) => {
                self.diags.push(Diag {
                    var,
                    value: shown(&raw),
                    reason,
                    used: format!("default {}", show_default(&default)),
                });
                default
            }
        }
    }
}

fn show_default<T: fmt::Debug>(v: &T) -> String {
    let s = format!("{v:?}");
    match s.as_str() {
        "PortSet { ranges: [] }" | "[]" => "(none)".into(),
        // RINGSOCK_GAMMA, the one knob whose default depends on the wire.
        "None" => "(64 on shared memory, a quarter of the ring on RDMA)".into(),
        _ => s.to_lowercase(),
    }
}

static CONFIG: OnceLock<Config> = OnceLock::new();

/// The process-wide configuration, parsed from the environment on first use.
pub fn get() -> &'static Config {
    CONFIG.get_or_init(|| {
        let (cfg, diags) = Config::from_lookup(|k| std::env::var_os(k));
        let file = cfg.log_file.as_ref().map(|f| {
            use std::os::unix::ffi::OsStrExt;
            f.as_bytes()
        });
        let log_problem = crate::log::install(cfg.log_level, file).err();
        for d in &diags {
            crate::log::always(format_args!("{d}"));
        }
        if let (Some(p), Some(f)) = (log_problem, &cfg.log_file) {
            crate::log::always(format_args!(
                "RINGSOCK_LOG_FILE={} ignored: {p}; using stderr",
                shown(f)
            ));
        }
        cfg
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn with(vars: &[(&str, &str)]) -> (Config, Vec<Diag>) {
        let m: HashMap<String, OsString> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), OsString::from(v)))
            .collect();
        Config::from_lookup(|k| m.get(k).cloned())
    }

    #[test]
    fn zerocopy_min() {
        assert_eq!(with(&[]).0.zerocopy_min, 0);
        for (v, want) in [("0", 0), ("16384", 16384), (" 65536 ", 65536), ("", 0)] {
            let (c, d) = with(&[("RINGSOCK_ZEROCOPY_MIN", v)]);
            assert!(d.is_empty(), "{v}: {d:?}");
            assert_eq!(c.zerocopy_min, want, "{v}");
        }
        for v in [
            "1",
            "16383",
            "64k",
            "-1",
            "1e6",
            "99999999999999999999",
            "1099511627777",
        ] {
            let (c, d) = with(&[("RINGSOCK_ZEROCOPY_MIN", v)]);
            assert_eq!(c.zerocopy_min, 0, "{v}");
            assert_eq!(d.len(), 1, "{v}: {d:?}");
            let line = d[0].to_string();
            assert!(line.starts_with("RINGSOCK_ZEROCOPY_MIN="), "{line}");
            assert!(line.ends_with("using default 0 (zero-copy off)"), "{line}");
        }
        let (_, d) = with(&[("RINGSOCK_ZEROCOPY_MIN", "4096")]);
        assert!(d[0].reason.contains("below 16384"), "{:?}", d[0]);
    }

    #[test]
    fn rdma_device_and_gid_index() {
        let (c, d) = with(&[("RINGSOCK_DEVICE", "rxeB"), ("RINGSOCK_GID_INDEX", " 3 ")]);
        assert!(d.is_empty(), "{d:?}");
        assert_eq!(c.rdma_device.as_deref(), Some("rxeB"));
        assert_eq!(c.rdma_gid_index, Ok(Some(3)));
        let (c, _) = with(&[("RINGSOCK_DEVICE", ""), ("RINGSOCK_GID_INDEX", "")]);
        assert_eq!((c.rdma_device, c.rdma_gid_index), (None, Ok(None)));
        // A bad index keeps connections to other hosts on TCP (the
        // device is not opened), with this reason.
        for bad in ["256", "-1", "x"] {
            let (c, d) = with(&[("RINGSOCK_GID_INDEX", bad)]);
            assert!(d.is_empty(), "{d:?}");
            assert_eq!(
                c.rdma_gid_index,
                Err("RINGSOCK_GID_INDEX must be in 0..=255".to_string()),
                "{bad}"
            );
        }
    }

    #[test]
    fn verbs_mode_is_kept_for_its_warning() {
        assert_eq!(with(&[]).0.verbs_mode, None);
        assert_eq!(with(&[("RINGSOCK_VERBS_MODE", "")]).0.verbs_mode, None);
        let (c, d) = with(&[("RINGSOCK_VERBS_MODE", "pull")]);
        assert!(d.is_empty());
        assert_eq!(c.verbs_mode, Some(OsString::from("pull")));
    }

    #[test]
    fn defaults_when_unset() {
        let (c, d) = with(&[]);
        assert!(d.is_empty());
        assert_eq!(c, Config::default());
        assert_eq!(c.ring_slots, 4096);
        assert_eq!((c.alpha, c.beta, c.gamma), (16, 8, None));
        assert_eq!(c.ctl_sock, OsString::from(DEFAULT_CTL_SOCK));
    }

    #[test]
    fn good_values() {
        let (c, d) = with(&[
            ("RINGSOCK_DISABLE", "1"),
            ("RINGSOCK_LOG", "debug"),
            ("RINGSOCK_LOG_FILE", "/tmp/x.log"),
            ("RINGSOCK_CTL_SOCK", "/tmp/ctl.sock"),
            ("RINGSOCK_INCLUDE_PORTS", "6379,8000-8080"),
            ("RINGSOCK_EXCLUDE_NETS", "10.0.0.0/8"),
            ("RINGSOCK_RING_SLOTS", "1024"),
            ("RINGSOCK_SLOT_SIZE", "4096"),
            ("RINGSOCK_ALPHA", "512"),
            ("RINGSOCK_BETA", "512"),
            ("RINGSOCK_GAMMA", "1"),
            ("RINGSOCK_SPIN_US", "0"),
            ("RINGSOCK_CONNECT_TIMEOUT_MS", "1500"),
        ]);
        assert!(d.is_empty(), "{d:?}");
        assert!(c.disable);
        assert_eq!(c.log_level, LevelFilter::Debug);
        assert_eq!(c.log_file, Some(OsString::from("/tmp/x.log")));
        assert_eq!(c.ring_slots, 1024);
        assert_eq!(c.slot_size, 4096);
        assert_eq!((c.alpha, c.beta, c.gamma), (512, 512, Some(1)));
        assert_eq!(c.spin_us, 0);
        assert_eq!(c.connect_timeout_ms, 1500);
        assert!(c.allows("127.0.0.1".parse().unwrap(), 6379).is_ok());
        assert_eq!(
            c.allows("127.0.0.1".parse().unwrap(), 22),
            Err(Excluded::Port)
        );
        assert_eq!(
            c.allows("10.0.0.1".parse().unwrap(), 6379),
            Err(Excluded::Net)
        );
    }

    #[test]
    fn hostile_values_fall_back_with_one_line_each() {
        let cases: &[(&str, &str)] = &[
            ("RINGSOCK_DISABLE", "maybe"),
            ("RINGSOCK_LOG", "loud"),
            ("RINGSOCK_RING_SLOTS", "3000"),
            ("RINGSOCK_SLOT_SIZE", "100"),
            ("RINGSOCK_ALPHA", "-1"),
            ("RINGSOCK_BETA", "99999999999999999999999"),
            ("RINGSOCK_GAMMA", "０"),
            ("RINGSOCK_SPIN_US", "100001"),
            ("RINGSOCK_CONNECT_TIMEOUT_MS", "0"),
            ("RINGSOCK_INCLUDE_PORTS", "redis"),
            ("RINGSOCK_EXCLUDE_NETS", "10.0.0.0/99"),
        ];
        let (c, d) = with(cases);
        assert_eq!(d.len(), cases.len(), "{d:#?}");
        let defaults = Config::default();
        assert_eq!(c.ring_slots, defaults.ring_slots);
        assert_eq!(c.slot_size, defaults.slot_size);
        assert_eq!((c.alpha, c.beta, c.gamma), (16, 8, None));
        assert_eq!(c.spin_us, 50);
        assert_eq!(c.connect_timeout_ms, 1000);
        assert!(c.include_ports.is_empty());
        for (var, _) in cases {
            let diag = d.iter().find(|x| x.var == *var).expect(var);
            let line = diag.to_string();
            assert!(line.starts_with(var), "{line}");
            assert!(line.contains("using default"), "{line}");
            assert!(!line.contains('\n'));
        }
        let gamma = d.iter().find(|x| x.var == "RINGSOCK_GAMMA").unwrap();
        assert!(
            gamma
                .to_string()
                .ends_with("using default (64 on shared memory, a quarter of the ring on RDMA)"),
            "{gamma}"
        );
        let slots = d.iter().find(|x| x.var == "RINGSOCK_RING_SLOTS").unwrap();
        assert_eq!(
            slots.to_string(),
            "RINGSOCK_RING_SLOTS=\"3000\" ignored: not a power of two; using default 4096"
        );
    }

    #[test]
    fn garbage_is_escaped_and_shortened() {
        let long = "9".repeat(500);
        let (_, d) = with(&[
            ("RINGSOCK_SPIN_US", &long),
            ("RINGSOCK_LOG", "\u{1b}[31mred\n"),
        ]);
        assert_eq!(d.len(), 2);
        for x in &d {
            let line = x.to_string();
            assert!(line.len() < 300, "{line}");
            assert!(!line.contains('\n') && !line.contains('\u{1b}'), "{line:?}");
        }
    }

    #[test]
    fn non_utf8_value() {
        use std::os::unix::ffi::OsStringExt;
        let bad = OsString::from_vec(vec![0x66, 0xff, 0xfe]);
        let (c, d) = Config::from_lookup(|k| (k == "RINGSOCK_RING_SLOTS").then(|| bad.clone()));
        assert_eq!(c.ring_slots, 4096);
        assert_eq!(d.len(), 1);
        assert!(d[0].reason.contains("UTF-8"));
    }

    #[test]
    fn alpha_bounds_follow_ring_size() {
        let (c, d) = with(&[("RINGSOCK_RING_SLOTS", "64"), ("RINGSOCK_ALPHA", "33")]);
        assert_eq!(c.ring_slots, 64);
        assert_eq!(c.alpha, 16);
        assert_eq!(d.len(), 1);
        assert!(d[0].reason.contains("1..=32"));
        let (c, d) = with(&[("RINGSOCK_ALPHA", "2")]);
        assert!(d.is_empty());
        assert_eq!(
            (c.alpha, c.beta),
            (2, 2),
            "beta's default follows a smaller alpha"
        );
        let (c, d) = with(&[("RINGSOCK_ALPHA", "2"), ("RINGSOCK_BETA", "3")]);
        assert_eq!((c.alpha, c.beta), (2, 2));
        assert_eq!(d.len(), 1);
    }

    #[test]
    fn empty_means_unset() {
        let (c, d) = with(&[("RINGSOCK_RING_SLOTS", ""), ("RINGSOCK_LOG_FILE", "")]);
        assert!(d.is_empty());
        assert_eq!(c, Config::default());
    }
}
