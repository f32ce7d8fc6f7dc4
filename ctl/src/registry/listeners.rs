//! Refcounted table of shimmed listening sockets, and the match rule that
//! decides whether an offer's server address has a listener on this host,
//! in the offer's network namespace.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::netns::NetNs;

/// A registered listener. `dual_stack` marks an IPv6 wildcard socket
/// without IPV6_V6ONLY, which also accepts IPv4 connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ListenerKey {
    /// Canonical address the socket is bound to.
    pub addr: SocketAddr,
    pub dual_stack: bool,
    /// The namespace the socket belongs to (the kernel's word on it): the
    /// same address in another namespace is another listener.
    pub netns: NetNs,
}

/// Host-wide refcounts: one reference per successful ListenerAdd of any
/// session (nginx workers each register the same inherited socket).
#[derive(Debug, Default)]
pub struct ListenerTable {
    refs: HashMap<ListenerKey, usize>,
}

impl ListenerTable {
    pub fn add(&mut self, key: ListenerKey) {
        *self.refs.entry(key).or_insert(0) += 1;
    }

    /// Drops `n` references of `key`.
    pub fn release(&mut self, key: ListenerKey, n: usize) {
        if let Some(c) = self.refs.get_mut(&key) {
            *c = c.saturating_sub(n);
            if *c == 0 {
                self.refs.remove(&key);
            }
        }
    }

    /// Number of distinct listener addresses (for status and tests).
    pub fn len(&self) -> usize {
        self.refs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.refs.is_empty()
    }

    /// References held on `key` by all sessions together.
    pub fn refs(&self, key: &ListenerKey) -> usize {
        self.refs.get(key).copied().unwrap_or(0)
    }

    pub fn keys(&self) -> impl Iterator<Item = &ListenerKey> {
        self.refs.keys()
    }

    fn has(&self, netns: NetNs, addr: SocketAddr, dual_stack: bool) -> bool {
        self.refs.contains_key(&ListenerKey {
            addr,
            dual_stack,
            netns,
        })
    }

    /// Is there a listener in `netns` that would accept a connection to
    /// `server` (canonical)? Exact ip:port, the wildcard of the same family
    /// and port, or, for IPv4, a dual-stack `[::]` wildcard on that port.
    pub fn matches(&self, netns: NetNs, server: SocketAddr) -> bool {
        let has = |addr, dual_stack| self.has(netns, addr, dual_stack);
        let port = server.port();
        let any = match server.ip() {
            IpAddr::V4(_) => SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port),
            IpAddr::V6(_) => SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), port),
        };
        let v6_any = SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), port);
        has(server, false)
            || has(server, true)
            || has(any, false)
            || has(any, true)
            || (server.is_ipv4() && has(v6_any, true))
    }

    /// Is there a listener in `netns` bound to exactly `server`'s address
    /// and port (not a wildcard)?
    pub fn matches_exact(&self, netns: NetNs, server: SocketAddr) -> bool {
        self.has(netns, server, false) || self.has(netns, server, true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(s: &str, dual_stack: bool) -> ListenerKey {
        ListenerKey {
            addr: s.parse().unwrap(),
            dual_stack,
            netns: NS,
        }
    }

    const NS: NetNs = NetNs::FAKE;

    fn a(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn exact_and_wildcard() {
        let mut t = ListenerTable::default();
        t.add(key("127.0.0.1:80", false));
        assert!(t.matches(NS, a("127.0.0.1:80")));
        assert!(!t.matches(NS, a("127.0.0.2:80")));
        assert!(!t.matches(NS, a("127.0.0.1:81")));
        t.add(key("0.0.0.0:81", false));
        assert!(t.matches(NS, a("10.0.0.1:81")));
        assert!(!t.matches(NS, a("[::1]:81")));
    }

    #[test]
    fn v6_wildcard_takes_v4_only_when_dual_stack() {
        let mut t = ListenerTable::default();
        t.add(key("[::]:443", false));
        assert!(t.matches(NS, a("[::1]:443")));
        assert!(!t.matches(NS, a("127.0.0.1:443")));
        t.add(key("[::]:443", true));
        assert!(t.matches(NS, a("127.0.0.1:443")));
    }

    #[test]
    fn refcounts() {
        let mut t = ListenerTable::default();
        let k = key("127.0.0.1:80", false);
        t.add(k);
        t.add(k);
        t.release(k, 1);
        assert!(t.matches(NS, a("127.0.0.1:80")));
        t.release(k, 1);
        assert!(!t.matches(NS, a("127.0.0.1:80")));
        assert_eq!(t.len(), 0);
        t.release(k, 5);
        assert_eq!(t.len(), 0);
    }

    #[test]
    fn another_namespace_is_another_listener() {
        let mut t = ListenerTable::default();
        t.add(key("0.0.0.0:80", false));
        let other = NetNs { dev: 4, ino: 2 };
        assert!(t.matches(NS, a("127.0.0.1:80")));
        assert!(!t.matches(other, a("127.0.0.1:80")));
        assert!(!t.matches_exact(NS, a("127.0.0.1:80")));
        t.add(key("127.0.0.1:80", false));
        assert!(t.matches_exact(NS, a("127.0.0.1:80")));
        assert!(!t.matches_exact(other, a("127.0.0.1:80")));
    }
}
