//! A program that exits with a ring connection still open (no close) must
//! not lose what it wrote: the kernel delivers a socket's bytes after its
//! process exits, through `exit` and `_exit` alike. Under the shim the
//! last small writes may sit in an open batch when the process leaves;
//! the atexit handler and the `_exit`/`_Exit` hooks flush every ring the
//! process uses (`lifecycle::drain_at_exit`).
//!
//! `exitsend` (tests/src/bin/exitsend.rs) writes 2 MiB in 100-byte writes
//! and exits without closing; the reader's byte count and FNV hash must
//! match the writer's. Over verbs the same runs in the guest
//! (scripts/softroce-vm.d/quiet.sh).

use std::time::Duration;

use ringsock_integration::{free_port, Ctl};

const BIN: &str = env!("CARGO_BIN_EXE_exitsend");

fn exits_with_open_socket(how: &str) {
    let ctl = Ctl::start();
    let port = free_port();
    let p = port.to_string();
    let host = ["--host", "127.0.0.1", "--port", &p];
    let mut srv = ctl.shimmed(BIN).arg("server").args(host).spawn();
    srv.wait_line("listening", Duration::from_secs(20));
    let mut cli = ctl
        .shimmed(BIN)
        .arg("client")
        .args(host)
        .args(["--bytes", "2097152", "--chunk", "100", "--pause-ms", "300"])
        .args(["--how", how])
        .spawn();
    let links = ctl.wait_links(port, 1, Duration::from_secs(15));
    assert!(
        links.iter().all(|l| l.is_shm()),
        "{how}: the connection is not on a shm ring: {links:?}"
    );
    let (out, err) = cli.wait_ok(Duration::from_secs(30));
    let sent = out
        .lines()
        .find_map(|l| l.strip_prefix("sent "))
        .unwrap_or_else(|| panic!("{how}: the writer did not finish: {out}{err}"))
        .to_string();
    let (out, err) = srv.wait_ok(Duration::from_secs(20));
    let got = out
        .lines()
        .find_map(|l| l.strip_prefix("got "))
        .unwrap_or_else(|| panic!("{how}: the reader did not reach EOF: {out}{err}"));
    assert_eq!(
        got, sent,
        "{how}: the reader got (bytes, hash) {got}, the writer sent {sent}"
    );
}

#[test]
fn bytes_written_before_exit_arrive() {
    exits_with_open_socket("exit");
}

#[test]
fn bytes_written_before_underscore_exit_arrive() {
    exits_with_open_socket("_exit");
}
