//! One role of a scenario as a process: its log, its side channel, the
//! scenario's port, and the steps scenarios are written in (each logs its
//! observation line through `ops`).

use std::net::{Ipv4Addr, Ipv6Addr};
use std::os::fd::RawFd;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::obs::Log;
use crate::ops::{self, Obs, Ret};
use crate::probe::{Probe, AFTER_RELEASE, GRACE};
use crate::sync::Sync;
use crate::{addr, names};

/// Which end of the scenario's connection a role plays.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    Server,
    Client,
}

impl Side {
    pub fn as_str(self) -> &'static str {
        match self {
            Side::Server => "server",
            Side::Client => "client",
        }
    }

    pub fn parse(s: &str) -> Option<Side> {
        match s {
            "server" => Some(Side::Server),
            "client" => Some(Side::Client),
            _ => None,
        }
    }
}

/// How long a settle step (waiting for data or an event the peer caused
/// before a barrier) may wait before it logs that nothing came.
pub const SETTLE: Duration = Duration::from_secs(3);

/// The environment variable with the server's IPv4 address (loopback
/// unless the roles run on two hosts).
pub const ENV_SERVER_IP: &str = "CONFORM_SERVER_IP";

/// The server's IPv4 address as the runner gave it.
pub fn server_ip_from_env() -> Ipv4Addr {
    std::env::var(ENV_SERVER_IP)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(Ipv4Addr::LOCALHOST)
}

/// What a role process knows.
pub struct Role {
    pub log: Log,
    pub sync: Sync,
    pub side: Side,
    pub scenario: String,
    pub server_ip: Ipv4Addr,
    pub port: u16,
    /// The role's log file (exec'd helpers append to it).
    pub log_path: PathBuf,
    /// A scratch directory of this run.
    pub dir: PathBuf,
}

/// The bytes a scenario sends: seeded, so the receiver's fingerprint
/// is the same in every run.
pub fn payload(len: usize, seed: u64) -> Vec<u8> {
    ringsock_integration::payload(len, seed)
}

impl Role {
    pub fn is_server(&self) -> bool {
        self.side == Side::Server
    }

    /// Logs an observation and hands back the call's result.
    pub fn call<T>(&self, o: Obs<T>) -> T {
        self.log.line(o.0);
        o.1
    }

    /// A line that is not a call (a step's outcome, a comparison).
    pub fn note(&self, text: impl AsRef<str>) {
        self.log.line(text);
    }

    pub fn barrier(&self, name: &str) {
        self.sync.barrier(name, 0, "");
    }

    /// A barrier at which, in shim mode, the runner requires `n`
    /// connections to the port on rings.
    pub fn ring(&self, name: &str, n: u32) {
        self.sync.barrier(name, n, "");
    }

    /// A barrier that hands `mine` to the other role and returns its.
    pub fn exchange(&self, name: &str, mine: &str) -> String {
        self.sync.barrier(name, 0, mine)
    }

    /// Exits the role after a setup step failed (its line is logged).
    pub fn must(&self, r: Ret, what: &str) -> i32 {
        if !r.ok() {
            self.note(format!("cannot go on: {what} failed"));
            std::process::exit(2);
        }
        r.v as i32
    }

    // ----- connection setup -----

    pub fn server_addr(&self) -> (libc::sockaddr_storage, libc::socklen_t) {
        addr::v4(self.server_ip, self.port)
    }

    pub fn server_addr6(&self) -> (libc::sockaddr_storage, libc::socklen_t) {
        addr::v6(Ipv6Addr::LOCALHOST, self.port)
    }

    /// A listener on `sa` with SO_REUSEADDR.
    pub fn listen_at(&self, domain: i32, sa: &(libc::sockaddr_storage, libc::socklen_t)) -> RawFd {
        let l = self.call(ops::socket(domain, libc::SOCK_STREAM));
        let l = self.must(l, "socket");
        self.call(ops::setsockopt_int(
            l,
            libc::SOL_SOCKET,
            libc::SO_REUSEADDR,
            "SO_REUSEADDR",
            1,
        ));
        let r = self.call(ops::bind(l, sa));
        self.must(r, "bind");
        let r = self.call(ops::listen(l, 128));
        self.must(r, "listen");
        l
    }

    /// A listener on the server address and port.
    pub fn listen(&self) -> RawFd {
        self.listen_at(libc::AF_INET, &self.server_addr())
    }

    pub fn accept(&self, l: RawFd) -> RawFd {
        let r = self.call(ops::accept(l, None));
        self.must(r, "accept")
    }

    /// A blocking socket connected to the server address and port.
    pub fn connect(&self) -> RawFd {
        self.connect_to(libc::AF_INET, &self.server_addr())
    }

    pub fn connect_to(&self, domain: i32, sa: &(libc::sockaddr_storage, libc::socklen_t)) -> RawFd {
        let c = self.call(ops::socket(domain, libc::SOCK_STREAM));
        let c = self.must(c, "socket");
        let r = self.call(ops::connect(c, sa));
        self.must(r, "connect");
        c
    }

    /// The scenario's connection, set up the standard way: the server
    /// listens, both pass `listening`, the client connects, the server
    /// accepts, and both pass `connected` (where, in shim mode, the
    /// runner requires the connection on a ring). Returns this end.
    pub fn open(&self) -> RawFd {
        match self.side {
            Side::Server => {
                let l = self.listen();
                self.barrier("listening");
                let s = self.accept(l);
                self.ring("connected", 1);
                s
            }
            Side::Client => {
                self.barrier("listening");
                let c = self.connect();
                self.ring("connected", 1);
                c
            }
        }
    }

    // ----- data -----

    /// Sends all of `n` seeded bytes in blocking sends; one line for the
    /// whole (the split into calls is the kernel's business).
    pub fn send_all(&self, fd: RawFd, n: usize, seed: u64, flags: i32) -> usize {
        self.call(ops::send_all(fd, n, seed, flags))
    }

    /// Receives until `n` bytes, end of stream or an error; one line with
    /// the count, the fingerprint and how it ended.
    pub fn recv_all(&self, fd: RawFd, n: usize) -> Vec<u8> {
        self.call(ops::recv_all(fd, n))
    }

    /// Receives until end of stream or an error; one line as for
    /// `recv_all`. More than `cap` bytes is logged as such.
    pub fn recv_to_end(&self, fd: RawFd, cap: usize) -> Vec<u8> {
        let (line, data) = ops::recv_all(fd, cap + 1);
        let line = line.replacen("recv_all", "recv_to_end", 1);
        let line = line.replacen(&format!(", {})", cap + 1), ")", 1);
        self.note(if data.len() > cap {
            format!("{line} (more than {cap})")
        } else {
            line
        });
        data
    }

    /// Waits (up to SETTLE) until at least `n` bytes can be read from
    /// `fd` without blocking, so that the steps after it see the peer's
    /// data in place. Logs only when they never came.
    pub fn await_bytes(&self, fd: RawFd, n: usize) {
        let end = Instant::now() + SETTLE;
        let mut buf = vec![0u8; n.max(1)];
        loop {
            // SAFETY: peeking into our own buffer.
            let k = unsafe {
                libc::recv(
                    fd,
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_PEEK | libc::MSG_DONTWAIT,
                )
            };
            if k >= n as isize || k == 0 && n > 0 {
                return;
            }
            if Instant::now() >= end {
                self.note(format!("settle: {n} bytes never became readable on {fd}"));
                return;
            }
            let mut p = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one pollfd of ours; a short timeout between peeks.
            unsafe { libc::poll(&mut p, 1, 20) };
        }
    }

    /// Waits (up to SETTLE) until FIONREAD says `n` bytes are queued (for a
    /// socket whose reads return 0 before its bytes, after SHUT_RD). Logs
    /// only when they never were.
    pub fn await_queued(&self, fd: RawFd, n: usize) {
        let end = Instant::now() + SETTLE;
        loop {
            let mut q: i32 = 0;
            // SAFETY: FIONREAD fills one int, which q is.
            let ok = unsafe { libc::ioctl(fd, libc::FIONREAD, &mut q) } == 0;
            if ok && q as usize >= n {
                return;
            }
            if Instant::now() >= end {
                self.note(format!("settle: {n} bytes never queued on {fd}"));
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Waits (up to SETTLE) until poll reports any of `events` on `fd`.
    /// Logs only when nothing came.
    pub fn await_events(&self, fd: RawFd, events: i16) {
        let end = Instant::now() + SETTLE;
        loop {
            let mut p = libc::pollfd {
                fd,
                events,
                revents: 0,
            };
            // SAFETY: one pollfd of ours.
            unsafe { libc::poll(&mut p, 1, 20) };
            if p.revents & events != 0 {
                return;
            }
            if Instant::now() >= end {
                self.note(format!(
                    "settle: {} never reported on {fd}",
                    names::poll(events)
                ));
                return;
            }
        }
    }

    /// Waits (up to SETTLE) until the peer's end of stream (or anything
    /// readable) arrived: the settle for a FIN on an idle connection,
    /// whatever bits the observation after it then checks.
    pub fn await_eof(&self, fd: RawFd) {
        self.await_events(fd, libc::POLLIN | libc::POLLRDHUP);
    }

    /// Waits (up to SETTLE) until a reset (or end of stream, or anything
    /// readable) arrived on an idle connection.
    pub fn await_reset(&self, fd: RawFd) {
        self.await_events(
            fd,
            libc::POLLIN | libc::POLLERR | libc::POLLHUP | libc::POLLRDHUP,
        );
    }

    // ----- blocking -----

    /// Runs `call` on a probe thread and logs it as `immediate: LINE`
    /// when it returned within the grace, else `blocked: LINE`; `release`
    /// runs in between either way (a barrier after which the peer acts,
    /// or a step of this role). A call that never returns, even after
    /// the release, ends the role.
    pub fn blocking(
        &self,
        call: impl FnOnce() -> String + Send + 'static,
        release: impl FnOnce(&Role),
    ) {
        let p = Probe::start(call);
        let early = p.within(GRACE);
        release(self);
        let (how, line) = match early {
            Some(l) => ("immediate", l),
            None => match p.within(AFTER_RELEASE) {
                Some(l) => ("blocked", l),
                None => {
                    self.note("blocked: the call never returned after the release");
                    std::process::exit(3);
                }
            },
        };
        self.note(format!("{how}: {line}"));
    }

    /// Runs `call` (which the kernel never blocks in) on a probe thread and
    /// logs its line; if it has not returned within the grace, logs that
    /// `label` blocked and ends the role, rather than hang the scenario.
    pub fn immediate(&self, label: &str, call: impl FnOnce() -> String + Send + 'static) {
        match Probe::start(call).within(GRACE) {
            Some(line) => self.note(line),
            None => {
                self.note(format!("blocked: {label} did not return"));
                std::process::exit(3);
            }
        }
    }

    /// `blocking` released by a barrier named `release`.
    pub fn blocking_until(&self, release: &str, call: impl FnOnce() -> String + Send + 'static) {
        self.blocking(call, |r| r.barrier(release));
    }

    // ----- processes -----

    /// fork(); the child's log lines are tagged `tag`. Returns the pid in
    /// the parent, 0 in the child.
    pub fn fork(&mut self, tag: &str) -> libc::pid_t {
        // SAFETY: the role has no other threads running at a fork (probes
        // are joined before it), so the child may run Rust code.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            self.note(format!("fork() = {}", Ret::of(-1)));
            std::process::exit(2);
        }
        if pid == 0 {
            self.log = self.log.tagged(tag);
        }
        pid
    }

    /// Waits for a child and logs how it ended.
    pub fn wait_child(&self, pid: libc::pid_t) {
        let mut status = 0;
        // SAFETY: waiting for our own child; bounded by the runner's
        // deadline for the whole role.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r < 0 {
            self.note(format!("waitpid = {}", Ret::of(-1)));
        } else {
            self.note(format!("child {}", exit_text(status)));
        }
    }

    /// The path of the conform binary (for exec'd helpers).
    pub fn exe(&self) -> PathBuf {
        std::env::current_exe().unwrap_or_else(|_| PathBuf::from("/proc/self/exe"))
    }
}

/// `exit N` or `killed SIGNAME` for a wait status.
pub fn exit_text(status: i32) -> String {
    if libc::WIFEXITED(status) {
        format!("exit {}", libc::WEXITSTATUS(status))
    } else if libc::WIFSIGNALED(status) {
        format!("killed {}", names::signal(libc::WTERMSIG(status)))
    } else {
        format!("status {status:#x}")
    }
}
