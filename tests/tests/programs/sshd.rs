//! sshd and scp: a private sshd (its own config, a generated host key and
//! user key, a free port; privilege separation and the seccomp sandbox
//! as Debian ships them) under the shim, and scp (which runs ssh) under
//! the shim copying an 8 MiB file up and back down; the checksums must
//! match.
//!
//! As Debian runs it, sshd re-executes itself for every connection: the
//! connection leaves the ring at that exec and goes on over TCP. With
//! `-r` (no re-exec) the forked child keeps the ring, and so does the
//! pre-authentication child it forks and sandboxes.

use std::path::Path;
use std::time::Duration;

use ringsock_integration::matrix::Matrix;
use ringsock_integration::{
    assert_shim_silent, free_port, payload, require, sha256, wait_port, Cmd, Server, TempDir,
};

use crate::support::{daemon_bin, is_root};

/// Writes the config, keys and authorized_keys into `dir`; returns the
/// config's path and the user key's.
fn setup(dir: &TempDir, port: u16) -> (std::path::PathBuf, std::path::PathBuf) {
    let d = dir.path();
    for key in ["host_key", "user_key"] {
        Cmd::plain("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-f"])
            .arg(d.join(key))
            .run_ok(Duration::from_secs(30));
    }
    std::fs::copy(d.join("user_key.pub"), d.join("authorized_keys")).unwrap();
    let conf = format!(
        "Port {port}\nListenAddress 127.0.0.1\nHostKey {d}/host_key\nPidFile none\n\
         AuthorizedKeysFile {d}/authorized_keys\nStrictModes no\nUsePAM no\n\
         PasswordAuthentication no\nKbdInteractiveAuthentication no\n\
         PermitRootLogin prohibit-password\nSubsystem sftp internal-sftp\nLogLevel INFO\n",
        d = d.display()
    );
    (
        dir.write("sshd_config", conf.as_bytes()),
        d.join("user_key"),
    )
}

/// scp FROM TO with the test's key and no host key checks; sshd's log
/// comes with a failure.
fn scp(m: &mut Matrix, sshd: &Server, key: &Path, port: u16, from: &str, to: &str) {
    let w = m.run(
        m.ctl
            .shimmed("scp")
            .arg("-i")
            .arg(key)
            .args(["-P", &port.to_string(), "-q"])
            .args([
                "-o",
                "StrictHostKeyChecking=no",
                "-o",
                "UserKnownHostsFile=/dev/null",
            ])
            .args(["-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes"])
            .args([from, to]),
        Duration::from_secs(120),
    );
    if !w.status.is_some_and(|s| s.success()) {
        let (o, e) = sshd.output();
        println!("sshd's output:\n{o}{e}");
    }
    w.assert_ok(&format!("scp {from} {to}"));
    assert_shim_silent("scp", &w.stderr);
    let ends: Vec<String> = w
        .conns
        .iter()
        .filter(|c| c.peer.port() == port || c.local.port() == port)
        .map(|c| c.to_string())
        .collect();
    println!("scp {from} -> {to}: ends seen {ends:?}");
    // Made on a ring (status keeps the ring's number after a leave).
    assert!(
        w.conns
            .iter()
            .any(|c| c.peer.port() == port && c.ring.is_some()),
        "scp {from} {to}: ssh's connection was not made on a ring: {ends:?}"
    );
}

fn copy_both_ways(no_reexec: bool) {
    require!("scp", "ssh", "ssh-keygen");
    let Some(sshd) = daemon_bin("sshd") else {
        println!("SKIP: `sshd` is not installed; install openssh-server to run this test");
        return;
    };
    if is_root() {
        // Privilege separation's empty chroot (made by the package's
        // service unit, which the tests do not run).
        std::fs::create_dir_all("/run/sshd").expect("/run/sshd");
    }
    let mut m = Matrix::new();
    let dir = TempDir::new("sshd");
    let port = free_port();
    let (conf, key) = setup(&dir, port);
    let data = payload(8 << 20, 81);
    let up = dir.write("up.bin", &data);
    let mut server = m.serve(
        m.ctl
            .shimmed(&sshd)
            .args(["-D", "-e", "-f"])
            .arg(&conf)
            .args(if no_reexec { &["-r"][..] } else { &[] }),
    );
    wait_port(&mut server, port, Duration::from_secs(20));
    let user = std::env::var("USER").unwrap_or_else(|_| {
        if is_root() {
            "root".into()
        } else {
            "nobody".into()
        }
    });
    let remote = dir.path().join("remote.bin");
    let down = dir.path().join("down.bin");
    scp(
        &mut m,
        &server,
        &key,
        port,
        up.to_str().unwrap(),
        &format!("{user}@127.0.0.1:{}", remote.display()),
    );
    scp(
        &mut m,
        &server,
        &key,
        port,
        &format!("{user}@127.0.0.1:{}", remote.display()),
        down.to_str().unwrap(),
    );
    for (what, p) in [("uploaded", &remote), ("downloaded", &down)] {
        sha256::assert_file(what, p, &data);
    }
    let errs = m.finish("sshd", vec![server]);
    assert_shim_silent("sshd", &errs[0]);
}

/// sshd's listener accepts on a ring, forks, and the child re-executes
/// sshd, leaving the ring before the client has seen the server's
/// decision: the client reads the leave header as one (not as the
/// server's first bytes) and both ends go on over TCP.
#[test]
fn sshd_scp_both_ways() {
    copy_both_ways(false);
}

/// The forked child keeps the ring; the pre-authentication child it forks
/// leaves it as it sandboxes itself (seccomp, a descriptor limit of 1),
/// and from then on the shim makes no call of its own there; the monitor
/// and the child serving the session follow it over TCP.
#[test]
fn sshd_without_reexec_scp_both_ways() {
    copy_both_ways(true);
}
