//! handoff: apache mpm_event's keep-alive hand-over between a listener
//! thread and a worker, for the shim's wake-up tests.
//!
//! ```text
//! handoff server --mode add|oneshot [--hold-ms H]
//! handoff client --port P [--requests N] [--pause-ms MS] [--size B]
//! ```
//!
//! The server listens on 127.0.0.1:0, prints `listening PORT` and takes
//! one connection. Its listener thread waits (30 s at most) on an epoll
//! set holding the connection; when the connection is readable it takes
//! it out of the set (`add`: EPOLL_CTL_DEL; `oneshot`: the EPOLLONESHOT
//! registration disabled itself) and hands it to the worker thread. The
//! worker reads the request, answers it, finishes it for H ms (apache
//! logs it), and gives the connection back while the listener sleeps
//! (`add`: EPOLL_CTL_ADD; `oneshot`: EPOLL_CTL_MOD), as apache's worker
//! does after each response.
//!
//! The client sends N requests of B bytes, each MS after the answer to the
//! one before (MS > H: the connection is back in the listener's set, and
//! quiet, before the next request comes). Every byte of request i is i (mod 256), and the answer echoes
//! it; both ends check. The listener counts its own voluntary context
//! switches over its waits from the second request's to the end of the
//! stream's: kernel TCP makes that about one sleep per request, since
//! handing back a quiet connection wakes no waiter. The server prints
//! `requests N`, `listener_sleeps S`, then `ok`; the client `requests N`,
//! `ok`. Any violation prints `FAIL ...` and exits 1.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use ringsock_integration::args::{fail, number, value};

/// Longest a side waits for the other.
const STALL: Duration = Duration::from_secs(30);

/// The calling thread's voluntary context switches: each is a sleep.
fn sleeps_of_this_thread() -> u64 {
    let status = std::fs::read_to_string("/proc/thread-self/status")
        .unwrap_or_else(|e| fail(&format!("/proc/thread-self/status: {e}")));
    status
        .lines()
        .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| fail("no voluntary_ctxt_switches in /proc/thread-self/status"))
}

/// A request's bytes are its number; the answer echoes them.
fn check(buf: &[u8], n: usize, what: &str) {
    let want = n as u8;
    if let Some(i) = buf.iter().position(|&b| b != want) {
        fail(&format!(
            "{what} {n}: byte {i} is {} instead of {want}",
            buf[i]
        ));
    }
}

fn ctl(epfd: i32, op: i32, fd: i32, events: i32) {
    let mut ev = libc::epoll_event {
        events: events as u32,
        u64: fd as u64,
    };
    // SAFETY: ev is valid for the call.
    if unsafe { libc::epoll_ctl(epfd, op, fd, &mut ev) } != 0 {
        fail(&format!(
            "epoll_ctl op {op}: {}",
            std::io::Error::last_os_error()
        ));
    }
}

fn server(args: &[String]) {
    let oneshot = match value(args, "--mode", None).as_str() {
        "add" => false,
        "oneshot" => true,
        m => fail(&format!("--mode add|oneshot, not {m}")),
    };
    let hold = Duration::from_millis(number(args, "--hold-ms", Some("1")));
    let l =
        TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap_or_else(|e| fail(&format!("bind: {e}")));
    let port = l.local_addr().map(|a| a.port()).unwrap_or(0);
    println!("listening {port}");
    let (mut s, _) = l.accept().unwrap_or_else(|e| fail(&format!("accept: {e}")));
    let fd = s.as_raw_fd();
    // SAFETY: plain epoll creation.
    let epfd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if epfd < 0 {
        fail("epoll_create1");
    }
    let events = libc::EPOLLIN | if oneshot { libc::EPOLLONESHOT } else { 0 };
    ctl(epfd, libc::EPOLL_CTL_ADD, fd, events);
    // The worker's word to the listener that the client is gone.
    // SAFETY: plain eventfd creation.
    let stop = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    if stop < 0 {
        fail("eventfd");
    }
    ctl(epfd, libc::EPOLL_CTL_ADD, stop, libc::EPOLLIN);
    let (to_worker, from_listener) = mpsc::channel::<()>();
    let listener = std::thread::spawn(move || {
        // Sleeps from the wait for the second request on.
        let mut from = None;
        let mut handed = 0u64;
        loop {
            if handed == 1 {
                from = Some(sleeps_of_this_thread());
            }
            let mut ev = [libc::epoll_event { events: 0, u64: 0 }];
            // SAFETY: ev is valid for one event.
            let n = unsafe { libc::epoll_wait(epfd, ev.as_mut_ptr(), 1, STALL.as_millis() as i32) };
            match n {
                1 => {}
                0 => fail("the listener waited 30 s for a request"),
                _ => fail(&format!("epoll_wait: {}", std::io::Error::last_os_error())),
            }
            if ev[0].u64 == stop as u64 {
                return;
            }
            if !oneshot {
                ctl(epfd, libc::EPOLL_CTL_DEL, fd, 0);
            }
            handed += 1;
            if let Some(from) = from {
                SLEEPS.store(sleeps_of_this_thread() - from, Ordering::Relaxed);
            }
            if to_worker.send(()).is_err() {
                fail("the worker is gone");
            }
        }
    });
    let mut buf = Vec::new();
    let mut requests = 0usize;
    loop {
        if from_listener.recv_timeout(STALL).is_err() {
            fail("the worker waited 30 s for the listener");
        }
        let mut len = [0u8; 4];
        match s.read(&mut len[..1]) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) => fail(&format!("read: {e}")),
        }
        if let Err(e) = s.read_exact(&mut len[1..]) {
            fail(&format!("read of a length: {e}"));
        }
        buf.resize(u32::from_le_bytes(len) as usize, 0);
        if let Err(e) = s.read_exact(&mut buf) {
            fail(&format!("read of request {}: {e}", requests + 1));
        }
        requests += 1;
        check(&buf, requests, "request");
        if let Err(e) = s.write_all(&buf) {
            fail(&format!("answer {requests}: {e}"));
        }
        // Back to the listener, which sleeps by now (the client pauses).
        std::thread::sleep(hold);
        let op = if oneshot {
            libc::EPOLL_CTL_MOD
        } else {
            libc::EPOLL_CTL_ADD
        };
        ctl(epfd, op, fd, events);
    }
    // The end of the stream was handed over too; the listener waits again.
    let one = 1u64;
    // SAFETY: 8 bytes from a valid u64 to our eventfd.
    if unsafe { libc::write(stop, (&one as *const u64).cast(), 8) } != 8 {
        fail("write to the stop eventfd");
    }
    if listener.join().is_err() {
        fail("the listener thread panicked");
    }
    println!("requests {requests}");
    println!("listener_sleeps {}", SLEEPS.load(Ordering::Relaxed));
}

/// The listener's sleeps over its waits from the second request's to the
/// end of the stream's (N waits for N requests).
static SLEEPS: AtomicU64 = AtomicU64::new(0);

fn client(args: &[String]) {
    let port = number(args, "--port", Some("0")) as usize;
    let requests = number(args, "--requests", Some("200")) as usize;
    let pause = Duration::from_millis(number(args, "--pause-ms", Some("5")));
    let size = (number(args, "--size", Some("100")) as usize).max(1);
    let mut s = TcpStream::connect((Ipv4Addr::LOCALHOST, port as u16))
        .unwrap_or_else(|e| fail(&format!("connect: {e}")));
    if let Err(e) = s.set_read_timeout(Some(STALL)) {
        fail(&format!("SO_RCVTIMEO: {e}"));
    }
    let mut buf = vec![0u8; size];
    for n in 1..=requests {
        std::thread::sleep(pause);
        buf.fill(n as u8);
        let mut msg = (size as u32).to_le_bytes().to_vec();
        msg.extend_from_slice(&buf);
        if let Err(e) = s.write_all(&msg) {
            fail(&format!("request {n}: {e}"));
        }
        if let Err(e) = s.read_exact(&mut buf) {
            fail(&format!("answer {n}: {e}"));
        }
        check(&buf, n, "answer");
    }
    println!("requests {requests}");
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("server") => server(&args),
        Some("client") => client(&args),
        _ => fail("usage: handoff server --mode add|oneshot | client --port P [--requests N]"),
    }
    println!("ok");
}
