//! Rings through address translation (docs/design.md, "Namespaces"): A
//! and B on a bridge in the hub namespace (`netns::Bridge`), the hub
//! standing for a container host: it runs the daemon and translates its
//! own address's port P to B's (an nftables DNAT rule, as Docker's
//! published ports and kube-proxy install), with masquerading (Docker's
//! hairpin: B sees the hub as the peer) or without (B answers A through
//! the hub, which it routes A's address through). A shimmed echo server in
//! B listens on its wildcard address; a shimmed client in A connects to
//! the hub's address.
//!
//! The daemon learns the translation from its connection tracking, so the
//! first connection, made before, stays TCP (and must carry its bytes
//! right); a later one (within five, a second or more apart) gets a
//! shared-memory ring, which the server's accepted socket claims through
//! the tracking entry (reply tuple = the accepted socket, original tuple =
//! the offer): both ends on one ring, 4 MiB sha256 checked.
//!
//! `a_service_address_with_two_replicas_gets_rings`: an address of no
//! namespace translated to two replicas in turn, as a Kubernetes Service.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use ringsock_integration::netns::{run_in, Bridge, Hosts, NsCtl};
use ringsock_integration::{payload, require, sha256, Conn, Server, TempDir};

const SIZE: usize = 4 << 20;
const PORT: u16 = 8080;

/// Echo server: listens on 0.0.0.0:PORT, echoes every connection (a
/// thread each) until its EOF.
const SERVER_PY: &str = r#"
import socket, sys, threading
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("0.0.0.0", int(sys.argv[1])))
l.listen(8)
print("listening", flush=True)
def echo(c):
    while True:
        b = c.recv(65536)
        if not b:
            break
        c.sendall(b)
    c.close()
while True:
    c, _ = l.accept()
    threading.Thread(target=echo, args=(c,), daemon=True).start()
"#;

/// Echo client: connects to DEST:PORT, sends the payload file while
/// reading the echo, prints its length and sha256, closes once the `end`
/// file exists.
const CLIENT_PY: &str = r#"
import hashlib, os, socket, sys, threading, time
dest, port, path, end = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
data = open(path, "rb").read()
s = socket.create_connection((dest, port))
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
s.close()
"#;

/// The hub translates its own address's PORT to B's; with `masquerade`
/// it also rewrites the source, else B routes A's address via the hub.
fn translate(br: &Bridge, masquerade: bool) {
    let (hub, b) = (br.hub.as_str(), br.b.as_str());
    run_in(hub, &["nft", "add", "table", "ip", "rsnat"]);
    run_in(
        hub,
        &[
            "nft",
            "add chain ip rsnat pre { type nat hook prerouting priority -100; }",
        ],
    );
    run_in(
        hub,
        &[
            "nft",
            &format!(
                "add rule ip rsnat pre ip daddr {} tcp dport {PORT} dnat to {}:{PORT}",
                br.ip_hub, br.ip_b
            ),
        ],
    );
    if masquerade {
        run_in(
            hub,
            &[
                "nft",
                "add chain ip rsnat post { type nat hook postrouting priority 100; }",
            ],
        );
        run_in(
            hub,
            &[
                "nft",
                &format!(
                    "add rule ip rsnat post ip daddr {} tcp dport {PORT} masquerade",
                    br.ip_b
                ),
            ],
        );
    } else {
        // B answers A through the hub (which must not redirect it to A
        // directly), so the hub translates the answers back.
        for s in [
            "net.ipv4.conf.all.send_redirects=0",
            "net.ipv4.conf.default.send_redirects=0",
        ] {
            run_in(hub, &["sysctl", "-qw", s]);
        }
        run_in(
            b,
            &["sysctl", "-qw", "net.ipv4.conf.all.accept_redirects=0"],
        );
        run_in(
            b,
            &[
                "ip",
                "route",
                "add",
                &format!("{}/32", br.ip_a),
                "via",
                &br.ip_hub.to_string(),
            ],
        );
    }
}

/// One client run in A against the hub's address; waits for its check
/// line and compares it with the payload.
fn client(br: &Bridge, ctl: &NsCtl, dir: &TempDir, data: &[u8], end: &Path) -> Server {
    let dest = SocketAddr::from((br.ip_hub, PORT));
    client_to(br, ctl, dir, data, end, dest)
}

/// One client run in A against `dest`.
fn client_to(
    br: &Bridge,
    ctl: &NsCtl,
    dir: &TempDir,
    data: &[u8],
    end: &Path,
    dest: SocketAddr,
) -> Server {
    let mut c = Hosts::shimmed_in(&br.a, ctl.sock(), "python3")
        .env("RINGSOCK_CLAIM_WAIT_MS", "20000")
        .arg(dir.path().join("client.py"))
        .arg(dest.ip().to_string())
        .arg(dest.port().to_string())
        .arg(dir.path().join("payload"))
        .arg(end)
        .spawn();
    let line = c.wait_line("recv ", Duration::from_secs(60));
    let want = format!("recv {} {}", data.len(), sha256::hex(data));
    assert_eq!(
        line.trim(),
        want,
        "the echo through the translation differs"
    );
    c
}

fn end_of<'a>(conns: &'a [Conn], pid: u32, all: &str) -> &'a Conn {
    conns
        .iter()
        .find(|c| c.pid == pid && (c.local.port() == PORT || c.peer.port() == PORT))
        .unwrap_or_else(|| panic!("no end of pid {pid} reported:\n{all}"))
}

fn through_translation(masquerade: bool) {
    require!("python3", "ip", "nft");
    let Some(br) = Bridge::new() else {
        return;
    };
    translate(&br, masquerade);
    let ctl = NsCtl::start(&br.hub, &[]);
    let dir = TempDir::new("nsnat");
    let data = payload(SIZE, 31 + u64::from(masquerade));
    dir.write("server.py", SERVER_PY.as_bytes());
    dir.write("client.py", CLIENT_PY.as_bytes());
    dir.write("payload", &data);
    let mut srv = Hosts::shimmed_in(&br.b, ctl.sock(), "python3")
        .arg(dir.path().join("server.py"))
        .arg(PORT.to_string())
        .spawn();
    srv.wait_line("listening", Duration::from_secs(20));

    // Before the daemon saw the translation: TCP, right bytes.
    let first_end = dir.write("end-first", b"");
    let mut first = client(&br, &ctl, &dir, &data, &first_end);
    assert!(first
        .wait(Duration::from_secs(30))
        .is_some_and(|s| s.success()));
    // The daemon reads its connection tracking every second: a later
    // connection gets a ring (each one checked byte for byte meanwhile).
    let mut attempt = 0;
    let (mut second, conns, c, s) = loop {
        attempt += 1;
        std::thread::sleep(Duration::from_millis(1200));
        let end = dir.path().join(format!("end{attempt}"));
        let mut second = client(&br, &ctl, &dir, &data, &end);
        let conns = ctl.status().expect("status");
        let all = ringsock_integration::show(&conns);
        let c = end_of(&conns, second.pid(), &all).clone();
        let s = conns
            .iter()
            .find(|s| s.pid == srv.pid() && s.ring.is_some() && s.ring == c.ring)
            .cloned();
        match s {
            Some(s) => break (second, conns, c, s),
            None => {
                assert!(
                    attempt < 5,
                    "no ring through the translation after {attempt} connections:\n{all}\ndaemon log:\n{}",
                    ctl.log()
                );
                dir.write(&format!("end{attempt}"), b"");
                assert!(second
                    .wait(Duration::from_secs(30))
                    .is_some_and(|s| s.success()));
            }
        }
    };
    let all = ringsock_integration::show(&conns);
    assert!(
        c.is_shm() && s.is_shm(),
        "not both on shm through the translation:\n{all}\ndaemon log:\n{}",
        ctl.log()
    );
    assert_eq!(c.peer.ip(), br.ip_hub, "{c}");
    let peer = if masquerade { br.ip_hub } else { br.ip_a };
    assert_eq!(s.peer.ip(), peer, "{s}");
    dir.write(&format!("end{attempt}"), b"");
    assert!(second
        .wait(Duration::from_secs(30))
        .is_some_and(|s| s.success()));
    srv.assert_running();
}

#[test]
fn dnat_with_masquerade_gets_a_ring() {
    through_translation(true);
}

#[test]
fn dnat_without_masquerade_gets_a_ring() {
    through_translation(false);
}

/// A service address as kube-proxy makes one: an address of no namespace
/// (10.254.Y.80:80, routed to the hub), translated in the hub to one of
/// two replicas in turn (B's 8081 and 8082, nft numgen), masqueraded.
/// Once the daemon saw both translations, connections to the service
/// address get rings to whichever replica the kernel picked, each one
/// claimed through its own tracking entry.
#[test]
fn a_service_address_with_two_replicas_gets_rings() {
    require!("python3", "ip", "nft");
    let Some(br) = Bridge::new() else {
        return;
    };
    let [_, _, y, _] = br.ip_a.octets();
    let vip = Ipv4Addr::new(10, 254, y, 80);
    let hub = br.hub.as_str();
    run_in(hub, &["nft", "add", "table", "ip", "rssvc"]);
    for rule in [
        "add chain ip rssvc pre { type nat hook prerouting priority -100; }".to_string(),
        format!(
            "add rule ip rssvc pre ip daddr {vip} tcp dport 80 dnat to {}:numgen inc mod 2 map {{ 0 : 8081, 1 : 8082 }}",
            br.ip_b
        ),
        "add chain ip rssvc post { type nat hook postrouting priority 100; }".to_string(),
        format!("add rule ip rssvc post ip daddr {} ct status dnat masquerade", br.ip_b),
    ] {
        run_in(hub, &["nft", &rule]);
    }
    let ctl = NsCtl::start(hub, &[]);
    let dir = TempDir::new("nssvc");
    let data = payload(SIZE, 41);
    dir.write("server.py", SERVER_PY.as_bytes());
    dir.write("client.py", CLIENT_PY.as_bytes());
    dir.write("payload", &data);
    let mut replicas: Vec<Server> = [8081u16, 8082]
        .iter()
        .map(|port| {
            let mut srv = Hosts::shimmed_in(&br.b, ctl.sock(), "python3")
                .arg(dir.path().join("server.py"))
                .arg(port.to_string())
                .spawn();
            srv.wait_line("listening", Duration::from_secs(20));
            srv
        })
        .collect();
    let dest = SocketAddr::from((vip, 80));
    let end = dir.write("end-warm", b"");
    for _ in 0..2 {
        let mut c = client_to(&br, &ctl, &dir, &data, &end, dest);
        assert!(c.wait(Duration::from_secs(30)).is_some_and(|s| s.success()));
    }
    // Until each replica took a connection on a ring (every connection
    // checked byte for byte).
    let mut on_ring = std::collections::BTreeSet::new();
    for attempt in 1..=8 {
        if on_ring.len() == 2 {
            break;
        }
        std::thread::sleep(Duration::from_millis(600));
        let end = dir.path().join(format!("end{attempt}"));
        let mut c = client_to(&br, &ctl, &dir, &data, &end, dest);
        // Reports go out from the shims' threads, off the connect path
        // (a plain-TCP end's after 50 ms): look until the client's shows.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let (conns, all) = loop {
            let conns = ctl.status().expect("status");
            let all = ringsock_integration::show(&conns);
            if conns.iter().any(|e| e.pid == c.pid() && e.peer == dest)
                || std::time::Instant::now() > deadline
            {
                break (conns, all);
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let mine = conns
            .iter()
            .find(|e| e.pid == c.pid() && e.peer == dest)
            .unwrap_or_else(|| panic!("the client's end is not reported:\n{all}"));
        if let Some(s) = conns.iter().find(|s| {
            replicas.iter().any(|r| r.pid() == s.pid) && s.ring.is_some() && s.ring == mine.ring
        }) {
            assert!(mine.is_shm() && s.is_shm(), "{all}");
            assert_eq!(s.peer.ip(), br.ip_hub, "{s}");
            on_ring.insert(s.local.port());
        }
        dir.write(&format!("end{attempt}"), b"");
        assert!(c.wait(Duration::from_secs(30)).is_some_and(|s| s.success()));
    }
    assert_eq!(
        on_ring.len(),
        2,
        "not both replicas on rings: {on_ring:?}\ndaemon log:\n{}",
        ctl.log()
    );
    for r in &mut replicas {
        r.assert_running();
    }
}
