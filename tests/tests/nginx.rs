//! nginx (master + 2 workers, which accept on the master's inherited
//! listening socket) under the shim, serving 0 B, 1 MiB and 10 MiB files to
//! curl under the shim, with a daemon (a program-matrix run): right bytes,
//! every transfer seen while alive (the 10 MiB one is slowed down with
//! curl's --limit-rate) on a shared-memory ring between curl and a worker
//! (nginx uses sendfile, which the shim carries over the ring), the workers
//! let go of every connection, and nothing is left behind.

use std::time::Duration;

use ringsock_integration::http::curl;
use ringsock_integration::matrix::Matrix;
use ringsock_integration::nginx;
use ringsock_integration::sha256::assert_file;
use ringsock_integration::{
    assert_all_shm, assert_shim_silent, free_port, payload, require, wait_port, TempDir,
};

#[test]
fn nginx_serves_files_to_curl() {
    require!("nginx", "curl");
    let mut m = Matrix::new();
    let out_dir = TempDir::new("nginx-out");
    let prefix = TempDir::new("nginx");
    let root = prefix.path().join("html");
    let files: Vec<(String, Vec<u8>)> = [(0usize, 11u64), (1 << 20, 12), (10 << 20, 13)]
        .iter()
        .map(|&(n, seed)| (format!("f{n}.bin"), payload(n, seed)))
        .collect();
    for (name, data) in &files {
        prefix.write(&format!("html/{name}"), data);
    }
    let port = free_port();
    let conf = nginx::conf(
        prefix.path(),
        "worker_processes 2;",
        "worker_connections 64;",
        &format!(
            "sendfile on; server {{ listen 127.0.0.1:{port}; root {}; }}",
            root.display()
        ),
    );
    let mut server = m.serve(nginx::args(m.ctl.shimmed("nginx"), prefix.path(), &conf));
    wait_port(&mut server, port, Duration::from_secs(10));
    let idle = m.baseline();

    // Several rounds, so that both workers get to serve.
    let mut workers = std::collections::BTreeSet::new();
    for round in 0..3 {
        for (name, data) in &files {
            let dest = out_dir.path().join(format!("{round}-{name}"));
            let url = format!("http://127.0.0.1:{port}/{name}");
            m.settle(port);
            let w = m.run(
                curl(m.ctl.shimmed("curl"), &url, &dest, Some("20M")),
                Duration::from_secs(40),
            );
            w.assert_ok(&format!("round {round} curl {name}"));
            assert_shim_silent("curl", &w.stderr);
            assert_file(name, &dest, data);
            let min = usize::from(data.len() >= 10 << 20);
            for l in assert_all_shm(&format!("round {round} {name}"), &w.conns, port, min) {
                println!("round {round} {name}: {l}");
                workers.insert(l.server.pid);
            }
            if min > 0 {
                println!("{}", w.expect(port, "transport=shm,ends=2"));
            }
        }
    }
    println!("workers seen serving over shm: {workers:?}");
    println!("{}", m.ctl.expect(port, "ends=0", Duration::from_secs(10)));
    idle.assert_settled("nginx", Duration::from_secs(10));
    let errs = m.finish("nginx", vec![server]);
    assert_shim_silent("nginx", &errs[0]);
    nginx::assert_quiet_log(prefix.path());
}
