//! Starting a role process: its own process group (so the runner can kill
//! everything it forked), its side channel as descriptor 3, its output in
//! files, and in shim mode the shim preloaded and pointed at the run's
//! daemon. Plain mode has no LD_PRELOAD at all.

use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::RING_WAIT;
use crate::role::{Side, ENV_SERVER_IP};
use crate::sync::ENV_FD;

/// The descriptor number a role finds its side channel at.
pub const SYNC_FD: i32 = 3;

/// What the role process is told.
pub struct RoleArgs<'a> {
    pub bin: &'a Path,
    pub scenario: &'a str,
    pub side: Side,
    pub port: u16,
    pub dir: &'a Path,
    /// The address the server listens on and the client connects to.
    pub server_ip: &'a str,
    /// A command prefix (`ip netns exec A`), empty for none.
    pub wrap: &'a [String],
    /// LD_PRELOAD and RINGSOCK_CTL_SOCK in shim mode.
    pub shim: Option<(&'a Path, &'a Path)>,
}

impl RoleArgs<'_> {
    pub fn log_path(&self) -> PathBuf {
        self.dir.join(format!("{}.log", self.side.as_str()))
    }

    pub fn err_path(&self) -> PathBuf {
        self.dir.join(format!("{}.stderr", self.side.as_str()))
    }
}

/// A SOCK_SEQPACKET socketpair (close-on-exec): (runner's end, role's).
pub fn channel() -> (OwnedFd, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: socketpair fills two fds that we own from here on.
    let r = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    assert_eq!(r, 0, "socketpair: {}", std::io::Error::last_os_error());
    use std::os::fd::FromRawFd;
    // SAFETY: both fds are fresh and owned by nobody else.
    unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

/// Starts `conform role SIDE SCENARIO` (behind the prefix) with `chan` as
/// its descriptor 3.
pub fn start(a: &RoleArgs<'_>, chan: &OwnedFd) -> Child {
    let mut cmd = match a.wrap.split_first() {
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg(a.bin);
            c
        }
        None => Command::new(a.bin),
    };
    cmd.arg("role")
        .arg(a.side.as_str())
        .arg(a.scenario)
        .arg("--port")
        .arg(a.port.to_string())
        .arg("--log")
        .arg(a.log_path())
        .arg("--dir")
        .arg(a.dir)
        .env(ENV_FD, SYNC_FD.to_string())
        .env(ENV_SERVER_IP, a.server_ip)
        .env_remove("LD_PRELOAD")
        .env_remove("RINGSOCK_CTL_SOCK")
        .stdin(Stdio::null())
        .stdout(
            File::create(a.dir.join(format!("{}.stdout", a.side.as_str()))).expect("stdout file"),
        )
        .stderr(File::create(a.err_path()).expect("stderr file"));
    if let Some((shim, ctl_sock)) = a.shim {
        // CONFORM_SHIM_LOG (a RINGSOCK_LOG level) debugs one scenario.
        let level = std::env::var("CONFORM_SHIM_LOG").unwrap_or_else(|_| "warn".into());
        cmd.env("LD_PRELOAD", shim)
            .env("RINGSOCK_LOG", level)
            .env("RINGSOCK_CTL_SOCK", ctl_sock);
        // The suite compares the ring's behaviour with the kernel's, so a
        // server slowed past the default claim wait (1 s) by a loaded
        // machine must not turn the connection into plain TCP: the claim
        // gets as long as the runner's ring check waits, unless the
        // caller chose a bound.
        if std::env::var_os("RINGSOCK_CLAIM_WAIT_MS").is_none() {
            cmd.env("RINGSOCK_CLAIM_WAIT_MS", RING_WAIT.as_millis().to_string());
        }
    }
    let fd = chan.as_raw_fd();
    // SAFETY: the closure runs between fork and exec and only makes
    // async-signal-safe calls (setpgid, dup2, fcntl).
    unsafe {
        cmd.pre_exec(move || {
            if libc::setpgid(0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if fd == SYNC_FD {
                // dup2 onto itself would keep close-on-exec.
                libc::fcntl(fd, libc::F_SETFD, 0);
            } else if libc::dup2(fd, SYNC_FD) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", a.bin.display()))
}

/// Kills every process in the group `pgid`.
pub fn kill_group(pgid: u32) {
    // SAFETY: signalling a process group this runner created.
    unsafe { libc::kill(-(pgid as libc::pid_t), libc::SIGKILL) };
}

/// Whether a process of group `pgid` still runs. Zombies do not count:
/// an orphan's new parent reaps it when it will.
fn group_alive(pgid: u32) -> bool {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return false;
    };
    dir.flatten().any(|e| {
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            return false;
        };
        // Fields after the command (which may hold spaces): state, ppid, pgrp.
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            return false;
        };
        let f: Vec<&str> = rest.split_whitespace().collect();
        f.len() > 2 && f[0] != "Z" && f[2] == pgid.to_string()
    })
}

/// Waits (bounded) for group `pgid` to be gone; kills what is left and
/// returns false if it was not.
pub fn group_gone(pgid: u32, within: Duration) -> bool {
    let end = Instant::now() + within;
    while group_alive(pgid) {
        if Instant::now() >= end {
            kill_group(pgid);
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    true
}
