//! Parsers for the values of RINGSOCK_* variables. Each returns a short
//! reason on failure; the caller turns that into one diagnostic line that
//! names the variable and the default it falls back to.

use std::net::IpAddr;
use std::ops::RangeInclusive;

use log::LevelFilter;

/// A boolean switch: 0/1, true/false, yes/no, on/off (any case).
pub fn switch(s: &str) -> Result<bool, &'static str> {
    match s.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err("expected 0 or 1"),
    }
}

/// A log level name (any case); "off" silences the shim.
pub fn level(s: &str) -> Result<LevelFilter, &'static str> {
    match s.trim().to_ascii_lowercase().as_str() {
        "off" => Ok(LevelFilter::Off),
        "error" => Ok(LevelFilter::Error),
        "warn" | "warning" => Ok(LevelFilter::Warn),
        "info" => Ok(LevelFilter::Info),
        "debug" => Ok(LevelFilter::Debug),
        "trace" => Ok(LevelFilter::Trace),
        _ => Err("expected one of off, error, warn, info, debug, trace"),
    }
}

/// A decimal unsigned integer within `range`.
pub fn number(s: &str, range: RangeInclusive<u64>) -> Result<u64, String> {
    let t = s.trim();
    if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
        return Err("not a non-negative decimal number".into());
    }
    // All digits: the only possible failure is overflow.
    let v: u64 = t.parse().map_err(|_| "number too large".to_string())?;
    if !range.contains(&v) {
        return Err(format!("out of range {}..={}", range.start(), range.end()));
    }
    Ok(v)
}

/// A set of TCP ports given as `6379,8000-8080`. Empty means "no ports".
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PortSet {
    ranges: Vec<RangeInclusive<u16>>,
}

impl PortSet {
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    pub fn contains(&self, port: u16) -> bool {
        self.ranges.iter().any(|r| r.contains(&port))
    }
}

/// Parses a comma-separated list of ports and inclusive ranges (1..=65535).
/// Blanks around items are ignored, as are empty items ("80,,443").
pub fn ports(s: &str) -> Result<PortSet, String> {
    let mut ranges = Vec::new();
    for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (lo, hi) = match item.split_once('-') {
            Some((a, b)) => (one_port(a.trim())?, one_port(b.trim())?),
            None => {
                let p = one_port(item)?;
                (p, p)
            }
        };
        if lo > hi {
            return Err(format!("range {item:?} is reversed"));
        }
        ranges.push(lo..=hi);
    }
    Ok(PortSet { ranges })
}

fn one_port(s: &str) -> Result<u16, String> {
    match number(s, 1..=65535) {
        Ok(v) => Ok(v as u16),
        Err(_) => Err(format!("{s:?} is not a port in 1..=65535")),
    }
}

/// An IPv4 or IPv6 network in CIDR form.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// True if `ip` lies in this network. IPv4-mapped IPv6 addresses
    /// (::ffff:a.b.c.d, what a dual-stack socket reports) match IPv4 nets.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
            v4 => v4,
        };
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(a)) => mask_eq(&net.octets(), &a.octets(), self.prefix),
            (IpAddr::V6(net), IpAddr::V6(a)) => mask_eq(&net.octets(), &a.octets(), self.prefix),
            _ => false,
        }
    }
}

fn mask_eq(a: &[u8], b: &[u8], prefix: u8) -> bool {
    let full = (prefix / 8) as usize;
    if a[..full] != b[..full] {
        return false;
    }
    let rest = prefix % 8;
    if rest == 0 {
        return true;
    }
    let m = 0xffu8 << (8 - rest);
    a[full] & m == b[full] & m
}

/// Parses a comma-separated list of networks: `10.0.0.0/8,fd00::/8,192.0.2.7`
/// (a bare address is a host: /32 or /128). Host bits below the prefix are
/// ignored, as `ip route` does.
pub fn nets(s: &str) -> Result<Vec<Cidr>, String> {
    let mut out = Vec::new();
    for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (a, p) = match item.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (item, None),
        };
        let addr: IpAddr = a
            .trim()
            .parse()
            .map_err(|_| format!("{a:?} is not an IPv4 or IPv6 address"))?;
        let max: u64 = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match p {
            None => max as u8,
            Some(p) => match number(p, 0..=max) {
                Ok(v) => v as u8,
                Err(_) => return Err(format!("{item:?}: prefix must be in 0..={max}")),
            },
        };
        out.push(Cidr { addr, prefix });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn switches() {
        assert_eq!(switch("1"), Ok(true));
        assert_eq!(switch(" ON "), Ok(true));
        assert_eq!(switch("no"), Ok(false));
        assert!(switch("2").is_err());
        assert!(switch("").is_err());
        assert!(switch("ja\u{308}").is_err());
    }

    #[test]
    fn levels() {
        assert_eq!(level("DEBUG"), Ok(LevelFilter::Debug));
        assert_eq!(level("off"), Ok(LevelFilter::Off));
        assert!(level("verbose").is_err());
        assert!(level("").is_err());
    }

    #[test]
    fn numbers_hostile() {
        assert_eq!(number("4096", 64..=1 << 20), Ok(4096));
        assert_eq!(number(" 64 ", 64..=1 << 20), Ok(64));
        assert!(number("-1", 0..=10).is_err());
        assert!(number("+5", 0..=10).is_err());
        assert!(number("", 0..=10).is_err());
        assert!(number("1e3", 0..=10000).is_err());
        assert!(number("0x10", 0..=100).is_err());
        assert!(number("99999999999999999999999999", 0..=u64::MAX).is_err());
        assert!(number("18446744073709551615", 0..=10).is_err());
        assert!(
            number("٣", 0..=10).is_err(),
            "non-ASCII digits are not digits here"
        );
        assert!(number("12\u{0}", 0..=100).is_err());
        assert!(number("11", 0..=10).unwrap_err().contains("0..=10"));
    }

    #[test]
    fn port_lists() {
        let p = ports("6379, 8000-8080,,443").unwrap();
        assert!(p.contains(6379) && p.contains(8000) && p.contains(8080) && p.contains(443));
        assert!(!p.contains(7999) && !p.contains(8081) && !p.contains(80));
        assert!(ports("").unwrap().is_empty());
        assert!(ports(" , ").unwrap().is_empty());
        assert!(ports("0").is_err());
        assert!(ports("65536").is_err());
        assert!(ports("80-").is_err());
        assert!(ports("-80").is_err());
        assert!(ports("90-80").is_err());
        assert!(ports("http").is_err());
        assert!(ports("80;443").is_err());
        assert!(ports("-1").is_err());
        assert!(ports("８０").is_err());
    }

    #[test]
    fn net_lists() {
        let n = nets("10.0.0.0/8, fd00::/8,192.0.2.7").unwrap();
        let hit = |s: &str| n.iter().any(|c| c.contains(s.parse().unwrap()));
        assert!(hit("10.1.2.3"));
        assert!(hit("::ffff:10.9.9.9"), "v4-mapped matches v4 nets");
        assert!(hit("fd12::1"));
        assert!(hit("192.0.2.7"));
        assert!(!hit("192.0.2.8"));
        assert!(!hit("11.0.0.1"));
        assert!(!hit("fe80::1"));
        let odd = nets("10.1.2.3/12").unwrap();
        assert!(odd[0].contains("10.15.0.1".parse().unwrap()));
        assert!(!odd[0].contains("10.16.0.1".parse().unwrap()));
        let all = nets("0.0.0.0/0").unwrap();
        assert!(all[0].contains("203.0.113.9".parse().unwrap()));
        assert!(nets("10.0.0.0/33").is_err());
        assert!(nets("::/129").is_err());
        assert!(nets("10.0.0.0/-1").is_err());
        assert!(nets("10.0.0/8").is_err());
        assert!(nets("example.com").is_err());
        assert!(nets("10.0.0.0/８").is_err());
        assert!(nets("").unwrap().is_empty());
    }
}
