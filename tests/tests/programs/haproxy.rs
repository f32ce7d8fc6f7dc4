//! haproxy 2.x with two threads (`nbthread 2`: each thread its own epoll
//! set, connections handed between threads), mode http, `http-reuse
//! always`, in front of a shimmed keep-alive python back end; wrk (two
//! threads, 16 connections, 2 s) checks every response body. Every
//! connection, client to haproxy and haproxy to the back end, must be on
//! a ring at both ends; once wrk is gone haproxy must have let go of
//! every client connection.

use std::time::Duration;

use ringsock_integration::http::curl;
use ringsock_integration::matrix::Matrix;
use ringsock_integration::sha256::assert_file;
use ringsock_integration::{
    assert_shim_silent, free_port, out_field, payload, require, script, wait_port, TempDir,
};

use crate::support::{daemon_bin, http_backend};

#[test]
fn haproxy_two_threads_http_reuse_over_rings() {
    require!("wrk", "python3", "curl");
    let Some(haproxy_bin) = daemon_bin("haproxy") else {
        println!("SKIP: `haproxy` is not installed; install it to run this test");
        return;
    };
    let mut m = Matrix::new();
    let dir = TempDir::new("haproxy");
    let body = payload(24 << 10, 51);
    let file = dir.write("www/f.bin", &body);
    let (backend, back_port) = http_backend(&mut m, &dir.path().join("www"));
    let port = free_port();
    let conf = format!(
        "global\n  nbthread 2\n\
         defaults\n  mode http\n  timeout connect 5s\n  timeout client 30s\n  timeout server 30s\n\
         \x20 http-reuse always\n\
         frontend f\n  bind 127.0.0.1:{port}\n  default_backend b\n\
         backend b\n  server s1 127.0.0.1:{back_port}\n"
    );
    let conf = dir.write("haproxy.cfg", conf.as_bytes());
    let mut haproxy = m.serve(m.ctl.shimmed(&haproxy_bin).arg("-f").arg(&conf).arg("-db"));
    wait_port(&mut haproxy, port, Duration::from_secs(10));

    // One request through both hops first.
    let url = format!("http://127.0.0.1:{port}/f.bin");
    let got = dir.path().join("got.bin");
    let w = m.run(
        curl(m.ctl.shimmed("curl"), &url, &got, None),
        Duration::from_secs(40),
    );
    w.assert_ok("curl through haproxy");
    assert_file("curl through haproxy", &got, &body);

    let w = m.run(
        m.ctl
            .shimmed("wrk")
            .args(["-t", "2", "-c", "16", "-d", "2s", "--timeout", "10s", "-s"])
            .arg(script("wrk_check.lua"))
            .arg(&url)
            .arg("--")
            .arg(&file),
        Duration::from_secs(60),
    );
    w.assert_ok("wrk through haproxy");
    assert_shim_silent("wrk", &w.stderr);
    let checked = out_field(&w.stdout, "checked");
    let (ok, bad): (u64, u64) = (checked[1].parse().unwrap(), checked[3].parse().unwrap());
    assert_eq!(bad, 0, "wrong status or body:\n{}", w.stdout);
    // A stalled connection serves nothing: every one of the 16 must have
    // been served more than once in 2 s.
    assert!(ok >= 64, "only {ok} responses in 2 s:\n{}", w.stdout);
    assert!(
        !w.stdout.contains("Socket errors") && !w.stdout.contains("Non-2xx"),
        "{}",
        w.stdout
    );
    println!("haproxy: {ok} responses");
    w.assert_on_rings("wrk -> haproxy", port, 16);
    w.assert_on_rings("haproxy -> back end", back_port, 1);
    // wrk is gone: so must be every client connection's end in haproxy
    // (its idle back-end connections may stay, reused later).
    println!("{}", m.ctl.expect(port, "ends=0", Duration::from_secs(10)));
    let errs = m.finish("haproxy", vec![haproxy, backend]);
    assert_shim_silent("haproxy", &errs[0]);
    assert_shim_silent("back end", &errs[1]);
}
