//! ncat (nmap's netcat): a 16 MiB file each way, `--recv-only` and
//! `--send-only` at either end; the checksums must match and the
//! connection be on one ring at both ends.

use std::time::Duration;

use ringsock_integration::matrix::Matrix;
use ringsock_integration::{
    assert_shim_silent, free_port, payload, require, sha256, wait_port, TempDir,
};

/// Direction of a transfer, seen from the client.
#[derive(Clone, Copy, Debug)]
enum Way {
    Upload,
    Download,
}

fn transfer(way: Way) {
    require!("ncat");
    let mut m = Matrix::new();
    let dir = TempDir::new("ncat");
    let data = payload(16 << 20, 41);
    let input = dir.write("in", &data);
    let output = dir.path().join("out");
    let port = free_port().to_string();
    let (server_mode, client_mode) = match way {
        Way::Upload => ("--recv-only", "--send-only"),
        Way::Download => ("--send-only", "--recv-only"),
    };
    let mut server = m
        .ctl
        .shimmed("ncat")
        .args(["-l", "127.0.0.1", &port, server_mode]);
    let mut client = m
        .ctl
        .shimmed("ncat")
        .args(["127.0.0.1", &port, client_mode]);
    // The sender pauses 1 ms between its 8 KiB writes: the connection
    // lives a few seconds, long enough for status to see both ends on a
    // busy machine.
    match way {
        Way::Upload => {
            server = server.stdout_to(&output);
            client = client.stdin_from(&input).args(["--delay", "1ms"]);
        }
        Way::Download => {
            server = server.stdin_from(&input).args(["--delay", "1ms"]);
            client = client.stdout_to(&output);
        }
    }
    let mut server = m.serve(server);
    let port: u16 = port.parse().unwrap();
    wait_port(&mut server, port, Duration::from_secs(10));
    let w = m.run(client, Duration::from_secs(60));
    w.assert_ok(&format!("ncat client ({way:?})"));
    assert_shim_silent("ncat client", &w.stderr);
    let status = server.wait(Duration::from_secs(15));
    assert!(status.is_some_and(|s| s.success()), "ncat -l: {status:?}");
    sha256::assert_file(&format!("ncat {way:?}"), &output, &data);
    w.assert_on_rings(&format!("ncat {way:?}"), port, 1);
    let errs = m.finish("ncat", vec![server]);
    assert_shim_silent("ncat -l", &errs[0]);
}

#[test]
fn ncat_upload_16mib_over_a_ring() {
    transfer(Way::Upload);
}

#[test]
fn ncat_download_16mib_over_a_ring() {
    transfer(Way::Download);
}
