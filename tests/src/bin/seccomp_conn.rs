//! seccomp_conn: a shimmed client that puts itself under a seccomp filter
//! in the middle of a ring connection and carries on.
//!
//! ```text
//! seccomp_conn echo
//! seccomp_conn client --port P --bytes N --go FILE --filter sshd|service|none
//!              [--errno] [--tsync] [--fork]
//! ```
//!
//! * `echo` listens on 127.0.0.1:0, prints `listening PORT`, and echoes
//!   every connection (a thread each) until end of stream.
//! * `client` connects, waits for readiness in an epoll instance, echoes N
//!   seeded bytes through the server (16 KiB at a time, each checked),
//!   then waits for FILE to exist (the test makes it once status shows the
//!   connection on a ring) and installs the filter: `sshd`, OpenSSH's
//!   pre-authentication allow-list plus epoll_wait, socket and connect
//!   (anything else kills, or fails with EPERM with `--errno`); `service`,
//!   systemd's @system-service (anything else fails with EPERM); `none`,
//!   no filter (for a client started under one, `seccomp_run`). With
//!   `--tsync` through seccomp(2) for every thread, else prctl for the
//!   calling one. Then it echoes N more bytes on that connection (same
//!   epoll instance), and N on a new one (waiting with poll; made and
//!   used by a forked child with `--fork`), and prints
//!   `echoed BYTES SHA256` over everything that came back. Exit 0 only if
//!   every byte came back as sent.

use std::io::Write;
use std::net::{Ipv4Addr, TcpStream};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use ringsock_integration::payload;
use ringsock_integration::seccomp::{self, fail, Outside};
use sha2::{Digest, Sha256};

const CHUNK: usize = 16 << 10;
/// Longest wait for one echo.
const WAIT_MS: i32 = 30_000;

fn usage() -> ! {
    eprintln!(
        "usage: seccomp_conn echo | client --port P --bytes N --go FILE --filter sshd|service|none [--errno] [--tsync] [--fork]"
    );
    std::process::exit(64);
}

/// How the client waits for its connection to be readable.
enum Waiter {
    Epoll(i32),
    Poll,
}

impl Waiter {
    fn wait_readable(&self, fd: i32) {
        let n = match self {
            Waiter::Epoll(ep) => {
                let mut ev = libc::epoll_event { events: 0, u64: 0 };
                // SAFETY: one event slot of ours.
                let n = unsafe { libc::epoll_wait(*ep, &mut ev, 1, WAIT_MS) };
                let data = ev.u64;
                if n == 1 && data != fd as u64 {
                    fail(&format!("epoll reported data {data} for fd {fd}"));
                }
                n
            }
            Waiter::Poll => {
                let mut p = libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one valid pollfd.
                unsafe { libc::poll(&mut p, 1, WAIT_MS) }
            }
        };
        match n {
            1 => {}
            0 => fail(&format!("fd {fd}: no echo within {WAIT_MS} ms")),
            _ => fail(&format!("wait: {}", std::io::Error::last_os_error())),
        }
    }
}

/// Sends `data` through the echo server on `s`, a chunk at a time, and
/// returns what came back (checked chunk by chunk). With read(2) and
/// write(2), as sshd does (std's streams send and receive).
fn through(s: &TcpStream, waiter: &Waiter, data: &[u8], what: &str) -> Vec<u8> {
    let fd = s.as_raw_fd();
    let mut back = Vec::with_capacity(data.len());
    let mut buf = vec![0u8; CHUNK];
    for chunk in data.chunks(CHUNK) {
        let mut sent = 0;
        while sent < chunk.len() {
            // SAFETY: writing from our own buffer.
            let n = unsafe { libc::write(fd, chunk[sent..].as_ptr().cast(), chunk.len() - sent) };
            if n <= 0 {
                fail(&format!(
                    "{what}: write: {}",
                    std::io::Error::last_os_error()
                ));
            }
            sent += n as usize;
        }
        let mut got = 0;
        while got < chunk.len() {
            waiter.wait_readable(fd);
            // SAFETY: reading into our own buffer.
            let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), chunk.len() - got) };
            if n < 0 {
                fail(&format!(
                    "{what}: read: {}",
                    std::io::Error::last_os_error()
                ));
            }
            let n = n as usize;
            if n == 0 {
                fail(&format!("{what}: end of stream at byte {}", back.len()));
            }
            if buf[..n] != chunk[got..got + n] {
                fail(&format!("{what}: bytes differ at {}", back.len()));
            }
            back.extend_from_slice(&buf[..n]);
            got += n;
        }
    }
    back
}

/// Runs `f` in a forked child, which exits 0 after it (`f` fails the
/// child itself); fails unless the child exits 0.
fn in_child(f: impl FnOnce()) {
    // SAFETY: fork in this single-threaded program; the child runs `f`
    // and leaves with _exit.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        fail(&format!("fork: {}", std::io::Error::last_os_error()));
    }
    if pid == 0 {
        f();
        // SAFETY: leaving the child at once.
        unsafe { libc::_exit(0) };
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    if unsafe { libc::waitpid(pid, &mut status, 0) } != pid {
        fail(&format!("waitpid: {}", std::io::Error::last_os_error()));
    }
    if !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
        fail(&format!("the child ended with status {status:#x}"));
    }
}

fn epoll_on(fd: i32) -> i32 {
    // SAFETY: plain epoll_create1.
    let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if ep < 0 {
        fail(&format!(
            "epoll_create1: {}",
            std::io::Error::last_os_error()
        ));
    }
    let mut ev = libc::epoll_event {
        events: libc::EPOLLIN as u32,
        u64: fd as u64,
    };
    // SAFETY: ev is valid for the call.
    if unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, fd, &mut ev) } != 0 {
        fail(&format!("epoll_ctl: {}", std::io::Error::last_os_error()));
    }
    ep
}

struct Opts {
    port: u16,
    bytes: usize,
    go: PathBuf,
    filter: Option<seccomp::Filter>,
    tsync: bool,
    fork: bool,
}

fn client(o: Opts) -> ! {
    let connect = || {
        TcpStream::connect((Ipv4Addr::LOCALHOST, o.port))
            .unwrap_or_else(|e| fail(&format!("connect: {e}")))
    };
    let first = connect();
    let ep = Waiter::Epoll(epoll_on(first.as_raw_fd()));
    let data = payload(o.bytes, 0x5ecc_0a11);
    let mut hash = Sha256::new();
    hash.update(through(&first, &ep, &data, "before the filter"));
    let deadline = Instant::now() + Duration::from_secs(60);
    while !o.go.exists() {
        if Instant::now() >= deadline {
            fail("the go file never appeared");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let installed = match &o.filter {
        None => Ok(()),
        Some(f) if o.tsync => seccomp::install_all_threads(f),
        Some(f) => seccomp::install(f),
    };
    installed.unwrap_or_else(|e| fail(&format!("installing the filter: {e}")));
    let mut total = data.len();
    let more = payload(o.bytes, 0x5ecc_0a12);
    hash.update(through(&first, &ep, &more, "after the filter"));
    total += more.len();
    let fresh = payload(o.bytes, 0x5ecc_0a13);
    if o.fork {
        in_child(|| {
            through(
                &connect(),
                &Waiter::Poll,
                &fresh,
                "new connection in a child",
            );
        });
        // The child compared every byte that came back with `fresh`.
        hash.update(&fresh);
    } else {
        // Kept until _exit: dropping it would make std's debug check of
        // the descriptor (fcntl), outside sshd's allow-list.
        let second = connect();
        hash.update(through(&second, &Waiter::Poll, &fresh, "new connection"));
        std::mem::forget(second);
    }
    total += fresh.len();
    let hex: String = hash.finalize().iter().map(|b| format!("{b:02x}")).collect();
    println!("echoed {total} {hex}");
    std::io::stdout().flush().ok();
    // SAFETY: leaving at once: std's exit path takes down its signal stack
    // with sigaltstack, which the filter does not allow.
    unsafe { libc::_exit(0) }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value = |name: &str| -> String {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
            .unwrap_or_else(|| usage())
    };
    let flag = |name: &str| args.iter().any(|a| a == name);
    match args.first().map(String::as_str) {
        Some("echo") => ringsock_integration::echo::serve(),
        Some("client") => {
            let outside = if flag("--errno") {
                Outside::Errno
            } else {
                Outside::Kill
            };
            let filter = match value("--filter").as_str() {
                "none" => None,
                "sshd" => Some(seccomp::sshd_filter_and(
                    &[
                        libc::SYS_epoll_wait,
                        libc::SYS_epoll_pwait,
                        libc::SYS_socket,
                        libc::SYS_connect,
                    ],
                    outside,
                )),
                "service" => Some(
                    seccomp::system_service_filter()
                        .unwrap_or_else(|| fail("no systemd-analyze to spell @system-service")),
                ),
                _ => usage(),
            };
            client(Opts {
                port: value("--port").parse().unwrap_or_else(|_| usage()),
                bytes: value("--bytes").parse().unwrap_or_else(|_| usage()),
                go: PathBuf::from(value("--go")),
                filter,
                tsync: flag("--tsync"),
                fork: flag("--fork"),
            })
        }
        _ => usage(),
    }
}
