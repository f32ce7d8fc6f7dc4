//! memcached with 4 worker threads under the shim, loaded by memcslap and
//! checked by a python client speaking the text protocol (both under the
//! shim), with a daemon (a program-matrix run): right answers, the
//! connections on shared-memory rings at both ends while they run (the
//! python client keeps its connection open for half a second), the server
//! lets go of them, and nothing is left behind.

use std::time::Duration;

use ringsock_integration::matrix::Matrix;
use ringsock_integration::{assert_all_shm, assert_shim_silent, free_port, require, wait_port};

const CLIENT: &str = r#"
import socket, sys, time
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=10)
f = s.makefile("rwb")
value = bytes(range(256)) * 400
f.write(b"set ringsock 0 0 %d\r\n" % len(value) + value + b"\r\n"); f.flush()
assert f.readline() == b"STORED\r\n"
f.write(b"get ringsock\r\n"); f.flush()
head = f.readline().split()
assert head[:2] == [b"VALUE", b"ringsock"] and int(head[3]) == len(value), head
assert f.read(len(value)) == value
assert f.readline() == b"\r\n" and f.readline() == b"END\r\n"
f.write(b"incr nope 1\r\n"); f.flush()
assert f.readline() == b"NOT_FOUND\r\n"
time.sleep(0.5)
f.write(b"get ringsock\r\n"); f.flush()
assert f.readline().split()[:2] == [b"VALUE", b"ringsock"]
assert f.read(len(value) + 2) == value + b"\r\n" and f.readline() == b"END\r\n"
print("memcached ok")
"#;

#[test]
fn memcached_under_load_and_readback() {
    run(true);
}

/// The same without memcslap: the python client's read-back on its own.
#[test]
fn memcached_python_client_readback() {
    run(false);
}

fn run(with_memcslap: bool) {
    require!("memcached");
    let mut m = Matrix::new();
    let port = free_port();
    let mut server = m.serve(m.ctl.shimmed("memcached").args([
        "-l",
        "127.0.0.1",
        "-p",
        &port.to_string(),
        "-U",
        "0",
        "-u",
        "root",
        "-t",
        "4",
    ]));
    wait_port(&mut server, port, Duration::from_secs(10));
    let idle = m.baseline();

    if !with_memcslap {
        println!("memcslap skipped");
    } else if ringsock_integration::which("memcslap").is_some() {
        for test in ["set", "get"] {
            m.settle(port);
            let w = m.run(
                m.ctl
                    .shimmed("memcslap")
                    .arg(format!("--servers=127.0.0.1:{port}"))
                    .args(["--concurrency=4", "--execute-number=2000", "--test", test]),
                Duration::from_secs(30),
            );
            w.assert_ok(&format!("memcslap {test}"));
            let (out, err) = (&w.stdout, &w.stderr);
            assert_shim_silent("memcslap", err);
            // memcslap may finish between two samples: whatever was seen
            // must be shm.
            let links = assert_all_shm(&format!("memcslap {test}"), &w.conns, port, 0);
            println!(
                "memcslap {test}: {} connection(s) seen over shm",
                links.len()
            );
            let text = format!("{out}{err}");
            assert!(
                !text.to_lowercase().contains("fail"),
                "memcslap {test}:\n{text}"
            );
            let done = format!("Time to {test}");
            assert!(
                text.contains(&done),
                "memcslap {test} did not finish:\n{text}"
            );
        }
    } else {
        println!("memcslap not installed: running the python client only");
    }
    if ringsock_integration::which("python3").is_some() {
        m.settle(port);
        let w = m.run(
            m.ctl
                .shimmed("python3")
                .args(["-c", CLIENT, &port.to_string()]),
            Duration::from_secs(15),
        );
        w.assert_ok("python client");
        assert_shim_silent("python client", &w.stderr);
        assert!(w.stdout.contains("memcached ok"), "{}", w.stdout);
        let links = assert_all_shm("python client", &w.conns, port, 1);
        println!("python client: {}", links[0]);
        println!("{}", w.expect(port, "transport=shm,ends=2"));
    }
    println!("{}", m.ctl.expect(port, "ends=0", Duration::from_secs(10)));
    idle.assert_settled("memcached", Duration::from_secs(10));
    let errs = m.finish("memcached", vec![server]);
    assert_shim_silent("memcached", &errs[0]);
}
