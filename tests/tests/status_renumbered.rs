//! Status keeps a ring end whose process moves it to another fd number
//! (dup, then close of the first) while the first number goes to the
//! next connection: both rows are listed, each under the number that
//! holds it (tests/tests/scripts/renumbered.py). Before the fix the new
//! connection's report took the row of the moved one, which vanished
//! from status while it carried data.

use std::time::Duration;

use ringsock_integration::{
    assert_shim_silent, free_port, require, show, wait_port, Conn, Ctl, TempDir,
};

mod common;
use common::{field, script};

const T: Duration = Duration::from_secs(20);

/// The server's rows, as (fd, peer port).
fn server_rows(status: &[Conn], pid: u32) -> Vec<(i32, u16)> {
    let mut rows: Vec<(i32, u16)> = status
        .iter()
        .filter(|c| c.pid == pid && c.is_shm())
        .map(|c| (c.fd, c.peer.port()))
        .collect();
    rows.sort();
    rows
}

#[test]
fn a_moved_ring_end_keeps_its_row() {
    require!("python3");
    let ctl = Ctl::start();
    let port = free_port();
    let dir = TempDir::new("renumbered");
    let run = |mode: &str| {
        ctl.shimmed("python3")
            .arg(script("renumbered.py"))
            .arg(mode)
            .arg(port.to_string())
            .arg(dir.path())
            .spawn()
    };
    let mut server = run("server");
    wait_port(&mut server, port, T);
    let mut client = run("client");
    let moved = server.wait_line("moved ", T);
    let w: Vec<&str> = moved.split_whitespace().collect();
    let (first, second, port_a): (i32, i32, u16) = (
        w[1].parse().unwrap(),
        w[2].parse().unwrap(),
        w[3].parse().unwrap(),
    );
    let pid = server.pid();
    // Moved, with the first number free: one row, under the new number.
    let one = ctl.wait_for(T, |s| server_rows(s, pid) == [(second, port_a)]);
    assert!(
        one.is_some(),
        "fd {first} moved to {second}: one row under {second} expected:\n{}",
        show(&ctl.status())
    );
    std::fs::write(dir.path().join("go"), b"").unwrap();
    let both = server.wait_line("both ", T);
    let w: Vec<&str> = both.split_whitespace().collect();
    let (reused, port_b): (i32, u16) = (w[1].parse().unwrap(), w[2].parse().unwrap());
    assert_eq!(reused, first, "the next connection takes the first number");
    let mut want = vec![(second, port_a), (reused, port_b)];
    want.sort();
    let two = ctl.wait_for(T, |s| server_rows(s, pid) == want);
    assert!(
        two.is_some(),
        "both ring ends of the server expected at {want:?}:\n{}",
        show(&ctl.status())
    );
    std::fs::write(dir.path().join("done"), b"").unwrap();
    let (cout, cerr) = client.wait_ok(T);
    let (_, serr) = server.wait_ok(T);
    assert_shim_silent("renumbered.py client", &cerr);
    assert_shim_silent("renumbered.py server", &serr);
    assert_eq!(field(&cout, "got"), ["AB"], "{cout}");
    // The moved end's close names its new number: nothing is left.
    ctl.assert_clean("renumbered.py", T);
}
