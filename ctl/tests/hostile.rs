//! Hostile or broken sessions: each is closed alone, and the daemon goes
//! on serving everyone else.

mod common;

use std::os::fd::AsRawFd;

use common::*;
use ringsock_proto::{frame, Msg, MAX_FRAME, PROTO_VERSION};

/// The daemon still answers a well-behaved session.
fn still_serving(d: &Daemon) {
    let mut c = d.session();
    let (r, _) = call(&mut c, &Msg::Status { after: None }, &[]);
    assert!(matches!(r, Msg::StatusReply { .. }), "{r:?}");
}

fn assert_evicted(d: &Daemon, bytes: &[u8], hello_first: bool) {
    let c = if hello_first {
        d.session()
    } else {
        d.raw_session()
    };
    let bystander = d.session();
    send_raw(&c, bytes).unwrap();
    assert!(
        is_closed_by_daemon(&c),
        "session not closed for {:?}",
        &bytes[..bytes.len().min(16)]
    );
    drop(bystander);
    still_serving(d);
}

fn header(len: u32, version: u16, kind: u16) -> Vec<u8> {
    let mut v = len.to_le_bytes().to_vec();
    v.extend_from_slice(&version.to_le_bytes());
    v.extend_from_slice(&kind.to_le_bytes());
    v
}

#[test]
fn garbage_bytes() {
    let d = Daemon::start();
    assert_evicted(&d, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", false);
    assert_evicted(&d, &[0xff; 3], true);
    assert_evicted(&d, &[0; 64], true);
}

#[test]
fn oversized_length_prefix() {
    let d = Daemon::start();
    assert_evicted(
        &d,
        &header(MAX_FRAME as u32 + 1, PROTO_VERSION, 0x000c),
        true,
    );
    assert_evicted(&d, &header(u32::MAX, PROTO_VERSION, 0x000c), true);
    // A datagram really larger than any frame.
    let mut big = header(MAX_FRAME as u32 + 100, PROTO_VERSION, 0x000c);
    big.resize(MAX_FRAME + 104, 0);
    assert_evicted(&d, &big, true);
}

#[test]
fn wrong_version_unknown_kind_trailing_bytes() {
    let d = Daemon::start();
    let mut f = frame::encode(&Msg::Status { after: None }).unwrap();
    f[4..6].copy_from_slice(&(PROTO_VERSION + 1).to_le_bytes());
    assert_evicted(&d, &f, true);
    assert_evicted(&d, &header(4, PROTO_VERSION, 0x0777), true);
    let mut t = frame::encode(&Msg::Status { after: None }).unwrap();
    t.push(0);
    let len = (t.len() - 4) as u32;
    t[..4].copy_from_slice(&len.to_le_bytes());
    assert_evicted(&d, &t, true);
}

#[test]
fn protocol_violations() {
    let d = Daemon::start();
    // A request before Hello.
    let status = frame::encode(&Msg::Status { after: None }).unwrap();
    assert_evicted(&d, &status, false);
    // A reply kind sent to the daemon.
    assert_evicted(&d, &frame::encode(&Msg::Ok).unwrap(), true);
    // A descriptor on a message that takes none: closed, and the fd with it.
    let c = d.session();
    let efd = eventfd();
    ringsock_proto::io::send_frame(c.as_raw_fd(), &status, &[efd.as_raw_fd()], 0).unwrap();
    assert!(is_closed_by_daemon(&c));
    // A claim without its proof descriptor.
    assert_evicted(&d, &frame::encode(&Msg::Claim).unwrap(), true);
    still_serving(&d);
    let log = d.log_text();
    assert!(log.contains("before Hello"), "{log}");
    assert!(log.contains("closing it"), "{log}");
}

#[test]
fn many_sessions_and_abrupt_disconnects() {
    let d = Daemon::start();
    let mut sessions: Vec<_> = (0..50).map(|_| d.session()).collect();
    // Half vanish mid-conversation with a request in flight.
    for c in sessions.drain(..25) {
        send_raw(&c, &frame::encode(&Msg::Status { after: None }).unwrap()).unwrap();
    }
    for c in &mut sessions {
        assert!(matches!(
            call(c, &Msg::Status { after: None }, &[]).0,
            Msg::StatusReply { .. }
        ));
    }
    still_serving(&d);
}

#[test]
fn a_session_that_never_reads_is_throttled_not_fatal() {
    let d = Daemon::start();
    let greedy = d.session();
    let req = frame::encode(&Msg::Status { after: None }).unwrap();
    // Pipeline requests without reading a single reply, until our own send
    // buffer is full: the daemon stops reading us once its replies back up.
    let mut sent = 0;
    while sent < 100_000 {
        match ringsock_proto::io::send_frame(greedy.as_raw_fd(), &req, &[], libc::MSG_DONTWAIT) {
            Ok(()) => sent += 1,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) => panic!("send: {e}"),
        }
    }
    assert!(sent < 100_000, "daemon never pushed back");
    still_serving(&d);
    // Every request still gets its reply, in order.
    let mut buf = vec![0u8; ringsock_proto::MAX_FRAME_TOTAL];
    for _ in 0..sent {
        let (m, _) = ringsock_proto::recv_msg(greedy.as_raw_fd(), &mut buf).unwrap();
        assert!(matches!(m, Msg::StatusReply { .. }));
    }
}

#[test]
fn sessions_beyond_the_limit_are_refused_alone() {
    // RLIMIT_NOFILE 64 gives the daemon a budget of 16 sessions.
    let dir = TempDir::new();
    let socket = dir.path("ctl.sock");
    let mut child = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -n 64 && exec {BIN} daemon --foreground --socket {}",
            socket.display()
        ))
        .stderr(std::fs::File::create(dir.path("log")).unwrap())
        .spawn()
        .unwrap();
    wait_until("daemon start", || {
        ringsock_proto::Client::connect(&socket, None).is_ok()
    });
    let mut ok = Vec::new();
    let mut refused = 0;
    for _ in 0..24 {
        let mut c =
            ringsock_proto::Client::connect(&socket, Some(std::time::Duration::from_secs(5)))
                .unwrap();
        match c.hello("t") {
            Ok(_) => ok.push(c),
            Err(_) => refused += 1,
        }
    }
    assert!(
        refused > 0 && ok.len() >= 8,
        "ok {} refused {refused}",
        ok.len()
    );
    // Those admitted are served; after some leave, newcomers are admitted.
    for c in &mut ok {
        assert!(matches!(
            call(c, &Msg::Status { after: None }, &[]).0,
            Msg::StatusReply { .. }
        ));
    }
    ok.truncate(2);
    wait_until("a free session slot", || {
        ringsock_proto::Client::connect(&socket, Some(std::time::Duration::from_secs(5)))
            .is_ok_and(|mut c| c.hello("t").is_ok())
    });
    let _ = child.kill();
    let _ = child.wait();
    let log = std::fs::read_to_string(dir.path("log")).unwrap();
    assert!(log.contains("refusing another"), "{log}");
}

/// Rings passed with connection reports are mapped by the daemon for its
/// status counters: a process that shrinks its memfd afterwards (SIGBUS
/// for a mapping past the end), or fills a sealed one with garbage, must
/// not crash it, nor hide anyone else's entries.
#[test]
fn hostile_ring_memfds_in_reports() {
    use ringsock_proto::Transport;
    let d = Daemon::start();
    let report = |fd: i32, port: u16| Msg::ConnReport {
        fd,
        local: format!("127.0.0.1:{port}").parse().unwrap(),
        peer: "127.0.0.1:6379".parse().unwrap(),
        transport: Transport::Shm,
        reason: String::new(),
        ring: Some(fd as u64),
    };
    let mut evil = d.session();
    // Unsealed, 2 MiB, then truncated to nothing.
    let shrinking = memfd(2 << 20, false);
    assert_eq!(
        call(&mut evil, &report(7, 40007), &[shrinking.as_raw_fd()]).0,
        Msg::Ok
    );
    // SAFETY: truncating our own memfd.
    assert_eq!(unsafe { libc::ftruncate(shrinking.as_raw_fd(), 0) }, 0);
    // Sealed against shrinking, full of garbage (counters, geometry).
    let garbage = memfd(1 << 20, true);
    let junk: Vec<u8> = (0..1u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    pwrite(garbage.as_raw_fd(), &junk, 0);
    assert_eq!(
        call(&mut evil, &report(8, 40008), &[garbage.as_raw_fd()]).0,
        Msg::Ok
    );
    // A bystander's report, and status for everyone, several times.
    let mut good = d.session();
    assert_eq!(call(&mut good, &report(9, 40009), &[]).0, Msg::Ok);
    for _ in 0..3 {
        let (r, _) = call(&mut good, &Msg::Status { after: None }, &[]);
        let Msg::StatusReply { entries, .. } = r else {
            panic!("{r:?}")
        };
        let fds: Vec<i32> = entries.iter().map(|e| e.fd).collect();
        assert!([7, 8, 9].iter().all(|f| fds.contains(f)), "entries {fds:?}");
    }
    let out = std::process::Command::new(BIN)
        .args(["status", "--json", "--socket"])
        .arg(&d.socket)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    still_serving(&d);
}
