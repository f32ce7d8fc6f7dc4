//! closeall: a shimmed client that closes "every other descriptor" in the
//! middle of a ring connection, as daemons and subprocess children do, and
//! carries on.
//!
//! ```text
//! closeall echo
//! closeall client --port P --bytes N --go FILE --mode MODE
//! ```
//!
//! * `echo` listens on 127.0.0.1:0, prints `listening PORT`, and echoes
//!   every connection (a thread each) until end of stream.
//! * `client` connects and echoes N seeded bytes (16 KiB at a time), waits
//!   for FILE to exist (the test makes it once status shows the connection
//!   on a ring), then, by MODE:
//!   `range`: close_range(3, fd - 1, 0) and close_range(fd + 1, ~0U, 0)
//!   around its connection `fd`; `range-syscall`: the same through
//!   syscall(2); `from`: its connection moved to 3 (dup2) and closefrom(4);
//!   `loop`: close() on every number from 3 below the soft RLIMIT_NOFILE
//!   but its connection's; `dup2`: finds the shim's descriptors in
//!   /proc/self/fd (the daemon session, a unix socket; eventfds; a
//!   `memfd:ringsock` memory where there is one), checks that fcntl, dup and close see each
//!   as a free number (EBADF), then dup2s /dev/null onto the daemon
//!   session's number (must succeed, the number then holds /dev/null) and
//!   onto an eventfd's and a memfd's (must succeed, or fail with EBUSY
//!   and leave the number free to the program). Then it echoes N more
//!   bytes on the connection and N on a new one, prints
//!   `echoed BYTES SHA256` over everything that came back and `second`,
//!   and waits for FILE.2 (the test checks status meanwhile) before it
//!   ends. Exit 0 only if every byte came back as sent and every check held.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use libc::{c_int, c_uint};
use ringsock_integration::payload;
use sha2::{Digest, Sha256};

const CHUNK: usize = 16 << 10;

extern "C" {
    fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int;
    fn closefrom(lowfd: c_int);
}

fn fail(why: &str) -> ! {
    eprintln!("closeall: {why}");
    std::process::exit(1);
}

fn usage() -> ! {
    eprintln!("usage: closeall echo | client --port P --bytes N --go FILE --mode MODE");
    std::process::exit(64);
}

/// Sends `data` through the echo server, a chunk at a time, and returns
/// what came back (checked equal).
fn through(s: &mut TcpStream, data: &[u8], what: &str) -> Vec<u8> {
    let mut back = vec![0u8; data.len()];
    for (out, inp) in data.chunks(CHUNK).zip(back.chunks_mut(CHUNK)) {
        s.write_all(out)
            .unwrap_or_else(|e| fail(&format!("{what}: write: {e}")));
        s.read_exact(inp)
            .unwrap_or_else(|e| fail(&format!("{what}: read: {e}")));
    }
    if back != data {
        fail(&format!("{what}: the echo differs from what was sent"));
    }
    back
}

fn wait_for(path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !path.exists() {
        if Instant::now() > deadline {
            fail(&format!("{} never appeared", path.display()));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn errno() -> c_int {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn soft_nofile() -> c_uint {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: rl is a valid out-pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } != 0 {
        fail("getrlimit");
    }
    rl.rlim_cur.min(1 << 20) as c_uint
}

/// The shim's descriptors by kind, found by what /proc/self/fd says.
#[derive(Default)]
struct Found {
    session: Vec<c_int>,
    eventfds: Vec<c_int>,
    memfds: Vec<c_int>,
}

fn unix_inodes() -> Vec<String> {
    let text = std::fs::read_to_string("/proc/net/unix").unwrap_or_default();
    text.lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().nth(6).map(str::to_string))
        .collect()
}

fn shim_fds(mine: c_int) -> Found {
    let unix = unix_inodes();
    let mut found = Found::default();
    let dir = std::fs::read_dir("/proc/self/fd").unwrap_or_else(|e| fail(&format!("{e}")));
    let entries: Vec<_> = dir.filter_map(|e| e.ok()).collect();
    for e in entries {
        let Ok(fd) = e.file_name().to_string_lossy().parse::<c_int>() else {
            continue;
        };
        let Ok(target) = std::fs::read_link(e.path()) else {
            continue;
        };
        let t = target.to_string_lossy();
        if fd <= 2 || fd == mine {
            continue;
        }
        if t.starts_with("/memfd:ringsock") {
            found.memfds.push(fd);
        } else if t == "anon_inode:[eventfd]" {
            found.eventfds.push(fd);
        } else if let Some(ino) = t.strip_prefix("socket:[").and_then(|r| r.strip_suffix(']')) {
            if unix.iter().any(|u| u == ino) {
                found.session.push(fd);
            }
        }
    }
    found
}

/// fcntl, dup and close on `fd` fail with EBADF, as on a free number.
fn looks_free(fd: c_int, what: &str) {
    // SAFETY: fcntl/dup/close on a number; nothing of ours is there.
    let checks = unsafe {
        [
            ("fcntl", libc::fcntl(fd, libc::F_GETFD)),
            ("dup", libc::dup(fd)),
            ("close", libc::close(fd)),
        ]
    };
    for (call, r) in checks {
        if r != -1 || errno() != libc::EBADF {
            fail(&format!(
                "{call} on the shim's {what} {fd}: {r} (errno {})",
                errno()
            ));
        }
    }
}

/// dup2 of /dev/null onto `fd`: Ok(true) if it took the number (checked),
/// Ok(false) if it failed with EBUSY and left the number free.
fn dup2_onto(fd: c_int, what: &str) -> bool {
    let null = std::fs::File::open("/dev/null").unwrap_or_else(|e| fail(&format!("{e}")));
    // SAFETY: dup2 of our own file onto a number the program does not hold.
    let r = unsafe { libc::dup2(null.as_raw_fd(), fd) };
    if r == -1 && errno() == libc::EBUSY {
        looks_free(fd, what);
        return false;
    }
    if r != fd {
        fail(&format!(
            "dup2 onto the shim's {what} {fd}: {r} (errno {})",
            errno()
        ));
    }
    // SAFETY: fd is ours now (dup2 succeeded); the File closes it.
    let got = unsafe { std::fs::File::from_raw_fd(fd) };
    let (a, b) = (
        got.metadata().unwrap_or_else(|e| fail(&format!("{e}"))),
        null.metadata().unwrap_or_else(|e| fail(&format!("{e}"))),
    );
    use std::os::unix::fs::MetadataExt;
    if (a.dev(), a.ino(), a.rdev()) != (b.dev(), b.ino(), b.rdev()) {
        fail(&format!("{fd} after dup2 is not /dev/null"));
    }
    true
}

fn dup2_mode(mine: c_int) {
    let found = shim_fds(mine);
    if found.session.is_empty() || found.eventfds.is_empty() {
        fail(&format!(
            "not every kind of shim descriptor found: session {:?} eventfds {:?} memfds {:?}",
            found.session, found.eventfds, found.memfds
        ));
    }
    for (what, fds) in [
        ("session", &found.session),
        ("eventfd", &found.eventfds),
        ("memfd", &found.memfds),
    ] {
        for &fd in fds {
            looks_free(fd, what);
        }
    }
    if !dup2_onto(found.session[0], "session") {
        fail("dup2 onto the daemon session's number failed with EBUSY");
    }
    let eventfd = dup2_onto(found.eventfds[0], "eventfd");
    let memfd = found.memfds.first().map(|&fd| dup2_onto(fd, "memfd"));
    println!("dup2 session moved, eventfd taken {eventfd}, memfd taken {memfd:?}");
}

fn close_all(mode: &str, s: &mut TcpStream) {
    let fd = s.as_raw_fd() as c_uint;
    match mode {
        "range" => {
            // SAFETY: closes the numbers around our connection (below it
            // only if there are any: close_range(3, 2) is EINVAL).
            let r = unsafe {
                [
                    if fd > 3 { close_range(3, fd - 1, 0) } else { 0 },
                    close_range(fd + 1, !0, 0),
                ]
            };
            if r != [0, 0] {
                fail(&format!("close_range: {r:?} (errno {})", errno()));
            }
        }
        "range-syscall" => {
            // SAFETY: as above, through syscall(2).
            let r = unsafe {
                [
                    if fd > 3 {
                        libc::syscall(libc::SYS_close_range, 3, fd - 1, 0)
                    } else {
                        0
                    },
                    libc::syscall(libc::SYS_close_range, fd + 1, c_uint::MAX, 0),
                ]
            };
            if r != [0, 0] {
                fail(&format!("close_range: {r:?} (errno {})", errno()));
            }
        }
        "from" => {
            if fd != 3 {
                // SAFETY: dup2 of our connection onto 3; the old number
                // goes with closefrom, its stream lives on at 3.
                if unsafe { libc::dup2(fd as c_int, 3) } != 3 {
                    fail(&format!("dup2 to 3: errno {}", errno()));
                }
                // SAFETY: 3 is the copy dup2 just made, ours to own; the
                // old number's owner is forgotten (closefrom closes it).
                let moved = unsafe { TcpStream::from_raw_fd(3) };
                std::mem::forget(std::mem::replace(s, moved));
            }
            // SAFETY: closes everything above our connection.
            unsafe { closefrom(4) };
        }
        "loop" => {
            for n in 3..soft_nofile() {
                if n != fd {
                    // SAFETY: closing a number; whatever it held is no
                    // longer used by this program.
                    unsafe { libc::close(n as c_int) };
                }
            }
        }
        "dup2" => dup2_mode(fd as c_int),
        _ => usage(),
    }
}

fn client(port: u16, bytes: usize, go: PathBuf, mode: &str) -> ! {
    let mut s = TcpStream::connect((Ipv4Addr::LOCALHOST, port))
        .unwrap_or_else(|e| fail(&format!("connect: {e}")));
    let mut hash = Sha256::new();
    let mut total = 0;
    let mut echo = |s: &mut TcpStream, seed: u64, what: &str| {
        let back = through(s, &payload(bytes, seed), what);
        total += back.len();
        hash.update(&back);
    };
    echo(&mut s, 0xc105_ea11, "before");
    wait_for(&go);
    close_all(mode, &mut s);
    echo(&mut s, 0xc105_ea12, "after");
    let mut s2 = TcpStream::connect((Ipv4Addr::LOCALHOST, port))
        .unwrap_or_else(|e| fail(&format!("second connect: {e}")));
    echo(&mut s2, 0xc105_ea13, "second");
    println!("echoed {total} {:x}", hash.finalize());
    println!("second");
    std::io::stdout().flush().ok();
    let mut two = go.into_os_string();
    two.push(".2");
    wait_for(Path::new(&two));
    // Both still carry bytes after status was read.
    through(&mut s, b"last", "last");
    through(&mut s2, b"last", "last");
    std::process::exit(0)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("echo") => ringsock_integration::echo::serve(),
        Some("client") => {}
        _ => usage(),
    }
    let (mut port, mut bytes, mut go, mut mode) = (None, None, None, None);
    let mut it = args[1..].iter();
    while let Some(a) = it.next() {
        let mut val = || it.next().cloned().unwrap_or_else(|| usage());
        match a.as_str() {
            "--port" => port = val().parse().ok(),
            "--bytes" => bytes = val().parse().ok(),
            "--go" => go = Some(PathBuf::from(val())),
            "--mode" => mode = Some(val()),
            _ => usage(),
        }
    }
    let (Some(port), Some(bytes), Some(go), Some(mode)) = (port, bytes, go, mode) else {
        usage()
    };
    client(port, bytes, go, &mode)
}
