//! sandbox_echo: the shape of sshd's connection handling, for the shim:
//! a process uses a connection, forks, and the child puts itself under
//! OpenSSH's pre-authentication seccomp sandbox (seccomp.rs) and carries
//! on with the connection, making only the calls that sandbox allows.
//!
//! ```text
//! sandbox_echo server [--log] [--keep-fds]
//! sandbox_echo client --port P --bytes N [--log] [--keep-fds]
//! ```
//!
//! * `server` listens on 127.0.0.1:0, prints `listening PORT`, accepts one
//!   connection and reads the client's `hello` line itself (as sshd's
//!   monitor reads the banner), then forks: the child sandboxes itself and
//!   echoes every byte until end of stream, then shuts its side down.
//! * `client` connects, sends `hello`, and forks: the child sandboxes
//!   itself, sends N seeded bytes while reading the echo (poll on the one
//!   socket), shuts its side down, reads to end of stream and compares.
//!
//! In both the parent keeps its copy of the connection open while the
//! child runs (as sshd's monitor does), waits for the child and prints
//! what the child reports, `echoed N SHA256` (client) or `served N`
//! (server), then `child exited S` or `child killed by signal S`. Exit 0 only if the
//! child exited 0. With `--log`, calls outside the allow-list are logged by
//! the kernel (audit type 1326) instead of killing the child: one run then
//! lists every call that would have been fatal. `--keep-fds` leaves the
//! descriptor limit alone (sshd sets it to 1, and poll(2) with more
//! entries fails with EINVAL), to list the calls past such a wait.

use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;

use ringsock_integration::payload;
use ringsock_integration::seccomp::{fail, sandbox_like_sshd, Outside};
use sha2::{Digest, Sha256};

fn usage() -> ! {
    eprintln!(
        "usage: sandbox_echo server [--log] [--keep-fds] | client --port P --bytes N [--log] [--keep-fds]"
    );
    std::process::exit(64);
}

/// How the child sandboxes itself.
#[derive(Clone, Copy)]
struct Sandbox {
    outside: Outside,
    keep_fds: bool,
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// Waits (poll, up to 20 s) until `fd` is ready for `events`; returns the
/// ready events.
fn wait(fd: i32, events: i16) -> i16 {
    let mut p = libc::pollfd {
        fd,
        events,
        revents: 0,
    };
    loop {
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut p, 1, 20_000) };
        match n {
            1 => return p.revents,
            0 => fail("no progress within 20 s"),
            _ if errno() == libc::EINTR => continue,
            _ => fail(&format!("poll: errno {}", errno())),
        }
    }
}

/// read(2), EINTR and EAGAIN retried after a poll; 0 at end of stream.
fn read_some(fd: i32, buf: &mut [u8]) -> usize {
    loop {
        // SAFETY: reading into our own buffer.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n >= 0 {
            return n as usize;
        }
        match errno() {
            libc::EINTR => {}
            libc::EAGAIN => {
                wait(fd, libc::POLLIN);
            }
            e => fail(&format!("read: errno {e}")),
        }
    }
}

fn write_all(fd: i32, mut buf: &[u8]) {
    while !buf.is_empty() {
        // SAFETY: writing from our own buffer.
        let n = unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) };
        if n > 0 {
            buf = &buf[n as usize..];
            continue;
        }
        match errno() {
            libc::EINTR => {}
            libc::EAGAIN => {
                wait(fd, libc::POLLOUT);
            }
            e => fail(&format!("write: errno {e}")),
        }
    }
}

fn shut_wr(fd: i32) {
    // SAFETY: shutdown of our own socket.
    if unsafe { libc::shutdown(fd, libc::SHUT_WR) } != 0 {
        fail(&format!("shutdown: errno {}", errno()));
    }
}

/// Echoes until end of stream; returns the byte count.
fn serve(fd: i32) -> usize {
    let mut buf = vec![0u8; 64 << 10];
    let mut total = 0;
    loop {
        let n = read_some(fd, &mut buf);
        if n == 0 {
            shut_wr(fd);
            return total;
        }
        write_all(fd, &buf[..n]);
        total += n;
    }
}

/// Sends `data` while reading the echo back (on a non-blocking socket, so
/// neither direction's full ring can stall the other); returns what came
/// back by end of stream.
fn exchange(fd: i32, data: &[u8]) -> Vec<u8> {
    let mut back = Vec::with_capacity(data.len());
    let mut buf = vec![0u8; 64 << 10];
    let mut sent = 0;
    let mut shut = false;
    loop {
        let want = if sent < data.len() {
            libc::POLLIN | libc::POLLOUT
        } else {
            libc::POLLIN
        };
        let ready = wait(fd, want);
        if ready & libc::POLLOUT != 0 && sent < data.len() {
            let chunk = &data[sent..(sent + (32 << 10)).min(data.len())];
            // SAFETY: writing from our own buffer.
            let n = unsafe { libc::write(fd, chunk.as_ptr().cast(), chunk.len()) };
            if n > 0 {
                sent += n as usize;
            } else if errno() != libc::EAGAIN && errno() != libc::EINTR {
                fail(&format!("write: errno {}", errno()));
            }
        }
        if sent == data.len() && !shut {
            shut_wr(fd);
            shut = true;
        }
        if ready & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0 {
            // SAFETY: reading into our own buffer.
            let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
            if n == 0 {
                return back;
            }
            if n > 0 {
                back.extend_from_slice(&buf[..n as usize]);
            } else if errno() != libc::EAGAIN && errno() != libc::EINTR {
                fail(&format!("read: errno {}", errno()));
            }
        }
    }
}

/// Forks; the child sandboxes itself and runs `child`, which returns its
/// exit status and a line for the parent to print (through a pipe: with
/// no file allowed to grow, the child cannot write to a redirected
/// stdout); the parent keeps the connection open, waits and reports.
fn fork_sandboxed(sandbox: Sandbox, child: impl FnOnce() -> (i32, String)) -> ! {
    let mut pipe = [0; 2];
    // SAFETY: pipe2 fills two fds of ours.
    if unsafe { libc::pipe2(pipe.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        fail(&format!("pipe: errno {}", errno()));
    }
    // SAFETY: fork; the child goes on with this single-threaded program's
    // own state and leaves with _exit.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        fail(&format!("fork: errno {}", errno()));
    }
    if pid == 0 {
        if let Err(e) = sandbox_like_sshd(sandbox.outside, sandbox.keep_fds) {
            fail(&format!("sandbox: {e}"));
        }
        let (status, line) = child();
        write_all(pipe[1], format!("{line}\n").as_bytes());
        // SAFETY: leaving the child without running the parent's exit
        // handlers twice.
        unsafe { libc::_exit(status) };
    }
    // SAFETY: our copy of the pipe's write end.
    unsafe { libc::close(pipe[1]) };
    let mut said = Vec::new();
    let mut buf = [0u8; 256];
    loop {
        let n = read_some(pipe[0], &mut buf);
        if n == 0 {
            break;
        }
        said.extend_from_slice(&buf[..n]);
    }
    print!("{}", String::from_utf8_lossy(&said));
    let mut status = 0;
    // SAFETY: waiting for our own child.
    if unsafe { libc::waitpid(pid, &mut status, 0) } != pid {
        fail(&format!("waitpid: errno {}", errno()));
    }
    if libc::WIFSIGNALED(status) {
        println!("child killed by signal {}", libc::WTERMSIG(status));
        std::process::exit(1);
    }
    let code = libc::WEXITSTATUS(status);
    println!("child exited {code}");
    std::process::exit(if code == 0 { 0 } else { 1 });
}

fn server(sandbox: Sandbox) -> ! {
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap_or_else(|e| fail(&e.to_string()));
    let port = l.local_addr().map(|a| a.port()).unwrap_or(0);
    println!("listening {port}");
    std::io::stdout().flush().ok();
    let (s, _) = l.accept().unwrap_or_else(|e| fail(&format!("accept: {e}")));
    drop(l);
    // The greeting, byte by byte: nothing of the payload may be read here.
    let mut hello = Vec::new();
    let mut r = BufReader::with_capacity(1, &s);
    r.read_until(b'\n', &mut hello)
        .unwrap_or_else(|e| fail(&format!("greeting: {e}")));
    if hello != b"hello\n" {
        fail(&format!("greeting {hello:?}"));
    }
    let fd = s.as_raw_fd();
    fork_sandboxed(sandbox, || (0, format!("served {}", serve(fd))))
}

fn client(port: u16, bytes: usize, sandbox: Sandbox) -> ! {
    let mut s = TcpStream::connect((Ipv4Addr::LOCALHOST, port))
        .unwrap_or_else(|e| fail(&format!("connect: {e}")));
    s.write_all(b"hello\n")
        .unwrap_or_else(|e| fail(&format!("greeting: {e}")));
    let data = payload(bytes, 0x5a5d_b0c5);
    let want = Sha256::digest(&data);
    // Before the sandbox: fcntl is not among its calls.
    s.set_nonblocking(true)
        .unwrap_or_else(|e| fail(&format!("O_NONBLOCK: {e}")));
    let fd = s.as_raw_fd();
    fork_sandboxed(sandbox, move || {
        let back = exchange(fd, &data);
        let got = Sha256::digest(&back);
        let hex: String = got.iter().map(|b| format!("{b:02x}")).collect();
        let status = i32::from(back.len() != data.len() || got != want);
        (status, format!("echoed {} {hex}", back.len()))
    })
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let sandbox = Sandbox {
        outside: if args.iter().any(|a| a == "--log") {
            Outside::Log
        } else {
            Outside::Kill
        },
        keep_fds: args.iter().any(|a| a == "--keep-fds"),
    };
    let value = |name: &str| -> usize {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| usage())
    };
    match args.first().map(String::as_str) {
        Some("server") => server(sandbox),
        Some("client") => client(value("--port") as u16, value("--bytes"), sandbox),
        _ => usage(),
    }
}
