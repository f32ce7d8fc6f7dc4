//! Ownership proofs on real descriptors: what kind of socket a passed fd
//! is, and the addresses the kernel says it has. Never trusts what the
//! message claims; only getsockname/getpeername/getsockopt on the fd.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use ringsock_proto::{io as pio, RingStat};

use crate::handler::{ClientProof, Env, ListenerProof};
use crate::netns::NetNs;
use crate::ring::{RingMap, RingStats};

/// The production environment: proofs through system calls, rings mapped
/// with the configured stats provider.
pub struct SysEnv {
    stats: Box<dyn RingStats>,
    offers: Option<crate::offer_table::OfferTableFd>,
}

impl SysEnv {
    pub fn new(stats: Box<dyn RingStats>) -> Self {
        SysEnv {
            stats,
            offers: None,
        }
    }

    /// The offer table's memfd, handed to every process at hello.
    pub fn with_offer_table(mut self, fd: crate::offer_table::OfferTableFd) -> Self {
        self.offers = Some(fd);
        self
    }
}

fn why(what: &str, e: io::Error) -> String {
    format!("{what}: {e}")
}

/// Checks that `fd` is a TCP socket over IPv4/IPv6; returns whether it is
/// listening.
fn tcp_socket(fd: RawFd) -> Result<bool, String> {
    let domain = pio::sockopt_int(fd, libc::SOL_SOCKET, libc::SO_DOMAIN)
        .map_err(|e| why("not a socket", e))?;
    if domain != libc::AF_INET && domain != libc::AF_INET6 {
        return Err("not an IPv4/IPv6 socket".into());
    }
    let ty =
        pio::sockopt_int(fd, libc::SOL_SOCKET, libc::SO_TYPE).map_err(|e| why("SO_TYPE", e))?;
    let proto = pio::sockopt_int(fd, libc::SOL_SOCKET, libc::SO_PROTOCOL)
        .map_err(|e| why("SO_PROTOCOL", e))?;
    if ty != libc::SOCK_STREAM || proto != libc::IPPROTO_TCP {
        return Err("not a TCP socket".into());
    }
    let listening = pio::sockopt_int(fd, libc::SOL_SOCKET, libc::SO_ACCEPTCONN)
        .map_err(|e| why("SO_ACCEPTCONN", e))?;
    Ok(listening != 0)
}

impl Env for SysEnv {
    type Fd = OwnedFd;
    type Ring = RingMap;

    fn listener(&mut self, fd: &OwnedFd) -> Result<ListenerProof, String> {
        let raw = fd.as_raw_fd();
        if !tcp_socket(raw)? {
            return Err("socket is not listening".into());
        }
        let addr = pio::local_addr(raw).map_err(|e| why("getsockname", e))?;
        // An IPv6 wildcard socket takes IPv4 connections too unless
        // IPV6_V6ONLY is set; the offer match needs to know which.
        let dual_stack = match addr {
            SocketAddr::V6(a) if a.ip().is_unspecified() => {
                pio::sockopt_int(raw, libc::IPPROTO_IPV6, libc::IPV6_V6ONLY)
                    .map_err(|e| why("IPV6_V6ONLY", e))?
                    == 0
            }
            _ => false,
        };
        Ok(ListenerProof { addr, dual_stack })
    }

    fn client(&mut self, fd: &OwnedFd) -> Result<ClientProof, String> {
        let raw = fd.as_raw_fd();
        if tcp_socket(raw)? {
            return Err("socket is listening".into());
        }
        let local = pio::local_addr(raw).map_err(|e| why("getsockname", e))?;
        let peer = match pio::peer_addr(raw) {
            Ok(p) => Some(p),
            Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => None,
            Err(e) => return Err(why("getpeername", e)),
        };
        Ok(ClientProof { local, peer })
    }

    fn accepted(&mut self, fd: &OwnedFd) -> Result<(SocketAddr, SocketAddr), String> {
        let raw = fd.as_raw_fd();
        if tcp_socket(raw)? {
            return Err("socket is listening".into());
        }
        let local = pio::local_addr(raw).map_err(|e| why("getsockname", e))?;
        let peer = pio::peer_addr(raw).map_err(|e| why("getpeername", e))?;
        Ok((local, peer))
    }

    fn netns(&mut self, fd: &OwnedFd) -> Option<NetNs> {
        crate::netns::of_socket(fd.as_raw_fd()).ok()
    }

    fn own_netns(&mut self) -> Option<NetNs> {
        crate::netns::own().ok()
    }

    fn netns_addrs(&mut self, pid: u32, netns: NetNs) -> Option<Vec<std::net::IpAddr>> {
        // The process must still be in the namespace it is read for.
        if crate::netns::of_pid(pid).ok()? != netns {
            return None;
        }
        let addrs = crate::netns::addrs_of_pid(pid).ok()?;
        // It could have moved (setns) between the two reads.
        (crate::netns::of_pid(pid).ok()? == netns).then_some(addrs)
    }

    fn conntrack_by_reply(
        &mut self,
        reply: &crate::conntrack::Tuple,
    ) -> Option<crate::conntrack::Entry> {
        crate::conntrack::by_reply(reply)
            .map_err(|e| log::debug!("conntrack look-up of {reply:?}: {e}"))
            .ok()
            .flatten()
    }

    fn conntrack_translated(&mut self) -> Vec<crate::conntrack::Entry> {
        crate::conntrack::translated()
            .map_err(|e| log::debug!("conntrack dump: {e}"))
            .unwrap_or_default()
    }

    fn offer_table(&mut self) -> Option<OwnedFd> {
        self.offers.as_ref().and_then(|t| t.share())
    }

    fn open_ring(&mut self, fd: OwnedFd) -> RingMap {
        RingMap::open(fd)
    }

    fn ring_stats(&self, ring: &RingMap) -> Vec<RingStat> {
        self.stats.stats(&ring.view())
    }

    fn is_local_ip(&mut self, ip: std::net::IpAddr) -> bool {
        crate::sys::is_local_ip(ip)
    }

    fn process_name(&self, pid: u32) -> Option<String> {
        crate::sys::process_name(pid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ring::MemfdStats;
    use std::net::{TcpListener, TcpStream, UdpSocket};
    use std::os::fd::AsFd;

    fn env() -> SysEnv {
        SysEnv::new(Box::new(MemfdStats))
    }

    fn owned(f: impl AsFd) -> OwnedFd {
        f.as_fd().try_clone_to_owned().unwrap()
    }

    #[test]
    fn listener_proof() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let p = env().listener(&owned(&l)).unwrap();
        assert_eq!(p.addr, l.local_addr().unwrap());
        assert!(!p.dual_stack);
        assert!(env().client(&owned(&l)).is_err());
        assert!(env().accepted(&owned(&l)).is_err());
    }

    #[test]
    fn connected_socket_proofs() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        let (local, peer) = env().accepted(&owned(&s)).unwrap();
        assert_eq!(local, l.local_addr().unwrap());
        assert_eq!(peer, c.local_addr().unwrap());
        let cp = env().client(&owned(&c)).unwrap();
        assert_eq!(cp.local, c.local_addr().unwrap());
        assert_eq!(cp.peer, Some(l.local_addr().unwrap()));
        assert!(env().listener(&owned(&c)).is_err());
    }

    #[test]
    fn local_addresses() {
        let mut e = env();
        assert!(e.is_local_ip("127.0.0.1".parse().unwrap()));
        assert!(e.is_local_ip("127.3.4.5".parse().unwrap()));
        // TEST-NET-3: documentation only, never configured on a host.
        assert!(!e.is_local_ip("203.0.113.77".parse().unwrap()));
    }

    #[test]
    fn non_tcp_descriptors_prove_nothing() {
        let u = UdpSocket::bind("127.0.0.1:0").unwrap();
        assert!(env().client(&owned(&u)).is_err());
        let f = std::fs::File::open("/dev/null").unwrap();
        assert!(env().listener(&owned(&f)).is_err());
        assert!(env().accepted(&owned(&f)).is_err());
    }
}
