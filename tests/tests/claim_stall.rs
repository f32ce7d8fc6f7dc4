//! A server that stalls halfway through taking a client's ring: the daemon
//! has handed it the offer (the claim is answered) but the server has not
//! decided yet, and the client stops waiting meanwhile. The segment's
//! state word settles it (preload/src/ring/shm/handshake.rs): the client
//! withdraws, the resumed server finds the ring withdrawn and stays on TCP
//! with it, and every byte arrives exactly once, as the two streamcheck
//! hashes show.
//!
//! The window is driven with SIGSTOP, not with timing: the server is
//! stopped before it accepts, the client connects and offers, the daemon
//! is stopped, the server resumes until its claim sleeps waiting for the
//! daemon's reply, then the server is stopped there and the daemon resumed
//! (it answers the claim). The client gives up after its claim wait while
//! the server stays stopped; only then does the server run again.

use std::time::{Duration, Instant};

use ringsock_integration::{assert_shim_silent, show, Ctl};

const BIN: &str = env!("CARGO_BIN_EXE_streamcheck");
/// The client's claim wait: the steps up to the stopped claim take
/// milliseconds, so this leaves them ample room on a loaded machine (past
/// it the client withdraws before the claim, and the ends still agree).
const CLAIM_WAIT_MS: &str = "5000";

fn signal(pid: u32, sig: libc::c_int) {
    // SAFETY: signalling a child this test spawned, by pid.
    let r = unsafe { libc::kill(pid as libc::pid_t, sig) };
    assert_eq!(r, 0, "kill({pid}, {sig}) failed");
}

/// Whether `pid`'s main thread sleeps in recvmsg(2). Before it reads
/// anything of the connection, that is the shim's call to the daemon.
fn in_recvmsg(pid: u32) -> bool {
    let path = format!("/proc/{pid}/syscall");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{path}: {e} (the test reads its child's system call)"));
    text.split_whitespace()
        .next()
        .and_then(|n| n.parse::<libc::c_long>().ok())
        == Some(libc::SYS_recvmsg)
}

fn wait_until(what: &str, timeout: Duration, mut ok: impl FnMut() -> bool) {
    let end = Instant::now() + timeout;
    while !ok() {
        assert!(Instant::now() < end, "{what}: not within {timeout:?}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn server_stopped_between_claim_and_decision_stays_tcp_with_the_client() {
    let ctl = Ctl::start();
    let daemon = ctl.daemon_pid().expect("a daemon");
    // Calls to a stopped daemon wait for it instead of giving up.
    let cmd = |role: &str| {
        ctl.shimmed(BIN)
            .env("RINGSOCK_CONNECT_TIMEOUT_MS", "60000")
            .env("RINGSOCK_CLAIM_WAIT_MS", CLAIM_WAIT_MS)
            .arg(role)
            .args([
                "--seed", "11", "--mib", "1", "--conns", "1", "--mode", "block",
            ])
            .args(["--timeout-s", "90"])
    };
    let mut srv = cmd("server").spawn();
    let line = srv.wait_line("listening ", Duration::from_secs(20));
    let port: u16 = line[10..].trim().parse().unwrap();
    let spid = srv.pid();
    signal(spid, libc::SIGSTOP);
    let mut cli = cmd("client").args(["--port", &port.to_string()]).spawn();
    // The client reports its connection after its offer was registered.
    let mine = |c: &ringsock_integration::Conn| c.peer.port() == port;
    ctl.wait_for(Duration::from_secs(30), |s| s.iter().any(mine))
        .unwrap_or_else(|| panic!("the client's connection was never reported"));
    signal(daemon, libc::SIGSTOP);
    signal(spid, libc::SIGCONT);
    wait_until(
        "the server's claim waiting for the daemon",
        Duration::from_secs(60),
        || in_recvmsg(spid),
    );
    signal(spid, libc::SIGSTOP);
    signal(daemon, libc::SIGCONT);
    // The daemon hands the claimed offer over; the client, whose claim
    // wait runs out, goes to TCP while the server is still stopped.
    let gave_up = ctl.wait_for(Duration::from_secs(60), |s| {
        s.iter().any(|c| mine(c) && c.transport == "tcp")
    });
    signal(spid, libc::SIGCONT);
    let gave_up = gave_up.unwrap_or_else(|| panic!("the client never went to TCP"));
    let w = ctl.watch(&mut cli, Duration::from_secs(120));
    let (server_out, server_err) = srv.wait_ok(Duration::from_secs(60));
    w.assert_ok("streamcheck client");
    // `conn 0 sent N HASH recv N HASH ...`: each side received exactly
    // what the other sent.
    let conn = |out: &str| -> Vec<String> {
        let l = out.lines().find(|l| l.starts_with("conn 0 "));
        let w: Vec<&str> = l
            .unwrap_or_else(|| panic!("no conn line:\n{out}"))
            .split(' ')
            .collect();
        vec![w[3].into(), w[4].into(), w[6].into(), w[7].into()]
    };
    let (c, s) = (conn(&w.stdout), conn(&server_out));
    assert_eq!(c[..2], s[2..], "client -> server");
    assert_eq!(s[..2], c[2..], "server -> client");
    assert_shim_silent("streamcheck client", &w.stderr);
    assert_shim_silent("streamcheck server", &server_err);
    let seen: Vec<_> = gave_up.iter().chain(&w.conns).collect();
    for c in seen.iter().filter(|c| mine(c) || c.local.port() == port) {
        assert!(
            c.transport == "tcp",
            "both ends must stay on TCP: {c}\n{}",
            show(&w.conns)
        );
    }
}
