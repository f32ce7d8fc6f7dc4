//! Resource exhaustion: when a ring cannot be built (descriptor limit, no
//! memfd_create, no huge pages) the shim keeps the program working on
//! kernel TCP, with verified data, says why in one log line at the default
//! level, and `ringsock-ctl status` gives the reason; where huge pages are
//! missing it silently uses 4 KiB pages and stays on the ring.
//!
//! Helpers: `connloop` (an echo server; a client that opens connections
//! until EMFILE, checking an echo on each; socket() until EMFILE) and
//! `seccomp_run` (makes chosen system calls fail, then execs a program).
//!
//! Not here: a locked-memory limit (RLIMIT_MEMLOCK) too low for RDMA
//! registration. It concerns the verbs transport, which the shim does not
//! use for connections yet.

use std::time::Duration;

use ringsock_integration::{
    assert_all_shm, assert_shim_silent, links, resources, show, Cmd, Conn, Ctl, Server, Watched,
};

const CONNLOOP: &str = env!("CARGO_BIN_EXE_connloop");
const SECCOMP_RUN: &str = env!("CARGO_BIN_EXE_seccomp_run");
/// The reason status gives for a ring that could not be built.
const NO_RESOURCES: &str = "no memory or descriptors for a ring";

use ringsock_integration::{out_field as field, out_num as num};

/// The shim's log lines in `stderr`.
fn shim_lines(stderr: &str) -> Vec<&str> {
    stderr.lines().filter(|l| l.contains("ringsock[")).collect()
}

/// Asserts the shim logged exactly one line, a warning that names `cause`.
fn assert_one_line(what: &str, stderr: &str, cause: &str) -> String {
    let lines = shim_lines(stderr);
    assert!(
        lines.len() == 1 && lines[0].contains(": warn: ") && lines[0].contains(cause),
        "{what}: expected one warning naming `{cause}`, the shim logged:\n{}",
        lines.join("\n")
    );
    println!("{what}: the shim logged: {}", lines[0]);
    lines[0].to_string()
}

/// A shimmed echo server on `ctl`, and its port.
fn echo_server(ctl: &Ctl) -> (Server, u16) {
    let mut s = ctl.shimmed(CONNLOOP).arg("echo-server").spawn();
    let line = s.wait_line("listening ", Duration::from_secs(10));
    (s, line[10..].trim().parse().unwrap())
}

/// Client ends (peer port = `port`) that the client process `pid` reported.
fn client_ends(conns: &[Conn], port: u16, pid: u32) -> Vec<Conn> {
    conns
        .iter()
        .filter(|c| c.peer.port() == port && c.pid == pid)
        .cloned()
        .collect()
}

/// The pid of the process that reported client ends to `port`, the only
/// one besides the server (`server_pid`).
fn client_pid(w: &Watched, port: u16) -> u32 {
    w.conns
        .iter()
        .find(|c| c.peer.port() == port)
        .map(|c| c.pid)
        .unwrap_or_else(|| panic!("no client end reported:\n{}", show(&w.conns)))
}

#[test]
fn fd_limit_rings_give_way_to_tcp_and_the_program_gets_emfile() {
    let ctl = Ctl::start();
    let (mut server, port) = echo_server(&ctl);
    // 64 descriptors: the first connections get rings (3 descriptors more
    // each), the later ones find none left for a ring and go on over TCP,
    // and the last socket() fails with EMFILE, as it would without the
    // shim. Every connection echoes 4 KiB twice, checked byte for byte.
    let client = |c: Cmd| {
        c.args(["--nofile=64:64", CONNLOOP, "client", "--port"])
            .arg(port.to_string())
            .args(["--until-emfile", "--bytes", "4096", "--hold-ms", "1000"])
    };
    let mut shimmed = client(ctl.shimmed("prlimit")).spawn();
    let w = ctl.watch(&mut shimmed, Duration::from_secs(60));
    w.assert_ok("shimmed client at its fd limit");
    let out = &w.stdout;
    let (opened, rings) = (num(out, "opened"), num(out, "ring_maps"));
    assert_eq!(num(out, "stopped"), libc::EMFILE as u64, "{out}");
    assert!(out.contains("\nok"), "{out}");
    println!("shimmed, RLIMIT_NOFILE 64: {opened} connections, {rings} with a ring, then EMFILE");
    assert!(
        rings >= 1 && rings < opened,
        "expected both ring and TCP connections:\n{out}"
    );

    // Status, sampled while all were open: every connection that has no
    // ring says why.
    let pid = client_pid(&w, port);
    let ends = client_ends(&w.conns, port, pid);
    let tcp: Vec<&Conn> = ends.iter().filter(|c| !c.is_shm()).collect();
    assert_eq!(
        ends.len() as u64,
        opened,
        "every connection reported:\n{}",
        show(&w.conns)
    );
    assert_eq!(tcp.len() as u64, opened - rings, "{}", show(&w.conns));
    for c in &tcp {
        assert_eq!(c.reason, NO_RESOURCES, "{c}");
    }
    let l = links(&w.conns, port);
    assert!(
        l.iter().filter(|l| l.is_shm()).count() as u64 == rings,
        "{rings} shm links expected:\n{}",
        show(&w.conns)
    );
    assert_one_line("fd limit", &w.stderr, "Too many open files");

    // Without the shim: the same errno at the limit.
    let out = client(Cmd::plain("prlimit")).run(Duration::from_secs(60));
    let plain = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "plain client: {plain}");
    assert_eq!(num(&plain, "stopped"), libc::EMFILE as u64, "{plain}");
    println!(
        "plain, RLIMIT_NOFILE 64: {} connections, then EMFILE",
        num(&plain, "opened")
    );
    assert!(num(&plain, "opened") >= opened, "{plain}");
    // Rings only use the top quarter of the fd range (refused when it is
    // full), so the program loses at most that quarter of what it gets
    // without the shim.
    assert!(
        opened + 64 / 4 >= num(&plain, "opened"),
        "the shim took the program's descriptors: {opened} connections with it, {} without",
        num(&plain, "opened")
    );

    // Sockets alone (never connected) cost the shim nothing: the program
    // gets exactly as many as without it, then EMFILE.
    let sockets = |c: Cmd| {
        let (o, e) = c
            .args(["--nofile=32:32", CONNLOOP, "sockets"])
            .run_ok(Duration::from_secs(10));
        assert_shim_silent("sockets", &e);
        field(&o, "sockets")
    };
    let with = sockets(ctl.shimmed("prlimit"));
    let without = sockets(Cmd::plain("prlimit"));
    assert_eq!(with, without, "socket() until EMFILE, shim vs none");
    assert_eq!(with[2], libc::EMFILE.to_string());
    server.assert_running();
}

/// A shimmed client under `seccomp_run CALLS`, 3 connections of 1 MiB
/// echoed to a shimmed server; returns what it printed and what status
/// showed.
fn client_under_seccomp(ctl: &Ctl, port: u16, calls: &str) -> Watched {
    let mut c = ctl
        .shimmed(SECCOMP_RUN)
        .args([calls, "--", CONNLOOP, "client", "--port"])
        .arg(port.to_string())
        .args(["--conns", "3", "--bytes", "1048576", "--hold-ms", "500"])
        .spawn();
    let w = ctl.watch(&mut c, Duration::from_secs(60));
    w.assert_ok(&format!("client without {calls}"));
    assert_eq!(num(&w.stdout, "opened"), 3, "{}", w.stdout);
    assert_eq!(num(&w.stdout, "ring_maps"), 0, "{}", w.stdout);
    let pid = client_pid(&w, port);
    let ends = client_ends(&w.conns, port, pid);
    assert_eq!(ends.len(), 3, "{}", show(&w.conns));
    for c in &ends {
        assert!(
            c.transport == "tcp" && c.reason == NO_RESOURCES,
            "{c}\n{}",
            show(&w.conns)
        );
    }
    // The server's ends: TCP, no ring offered.
    for l in links(&w.conns, port) {
        assert!(!l.server.is_shm(), "{l}");
    }
    w
}

#[test]
fn memfd_unavailable_falls_back_to_tcp_with_one_line() {
    let ctl = Ctl::start();
    let (mut server, port) = echo_server(&ctl);
    let w = client_under_seccomp(&ctl, port, "memfd_create");
    assert_one_line("memfd_create fails", &w.stderr, "Function not implemented");
    // The filter is really there: the same program without the shim, under
    // the same filter, cannot create a memfd either (python3 tells).
    if ringsock_integration::which("python3").is_some() {
        let out = Cmd::plain(SECCOMP_RUN)
            .args(["memfd_create", "--", "python3", "-c"])
            .arg("import os\ntry:\n os.memfd_create('x')\nexcept OSError as e:\n print(e.errno)")
            .run(Duration::from_secs(10));
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            libc::ENOSYS.to_string()
        );
    }
    // Both ends under the filter: the server needs no memfd of its own.
    server.stop();
    let mut server = ctl
        .shimmed(SECCOMP_RUN)
        .args(["memfd_create", "--", CONNLOOP, "echo-server"])
        .spawn();
    let line = server.wait_line("listening ", Duration::from_secs(10));
    let port: u16 = line[10..].trim().parse().unwrap();
    let w = client_under_seccomp(&ctl, port, "memfd_create");
    assert_one_line("memfd_create fails (both)", &w.stderr, "shared memory");
    let (_, _, serr) = server.stop();
    assert_shim_silent("echo server", &serr);
}

#[test]
fn eventfd_unavailable_falls_back_to_tcp_with_one_line() {
    // Doorbells are eventfds: without them no ring either.
    let ctl = Ctl::start();
    let (mut server, port) = echo_server(&ctl);
    let w = client_under_seccomp(&ctl, port, "eventfd2");
    assert_one_line("eventfd2 fails", &w.stderr, "doorbell eventfd");
    let (_, _, serr) = server.stop();
    assert_shim_silent("echo server", &serr);
}

fn meminfo(key: &str) -> Option<u64> {
    std::fs::read_to_string("/proc/meminfo")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix(key))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[test]
fn no_huge_pages_rings_use_small_pages_silently() {
    // Segments try huge pages first; with none free (the default:
    // nr_hugepages = 0) that attempt fails and 4 KiB pages are used, with
    // no log line and no change for the program.
    let free = meminfo("HugePages_Free:");
    let ctl = Ctl::start();
    let (mut server, port) = echo_server(&ctl);
    let mut cli = ctl
        .shimmed(CONNLOOP)
        .args([
            "client",
            "--conns",
            "2",
            "--bytes",
            "4194304",
            "--hold-ms",
            "1500",
            "--port",
        ])
        .arg(port.to_string())
        .spawn();
    // While the client holds its connections: both on rings, and the
    // client's ring mappings on ordinary pages.
    let mut pages = Vec::new();
    let seen = ctl.wait_for(Duration::from_secs(20), |s| {
        pages = resources::ring_page_sizes(cli.pid());
        links(s, port).iter().filter(|l| l.is_shm()).count() == 2 && pages.len() == 2
    });
    let (out, err) = cli.wait_ok(Duration::from_secs(30));
    let seen = seen
        .unwrap_or_else(|| panic!("two shm links with mapped rings never seen; pages {pages:?}"));
    assert_all_shm("no huge pages", &seen, port, 2);
    assert_eq!(num(&out, "opened"), 2, "{out}");
    assert_eq!(num(&out, "ring_maps"), 2, "{out}");
    assert_shim_silent("client", &err);
    println!("HugePages_Free {free:?}; ring page sizes (KiB): {pages:?}");
    if free == Some(0) {
        assert_eq!(
            pages,
            [4, 4],
            "ring mappings on huge pages, yet none were free"
        );
    } else {
        println!("huge pages are free on this machine: the 4 KiB fallback is not exercised");
    }
    let (_, _, serr) = server.stop();
    assert_shim_silent("echo server", &serr);
}
