//! Shared fixtures for the daemon integration tests: a daemon process on a
//! private socket (killed on drop), connected sessions, and raw socket
//! helpers for the states std cannot express (bound but not connected).

#![allow(dead_code)]

use std::fs;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::sleep;
use std::time::{Duration, Instant};

use ringsock_proto::{addr, Client, Fds, Msg};

pub const BIN: &str = env!("CARGO_BIN_EXE_ringsock-ctl");

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// A fresh private directory under /tmp (short: unix socket paths are
/// limited to 107 bytes), removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new() -> TempDir {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let p = PathBuf::from(format!("/tmp/rsctl-{}-{n}", std::process::id()));
        let _ = fs::remove_dir_all(&p);
        fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// A daemon running in the foreground on a private socket.
pub struct Daemon {
    pub child: Child,
    pub socket: PathBuf,
    pub log: PathBuf,
    pub dir: TempDir,
}

impl Daemon {
    pub fn start() -> Daemon {
        Self::start_with(&[])
    }

    pub fn start_with(extra: &[&str]) -> Daemon {
        Self::start_in(None, extra)
    }

    /// A daemon inside network namespace `netns` (`ip netns exec`, which
    /// execs the daemon: the child is the daemon itself).
    pub fn start_in(netns: Option<&str>, extra: &[&str]) -> Daemon {
        let dir = TempDir::new();
        let socket = dir.path("run/ctl.sock");
        let log = dir.path("daemon.log");
        let mut cmd = match netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, BIN]);
                c
            }
            None => Command::new(BIN),
        };
        let child = cmd
            .arg("daemon")
            .arg("--foreground")
            .arg("--socket")
            .arg(&socket)
            .args(["--log-level", "debug"])
            .args(extra)
            .stdin(Stdio::null())
            .stderr(fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let d = Daemon {
            child,
            socket,
            log,
            dir,
        };
        d.wait_ready();
        d
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if Client::connect(&self.socket, None).is_ok() {
                return;
            }
            sleep(Duration::from_millis(10));
        }
        panic!("daemon did not start; log:\n{}", self.log_text());
    }

    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// A connected session that has said Hello.
    pub fn session(&self) -> Client {
        let mut c = Client::connect(&self.socket, Some(Duration::from_secs(5))).unwrap();
        c.hello("integration-test").unwrap();
        c
    }

    /// A connected session that has not said anything yet.
    pub fn raw_session(&self) -> Client {
        Client::connect(&self.socket, Some(Duration::from_secs(5))).unwrap()
    }

    /// Sends SIGTERM and waits for the exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        // SAFETY: kill(2) on our own child's pid.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        self.child.wait().unwrap()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Every connection end the daemon at `socket` lists, read from `status
/// --json` by the typed reader the integration tests use.
pub fn status_conns(socket: &Path) -> Vec<ringsock_integration::Conn> {
    ringsock_integration::status::status_of(Path::new(BIN), socket)
        .unwrap_or_else(|e| panic!("status: {e}"))
}

/// Request/reply, panicking on transport errors (tests want the reply).
pub fn call(c: &mut Client, m: &Msg, fds: &[RawFd]) -> (Msg, Fds) {
    c.call(m, fds).unwrap()
}

fn cvt(r: i32) -> io::Result<i32> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// A TCP socket bound to `a` but not connected: what the shim has in hand
/// when it offers, before the SYN.
pub fn bound_tcp(a: SocketAddr) -> OwnedFd {
    let family = if a.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    // SAFETY: plain socket(2); the fd is owned by the OwnedFd at once.
    let fd = unsafe {
        OwnedFd::from_raw_fd(
            cvt(libc::socket(
                family,
                libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
                0,
            ))
            .unwrap(),
        )
    };
    let (st, len) = addr::to_raw(&a);
    // SAFETY: st is a valid socket address of `len` bytes.
    cvt(unsafe {
        libc::bind(
            fd.as_raw_fd(),
            &st as *const _ as *const libc::sockaddr,
            len,
        )
    })
    .unwrap();
    fd
}

/// Blocking connect of a bound socket.
pub fn connect(fd: &OwnedFd, to: SocketAddr) -> io::Result<()> {
    let (st, len) = addr::to_raw(&to);
    // SAFETY: st is a valid socket address of `len` bytes.
    cvt(unsafe {
        libc::connect(
            fd.as_raw_fd(),
            &st as *const _ as *const libc::sockaddr,
            len,
        )
    })?;
    Ok(())
}

pub fn local_addr(fd: RawFd) -> SocketAddr {
    ringsock_proto::io::local_addr(fd).unwrap()
}

pub fn eventfd() -> OwnedFd {
    // SAFETY: plain eventfd(2); owned at once.
    unsafe { OwnedFd::from_raw_fd(cvt(libc::eventfd(0, libc::EFD_CLOEXEC)).unwrap()) }
}

pub fn eventfd_write(fd: RawFd, v: u64) {
    let b = v.to_ne_bytes();
    // SAFETY: b is a readable 8-byte buffer.
    assert_eq!(unsafe { libc::write(fd, b.as_ptr().cast(), 8) }, 8);
}

pub fn eventfd_read(fd: RawFd) -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: b is a writable 8-byte buffer.
    assert_eq!(unsafe { libc::read(fd, b.as_mut_ptr().cast(), 8) }, 8);
    u64::from_ne_bytes(b)
}

/// A memfd of `size` bytes, sealed against shrinking when `seal`.
pub fn memfd(size: i64, seal: bool) -> OwnedFd {
    // SAFETY: memfd_create/ftruncate/fcntl on a fresh fd owned at once.
    unsafe {
        let fd = OwnedFd::from_raw_fd(
            cvt(libc::memfd_create(
                c"rsctl-test".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            ))
            .unwrap(),
        );
        cvt(libc::ftruncate(fd.as_raw_fd(), size)).unwrap();
        if seal {
            cvt(libc::fcntl(
                fd.as_raw_fd(),
                libc::F_ADD_SEALS,
                libc::F_SEAL_SHRINK | libc::F_SEAL_GROW,
            ))
            .unwrap();
        }
        fd
    }
}

pub fn pwrite(fd: RawFd, data: &[u8], off: i64) {
    // SAFETY: data is a readable buffer of its length.
    let n = unsafe { libc::pwrite(fd, data.as_ptr().cast(), data.len(), off) };
    assert_eq!(n, data.len() as isize);
}

pub fn pread(fd: RawFd, len: usize, off: i64) -> Vec<u8> {
    let mut b = vec![0u8; len];
    // SAFETY: b is a writable buffer of `len` bytes.
    let n = unsafe { libc::pread(fd, b.as_mut_ptr().cast(), len, off) };
    assert_eq!(n, len as isize);
    b
}

/// Sends raw bytes as one datagram on a session socket.
pub fn send_raw(c: &Client, bytes: &[u8]) -> io::Result<()> {
    ringsock_proto::io::send_frame(c.as_raw_fd(), bytes, &[], 0)
}

/// True once the daemon has closed this session: the next receive sees
/// end-of-file (or a reset) instead of a reply.
pub fn is_closed_by_daemon(c: &Client) -> bool {
    let mut buf = vec![0u8; ringsock_proto::MAX_FRAME_TOTAL];
    match ringsock_proto::io::recv_frame(c.as_raw_fd(), &mut buf, 0) {
        Ok(None) => true,
        Err(ringsock_proto::Error::Io(e)) => e.kind() != io::ErrorKind::WouldBlock,
        _ => false,
    }
}

pub fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if f() {
            return;
        }
        sleep(Duration::from_millis(10));
    }
    panic!("timed out waiting for {what}");
}

pub fn file_exists(p: &Path) -> bool {
    fs::symlink_metadata(p).is_ok()
}
