//! iperf3 client and server under the shim, 1 s in each direction.

use std::time::Duration;

use ringsock_integration::{assert_shim_silent, free_port, require, wait_port, Cmd};

/// Extracts end.sum_sent.bytes and end.sum_received.bytes, and fails on an
/// "error" key, using python's json module.
const PARSE: &str = r#"
import json, sys
d = json.load(sys.stdin)
assert "error" not in d, d.get("error")
print(int(d["end"]["sum_sent"]["bytes"]), int(d["end"]["sum_received"]["bytes"]))
"#;

fn run_direction(reverse: bool) {
    let port = free_port().to_string();
    let mut server = Cmd::shimmed("iperf3")
        .args(["-s", "-1", "-B", "127.0.0.1", "-p", &port])
        .spawn();
    wait_port(&mut server, port.parse().unwrap(), Duration::from_secs(10));
    // wait_port's probe connection counts as iperf3's single client on some
    // versions; give the one-off server a fresh start if it already exited.
    if server.wait(Duration::from_millis(300)).is_some() {
        server = Cmd::shimmed("iperf3")
            .args(["-s", "-1", "-B", "127.0.0.1", "-p", &port])
            .spawn();
        std::thread::sleep(Duration::from_millis(300));
    }
    let mut client = Cmd::shimmed("iperf3").args(["-c", "127.0.0.1", "-p", &port, "-t", "1", "-J"]);
    if reverse {
        client = client.arg("-R");
    }
    let out = client.run(Duration::from_secs(20));
    let json = String::from_utf8_lossy(&out.stdout).into_owned();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "iperf3 -c (reverse={reverse}) failed:\n{json}\n{err}"
    );
    assert_shim_silent("iperf3 client", &err);
    let parsed = std::process::Command::new("python3")
        .args(["-c", PARSE])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().unwrap().write_all(json.as_bytes())?;
            c.wait_with_output()
        })
        .expect("python3 json parse");
    let text = String::from_utf8_lossy(&parsed.stdout);
    assert!(
        parsed.status.success(),
        "{}\n{json}",
        String::from_utf8_lossy(&parsed.stderr)
    );
    let v: Vec<u64> = text
        .split_whitespace()
        .map(|x| x.parse().unwrap())
        .collect();
    assert!(v[0] > 0 && v[1] > 0, "no bytes moved: {v:?}");
    let _ = server.wait(Duration::from_secs(5));
    let (_, _, serr) = server.stop();
    assert_shim_silent("iperf3 server", &serr);
}

#[test]
fn iperf3_forward() {
    require!("iperf3", "python3");
    run_direction(false);
}

#[test]
fn iperf3_reverse() {
    require!("iperf3", "python3");
    run_direction(true);
}
