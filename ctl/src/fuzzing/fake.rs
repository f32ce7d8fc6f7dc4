//! Fake descriptors: each pretends to be a socket or a memfd, answers the
//! handler's proofs from what it pretends, and counts itself alive until
//! dropped, so a test can compare the live count with what the registry
//! claims to hold.

use std::cell::Cell;
use std::net::SocketAddr;
use std::rc::Rc;

use ringsock_proto::{RingStat, MAX_STAT_NAME};

use crate::handler::{ClientProof, Env, ListenerProof};
use crate::netns::NetNs;

/// What a fake descriptor pretends to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FakeSock {
    Listener {
        addr: SocketAddr,
        dual_stack: bool,
    },
    /// Bound (and maybe connected) client socket.
    Client {
        local: SocketAddr,
        peer: Option<SocketAddr>,
    },
    /// Accepted (connected) socket.
    Accepted {
        local: SocketAddr,
        peer: SocketAddr,
    },
    Memfd {
        size: u64,
    },
    /// Anything else (a pipe, a file...).
    Other,
}

/// A fake descriptor; counts itself alive until dropped.
#[derive(Debug)]
pub struct FakeFd {
    pub sock: FakeSock,
    /// The namespace it says it belongs to.
    pub netns: NetNs,
    live: Rc<Cell<usize>>,
}

impl Drop for FakeFd {
    fn drop(&mut self) {
        self.live.set(self.live.get() - 1);
    }
}

/// Hands out fake descriptors and answers proofs from what they pretend.
#[derive(Debug, Default, Clone)]
pub struct FakeEnv {
    live: Rc<Cell<usize>>,
    /// Namespaces' addresses (`set_addrs`); none known otherwise.
    addrs: Rc<std::cell::RefCell<std::collections::HashMap<NetNs, Vec<std::net::IpAddr>>>>,
    /// The daemon namespace's tracked connections (`track`).
    tracked: Rc<std::cell::RefCell<Vec<crate::conntrack::Entry>>>,
}

impl FakeEnv {
    /// A descriptor of `NetNs::FAKE`, the daemon's own namespace here.
    pub fn fd(&self, sock: FakeSock) -> FakeFd {
        self.fd_in(NetNs::FAKE, sock)
    }

    /// A descriptor of namespace `netns`.
    pub fn fd_in(&self, netns: NetNs, sock: FakeSock) -> FakeFd {
        self.live.set(self.live.get() + 1);
        FakeFd {
            sock,
            netns,
            live: self.live.clone(),
        }
    }

    /// Makes `addrs` the addresses of namespace `netns`.
    pub fn set_addrs(&self, netns: NetNs, addrs: &[&str]) {
        let addrs = addrs.iter().map(|a| a.parse().expect("an IP")).collect();
        self.addrs.borrow_mut().insert(netns, addrs);
    }

    /// Tracks a connection sent from `src` to `dst` and answered from
    /// `reply_src` to `reply_dst` (translated when they differ).
    pub fn track(&self, src: &str, dst: &str, reply_src: &str, reply_dst: &str) {
        use crate::conntrack::{Entry, Tuple};
        let a = |s: &str| s.parse().expect("an address");
        self.tracked.borrow_mut().push(Entry {
            orig: Tuple {
                src: a(src),
                dst: a(dst),
            },
            reply: Tuple {
                src: a(reply_src),
                dst: a(reply_dst),
            },
        });
    }

    /// Fake descriptors alive right now.
    pub fn live(&self) -> usize {
        self.live.get()
    }
}

impl Env for FakeEnv {
    type Fd = FakeFd;
    type Ring = FakeFd;

    fn listener(&mut self, fd: &FakeFd) -> Result<ListenerProof, String> {
        match fd.sock {
            FakeSock::Listener { addr, dual_stack } => Ok(ListenerProof { addr, dual_stack }),
            _ => Err("not a listening TCP socket".into()),
        }
    }

    fn client(&mut self, fd: &FakeFd) -> Result<ClientProof, String> {
        match fd.sock {
            FakeSock::Client { local, peer } => Ok(ClientProof { local, peer }),
            FakeSock::Accepted { local, peer } => Ok(ClientProof {
                local,
                peer: Some(peer),
            }),
            _ => Err("not a TCP client socket".into()),
        }
    }

    fn accepted(&mut self, fd: &FakeFd) -> Result<(SocketAddr, SocketAddr), String> {
        match fd.sock {
            FakeSock::Accepted { local, peer } => Ok((local, peer)),
            FakeSock::Client {
                local,
                peer: Some(peer),
            } => Ok((local, peer)),
            _ => Err("not a connected TCP socket".into()),
        }
    }

    /// Sockets say their namespace; anything else is in none.
    fn netns(&mut self, fd: &FakeFd) -> Option<NetNs> {
        match fd.sock {
            FakeSock::Memfd { .. } | FakeSock::Other => None,
            _ => Some(fd.netns),
        }
    }

    fn own_netns(&mut self) -> Option<NetNs> {
        Some(NetNs::FAKE)
    }

    fn netns_addrs(&mut self, _pid: u32, netns: NetNs) -> Option<Vec<std::net::IpAddr>> {
        self.addrs.borrow().get(&netns).cloned()
    }

    fn conntrack_by_reply(
        &mut self,
        reply: &crate::conntrack::Tuple,
    ) -> Option<crate::conntrack::Entry> {
        self.tracked
            .borrow()
            .iter()
            .find(|e| e.reply == *reply)
            .copied()
    }

    fn conntrack_translated(&mut self) -> Vec<crate::conntrack::Entry> {
        let t = self.tracked.borrow();
        t.iter().filter(|e| e.translated()).copied().collect()
    }

    fn open_ring(&mut self, fd: FakeFd) -> FakeFd {
        fd
    }

    /// `p` repeated pid % 40 times: some longer than an entry carries.
    fn process_name(&self, pid: u32) -> Option<String> {
        Some("p".repeat(pid as usize % 40))
    }

    /// 192.0.2.0/24 (TEST-NET-1) stands for other hosts.
    fn is_local_ip(&mut self, ip: std::net::IpAddr) -> bool {
        !matches!(ip, std::net::IpAddr::V4(v4) if v4.octets()[..3] == [192, 0, 2])
    }

    /// `memfd_size`, then as many more counters as the memfd has pages,
    /// modulo 48, with over-long names: a provider may return more and
    /// longer than an entry carries, and the handler must cut both (a full
    /// page of such entries must still encode).
    fn ring_stats(&self, ring: &FakeFd) -> Vec<RingStat> {
        let size = match ring.sock {
            FakeSock::Memfd { size } => size,
            _ => 0,
        };
        let extra = (size >> 12) % 48;
        std::iter::once(RingStat {
            name: "memfd_size".into(),
            value: size,
        })
        .chain((0..extra).map(|i| RingStat {
            name: format!("{i:02}_{}", "n".repeat(MAX_STAT_NAME)),
            value: u64::MAX - i,
        }))
        .collect()
    }
}
