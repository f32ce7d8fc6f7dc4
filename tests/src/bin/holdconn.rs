//! holdconn: one client connection that stays open, its process waiting
//! in poll(2) on it (a call the shim sees) until it is stopped.
//!
//! ```text
//! holdconn --port P [--no-threads]
//! ```
//!
//! Connects to 127.0.0.1:P, checks one echoed round trip (the peer is
//! `connloop echo-server`), prints `connected LOCAL_PORT`, then polls the
//! socket with a 50 ms timeout until the peer closes or a signal ends the
//! process. With `--no-threads` the process first makes thread creation
//! fail (RLIMIT_NPROC of 1, under uid/gid 65534 when started as root, whom
//! the limit does not bind), checks that it does, and prints
//! `threads refused`: the shim's background thread never runs in it.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::os::fd::AsRawFd;

fn fail(msg: String) -> ! {
    eprintln!("FAIL {msg}");
    std::process::exit(1);
}

/// Makes every later thread creation in this process fail.
fn refuse_threads() {
    let one = libc::rlimit {
        rlim_cur: 1,
        rlim_max: 1,
    };
    // SAFETY: a valid rlimit for our own process.
    if unsafe { libc::setrlimit(libc::RLIMIT_NPROC, &one) } != 0 {
        fail(format!("setrlimit: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: plain identity calls on our own process.
    unsafe {
        if libc::geteuid() == 0
            && (libc::setgroups(0, std::ptr::null()) != 0
                || libc::setresgid(65534, 65534, 65534) != 0
                || libc::setresuid(65534, 65534, 65534) != 0)
        {
            fail(format!(
                "dropping to uid 65534: {}",
                std::io::Error::last_os_error()
            ));
        }
    }
    if std::thread::Builder::new().spawn(|| ()).is_ok() {
        fail("a thread could still be started".into());
    }
    println!("threads refused");
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let port: u16 = args
        .iter()
        .position(|a| a == "--port")
        .and_then(|i| args.get(i + 1))
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| fail("usage: holdconn --port P [--no-threads]".into()));
    if args.iter().any(|a| a == "--no-threads") {
        refuse_threads();
    }
    let mut s = TcpStream::connect((Ipv4Addr::LOCALHOST, port))
        .unwrap_or_else(|e| fail(format!("connect: {e}")));
    let ping = b"holdconn round trip\n";
    s.write_all(ping)
        .unwrap_or_else(|e| fail(format!("write: {e}")));
    let mut back = [0u8; 20];
    s.read_exact(&mut back)
        .unwrap_or_else(|e| fail(format!("read: {e}")));
    if &back != ping {
        fail(format!("echo {back:?}"));
    }
    let local = s.local_addr().map_or(0, |a| a.port());
    println!("connected {local}");
    loop {
        let mut p = libc::pollfd {
            fd: s.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut p, 1, 50) };
        if n > 0 {
            // Only the peer's close (or an error) wakes it: nothing is sent.
            println!("peer closed");
            return;
        }
    }
}
