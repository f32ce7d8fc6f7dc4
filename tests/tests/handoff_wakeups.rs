//! apache mpm_event's keep-alive pattern: a listener thread sleeps in
//! epoll_wait while a worker, done with a request, puts the quiet
//! connection back into its set (EPOLL_CTL_ADD, or MOD of a oneshot
//! registration). The kernel wakes no waiter for that, so the listener
//! sleeps once per request; a shim that woke it for the hand-over made it
//! sleep twice (and contend for the set's lock), which made `ab -k -c 1`
//! against apache 2.6x slower than on kernel TCP.
//!
//! `handoff` (tests/src/bin/handoff.rs) counts the listener thread's
//! voluntary context switches over N requests, each sent after a pause
//! that leaves the listener asleep with the connection handed back; the
//! test wants about one per request, as on kernel TCP (two each before
//! the fix).

use std::time::Duration;

use ringsock_integration::{assert_shim_silent, out_num, Ctl};

const BIN: &str = env!("CARGO_BIN_EXE_handoff");
const REQUESTS: u64 = 200;

fn handoff(mode: &str) {
    let ctl = Ctl::start();
    let mut srv = ctl.shimmed(BIN).args(["server", "--mode", mode]).spawn();
    let line = srv.wait_line("listening ", Duration::from_secs(20));
    let port: u16 = line[10..].trim().parse().unwrap();
    let requests = REQUESTS.to_string();
    let mut cli = ctl
        .shimmed(BIN)
        .args(["client", "--port", &port.to_string()])
        .args(["--requests", &requests])
        .spawn();
    let links = ctl.wait_links(port, 1, Duration::from_secs(15));
    assert!(
        links.iter().all(|l| l.is_shm()),
        "{mode}: the connection is not on a shm ring: {links:?}"
    );
    let (cout, cerr) = cli.wait_ok(Duration::from_secs(60));
    let (sout, serr) = srv.wait_ok(Duration::from_secs(40));
    assert_shim_silent("client", &cerr);
    assert_shim_silent("server", &serr);
    for (who, out) in [("client", &cout), ("server", &sout)] {
        assert!(out.lines().any(|l| l == "ok"), "{mode} {who}: {out}");
        assert_eq!(out_num(out, "requests"), REQUESTS, "{mode} {who}: {out}");
    }
    let sleeps = out_num(&sout, "listener_sleeps");
    println!("{mode}: the listener slept {sleeps} times for {REQUESTS} requests");
    assert!(
        sleeps < REQUESTS + REQUESTS / 4,
        "{mode}: the listener slept {sleeps} times for {REQUESTS} requests: handing a \
         quiet connection back to its sleeping set woke it"
    );
}

#[test]
fn a_connection_added_back_leaves_the_listener_asleep() {
    handoff("add");
}

#[test]
fn a_oneshot_connection_rearmed_leaves_the_listener_asleep() {
    handoff("oneshot");
}
