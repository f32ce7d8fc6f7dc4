//! socat: a server that echoes one connection through a pipe (`PIPE`), a
//! client that sends a 24 MiB file and writes what comes back to another
//! (socat's `OPEN:in!!CREATE:out` dual address); both files' checksums
//! must match, and the connection be on one ring at both ends.

use std::time::Duration;

use ringsock_integration::matrix::Matrix;
use ringsock_integration::{
    assert_shim_silent, free_port, payload, require, sha256, wait_port, TempDir,
};

#[test]
fn socat_echoes_24mib_over_a_ring() {
    require!("socat");
    let mut m = Matrix::new();
    let dir = TempDir::new("socat");
    let data = payload(24 << 20, 31);
    let input = dir.write("in", &data);
    let output = dir.path().join("out");
    let port = free_port();
    // No fork: the one connection is served by the listening process.
    let mut server = m.serve(
        m.ctl
            .shimmed("socat")
            .arg(format!("TCP-LISTEN:{port},bind=127.0.0.1,reuseaddr"))
            .arg("PIPE"),
    );
    wait_port(&mut server, port, Duration::from_secs(10));
    let w = m.run(
        m.ctl
            .shimmed("socat")
            // Half-close: after the file, wait up to 20 s for the echo.
            .args(["-t", "20", "-b", "65536"])
            .arg(format!(
                "OPEN:{}!!CREATE:{}",
                input.display(),
                output.display()
            ))
            .arg(format!("TCP:127.0.0.1:{port}")),
        Duration::from_secs(60),
    );
    w.assert_ok("socat client");
    assert_shim_silent("socat client", &w.stderr);
    sha256::assert_file("socat echo", &output, &data);
    w.assert_on_rings("socat", port, 1);
    // The server serves one connection and exits by itself.
    let status = server.wait(Duration::from_secs(15));
    assert!(
        status.is_some_and(|s| s.success()),
        "socat server: {status:?}"
    );
    let errs = m.finish("socat", vec![server]);
    assert_shim_silent("socat server", &errs[0]);
}
