//! python3 client and server, both under the shim: sendall/recv, makefile
//! and asyncio streams carry 4 MiB each way with matching sha256.

use std::time::Duration;

use ringsock_integration::{assert_shim_silent, free_port, require, wait_port, Cmd};

const SIZE: usize = 4 << 20;

fn script(name: &str) -> String {
    format!("{}/tests/scripts/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn field<'a>(out: &'a str, key: &str) -> Vec<&'a str> {
    // The last such line: wait_port's probe connections print first.
    out.lines()
        .rev()
        .find(|l| l.starts_with(&format!("{key} ")))
        .unwrap_or_else(|| panic!("no `{key}` line in:\n{out}"))
        .split_whitespace()
        .skip(1)
        .collect()
}

#[test]
fn python_echo_4mib_both_ways() {
    require!("python3");
    let (tport, aport) = (free_port(), free_port());
    let mut server = Cmd::shimmed("python3")
        .arg(script("echo_server.py"))
        .arg(tport.to_string())
        .arg(aport.to_string())
        .spawn();
    wait_port(&mut server, tport, Duration::from_secs(10));
    wait_port(&mut server, aport, Duration::from_secs(10));

    let (out, err) = Cmd::shimmed("python3")
        .arg(script("echo_client.py"))
        .arg(tport.to_string())
        .arg(aport.to_string())
        .arg(SIZE.to_string())
        .run_ok(Duration::from_secs(30));
    assert_shim_silent("client", &err);
    let sent = field(&out, "sent")[0].to_string();
    assert_eq!(
        field(&out, "threaded-back"),
        [SIZE.to_string().as_str(), &sent]
    );
    assert_eq!(
        field(&out, "asyncio-back"),
        [SIZE.to_string().as_str(), &sent]
    );
    assert!(out.contains("lines ok"), "{out}");

    // The server saw the same bytes (its lines appear once the connections
    // are done; poll briefly for them).
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let (sout, serr) = server.output();
        if sout.contains("threaded-received") && sout.matches("asyncio-received").count() >= 2 {
            assert_eq!(field(&sout, "threaded-received"), [sent.as_str()]);
            assert_eq!(field(&sout, "asyncio-received"), [sent.as_str()]);
            assert_shim_silent("server", &serr);
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "server output:\n{sout}\n{serr}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
