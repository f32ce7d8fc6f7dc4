//! wakecount: a request/response exchange that counts how often the
//! shim's background thread (named `ringsock`) was switched in meanwhile.
//!
//! ```text
//! wakecount server|client --host ADDR --port P [--bursts K] [--rounds N]
//!                         [--size B] [--pause-ms MS]
//! ```
//!
//! The client sends messages of B bytes, each after it read the answer to
//! the one before; the server reads each whole and sends it back. Every
//! byte of a message is its number (mod 256), and each end checks what it
//! read. Two messages start the exchange, the second after a pause of MS
//! (the connection's setup work in the thread is over by then); then K
//! bursts of N messages, each burst after a pause of MS, which is longer
//! than the thread ticks after its last flush: it sleeps until woken.
//! From after the second message to the end, each end counts the
//! voluntary context switches of its process's `ringsock` thread
//! (/proc/self/task/*/status) and prints `bg_switches C` (`bg_switches
//! none` without such a thread), then `ok`. A send that leaves its bytes
//! for that thread to flush wakes it at least once a burst.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};

use ringsock_integration::args::{fail, number, value};

/// Voluntary context switches of this process's `ringsock` thread.
fn bg_switches() -> Option<u64> {
    let tasks = std::fs::read_dir("/proc/self/task").ok()?;
    for task in tasks.flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim() != "ringsock" {
            continue;
        }
        let status = std::fs::read_to_string(task.path().join("status")).ok()?;
        return status
            .lines()
            .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
            .and_then(|v| v.trim().parse().ok());
    }
    None
}

/// Reads one message of `size` bytes and checks every byte is `round`'s.
fn read_message(s: &mut TcpStream, buf: &mut [u8], round: usize) {
    if let Err(e) = s.read_exact(buf) {
        fail(&format!("read of message {round}: {e}"));
    }
    let want = round as u8;
    if let Some(i) = buf.iter().position(|&b| b != want) {
        fail(&format!(
            "message {round}: byte {i} is {} instead of {want}",
            buf[i]
        ));
    }
}

fn send_message(s: &mut TcpStream, buf: &mut [u8], round: usize) {
    buf.fill(round as u8);
    if let Err(e) = s.write_all(buf) {
        fail(&format!("send of message {round}: {e}"));
    }
}

fn print_switches(before: Option<u64>, after: Option<u64>) {
    match (before, after) {
        (Some(b), Some(a)) => println!("bg_switches {}", a.saturating_sub(b)),
        _ => println!("bg_switches none"),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let role = args.get(1).map(String::as_str).unwrap_or("");
    let addr = format!(
        "{}:{}",
        value(&args, "--host", None),
        value(&args, "--port", None)
    );
    let bursts = number(&args, "--bursts", Some("10")) as usize;
    let rounds = number(&args, "--rounds", Some("50")) as usize;
    let pause = std::time::Duration::from_millis(number(&args, "--pause-ms", Some("250")));
    let total = 2 + bursts * rounds;
    let mut buf = vec![0u8; (number(&args, "--size", Some("64")) as usize).max(1)];
    match role {
        "server" => {
            let l = TcpListener::bind(&addr).unwrap_or_else(|e| fail(&format!("bind {addr}: {e}")));
            println!("listening");
            let (mut s, _) = l.accept().unwrap_or_else(|e| fail(&format!("accept: {e}")));
            let mut before = None;
            for message in 1..=total {
                read_message(&mut s, &mut buf, message);
                send_message(&mut s, &mut buf, message);
                if message == 2 {
                    before = bg_switches();
                }
            }
            let after = bg_switches();
            let mut rest = Vec::new();
            if let Err(e) = s.read_to_end(&mut rest) {
                fail(&format!("read to end: {e}"));
            }
            if !rest.is_empty() {
                fail(&format!("{} unexpected bytes after {total}", rest.len()));
            }
            print_switches(before, after);
        }
        "client" => {
            let mut s =
                TcpStream::connect(&addr).unwrap_or_else(|e| fail(&format!("connect {addr}: {e}")));
            let mut exchange = |s: &mut TcpStream, message: usize| {
                send_message(s, &mut buf, message);
                read_message(s, &mut buf, message);
            };
            exchange(&mut s, 1);
            std::thread::sleep(pause);
            exchange(&mut s, 2);
            let before = bg_switches();
            let mut message = 2;
            for _ in 0..bursts {
                std::thread::sleep(pause);
                for _ in 0..rounds {
                    message += 1;
                    exchange(&mut s, message);
                }
            }
            print_switches(before, bg_switches());
        }
        _ => fail("usage: wakecount server|client --host ADDR --port P [--bursts K] [--rounds N]"),
    }
    println!("ok");
}
