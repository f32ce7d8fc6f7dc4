//! curl fetching files from `python3 -m http.server`, both under the shim.

use std::time::Duration;

use ringsock_integration::{
    assert_shim_silent, free_port, payload, require, sha256, wait_port, Cmd, TempDir,
};

#[test]
fn curl_fetches_from_python_http_server() {
    require!("python3", "curl");
    let dir = TempDir::new("http");
    let files: Vec<(String, Vec<u8>)> = [(0usize, 1u64), (1000, 2), (3 << 20, 3)]
        .iter()
        .map(|&(n, seed)| (format!("f{n}.bin"), payload(n, seed)))
        .collect();
    for (name, data) in &files {
        dir.write(name, data);
    }
    let port = free_port();
    let mut server = Cmd::shimmed("python3")
        .args([
            "-m",
            "http.server",
            "--bind",
            "127.0.0.1",
            &port.to_string(),
        ])
        .current_dir(dir.path())
        .spawn();
    wait_port(&mut server, port, Duration::from_secs(10));

    for (name, data) in &files {
        let out = Cmd::shimmed("curl")
            .args(["-sS", "--fail", "--max-time", "10"])
            .arg(format!("http://127.0.0.1:{port}/{name}"))
            .run(Duration::from_secs(15));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "curl {name}: {}\n{err}", out.status);
        assert_shim_silent("curl", &err);
        assert_eq!(out.stdout.len(), data.len(), "{name}: length");
        assert_eq!(
            sha256::hex(&out.stdout),
            sha256::hex(data),
            "{name}: checksum"
        );
    }
    let (_, _, serr) = server.stop();
    assert_shim_silent("http.server", &serr);
}
