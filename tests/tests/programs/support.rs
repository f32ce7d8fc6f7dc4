//! What several program tests share: an HTTP back end, and a service user
//! for servers that refuse to run as root.

use std::time::Duration;

use ringsock_integration::matrix::Matrix;
use ringsock_integration::{free_port, script, Server};

/// tests/scripts/http_backend.py (keep-alive HTTP/1.1) under the shim,
/// serving `dir`; returns it and its port once it listens.
pub fn http_backend(m: &mut Matrix, dir: &std::path::Path) -> (Server, u16) {
    let port = free_port();
    let mut s = m.serve(
        m.ctl
            .shimmed("python3")
            .arg(script("http_backend.py"))
            .arg(port.to_string())
            .arg(dir),
    );
    s.wait_line("listening", Duration::from_secs(15));
    (s, port)
}

/// A daemon's binary: from PATH, else from /usr/sbin (off a normal user's
/// PATH on Debian); None when it is not installed.
pub fn daemon_bin(program: &str) -> Option<String> {
    ringsock_integration::which(program)
        .or_else(|| ringsock_integration::which(&format!("/usr/sbin/{program}")))
        .map(|p| p.to_string_lossy().into_owned())
}

/// Whether the tests run as root (servers that refuse root then run as
/// their service user).
pub fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// uid and gid of `user`, from /etc/passwd.
pub fn user_ids(user: &str) -> Option<(u32, u32)> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        (f.len() > 3 && f[0] == user).then(|| Some((f[2].parse().ok()?, f[3].parse().ok()?)))?
    })
}

/// Hands `path` (and what is below it) to `uid:gid`.
pub fn chown_tree(path: &std::path::Path, uid: u32, gid: u32) {
    let out = std::process::Command::new("chown")
        .arg("-R")
        .arg(format!("{uid}:{gid}"))
        .arg(path)
        .output()
        .expect("chown");
    assert!(out.status.success(), "chown {}: {out:?}", path.display());
}
