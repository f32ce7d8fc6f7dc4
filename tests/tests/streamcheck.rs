//! Byte-stream properties through the shim, with the `streamcheck` program
//! (tests/src/bin/streamcheck.rs): both directions at once on several
//! connections, random read/write sizes and calls (read/recv/recvfrom/
//! readv/recvmsg, write/send/sendto/writev/sendmsg, MSG_PEEK then read,
//! MSG_WAITALL, MSG_DONTWAIT, FIONREAD), blocking and non-blocking sockets,
//! EAGAIN waited out with poll/ppoll/select/epoll, shutdown(SHUT_WR) then
//! EOF exactly at the end. Each side checks every byte it receives; the
//! test compares the FNV hashes both sides print, and checks (status
//! sampled while the connections live) that they were on shm rings — or,
//! with an unshimmed server, on TCP with the very same hashes.

use std::time::Duration;

use ringsock_integration::{
    assert_all_shm, assert_shim_silent, show, streamcheck_hashes, Cmd, Ctl, Watched,
};

const BIN: &str = env!("CARGO_BIN_EXE_streamcheck");
const MIB: u32 = 4;
const CONNS: u32 = 2;

struct Run {
    client: Watched,
    server_out: String,
    server_err: String,
    port: u16,
}

/// One client/server pair; `server` / `client` build the command (shimmed
/// or not, knobs).
fn run(
    ctl: &Ctl,
    seed: u64,
    mode: &str,
    server: impl FnOnce(&str) -> Cmd,
    client: impl FnOnce(&str) -> Cmd,
) -> Run {
    let common = |c: Cmd| {
        c.args(["--seed", &seed.to_string()])
            .args(["--mib", &MIB.to_string(), "--conns", &CONNS.to_string()])
            .args(["--mode", mode, "--timeout-s", "60"])
    };
    let mut srv = common(server(BIN).arg("server")).spawn();
    let line = srv.wait_line("listening ", Duration::from_secs(20));
    let port: u16 = line[10..].trim().parse().unwrap();
    let mut cli = common(client(BIN).arg("client"))
        .args(["--port", &port.to_string(), "--pause-ms", "300"])
        .spawn();
    let w = ctl.watch(&mut cli, Duration::from_secs(90));
    w.assert_ok(&format!("streamcheck client seed {seed} mode {mode}"));
    let (server_out, server_err) = srv.wait_ok(Duration::from_secs(30));
    let r = Run {
        client: w,
        server_out,
        server_err,
        port,
    };
    // Every byte was checked by the receivers; the hashes tie the two
    // processes' views together.
    let (c, s) = (
        streamcheck_hashes(&r.client.stdout),
        streamcheck_hashes(&r.server_out),
    );
    assert_eq!(c.len(), CONNS as usize, "client:\n{}", r.client.stdout);
    assert_eq!(s.len(), CONNS as usize, "server:\n{}", r.server_out);
    for ((c_sent, c_recv), (s_sent, s_recv)) in c.iter().zip(&s) {
        assert_eq!(c_sent, s_recv, "client->server hash (seed {seed})");
        assert_eq!(s_sent, c_recv, "server->client hash (seed {seed})");
    }
    assert!(r.client.stdout.contains("\nok") && r.server_out.contains("\nok"));
    r
}

fn shm_run(seed: u64, mode: &str, knobs: &[(&str, &str)]) -> Vec<(String, String)> {
    let ctl = Ctl::start();
    let with = |c: Cmd| knobs.iter().fold(c, |c, (k, v)| c.env(k, v));
    let r = run(
        &ctl,
        seed,
        mode,
        |b| with(ctl.shimmed(b)),
        |b| with(ctl.shimmed(b)),
    );
    assert_shim_silent("streamcheck client", &r.client.stderr);
    assert_shim_silent("streamcheck server", &r.server_err);
    let links = assert_all_shm(
        &format!("streamcheck seed {seed} mode {mode}"),
        &r.client.conns,
        r.port,
        CONNS as usize,
    );
    for l in &links {
        println!(
            "seed {seed} {mode} {knobs:?}: {l} c2s {} B s2c {} B",
            l.client.stat("c2s_bytes"),
            l.client.stat("s2c_bytes")
        );
    }
    streamcheck_hashes(&r.client.stdout)
}

#[test]
fn streamcheck_blocking_seed_1() {
    shm_run(1, "block", &[]);
}

#[test]
fn streamcheck_nonblocking_seed_2() {
    shm_run(2, "nonblock", &[]);
}

#[test]
fn streamcheck_mixed_seeds_3_to_5() {
    for seed in 3..=5 {
        shm_run(seed, "mixed", &[]);
    }
}

/// A small ring (512 slots of 64 B: 32 KiB) and no spinning: every large
/// write wraps the ring many times and every wait sleeps.
#[test]
fn streamcheck_small_ring_no_spin() {
    shm_run(
        6,
        "mixed",
        &[
            ("RINGSOCK_RING_SLOTS", "512"),
            ("RINGSOCK_SLOT_SIZE", "64"),
            ("RINGSOCK_SPIN_US", "0"),
        ],
    );
}

/// The smallest ring the knobs allow (64 slots of 64 B: 4 KiB). Before
/// b506e20 the shim did not clamp gamma/max_record_slots to slots/2 and a
/// ring under 512 slots silently stayed TCP.
#[test]
fn streamcheck_tiny_ring_no_spin() {
    shm_run(
        8,
        "mixed",
        &[
            ("RINGSOCK_RING_SLOTS", "64"),
            ("RINGSOCK_SLOT_SIZE", "64"),
            ("RINGSOCK_SPIN_US", "0"),
        ],
    );
}

/// Shimmed client, unshimmed server: TCP, and the same bytes (the same
/// hashes as over shm for the same seed).
#[test]
fn streamcheck_fallback_unshimmed_server() {
    let want = shm_run(7, "mixed", &[]);
    let ctl = Ctl::start();
    let r = run(&ctl, 7, "mixed", Cmd::plain, |b| ctl.shimmed(b));
    assert_eq!(
        streamcheck_hashes(&r.client.stdout),
        want,
        "same data as over shm"
    );
    assert_shim_silent("streamcheck client", &r.client.stderr);
    let mine: Vec<_> = r
        .client
        .conns
        .iter()
        .filter(|c| c.peer.port() == r.port)
        .collect();
    assert!(
        !mine.is_empty(),
        "the client's connections were never reported:\n{}",
        show(&r.client.conns)
    );
    for c in mine {
        assert!(
            c.transport == "tcp" && !c.reason.is_empty(),
            "expected tcp with a reason: {c}"
        );
    }
}
