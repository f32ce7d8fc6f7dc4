//! `status` end to end with a real shim segment: the daemon maps the
//! reported memfd and shows the ring counters per direction, in the table
//! and in --json.

mod common;

use std::os::fd::AsRawFd;
use std::process::Command;

use common::*;
use ringsock_proto::{Msg, Transport};
use ringsock_ring::{Receiver, RingConfig, Segment, Sender, ShmTransport};

fn status(d: &Daemon, json: bool) -> String {
    let mut c = Command::new(BIN);
    c.arg("status");
    if json {
        c.arg("--json");
    }
    let out = c.arg("--socket").arg(&d.socket).output().unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn status_shows_live_ring_counters() {
    let cfg = RingConfig::default();
    let seg = Segment::create(&cfg, 2).unwrap();
    // Ring 0 carries client -> server: 3000 bytes, 1000 of them read.
    let mut tx = Sender::new(seg.ring(0), ShmTransport::new(seg.ring(0), None), cfg).unwrap();
    let mut rx = Receiver::new(seg.ring(0), ShmTransport::new(seg.ring(0), None), cfg).unwrap();
    tx.write(&[1u8; 3000]).unwrap();
    tx.flush().unwrap();
    let mut buf = [0u8; 1000];
    assert_eq!(rx.read(&mut buf).unwrap(), 1000);

    let d = Daemon::start();
    let mut shim = d.session();
    let memfd = seg.share_fd().unwrap();
    let report = Msg::ConnReport {
        fd: 9,
        local: "127.0.0.1:40000".parse().unwrap(),
        peer: "127.0.0.1:6379".parse().unwrap(),
        transport: Transport::Shm,
        reason: String::new(),
        ring: Some(5),
    };
    assert_eq!(call(&mut shim, &report, &[memfd.as_raw_fd()]).0, Msg::Ok);

    let json = status(&d, true);
    assert!(json.contains("\"c2s_bytes\":3000"), "{json}");
    assert!(json.contains("\"s2c_bytes\":0"), "{json}");
    assert!(json.contains("\"c2s_batches\":"), "{json}");
    assert!(json.contains("\"c2s_occupancy\":"), "{json}");
    assert!(!json.contains("memfd_size"), "{json}");
    let table = status(&d, false);
    assert!(table.contains("#5 c2s 2.9KiB"), "{table}");

    // Live: more traffic shows at the next status.
    tx.write(&[2u8; 500]).unwrap();
    tx.flush().unwrap();
    assert!(status(&d, true).contains("\"c2s_bytes\":3500"));
}
