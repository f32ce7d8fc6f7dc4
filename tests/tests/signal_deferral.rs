//! A program's signal handler never runs inside the shim's own code
//! (preload/src/interpose/defer.rs), with tests/tests/c/sigdefer.c, a C
//! program built here with cc (longjmp out of a handler, as iperf3 does,
//! has no Rust spelling):
//! * its handlers, as sigaction, signal(3), sysv_signal, sigset,
//!   siginterrupt and rt_sigaction through syscall(2) install and report
//!   them and as they run, are exactly what they are without the shim;
//! * a handler that writes on a ring connection while the main thread is
//!   inside long sends on it: every byte arrives, each handler message
//!   whole, between runs of the main thread's bytes in order, and the
//!   connection stays on the ring;
//! * a handler that longjmps out of a blocking recv, a blocking send or a
//!   loop of nonblocking calls on a ring connection and then writes on it
//!   and exits: no hang, its bytes arrive last and whole;
//! * a real iperf3 client interrupted by SIGTERM mid-test: the server hears
//!   the client's termination, and both exit;
//! * a blocking recv or send on a ring interrupted by a handler is restarted
//!   exactly when the kernel restarts it: by that handler's SA_RESTART
//!   (another handler without it changes nothing), never with SO_RCVTIMEO.

use std::path::PathBuf;
use std::time::Duration;

use ringsock_integration::{
    assert_shim_silent, free_port, require, which, Cmd, Ctl, Server, TempDir,
};

/// Builds sigdefer.c into `dir`; None (and a SKIP line) without cc.
fn build(dir: &TempDir) -> Option<PathBuf> {
    if which("cc").is_none() {
        println!("SKIP: no C compiler (cc) to build tests/tests/c/sigdefer.c");
        return None;
    }
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/c/sigdefer.c");
    let bin = dir.path().join("sigdefer");
    let out = std::process::Command::new("cc")
        .args(["-O1", "-w", "-pthread", "-o"])
        .arg(&bin)
        .arg(src)
        .output()
        .expect("cc runs");
    assert!(
        out.status.success(),
        "cc failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(bin)
}

fn path(p: &std::path::Path) -> &str {
    p.to_str().expect("a UTF-8 temp path")
}

#[test]
fn handlers_read_back_as_without_the_shim() {
    let dir = TempDir::new("sigdefer_actions");
    let Some(bin) = build(&dir) else { return };
    let (plain, _) = Cmd::plain(path(&bin))
        .arg("actions")
        .run_ok(Duration::from_secs(20));
    let (shimmed, err) = Cmd::shimmed(path(&bin))
        .arg("actions")
        .run_ok(Duration::from_secs(20));
    assert_shim_silent("sigdefer actions", &err);
    assert!(
        plain.contains("done"),
        "incomplete without the shim:\n{plain}"
    );
    assert_eq!(shimmed, plain, "the shim changed what the program sees");
    // Pinned, so that a probe that checks nothing cannot pass.
    for line in [
        "siginfo hits=1 value=42 code=-1 self=1",
        "replaced: old=h_info old_flags_siginfo=1 old_restart=1",
        "oneshot ran=1",
        "signal second old=h_plain",
        "raw query rc=0 handler=h_other flags_siginfo=0",
        "raw ran=1",
    ] {
        assert!(
            shimmed.lines().any(|l| l == line),
            "missing `{line}` in:\n{shimmed}"
        );
    }
    assert!(
        shimmed
            .lines()
            .any(|l| l.starts_with("after oneshot: handler=SIG_DFL")),
        "SA_RESETHAND did not reset:\n{shimmed}"
    );
}

#[test]
fn a_handler_writes_whole_messages_between_long_sends() {
    let dir = TempDir::new("sigdefer_burst");
    let Some(bin) = build(&dir) else { return };
    let ctl = Ctl::start();
    const BYTES: u64 = 256 << 20;
    const SIGNALS: u64 = 40;
    let port = free_port();
    let go = dir.path().join("go");
    let total = (BYTES + 64 * SIGNALS).to_string();
    let mut sink = ctl
        .shimmed(path(&bin))
        .args(["sink", &total, &SIGNALS.to_string(), &port.to_string()])
        .spawn();
    sink.wait_line("listening", Duration::from_secs(20));
    let mut client = ctl
        .shimmed(path(&bin))
        .args(["burst", &port.to_string(), &BYTES.to_string()])
        .arg(SIGNALS.to_string())
        .arg(&go)
        .spawn();
    let verdict = client.wait_line("verdict", Duration::from_secs(300));
    let (cout, _) = client.output();
    assert!(verdict.starts_with("verdict ok"), "{verdict}\n{cout}");
    println!("{cout}");
    let links = ctl.wait_links(port, 1, Duration::from_secs(30));
    assert!(
        links.iter().all(|l| l.is_shm()),
        "the connection left the ring: {links:?}"
    );
    let moved = links[0].client.stat("c2s_bytes");
    assert!(
        moved >= BYTES,
        "the ring carried {moved} of {BYTES} B: the rest bypassed it"
    );
    std::fs::write(&go, b"").unwrap();
    let (_, cerr, serr) = client.wait_ok_beside(&mut sink, Duration::from_secs(60));
    assert_shim_silent("burst client", &cerr);
    assert_shim_silent("sink", &serr);
}

#[test]
fn interrupted_calls_restart_as_the_kernel_restarts_them() {
    let dir = TempDir::new("sigdefer_restart");
    let Some(bin) = build(&dir) else { return };
    // The program's listening line names its port; the rest must match.
    let calls = |out: &str| -> Vec<String> {
        out.lines()
            .filter(|l| l.contains("ret="))
            .map(str::to_string)
            .collect()
    };
    let (plain, _) = Cmd::plain(path(&bin))
        .arg("restart")
        .run_ok(Duration::from_secs(60));
    let ctl = Ctl::start();
    let (shimmed, err) = ctl
        .shimmed(path(&bin))
        .arg("restart")
        .env("RINGSOCK_LOG", "debug")
        .run_ok(Duration::from_secs(60));
    assert_eq!(
        calls(&plain),
        [
            "recv, SA_RESTART: ret=5 errno=0 hits=1",
            "recv, no SA_RESTART: ret=-1 errno=EINTR hits=1",
            "recv with SO_RCVTIMEO, SA_RESTART: ret=-1 errno=EINTR hits=1",
            "peek, SA_RESTART: ret=5 errno=0 hits=1",
            "peek, no SA_RESTART: ret=-1 errno=EINTR hits=1",
            "send, SA_RESTART: ret=1 errno=0 hits=1",
            "send, no SA_RESTART: ret=-1 errno=EINTR hits=1",
        ],
        "kernel TCP did not behave as this test expects:\n{plain}"
    );
    assert_eq!(
        calls(&shimmed),
        calls(&plain),
        "the shim restarted differently:\n{shimmed}\n{err}"
    );
    // Every call was on a ring: seven connections, both ends attached.
    let attached = err.lines().filter(|l| l.contains("ring attached")).count();
    assert_eq!(attached, 14, "not every connection had a ring:\n{err}");
}

/// SIGTERM while the client is in `mode`; its handler longjmps out.
fn jump(mode: &str) {
    let dir = TempDir::new("sigdefer_jump");
    let Some(bin) = build(&dir) else { return };
    let ctl = Ctl::start();
    let port = free_port();
    let go = dir.path().join("go");
    let mut sink = ctl
        .shimmed(path(&bin))
        .args(["jumpsink", path(&go), &port.to_string()])
        .spawn();
    sink.wait_line("listening", Duration::from_secs(20));
    let mut client = ctl
        .shimmed(path(&bin))
        .args(["jump", &port.to_string(), mode])
        .spawn();
    client.wait_line("ready", Duration::from_secs(20));
    let links = ctl.wait_links(port, 1, Duration::from_secs(30));
    assert!(links.iter().all(|l| l.is_shm()), "not on a ring: {links:?}");
    // Into the loop proper (a blocking send fills the ring first).
    std::thread::sleep(Duration::from_millis(300));
    terminate(&client);
    if mode == "block-send" {
        // The send sleeps on a full ring until the sink reads.
        std::thread::sleep(Duration::from_millis(200));
    }
    std::fs::write(&go, b"").unwrap();
    if mode == "nonblock-stay" {
        // The end of the stream must reach the sink while the client
        // lives: the close after the longjmp released the connection.
        client.wait_line("closed", Duration::from_secs(60));
        let sstatus = sink.wait(Duration::from_secs(60));
        let (sout, serr) = sink.output();
        assert!(
            sstatus.is_some_and(|s| s.success()) && sout.contains("tail whole"),
            "sink ({mode}) {sstatus:?}: no end of stream while the client lives\n{sout}{serr}"
        );
        return;
    }
    let status = client.wait(Duration::from_secs(60));
    let (cout, cerr) = client.output();
    assert!(
        status.is_some_and(|s| s.success()),
        "client ({mode}) hung or failed: {status:?}\n{cout}{cerr}"
    );
    assert_shim_silent("jump client", &cerr);
    let sstatus = sink.wait(Duration::from_secs(60));
    let (sout, serr) = sink.output();
    assert!(
        sstatus.is_some_and(|s| s.success()) && sout.contains("tail whole"),
        "sink ({mode}) {sstatus:?}:\n{sout}{serr}\nclient:\n{cout}"
    );
    assert_shim_silent("jump sink", &serr);
}

fn terminate(s: &Server) {
    // SAFETY: signalling our own child by pid.
    unsafe { libc::kill(s.pid() as libc::pid_t, libc::SIGTERM) };
}

#[test]
fn longjmp_out_of_a_blocking_recv() {
    jump("block-recv");
}

#[test]
fn longjmp_out_of_a_blocking_send() {
    jump("block-send");
}

#[test]
fn longjmp_out_of_nonblocking_calls() {
    jump("nonblock");
}

#[test]
fn a_connection_closed_after_a_longjmp_ends() {
    jump("nonblock-stay");
}

#[test]
fn iperf3_client_terminated_mid_test() {
    require!("iperf3");
    let ctl = Ctl::start();
    let port = free_port().to_string();
    let mut server = ctl
        .shimmed("iperf3")
        .args(["-s", "-1", "--forceflush", "-B", "127.0.0.1", "-p", &port])
        .spawn();
    server.wait_line("Server listening", Duration::from_secs(20));
    let mut client = ctl
        .shimmed("iperf3")
        .args(["-c", "127.0.0.1", "-p", &port, "-t", "60", "--forceflush"])
        .spawn();
    client.wait_line("[  5]", Duration::from_secs(30));
    let links = ctl.wait_links(port.parse().unwrap(), 2, Duration::from_secs(30));
    assert!(links.iter().all(|l| l.is_shm()), "not on rings: {links:?}");
    terminate(&client);
    let cstatus = client.wait(Duration::from_secs(60));
    let (cout, cerr) = client.output();
    assert!(
        cstatus.is_some(),
        "the iperf3 client hung after SIGTERM:\n{cout}{cerr}"
    );
    assert!(
        cerr.contains("the client has terminated"),
        "client:\n{cout}{cerr}"
    );
    let sstatus = server.wait(Duration::from_secs(60));
    let (sout, serr) = server.output();
    assert!(sstatus.is_some(), "the iperf3 server hung:\n{sout}{serr}");
    assert!(
        serr.contains("the client has terminated") || sout.contains("the client has terminated"),
        "the server did not hear the client's termination:\n{sout}{serr}"
    );
    assert!(
        !serr.contains("ringsock"),
        "shim complaints in the server:\n{serr}"
    );
}

/// setuid and its kin in a threaded process make glibc signal every
/// thread (SIGSETXID) and wait until each ran its handler: the shim's own
/// thread must take that signal (sshd's monitor changes its uid with the
/// shim's thread running). glibc unblocks its signals in the creating
/// thread only at a process's first thread, so the case that matters is a
/// forked child of a threaded process starting the shim's thread anew.
#[test]
fn a_uid_change_beside_the_shims_thread_returns() {
    require!("python3");
    let ctl = Ctl::start();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    // The connection's status report starts the shim's thread.
    let script = format!(
        "import os, socket, time\n\
         a = socket.create_connection(('127.0.0.1', {port}))\n\
         time.sleep(0.5)\n\
         if os.fork() == 0:\n\
         \x20   b = socket.create_connection(('127.0.0.1', {port}))\n\
         \x20   time.sleep(0.5)\n\
         \x20   os.seteuid(os.geteuid())\n\
         \x20   os.setegid(os.getegid())\n\
         \x20   print('changed', flush=True)\n\
         \x20   os._exit(0)\n\
         os.wait()\n"
    );
    let mut p = ctl.shimmed("python3").args(["-c", &script]).spawn();
    let (_a, _) = listener.accept().unwrap();
    let (_b, _) = listener.accept().unwrap();
    let status = p.wait(Duration::from_secs(60));
    let (out, err) = p.output();
    assert!(
        status.is_some_and(|s| s.success()) && out.contains("changed"),
        "seteuid hung or failed beside the shim's thread: {status:?}\n{out}{err}"
    );
}
