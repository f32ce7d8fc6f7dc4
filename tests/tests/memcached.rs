//! memcached under the shim, loaded by memcslap and checked by a python
//! client speaking the text protocol (both under the shim).

use std::time::Duration;

use ringsock_integration::{assert_shim_silent, free_port, require, wait_port, Cmd};

const CLIENT: &str = r#"
import socket, sys
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
print("memcached ok")
"#;

#[test]
fn memcached_under_load_and_readback() {
    require!("memcached");
    let port = free_port();
    let mut server = Cmd::shimmed("memcached")
        .args([
            "-l",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-U",
            "0",
            "-u",
            "root",
            "-t",
            "2",
        ])
        .spawn();
    wait_port(&mut server, port, Duration::from_secs(10));

    if ringsock_integration::which("memcslap").is_some() {
        for test in ["set", "get"] {
            let (out, err) = Cmd::shimmed("memcslap")
                .arg(format!("--servers=127.0.0.1:{port}"))
                .args(["--concurrency=4", "--execute-number=2000", "--test", test])
                .run_ok(Duration::from_secs(30));
            assert_shim_silent("memcslap", &err);
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
        let (out, err) = Cmd::shimmed("python3")
            .args(["-c", CLIENT, &port.to_string()])
            .run_ok(Duration::from_secs(15));
        assert_shim_silent("python client", &err);
        assert!(out.contains("memcached ok"), "{out}");
    }
    let (_, _, serr) = server.stop();
    assert_shim_silent("memcached", &serr);
}
