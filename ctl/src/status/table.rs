//! The aligned text table `status` prints by default.

use std::fmt::Write;

use ringsock_proto::{RingStat, StatusEntry, Transport};

/// Bytes with a binary unit, short.
fn human(v: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut x = v as f64;
    let mut u = 0;
    while x >= 1024.0 && u + 1 < UNITS.len() {
        x /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{v}B")
    } else {
        format!("{x:.1}{}", UNITS[u])
    }
}

/// The RING column: the ring id, then per direction the bytes, batches,
/// occupancy (slots) and sleeps; any other counters as name=value, except
/// the zero-copy and pull-mode counters of a verbs ring while they are
/// zero (a ring that never used either mode would carry ten `=0` columns).
/// The full set is in `--json`.
fn ring_text(e: &StatusEntry) -> String {
    let mut s = String::new();
    if let Some(id) = e.ring {
        let _ = write!(s, "#{id}");
    }
    let get = |n: &str| {
        e.ring_stats
            .iter()
            .find(|st| st.name == n)
            .map(|st| st.value)
    };
    let mut shown = Vec::new();
    for dir in ["c2s", "s2c"] {
        let name = |k: &str| format!("{dir}_{k}");
        if let Some(bytes) = get(&name("bytes")) {
            let _ = write!(
                s,
                " {dir} {} b={} occ={} sl={}",
                human(bytes),
                get(&name("batches")).unwrap_or(0),
                get(&name("occupancy")).unwrap_or(0),
                get(&name("sleeps")).unwrap_or(0)
            );
            shown.extend(["bytes", "batches", "occupancy", "sleeps"].map(name));
        }
    }
    let folded = |st: &RingStat| {
        st.value == 0
            && e.transport == Transport::Rdma
            && crate::ring::VERBS_EXTRA_COUNTERS
                .iter()
                .any(|(n, _)| *n == st.name)
    };
    for st in e.ring_stats.iter().filter(|st| {
        !shown.contains(&st.name)
            && !st.name.starts_with("c2s_")
            && !st.name.starts_with("s2c_")
            && !folded(st)
    }) {
        let _ = write!(s, " {}={}", st.name, st.value);
    }
    let s = s.trim_start().to_string();
    if s.is_empty() {
        "-".into()
    } else {
        s
    }
}

/// What `ps` calls the process; from a daemon that does not say, the
/// last component of its executable's path.
fn process_name(e: &StatusEntry) -> &str {
    if !e.name.is_empty() {
        return &e.name;
    }
    match e.exe.rsplit('/').next() {
        Some(n) if !n.is_empty() => n,
        _ => "-",
    }
}

/// Removes control characters so a hostile report cannot mess with the
/// terminal.
pub(super) fn printable(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

/// Aligned text table, one connection per line.
pub fn table(entries: &[StatusEntry]) -> String {
    let header = [
        "PID",
        "PROCESS",
        "FD",
        "LOCAL",
        "PEER",
        "TRANSPORT",
        "REASON",
        "RING",
    ];
    let rows: Vec<[String; 8]> = entries
        .iter()
        .map(|e| {
            [
                e.pid.to_string(),
                printable(process_name(e)),
                e.fd.to_string(),
                e.local.to_string(),
                e.peer.to_string(),
                e.transport.as_str().to_owned(),
                if e.reason.is_empty() {
                    "-".to_owned()
                } else {
                    printable(&e.reason)
                },
                printable(&ring_text(e)),
            ]
        })
        .collect();
    let mut width = header.map(str::len);
    for r in &rows {
        for (w, cell) in width.iter_mut().zip(r) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &[&str]| {
        let last = cells.len() - 1;
        for (i, (cell, w)) in cells.iter().zip(width).enumerate() {
            if i == last {
                out.push_str(cell);
            } else {
                let _ = write!(out, "{cell:<w$}  ");
            }
        }
        out.push('\n');
    };
    line(&header);
    for r in &rows {
        line(&r.each_ref().map(String::as_str));
    }
    if entries.is_empty() {
        out.push_str("(no connections reported)\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::tests::entry;

    #[test]
    fn table_shape() {
        let t = table(&[entry()]);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 2);
        assert!(lines[0].starts_with("PID  PROCESS"));
        assert!(lines[1].starts_with("42   redis-server  7"), "{t}");
        assert!(lines[1].contains("line?break"));
        assert!(lines[1].ends_with("#3 memfd_size=4096"));
        assert!(table(&[]).contains("no connections"));
    }

    #[test]
    fn without_a_name_the_executable_names_the_process() {
        let mut e = entry();
        e.name.clear();
        assert!(table(&[e.clone()])
            .lines()
            .nth(1)
            .unwrap()
            .contains("redis-\"server"));
        e.name = "tab\tname".into();
        assert!(table(&[e]).contains("tab?name"));
    }

    #[test]
    fn verbs_table_folds_idle_zero_copy_and_pull_counters() {
        let mut e = entry();
        e.transport = Transport::Rdma;
        let stat = |name: &str, value| RingStat {
            name: name.into(),
            value,
        };
        e.ring_stats = vec![
            stat("out_bytes", 10),
            stat("cq_errors", 0),
            stat("zc_writes", 0),
            stat("zc_bytes", 0),
            stat("tx_to_pull", 1),
            stat("slot_reads", 5),
            stat("read_bytes", 0),
        ];
        let t = table(std::slice::from_ref(&e));
        let row = t.lines().nth(1).unwrap();
        assert!(
            row.ends_with("#3 out_bytes=10 cq_errors=0 tx_to_pull=1 slot_reads=5"),
            "{row}"
        );
    }
}
