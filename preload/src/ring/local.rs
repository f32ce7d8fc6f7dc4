//! Whether an address belongs to this host.
//!
//! A shared-memory ring only joins two processes of one host, so the shim
//! offers one only for destinations on this host: loopback, the
//! unspecified address (which connect(2) sends to loopback), or an address
//! of one of this host's interfaces. Anything else stays TCP at once,
//! without asking the daemon (which would have to consult the other
//! host's ctl). The interface list is cached and refreshed at most once a
//! second, and only when an address is not found in it.

use std::net::IpAddr;

use crate::plock::PLock;
use crate::sys;

const REFRESH_NS: u64 = 1_000_000_000;

struct Cache {
    addrs: Vec<IpAddr>,
    loaded_ns: u64,
}

static CACHE: PLock<Cache> = PLock::new(
    Cache {
        addrs: Vec::new(),
        loaded_ns: 0,
    },
    || Cache {
        addrs: Vec::new(),
        loaded_ns: 0,
    },
);

fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// The host's interface addresses (getifaddrs).
fn interface_addrs() -> Vec<IpAddr> {
    let mut out = Vec::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list we free below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return out;
    }
    let mut p = head;
    while !p.is_null() {
        // SAFETY: p is a node of the list getifaddrs returned.
        let ifa = unsafe { &*p };
        if !ifa.ifa_addr.is_null() {
            // SAFETY: ifa_addr points to a sockaddr of its family's size.
            let fam = i32::from(unsafe { (*ifa.ifa_addr).sa_family });
            let len = match fam {
                libc::AF_INET => std::mem::size_of::<libc::sockaddr_in>(),
                libc::AF_INET6 => std::mem::size_of::<libc::sockaddr_in6>(),
                _ => 0,
            };
            if len > 0 {
                // SAFETY: as above, `len` bytes of the family's sockaddr.
                if let Some(a) = unsafe { crate::sockaddr::to_std(ifa.ifa_addr, len as u32) } {
                    out.push(canonical(a.ip()));
                }
            }
        }
        p = ifa.ifa_next;
    }
    // SAFETY: the list came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    out
}

/// True if `ip` is this host's.
pub fn is_local(ip: IpAddr) -> bool {
    let ip = canonical(ip);
    if ip.is_loopback() || ip.is_unspecified() {
        return true;
    }
    let mut c = CACHE.lock();
    if c.addrs.contains(&ip) {
        return true;
    }
    let now = sys::monotonic_ns();
    if c.loaded_ns == 0 || now.saturating_sub(c.loaded_ns) >= REFRESH_NS {
        c.addrs = interface_addrs();
        c.loaded_ns = now.max(1);
        return c.addrs.contains(&ip);
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_and_interfaces_are_local_others_not() {
        assert!(is_local("127.0.0.1".parse().unwrap()));
        assert!(is_local("::1".parse().unwrap()));
        assert!(is_local("::ffff:127.0.0.1".parse().unwrap()));
        assert!(is_local("0.0.0.0".parse().unwrap()));
        // TEST-NET-3, never assigned to a host.
        assert!(!is_local("203.0.113.7".parse().unwrap()));
        for a in interface_addrs() {
            assert!(is_local(a), "{a}");
        }
    }
}
