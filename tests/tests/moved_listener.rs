//! A listener a forked worker moves to another number (dup, then close
//! of the first), as php-fpm's workers do: the worker's new daemon
//! session registers the process's listeners again, and a stale number
//! among them must not break the session, or the worker never
//! claims a ring and every client waits its whole claim wait for TCP
//! (tests/scripts/moved_listener.py; the client is defer_accept.py's).
//! The accepted socket takes a lower number, as in php-fpm, so the first
//! number is still closed when the session registers it (EBADF).

use std::time::Duration;

use ringsock_integration::{assert_shim_silent, free_port, require, show, wait_port, Ctl, TempDir};

mod common;
use common::{field, script};

const T: Duration = Duration::from_secs(20);
/// The client's claim wait: a worker that cannot claim makes the first
/// round trip take this long.
const CLAIM_WAIT_MS: u64 = 5000;

#[test]
fn worker_of_a_moved_listener_takes_the_ring() {
    require!("python3");
    let ctl = Ctl::start();
    let port = free_port();
    let hold = TempDir::new("moved-hold");
    let hold_file = hold.path().join("go");
    let mut server = ctl
        .shimmed("python3")
        .arg(script("moved_listener.py"))
        .arg(port.to_string())
        .spawn();
    wait_port(&mut server, port, T);
    let mut client = ctl
        .shimmed("python3")
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
    // Both ends report within milliseconds of the ring's set-up.
    let links = ctl.wait_links(port, 1, T);
    let status = ctl.status();
    let ends: Vec<_> = status
        .iter()
        .filter(|c| c.local.port() == local || c.peer.port() == local)
        .collect();
    std::fs::write(&hold_file, b"go").unwrap();
    let (_, cerr) = client.wait_ok(T);
    let (sout, serr) = server.wait_ok(T);
    assert_shim_silent("defer_accept.py client", &cerr);
    assert_shim_silent("moved_listener.py", &serr);
    assert_eq!(field(&sout, "worker"), ["done", "hello"], "{sout}");
    assert!(
        ms < CLAIM_WAIT_MS / 2,
        "the first round trip took {ms} ms: the worker did not claim the ring"
    );
    assert!(
        ends.len() == 2 && ends.iter().all(|c| c.is_shm()),
        "both ends on shm expected ({} links):\n{}",
        links.len(),
        show(&status)
    );
}
