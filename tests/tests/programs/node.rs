//! node: an http server and a keep-alive client (tests/scripts/
//! node_http.js), 400 requests of 64 KiB over 4 connections, every body's
//! sha256 checked; both ends of each connection on one ring. Once the
//! client is gone the server must let go of its connections (no ring, no
//! descriptor, no status report left).

use std::time::Duration;

use ringsock_integration::matrix::Matrix;
use ringsock_integration::{
    assert_shim_silent, free_port, payload, require, script, sha256, TempDir,
};

const REQUESTS: usize = 400;

fn node_pair(lets_go: bool) {
    require!("node");
    let mut m = Matrix::new();
    let dir = TempDir::new("node");
    let body = payload(64 << 10, 71);
    let file = dir.write("body.bin", &body);
    let port = free_port();
    let mut server = m.serve(
        m.ctl
            .shimmed("node")
            .arg(script("node_http.js"))
            .args(["server", &port.to_string()])
            .arg(&file),
    );
    server.wait_line("listening", Duration::from_secs(20));
    let idle = m.baseline();
    let w = m.run(
        m.ctl.shimmed("node").arg(script("node_http.js")).args([
            "client",
            &port.to_string(),
            &REQUESTS.to_string(),
            &sha256::hex(&body),
            "300",
        ]),
        Duration::from_secs(60),
    );
    w.assert_ok("node client");
    assert_shim_silent("node client", &w.stderr);
    assert_eq!(w.stdout.trim(), format!("ok {REQUESTS}"));
    w.assert_on_rings("node", port, 4);
    if lets_go {
        println!("{}", m.ctl.expect(port, "ends=0", Duration::from_secs(10)));
        idle.assert_settled("node server", Duration::from_secs(10));
    } else {
        println!(
            "node server after the client left: {} end(s) still listed",
            m.ctl
                .status()
                .iter()
                .filter(|c| c.local.port() == port)
                .count()
        );
    }
    let errs = m.finish("node", vec![server]);
    assert_shim_silent("node server", &errs[0]);
}

#[test]
fn node_http_server_and_client_over_rings() {
    node_pair(false);
}

/// libuv closes a socket with `syscall(SYS_close, fd)`: the shim follows
/// the close there too, so the server lets go of every connection (its
/// duplicate of the kernel socket, the ring, the status report) and the
/// peer sees the close.
#[test]
fn node_server_lets_go_of_closed_connections() {
    node_pair(true);
}
