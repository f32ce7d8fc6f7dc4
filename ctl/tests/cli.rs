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
    let out = Command::new(BIN)
        .args(["status", "--json", "--socket"])
        .arg(&d.socket)
        .output()
        .unwrap();
    let json = String::from_utf8(out.stdout).unwrap();
    assert_eq!(json.matches("\"session\":").count(), 100);
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
