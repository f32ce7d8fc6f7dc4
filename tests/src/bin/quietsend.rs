//! quietsend: a writer that goes quiet right after a send (it sleeps, a
//! call the shim does not see) must still wake a reader that sleeps on the
//! ring: a batched byte, or the check for the sleeping reader owed when
//! the send's tail WRITE completes on verbs, is the shim background
//! thread's job and cannot wait for the writer's next call.
//!
//! ```text
//! quietsend server --host ADDR --port P --mark FILE [--rounds N]
//! quietsend client --host ADDR --port P --mark FILE [--rounds N]
//!                  [--before-ms 2000] [--after-ms 3000]
//! ```
//!
//! The client connects, then N times: sleeps BEFORE ms (the server is
//! blocked in recv meanwhile, asleep on its ring), sends one byte, sleeps
//! AFTER ms. The server writes the count of bytes it has read to FILE
//! after each one; the client, after each AFTER sleep and before its next
//! call on the socket, reads FILE and fails unless that byte arrived while
//! it slept. The server prints how long its first recv took from accept
//! (`waited_ms`), then `ok` at EOF after N bytes.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use ringsock_integration::args::{fail, number, value};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let role = args.get(1).map(String::as_str).unwrap_or("");
    let addr = format!(
        "{}:{}",
        value(&args, "--host", None),
        value(&args, "--port", None)
    );
    match role {
        "server" => {
            let mark = value(&args, "--mark", None);
            let rounds = number(&args, "--rounds", Some("1")) as u32;
            let l = TcpListener::bind(&addr).unwrap_or_else(|e| fail(&format!("bind {addr}: {e}")));
            println!("listening");
            let (mut s, _) = l.accept().unwrap_or_else(|e| fail(&format!("accept: {e}")));
            let t0 = Instant::now();
            for i in 1..=rounds {
                let mut b = [0u8; 1];
                match s.read(&mut b) {
                    Ok(1) if b[0] == b'q' => {}
                    r => fail(&format!("read {i}: {r:?} {b:?}")),
                }
                if i == 1 {
                    println!("waited_ms {}", t0.elapsed().as_millis());
                }
                std::fs::write(&mark, i.to_string())
                    .unwrap_or_else(|e| fail(&format!("write {mark}: {e}")));
            }
            let mut rest = Vec::new();
            if let Err(e) = s.read_to_end(&mut rest) {
                fail(&format!("read to end: {e}"));
            }
            if !rest.is_empty() {
                fail(&format!("{} unexpected bytes after {rounds}", rest.len()));
            }
            println!("ok");
        }
        "client" => {
            let mark = value(&args, "--mark", None);
            let rounds = number(&args, "--rounds", Some("1")) as u32;
            let before = number(&args, "--before-ms", Some("2000"));
            let after = number(&args, "--after-ms", Some("3000"));
            let mut s =
                TcpStream::connect(&addr).unwrap_or_else(|e| fail(&format!("connect {addr}: {e}")));
            for i in 1..=rounds {
                std::thread::sleep(Duration::from_millis(before));
                if let Err(e) = s.write_all(b"q") {
                    fail(&format!("send {i}: {e}"));
                }
                std::thread::sleep(Duration::from_millis(after));
                let got: u32 = std::fs::read_to_string(&mark)
                    .ok()
                    .and_then(|t| t.trim().parse().ok())
                    .unwrap_or(0);
                if got < i {
                    fail(&format!(
                        "byte {i} was not delivered while the writer slept {after} ms \
                         (the reader has {got})"
                    ));
                }
            }
            drop(s);
            println!("ok");
        }
        _ => {
            eprintln!("usage: quietsend server|client --host ADDR --port P --mark FILE");
            std::process::exit(2)
        }
    }
}
