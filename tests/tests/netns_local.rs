//! One daemon, several network namespaces (docs/design.md, "Namespaces"):
//! a daemon in the test's namespace serves processes in two others (A and
//! B of `netns::Hosts`, each with its own loopback) through its socket
//! path, as containers reach a host's daemon through a bind-mounted
//! directory. Both namespaces use the very same addresses.
//!
//! * `same_addresses_in_two_namespaces_pair_within_each`: a shimmed python
//!   echo server on 127.0.0.1:P and a shimmed client bound to
//!   127.0.0.1:Q in each namespace, so the two connections have one
//!   4-tuple; both clients offer before either server accepts (two live
//!   offers for one 4-tuple), then both pairs stream 4 MiB at once. Every
//!   byte checks out (sha256), every end is on shm, each client shares its
//!   ring with the server of its own namespace, and a status listing read
//!   from inside a namespace (by root without CAP_SYS_ADMIN, as a
//!   container's root) shows that namespace's connections only.
//! * `a_claim_from_another_namespace_is_refused`: with A's offer open (its
//!   server holds off accepting), the `intruder` in B makes a real TCP
//!   connection with the victims' 4-tuple (free in B) and claims with its
//!   accepted socket, and offers for A's client address with a socket of
//!   its own, among its other attempts: NoOffer, refused; A's server then
//!   gets its ring and the stream checks out.

use std::path::Path;
use std::time::Duration;

use ringsock_integration::netns::Hosts;
use ringsock_integration::status::parse;
use ringsock_integration::{ctl_bin, payload, require, sha256, Conn, Ctl, Server, TempDir};

const INTRUDER: &str = env!("CARGO_BIN_EXE_intruder");
const SIZE: usize = 4 << 20;

/// Echo server: listens on ADDRESS:PORT, accepts one connection once the
/// `go` file exists, echoes until EOF.
const SERVER_PY: &str = r#"
import os, socket, sys, time
port, go, host = int(sys.argv[1]), sys.argv[2], sys.argv[3]
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind((host, port))
l.listen(8)
print("listening", flush=True)
while not os.path.exists(go):
    time.sleep(0.01)
c, a = l.accept()
n = 0
while True:
    b = c.recv(65536)
    if not b:
        break
    c.sendall(b)
    n += len(b)
c.shutdown(socket.SHUT_WR)
print("echoed", n, flush=True)
"#;

/// Echo client: binds 127.0.0.1:CPORT (CPORT 0: binds nothing), connects
/// to DEST:PORT, says so, sends the payload file while reading the echo,
/// prints its length and sha256, and closes once the `end` file exists.
const CLIENT_PY: &str = r#"
import hashlib, os, socket, sys, threading, time
port, cport, path, end, dest = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
data = open(path, "rb").read()
s = socket.socket()
if cport:
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", cport))
s.connect((dest, port))
print("connected", flush=True)
got = bytearray()
def reader():
    while len(got) < len(data):
        b = s.recv(65536)
        if not b:
            break
        got.extend(b)
t = threading.Thread(target=reader)
t.start()
s.sendall(data)
t.join()
print("recv", len(got), hashlib.sha256(bytes(got)).hexdigest(), flush=True)
while not os.path.exists(end):
    time.sleep(0.01)
s.shutdown(socket.SHUT_WR)
while s.recv(65536):
    pass
s.close()
"#;

/// Two ports unlikely to be in use by a concurrent test process (they
/// are bound inside fresh namespaces anyway).
fn ports() -> (u16, u16) {
    let base = 20000 + (std::process::id() % 20000) as u16;
    (base, base + 20000)
}

/// One echo pair in namespace `ns`, using the daemon at `sock`.
struct Pair {
    srv: Server,
    cli: Server,
}

impl Pair {
    /// Starts the server, then the client, and waits until the client is
    /// connected (its offer registered: the server has not accepted yet).
    fn start(ns: &str, sock: &Path, dir: &TempDir, port: u16, cport: u16) -> Pair {
        Pair::across(ns, ns, "127.0.0.1", sock, dir, port, cport)
    }

    /// `start`, with the server in `server_ns` listening on `dest`'s
    /// wildcard (`dest` 127.0.0.1: on loopback), the client in `client_ns`
    /// connecting to `dest`.
    fn across(
        client_ns: &str,
        server_ns: &str,
        dest: &str,
        sock: &Path,
        dir: &TempDir,
        port: u16,
        cport: u16,
    ) -> Pair {
        let srv_py = dir.path().join("server.py");
        let cli_py = dir.path().join("client.py");
        let bind = if dest == "127.0.0.1" { dest } else { "0.0.0.0" };
        let mut srv = Hosts::shimmed_in(server_ns, sock, "python3")
            .arg(&srv_py)
            .arg(port.to_string())
            .arg(dir.path().join("go"))
            .arg(bind)
            .spawn();
        srv.wait_line("listening", Duration::from_secs(20));
        let mut cli = Hosts::shimmed_in(client_ns, sock, "python3")
            .env("RINGSOCK_CLAIM_WAIT_MS", "20000")
            .arg(&cli_py)
            .arg(port.to_string())
            .arg(cport.to_string())
            .arg(dir.path().join("payload"))
            .arg(dir.path().join("end"))
            .arg(dest)
            .spawn();
        cli.wait_line("connected", Duration::from_secs(20));
        Pair { srv, cli }
    }

    /// Waits for the client's check line and returns it.
    fn received(&mut self) -> String {
        self.cli.wait_line("recv ", Duration::from_secs(60))
    }

    /// Lets the client close; asserts both ended well.
    fn finish(&mut self, what: &str) {
        let st = self.cli.wait(Duration::from_secs(30));
        let (o, e) = self.cli.output();
        assert!(
            st.is_some_and(|s| s.success()),
            "{what}: client ended with {st:?}:\n{o}\n{e}"
        );
        let st = self.srv.wait(Duration::from_secs(30));
        let (so, se) = self.srv.output();
        assert!(
            st.is_some_and(|s| s.success()) && so.contains(&format!("echoed {SIZE}")),
            "{what}: server ended with {st:?}:\n{so}\n{se}"
        );
    }
}

/// A directory with the scripts and a payload of `seed`.
fn pair_dir(tag: &str, seed: u64) -> (TempDir, Vec<u8>) {
    let dir = TempDir::new(tag);
    let data = payload(SIZE, seed);
    dir.write("server.py", SERVER_PY.as_bytes());
    dir.write("client.py", CLIENT_PY.as_bytes());
    dir.write("payload", &data);
    (dir, data)
}

fn expect_recv(what: &str, line: &str, data: &[u8]) {
    let want = format!("recv {} {}", data.len(), sha256::hex(data));
    assert_eq!(
        line.trim(),
        want,
        "{what}: the echo differs from what was sent"
    );
}

/// The shm end of process `pid` on the connection to or from `port`.
fn end_of<'a>(conns: &'a [Conn], pid: u32, port: u16, all: &str) -> &'a Conn {
    conns
        .iter()
        .find(|c| c.pid == pid && (c.local.port() == port || c.peer.port() == port))
        .unwrap_or_else(|| panic!("no end of pid {pid} on port {port} reported:\n{all}"))
}

/// `ringsock-ctl status --json` run inside namespace `ns` by root without
/// CAP_SYS_ADMIN, as in a container.
fn status_from(ns: &str, sock: &Path) -> Vec<Conn> {
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", ns])
        .args(["setpriv", "--bounding-set", "-sys_admin"])
        .arg(ctl_bin())
        .args(["status", "--json", "--socket"])
        .arg(sock)
        .env_remove("LD_PRELOAD")
        .output()
        .expect("run ringsock-ctl status");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "status in {ns} failed: {text}");
    parse(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

#[test]
fn same_addresses_in_two_namespaces_pair_within_each() {
    require!("python3", "ip", "setpriv");
    let Some(h) = Hosts::new() else {
        return;
    };
    let ctl = Ctl::start();
    let (port, cport) = ports();
    let (dir_a, data_a) = pair_dir("nsa", 1);
    let (dir_b, data_b) = pair_dir("nsb", 2);
    // Both offers for one 4-tuple are live before either server accepts.
    let mut pa = Pair::start(&h.a, ctl.sock(), &dir_a, port, cport);
    let mut pb = Pair::start(&h.b, ctl.sock(), &dir_b, port, cport);
    dir_b.write("go", b"");
    dir_a.write("go", b"");
    let (ra, rb) = (pa.received(), pb.received());
    expect_recv("namespace A", &ra, &data_a);
    expect_recv("namespace B", &rb, &data_b);

    // Connections still open: each client on the ring of its own server.
    let conns = ctl.status();
    let all = ringsock_integration::show(&conns);
    let mut rings = Vec::new();
    for (what, p) in [("A", &pa), ("B", &pb)] {
        let c = end_of(&conns, p.cli.pid(), port, &all);
        let s = end_of(&conns, p.srv.pid(), port, &all);
        assert!(
            c.is_shm() && s.is_shm() && c.ring.is_some() && c.ring == s.ring,
            "namespace {what}: client and server not on one shm ring:\n{all}"
        );
        rings.push(c.ring);
    }
    assert_ne!(rings[0], rings[1], "two namespaces on one ring:\n{all}");

    // Inside a namespace, status lists that namespace's processes only.
    for (ns, mine, theirs) in [(&h.a, &pa, &pb), (&h.b, &pb, &pa)] {
        let seen = status_from(ns, ctl.sock());
        let pids: Vec<u32> = seen.iter().map(|c| c.pid).collect();
        assert!(
            pids.contains(&mine.cli.pid()) && pids.contains(&mine.srv.pid()),
            "status in {ns} misses its own processes: {pids:?}"
        );
        assert!(
            !pids.contains(&theirs.cli.pid()) && !pids.contains(&theirs.srv.pid()),
            "status in {ns} shows another namespace's processes: {pids:?}"
        );
    }
    dir_a.write("end", b"");
    dir_b.write("end", b"");
    pa.finish("namespace A");
    pb.finish("namespace B");
}

#[test]
fn a_claim_from_another_namespace_is_refused() {
    require!("python3", "ip");
    let Some(h) = Hosts::new() else {
        return;
    };
    let ctl = Ctl::start();
    let (port, cport) = ports();
    let (dir, data) = pair_dir("nsclaim", 3);
    let mut p = Pair::start(&h.a, ctl.sock(), &dir, port, cport);
    // A's offer is open: its server has not accepted.
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", &h.b, INTRUDER, "--ctl"])
        .arg(ctl.sock())
        .args(["--server", &format!("127.0.0.1:{port}")])
        .args(["--client", &format!("127.0.0.1:{cport}")])
        .args(["--offer-ids", "8"])
        .env_remove("LD_PRELOAD")
        .output()
        .expect("run the intruder");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{text}");
    assert!(
        out.status.success() && text.contains(" breaches 0"),
        "the intruder got through ({}):\n{text}",
        out.status
    );
    assert!(
        text.contains("denied claim with our own connection of their 4-tuple: NoOffer"),
        "the claim with the victims' 4-tuple from another namespace was not made or not refused:\n{text}"
    );
    // An offer for A's client address, proven with B's own socket.
    assert!(
        text.contains("denied offer for the victim client's address"),
        "{text}"
    );
    // The open offer was there, and only A's server could settle it.
    assert!(
        text.lines()
            .any(|l| l.starts_with("denied decline offer") && l.contains("not-owner")),
        "the intruder never hit the open offer:\n{text}"
    );
    dir.write("go", b"");
    let r = p.received();
    expect_recv("namespace A", &r, &data);
    let conns = ctl.status();
    let all = ringsock_integration::show(&conns);
    let c = end_of(&conns, p.cli.pid(), port, &all);
    let s = end_of(&conns, p.srv.pid(), port, &all);
    assert!(
        c.is_shm() && s.is_shm() && c.ring == s.ring,
        "the victims are not on their ring:\n{all}"
    );
    dir.write("end", b"");
    p.finish("namespace A");
}

/// A client in A connecting to B's address, where B's server (under the
/// same daemon) listens on the wildcard: a shared-memory ring between the
/// two namespaces, every byte checked.
#[test]
fn a_client_in_one_namespace_gets_a_ring_to_a_server_in_another() {
    require!("python3", "ip");
    let Some(h) = Hosts::new() else {
        return;
    };
    let ctl = Ctl::start();
    let (port, _) = ports();
    let (dir, data) = pair_dir("nsx", 4);
    let dest = h.ip_b.to_string();
    let mut p = Pair::across(&h.a, &h.b, &dest, ctl.sock(), &dir, port, 0);
    dir.write("go", b"");
    let r = p.received();
    expect_recv("A to B", &r, &data);
    let conns = ctl.status();
    let all = ringsock_integration::show(&conns);
    let c = end_of(&conns, p.cli.pid(), port, &all);
    let s = end_of(&conns, p.srv.pid(), port, &all);
    assert!(
        c.is_shm() && s.is_shm() && c.ring.is_some() && c.ring == s.ring,
        "A's client and B's server not on one shm ring:\n{all}"
    );
    assert_eq!(c.peer.ip(), h.ip_b, "{c}");
    assert_eq!(s.peer.ip(), h.ip_a, "{s}");
    dir.write("end", b"");
    p.finish("A to B");
}
