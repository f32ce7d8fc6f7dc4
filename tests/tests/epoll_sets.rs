//! Readiness with several threads, each waiting on its own epoll set, and
//! connections handed between the sets (haproxy `nbthread`, nginx thread
//! pools, memcached `-t N`). Helper: `epollmove` (tests/src/bin): its
//! server's workers wait without a timeout, so a registration the shim
//! misses stalls the connection, and both sides give up after 30 s
//! without progress; every frame's bytes are checked.

use std::time::Duration;

use ringsock_integration::{assert_all_shm, assert_shim_silent, out_field, Ctl};

const EPOLLMOVE: &str = env!("CARGO_BIN_EXE_epollmove");

/// Runs `epollmove server ARGS` and a client (16 connections, 150 frames
/// each), both under the shim; checks both counted every frame and byte,
/// and that every connection was on a ring.
fn hand_over(server_args: &[&str]) {
    let ctl = Ctl::start();
    let mut srv = ctl
        .shimmed(EPOLLMOVE)
        .arg("server")
        .args(server_args)
        .spawn();
    let line = srv.wait_line("listening ", Duration::from_secs(10));
    let port: u16 = line[10..].trim().parse().unwrap();
    let mut cli = ctl
        .shimmed(EPOLLMOVE)
        .args(["client", "--port", &port.to_string()])
        .args(["--conns", "16", "--rounds", "150"])
        .spawn();
    let w = ctl.watch(&mut cli, Duration::from_secs(90));
    w.assert_ok("epollmove client");
    let (sout, serr) = srv.wait_ok(Duration::from_secs(40));
    assert_shim_silent("client", &w.stderr);
    assert_shim_silent("server", &serr);
    let (c, s) = (out_field(&w.stdout, "frames"), out_field(&sout, "frames"));
    println!("{server_args:?}: client {c:?}, server {s:?}");
    assert_eq!(c, s, "frames and bytes, client and server");
    assert_eq!(c[0], (16 * 150).to_string());
    assert_all_shm("epollmove", &w.conns, port, 16);
}

#[test]
fn level_triggered_connections_move_between_sets() {
    hand_over(&["--threads", "4", "--events", "lt"]);
}

#[test]
fn edge_triggered_connections_move_between_sets() {
    hand_over(&["--threads", "4", "--events", "et"]);
}

#[test]
fn oneshot_connections_move_between_sets() {
    hand_over(&["--threads", "4", "--events", "oneshot"]);
}

#[test]
fn mixed_registrations_in_five_kinds_of_sets() {
    // Five workers: sets from epoll_create, epoll_create1, syscall(2),
    // dup(2) and F_DUPFD; each registration's kind follows the frame.
    hand_over(&["--threads", "5", "--events", "mixed"]);
}

#[test]
fn sets_made_before_fork_serve_in_the_child() {
    hand_over(&["--threads", "3", "--events", "mixed", "--fork"]);
}

#[test]
fn a_set_inside_another_set_reports_through_it() {
    // The last worker sleeps on an outer set holding its own set: the
    // kernel must see its set readable while a ring registration in it
    // has something to report.
    hand_over(&["--threads", "3", "--events", "mixed", "--nest"]);
}
