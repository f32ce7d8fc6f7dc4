//! A writer that goes quiet after a send (it sleeps in a call the shim
//! does not see) must not hold back its byte: a batch left open by the
//! send is the shim background thread's to flush. A lost wake-up for such
//! a post (`ringsock_ring::sleep::park`) would leave every later byte of
//! that process waiting for the writer's next call on the socket.
//!
//! `quietsend` (tests/src/bin/quietsend.rs) checks each byte arrived
//! while the writer slept, through a file the reader updates; reader and
//! writer are both shimmed on one host, so the connection is a shm ring.
//! On shm a one-byte send is usually published at once, so this test
//! seldom needs the thread; the guest check over verbs
//! (scripts/softroce-vm.d/quiet.sh), where every send leaves a tail WRITE
//! for the thread to complete, needs it for every byte.

use std::time::Duration;

use ringsock_integration::{free_port, Ctl, TempDir};

const BIN: &str = env!("CARGO_BIN_EXE_quietsend");
const ROUNDS: &str = "6";

#[test]
fn bytes_of_a_quiet_writer_arrive_while_it_sleeps() {
    let ctl = Ctl::start();
    let dir = TempDir::new("quietsend");
    let mark = dir.path().join("received");
    let port = free_port().to_string();
    let common = [
        "--host",
        "127.0.0.1",
        "--port",
        &port,
        "--rounds",
        ROUNDS,
        "--mark",
        mark.to_str().unwrap(),
    ];
    let mut srv = ctl.shimmed(BIN).arg("server").args(common).spawn();
    srv.wait_line("listening", Duration::from_secs(20));
    let mut cli = ctl
        .shimmed(BIN)
        .arg("client")
        .args(common)
        .args(["--before-ms", "100", "--after-ms", "400"])
        .spawn();
    let p: u16 = port.parse().unwrap();
    let links = ctl.wait_links(p, 1, Duration::from_secs(15));
    assert!(
        links.iter().all(|l| l.is_shm()),
        "the connection is not on a shm ring: {links:?}"
    );
    let (out, err) = cli.wait_ok(Duration::from_secs(30));
    assert!(
        out.lines().any(|l| l == "ok") && !out.contains("FAIL"),
        "client: {out}{err}"
    );
    let (out, err) = srv.wait_ok(Duration::from_secs(10));
    assert!(
        out.lines().any(|l| l == "ok") && !out.contains("FAIL"),
        "server: {out}{err}"
    );
    assert_eq!(std::fs::read_to_string(&mark).unwrap().trim(), ROUNDS);
}
