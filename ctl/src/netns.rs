//! Network namespaces as the daemon tells them apart: by the identity of
//! their nsfs file (device and inode, what `ip netns identify` and
//! `readlink /proc/PID/ns/net` compare), learned from the kernel, never
//! from a message. One daemon serves every namespace of its host, and two
//! namespaces may use the same addresses: offers, claims and listeners are
//! matched only within one namespace (DESIGN "Namespaces").

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
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

    /// No namespace (nsfs's device is never 0): where offers for a
    /// translated address wait, their server's namespace known only once
    /// a connection-tracking entry names it at the claim.
    pub const TRANSLATED: NetNs = NetNs { dev: 0, ino: 0 };

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

/// The addresses of the namespace process `pid` is in (its
/// /proc/PID/net: the LOCAL host routes of fib_trie, and if_inet6), read
/// without entering it. Loopback included.
pub fn addrs_of_pid(pid: u32) -> io::Result<Vec<IpAddr>> {
    let v4 = std::fs::read_to_string(format!("/proc/{pid}/net/fib_trie"))?;
    let mut out = local_v4(&v4);
    // No IPv6 in the namespace (or the kernel): no file.
    if let Ok(v6) = std::fs::read_to_string(format!("/proc/{pid}/net/if_inet6")) {
        out.extend(v6.lines().filter_map(inet6_line).map(IpAddr::V6));
    }
    out.sort();
    out.dedup();
    Ok(out)
}

/// The addresses fib_trie lists as `/32 host LOCAL`: each follows the
/// `|-- ADDRESS` line it belongs to.
fn local_v4(fib_trie: &str) -> Vec<IpAddr> {
    let mut out = Vec::new();
    let mut current = None;
    for line in fib_trie.lines().map(str::trim) {
        if let Some(a) = line.strip_prefix("|-- ") {
            current = a.parse::<Ipv4Addr>().ok();
        } else if line.starts_with("/32 host LOCAL") {
            out.extend(current.map(IpAddr::V4));
        }
    }
    out
}

/// The address of one if_inet6 line (32 hex digits first).
fn inet6_line(line: &str) -> Option<Ipv6Addr> {
    let hex = line.split_whitespace().next()?;
    u128::from_str_radix(hex, 16)
        .ok()
        .filter(|_| hex.len() == 32)
        .map(Ipv6Addr::from)
}

/// The administrative capabilities a process has in its effective set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Caps {
    /// CAP_SYS_ADMIN: it may enter any namespace of its user namespace.
    pub sys_admin: bool,
    /// CAP_NET_ADMIN: it administers the network of its namespace.
    pub net_admin: bool,
}

impl Caps {
    pub const NONE: Caps = Caps {
        sys_admin: false,
        net_admin: false,
    };
    pub const ALL: Caps = Caps {
        sys_admin: true,
        net_admin: true,
    };
}

/// The capabilities of process `pid` (/proc/PID/status CapEff); none
/// when unknown.
pub fn caps_of(pid: u32) -> Caps {
    const CAP_NET_ADMIN: u32 = 12;
    const CAP_SYS_ADMIN: u32 = 21;
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return Caps::NONE;
    };
    let eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0);
    Caps {
        sys_admin: eff & (1 << CAP_SYS_ADMIN) != 0,
        net_admin: eff & (1 << CAP_NET_ADMIN) != 0,
    }
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
    fn local_addresses_from_proc() {
        let trie = "Main:\n  +-- 0.0.0.0/0 3 0 5\n     |-- 0.0.0.0\n        /0 universe UNICAST\n\
            \x20          |-- 127.0.0.1\n              /32 host LOCAL\n\
            \x20       |-- 10.1.2.3\n           /24 link UNICAST\n           /32 host LOCAL\n\
            \x20       |-- 10.1.2.255\n           /32 link BROADCAST\n";
        assert_eq!(
            local_v4(trie),
            vec![IpAddr::from([127, 0, 0, 1]), IpAddr::from([10, 1, 2, 3])]
        );
        assert_eq!(
            inet6_line("fd000000000000000000000000000002 04 40 00 82     eth0"),
            Some("fd00::2".parse().unwrap())
        );
        assert_eq!(inet6_line("zz 04"), None);
        let own = addrs_of_pid(std::process::id()).unwrap();
        assert!(own.contains(&IpAddr::from([127, 0, 0, 1])), "{own:?}");
    }

    #[test]
    fn a_process_that_is_gone_is_no_admin() {
        assert!(of_pid(u32::MAX).is_err());
        assert_eq!(caps_of(u32::MAX), Caps::NONE);
        // Whatever we are, asking does not fail.
        let _ = caps_of(std::process::id());
    }
}
