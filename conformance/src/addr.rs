//! Socket addresses as the logs print them: the family, the IP (always a
//! loopback or wildcard address in these scenarios) and the port as `SRV`
//! when it is the scenario's server port, `EPH` for any other non-zero
//! port (ephemeral ports differ from run to run), `0` when unbound.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::atomic::{AtomicU16, Ordering};

static SERVER_PORT: AtomicU16 = AtomicU16::new(0);

/// Sets the port printed as `SRV` (once per role process).
pub fn set_server_port(p: u16) {
    SERVER_PORT.store(p, Ordering::Relaxed);
}

fn server_port() -> u16 {
    SERVER_PORT.load(Ordering::Relaxed)
}

fn port(p: u16) -> String {
    if p == 0 {
        "0".into()
    } else if p == server_port() {
        "SRV".into()
    } else {
        "EPH".into()
    }
}

/// A sockaddr_storage filled to `len` bytes by the kernel.
pub fn show(ss: &libc::sockaddr_storage, len: libc::socklen_t) -> String {
    if len == 0 {
        return "none".into();
    }
    match i32::from(ss.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in.
            let sin = unsafe { &*(ss as *const _ as *const libc::sockaddr_in) };
            let ip = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
            format!("AF_INET {ip}:{}", port(u16::from_be(sin.sin_port)))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6.
            let sin6 = unsafe { &*(ss as *const _ as *const libc::sockaddr_in6) };
            let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            format!("AF_INET6 [{ip}]:{}", port(u16::from_be(sin6.sin6_port)))
        }
        f => crate::names::family(f),
    }
}

/// 127.0.0.1:`port`.
pub fn v4(ip: Ipv4Addr, port: u16) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    // SAFETY: sockaddr_in fits in sockaddr_storage.
    let sin = unsafe { &mut *(&mut ss as *mut _ as *mut libc::sockaddr_in) };
    sin.sin_family = libc::AF_INET as libc::sa_family_t;
    sin.sin_port = port.to_be();
    sin.sin_addr.s_addr = u32::from(ip).to_be();
    (
        ss,
        std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
    )
}

/// [`ip`]:`port`.
pub fn v6(ip: Ipv6Addr, port: u16) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    // SAFETY: sockaddr_in6 fits in sockaddr_storage.
    let sin6 = unsafe { &mut *(&mut ss as *mut _ as *mut libc::sockaddr_in6) };
    sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
    sin6.sin6_port = port.to_be();
    sin6.sin6_addr.s6_addr = ip.octets();
    (
        ss,
        std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_print_by_role() {
        set_server_port(4242);
        let (ss, len) = v4(Ipv4Addr::LOCALHOST, 4242);
        assert_eq!(show(&ss, len), "AF_INET 127.0.0.1:SRV");
        let (ss, len) = v6(Ipv6Addr::LOCALHOST, 50000);
        assert_eq!(show(&ss, len), "AF_INET6 [::1]:EPH");
        assert_eq!(show(&ss, 0), "none");
    }
}
