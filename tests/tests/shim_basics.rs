//! The shim loads, reports bad knobs in one line each without breaking the
//! program, honours RINGSOCK_LOG / RINGSOCK_LOG_FILE / RINGSOCK_DISABLE.

use std::time::Duration;

use ringsock_integration::{require, Cmd, TempDir};

const T: Duration = Duration::from_secs(10);

#[test]
fn loads_and_logs_at_debug() {
    require!("echo");
    let (out, err) = Cmd::shimmed("echo")
        .arg("hi")
        .env("RINGSOCK_LOG", "debug")
        .run_ok(T);
    assert_eq!(out, "hi\n");
    let loaded: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("debug: loaded"))
        .collect();
    assert_eq!(loaded.len(), 1, "{err}");
    let pid_prefix = loaded[0].split(']').next().unwrap();
    assert!(
        pid_prefix.starts_with("ringsock[") && pid_prefix[9..].parse::<u32>().is_ok(),
        "{err}"
    );
}

#[test]
fn silent_by_default() {
    require!("echo");
    let (out, err) = Cmd::shimmed("echo").arg("quiet").run_ok(T);
    assert_eq!(out, "quiet\n");
    assert_eq!(err, "");
}

#[test]
fn bad_knobs_give_one_line_each_and_the_program_runs() {
    require!("echo");
    let (out, err) = Cmd::shimmed("echo")
        .arg("still works")
        .env("RINGSOCK_RING_SLOTS", "3000")
        .env("RINGSOCK_SPIN_US", "-5")
        .env("RINGSOCK_LOG", "chatty")
        .env("RINGSOCK_EXCLUDE_PORTS", "80-")
        .env("RINGSOCK_INCLUDE_NETS", "10.0.0.0/40")
        .env("RINGSOCK_ALPHA", "💥")
        .run_ok(T);
    assert_eq!(out, "still works\n");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 6, "{err}");
    for (var, default) in [
        ("RINGSOCK_RING_SLOTS=\"3000\"", "using default 4096"),
        ("RINGSOCK_SPIN_US=\"-5\"", "using default 50"),
        ("RINGSOCK_LOG=\"chatty\"", "using default warn"),
        ("RINGSOCK_EXCLUDE_PORTS=\"80-\"", "using default (none)"),
        (
            "RINGSOCK_INCLUDE_NETS=\"10.0.0.0/40\"",
            "using default (none)",
        ),
        ("RINGSOCK_ALPHA=\"💥\"", "using default 16"),
    ] {
        assert!(
            lines
                .iter()
                .any(|l| l.contains(var) && l.ends_with(default)),
            "no line for {var} ending in `{default}`:\n{err}"
        );
    }
}

#[test]
fn log_file_receives_the_lines() {
    require!("echo");
    let dir = TempDir::new("logfile");
    let log = dir.path().join("shim.log");
    let (out, err) = Cmd::shimmed("echo")
        .arg("x")
        .env("RINGSOCK_LOG", "debug")
        .env("RINGSOCK_LOG_FILE", &log)
        .run_ok(T);
    assert_eq!(out, "x\n");
    assert_eq!(err, "", "nothing on stderr when a log file is set");
    let text = std::fs::read_to_string(&log).expect("log file written");
    assert!(text.contains("debug: loaded"), "{text}");
}

#[test]
fn disabled_shim_passes_everything_through() {
    require!("python3");
    let script = "import socket\n\
        l = socket.socket(); l.bind(('127.0.0.1', 0)); l.listen()\n\
        c = socket.create_connection(l.getsockname()); a, _ = l.accept()\n\
        c.sendall(b'ping'); print(a.recv(4).decode())";
    let (out, err) = Cmd::shimmed("python3")
        .args(["-c", script])
        .env("RINGSOCK_DISABLE", "1")
        .run_ok(T);
    assert_eq!(out, "ping\n");
    assert_eq!(err, "");
}

/// The kernel grows a descriptor table that threads share only after an
/// RCU grace period (milliseconds): the shim grows it over its own range
/// at the first TCP socket, not at the first connection that needs one of
/// its descriptors (fdspace::reserve).
#[test]
fn the_first_tcp_socket_grows_the_fd_table_over_the_shims_range() {
    require!("python3");
    let script = "import resource, socket\n\
        def size():\n    return int(next(l for l in open('/proc/self/status') if l.startswith('FDSize:')).split()[1])\n\
        resource.setrlimit(resource.RLIMIT_NOFILE, (4096, 4096))\n\
        before = size()\n\
        s = socket.socket()\n\
        print(before, size())\n";
    let sizes = |out: &str| -> (u32, u32) {
        let v: Vec<u32> = out.split_whitespace().map(|x| x.parse().unwrap()).collect();
        (v[0], v[1])
    };
    // The shim's range starts at 3/4 of the soft limit: 3072.
    let (out, _) = Cmd::shimmed("python3").arg("-c").arg(script).run_ok(T);
    let (before, after) = sizes(&out);
    assert!(before <= 3072, "{out}");
    assert!(
        after > 3072,
        "the table does not cover fd 3072 after a TCP socket: {out}"
    );
    let (out, _) = Cmd::plain("python3").arg("-c").arg(script).run_ok(T);
    let (_, plain) = sizes(&out);
    assert!(
        plain <= 3072,
        "without the shim the table stays small: {out}"
    );
}
