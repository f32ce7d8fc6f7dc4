//! Fallback to kernel TCP: a shimmed program whose peer is not shimmed (in
//! either direction) keeps working, with status showing `tcp` and a reason
//! for its end; without any daemon every connection is plain TCP and the
//! shim stays silent. Same python echo pair and checksums as python_echo.

mod common;

use common::{python_echo, Held, Side};
use ringsock_integration::{assert_shim_silent, require, Ctl};

const SIZE: usize = 1 << 20;

fn assert_tcp_end(h: &Held, end: &Option<ringsock_integration::Conn>, which: &str) {
    let c = end.as_ref().unwrap_or_else(|| {
        panic!(
            "{}: the shimmed {which} end was never reported:\n{}",
            h.name,
            ringsock_integration::show(&h.sample)
        )
    });
    assert_eq!(c.transport, "tcp", "{}: {c}", h.name);
    assert!(
        !c.reason.is_empty(),
        "{}: tcp without a reason: {c}",
        h.name
    );
    assert!(c.ring.is_none(), "{}: tcp with a ring: {c}", h.name);
}

#[test]
fn shimmed_client_unshimmed_server_is_tcp() {
    require!("python3");
    let ctl = Ctl::start();
    let (held, cerr, _) = python_echo(Some(&ctl), Side::Plain, Side::Shim, SIZE);
    for h in &held {
        assert_tcp_end(h, &h.client, "client");
        assert!(h.server.is_none(), "plain server reported: {:?}", h.server);
        println!("{}: {}", h.name, h.client.as_ref().unwrap());
    }
    assert_shim_silent("client", &cerr);
}

#[test]
fn unshimmed_client_shimmed_server_is_tcp() {
    require!("python3");
    let ctl = Ctl::start();
    let (held, _, serr) = python_echo(Some(&ctl), Side::Shim, Side::Plain, SIZE);
    for h in &held {
        assert_tcp_end(h, &h.server, "server");
        assert!(h.client.is_none(), "plain client reported: {:?}", h.client);
        println!("{}: {}", h.name, h.server.as_ref().unwrap());
    }
    assert_shim_silent("server", &serr);
}

#[test]
fn no_daemon_everything_is_tcp() {
    require!("python3");
    // Cmd::shimmed without .ctl(): RINGSOCK_CTL_SOCK names a path where no
    // daemon answers.
    let (held, cerr, serr) = python_echo(None, Side::Shim, Side::Shim, SIZE);
    assert!(held.is_empty());
    assert_shim_silent("client", &cerr);
    assert_shim_silent("server", &serr);
}

#[test]
fn daemon_elsewhere_sees_nothing_of_programs_without_it() {
    require!("python3");
    // A daemon runs, but the programs were not pointed at it: they stay
    // TCP and report nothing to it.
    let ctl = Ctl::start();
    let (held, _, _) = python_echo(None, Side::Shim, Side::Shim, SIZE);
    assert!(held.is_empty());
    let s = ctl.status();
    assert!(s.is_empty(), "{}", ringsock_integration::show(&s));
}

/// A listener that closes with a shimmed client's connection still queued
/// (never accepted, its first bytes unread) resets that connection, as TCP
/// does: the client reads ECONNRESET, and its close returns at once and
/// silently, rather than waiting out the ring handshake's budget for a
/// server's decision that can no longer come.
#[test]
fn a_listener_closing_with_a_client_queued_resets_it_at_once() {
    require!("python3");
    let ctl = Ctl::start();
    let script = r#"
import errno, socket, time
l = socket.socket()
l.bind(("127.0.0.1", 0))
l.listen(8)
c = socket.socket()
c.connect(l.getsockname())
c.sendall(b"x" * 37)
time.sleep(0.05)
l.close()
c.settimeout(30)
try:
    print("recv", c.recv(100))
except OSError as e:
    print("recv", errno.errorcode.get(e.errno, e.errno))
t = time.monotonic()
c.close()
print("close", time.monotonic() - t)
"#;
    // The budget a close would wait for the decision: 20 s.
    let (out, err) = ctl
        .shimmed("python3")
        .env("RINGSOCK_CONNECT_TIMEOUT_MS", "20000")
        .arg("-c")
        .arg(script)
        .run_ok(std::time::Duration::from_secs(60));
    assert!(out.contains("recv ECONNRESET"), "{out}");
    let close_s: f64 = out
        .lines()
        .find_map(|l| l.strip_prefix("close "))
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| panic!("no close time in {out}"));
    assert!(
        close_s < 10.0,
        "close waited {close_s} s for a decision that cannot come"
    );
    assert_shim_silent("client", &err);
}

/// A client whose ring offer nobody took (the accepting process never
/// claims it) goes on over TCP after the claim wait; its edge-triggered
/// epoll registration, made before connect as nginx makes it, must then
/// report every arrival on the kernel socket, as the kernel's does: bytes
/// that come while the program is busy between two waits, after it read
/// everything, are reported at its next wait. (nginx proxying a large
/// response stalled here until its 60 s timeout.)
#[test]
fn an_edge_triggered_waiter_sees_every_arrival_after_falling_back() {
    require!("python3");
    const ROUNDS: usize = 6;
    const CHUNK: usize = 200_000;
    let ctl = Ctl::start();
    let server = r#"
import socket
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("0.0.0.0", 0))
l.listen(4)
print("listening", l.getsockname()[1], flush=True)
c, _ = l.accept()
req = b""
while not req.endswith(b"\n"):
    req += c.recv(100)
for _ in range(ROUNDS):
    c.sendall(b"a" * CHUNK)
    assert c.recv(1) == b"g"
c.close()
"#
    .replace("ROUNDS", &ROUNDS.to_string())
    .replace("CHUNK", &CHUNK.to_string());
    let client = r#"
import errno, select, socket, sys, time
port = int(sys.argv[1])
s = socket.socket()
s.setblocking(False)
ep = select.epoll()
ep.register(s.fileno(), select.EPOLLIN | select.EPOLLOUT | select.EPOLLET | select.EPOLLRDHUP)
assert s.connect_ex(("127.0.0.1", port)) in (0, errno.EINPROGRESS)
if not ep.poll(10):
    sys.exit("never writable")
s.send(b"request\n")
total = 0
while total < ROUNDS * CHUNK:
    if not ep.poll(10):
        print("stalled at", total, flush=True)
        sys.exit(1)
    while True:
        try:
            d = s.recv(4096)
        except BlockingIOError:
            break
        if not d:
            break
        total += len(d)
    if total and total % CHUNK == 0:
        s.send(b"g")
        # The next chunk arrives while this program is not waiting.
        time.sleep(0.1)
print("received", total, flush=True)
"#
    .replace("ROUNDS", &ROUNDS.to_string())
    .replace("CHUNK", &CHUNK.to_string());
    // The server's shim takes no ring for its loopback peers, so the
    // client's offer is never claimed.
    let mut srv = ctl
        .shimmed("python3")
        .env("RINGSOCK_EXCLUDE_NETS", "127.0.0.0/8")
        .arg("-c")
        .arg(server)
        .spawn();
    let port = srv
        .wait_line("listening", std::time::Duration::from_secs(20))
        .split_whitespace()
        .nth(1)
        .expect("a port")
        .to_string();
    let (out, err) = ctl
        .shimmed("python3")
        .env("RINGSOCK_CLAIM_WAIT_MS", "200")
        .arg("-c")
        .arg(client)
        .arg(&port)
        .run_ok(std::time::Duration::from_secs(60));
    assert!(
        out.contains(&format!("received {}", ROUNDS * CHUNK)),
        "{out}\n{err}"
    );
    assert!(srv
        .wait(std::time::Duration::from_secs(20))
        .is_some_and(|s| s.success()));
}
