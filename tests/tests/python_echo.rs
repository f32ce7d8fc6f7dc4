//! python3 client and server, both under the shim with a daemon: sendall/
//! recv (threads), socket.makefile lines and asyncio streams (non-blocking)
//! carry 4 MiB each way with matching sha256, every one of those
//! connections is on a shared-memory ring while it is open, and once both
//! programs are gone nothing is left with the daemon.

mod common;

use common::{assert_held_shm, python_echo, Side};
use ringsock_integration::{assert_shim_silent, require, Ctl};

const SIZE: usize = 4 << 20;

#[test]
fn python_echo_4mib_both_ways_over_shm() {
    require!("python3");
    let ctl = Ctl::start();
    let (held, cerr, serr) = python_echo(Some(&ctl), Side::Shim, Side::Shim, SIZE);
    assert_eq!(held.len(), 3);
    for h in &held {
        assert_held_shm(h);
    }
    assert_shim_silent("client", &cerr);
    assert_shim_silent("server", &serr);
    // Both programs are gone (reaped by python_echo): nothing may be left
    // with the daemon.
    ctl.assert_clean("python echo", ringsock_integration::matrix::GONE);
}
