//! sharedkids: children that share the parent's memory must leave the
//! shim's tables alone while the parent keeps its ring connection.
//!
//! ```text
//! sharedkids METHOD...
//! ```
//!
//! Starts an echo process (itself, `--echo`) and connects to it on
//! 127.0.0.1 (under the shim the connection gets a ring). Then, for each
//! METHOD in turn, makes a child that closes the connection (and an
//! unconnected TCP socket of the parent's) and dup2s stdin onto the
//! connection's number before it leaves:
//!
//! * `vfork`: libc's vfork, the child then `_exit`s;
//! * `clone-vfork`: libc's clone(CLONE_VM | CLONE_VFORK) on a stack of its
//!   own, the child returns (and so exits);
//! * `clone-vm`: libc's clone(CLONE_VM) without CLONE_VFORK, the parent
//!   waits for it;
//! * `spawn`: posix_spawn of `/bin/sh -c 'exit 0'` with file actions
//!   closing both (run by glibc inside its CLONE_VM child).
//!
//! After each child has gone the parent sends 256 KiB through the echo
//! and checks every byte coming back. Prints `ring before=BOOL
//! on_ring=BOOL` after a first exchange, `ok METHOD ring=BOOL
//! on_ring=BOOL` per method, then `done`: `ring`, whether a ring segment
//! is mapped; `on_ring`, whether the kernel socket received none of the
//! payload. Any failure prints `FAIL ...` and exits 1; every read is
//! bounded (20 s).

use std::ffi::{c_int, c_void, CString};
use std::io::{BufRead, Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::Duration;

use ringsock_integration::payload;

const BYTES: usize = 256 * 1024;

fn fail(msg: String) -> ! {
    println!("FAIL {msg}");
    std::process::exit(1);
}

/// Whether a ring segment is mapped in this process.
fn ring_mapped() -> bool {
    std::fs::read_to_string("/proc/self/maps")
        .map(|m| m.contains("memfd:ringsock"))
        .unwrap_or(false)
}

/// What the children do to the shared tables: close both ends and put
/// another descriptor at the connection's number (all async-signal-safe).
struct Fds {
    client: c_int,
    other: c_int,
}

/// Bytes the kernel socket of `fd` received (TCP_INFO's bytes_received,
/// at byte 128 of struct tcp_info since Linux 4.1): a connection on its
/// ring receives none of the payload there.
fn kernel_rx(fd: c_int) -> u64 {
    let mut info = [0u8; 256];
    let mut len = info.len() as libc::socklen_t;
    // SAFETY: `info` has room for `len` bytes, which the kernel fills.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            info.as_mut_ptr() as *mut c_void,
            &mut len,
        )
    };
    if r != 0 || len < 136 {
        fail(format!("TCP_INFO: r {r}, len {len}"));
    }
    u64::from_ne_bytes(info[128..136].try_into().unwrap())
}

fn child_body(fds: &Fds) {
    // SAFETY: plain descriptor calls on numbers this (child) process holds.
    unsafe {
        libc::close(fds.other);
        libc::dup2(0, fds.client);
        libc::close(fds.client);
    }
}

extern "C" fn clone_child(arg: *mut c_void) -> c_int {
    // SAFETY: `arg` is the `Fds` the parent passed, alive until the child
    // is waited for.
    child_body(unsafe { &*(arg as *const Fds) });
    0
}

fn wait_child(pid: libc::pid_t, what: &str) {
    let mut status = 0;
    // SAFETY: waiting for our own child; __WALL also waits for a clone child
    // that sends no SIGCHLD.
    let r = unsafe { libc::waitpid(pid, &mut status, libc::__WALL) };
    if r != pid || !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
        fail(format!("{what}: waitpid {r}, status {status:#x}"));
    }
}

/// libc's vfork is deprecated in Rust because the compiler does not know
/// that it returns twice; the child here makes only libc calls on values
/// computed before the fork and `_exit`s, as a C shell's child does, so no
/// state the compiler keeps in the shared frame is relied on after it.
#[inline(never)]
#[allow(deprecated)]
fn by_vfork(fds: &Fds) {
    // SAFETY: as above: the child only makes descriptor calls and `_exit`s.
    let pid = unsafe { libc::vfork() };
    if pid == 0 {
        child_body(fds);
        // SAFETY: leaving the vfork child without touching the parent's state.
        unsafe { libc::_exit(0) };
    }
    if pid < 0 {
        fail("vfork failed".into());
    }
    wait_child(pid, "vfork");
}

fn by_clone(fds: &Fds, vfork: bool, what: &str) {
    let mut stack = vec![0u8; 256 * 1024];
    let mut flags = libc::CLONE_VM | libc::SIGCHLD;
    if vfork {
        flags |= libc::CLONE_VFORK;
    }
    // SAFETY: the child runs `clone_child` on `stack`, which outlives it
    // (the parent waits for it below before dropping the stack), and only
    // makes descriptor calls.
    let pid = unsafe {
        let top = stack.as_mut_ptr().add(stack.len()) as *mut c_void;
        libc::clone(clone_child, top, flags, fds as *const Fds as *mut c_void)
    };
    if pid < 0 {
        fail(format!("{what}: clone failed"));
    }
    wait_child(pid, what);
    drop(stack);
}

fn by_spawn(fds: &Fds) {
    let sh = CString::new("/bin/sh").unwrap();
    let args = [
        c"sh".as_ptr(),
        c"-c".as_ptr(),
        c"exit 0".as_ptr(),
        std::ptr::null(),
    ];
    // SAFETY: the file actions object is initialised, used for the one
    // spawn and destroyed; argv and envp are null-terminated arrays of C
    // strings that outlive the call.
    unsafe {
        let mut fa: libc::posix_spawn_file_actions_t = std::mem::zeroed();
        libc::posix_spawn_file_actions_init(&mut fa);
        libc::posix_spawn_file_actions_addclose(&mut fa, fds.other);
        libc::posix_spawn_file_actions_adddup2(&mut fa, 0, fds.client);
        let env: [*const libc::c_char; 1] = [std::ptr::null()];
        let mut pid = 0;
        let r = libc::posix_spawn(
            &mut pid,
            sh.as_ptr(),
            &fa,
            std::ptr::null(),
            args.as_ptr() as *const *mut _,
            env.as_ptr() as *const *mut _,
        );
        libc::posix_spawn_file_actions_destroy(&mut fa);
        if r != 0 {
            fail(format!("posix_spawn: {r}"));
        }
        wait_child(pid, "spawn");
    }
}

/// BYTES to the echo process and back, every byte checked; seeded by
/// `round`.
fn exchange(client: &mut TcpStream, round: u64) {
    let up = payload(BYTES, round);
    std::thread::scope(|s| {
        let mut w = client
            .try_clone()
            .unwrap_or_else(|e| fail(format!("dup: {e}")));
        let up_ref = &up;
        s.spawn(move || {
            w.write_all(up_ref)
                .unwrap_or_else(|e| fail(format!("client write: {e}")));
        });
        let mut got = vec![0u8; BYTES];
        client
            .read_exact(&mut got)
            .unwrap_or_else(|e| fail(format!("client read, round {round}: {e}")));
        if got != up {
            fail(format!("round {round}: wrong bytes back"));
        }
    });
}

/// The echo process (`sharedkids --echo`): prints its port, then sends
/// back everything its one connection sends, until EOF.
fn echo() -> ! {
    let listener =
        TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap_or_else(|e| fail(format!("bind: {e}")));
    println!("{}", listener.local_addr().unwrap().port());
    std::io::stdout().flush().unwrap();
    let (mut s, _) = listener
        .accept()
        .unwrap_or_else(|e| fail(format!("accept: {e}")));
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match s.read(&mut buf) {
            Ok(0) => std::process::exit(0),
            Ok(n) => s
                .write_all(&buf[..n])
                .unwrap_or_else(|e| fail(format!("echo write: {e}"))),
            Err(e) => fail(format!("echo read: {e}")),
        }
    }
}

fn main() {
    let methods: Vec<String> = std::env::args().skip(1).collect();
    if methods.is_empty() {
        eprintln!("usage: sharedkids vfork|clone-vfork|clone-vm|spawn...");
        std::process::exit(64);
    }
    if methods[0] == "--echo" {
        echo();
    }
    let mut echo = std::process::Command::new(std::env::current_exe().unwrap())
        .arg("--echo")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| fail(format!("spawn echo: {e}")));
    let mut line = String::new();
    std::io::BufReader::new(echo.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap_or_else(|e| fail(format!("echo port: {e}")));
    let port: u16 = line
        .trim()
        .parse()
        .unwrap_or_else(|_| fail(format!("echo port: {line:?}")));
    let mut client = TcpStream::connect((Ipv4Addr::LOCALHOST, port))
        .unwrap_or_else(|e| fail(format!("connect: {e}")));
    client
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    exchange(&mut client, 0);
    println!(
        "ring before={} on_ring={}",
        ring_mapped(),
        kernel_rx(client.as_raw_fd()) == 0
    );
    // The children also close a socket of the parent's that is not yet
    // connected (the shim tracks it from socket()).
    // SAFETY: socket() has no memory arguments; the result is checked.
    let other = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if other < 0 {
        fail("socket failed".into());
    }
    let fds = Fds {
        client: client.as_raw_fd(),
        other,
    };
    for (i, m) in methods.iter().enumerate() {
        match m.as_str() {
            "vfork" => by_vfork(&fds),
            "clone-vfork" => by_clone(&fds, true, m),
            "clone-vm" => by_clone(&fds, false, m),
            "spawn" => by_spawn(&fds),
            _ => fail(format!("unknown method {m}")),
        }
        exchange(&mut client, i as u64 + 1);
        let on_ring = kernel_rx(client.as_raw_fd()) == 0;
        println!("ok {m} ring={} on_ring={on_ring}", ring_mapped());
    }
    // SAFETY: our own socket, closed once.
    unsafe { libc::close(other) };
    drop(client);
    let st = echo
        .wait()
        .unwrap_or_else(|e| fail(format!("echo wait: {e}")));
    if !st.success() {
        fail(format!("echo: {st}"));
    }
    println!("done");
}
