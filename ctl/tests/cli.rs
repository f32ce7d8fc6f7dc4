//! The binary's commands end to end: daemon start-up rules, status output,
//! run's LD_PRELOAD handling.

mod common;

use std::fs;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixListener;
use std::process::Command;

use common::*;
use ringsock_proto::{Msg, Transport};

#[test]
fn second_daemon_on_the_same_socket_refuses() {
    let d = Daemon::start();
    let out = Command::new(BIN)
        .args(["daemon", "--foreground", "--socket"])
        .arg(&d.socket)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("already running"), "{err}");
    // The first one is unharmed.
    let mut c = d.session();
    assert!(matches!(
        call(&mut c, &Msg::Status { after: None }, &[]).0,
        Msg::StatusReply { .. }
    ));
}

#[test]
fn stale_socket_is_replaced_and_sigterm_cleans_up() {
    let dir = TempDir::new();
    let path = dir.path("ctl.sock");
    // A socket file nobody listens on any more (a daemon that was killed).
    drop(UnixListener::bind(&path).unwrap());
    assert!(file_exists(&path));
    let mut child = Command::new(BIN)
        .args(["daemon", "--foreground", "--socket"])
        .arg(&path)
        .stderr(fs::File::create(dir.path("log")).unwrap())
        .spawn()
        .unwrap();
    wait_until("daemon start", || {
        ringsock_proto::Client::connect(&path, None).is_ok()
    });
    // SAFETY: kill(2) on our own child.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    assert!(child.wait().unwrap().success());
    assert!(!file_exists(&path), "socket file left behind");
    let log = fs::read_to_string(dir.path("log")).unwrap();
    assert!(log.contains("removed stale socket"), "{log}");
    assert!(log.contains("received SIGTERM"), "{log}");
}

#[test]
fn refuses_to_replace_a_non_socket() {
    let dir = TempDir::new();
    let path = dir.path("ctl.sock");
    fs::write(&path, b"precious").unwrap();
    let out = Command::new(BIN)
        .args(["daemon", "--foreground", "--socket"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a socket"));
    assert_eq!(fs::read(&path).unwrap(), b"precious");
}

#[test]
fn socket_permissions() {
    use std::os::unix::fs::PermissionsExt;
    let d = Daemon::start();
    let mode = fs::metadata(&d.socket).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o666);
    let dir_mode = fs::metadata(d.socket.parent().unwrap())
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(dir_mode, 0o755);
}

#[test]
fn background_daemon_detaches_and_serves() {
    let dir = TempDir::new();
    let path = dir.path("ctl.sock");
    let status = Command::new(BIN)
        .args(["daemon", "--socket"])
        .arg(&path)
        .stderr(fs::File::create(dir.path("log")).unwrap())
        .status()
        .unwrap();
    assert!(status.success());
    // Ready as soon as the parent returned; SO_PEERCRED names the detached
    // process (it, not the parent, called listen()).
    let mut c = ringsock_proto::Client::connect(&path, None).unwrap();
    c.hello("t").unwrap();
    let pid = ringsock_proto::io::peer_cred(c.as_raw_fd()).unwrap().pid;
    assert!(dir.path("log").exists());
    let log = fs::read_to_string(dir.path("log")).unwrap();
    assert!(log.contains(&format!("pid {pid})")), "{log}");

    // A second background start fails in the parent, with the reason.
    let out = Command::new(BIN)
        .args(["daemon", "--socket"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.matches("already running").count(), 1, "{err}");

    // SAFETY: kill(2) on the daemon we started.
    unsafe {
        libc::kill(pid as i32, libc::SIGTERM);
    }
    wait_until("socket removal", || !file_exists(&path));
}

#[test]
fn status_json_lists_reports() {
    let d = Daemon::start();
    let mut shim = d.session();
    let ring = memfd(8192, true);
    let report = Msg::ConnReport {
        fd: 11,
        local: "127.0.0.1:40000".parse().unwrap(),
        peer: "127.0.0.1:6379".parse().unwrap(),
        transport: Transport::Shm,
        reason: "peer \"shim\" answered".into(),
        ring: Some(77),
    };
    assert_eq!(call(&mut shim, &report, &[ring.as_raw_fd()]).0, Msg::Ok);
    let plain = Msg::ConnReport {
        fd: 12,
        local: "127.0.0.1:40001".parse().unwrap(),
        peer: "127.0.0.1:80".parse().unwrap(),
        transport: Transport::Tcp,
        reason: "no listener".into(),
        ring: None,
    };
    assert_eq!(call(&mut shim, &plain, &[]).0, Msg::Ok);

    let out = Command::new(BIN)
        .args(["status", "--json", "--socket"])
        .arg(&d.socket)
        .output()
        .unwrap();
    assert!(out.status.success());
    let json = String::from_utf8(out.stdout).unwrap();
    let pid = std::process::id();
    assert!(json.starts_with("{\"connections\":["), "{json}");
    assert!(json.contains(&format!("\"pid\":{pid},")), "{json}");
    assert!(json.contains("\"fd\":11,"), "{json}");
    assert!(json.contains("\"local\":\"127.0.0.1:40000\""), "{json}");
    assert!(json.contains("\"transport\":\"shm\""), "{json}");
    assert!(
        json.contains("\"reason\":\"peer \\\"shim\\\" answered\""),
        "{json}"
    );
    assert!(
        json.contains("\"ring\":{\"id\":77,\"stats\":{\"memfd_size\":8192,\"mapped\":1}}"),
        "{json}"
    );
    assert!(json.contains("\"transport\":\"tcp\""), "{json}");
    assert!(json.contains("\"ring\":null"), "{json}");

    let out = Command::new(BIN)
        .args(["status", "--socket"])
        .arg(&d.socket)
        .output()
        .unwrap();
    let table = String::from_utf8(out.stdout).unwrap();
    assert!(table.contains("memfd_size=8192"), "{table}");
    assert!(table.contains("no listener"), "{table}");

    // Closing the connection removes it; the session ending removes all.
    let closed = Msg::ConnClosed {
        fd: 12,
        local: "127.0.0.1:40001".parse().unwrap(),
        peer: "127.0.0.1:80".parse().unwrap(),
    };
    assert_eq!(call(&mut shim, &closed, &[]).0, Msg::Ok);
    drop(shim);
    wait_until("reports to die with the session", || {
        let out = Command::new(BIN)
            .args(["status", "--json", "--socket"])
            .arg(&d.socket)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout) == "{\"connections\":[]}\n"
    });
}

#[test]
fn status_pages_through_many_reports() {
    let d = Daemon::start();
    let mut shim = d.session();
    for fd in 0..100 {
        let report = Msg::ConnReport {
            fd,
            local: "127.0.0.1:1".parse().unwrap(),
            peer: "127.0.0.1:2".parse().unwrap(),
            transport: Transport::Tcp,
            reason: String::new(),
            ring: None,
        };
        assert_eq!(call(&mut shim, &report, &[]).0, Msg::Ok);
    }
    let conns = status_conns(&d.socket);
    let fds: Vec<i32> = conns.iter().map(|c| c.fd).collect();
    assert_eq!(fds, (0..100).collect::<Vec<i32>>());
}

#[test]
fn status_without_daemon() {
    let dir = TempDir::new();
    let out = Command::new(BIN)
        .args(["status", "--socket"])
        .arg(dir.path("none.sock"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no daemon"));
}

#[test]
fn bad_log_level_warns_and_uses_default() {
    let dir = TempDir::new();
    let path = dir.path("ctl.sock");
    let mut child = Command::new(BIN)
        .args(["daemon", "--foreground", "--log-level", "loud", "--socket"])
        .arg(&path)
        .stderr(fs::File::create(dir.path("log")).unwrap())
        .spawn()
        .unwrap();
    // The start-up line comes once the event loop is set up.
    wait_until("daemon start", || {
        fs::read_to_string(dir.path("log")).is_ok_and(|l| l.contains("listening on"))
    });
    let _ = child.kill();
    let _ = child.wait();
    let log = fs::read_to_string(dir.path("log")).unwrap();
    assert!(log.contains("invalid --log-level value \"loud\""), "{log}");
    assert!(log.contains("INFO"), "{log}");
}

#[test]
fn run_prepends_the_shim_to_ld_preload() {
    let dir = TempDir::new();
    let lib = dir.path("libringsock.so");
    fs::write(&lib, b"").unwrap();
    let out = Command::new(BIN)
        .args(["run", "--lib"])
        .arg(&lib)
        .args(["--", "sh", "-c", "printf %s \"$LD_PRELOAD\""])
        .env("LD_PRELOAD", "")
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout), lib.to_str().unwrap());

    // Missing library: a clear error, nothing executed.
    let out = Command::new(BIN)
        .args(["run", "--lib", "/nonexistent/libringsock.so", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not found"));

    // Command not found: the shell's 127.
    let out = Command::new(BIN)
        .args(["run", "--lib"])
        .arg(&lib)
        .arg("/nonexistent/cmd")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(127));
}

/// `status --json` of the daemon at `socket`.
fn status_json(socket: &std::path::Path) -> String {
    let out = Command::new(BIN)
        .args(["status", "--json", "--socket"])
        .arg(socket)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap()
}

fn status_with(socket: &std::path::Path, args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(BIN)
        .args(["status", "--socket"])
        .arg(socket)
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn report(fd: i32, local: &str, peer: &str, transport: Transport) -> Msg {
    Msg::ConnReport {
        fd,
        local: local.parse().unwrap(),
        peer: peer.parse().unwrap(),
        transport,
        reason: if transport == Transport::Tcp {
            "no listener".into()
        } else {
            String::new()
        },
        ring: None,
    }
}

#[test]
fn status_expect_selects_counts_and_says_why() {
    let d = Daemon::start();
    let mut shim = d.session();
    for (fd, local, peer, t) in [
        (3, "127.0.0.1:41000", "127.0.0.1:6379", Transport::Shm),
        (4, "127.0.0.1:6379", "127.0.0.1:41000", Transport::Shm),
        (5, "127.0.0.1:41001", "127.0.0.1:80", Transport::Tcp),
    ] {
        assert_eq!(call(&mut shim, &report(fd, local, peer, t), &[]).0, Msg::Ok);
    }
    let (code, out, _) = status_with(
        &d.socket,
        &["--port", "6379", "--expect", "transport=shm,ends=2"],
    );
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.starts_with(
            "transport=shm,ends=2 holds for the connection ends on port 6379: 2 ends, all on shm\n"
        ),
        "{out}"
    );
    let (code, out, _) = status_with(&d.socket, &["--expect", "transport=shm"]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("3 ends, 1 not on shm"), "{out}");
    assert!(
        out.lines()
            .nth(1)
            .unwrap()
            .contains("tcp 127.0.0.1:41001 <-> 127.0.0.1:80"),
        "{out}"
    );
    let pid = std::process::id().to_string();
    let (code, out, _) = status_with(
        &d.socket,
        &["--pid", &pid, "--transport", "tcp", "--expect", "ends=1"],
    );
    assert_eq!(code, Some(0), "{out}");
    let (code, out, _) = status_with(&d.socket, &["--count"]);
    assert_eq!((code, out.as_str()), (Some(0), "rdma=0,tcp=1,shm=2\n"));
    let (code, out, _) = status_with(&d.socket, &["--port", "80", "--json"]);
    assert_eq!(code, Some(0));
    let conns = ringsock_integration::status::parse(&out).unwrap();
    assert_eq!(conns.len(), 1, "{out}");
    assert_eq!(conns[0].peer.port(), 80);
    // A bad expectation is a usage error.
    let (code, _, err) = status_with(&d.socket, &["--expect", "ends>=many"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("not an unsigned number"), "{err}");
}

#[test]
fn status_wait_ms_polls_until_the_expectation_holds() {
    let d = Daemon::start();
    let waiter = Command::new(BIN)
        .args(["status", "--socket"])
        .arg(&d.socket)
        .args(["--port", "7000", "--expect", "ends=1", "--wait-ms", "60000"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Not reported yet: the waiter keeps asking.
    let mut shim = d.session();
    assert!(status_conns(&d.socket).is_empty());
    let r = report(3, "127.0.0.1:41000", "127.0.0.1:7000", Transport::Rdma);
    assert_eq!(call(&mut shim, &r, &[]).0, Msg::Ok);
    let out = waiter.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("ends=1 holds"), "{text}");

    // An expectation that never holds fails once the wait is over.
    let (code, out, _) = status_with(&d.socket, &["--expect", "ends=5", "--wait-ms", "300"]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("1 end (want ends=5)"), "{out}");
}

#[test]
fn status_expect_without_daemon_fails_after_the_wait() {
    let dir = TempDir::new();
    let (code, _, err) = status_with(
        &dir.path("none.sock"),
        &["--expect", "ends=0", "--wait-ms", "200"],
    );
    assert_eq!(code, Some(1));
    assert!(err.contains("no daemon"), "{err}");
}

#[test]
fn status_from_saved_samples() {
    let d = Daemon::start();
    let mut shim = d.session();
    let dir = TempDir::new();
    let file = dir.path("samples");
    let mut text = status_json(&d.socket);
    assert_eq!(text, "{\"connections\":[]}\n");
    let r = report(3, "127.0.0.1:41000", "127.0.0.1:7209", Transport::Rdma);
    assert_eq!(call(&mut shim, &r, &[]).0, Msg::Ok);
    text.push_str(&status_json(&d.socket));
    text.push('\n');
    text.push_str(&status_json(&d.socket));
    fs::write(&file, &text).unwrap();
    let from = |args: &[&str]| {
        let out = Command::new(BIN)
            .args(["status", "--from"])
            .arg(&file)
            .args(args)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let (code, out) = from(&["--port", "7209", "--expect", "transport=rdma,ends=1"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("1 end, all on rdma; 3 samples"), "{out}");
    let (code, out) = from(&["--count"]);
    assert_eq!((code, out.as_str()), (Some(0), "rdma=1,tcp=0,shm=0\n"));
    let (code, out) = from(&["--port", "7209"]);
    assert_eq!(code, Some(0));
    assert!(out.contains("127.0.0.1:41000"), "{out}");
    let (code, out) = from(&["--counter", "zc_writes>=1", "--expect", "ends>=1"]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("highest zc_writes absent"), "{out}");
}
