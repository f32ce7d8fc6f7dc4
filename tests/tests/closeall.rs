//! The shim's own descriptors are free numbers to the program: a client
//! that closes every descriptor but its connection (close_range, through
//! syscall(2) too, closefrom, a close() loop), or dup2s onto the shim's
//! numbers, keeps its ring connection and gets a new one on a ring
//! (tests/src/bin/closeall.rs). A shimmed Python that runs subprocesses
//! with close_fds=True (its child calls close_range before exec) does too.

use std::time::Duration;

use ringsock_integration::{assert_shim_silent, out_field, payload, sha256, Cmd, Ctl, TempDir};

const BIN: &str = env!("CARGO_BIN_EXE_closeall");
const BYTES: usize = 256 << 10;

/// Runs `client` (given the port and the go file) against a shimmed echo
/// server; checks the connection is on shared memory before FILE, and
/// both are once the client says `second`; returns its stdout.
fn run(client: impl FnOnce(&Ctl, u16, &std::path::Path) -> Cmd) -> String {
    let ctl = Ctl::start();
    let dir = TempDir::new("closeall");
    let go = dir.path().join("go");
    let mut echo = ctl.shimmed(BIN).arg("echo").spawn();
    let line = echo.wait_line("listening ", Duration::from_secs(10));
    let port: u16 = line["listening ".len()..].trim().parse().unwrap();
    let mut client = client(&ctl, port, &go).spawn();
    let links = ctl.wait_links(port, 1, Duration::from_secs(60));
    assert!(links.iter().all(|l| l.is_shm()), "not on a ring: {links:?}");
    std::fs::write(&go, b"").unwrap();
    client.wait_line("second", Duration::from_secs(120));
    let links = ctl.wait_links(port, 2, Duration::from_secs(60));
    assert!(
        links.len() == 2 && links.iter().all(|l| l.is_shm()),
        "both connections must be on rings: {links:?}"
    );
    std::fs::write(dir.path().join("go.2"), b"").unwrap();
    let (out, err, eerr) = client.wait_ok_beside(&mut echo, Duration::from_secs(120));
    assert_shim_silent("client", &err);
    assert_shim_silent("echo server", &eerr);
    out
}

fn run_mode(mode: &str) {
    let out = run(|ctl, port, go| {
        ctl.shimmed(BIN)
            .args(["client", "--port", &port.to_string(), "--bytes"])
            .arg(BYTES.to_string())
            .arg("--go")
            .arg(go)
            .args(["--mode", mode])
    });
    let mut all = payload(BYTES, 0xc105_ea11);
    all.extend(payload(BYTES, 0xc105_ea12));
    all.extend(payload(BYTES, 0xc105_ea13));
    assert_eq!(
        out_field(&out, "echoed"),
        [all.len().to_string(), sha256::hex(&all)]
    );
}

#[test]
fn close_range_around_the_connection() {
    run_mode("range");
}

#[test]
fn close_range_through_syscall() {
    run_mode("range-syscall");
}

#[test]
fn closefrom_above_the_connection() {
    run_mode("from");
}

#[test]
fn close_loop_up_to_the_limit() {
    run_mode("loop");
}

#[test]
fn dup2_onto_the_shims_numbers() {
    run_mode("dup2");
}

/// Python's subprocess (close_fds=True, the default) closes every
/// descriptor above 2 in the child before exec; the parent's ring
/// connection and its session go on, and a new connection gets a ring.
const PY: &str = r#"
import os, socket, subprocess, sys, time, hashlib
port, nbytes, go = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
def wait(path):
    end = time.time() + 120
    while not os.path.exists(path):
        if time.time() > end: sys.exit("no " + path)
        time.sleep(0.02)
def through(s, data):
    back = bytearray()
    for i in range(0, len(data), 16384):
        chunk = data[i:i + 16384]
        s.sendall(chunk)
        want = len(chunk)
        while want:
            b = s.recv(want)
            if not b: sys.exit("eof")
            back += b; want -= len(b)
    if bytes(back) != data: sys.exit("echo differs")
    return bytes(back)
h = hashlib.sha256(); total = 0
data = bytes(range(256)) * (nbytes // 256)
s = socket.create_connection(("127.0.0.1", port))
b = through(s, data); h.update(b); total += len(b)
wait(go)
for close_fds in (True, True, False):
    subprocess.run(["true"], close_fds=close_fds, check=True)
subprocess.run(["sh", "-c", "exec 3>&- 4>&-; true"], check=True)
b = through(s, data); h.update(b); total += len(b)
s2 = socket.create_connection(("127.0.0.1", port))
b = through(s2, data); h.update(b); total += len(b)
print("echoed", total, h.hexdigest())
print("second", flush=True)
wait(go + ".2")
through(s, b"last"); through(s2, b"last")
"#;

#[test]
fn python_subprocess_with_close_fds() {
    ringsock_integration::require!("python3");
    let out = run(|ctl, port, go| {
        ctl.shimmed("python3")
            .args(["-c", PY, &port.to_string(), &BYTES.to_string()])
            .arg(go)
    });
    let data: Vec<u8> = (0..=255u8).cycle().take(BYTES).collect();
    let all = data.repeat(3);
    assert_eq!(
        out_field(&out, "echoed"),
        [all.len().to_string(), sha256::hex(&all)]
    );
}
