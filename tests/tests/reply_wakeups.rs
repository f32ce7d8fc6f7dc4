//! A request/response program must not wake the shim's background thread
//! for every message. The thread flushes what a send leaves batched when
//! the program does not block soon after; were every send left batched,
//! each message of a ping-pong would post a flush and, where the thread
//! sleeps, wake it: an eventfd write in the send and a context switch.
//! The first write since the program waited goes out at once
//! (preload/src/ring/msgstart.rs).
//!
//! `wakecount` (tests/src/bin/wakecount.rs) exchanges bursts of 64 B
//! messages separated by pauses longer than the thread's ticking, and
//! prints how often its process's `ringsock` thread was switched in:
//! batched sends would wake it at least once per burst, so the test wants
//! fewer switches than bursts (the thread's own bookkeeping makes a few).

use std::time::Duration;

use ringsock_integration::{free_port, out_num, Ctl};

const BIN: &str = env!("CARGO_BIN_EXE_wakecount");
const BURSTS: u64 = 16;

#[test]
fn a_ping_pong_leaves_the_background_thread_asleep() {
    let ctl = Ctl::start();
    let port = free_port().to_string();
    let bursts = BURSTS.to_string();
    let common = [
        "--host",
        "127.0.0.1",
        "--port",
        &port,
        "--bursts",
        &bursts,
        "--rounds",
        "50",
    ];
    let mut srv = ctl.shimmed(BIN).arg("server").args(common).spawn();
    srv.wait_line("listening", Duration::from_secs(20));
    let mut cli = ctl.shimmed(BIN).arg("client").args(common).spawn();
    let p: u16 = port.parse().unwrap();
    let links = ctl.wait_links(p, 1, Duration::from_secs(15));
    assert!(
        links.iter().all(|l| l.is_shm()),
        "the connection is not on a shm ring: {links:?}"
    );
    let (cout, cerr) = cli.wait_ok(Duration::from_secs(60));
    let (sout, serr) = srv.wait_ok(Duration::from_secs(10));
    for (who, out, err) in [("client", &cout, &cerr), ("server", &sout, &serr)] {
        assert!(
            out.lines().any(|l| l == "ok") && !out.contains("FAIL"),
            "{who}: {out}{err}"
        );
        // `bg_switches none` (no ringsock thread to count) fails here too.
        let n = out_num(out, "bg_switches");
        assert!(
            n < BURSTS,
            "{who}: its background thread was switched in {n} times in {BURSTS} bursts \
             of request/response messages (a send left its bytes for the thread to flush)"
        );
    }
}
