//! Connection ends out of status samples: the reports that a selection
//! keeps, grouped by end (session, pid, fd and addresses), since one end
//! shows in every sample taken while it lived.

use std::fmt::Write;

use ringsock_proto::{StatusEntry, Transport};

use super::select::Selection;

/// One connection end and every report of it, oldest first.
pub struct End<'a> {
    pub reports: Vec<&'a StatusEntry>,
}

impl<'a> End<'a> {
    /// The latest report.
    pub fn last(&self) -> &'a StatusEntry {
        self.reports[self.reports.len() - 1]
    }

    fn is(&self, r: &StatusEntry) -> bool {
        let key = |e: &StatusEntry| (e.session, e.pid, e.fd, e.local, e.peer);
        key(self.reports[0]) == key(r)
    }
}

/// The ends `sel` selects in `samples`, in the order they first showed.
pub fn group<'a>(samples: &'a [Vec<StatusEntry>], sel: &Selection) -> Vec<End<'a>> {
    let mut ends: Vec<End<'a>> = Vec::new();
    for r in samples.iter().flatten().filter(|e| sel.matches(e)) {
        match ends.iter_mut().find(|e| e.is(r)) {
            Some(e) => e.reports.push(r),
            None => ends.push(End { reports: vec![r] }),
        }
    }
    ends
}

/// `rdma=N,tcp=N,shm=N`: per transport, the ends with a report on it.
pub fn count(ends: &[End<'_>]) -> String {
    [Transport::Rdma, Transport::Tcp, Transport::Shm]
        .map(|t| {
            let n = ends
                .iter()
                .filter(|e| e.reports.iter().any(|r| r.transport == t))
                .count();
            format!("{}={n}", t.as_str())
        })
        .join(",")
}

pub fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// `rdma 10.0.0.1:7209 <-> 10.0.0.2:40000 pid 12 fd 5 (reason)`.
pub fn describe(e: &StatusEntry) -> String {
    let mut s = format!(
        "{} {} <-> {} pid {} fd {}",
        e.transport.as_str(),
        e.local,
        e.peer,
        e.pid,
        e.fd
    );
    if !e.reason.is_empty() {
        let _ = write!(s, " ({})", super::table::printable(&e.reason));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::tests::entry;

    #[test]
    fn groups_reports_by_end_and_counts_transports() {
        let a = entry();
        let mut a_later = entry();
        a_later.transport = Transport::Tcp;
        let mut b = entry();
        b.fd += 1;
        let samples = vec![vec![a.clone()], vec![a_later.clone(), b.clone()]];
        let ends = group(&samples, &Selection::default());
        assert_eq!(ends.len(), 2);
        assert_eq!(ends[0].reports.len(), 2);
        assert_eq!(ends[0].last(), &a_later);
        assert_eq!(count(&ends), "rdma=0,tcp=1,shm=2");
        let only_b = Selection {
            pid: Some(b.pid),
            transport: Some(Transport::Shm),
            ..Selection::default()
        };
        assert_eq!(group(&samples, &only_b).len(), 2);
        assert_eq!(
            describe(&b),
            "shm 127.0.0.1:6379 <-> [::1]:5000 pid 42 fd 8 (line?break)"
        );
    }
}
