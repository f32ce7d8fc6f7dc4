//! `status` of a verbs connection end to end: the daemon maps a reported
//! memfd with a verbs header page and the CLI shows every counter, the
//! zero-copy and pull-mode ones included (`StatusAll`); the original
//! `Status` request still gets the 16 an older CLI decodes; and the CLI
//! falls back to `Status` against a daemon that predates `StatusAll`.

mod common;

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::Command;
use std::thread;
use std::time::Duration;

use common::*;
use ringsock_proto::{
    frame, Msg, RingStat, StatusEntry, Transport, MAX_FRAME_TOTAL, MAX_RING_STATS_V1,
};
use ringsock_ring::transport::verbs::stats::{offsets, VerbsHeader, VERBS_MAGIC, VERBS_VERSION};

fn status(socket: &std::path::Path, json: bool) -> String {
    let mut c = Command::new(BIN);
    c.arg("status");
    if json {
        c.arg("--json");
    }
    let out = c.arg("--socket").arg(socket).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn put(fd: &OwnedFd, off: usize, v: u64) {
    pwrite(fd.as_raw_fd(), &v.to_le_bytes(), off as i64);
}

/// The counters the header page carries, each with its own value (zero
/// where `zero` says so).
fn header_counters(zero: &[&str]) -> Vec<(&'static str, usize, u64)> {
    let o = |n, off| (n, off);
    [
        o("wr_posted", offsets::WR_POSTED),
        o("wr_signaled", offsets::WR_SIGNALED),
        o("wr_inline", offsets::WR_INLINE),
        o("slot_writes", offsets::SLOT_WRITES),
        o("slot_bytes", offsets::SLOT_BYTES),
        o("word_writes", offsets::WORD_WRITES),
        o("kicks_sent", offsets::KICKS_SENT),
        o("rings_received", offsets::RINGS_RECEIVED),
        o("completions", offsets::COMPLETIONS),
        o("cq_errors", offsets::CQ_ERRORS),
        o("zc_writes", offsets::ZC_WRITES),
        o("zc_bytes", offsets::ZC_BYTES),
        o("headerless_writes", offsets::HEADERLESS_WRITES),
        o("headers_resent", offsets::HEADERS_RESENT),
        o("tx_to_pull", offsets::PULL_TX_TO_PULL),
        o("tx_to_push", offsets::PULL_TX_TO_PUSH),
        o("rx_to_pull", offsets::PULL_RX_TO_PULL),
        o("rx_to_push", offsets::PULL_RX_TO_PUSH),
        o("tail_reads", offsets::PULL_TAIL_READS),
        o("slot_reads", offsets::PULL_SLOT_READS),
        o("read_bytes", offsets::PULL_READ_BYTES),
        o("catchup_writes", offsets::PULL_CATCHUP_WRITES),
    ]
    .into_iter()
    .enumerate()
    .map(|(i, (n, off))| {
        let v = if zero.contains(&n) {
            0
        } else {
            7000 + 11 * i as u64
        };
        (n, off, v)
    })
    .collect()
}

/// A sealed memfd with a verbs header page and two (zeroed) control
/// blocks after it, so the six ring counters are listed too.
fn verbs_memfd(counters: &[(&str, usize, u64)]) -> OwnedFd {
    let fd = memfd(3 * 4096, true);
    let hl = std::mem::size_of::<VerbsHeader>() as u64;
    put(&fd, offsets::MAGIC, VERBS_MAGIC);
    put(
        &fd,
        offsets::VERSION_LEN,
        u64::from(VERBS_VERSION) | hl << 32,
    );
    put(&fd, offsets::OUT_CTRL, 4096);
    put(&fd, offsets::IN_CTRL, 8192);
    for &(_, off, v) in counters {
        put(&fd, off, v);
    }
    fd
}

fn report(d: &Daemon, shim: &mut ringsock_proto::Client, fd: &OwnedFd) {
    let report = Msg::ConnReport {
        fd: 9,
        local: "10.0.0.1:40000".parse().unwrap(),
        peer: "10.0.0.2:6379".parse().unwrap(),
        transport: Transport::Rdma,
        reason: String::new(),
        ring: Some(5),
    };
    assert_eq!(
        call(shim, &report, &[fd.as_raw_fd()]).0,
        Msg::Ok,
        "{}",
        d.log_text()
    );
}

#[test]
fn status_shows_zero_copy_and_pull_counters() {
    let d = Daemon::start();
    let mut shim = d.session();
    let counters = header_counters(&["zc_writes", "zc_bytes", "rx_to_push"]);
    let fd = verbs_memfd(&counters);
    report(&d, &mut shim, &fd);

    let json = status(&d.socket, true);
    for &(n, _, v) in &counters {
        assert!(
            json.contains(&format!("\"{n}\":{v},")) || json.contains(&format!("\"{n}\":{v}}}")),
            "{n}={v}: {json}"
        );
    }
    let table = status(&d.socket, false);
    assert!(table.contains(" slot_reads=7209"), "{table}");
    assert!(table.contains(" catchup_writes=7231"), "{table}");
    assert!(table.contains(" headerless_writes=7132"), "{table}");
    assert!(table.contains(" headers_resent=7143"), "{table}");
    // Idle zero-copy/pull counters are folded in the table, not in JSON.
    assert!(!table.contains("zc_writes"), "{table}");
    assert!(!table.contains("rx_to_push"), "{table}");
    assert!(table.contains(" cq_errors=7099"), "{table}");

    // Live: a counter that moves shows at the next status.
    put(&fd, offsets::PULL_SLOT_READS, 123_456);
    assert!(status(&d.socket, true).contains("\"slot_reads\":123456"));

    // The original request gets the first 16, as an older CLI expects.
    let mut c = d.session();
    let Msg::StatusReply { entries, .. } = call(&mut c, &Msg::Status { after: None }, &[]).0 else {
        panic!("no status reply");
    };
    let names: Vec<&str> = entries[0]
        .ring_stats
        .iter()
        .map(|s| s.name.as_str())
        .collect();
    assert_eq!(names.len(), MAX_RING_STATS_V1, "{names:?}");
    assert_eq!(names.last(), Some(&"cq_errors"), "{names:?}");
    let Msg::StatusReply { entries, .. } = call(&mut c, &Msg::StatusAll { after: None }, &[]).0
    else {
        panic!("no status reply");
    };
    assert_eq!(entries[0].ring_stats.len(), 28, "{:?}", entries[0]);
}

/// A daemon built before `StatusAll` (and `StatusNamed`): closes the
/// session on those kinds (as on any kind it does not know), answers
/// `Status`. Serves `sessions` connections, then returns what it was asked.
fn old_daemon(listener: OwnedFd, sessions: usize) -> Vec<&'static str> {
    let mut asked = Vec::new();
    let mut buf = vec![0u8; MAX_FRAME_TOTAL];
    for _ in 0..sessions {
        // SAFETY: accept4 on a listening socket we own; the result is owned.
        let s = unsafe {
            let fd = libc::accept4(
                listener.as_raw_fd(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                libc::SOCK_CLOEXEC,
            );
            assert!(fd >= 0, "accept: {}", std::io::Error::last_os_error());
            OwnedFd::from_raw_fd(fd)
        };
        while let Ok(Some((n, _))) = ringsock_proto::io::recv_frame(s.as_raw_fd(), &mut buf, 0) {
            let reply = match frame::decode(&buf[..n]).unwrap() {
                Msg::Hello { .. } => Msg::HelloOk {
                    daemon_version: "0.0.1".into(),
                    host_id: 1,
                },
                Msg::Status { .. } => {
                    asked.push("Status");
                    Msg::StatusReply {
                        entries: vec![StatusEntry {
                            session: 1,
                            pid: 77,
                            uid: 0,
                            exe: "/bin/old".into(),
                            name: String::new(),
                            fd: 3,
                            local: "10.0.0.1:1".parse().unwrap(),
                            peer: "10.0.0.2:2".parse().unwrap(),
                            transport: Transport::Rdma,
                            reason: String::new(),
                            ring: Some(1),
                            ring_stats: vec![RingStat {
                                name: "wr_posted".into(),
                                value: 4242,
                            }],
                        }],
                        next: None,
                    }
                }
                other => {
                    asked.push(other.name());
                    break; // unknown to this daemon: drop the session
                }
            };
            let f = frame::encode(&reply).unwrap();
            ringsock_proto::io::send_frame(s.as_raw_fd(), &f, &[], 0).unwrap();
        }
    }
    asked
}

#[test]
fn cli_falls_back_to_status_for_an_older_daemon() {
    let dir = TempDir::new();
    let path = dir.path("old.sock");
    let (sa, len) = ringsock_proto::io::unix_addr(&path).unwrap();
    // SAFETY: a fresh socket, bound and listening; owned at once.
    let listener = unsafe {
        let fd = libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0);
        assert!(fd >= 0);
        let fd = OwnedFd::from_raw_fd(fd);
        assert_eq!(libc::bind(fd.as_raw_fd(), (&raw const sa).cast(), len), 0);
        assert_eq!(libc::listen(fd.as_raw_fd(), 4), 0);
        fd
    };
    // Bounds the fake daemon's accept and reads (a CLI that never comes
    // back fails the test instead of hanging it).
    ringsock_proto::io::set_timeouts(listener.as_raw_fd(), Duration::from_secs(10)).unwrap();
    let server = thread::spawn(move || old_daemon(listener, 3));
    let out = Command::new(BIN)
        .args(["status", "--json", "--socket"])
        .arg(&path)
        .output()
        .unwrap();
    let asked = server.join().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("\"wr_posted\":4242"), "{stdout}");
    assert_eq!(asked, ["StatusNamed", "StatusAll", "Status"]);
}
