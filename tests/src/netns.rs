//! Two "hosts" on one machine, for runs between hosts: network namespaces
//! A and B joined by a veth pair (`Hosts`, also used by ringsock-ctl's
//! tests), a `ringsock-ctl daemon` per namespace (`NsCtl`), programs
//! started inside a namespace, with or without the shim
//! (`Hosts::shimmed_in` / `plain_in`), and code run on a thread inside
//! one (`in_ns`).
//!
//! Programs run through `ip netns exec NS env VAR=.. PROGRAM ..`: both `ip`
//! (without a batch or `-all`) and `env` exec in place, so the spawned pid
//! is the program's own (status reports it, `Server` signals it), and `ip`
//! itself never runs under the shim (LD_PRELOAD is set by `env`, after the
//! namespace switch). Control sockets are filesystem paths, which work
//! across network namespaces, so status is read from the test's namespace.

use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::ctl::status_at;
use crate::proc::{Cmd, Server};
use crate::shim::{ctl_bin, shim};
use crate::status::Conn;
use crate::tmp::TempDir;

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .env_remove("LD_PRELOAD")
        .output()
        .map_err(|e| format!("cannot run ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Waits until `dev` in `ns` is operationally up: until the kernel's link
/// watch has run for a veth that was just set up, it drops what it is
/// given, and a SYN dropped then is sent again only a second later.
fn wait_oper_up(ns: &str, dev: &str) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = Command::new("ip")
            .args(["-n", ns, "-o", "link", "show", "dev", dev])
            .env_remove("LD_PRELOAD")
            .output()
            .map_err(|e| format!("cannot run ip: {e}"))?;
        if String::from_utf8_lossy(&out.stdout).contains("state UP") {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("{dev} in {ns} did not come up in 10 s"));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Namespaces A (`ip_a`) and B (`ip_b`) on a private /24 joined by a veth
/// pair; names and subnet are unique per test process and per `Hosts`.
/// Both namespaces (and with them the veth pair) are deleted on drop, also
/// when the test panics.
pub struct Hosts {
    pub a: String,
    pub b: String,
    pub ip_a: Ipv4Addr,
    pub ip_b: Ipv4Addr,
}

impl Hosts {
    /// Sets the pair up; prints `SKIPPED` with the reason and returns None
    /// when network namespaces cannot be created here (no `ip`, no
    /// privileges, no veth).
    pub fn new() -> Option<Hosts> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let pid = std::process::id();
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        // 10.X.Y.0/24: X from the pid, Y from the counter, so concurrent
        // test processes and tests in one process do not share a subnet
        // (the namespaces would keep them apart anyway; distinct addresses
        // keep failure messages unambiguous).
        let (x, y) = (128 + (pid % 100) as u8, 1 + (n % 250) as u8);
        let tag = format!("{pid}x{n}");
        let h = Hosts {
            a: format!("rs2h-a{tag}"),
            b: format!("rs2h-b{tag}"),
            ip_a: Ipv4Addr::new(10, x, y, 1),
            ip_b: Ipv4Addr::new(10, x, y, 2),
        };
        // Interface names are at most 15 bytes: "r2a" + pid (<= 7 digits)
        // + "x" + counter.
        let (va, vb) = (format!("r2a{tag}"), format!("r2b{tag}"));
        let setup = || -> Result<(), String> {
            ip(&["netns", "add", &h.a])?;
            ip(&["netns", "add", &h.b])?;
            ip(&[
                "link", "add", &va, "netns", &h.a, "type", "veth", "peer", "name", &vb, "netns",
                &h.b,
            ])?;
            for (ns, dev, addr) in [(&h.a, &va, h.ip_a), (&h.b, &vb, h.ip_b)] {
                ip(&["-n", ns, "addr", "add", &format!("{addr}/24"), "dev", dev])?;
                ip(&["-n", ns, "link", "set", dev, "up"])?;
                ip(&["-n", ns, "link", "set", "lo", "up"])?;
            }
            for (ns, dev) in [(&h.a, &va), (&h.b, &vb)] {
                wait_oper_up(ns, dev)?;
            }
            Ok(())
        };
        match setup() {
            Ok(()) => Some(h),
            Err(e) => {
                println!("SKIPPED: network namespaces unavailable ({e})");
                None
            }
        }
    }

    /// An address on the hosts' subnet that no host has: SYNs to it go
    /// unanswered.
    pub fn ip_nobody(&self) -> Ipv4Addr {
        let [a, b, c, _] = self.ip_a.octets();
        Ipv4Addr::new(a, b, c, 3)
    }

    /// `program` inside namespace `ns`, without the shim.
    pub fn plain_in(ns: &str, program: &str) -> Cmd {
        Cmd::plain("ip").args(["netns", "exec", ns, "env", "-u", "LD_PRELOAD", program])
    }

    /// `program` inside namespace `ns` under the shim (log level warn),
    /// talking to the daemon on `ctl_sock` (a path where none answers: no
    /// daemon on that host).
    pub fn shimmed_in(ns: &str, ctl_sock: &Path, program: &str) -> Cmd {
        let mut preload = std::ffi::OsString::from("LD_PRELOAD=");
        preload.push(shim());
        let mut sock = std::ffi::OsString::from("RINGSOCK_CTL_SOCK=");
        sock.push(ctl_sock);
        Cmd::plain("ip")
            .args(["netns", "exec", ns, "env"])
            .arg(preload)
            .arg(sock)
            .args(["RINGSOCK_LOG=warn", program])
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.a]);
        let _ = ip(&["netns", "del", &self.b]);
    }
}

/// Namespaces A and B on a bridge, as containers on one host: a third
/// namespace, the hub (standing for the host), holds bridge `br` with
/// address `ip_hub`, a veth pair joins each of A and B to it, and A and B
/// route everything else through the hub, which forwards. Unique names
/// and subnet per test process and per `Bridge`; all three namespaces are
/// deleted on drop.
pub struct Bridge {
    pub hub: String,
    pub a: String,
    pub b: String,
    pub ip_hub: Ipv4Addr,
    pub ip_a: Ipv4Addr,
    pub ip_b: Ipv4Addr,
}

impl Bridge {
    /// Sets it up; prints `SKIPPED` with the reason and returns None when
    /// network namespaces or bridges cannot be made here (as `Hosts`).
    pub fn new() -> Option<Bridge> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let pid = std::process::id();
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        // 10.X.Y.0/24 with X in 28..128: apart from `Hosts`' subnets.
        let (x, y) = (28 + (pid % 100) as u8, 1 + (n % 250) as u8);
        let tag = format!("{pid}x{n}");
        let br = Bridge {
            hub: format!("rsbr-h{tag}"),
            a: format!("rsbr-a{tag}"),
            b: format!("rsbr-b{tag}"),
            ip_hub: Ipv4Addr::new(10, x, y, 254),
            ip_a: Ipv4Addr::new(10, x, y, 1),
            ip_b: Ipv4Addr::new(10, x, y, 2),
        };
        // Interface names are at most 15 bytes.
        let dev = format!("rbh{tag}");
        let setup = || -> Result<(), String> {
            for ns in [&br.hub, &br.a, &br.b] {
                ip(&["netns", "add", ns])?;
                ip(&["-n", ns, "link", "set", "lo", "up"])?;
            }
            let hub = br.hub.as_str();
            ip(&["-n", hub, "link", "add", &dev, "type", "bridge"])?;
            ip(&[
                "-n",
                hub,
                "addr",
                "add",
                &format!("{}/24", br.ip_hub),
                "dev",
                &dev,
            ])?;
            ip(&["-n", hub, "link", "set", &dev, "up"])?;
            let gw = br.ip_hub.to_string();
            for (ns, side, addr) in [(&br.a, "a", br.ip_a), (&br.b, "b", br.ip_b)] {
                let (inner, outer) = (format!("rb{side}{tag}"), format!("rB{side}{tag}"));
                ip(&[
                    "link", "add", &inner, "netns", ns, "type", "veth", "peer", "name", &outer,
                    "netns", hub,
                ])?;
                ip(&["-n", hub, "link", "set", &outer, "master", &dev])?;
                ip(&["-n", hub, "link", "set", &outer, "up"])?;
                ip(&[
                    "-n",
                    ns,
                    "addr",
                    "add",
                    &format!("{addr}/24"),
                    "dev",
                    &inner,
                ])?;
                ip(&["-n", ns, "link", "set", &inner, "up"])?;
                ip(&["-n", ns, "route", "add", "default", "via", &gw])?;
                wait_oper_up(ns, &inner)?;
                wait_oper_up(hub, &outer)?;
            }
            wait_oper_up(hub, &dev)?;
            sysctl(hub, "net.ipv4.ip_forward=1")
        };
        match setup() {
            Ok(()) => Some(br),
            Err(e) => {
                println!("SKIPPED: network namespaces or bridges unavailable ({e})");
                None
            }
        }
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        for ns in [&self.a, &self.b, &self.hub] {
            let _ = ip(&["netns", "del", ns]);
        }
    }
}

/// `sysctl -w SETTING` inside namespace `ns`.
fn sysctl(ns: &str, setting: &str) -> Result<(), String> {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "sysctl", "-qw", setting])
        .env_remove("LD_PRELOAD")
        .output()
        .map_err(|e| format!("cannot run sysctl: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "sysctl {setting} in {ns}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Runs `args` in namespace `ns` (no shim); panics with its output on
/// failure.
pub fn run_in(ns: &str, args: &[&str]) {
    let out = Command::new("ip")
        .args(["netns", "exec", ns])
        .args(args)
        .env_remove("LD_PRELOAD")
        .output()
        .expect("run ip netns exec");
    assert!(
        out.status.success(),
        "{args:?} in {ns}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs `f` on a thread inside network namespace `ns` (what it creates,
/// sockets included, belongs to that namespace).
pub fn in_ns<T: Send>(ns: &str, f: impl FnOnce() -> T + Send) -> T {
    let path = format!("/var/run/netns/{ns}");
    std::thread::scope(|s| {
        s.spawn(|| {
            let nsf = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
            // SAFETY: setns on an open namespace file; it moves only this
            // thread, which ends with the scope.
            let r = unsafe { libc::setns(nsf.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(r, 0, "setns {path}: {}", std::io::Error::last_os_error());
            f()
        })
        .join()
        .unwrap_or_else(|e| std::panic::resume_unwind(e))
    })
}

/// A `ringsock-ctl daemon --foreground` inside a namespace, on a private
/// socket; stopped (and reaped) on drop.
pub struct NsCtl {
    daemon: Server,
    sock: PathBuf,
    _dir: TempDir,
}

impl NsCtl {
    /// Starts it in `ns` with `extra` flags (e.g. `--peer-port`) and waits
    /// until its status answers; panics with its log otherwise.
    pub fn start(ns: &str, extra: &[&str]) -> NsCtl {
        let dir = TempDir::new("nsctl");
        let sock = dir.path().join("ctl.sock");
        let mut daemon = Cmd::plain("ip")
            .args(["netns", "exec", ns])
            .arg(ctl_bin())
            .arg("daemon")
            .arg("--socket")
            .arg(&sock)
            .args(["--foreground", "--log-level", "debug"])
            .args(extra)
            .spawn();
        let end = Instant::now() + Duration::from_secs(10);
        loop {
            daemon.assert_running();
            if sock.exists() && status_at(&sock).is_ok() {
                break;
            }
            assert!(
                Instant::now() < end,
                "ringsock-ctl daemon in {ns} did not answer on {}: {:?}",
                sock.display(),
                daemon.output()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        NsCtl {
            daemon,
            sock,
            _dir: dir,
        }
    }

    pub fn sock(&self) -> &Path {
        &self.sock
    }

    /// Every connection the shims on this host report right now.
    pub fn status(&self) -> Result<Vec<Conn>, String> {
        status_at(&self.sock)
    }

    /// The daemon's log so far.
    pub fn log(&self) -> String {
        let (o, e) = self.daemon.output();
        format!("{o}{e}")
    }
}
