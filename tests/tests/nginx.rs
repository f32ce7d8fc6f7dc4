//! nginx (master + 2 workers, which accept on the master's inherited
//! listening socket) under the shim, serving 0 B, 1 MiB and 10 MiB files to
//! curl under the shim.

use std::time::Duration;

use ringsock_integration::{
    assert_shim_silent, free_port, payload, require, sha256, wait_port, Cmd, TempDir,
};

#[test]
fn nginx_serves_files_to_curl() {
    require!("nginx", "curl");
    let prefix = TempDir::new("nginx");
    let root = prefix.path().join("html");
    let files: Vec<(String, Vec<u8>)> = [(0usize, 11u64), (1 << 20, 12), (10 << 20, 13)]
        .iter()
        .map(|&(n, seed)| (format!("f{n}.bin"), payload(n, seed)))
        .collect();
    for (name, data) in &files {
        prefix.write(&format!("html/{name}"), data);
    }
    let sums: Vec<String> = files.iter().map(|(_, d)| sha256::hex(d)).collect();
    let port = free_port();
    let p = prefix.path().display();
    let conf = format!(
        "worker_processes 2;\n\
         pid {p}/nginx.pid;\n\
         error_log {p}/error.log warn;\n\
         events {{ worker_connections 64; }}\n\
         http {{\n\
           access_log off;\n\
           client_body_temp_path {p}/body;\n\
           proxy_temp_path {p}/proxy;\n\
           fastcgi_temp_path {p}/fastcgi;\n\
           uwsgi_temp_path {p}/uwsgi;\n\
           scgi_temp_path {p}/scgi;\n\
           sendfile on;\n\
           server {{ listen 127.0.0.1:{port}; root {}; }}\n\
         }}\n",
        root.display()
    );
    let conf_path = prefix.write("nginx.conf", conf.as_bytes());
    let mut server = Cmd::shimmed("nginx")
        .arg("-p")
        .arg(prefix.path())
        .arg("-c")
        .arg(&conf_path)
        .args(["-g", "daemon off; master_process on;"])
        .spawn();
    wait_port(&mut server, port, Duration::from_secs(10));

    // Several rounds, so that both workers get to serve.
    for round in 0..3 {
        for ((name, data), sum) in files.iter().zip(&sums) {
            let out = Cmd::shimmed("curl")
                .args(["-sS", "--fail", "--max-time", "10"])
                .arg(format!("http://127.0.0.1:{port}/{name}"))
                .run(Duration::from_secs(15));
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(
                out.status.success(),
                "round {round} curl {name}: {}\n{err}",
                out.status
            );
            assert_shim_silent("curl", &err);
            assert_eq!(out.stdout.len(), data.len(), "{name}: length");
            assert_eq!(&sha256::hex(&out.stdout), sum, "{name}: checksum");
        }
    }
    let (_, _, serr) = server.stop();
    assert_shim_silent("nginx", &serr);
    let log = std::fs::read_to_string(prefix.path().join("error.log")).unwrap_or_default();
    assert!(
        !log.contains("[alert]") && !log.contains("[crit]"),
        "nginx error.log:\n{log}"
    );
}
