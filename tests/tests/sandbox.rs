//! A ring connection used by a child that sandboxes itself the way sshd's
//! pre-authentication child does (tests/src/bin/sandbox_echo.rs: fork,
//! RLIMIT_NOFILE 1, OpenSSH's seccomp allow-list, anything else kills):
//! the shim in that child leaves the ring before the filter goes in and
//! makes no system call after it, or the child dies with SIGSYS. Both ends
//! (an echo server's child and a client's child) run sandboxed; 4 MiB go
//! round and must come back with the same checksum.

use std::time::Duration;

use ringsock_integration::{assert_shim_silent, out_field, payload, sha256, Cmd, Ctl, Server};

const BIN: &str = env!("CARGO_BIN_EXE_sandbox_echo");
const BYTES: usize = 4 << 20;

fn echo(server: Cmd, client: impl FnOnce(u16) -> Cmd, ctl: Option<&Ctl>) -> (String, String) {
    let mut s: Server = server.spawn();
    let line = s.wait_line("listening ", Duration::from_secs(10));
    let port: u16 = line["listening ".len()..].trim().parse().unwrap();
    let mut c = client(port).spawn();
    let (status, out, err, conns) = match ctl {
        Some(ctl) => {
            let w = ctl.watch(&mut c, Duration::from_secs(60));
            (w.status, w.stdout, w.stderr, Some(w.conns))
        }
        None => {
            let st = c.wait(Duration::from_secs(60));
            let (o, e) = c.output();
            (st, o, e, None)
        }
    };
    let sstatus = s.wait(Duration::from_secs(20));
    let (sout, serr) = s.output();
    assert!(
        status.is_some_and(|x| x.success()) && sstatus.is_some_and(|x| x.success()),
        "client {status:?}:\n{out}{err}\nserver {sstatus:?}:\n{sout}{serr}"
    );
    if let Some(conns) = conns {
        // The parents keep their copies open while their children run:
        // the connection is listed at both ends, made on one ring (which
        // the children leave at their sandbox: then it reads `tcp`).
        let links = ringsock_integration::links(&conns, port);
        assert!(
            !links.is_empty()
                && links
                    .iter()
                    .all(|l| l.client.ring.is_some() && l.client.ring == l.server.ring),
            "sandbox_echo: not made on one ring:\n{}",
            ringsock_integration::show(&conns)
        );
    }
    let want = sha256::hex(&payload(BYTES, 0x5a5d_b0c5));
    assert_eq!(out_field(&out, "echoed"), [BYTES.to_string(), want]);
    assert_eq!(out_field(&sout, "served"), [BYTES.to_string()]);
    (err, serr)
}

/// The helper and its filter, without the shim: what the sandbox allows
/// is enough for the program itself.
#[test]
fn sandboxed_children_echo_without_the_shim() {
    echo(
        Cmd::plain(BIN).arg("server"),
        |port| {
            Cmd::plain(BIN)
                .args(["client", "--port", &port.to_string(), "--bytes"])
                .arg(BYTES.to_string())
        },
        None,
    );
}

/// Under the shim: the children leave the ring as they sandbox
/// themselves, and carry on over TCP with plain libc calls.
#[test]
fn sandboxed_children_carry_on_their_ring_connection() {
    let ctl = Ctl::start();
    let (cerr, serr) = echo(
        ctl.shimmed(BIN).arg("server"),
        |port| {
            ctl.shimmed(BIN)
                .args(["client", "--port", &port.to_string(), "--bytes"])
                .arg(BYTES.to_string())
        },
        Some(&ctl),
    );
    assert_shim_silent("sandboxed client", &cerr);
    assert_shim_silent("sandboxed server", &serr);
}
