//! A shimmed client puts itself under a seccomp filter in the middle of a
//! ring connection (tests/src/bin/seccomp_conn.rs): its rings are left
//! before the filter goes in, and the shim makes no call of its own after
//! it, so neither a strict allow-list that kills (OpenSSH's, with what a
//! client needs to connect) nor a service's filter stops it. Bytes echoed
//! before and after the filter, and over a connection made under it, must
//! all come back as sent; the connection is on a ring before the filter.

use std::time::Duration;

use ringsock_integration::{
    assert_shim_silent, out_field, payload, seccomp, sha256, Cmd, Ctl, TempDir,
};

const BIN: &str = env!("CARGO_BIN_EXE_seccomp_conn");
const SECCOMP_RUN: &str = env!("CARGO_BIN_EXE_seccomp_run");
const BYTES: usize = 1 << 20;

/// Whether systemd-analyze can spell @system-service here (else SKIP).
fn have_system_service() -> bool {
    let have = seccomp::system_service_filter().is_some();
    if !have {
        println!("SKIP: no systemd-analyze (or asm/unistd_64.h) to spell @system-service");
    }
    have
}

fn run(filter: &str, extra: &[&str]) {
    run_as(filter, extra, |ctl| ctl.shimmed(BIN));
}

/// `run`, each process started by `start` (the shimmed program, or a
/// runner that execs it).
fn run_as(filter: &str, extra: &[&str], start: impl Fn(&Ctl) -> Cmd) {
    let ctl = Ctl::start();
    let dir = TempDir::new("seccomp_conn");
    let go = dir.path().join("go");
    let mut echo = start(&ctl).arg("echo").spawn();
    let line = echo.wait_line("listening ", Duration::from_secs(10));
    let port: u16 = line["listening ".len()..].trim().parse().unwrap();
    let mut client = start(&ctl)
        .args(["client", "--port", &port.to_string(), "--bytes"])
        .arg(BYTES.to_string())
        .arg("--go")
        .arg(&go)
        .args(["--filter", filter])
        .args(extra)
        .spawn();
    let links = ctl.wait_links(port, 1, Duration::from_secs(60));
    assert!(
        links.iter().all(|l| l.is_shm()),
        "not on a ring before the filter: {links:?}"
    );
    std::fs::write(&go, b"").unwrap();
    let (out, err, eerr) = client.wait_ok_beside(&mut echo, Duration::from_secs(120));
    let mut all = payload(BYTES, 0x5ecc_0a11);
    all.extend(payload(BYTES, 0x5ecc_0a12));
    all.extend(payload(BYTES, 0x5ecc_0a13));
    assert_eq!(
        out_field(&out, "echoed"),
        [all.len().to_string(), sha256::hex(&all)]
    );
    assert_shim_silent("sandboxed client", &err);
    assert_shim_silent("echo server", &eerr);
}

/// sshd's allow-list, anything else kills; installed by prctl for the
/// calling thread.
#[test]
fn strict_filter_that_kills() {
    run("sshd", &[]);
}

/// The same, for every thread at once (seccomp(2), TSYNC): the shim's own
/// thread is under it too.
#[test]
fn strict_filter_that_kills_every_thread() {
    run("sshd", &["--tsync"]);
}

/// The allow-list failing the rest with EPERM.
#[test]
fn strict_filter_that_fails_calls() {
    run("sshd", &["--errno", "--tsync"]);
}

/// A service's filter (systemd's @system-service): only exotic calls fail.
#[test]
fn system_service_filter() {
    if have_system_service() {
        run("service", &[]);
    }
}

/// The same, and the new connection is made by a child forked under the
/// filter (the shim's fork hook and handlers pass through there too).
#[test]
fn system_service_filter_then_fork() {
    if have_system_service() {
        run("service", &["--fork", "--tsync"]);
    }
}

/// Both ends started under @system-service, as systemd starts a service
/// (the filter is there before the shim loads): the shim's own calls are
/// all allowed, so the connection is on a ring, and every byte arrives.
#[test]
fn started_under_system_service_keeps_its_rings() {
    if have_system_service() {
        run_as("none", &[], |ctl| {
            ctl.shimmed(SECCOMP_RUN)
                .args(["@system-service", "--", BIN])
        });
    }
}
