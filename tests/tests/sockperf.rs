//! sockperf server and client (ping-pong, throughput) under the shim with a
//! daemon (a program-matrix run): sane output (messages counted,
//! observations, no drops, no errors), the connection on a shared-memory
//! ring at both ends, and nothing left behind.

use std::time::Duration;

use ringsock_integration::matrix::Matrix;
use ringsock_integration::{assert_shim_silent, free_port, require, wait_port, Server};

fn start(m: &mut Matrix) -> (Server, u16) {
    let port = free_port();
    let mut server = m.serve(m.ctl.shimmed("sockperf").args([
        "server",
        "--tcp",
        "-i",
        "127.0.0.1",
        "-p",
        &port.to_string(),
    ]));
    wait_port(&mut server, port, Duration::from_secs(10));
    (server, port)
}

/// The server still runs and let go of the connection, and nothing is
/// left once it stops.
fn finish(m: Matrix, mut server: Server, port: u16) {
    server.assert_running();
    println!("{}", m.ctl.expect(port, "ends=0", Duration::from_secs(10)));
    let errs = m.finish("sockperf", vec![server]);
    assert_shim_silent("sockperf server", &errs[0]);
}

/// The number right after the first `key` (in `text`) that a number
/// follows.
fn number_after(text: &str, key: &str) -> u64 {
    text.match_indices(key)
        .find_map(|(i, _)| {
            let digits: String = text[i + key.len()..]
                .trim_start()
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            digits.parse().ok()
        })
        .unwrap_or_else(|| panic!("no number after `{key}` in:\n{text}"))
}

fn sanity(text: &str) {
    let lower = text.to_lowercase();
    for bad in ["error", "fail", "abort"] {
        assert!(!lower.contains(bad), "sockperf reported `{bad}`:\n{text}");
    }
}

#[test]
fn sockperf_ping_pong_over_shm() {
    require!("sockperf");
    let mut m = Matrix::new();
    let (server, port) = start(&mut m);
    let w = m.run(
        m.ctl
            .shimmed("sockperf")
            .args(["ping-pong", "--tcp", "-i", "127.0.0.1", "-p"])
            .arg(port.to_string())
            // sockperf's default rate cap aborts a run faster than it
            // (`_seqN > m_maxSequenceNo`): raised past what a ring reaches.
            .args(["-t", "2", "-m", "64", "--mps", "5000000"]),
        Duration::from_secs(30),
    );
    w.assert_ok("sockperf ping-pong");
    let text = format!("{}{}", w.stdout, w.stderr);
    assert_shim_silent("sockperf ping-pong", &w.stderr);
    sanity(&text);
    let sent = number_after(&text, "SentMessages=");
    let received = number_after(&text, "ReceivedMessages=");
    let observations = number_after(&text, "Total ");
    assert!(
        sent > 0 && received > 0 && observations > 0,
        "nothing measured:\n{text}"
    );
    assert!(
        text.contains(
            "# dropped messages = 0; # duplicated messages = 0; # out-of-order messages = 0"
        ),
        "{text}"
    );
    let links = w.assert_on_rings("sockperf ping-pong", port, 1);
    println!(
        "ping-pong: {sent} sent, {received} received, {observations} observations; {}",
        links[0]
    );
    finish(m, server, port);
}

#[test]
fn sockperf_throughput_over_shm() {
    require!("sockperf");
    let mut m = Matrix::new();
    let (server, port) = start(&mut m);
    let w = m.run(
        m.ctl
            .shimmed("sockperf")
            .args(["throughput", "--tcp", "-i", "127.0.0.1", "-p"])
            .arg(port.to_string())
            .args(["-t", "2", "-m", "1024"]),
        Duration::from_secs(30),
    );
    w.assert_ok("sockperf throughput");
    let text = format!("{}{}", w.stdout, w.stderr);
    assert_shim_silent("sockperf throughput", &w.stderr);
    sanity(&text);
    let sent = number_after(&text, "Total of ");
    assert!(sent > 0, "nothing sent:\n{text}");
    assert!(text.contains("Message Rate is"), "{text}");
    let links = w.assert_on_rings("sockperf throughput", port, 1);
    let bytes = links
        .iter()
        .map(|l| l.server.stat("c2s_bytes"))
        .max()
        .unwrap();
    assert!(
        bytes > 0,
        "no bytes on the ring: {:?}",
        links[0].server.stats
    );
    println!(
        "throughput: {sent} messages; {} ({bytes} B seen on the ring)",
        links[0]
    );
    finish(m, server, port);
}
