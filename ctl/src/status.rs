//! `ringsock-ctl status`: fetches every page of the connection listing and
//! prints it as a table or as JSON.

use std::fmt::Write;
use std::path::Path;
use std::time::Duration;

use ringsock_proto::{Client, Error, Msg, RingStat, StatusEntry, Transport};

use crate::json;

/// How long status waits on an unresponsive daemon.
const TIMEOUT: Duration = Duration::from_secs(3);

/// Every entry, page after page, with every counter (`StatusAll`); from a
/// daemon that predates `StatusAll` (it closes the session on the unknown
/// kind) the old way, with at most `MAX_RING_STATS_V1` counters per entry.
pub fn fetch(socket: &Path) -> Result<Vec<StatusEntry>, Error> {
    match fetch_pages(socket, true) {
        Err(Fetch::Refused(_)) => fetch_pages(socket, false).map_err(Fetch::into_error),
        r => r.map_err(Fetch::into_error),
    }
}

/// Why a listing failed: `Refused` when the daemon hung up on the very
/// first listing request (after a good `Hello`), which is what a daemon
/// that does not know that request kind does.
enum Fetch {
    Refused(Error),
    Other(Error),
}

impl Fetch {
    fn into_error(self) -> Error {
        match self {
            Fetch::Refused(e) | Fetch::Other(e) => e,
        }
    }
}

fn fetch_pages(socket: &Path, every_counter: bool) -> Result<Vec<StatusEntry>, Fetch> {
    let mut c = Client::connect(socket, Some(TIMEOUT)).map_err(Fetch::Other)?;
    c.hello("ringsock-ctl status").map_err(Fetch::Other)?;
    let mut all = Vec::new();
    let mut after = None;
    loop {
        let req = if every_counter {
            Msg::StatusAll { after }
        } else {
            Msg::Status { after }
        };
        let reply = match c.call(&req, &[]) {
            Ok((m, _)) => m,
            Err(e) if after.is_none() && hung_up(&e) => return Err(Fetch::Refused(e)),
            Err(e) => return Err(Fetch::Other(e)),
        };
        match reply {
            Msg::StatusReply { entries, next } => {
                all.extend(entries);
                match next {
                    Some(n) if Some(n) != after => after = Some(n),
                    _ => return Ok(all),
                }
            }
            other => {
                return Err(Fetch::Other(Error::Proto(
                    ringsock_proto::ProtoError::UnknownKind { kind: other.kind() },
                )))
            }
        }
    }
}

/// The daemon closed the session (not a timeout: an unresponsive daemon
/// is not asked twice).
fn hung_up(e: &Error) -> bool {
    match e {
        Error::Closed => true,
        Error::Io(e) => matches!(
            e.kind(),
            std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
        ),
        Error::Proto(_) => false,
    }
}

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

fn exe_name(exe: &str) -> &str {
    match exe.rsplit('/').next() {
        Some(n) if !n.is_empty() => n,
        _ => "-",
    }
}

/// Removes control characters so a hostile report cannot mess with the
/// terminal.
fn printable(s: &str) -> String {
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
                printable(exe_name(&e.exe)),
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

/// `{"connections":[...]}` with one object per connection; `ring` is null
/// or `{"id": n|null, "stats": {name: value...}}`.
pub fn json(entries: &[StatusEntry]) -> String {
    let mut o = String::from("{\"connections\":[");
    for (i, e) in entries.iter().enumerate() {
        if i > 0 {
            o.push(',');
        }
        let _ = write!(
            o,
            "{{\"session\":{},\"pid\":{},\"uid\":{},\"fd\":{},",
            e.session, e.pid, e.uid, e.fd
        );
        for (k, v) in [
            ("exe", e.exe.as_str()),
            ("local", &e.local.to_string()),
            ("peer", &e.peer.to_string()),
            ("transport", e.transport.as_str()),
            ("reason", &e.reason),
        ] {
            json::key(&mut o, k);
            json::string(&mut o, v);
            o.push(',');
        }
        json::key(&mut o, "ring");
        if e.ring.is_none() && e.ring_stats.is_empty() {
            o.push_str("null");
        } else {
            o.push_str("{\"id\":");
            match e.ring {
                Some(id) => {
                    let _ = write!(o, "{id}");
                }
                None => o.push_str("null"),
            }
            o.push_str(",\"stats\":{");
            for (j, st) in e.ring_stats.iter().enumerate() {
                if j > 0 {
                    o.push(',');
                }
                json::key(&mut o, &st.name);
                let _ = write!(o, "{}", st.value);
            }
            o.push_str("}}");
        }
        o.push('}');
    }
    o.push_str("]}\n");
    o
}

/// Runs the command; returns the exit code.
pub fn run(socket: &Path, as_json: bool) -> i32 {
    match fetch(socket) {
        Ok(entries) => {
            let text = if as_json {
                json(&entries)
            } else {
                table(&entries)
            };
            print!("{text}");
            0
        }
        Err(Error::Io(e)) => {
            eprintln!(
                "ringsock-ctl: no daemon is answering on {} ({e}); start one with `ringsock-ctl daemon`",
                socket.display()
            );
            1
        }
        Err(e) => {
            eprintln!("ringsock-ctl: status from {} failed: {e}", socket.display());
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry() -> StatusEntry {
        StatusEntry {
            session: 16,
            pid: 42,
            uid: 0,
            exe: "/usr/bin/redis-\"server".into(),
            fd: 7,
            local: "127.0.0.1:6379".parse().unwrap(),
            peer: "[::1]:5000".parse().unwrap(),
            transport: Transport::Shm,
            reason: "line\nbreak".into(),
            ring: Some(3),
            ring_stats: vec![RingStat {
                name: "memfd_size".into(),
                value: 4096,
            }],
        }
    }

    #[test]
    fn json_shape() {
        let j = json(&[entry()]);
        assert_eq!(
            j,
            "{\"connections\":[{\"session\":16,\"pid\":42,\"uid\":0,\"fd\":7,\
             \"exe\":\"/usr/bin/redis-\\\"server\",\"local\":\"127.0.0.1:6379\",\
             \"peer\":\"[::1]:5000\",\"transport\":\"shm\",\"reason\":\"line\\nbreak\",\
             \"ring\":{\"id\":3,\"stats\":{\"memfd_size\":4096}}}]}\n"
        );
        assert_eq!(json(&[]), "{\"connections\":[]}\n");
        let mut e = entry();
        e.ring = None;
        e.ring_stats.clear();
        assert!(json(&[e]).contains("\"ring\":null"));
    }

    #[test]
    fn table_shape() {
        let t = table(&[entry()]);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 2);
        assert!(lines[0].starts_with("PID  PROCESS"));
        assert!(lines[1].contains("redis-\"server"));
        assert!(lines[1].contains("line?break"));
        assert!(lines[1].ends_with("#3 memfd_size=4096"));
        assert!(table(&[]).contains("no connections"));
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
        // JSON has every counter, zero or not.
        let j = json(&[e]);
        for n in ["\"zc_writes\":0", "\"zc_bytes\":0", "\"read_bytes\":0"] {
            assert!(j.contains(n), "{n}: {j}");
        }
    }
}
