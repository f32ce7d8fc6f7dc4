//! A listener with TCP_DEFER_ACCEPT (apache sets it by default on Linux,
//! nginx with `listen ... deferred`, haproxy with `defer-accept`) and a
//! shimmed client: the kernel holds a connection back from accept until
//! data comes over TCP, but a ring client's first bytes go into the ring.
//! The listener must still accept it at once, on the ring, and the option
//! must read back as the kernel reports it (tests/scripts/defer_accept.py).

use std::time::Duration;

use ringsock_integration::{
    assert_shim_silent, free_port, require, show, wait_port, Cmd, Ctl, TempDir,
};

mod common;
use common::{field, script};

const T: Duration = Duration::from_secs(20);
/// The client's claim wait: a server that cannot accept before it ends
/// would make the first round trip take this long.
const CLAIM_WAIT_MS: u64 = 5000;

/// The server's option readings and the client's round trip time (ms),
/// with both ends made by `cmd`; `check` runs while the client holds the
/// connection, given the two ports.
fn run(cmd: &dyn Fn(&str) -> Cmd, check: &dyn Fn(u16, u16)) -> (String, u64) {
    let port = free_port();
    let hold = TempDir::new("defer-hold");
    let hold_file = hold.path().join("go");
    let mut server = cmd("python3")
        .arg(script("defer_accept.py"))
        .arg("server")
        .arg(port.to_string())
        .spawn();
    wait_port(&mut server, port, T);
    let mut client = cmd("python3")
        .arg(script("defer_accept.py"))
        .arg("client")
        .arg(port.to_string())
        .arg(&hold_file)
        .env("RINGSOCK_CLAIM_WAIT_MS", CLAIM_WAIT_MS.to_string())
        .spawn();
    let line = client.wait_line("reply ", T);
    let words: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(words[1], "olleh", "{line}");
    let ms: u64 = words[3].parse().unwrap();
    let local: u16 = words[5].parse().unwrap();
    check(port, local);
    std::fs::write(&hold_file, b"go").unwrap();
    let (_, cerr) = client.wait_ok(T);
    let (sout, serr) = server.wait_ok(T);
    assert_shim_silent("defer_accept.py client", &cerr);
    assert_shim_silent("defer_accept.py server", &serr);
    assert_eq!(field(&sout, "done"), ["hello"], "{sout}");
    (sout, ms)
}

#[test]
fn deferred_listener_accepts_a_ring_client_at_once() {
    require!("python3");
    let (plain, _) = run(&|p| Cmd::plain(p), &|_, _| {});
    let ctl = Ctl::start();
    let (shimmed, ms) = run(&|p| ctl.shimmed(p), &|port, local| {
        let links = ctl.wait_links(port, 1, T);
        let status = ctl.status();
        let ends: Vec<_> = status
            .iter()
            .filter(|c| c.local.port() == local || c.peer.port() == local)
            .collect();
        assert!(
            ends.len() == 2 && ends.iter().all(|c| c.is_shm()),
            "both ends on shm expected ({} links):\n{}",
            links.len(),
            show(&status)
        );
    });
    assert_eq!(shimmed, plain, "the option reads differently with the shim");
    // Pinned, so that a script that reads nothing cannot pass.
    for line in [
        "before-listen 7",
        "after-listen 31 short 1f00",
        "two-byte-value 22",
        "accepted 0 listener 31",
    ] {
        assert!(
            plain.lines().any(|l| l == line),
            "missing `{line}`:\n{plain}"
        );
    }
    assert!(
        ms < CLAIM_WAIT_MS / 2,
        "the first round trip took {ms} ms: the listener held the ring client back"
    );
}
