//! Short connections by default: a process whose connections to one
//! address keep closing within RINGSOCK_SHORT_MS connects there over plain
//! TCP (status says why), a long and busy connection there brings rings
//! back (a slow one with a request or two does not), and
//! every reply is right either way. `connloop redis` makes the connections
//! (SET then GET on each, both replies checked) and counts the ones that
//! mapped a ring.

use std::time::Duration;

use ringsock_integration::{
    assert_shim_silent, out_num as num, require, show, wait_port, Ctl, Server, TempDir,
};

const CONNLOOP: &str = env!("CARGO_BIN_EXE_connloop");
const SHORT_LIVED: &str = "short-lived connections to this address";

fn redis(ctl: &Ctl, dir: &TempDir) -> (Server, u16) {
    let port = ringsock_integration::free_port();
    let mut redis = ctl
        .shimmed("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no", "--dir"])
        .arg(dir.path())
        .spawn();
    wait_port(&mut redis, port, Duration::from_secs(10));
    (redis, port)
}

#[test]
fn short_connections_go_over_tcp_and_long_ones_bring_rings_back() {
    require!("redis-server");
    let ctl = Ctl::start();
    let dir = TempDir::new("short-conns");
    let (mut server, port) = redis(&ctl, &dir);

    // 1000 connections that each live for one SET and one GET: the first
    // two get rings, then the skips grow eightfold (16, 128, 1024)
    // with one ring tried between them. A connection slowed past 50 ms by
    // a busy machine only adds a few rings.
    const N: u64 = 1000;
    let mut c = ctl
        .shimmed(CONNLOOP)
        .args(["redis", "--port", &port.to_string(), "--n", &N.to_string()])
        .spawn();
    let w = ctl.watch(&mut c, Duration::from_secs(120));
    w.assert_ok("1000 short connections");
    assert_shim_silent("short connections", &w.stderr);
    assert_eq!(num(&w.stdout, "ok"), N, "{}", w.stdout);
    let rings = num(&w.stdout, "ring_conns");
    println!("{N} short connections, {rings} with a ring");
    assert!(
        (2..=N / 20).contains(&rings),
        "expected the first connections on rings and nearly all the rest on TCP: {}",
        w.stdout
    );
    assert_eq!(num(&w.stdout, "ring_maps_after"), 0, "{}", w.stdout);

    // Every 8th connection lives 150 ms after its one SET and GET: slow,
    // but not busy (a slow server, a loaded machine). Those do not end
    // the skips: rings stay as rare as above.
    let mut c = ctl
        .shimmed(CONNLOOP)
        .args(["redis", "--port", &port.to_string(), "--n", "200"])
        .args(["--hold-every", "8", "--hold-ms", "150"])
        .spawn();
    let w = ctl.watch(&mut c, Duration::from_secs(120));
    w.assert_ok("short connections with slow ones among them");
    let rings = num(&w.stdout, "ring_conns");
    println!("200 connections, every 8th slow: {rings} with a ring");
    assert!(
        rings <= 10,
        "slow one-request connections brought rings back: {}",
        w.stdout
    );

    // Every 8th connection also makes 20 more round trips and lives
    // 150 ms: busy and long. Each such one resets the record, so the two
    // after it get rings again; the ones after them are in the first skip
    // (16), so the held ones go over TCP and say why in status.
    const M: u64 = 200;
    let mut c = ctl
        .shimmed(CONNLOOP)
        .args(["redis", "--port", &port.to_string(), "--n", &M.to_string()])
        .args([
            "--hold-every",
            "8",
            "--hold-ms",
            "150",
            "--hold-pings",
            "20",
        ])
        .spawn();
    let w = ctl.watch(&mut c, Duration::from_secs(120));
    w.assert_ok("short connections with long ones among them");
    assert_eq!(num(&w.stdout, "ok"), M, "{}", w.stdout);
    let rings = num(&w.stdout, "ring_conns");
    println!("{M} connections, every 8th long: {rings} with a ring");
    assert!(
        rings >= M / 10,
        "a long connection must bring rings back: {}",
        w.stdout
    );
    let skipped: Vec<_> = w
        .conns
        .iter()
        .filter(|c| c.peer.port() == port && c.transport == "tcp")
        .collect();
    assert!(
        !skipped.is_empty(),
        "no held connection seen on TCP:\n{}",
        show(&w.conns)
    );
    for c in &skipped {
        assert_eq!(c.reason, SHORT_LIVED, "{c}\n{}", show(&w.conns));
    }

    // RINGSOCK_SHORT_MS=0: every connection is offered a ring.
    const K: u64 = 100;
    let mut c = ctl
        .shimmed(CONNLOOP)
        .env("RINGSOCK_SHORT_MS", "0")
        .args(["redis", "--port", &port.to_string(), "--n", &K.to_string()])
        .spawn();
    let w = ctl.watch(&mut c, Duration::from_secs(120));
    w.assert_ok("RINGSOCK_SHORT_MS=0");
    assert_eq!(num(&w.stdout, "ring_conns"), K, "{}", w.stdout);
    assert_eq!(num(&w.stdout, "ring_maps_after"), 0, "{}", w.stdout);
    server.assert_running();
}
