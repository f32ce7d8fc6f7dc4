//! Connections between hosts on a machine without an RDMA device: two
//! network namespaces A and B joined by a veth pair (tests/src/netns.rs),
//! a streamcheck server in A and a shimmed streamcheck client in B
//! connecting to A's address. Without a device the client's shim must keep
//! every connection to another host on kernel TCP at once, without asking
//! its daemon (docs/limits.md: reason "no ring transport"), whatever runs
//! on A: a shimmed server with its own daemon, a shimmed server on a host
//! without a daemon, or a server without the shim.
//!
//! Each run is 2 connections with 2 MiB each way at once, mode mixed
//! (blocking and non-blocking sockets, asynchronous connects); streamcheck
//! checks every byte and the test compares both sides' hashes. Status is
//! sampled on both hosts' daemons while the connections live (each writer
//! pauses 300 ms halfway). Every test skips (prints SKIPPED) when network
//! namespaces cannot be created.

use std::net::Ipv4Addr;
use std::path::Path;
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use ringsock_integration::ctl::Seen;
use ringsock_integration::netns::{Hosts, NsCtl};
use ringsock_integration::{
    assert_shim_silent, links, show, streamcheck_hashes, Cmd, Conn, Server, TempDir,
};

const BIN: &str = env!("CARGO_BIN_EXE_streamcheck");
const CONNS: usize = 2;
/// The ctl-to-ctl port; each daemon has its own namespace, so the default
/// port cannot collide with anything else on the machine. Passed
/// explicitly so that a RINGSOCK_CTL_PORT in the environment changes
/// nothing.
const PEER_PORT: &str = "7471";
/// Hang guard for the client (a healthy run over veth takes about a
/// second): a client whose connect waited on an answer that never comes
/// would hit it. Not a performance bound.
const CLIENT_LIMIT: Duration = Duration::from_secs(20);
/// streamcheck's own watchdog, below CLIENT_LIMIT so that a stuck stream
/// reports every connection's progress before the test kills it.
const WATCHDOG_S: &str = "15";

/// How the server in A runs.
enum ServerSide<'a> {
    /// Under the shim, with this control socket (a daemon's, or a path
    /// where none answers).
    Shim(&'a Path),
    Plain,
}

/// What one client/server run left behind.
struct Outcome {
    port: u16,
    client_pid: u32,
    client_err: String,
    server_err: String,
    /// Connections reported to A's and B's daemon while the client ran
    /// (the latest sample of each).
    on_a: Vec<Conn>,
    on_b: Vec<Conn>,
    took: Duration,
}

/// Waits for `child` (up to CLIENT_LIMIT, then it is killed) while
/// sampling the daemons' status every ~10 ms.
fn watch(
    child: &mut Server,
    a: Option<&NsCtl>,
    b: &NsCtl,
) -> (Option<ExitStatus>, Seen, Seen, usize) {
    let end = Instant::now() + CLIENT_LIMIT;
    let (mut seen_a, mut seen_b) = (Seen::default(), Seen::default());
    let mut samples = 0;
    let status = loop {
        if let Some(s) = child.exited() {
            break Some(s);
        }
        if Instant::now() >= end {
            break child.wait(Duration::ZERO);
        }
        if let Some(a) = a {
            if let Ok(s) = a.status() {
                seen_a.add(&s);
            }
        }
        if let Ok(s) = b.status() {
            seen_b.add(&s);
            samples += 1;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    (status, seen_a, seen_b, samples)
}

/// Runs a streamcheck server in A (`server`) on A's address and a shimmed
/// client in B using B's daemon; asserts both succeeded within the hang
/// guard and that every byte arrived (each receiver checked it, and the
/// hashes of the two sides agree).
fn stream(h: &Hosts, seed: u64, server: ServerSide, a: Option<&NsCtl>, b: &NsCtl) -> Outcome {
    let host = h.ip_a.to_string();
    let common = |c: Cmd| {
        c.args(["--seed", &seed.to_string(), "--mib", "2"])
            .args(["--conns", &CONNS.to_string(), "--mode", "mixed"])
            .args(["--timeout-s", WATCHDOG_S, "--host", &host])
    };
    let srv_cmd = match server {
        ServerSide::Shim(sock) => Hosts::shimmed_in(&h.a, sock, BIN),
        ServerSide::Plain => Hosts::plain_in(&h.a, BIN),
    };
    let mut srv = common(srv_cmd.arg("server")).spawn();
    let line = srv.wait_line("listening ", Duration::from_secs(10));
    let port: u16 = line[10..].trim().parse().unwrap();

    let started = Instant::now();
    let mut cli = common(Hosts::shimmed_in(&h.b, b.sock(), BIN).arg("client"))
        .args(["--port", &port.to_string(), "--pause-ms", "300"])
        .spawn();
    let client_pid = cli.pid();
    let (status, seen_a, seen_b, samples) = watch(&mut cli, a, b);
    let took = started.elapsed();
    let (client_out, client_err) = cli.output();
    let logs = || {
        format!(
            "A's daemon:\n{}\nB's daemon:\n{}",
            a.map_or("(none)".into(), NsCtl::log),
            b.log()
        )
    };
    assert!(
        status.is_some_and(|s| s.success()),
        "streamcheck client (B -> {host}:{port}, seed {seed}) failed or was still running after {CLIENT_LIMIT:?} ({status:?}):\nstdout:\n{client_out}\nstderr:\n{client_err}\nserver:\n{:?}\n{}",
        srv.output(),
        logs()
    );
    let (server_out, server_err) = srv.wait_ok(Duration::from_secs(10));
    let (c, s) = (
        streamcheck_hashes(&client_out),
        streamcheck_hashes(&server_out),
    );
    assert_eq!(c.len(), CONNS, "client:\n{client_out}");
    assert_eq!(s.len(), CONNS, "server:\n{server_out}");
    for ((c_sent, c_recv), (s_sent, s_recv)) in c.iter().zip(&s) {
        assert_eq!(c_sent, s_recv, "client->server hash (seed {seed})");
        assert_eq!(s_sent, c_recv, "server->client hash (seed {seed})");
    }
    assert!(client_out.contains("\nok") && server_out.contains("\nok"));
    assert!(samples > 0, "no status sample of B's daemon succeeded");
    Outcome {
        port,
        client_pid,
        client_err,
        server_err,
        on_a: seen_a.conns,
        on_b: seen_b.conns,
        took,
    }
}

/// The client ends in B's status: exactly CONNS connections from B's
/// address to A's server port, all from the client process, on TCP for
/// want of a device, without a ring; nothing else reported on B.
fn assert_client_ends(o: &Outcome, ip_a: Ipv4Addr, ip_b: Ipv4Addr) {
    let ends: Vec<&Conn> = o
        .on_b
        .iter()
        .filter(|c| c.peer.port() == o.port && c.peer.ip() == ip_a)
        .collect();
    assert_eq!(
        ends.len(),
        CONNS,
        "B's daemon should list the client's {CONNS} connections to {ip_a}:{}:\n{}",
        o.port,
        show(&o.on_b)
    );
    for c in ends {
        assert_eq!(c.pid, o.client_pid, "{c}");
        assert_eq!(c.local.ip(), ip_b, "{c}");
        assert_eq!(c.transport, "tcp", "{c}");
        assert_eq!(c.reason, "no ring transport", "{c}");
        assert!(c.ring.is_none(), "tcp with a ring: {c}");
    }
    assert_eq!(o.on_b.len(), CONNS, "B:\n{}", show(&o.on_b));
}

/// With no device the client asks its daemon nothing, so no offer is
/// forwarded and the ctls never connect to each other.
fn assert_no_offer_forwarded(b: &NsCtl, a: Option<&NsCtl>) {
    let log = b.log();
    for s in ["forwarded to", "connecting to"] {
        assert!(!log.contains(s), "B's daemon logged `{s}`:\n{log}");
    }
    if let Some(a) = a {
        let log = a.log();
        assert!(
            !log.contains("ctl at"),
            "a ctl connected to A's daemon:\n{log}"
        );
    }
}

#[test]
fn shimmed_both_ends_with_daemons_fall_back_to_tcp() {
    let Some(h) = Hosts::new() else { return };
    let da = NsCtl::start(&h.a, &["--peer-port", PEER_PORT]);
    let db = NsCtl::start(&h.b, &["--peer-port", PEER_PORT]);
    let o = stream(&h, 21, ServerSide::Shim(da.sock()), Some(&da), &db);

    assert_client_ends(&o, h.ip_a, h.ip_b);
    // A's server claimed each accepted connection and found no offer: TCP,
    // "no ringsock peer", reported to A's daemon with the mirrored
    // 4-tuple, so each connection is seen from both ends.
    let all: Vec<Conn> = o.on_a.iter().chain(&o.on_b).cloned().collect();
    let l = links(&all, o.port);
    assert_eq!(
        l.len(),
        CONNS,
        "both ends of each connection:\n{}",
        show(&all)
    );
    for link in &l {
        let s = &link.server;
        assert!(o.on_a.contains(s), "server end not on A: {link}");
        assert_eq!(s.local.ip(), h.ip_a, "{link}");
        assert_eq!(s.transport, "tcp", "{link}");
        assert_eq!(s.reason, "no ringsock peer", "{link}");
        assert!(s.ring.is_none(), "{link}");
    }
    assert_eq!(o.on_a.len(), CONNS, "A:\n{}", show(&o.on_a));
    assert!(all.iter().all(|c| c.transport == "tcp"), "{}", show(&all));
    assert_no_offer_forwarded(&db, Some(&da));
    assert_shim_silent("client", &o.client_err);
    assert_shim_silent("server", &o.server_err);
    println!("took {:?}; links:", o.took);
    for link in &l {
        println!("  {link}");
    }
}

#[test]
fn server_host_without_daemon_is_tcp() {
    let Some(h) = Hosts::new() else { return };
    let db = NsCtl::start(&h.b, &["--peer-port", PEER_PORT]);
    // A's shim points at a path where no daemon answers.
    let nothing = TempDir::new("two-hosts-no-ctl");
    let sock = nothing.path().join("ctl.sock");
    let o = stream(&h, 22, ServerSide::Shim(&sock), None, &db);

    assert_client_ends(&o, h.ip_a, h.ip_b);
    assert_no_offer_forwarded(&db, None);
    assert_shim_silent("client", &o.client_err);
    assert_shim_silent("server", &o.server_err);
    println!("took {:?}; B:\n{}", o.took, show(&o.on_b));
}

#[test]
fn unshimmed_server_is_tcp() {
    let Some(h) = Hosts::new() else { return };
    let da = NsCtl::start(&h.a, &["--peer-port", PEER_PORT]);
    let db = NsCtl::start(&h.b, &["--peer-port", PEER_PORT]);
    let o = stream(&h, 23, ServerSide::Plain, Some(&da), &db);

    assert_client_ends(&o, h.ip_a, h.ip_b);
    // The server is not shimmed: nothing reports to A's daemon.
    assert!(o.on_a.is_empty(), "A:\n{}", show(&o.on_a));
    assert_no_offer_forwarded(&db, Some(&da));
    assert_shim_silent("client", &o.client_err);
    println!("took {:?}; B:\n{}", o.took, show(&o.on_b));
}
