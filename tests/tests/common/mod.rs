//! The python echo pair (tests/scripts/echo_server.py, echo_client.py)
//! under any mix of shim / no shim / daemon / no daemon, with a look at
//! `ringsock-ctl status` while each of the client's connections is held
//! open (threaded sendall/recv, makefile lines, asyncio streams).

#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

pub use ringsock_integration::script;
use ringsock_integration::{free_port, show, wait_port, Cmd, Conn, Ctl, TempDir};

/// The words after `key` on the last line that starts with it.
pub fn field<'a>(out: &'a str, key: &str) -> Vec<&'a str> {
    // The last such line, should a program print the key more than once.
    out.lines()
        .rev()
        .find(|l| l.starts_with(&format!("{key} ")))
        .unwrap_or_else(|| panic!("no `{key}` line in:\n{out}"))
        .split_whitespace()
        .skip(1)
        .collect()
}

/// How a side runs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Side {
    /// No shim.
    Plain,
    /// Shim, with the test's daemon when there is one (else no daemon).
    Shim,
}

/// A connection held open by the client, and both of its ends as status
/// showed them (None: that end was not reported).
pub struct Held {
    pub name: String,
    pub client: Option<Conn>,
    pub server: Option<Conn>,
    /// The whole sample.
    pub sample: Vec<Conn>,
}

fn cmd(side: Side, ctl: Option<&Ctl>, program: &str) -> Cmd {
    match (side, ctl) {
        (Side::Plain, _) => Cmd::plain(program),
        (Side::Shim, Some(c)) => c.shimmed(program),
        (Side::Shim, None) => Cmd::shimmed(program),
    }
}

/// Runs the echo pair with `size` bytes each way and checks every
/// checksum; returns what status showed for each held connection (only
/// when `ctl` is given) and the client's and server's stderr.
pub fn python_echo(
    ctl: Option<&Ctl>,
    server_side: Side,
    client_side: Side,
    size: usize,
) -> (Vec<Held>, String, String) {
    let holds = TempDir::new("echo-hold");
    let (tport, aport) = (free_port(), free_port());
    let mut server = cmd(server_side, ctl, "python3")
        .arg(script("echo_server.py"))
        .arg(tport.to_string())
        .arg(aport.to_string())
        .spawn();
    wait_port(&mut server, tport, Duration::from_secs(10));
    wait_port(&mut server, aport, Duration::from_secs(10));

    let mut client = cmd(client_side, ctl, "python3")
        .arg(script("echo_client.py"))
        .arg(tport.to_string())
        .arg(aport.to_string())
        .arg(size.to_string())
        .env("RS_HOLD_DIR", holds.path())
        .spawn();
    let mut held = Vec::new();
    for (name, port) in [("threaded", tport), ("lines", tport), ("asyncio", aport)] {
        let line = client.wait_line(&format!("HOLD {name} "), Duration::from_secs(30));
        let lport: u16 = line.split_whitespace().nth(2).unwrap().parse().unwrap();
        let c_addr = SocketAddr::from(([127, 0, 0, 1], lport));
        let s_addr = SocketAddr::from(([127, 0, 0, 1], port));
        if let Some(ctl) = ctl {
            let want_c = client_side == Side::Shim;
            let want_s = server_side == Side::Shim;
            let find = |s: &[Conn], local: SocketAddr, peer: SocketAddr| {
                s.iter()
                    .find(|c| c.local == local && c.peer == peer)
                    .cloned()
            };
            // Both shimmed ends report within milliseconds; a little
            // patience for a loaded machine.
            let end = Instant::now() + Duration::from_secs(5);
            let mut sample;
            loop {
                sample = ctl.status();
                let c = find(&sample, c_addr, s_addr);
                let s = find(&sample, s_addr, c_addr);
                if (c.is_some() || !want_c) && (s.is_some() || !want_s) || Instant::now() > end {
                    held.push(Held {
                        name: name.to_string(),
                        client: c,
                        server: s,
                        sample,
                    });
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        holds.write(name, b"go");
    }
    let (out, cerr) = client.wait_ok(Duration::from_secs(60));
    let sent = field(&out, "sent")[0].to_string();
    assert_eq!(
        field(&out, "threaded-back"),
        [size.to_string().as_str(), &sent]
    );
    assert_eq!(
        field(&out, "asyncio-back"),
        [size.to_string().as_str(), &sent]
    );
    assert!(out.contains("lines ok"), "{out}");

    // The server saw the same bytes (its lines appear once the connections
    // are done; poll briefly for them).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (sout, serr) = server.output();
        if sout.contains("threaded-received") && sout.contains("asyncio-received") {
            assert_eq!(field(&sout, "threaded-received"), [sent.as_str()]);
            assert_eq!(field(&sout, "asyncio-received"), [sent.as_str()]);
            let (_, _, serr2) = server.stop();
            return (held, cerr, format!("{serr}{serr2}"));
        }
        assert!(Instant::now() < deadline, "server output:\n{sout}\n{serr}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Asserts that `h`'s two ends were reported on one shm ring.
pub fn assert_held_shm(h: &Held) {
    let (Some(c), Some(s)) = (&h.client, &h.server) else {
        panic!(
            "{}: both ends should be reported; status:\n{}",
            h.name,
            show(&h.sample)
        );
    };
    assert!(
        c.is_shm() && s.is_shm() && c.ring.is_some() && c.ring == s.ring,
        "{}: not one shm ring:\n  {c}\n  {s}",
        h.name
    );
    assert!(
        c.stat("c2s_bytes") > 0,
        "{}: no bytes counted on the ring: {:?}",
        h.name,
        c.stats
    );
}
