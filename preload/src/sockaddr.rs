//! Reading C socket addresses.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

/// Converts an AF_INET/AF_INET6 `sockaddr` of `len` bytes; None for other
/// families or short buffers.
///
/// # Safety
/// `addr` is null or valid for `len` bytes.
pub unsafe fn to_std(addr: *const libc::sockaddr, len: libc::socklen_t) -> Option<SocketAddr> {
    if addr.is_null() || (len as usize) < std::mem::size_of::<libc::sa_family_t>() {
        return None;
    }
    // SAFETY: at least the family field is readable (checked above); the
    // structs are read unaligned because C callers owe us no alignment.
    let family = unsafe { std::ptr::read_unaligned(addr.cast::<libc::sa_family_t>()) };
    match i32::from(family) {
        libc::AF_INET if len as usize >= std::mem::size_of::<libc::sockaddr_in>() => {
            // SAFETY: len covers a sockaddr_in.
            let a = unsafe { std::ptr::read_unaligned(addr.cast::<libc::sockaddr_in>()) };
            let ip = Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr));
            Some(SocketAddr::V4(SocketAddrV4::new(
                ip,
                u16::from_be(a.sin_port),
            )))
        }
        libc::AF_INET6 if len as usize >= std::mem::size_of::<libc::sockaddr_in6>() => {
            // SAFETY: len covers a sockaddr_in6.
            let a = unsafe { std::ptr::read_unaligned(addr.cast::<libc::sockaddr_in6>()) };
            let ip = Ipv6Addr::from(a.sin6_addr.s6_addr);
            Some(SocketAddr::V6(SocketAddrV6::new(
                ip,
                u16::from_be(a.sin6_port),
                a.sin6_flowinfo,
                a.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// A C socket address for `a`, with its length.
pub fn from_std(a: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain data; zeroes are a valid value.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match a {
        SocketAddr::V4(v4) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: v4.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from(*v4.ip()).to_be(),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than sockaddr_in and
            // suitably aligned for it.
            unsafe { std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin) };
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(v6) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: v6.port().to_be(),
                sin6_flowinfo: v6.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: v6.ip().octets(),
                },
                sin6_scope_id: v6.scope_id(),
            };
            // SAFETY: as above, for sockaddr_in6.
            unsafe { std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin6) };
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as libc::socklen_t)
}

/// The local or peer address of socket `fd` through libc (never our hooks).
pub fn query(fd: i32, peer: bool) -> Option<SocketAddr> {
    // SAFETY: sockaddr_storage is plain data; zeroes are a valid value.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    let p = (&mut ss as *mut libc::sockaddr_storage).cast::<libc::sockaddr>();
    // SAFETY: p/len describe `ss`.
    let r = unsafe {
        if peer {
            crate::real::getpeername(fd, p, &mut len)
        } else {
            crate::real::getsockname(fd, p, &mut len)
        }
    };
    if r != 0 {
        return None;
    }
    // SAFETY: the kernel wrote `len` bytes of address into ss.
    unsafe { to_std(p, len) }
}

/// Whether `fd` may accept connections for addresses other than its own
/// (IP_TRANSPARENT / IPV6_TRANSPARENT, as TPROXY listeners set): then an
/// accepted socket's local address is not the listener's.
pub fn transparent(fd: i32) -> bool {
    let on = |level, name| {
        let mut v: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: v/len describe a c_int the kernel writes.
        let r = unsafe {
            crate::real::getsockopt(
                fd,
                level,
                name,
                (&mut v as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        r == 0 && v != 0
    };
    on(libc::SOL_IP, libc::IP_TRANSPARENT) || on(libc::SOL_IPV6, libc::IPV6_TRANSPARENT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_transparent_socket_is_seen() {
        for (domain, level, name) in [
            (libc::AF_INET, libc::SOL_IP, libc::IP_TRANSPARENT),
            (libc::AF_INET6, libc::SOL_IPV6, libc::IPV6_TRANSPARENT),
        ] {
            // SAFETY: plain socket calls on a socket this test owns.
            unsafe {
                let fd = libc::socket(domain, libc::SOCK_STREAM, 0);
                assert!(fd >= 0);
                assert!(!transparent(fd));
                let one: libc::c_int = 1;
                let len = std::mem::size_of_val(&one) as libc::socklen_t;
                // Needs CAP_NET_ADMIN; without it there is nothing to see.
                if libc::setsockopt(fd, level, name, (&one as *const libc::c_int).cast(), len) == 0
                {
                    assert!(transparent(fd));
                }
                libc::close(fd);
            }
        }
    }

    #[test]
    fn v4_and_v6() {
        let sin = libc::sockaddr_in {
            sin_family: libc::AF_INET as u16,
            sin_port: 6379u16.to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from(Ipv4Addr::new(127, 0, 0, 1)).to_be(),
            },
            sin_zero: [0; 8],
        };
        let p = (&sin as *const libc::sockaddr_in).cast();
        let n = std::mem::size_of_val(&sin) as u32;
        // SAFETY: p/n describe sin.
        let got = unsafe { to_std(p, n) };
        assert_eq!(got, Some("127.0.0.1:6379".parse().unwrap()));
        // SAFETY: a shorter length is rejected before reading past it.
        assert_eq!(unsafe { to_std(p, 4) }, None);
        // SAFETY: null is allowed.
        assert_eq!(unsafe { to_std(std::ptr::null(), 16) }, None);
        // SAFETY: sockaddr_in6 is plain data; zeroes are a valid value.
        let mut sin6: libc::sockaddr_in6 = unsafe { std::mem::zeroed() };
        sin6.sin6_family = libc::AF_INET6 as u16;
        sin6.sin6_port = 80u16.to_be();
        sin6.sin6_addr.s6_addr = Ipv6Addr::LOCALHOST.octets();
        let p6 = (&sin6 as *const libc::sockaddr_in6).cast();
        let n6 = std::mem::size_of_val(&sin6) as u32;
        // SAFETY: p6/n6 describe sin6.
        let got = unsafe { to_std(p6, n6) };
        assert_eq!(got, Some("[::1]:80".parse().unwrap()));
    }
}
