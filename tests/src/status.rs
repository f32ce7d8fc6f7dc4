//! The one typed reader of `ringsock-ctl status --json` for every test:
//! [`Conn`] per reported connection end (serde over the JSON the CLI
//! writes), [`status_of`] to run the CLI and read it, and the pairing of
//! ends into [`Link`]s that the transport assertions use.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;

use serde::Deserialize;

/// One connection as reported by a shim (one side of it).
#[derive(Debug, Clone, PartialEq)]
pub struct Conn {
    /// The daemon's session number of the reporting process.
    pub session: u64,
    pub pid: u32,
    pub fd: i32,
    pub exe: String,
    /// What `ps` calls the process ("" when the daemon could not tell).
    pub name: String,
    pub local: SocketAddr,
    pub peer: SocketAddr,
    /// `shm`, `rdma` or `tcp`.
    pub transport: String,
    /// Why it is TCP (empty for rings).
    pub reason: String,
    /// The ring's id, when it has one.
    pub ring: Option<u64>,
    /// The ring's counters (`c2s_bytes`, `s2c_batches`, `memfd_size`, ...).
    pub stats: BTreeMap<String, u64>,
    /// The first and last of a watch's samples that listed it (None: one
    /// listing).
    pub samples: Option<(usize, usize)>,
}

impl Conn {
    /// Whether `other` was listed in a sample that listed this end too (or
    /// either comes from a single listing): two ends that never were are
    /// two connections, one after the other, that had the same addresses
    /// (the kernel reuses a loopback port right after its TIME-WAIT).
    pub fn met(&self, other: &Conn) -> bool {
        match (self.samples, other.samples) {
            (Some((a0, a1)), Some((b0, b1))) => a0 <= b1 && b0 <= a1,
            _ => true,
        }
    }

    pub fn is_shm(&self) -> bool {
        self.transport == "shm"
    }

    /// A ring counter, 0 when absent.
    pub fn stat(&self, name: &str) -> u64 {
        self.stats.get(name).copied().unwrap_or(0)
    }

    /// The last path component of its executable.
    pub fn exe_name(&self) -> &str {
        self.exe.rsplit('/').next().unwrap_or("")
    }

    /// The process as `ps` names it, else its executable's name.
    pub fn process(&self) -> &str {
        if self.name.is_empty() {
            self.exe_name()
        } else {
            &self.name
        }
    }
}

impl std::fmt::Display for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "pid {} ({}) fd {} {} -> {} {}",
            self.pid,
            self.process(),
            self.fd,
            self.local,
            self.peer,
            self.transport
        )?;
        if !self.reason.is_empty() {
            write!(f, " ({})", self.reason)?;
        }
        if let Some(id) = self.ring {
            write!(f, " ring #{id}")?;
        }
        Ok(())
    }
}

/// `{"connections":[...]}` as the CLI writes it.
#[derive(Deserialize)]
struct Listing {
    connections: Vec<RawConn>,
}

#[derive(Deserialize)]
struct RawConn {
    session: u64,
    pid: u32,
    fd: i32,
    exe: String,
    #[serde(default)]
    name: String,
    local: SocketAddr,
    peer: SocketAddr,
    transport: String,
    reason: String,
    ring: Option<RawRing>,
}

#[derive(Deserialize)]
struct RawRing {
    id: Option<u64>,
    stats: BTreeMap<String, u64>,
}

impl From<RawConn> for Conn {
    fn from(c: RawConn) -> Self {
        let (ring, stats) = c.ring.map_or((None, BTreeMap::new()), |r| (r.id, r.stats));
        Conn {
            session: c.session,
            pid: c.pid,
            fd: c.fd,
            exe: c.exe,
            name: c.name,
            local: c.local,
            peer: c.peer,
            transport: c.transport,
            reason: c.reason,
            ring,
            stats,
            samples: None,
        }
    }
}

/// Parses `ringsock-ctl status --json` output.
pub fn parse(text: &str) -> Result<Vec<Conn>, String> {
    let listing: Listing = serde_json::from_str(text).map_err(|e| e.to_string())?;
    Ok(listing.connections.into_iter().map(Conn::from).collect())
}

/// `ctl status --json --socket sock` (`ctl`: the ringsock-ctl binary),
/// parsed; Err with the output when it fails or does not parse.
pub fn status_of(ctl: &Path, sock: &Path) -> Result<Vec<Conn>, String> {
    let text = status_json(ctl, sock)?;
    parse(&text).map_err(|e| format!("{e} in:\n{text}"))
}

/// The one line `ctl status --json --socket sock` prints.
pub fn status_json(ctl: &Path, sock: &Path) -> Result<String, String> {
    let out = std::process::Command::new(ctl)
        .args(["status", "--json", "--socket"])
        .arg(sock)
        .env_remove("LD_PRELOAD")
        .output()
        .map_err(|e| format!("running ringsock-ctl status: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!(
            "ringsock-ctl status failed ({}): {text}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(text.into_owned())
}

/// Both ends of one connection to a server port, as reported by the two
/// shims (client: peer port = server port; server: local port = server
/// port, addresses mirrored).
#[derive(Debug, Clone)]
pub struct Link {
    pub client: Conn,
    pub server: Conn,
}

impl Link {
    /// Both ends on the same shared-memory ring.
    pub fn is_shm(&self) -> bool {
        self.client.is_shm()
            && self.server.is_shm()
            && self.client.ring.is_some()
            && self.client.ring == self.server.ring
    }
}

impl std::fmt::Display for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "[{}] <=> [{}]", self.client, self.server)
    }
}

fn same_ip(a: SocketAddr, b: SocketAddr) -> bool {
    let canon = |x: SocketAddr| match x.ip() {
        std::net::IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map_or(std::net::IpAddr::V6(v6), std::net::IpAddr::V4),
        ip => ip,
    };
    canon(a) == canon(b) && a.port() == b.port()
}

/// The connections to `server_port` that both ends reported.
///
/// Samples taken over a run may hold two connections with the same
/// addresses: a client port the kernel gave out again after the first
/// connection closed. A client end is paired with the server
/// ends on its own ring when there are any, so the two connections are
/// not crossed; otherwise with every server end at its addresses (and a
/// check for one ring fails on those).
pub fn links(conns: &[Conn], server_port: u16) -> Vec<Link> {
    let mut out = Vec::new();
    for c in conns.iter().filter(|c| c.peer.port() == server_port) {
        let ends: Vec<&Conn> = conns
            .iter()
            .filter(|s| s.local.port() == server_port)
            .filter(|s| same_ip(c.local, s.peer) && same_ip(c.peer, s.local) && c.pid != s.pid)
            .filter(|s| c.met(s))
            .collect();
        let same_ring = |s: &&Conn| c.ring.is_some() && s.ring == c.ring;
        let on_ring = ends.iter().any(same_ring);
        for s in ends.into_iter().filter(|s| !on_ring || same_ring(s)) {
            out.push(Link {
                client: c.clone(),
                server: s.clone(),
            });
        }
    }
    out
}

/// One line per connection, for failure messages.
pub fn show(conns: &[Conn]) -> String {
    if conns.is_empty() {
        return "(no connections reported)".into();
    }
    conns.iter().map(|c| format!("  {c}\n")).collect::<String>()
}

/// Asserts that at least `min` connections to `server_port` were seen with
/// both ends reported, every such link on one shm ring, and no end of a
/// connection to that port reported as anything but shm; returns the links.
pub fn assert_all_shm(what: &str, conns: &[Conn], server_port: u16, min: usize) -> Vec<Link> {
    let l = links(conns, server_port);
    assert!(
        l.len() >= min,
        "{what}: expected at least {min} connection(s) to port {server_port} reported by both ends, saw {}:\n{}",
        l.len(),
        show(conns)
    );
    for link in &l {
        assert!(
            link.is_shm(),
            "{what}: not on one shm ring: {link}\nall:\n{}",
            show(conns)
        );
    }
    // Client ends (peer = the server port) that are not shm: a connection
    // the client shim put on TCP.
    let bad: Vec<&Conn> = conns
        .iter()
        .filter(|c| c.peer.port() == server_port && !c.is_shm())
        .filter(|c| l.iter().any(|x| x.client.pid == c.pid))
        .collect();
    assert!(
        bad.is_empty(),
        "{what}: client connections on TCP:\n{}\nall:\n{}",
        show(&bad.into_iter().cloned().collect::<Vec<_>>()),
        show(conns)
    );
    l
}

#[cfg(test)]
mod tests {
    use super::{links, parse, Conn};

    fn conn(pid: u32, local: &str, peer: &str, ring: Option<u64>) -> Conn {
        Conn {
            session: 1,
            pid,
            fd: 3,
            exe: "x".into(),
            name: String::new(),
            local: local.parse().unwrap(),
            peer: peer.parse().unwrap(),
            transport: "shm".into(),
            reason: String::new(),
            ring,
            stats: Default::default(),
            samples: None,
        }
    }

    #[test]
    fn a_reused_client_port_is_paired_by_ring() {
        let (cli, srv) = ("127.0.0.1:47691", "127.0.0.1:24142");
        let conns = [
            conn(1, cli, srv, Some(8)),
            conn(2, srv, cli, Some(8)),
            conn(1, cli, srv, Some(37)),
            conn(2, srv, cli, Some(37)),
        ];
        let l = links(&conns, 24142);
        assert_eq!(l.len(), 2);
        assert!(l.iter().all(|k| k.is_shm()), "crossed: {l:?}");
    }

    #[test]
    fn ends_on_different_rings_are_still_a_link_that_fails_the_ring_check() {
        let (cli, srv) = ("127.0.0.1:40000", "127.0.0.1:24142");
        let conns = [conn(1, cli, srv, Some(3)), conn(2, srv, cli, Some(4))];
        let l = links(&conns, 24142);
        assert_eq!(l.len(), 1);
        assert!(!l[0].is_shm());
    }

    /// The reused port of the watch that failed under load: the old
    /// connection's server end and the new one's client end were each
    /// sampled, never together, and neither's other end was.
    #[test]
    fn ends_that_were_never_listed_together_are_not_a_link() {
        let (cli, srv) = ("127.0.0.1:44067", "127.0.0.1:21197");
        let mut seen = crate::ctl::Seen::default();
        seen.add(&[conn(2, srv, cli, Some(1050))]);
        seen.add(&[]);
        seen.add(&[conn(1, cli, srv, Some(916))]);
        assert!(links(&seen.conns, 21197).is_empty());
        // Listed together, they are one (broken) link.
        seen.add(&[conn(2, srv, cli, Some(1050)), conn(1, cli, srv, Some(916))]);
        let l = links(&seen.conns, 21197);
        assert_eq!(l.len(), 1);
        assert!(!l[0].is_shm());
    }

    #[test]
    fn a_watch_keeps_two_rings_of_one_descriptor_apart() {
        let (cli, srv) = ("127.0.0.1:47691", "127.0.0.1:24142");
        let mut seen = crate::ctl::Seen::default();
        seen.add(&[conn(1, cli, srv, Some(8))]);
        seen.add(&[conn(1, cli, srv, Some(8))]);
        seen.add(&[conn(1, cli, srv, Some(37))]);
        let rings: Vec<_> = seen.conns.iter().map(|c| (c.ring, c.samples)).collect();
        assert_eq!(rings, [(Some(8), Some((0, 1))), (Some(37), Some((2, 2)))]);
        // Falling back to TCP is the same (latest) connection.
        seen.add(&[conn(1, cli, srv, None)]);
        let rings: Vec<_> = seen.conns.iter().map(|c| c.ring).collect();
        assert_eq!(rings, [Some(8), None]);
    }

    #[test]
    fn reads_what_the_cli_writes() {
        let text = r#"{"connections":[{"session":16,"pid":4242,"uid":0,"fd":11,"exe":"/usr/bin/a\"b\u00e9",
            "name":"ab","local":"127.0.0.1:6379","peer":"[::1]:40000","transport":"shm","reason":"",
            "ring":{"id":7,"stats":{"c2s_bytes":18446744073709551615,"mapped":1}}},
            {"session":17,"pid":1,"uid":0,"fd":3,"exe":"","local":"127.0.0.1:1","peer":"127.0.0.1:2",
            "transport":"tcp","reason":"no listener","ring":null}]}"#;
        let c = parse(text).unwrap();
        assert_eq!(c.len(), 2);
        assert_eq!((c[0].pid, c[0].exe.as_str()), (4242, "/usr/bin/a\"bé"));
        // Named by the daemon; a listing without names falls back to the
        // executable.
        assert_eq!((c[0].process(), c[1].process()), ("ab", ""));
        assert_eq!(c[0].peer, "[::1]:40000".parse().unwrap());
        assert_eq!((c[0].ring, c[0].stat("c2s_bytes")), (Some(7), u64::MAX));
        assert_eq!((c[1].ring, c[1].stat("mapped")), (None, 0));
        assert!(!c[1].is_shm());
        assert!(parse("{").is_err());
        assert!(parse(r#"{"connections":[{"pid":1}]}"#).is_err());
    }
}
