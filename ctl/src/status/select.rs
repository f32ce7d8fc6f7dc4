//! Which connection ends a `status` command looks at: `--port`, `--pid`,
//! `--transport` and `--counter NAME>=N` (also `<=`, `=`); an end is
//! selected when it passes every filter given.

use std::fmt;

use ringsock_proto::{StatusEntry, Transport};

/// How a number compares with a bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cmp {
    Eq,
    AtLeast,
    AtMost,
}

impl Cmp {
    pub fn holds(self, v: u64, bound: u64) -> bool {
        match self {
            Cmp::Eq => v == bound,
            Cmp::AtLeast => v >= bound,
            Cmp::AtMost => v <= bound,
        }
    }
}

impl fmt::Display for Cmp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Cmp::Eq => "=",
            Cmp::AtLeast => ">=",
            Cmp::AtMost => "<=",
        })
    }
}

/// `NAME OP VALUE` with OP one of `>=`, `<=`, `=`: (NAME, OP, VALUE).
pub fn parse_bound(s: &str) -> Result<(&str, Cmp, u64), String> {
    let (name, cmp, value) = if let Some((n, v)) = s.split_once(">=") {
        (n, Cmp::AtLeast, v)
    } else if let Some((n, v)) = s.split_once("<=") {
        (n, Cmp::AtMost, v)
    } else if let Some((n, v)) = s.split_once('=') {
        (n, Cmp::Eq, v)
    } else {
        return Err(format!("`{s}`: expected NAME>=N, NAME<=N or NAME=N"));
    };
    let name = name.trim();
    if name.is_empty() {
        return Err(format!("`{s}`: no name before the comparison"));
    }
    let value = value
        .trim()
        .parse()
        .map_err(|_| format!("`{s}`: `{}` is not an unsigned number", value.trim()))?;
    Ok((name, cmp, value))
}

/// A bound on one ring counter: an end without that counter fails it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CounterBound {
    pub name: String,
    pub cmp: Cmp,
    pub value: u64,
}

impl CounterBound {
    /// `zc_writes>=1`, `tx_to_pull=0`, `out_bytes<=4096`.
    pub fn parse(s: &str) -> Result<Self, String> {
        let (name, cmp, value) = parse_bound(s)?;
        Ok(CounterBound {
            name: name.to_owned(),
            cmp,
            value,
        })
    }

    /// The counter's value in `e`, if `e` has it.
    pub fn value_in(&self, e: &StatusEntry) -> Option<u64> {
        e.ring_stats
            .iter()
            .find(|st| st.name == self.name)
            .map(|st| st.value)
    }

    pub fn holds(&self, e: &StatusEntry) -> bool {
        self.value_in(e)
            .is_some_and(|v| self.cmp.holds(v, self.value))
    }
}

impl fmt::Display for CounterBound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}{}", self.name, self.cmp, self.value)
    }
}

/// The filters; none given selects every end.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selection {
    /// The end's local or peer port.
    pub port: Option<u16>,
    pub pid: Option<u32>,
    pub transport: Option<Transport>,
    pub counters: Vec<CounterBound>,
}

impl Selection {
    /// Passes the filters other than the counter bounds.
    pub fn matches_ends(&self, e: &StatusEntry) -> bool {
        self.port
            .is_none_or(|p| e.local.port() == p || e.peer.port() == p)
            && self.pid.is_none_or(|p| e.pid == p)
            && self.transport.is_none_or(|t| e.transport == t)
    }

    pub fn matches(&self, e: &StatusEntry) -> bool {
        self.matches_ends(e) && self.counters.iter().all(|c| c.holds(e))
    }
}

impl fmt::Display for Selection {
    /// " on port 7209 of pid 12 on rdma with zc_writes>=1", or "".
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(p) = self.port {
            write!(f, " on port {p}")?;
        }
        if let Some(p) = self.pid {
            write!(f, " of pid {p}")?;
        }
        if let Some(t) = self.transport {
            write!(f, " on {}", t.as_str())?;
        }
        for (i, c) in self.counters.iter().enumerate() {
            write!(f, "{}{c}", if i == 0 { " with " } else { ", " })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::tests::entry;

    #[test]
    fn bounds() {
        let b = CounterBound::parse("zc_bytes>=65536").unwrap();
        assert_eq!(
            (b.name.as_str(), b.cmp, b.value),
            ("zc_bytes", Cmp::AtLeast, 65536)
        );
        assert_eq!(CounterBound::parse(" x<=0 ").unwrap().cmp, Cmp::AtMost);
        assert_eq!(CounterBound::parse("x=7").unwrap().to_string(), "x=7");
        for bad in ["x", ">=1", "x>=", "x>=-1", "x>=1.5", "x=y"] {
            assert!(CounterBound::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn filters() {
        let e = entry(); // pid 42, 127.0.0.1:6379 <-> [::1]:5000, shm, memfd_size=4096
        let sel = |f: fn(&mut Selection)| {
            let mut s = Selection::default();
            f(&mut s);
            s.matches(&e)
        };
        assert!(sel(|_| {}));
        assert!(sel(|s| s.port = Some(6379)));
        assert!(sel(|s| s.port = Some(5000)));
        assert!(!sel(|s| s.port = Some(80)));
        assert!(sel(|s| s.pid = Some(42)));
        assert!(!sel(|s| s.pid = Some(43)));
        assert!(sel(|s| s.transport = Some(Transport::Shm)));
        assert!(!sel(|s| s.transport = Some(Transport::Tcp)));
        assert!(sel(
            |s| s.counters = vec![CounterBound::parse("memfd_size=4096").unwrap()]
        ));
        assert!(!sel(
            |s| s.counters = vec![CounterBound::parse("memfd_size>=4097").unwrap()]
        ));
        // An absent counter is not zero.
        assert!(!sel(
            |s| s.counters = vec![CounterBound::parse("zc_writes<=0").unwrap()]
        ));
        let s = Selection {
            port: Some(7209),
            pid: None,
            transport: Some(Transport::Rdma),
            counters: vec![
                CounterBound::parse("a>=1").unwrap(),
                CounterBound::parse("b=0").unwrap(),
            ],
        };
        assert_eq!(s.to_string(), " on port 7209 on rdma with a>=1, b=0");
    }
}
