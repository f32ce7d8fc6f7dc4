//! Unmodified programs across two network namespaces of one host
//! (docs/design.md, "Namespaces"): namespaces A and B on a bridge in a
//! third one, the hub (`netns::Bridge`), as two containers on a host; one
//! daemon, in the test's namespace, reached through its socket path. The
//! server runs in B on its wildcard address, the client in A connects to
//! B's address, and both ends must be on one shared-memory ring:
//!
//! * `redis_across_namespaces`: redis-benchmark (20 clients, SET and GET)
//!   and redis-cli writing and reading back a 1 MiB value (sha256);
//! * `nginx_across_namespaces`: curl fetching 1 MiB and 10 MiB files from
//!   two nginx workers, byte for byte;
//! * `sockperf_across_namespaces`: sockperf ping-pong over TCP, every
//!   reply back;
//! * `redis_through_a_published_port`: the hub runs the daemon and
//!   publishes its port 6380 as B's redis (nftables DNAT, masqueraded, as
//!   Docker does); once the daemon saw the translation (a first
//!   connection), redis-benchmark in A against the hub's port runs on
//!   rings.

use std::time::{Duration, Instant};

use ringsock_integration::http::curl;
use ringsock_integration::netns::{run_in, Bridge, Hosts, NsCtl};
use ringsock_integration::sha256::assert_file;
use ringsock_integration::{
    assert_all_shm, assert_shim_silent, nginx, payload, require, sha256, Ctl, Server, TempDir,
};

/// Waits until a plain TCP connect from namespace `ns` to `addr` succeeds
/// (the server in the other namespace listens), while `server` runs.
fn wait_listening(ns: &str, addr: &str, server: &mut Server) {
    let end = Instant::now() + Duration::from_secs(15);
    let (host, port) = addr.rsplit_once(':').expect("host:port");
    loop {
        server.assert_running();
        let probe = std::process::Command::new("ip")
            .args(["netns", "exec", ns, "bash", "-c"])
            .arg(format!("exec 3<>/dev/tcp/{host}/{port}"))
            .env_remove("LD_PRELOAD")
            .output()
            .expect("run ip netns exec");
        if probe.status.success() {
            return;
        }
        assert!(
            Instant::now() < end,
            "nothing listens on {addr} seen from {ns}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The port `redis_in` listens on.
const REDIS_PORT: &str = "6379";

/// redis-server under the shim in namespace `ns`, talking to the daemon
/// on `ctl_sock`, on its wildcard address (no protected mode: its clients
/// come from other namespaces), its files in `dir`.
fn redis_in(ns: &str, ctl_sock: &std::path::Path, dir: &TempDir) -> Server {
    Hosts::shimmed_in(ns, ctl_sock, "redis-server")
        .args([
            "--port",
            REDIS_PORT,
            "--bind",
            "0.0.0.0",
            "--protected-mode",
            "no",
        ])
        .args(["--save", "", "--appendonly", "no", "--dir"])
        .arg(dir.path())
        .spawn()
}

#[test]
fn redis_across_namespaces() {
    require!("redis-server", "redis-benchmark", "redis-cli", "ip", "bash");
    let Some(br) = Bridge::new() else {
        return;
    };
    let ctl = Ctl::start();
    let dir = TempDir::new("nsredis");
    let port = REDIS_PORT;
    let ip_b = br.ip_b.to_string();
    let mut server = redis_in(&br.b, ctl.sock(), &dir);
    wait_listening(&br.a, &format!("{ip_b}:{port}"), &mut server);

    let mut bench = Hosts::shimmed_in(&br.a, ctl.sock(), "redis-benchmark")
        .args([
            "-h", &ip_b, "-p", port, "-t", "set,get", "-n", "20000", "-c", "20",
        ])
        .spawn();
    let w = ctl.watch(&mut bench, Duration::from_secs(60));
    w.assert_ok("redis-benchmark");
    assert_shim_silent("redis-benchmark", &w.stderr);
    let links = assert_all_shm("redis-benchmark across namespaces", &w.conns, 6379, 1);
    println!(
        "redis-benchmark: {} connection(s) over shm across namespaces, e.g. {}",
        links.len(),
        links[0]
    );
    for l in &links {
        assert_eq!(l.client.peer.ip(), br.ip_b, "{l}");
        assert_eq!(l.server.peer.ip(), br.ip_a, "{l}");
    }
    for test in ["SET", "GET"] {
        let section = w
            .stdout
            .split(&format!("====== {test} ======"))
            .nth(1)
            .unwrap_or_else(|| panic!("no {test} section in:\n{}", w.stdout));
        let done = section
            .lines()
            .find(|l| l.contains("requests completed in"))
            .unwrap_or_else(|| panic!("no completion line for {test}:\n{section}"));
        let n: u64 = done.split_whitespace().next().unwrap().parse().unwrap();
        assert_eq!(n, 20000, "{test}: {done}");
    }

    // A 1 MiB value written and read back, each by its own redis-cli.
    let value: String = payload(1 << 20, 7)
        .iter()
        .map(|b| char::from(b'a' + b % 26))
        .collect();
    let file = dir.write("value", value.as_bytes());
    let mut set = Hosts::shimmed_in(&br.a, ctl.sock(), "redis-cli")
        .args(["-h", &ip_b, "-p", port, "-x", "set", "big"])
        .stdin_from(&file)
        .spawn();
    let w = ctl.watch(&mut set, Duration::from_secs(30));
    w.assert_ok("redis-cli set");
    assert_eq!(w.stdout.trim(), "OK", "{}", w.stdout);
    let mut get = Hosts::shimmed_in(&br.a, ctl.sock(), "redis-cli")
        .args(["-h", &ip_b, "-p", port, "--raw", "get", "big"])
        .spawn();
    let w = ctl.watch(&mut get, Duration::from_secs(30));
    w.assert_ok("redis-cli get");
    // redis-cli -x keeps the file's bytes; --raw adds a newline.
    let got = w.stdout.strip_suffix('\n').unwrap_or(&w.stdout);
    assert_eq!(
        sha256::hex(got.as_bytes()),
        sha256::hex(value.as_bytes()),
        "the value read back differs ({} bytes)",
        got.len()
    );
    // Too short to be sampled for sure: what was seen must be on shm.
    assert_all_shm("redis-cli get across namespaces", &w.conns, 6379, 0);
    drop(server);
}

#[test]
fn nginx_across_namespaces() {
    require!("nginx", "curl", "ip", "bash");
    let Some(br) = Bridge::new() else {
        return;
    };
    let ctl = Ctl::start();
    let out_dir = TempDir::new("nsnginx-out");
    let prefix = TempDir::new("nsnginx");
    let root = prefix.path().join("html");
    let files: Vec<(String, Vec<u8>)> = [(1usize << 20, 21u64), (10 << 20, 22)]
        .iter()
        .map(|&(n, seed)| (format!("f{n}.bin"), payload(n, seed)))
        .collect();
    for (name, data) in &files {
        prefix.write(&format!("html/{name}"), data);
    }
    let port = 8080u16;
    let conf = nginx::conf(
        prefix.path(),
        "worker_processes 2;",
        "worker_connections 64;",
        &format!(
            "sendfile on; server {{ listen {port}; root {}; }}",
            root.display()
        ),
    );
    let mut server = nginx::args(
        Hosts::shimmed_in(&br.b, ctl.sock(), "nginx"),
        prefix.path(),
        &conf,
    )
    .spawn();
    wait_listening(&br.a, &format!("{}:{port}", br.ip_b), &mut server);
    for round in 0..2 {
        for (name, data) in &files {
            let dest = out_dir.path().join(format!("{round}-{name}"));
            let url = format!("http://{}:{port}/{name}", br.ip_b);
            let mut c = curl(
                Hosts::shimmed_in(&br.a, ctl.sock(), "curl"),
                &url,
                &dest,
                Some("20M"),
            )
            .spawn();
            let w = ctl.watch(&mut c, Duration::from_secs(40));
            w.assert_ok(&format!("round {round} curl {name}"));
            assert_shim_silent("curl", &w.stderr);
            assert_file(name, &dest, data);
            let min = usize::from(data.len() >= 10 << 20);
            for l in assert_all_shm(&format!("round {round} {name}"), &w.conns, port, min) {
                println!("round {round} {name}: {l}");
            }
        }
    }
    drop(server);
    nginx::assert_quiet_log(prefix.path());
}

#[test]
fn sockperf_across_namespaces() {
    require!("sockperf", "ip", "bash");
    let Some(br) = Bridge::new() else {
        return;
    };
    let ctl = Ctl::start();
    let port = "11111";
    let mut server = Hosts::shimmed_in(&br.b, ctl.sock(), "sockperf")
        .args(["server", "--tcp", "-i", "0.0.0.0", "-p", port])
        .spawn();
    wait_listening(&br.a, &format!("{}:{port}", br.ip_b), &mut server);
    let mut client = Hosts::shimmed_in(&br.a, ctl.sock(), "sockperf")
        .args(["ping-pong", "--tcp", "-i", &br.ip_b.to_string(), "-p", port])
        // sockperf's default rate cap aborts a run faster than it
        // (`_seqN > m_maxSequenceNo`): raised past what a ring reaches.
        .args(["-t", "2", "-m", "64", "--mps", "5000000"])
        .spawn();
    let w = ctl.watch(&mut client, Duration::from_secs(30));
    w.assert_ok("sockperf ping-pong");
    let text = format!("{}{}", w.stdout, w.stderr);
    assert_shim_silent("sockperf ping-pong", &w.stderr);
    assert!(
        text.contains(
            "# dropped messages = 0; # duplicated messages = 0; # out-of-order messages = 0"
        ),
        "{text}"
    );
    assert_all_shm("sockperf across namespaces", &w.conns, 11111, 1);
    let summary = text
        .lines()
        .find(|l| l.contains("Summary: Latency is"))
        .unwrap_or_else(|| panic!("no latency summary:\n{text}"));
    println!("sockperf across namespaces on shm: {summary}");
    drop(server);
}

#[test]
fn redis_through_a_published_port() {
    require!(
        "redis-server",
        "redis-benchmark",
        "redis-cli",
        "ip",
        "bash",
        "nft"
    );
    let Some(br) = Bridge::new() else {
        return;
    };
    let hub = br.hub.as_str();
    run_in(hub, &["nft", "add", "table", "ip", "rspub"]);
    for rule in [
        "add chain ip rspub pre { type nat hook prerouting priority -100; }".to_string(),
        format!(
            "add rule ip rspub pre ip daddr {} tcp dport 6380 dnat to {}:6379",
            br.ip_hub, br.ip_b
        ),
        "add chain ip rspub post { type nat hook postrouting priority 100; }".to_string(),
        format!(
            "add rule ip rspub post ip daddr {} ct status dnat masquerade",
            br.ip_b
        ),
    ] {
        run_in(hub, &["nft", &rule]);
    }
    let ctl = NsCtl::start(hub, &[]);
    let dir = TempDir::new("nsredispub");
    let mut server = redis_in(&br.b, ctl.sock(), &dir);
    let published = format!("{}:6380", br.ip_hub);
    wait_listening(&br.a, &published, &mut server);
    // Until a connection through the port is on a ring: the first ones
    // teach the daemon the translation.
    let hub_ip = br.ip_hub.to_string();
    let on_ring = (0..10).any(|_| {
        std::thread::sleep(Duration::from_millis(600));
        let mut cli = Hosts::shimmed_in(&br.a, ctl.sock(), "redis-cli")
            .args([
                "-h", &hub_ip, "-p", "6380", "-r", "10", "-i", "0.05", "ping",
            ])
            .spawn();
        let end = Instant::now() + Duration::from_secs(10);
        let mut seen = false;
        while cli.exited().is_none() && Instant::now() < end {
            let conns = ctl.status().unwrap_or_default();
            seen |= conns.iter().any(|c| c.pid == cli.pid() && c.is_shm());
            std::thread::sleep(Duration::from_millis(20));
        }
        seen
    });
    assert!(
        on_ring,
        "no redis-cli connection through the published port on a ring:\n{}",
        ctl.log()
    );
    let mut bench = Hosts::shimmed_in(&br.a, ctl.sock(), "redis-benchmark")
        .args([
            "-h", &hub_ip, "-p", "6380", "-t", "set,get", "-n", "200000", "-c", "20",
        ])
        .spawn();
    let bench_pid = bench.pid();
    // NsCtl has no watch: sample its status while the benchmark runs.
    let mut seen: Vec<ringsock_integration::Conn> = Vec::new();
    let end = Instant::now() + Duration::from_secs(60);
    while bench.exited().is_none() && Instant::now() < end {
        for c in ctl.status().unwrap_or_default() {
            if !seen
                .iter()
                .any(|s| s.pid == c.pid && s.fd == c.fd && s.local == c.local)
            {
                seen.push(c);
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let st = bench.wait(Duration::from_secs(5));
    let (out, err) = bench.output();
    assert!(
        st.is_some_and(|s| s.success()),
        "redis-benchmark: {st:?}\n{out}\n{err}"
    );
    assert_shim_silent("redis-benchmark", &err);
    for test in ["SET", "GET"] {
        let section = out
            .split(&format!("====== {test} ======"))
            .nth(1)
            .unwrap_or_else(|| panic!("no {test} section in:\n{out}"));
        assert!(
            section.contains("200000 requests completed"),
            "{test}: {section}"
        );
    }
    // Every end seen is on shm, and the connections seen from both ends
    // (a report comes a little after its connection) share their ring.
    let all = ringsock_integration::show(&seen);
    let clients: Vec<_> = seen.iter().filter(|c| c.pid == bench_pid).collect();
    let srv_pid = server.pid();
    assert!(
        seen.iter()
            .filter(|c| c.pid == bench_pid || c.pid == srv_pid)
            .all(|c| c.is_shm()),
        "an end through the published port not on shm:\n{all}"
    );
    let paired = clients
        .iter()
        .filter(|c| {
            seen.iter()
                .any(|s| s.pid == srv_pid && s.ring.is_some() && s.ring == c.ring)
        })
        .count();
    assert!(
        paired >= 10,
        "only {paired} of {} benchmark connections seen on a ring with the server:\n{all}",
        clients.len()
    );
    println!("redis-benchmark through the published port: {paired} connection(s) on shm rings");
}
