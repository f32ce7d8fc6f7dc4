//! Network namespaces as the daemon tells them apart: by the identity of
//! their nsfs file (device and inode, what `ip netns identify` and
//! `readlink /proc/PID/ns/net` compare), learned from the kernel, never
//! from a message. One daemon serves every namespace of its host, and two
//! namespaces may use the same addresses: offers, claims and listeners are
//! matched only within one namespace (DESIGN "Namespaces").

use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;

/// A network namespace of this host, by its nsfs (device, inode).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NetNs {
    pub dev: u64,
    pub ino: u64,
}

impl NetNs {
    /// The one namespace fakes (tests, fuzzing) put everything in unless
    /// told otherwise.
    pub const FAKE: NetNs = NetNs { dev: 4, ino: 1 };

    fn of_file(meta: &std::fs::Metadata) -> NetNs {
        NetNs {
            dev: meta.dev(),
            ino: meta.ino(),
        }
    }
}

impl std::fmt::Display for NetNs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "net:[{}]", self.ino)
    }
}

/// The namespace socket `fd` belongs to (SIOCGSKNS: the namespace it was
/// created in, whichever process holds it now). Needs CAP_NET_ADMIN over
/// that namespace, which a root daemon has; EPERM otherwise.
pub fn of_socket(fd: RawFd) -> io::Result<NetNs> {
    // SAFETY: SIOCGSKNS takes no argument and returns a new descriptor of
    // the socket's namespace (or -1); `fd` is a descriptor we hold.
    let ns = unsafe { libc::ioctl(fd, libc::SIOCGSKNS as _) };
    if ns < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned `ns`, owned by nobody else.
    let ns = unsafe { OwnedFd::from_raw_fd(ns) };
    let file = std::fs::File::from(ns);
    Ok(NetNs::of_file(&file.metadata()?))
}

/// The namespace process `pid` (of the daemon's pid namespace) is in now.
pub fn of_pid(pid: u32) -> io::Result<NetNs> {
    Ok(NetNs::of_file(&std::fs::metadata(format!(
        "/proc/{pid}/ns/net"
    ))?))
}

/// Whether process `pid` has CAP_SYS_ADMIN in its effective set (it may
/// enter any namespace of its user namespace). False when unknown.
pub fn is_admin(pid: u32) -> bool {
    const CAP_SYS_ADMIN: u32 = 21;
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return false;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << CAP_SYS_ADMIN) != 0)
}

/// The daemon's own namespace (its addresses are what `is_local_ip` sees).
pub fn own() -> io::Result<NetNs> {
    Ok(NetNs::of_file(&std::fs::metadata(
        "/proc/thread-self/ns/net",
    )?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;
    use std::os::fd::AsRawFd;

    #[test]
    fn a_socket_is_in_the_namespace_of_its_creator() {
        let own = own().unwrap();
        assert_eq!(of_pid(std::process::id()).unwrap(), own);
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        match of_socket(l.as_raw_fd()) {
            Ok(ns) => assert_eq!(ns, own),
            // Without CAP_NET_ADMIN the kernel does not say.
            Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EPERM)),
        }
        let f = std::fs::File::open("/dev/null").unwrap();
        assert!(of_socket(f.as_raw_fd()).is_err());
    }

    #[test]
    fn a_process_that_is_gone_is_no_admin() {
        assert!(of_pid(u32::MAX).is_err());
        assert!(!is_admin(u32::MAX));
        // Whatever we are, asking does not fail.
        let _ = is_admin(std::process::id());
    }
}
