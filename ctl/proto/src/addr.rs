//! Conversions between `std::net::SocketAddr` and C socket addresses, and
//! the canonical form in which addresses of both families compare.

use std::mem;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

/// Reads an AF_INET/AF_INET6 address filled in by the kernel; `None` for
/// other families or a length too short for the family.
pub fn from_raw(storage: &libc::sockaddr_storage, len: libc::socklen_t) -> Option<SocketAddr> {
    let len = len as usize;
    match i32::from(storage.ss_family) {
        libc::AF_INET if len >= mem::size_of::<libc::sockaddr_in>() => {
            // SAFETY: the family says the storage holds a sockaddr_in, the
            // length covers it, and sockaddr_storage is aligned for any
            // socket address type.
            let sin = unsafe { &*(storage as *const _ as *const libc::sockaddr_in) };
            let ip = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
            Some(SocketAddr::V4(SocketAddrV4::new(
                ip,
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 if len >= mem::size_of::<libc::sockaddr_in6>() => {
            // SAFETY: as above, for sockaddr_in6.
            let sin6 = unsafe { &*(storage as *const _ as *const libc::sockaddr_in6) };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(sin6.sin6_addr.s6_addr),
                u16::from_be(sin6.sin6_port),
                u32::from_be(sin6.sin6_flowinfo),
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// Builds the C form of `addr` for bind/connect.
pub fn to_raw(addr: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain old data; all-zero is a valid value.
    let mut storage: libc::sockaddr_storage = unsafe { mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            // SAFETY: sockaddr_storage is large and aligned enough for any
            // address type; we only write the sockaddr_in prefix.
            let sin = unsafe { &mut *(&mut storage as *mut _ as *mut libc::sockaddr_in) };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_port = a.port().to_be();
            sin.sin_addr.s_addr = u32::from(*a.ip()).to_be();
            mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            // SAFETY: as above, for sockaddr_in6.
            let sin6 = unsafe { &mut *(&mut storage as *mut _ as *mut libc::sockaddr_in6) };
            sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sin6.sin6_port = a.port().to_be();
            sin6.sin6_flowinfo = a.flowinfo().to_be();
            sin6.sin6_addr.s6_addr = a.ip().octets();
            sin6.sin6_scope_id = a.scope_id();
            mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (storage, len as libc::socklen_t)
}

/// The form in which two addresses naming the same endpoint compare equal:
/// an IPv4-mapped IPv6 address (what a dual-stack `::` socket reports for
/// an IPv4 peer) becomes plain IPv4, and IPv6 flowinfo is dropped (it is
/// per-packet metadata, not identity). The scope id stays: it is part of a
/// link-local address.
pub fn canonical(addr: SocketAddr) -> SocketAddr {
    match addr {
        SocketAddr::V4(_) => addr,
        SocketAddr::V6(a) => match a.ip().to_ipv4_mapped() {
            Some(v4) => SocketAddr::V4(SocketAddrV4::new(v4, a.port())),
            None => SocketAddr::V6(SocketAddrV6::new(*a.ip(), a.port(), 0, a.scope_id())),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_round_trip() {
        for s in ["10.1.2.3:4567", "[2001:db8::7]:80", "[fe80::1%2]:9"] {
            let a: SocketAddr = s.parse().unwrap();
            let (st, len) = to_raw(&a);
            assert_eq!(from_raw(&st, len), Some(a));
            assert_eq!(from_raw(&st, len - 1), None);
        }
    }

    #[test]
    fn canonical_maps_v4_in_v6() {
        let m: SocketAddr = "[::ffff:127.0.0.1]:80".parse().unwrap();
        assert_eq!(canonical(m), "127.0.0.1:80".parse().unwrap());
        let f = SocketAddr::V6(SocketAddrV6::new(Ipv6Addr::LOCALHOST, 1, 99, 0));
        assert_eq!(canonical(f), "[::1]:1".parse().unwrap());
    }
}
