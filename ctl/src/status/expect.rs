//! `status --expect`: a check on the selected connection ends, for
//! scripts, that holds or fails with a sentence saying why.
//!
//! An expectation is a comma-separated list, every term of which must hold:
//! - `ends=N`, `ends>=N`, `ends<=N`: how many connection ends are selected;
//! - `transport=T` (`shm`, `rdma`, `tcp`): every selected end is on T.
//!
//! Over several samples (`--from`) every report of every sample counts: an
//! end is counted once (by session, pid, fd and addresses) however many
//! samples show it, and `transport=T` must hold for each of its reports.

use std::fmt::{self, Write};

use ringsock_proto::{StatusEntry, Transport};

use super::ends;
use super::select::{parse_bound, Cmp, Selection};

/// At most this many ends are listed under a verdict.
const LISTED: usize = 12;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expectation {
    ends: Option<(Cmp, u64)>,
    transport: Option<Transport>,
}

impl Expectation {
    /// `transport=shm,ends=2`.
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut x = Expectation {
            ends: None,
            transport: None,
        };
        for term in s.split(',') {
            if let Some(t) = term.trim().strip_prefix("transport=") {
                let t = Transport::from_name(t.trim())
                    .ok_or_else(|| format!("`{term}`: a transport is shm, rdma or tcp"))?;
                if x.transport.replace(t).is_some() {
                    return Err("transport given twice".into());
                }
                continue;
            }
            match parse_bound(term)? {
                ("ends", cmp, n) => {
                    if x.ends.replace((cmp, n)).is_some() {
                        return Err("ends given twice".into());
                    }
                }
                (other, ..) => {
                    return Err(format!(
                        "`{other}`: an expectation is ends=N, ends>=N, ends<=N or transport=T"
                    ))
                }
            }
        }
        Ok(x)
    }

    /// Checks the ends of `samples` that `sel` selects.
    pub fn check(&self, sel: &Selection, samples: &[Vec<StatusEntry>]) -> Verdict {
        let ends = ends::group(samples, sel);
        let mut holds = true;
        let mut why = format!("{} end{}", ends.len(), ends::plural(ends.len()));
        // Per end, a report of it on another transport than the expected one.
        let mut off: Vec<Option<&StatusEntry>> = vec![None; ends.len()];
        if let Some(t) = self.transport {
            for (o, e) in off.iter_mut().zip(&ends) {
                *o = e.reports.iter().rev().find(|r| r.transport != t).copied();
            }
            let off = off.iter().filter(|o| o.is_some()).count();
            if off == 0 {
                if !ends.is_empty() {
                    let _ = write!(why, ", all on {}", t.as_str());
                }
            } else {
                holds = false;
                let _ = write!(why, ", {off} not on {}", t.as_str());
            }
        }
        if let Some((cmp, n)) = self.ends {
            if !cmp.holds(ends.len() as u64, n) {
                holds = false;
                let _ = write!(why, " (want ends{cmp}{n})");
                if ends.is_empty() && !sel.counters.is_empty() {
                    why.push_str(&near_misses(sel, samples));
                }
            }
        }
        if samples.len() != 1 {
            let _ = write!(why, "; {} samples", samples.len());
        }
        // Ends that broke the transport rule first (as that report shows
        // them), then the rest (as last seen).
        let mut shown: Vec<&StatusEntry> = off.iter().flatten().copied().collect();
        shown.extend(
            off.iter()
                .zip(&ends)
                .filter(|(o, _)| o.is_none())
                .map(|(_, e)| e.last()),
        );
        let mut text = format!(
            "{self} {} for the connection ends{sel}: {why}\n",
            if holds { "holds" } else { "fails" }
        );
        for e in shown.iter().take(LISTED) {
            let _ = writeln!(text, "  {}", ends::describe(e));
        }
        if ends.len() > LISTED {
            let _ = writeln!(text, "  ... and {} more", ends.len() - LISTED);
        }
        Verdict { holds, text }
    }
}

impl fmt::Display for Expectation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut terms = Vec::new();
        if let Some(t) = self.transport {
            terms.push(format!("transport={}", t.as_str()));
        }
        if let Some((cmp, n)) = self.ends {
            terms.push(format!("ends{cmp}{n}"));
        }
        f.write_str(&terms.join(","))
    }
}

/// Whether the expectation held, and the sentence (then the ends) saying
/// what was seen.
#[derive(Debug)]
pub struct Verdict {
    pub holds: bool,
    pub text: String,
}

/// For a selection that found nothing because of its counter bounds: how
/// many reports the other filters kept, and the highest value each bounded
/// counter reached in them.
fn near_misses(sel: &Selection, samples: &[Vec<StatusEntry>]) -> String {
    let near: Vec<&StatusEntry> = samples
        .iter()
        .flatten()
        .filter(|e| sel.matches_ends(e))
        .collect();
    let highest: Vec<String> = sel
        .counters
        .iter()
        .map(|c| match near.iter().filter_map(|e| c.value_in(e)).max() {
            Some(v) => format!("{}={v}", c.name),
            None => format!("{} absent", c.name),
        })
        .collect();
    format!(
        "; {} report{} without the counter bounds, highest {}",
        near.len(),
        ends::plural(near.len()),
        highest.join(" ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::select::CounterBound;
    use crate::status::tests::entry;
    use ringsock_proto::RingStat;

    fn end(fd: i32, port: u16, transport: Transport, zc: u64) -> StatusEntry {
        let mut e = entry();
        e.fd = fd;
        e.local.set_port(port);
        e.transport = transport;
        e.ring_stats = vec![RingStat {
            name: "zc_writes".into(),
            value: zc,
        }];
        e
    }

    fn check(x: &str, sel: &Selection, samples: &[Vec<StatusEntry>]) -> Verdict {
        Expectation::parse(x).unwrap().check(sel, samples)
    }

    #[test]
    fn parses_a_small_language() {
        let x = Expectation::parse("transport=rdma, ends>=1").unwrap();
        assert_eq!(x.to_string(), "transport=rdma,ends>=1");
        assert_eq!(Expectation::parse("ends=2").unwrap().to_string(), "ends=2");
        for bad in [
            "",
            "ends",
            "ends=x",
            "ends=1,ends=2",
            "transport=udp",
            "transport=shm,transport=tcp",
            "pid=3",
        ] {
            assert!(Expectation::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn counts_ends_once_over_samples_and_checks_every_report() {
        let sel = Selection {
            port: Some(7209),
            ..Selection::default()
        };
        let a = end(3, 7209, Transport::Rdma, 0);
        let b = end(4, 7209, Transport::Rdma, 0);
        let other_port = end(5, 80, Transport::Tcp, 0);
        let samples = vec![
            vec![a.clone(), other_port.clone()],
            vec![a.clone(), b.clone()],
        ];
        let v = check("transport=rdma,ends=2", &sel, &samples);
        assert!(v.holds, "{}", v.text);
        assert!(
            v.text.starts_with(
                "transport=rdma,ends=2 holds for the connection ends on port 7209: \
                 2 ends, all on rdma; 2 samples\n"
            ),
            "{}",
            v.text
        );
        assert_eq!(v.text.lines().count(), 3);

        // One tcp report of an end in one sample is enough to fail.
        let mut a_tcp = a.clone();
        a_tcp.transport = Transport::Tcp;
        a_tcp.reason = "no listener".into();
        let samples = vec![vec![a.clone(), b.clone()], vec![a_tcp, b]];
        let v = check("transport=rdma", &sel, &samples);
        assert!(!v.holds);
        assert!(v.text.contains("2 ends, 1 not on rdma"), "{}", v.text);
        let first = v.text.lines().nth(1).unwrap();
        assert!(
            first.starts_with("  tcp ") && first.ends_with("(no listener)"),
            "{}",
            v.text
        );
    }

    #[test]
    fn no_end_is_not_every_end_on_a_transport() {
        let sel = Selection::default();
        assert!(check("transport=shm", &sel, &[vec![]]).holds);
        let v = check("transport=shm,ends>=1", &sel, &[vec![]]);
        assert!(!v.holds);
        assert!(v.text.contains("0 ends (want ends>=1)"), "{}", v.text);
        assert!(check("ends<=0", &sel, &[vec![]]).holds);
    }

    #[test]
    fn counter_bounds_select_and_near_misses_are_told() {
        let sel = Selection {
            port: Some(7209),
            counters: vec![CounterBound::parse("zc_writes>=1").unwrap()],
            ..Selection::default()
        };
        let early = end(3, 7209, Transport::Rdma, 0);
        let late = end(3, 7209, Transport::Rdma, 9);
        assert!(check("ends>=1", &sel, &[vec![early.clone()], vec![late]]).holds);
        let v = check("ends>=1", &sel, &[vec![early.clone()], vec![early]]);
        assert!(!v.holds);
        assert!(
            v.text
                .contains("2 reports without the counter bounds, highest zc_writes=0"),
            "{}",
            v.text
        );
    }
}
