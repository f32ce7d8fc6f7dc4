//! nginx (master + 2 workers, which accept on the master's inherited
//! listening socket) under the shim, serving 0 B, 1 MiB and 10 MiB files to
//! curl under the shim, with a daemon (a program-matrix run): right bytes,
//! every transfer seen while alive (the 10 MiB one is slowed down with
//! curl's --limit-rate) on a shared-memory ring between curl and a worker
//! (nginx uses sendfile, which the shim carries over the ring), the workers
//! let go of every connection, and nothing is left behind.

use std::time::Duration;

use ringsock_integration::matrix::Matrix;
use ringsock_integration::{
    assert_all_shm, assert_shim_silent, free_port, payload, require, sha256, wait_port, TempDir,
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
    let mut server = m.serve(
        m.ctl
            .shimmed("nginx")
            .arg("-p")
            .arg(prefix.path())
            .arg("-c")
            .arg(&conf_path)
            .args(["-g", "daemon off; master_process on;"]),
    );
    wait_port(&mut server, port, Duration::from_secs(10));
    let idle = m.baseline();

    // Several rounds, so that both workers get to serve.
    let mut workers = std::collections::BTreeSet::new();
    for round in 0..3 {
        for ((name, data), sum) in files.iter().zip(&sums) {
            let dest = out_dir.path().join(format!("{round}-{name}"));
            let w = m.run(
                m.ctl
                    .shimmed("curl")
                    .args([
                        "-sS",
                        "--fail",
                        "--max-time",
                        "20",
                        "--limit-rate",
                        "20M",
                        "-o",
                    ])
                    .arg(&dest)
                    .arg(format!("http://127.0.0.1:{port}/{name}")),
                Duration::from_secs(25),
            );
            w.assert_ok(&format!("round {round} curl {name}"));
            assert_shim_silent("curl", &w.stderr);
            let got = std::fs::read(&dest).expect("curl output");
            assert_eq!(got.len(), data.len(), "{name}: length");
            assert_eq!(&sha256::hex(&got), sum, "{name}: checksum");
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
    let log = std::fs::read_to_string(prefix.path().join("error.log")).unwrap_or_default();
    assert!(
        !log.contains("[alert]") && !log.contains("[crit]"),
        "nginx error.log:\n{log}"
    );
}
