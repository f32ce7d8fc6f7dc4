//! Running the roles on two hosts (the Soft-RoCE guest's namespaces A and
//! B, scripts/softroce-vm.d/conform.sh) instead of both on loopback: each
//! role's command is prefixed (`ip netns exec A ...`), the server listens
//! on the server host's address, each host has its own daemon (started by
//! the guest script), and the ring check merges both daemons' status and
//! wants the transport those hosts use (`rdma`).
//!
//! Configured from the environment, all of it required:
//! CONFORM_SERVER_IP, CONFORM_SERVER_WRAP and CONFORM_CLIENT_WRAP (command
//! prefixes, split at spaces), CONFORM_SERVER_CTL and CONFORM_CLIENT_CTL
//! (the daemons' sockets), CONFORM_SHIM (libringsock.so), CONFORM_TRANSPORT;
//! optional: CONFORM_CTL_BIN (default `ringsock-ctl` on PATH),
//! CONFORM_DEADLINE_S (default 60: an emulated guest is slow).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use ringsock_integration::status::status_of;
use ringsock_integration::{links, show, Conn};

/// Two hosts, as the environment describes them.
pub struct Hosts {
    pub server_ip: String,
    /// Command prefixes: [server, client].
    pub wrap: [Vec<String>; 2],
    /// Daemon sockets: [server's host, client's host].
    pub ctl: [PathBuf; 2],
    pub shim: PathBuf,
    pub transport: String,
    pub ctl_bin: PathBuf,
    pub deadline: Duration,
}

impl Hosts {
    /// The two-host setup, if CONFORM_SERVER_WRAP asks for one; panics
    /// naming a missing variable.
    pub fn from_env() -> Option<Hosts> {
        std::env::var_os("CONFORM_SERVER_WRAP")?;
        let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} is not set"));
        let words = |k: &str| var(k).split_whitespace().map(str::to_string).collect();
        Some(Hosts {
            server_ip: var("CONFORM_SERVER_IP"),
            wrap: [words("CONFORM_SERVER_WRAP"), words("CONFORM_CLIENT_WRAP")],
            ctl: [
                var("CONFORM_SERVER_CTL").into(),
                var("CONFORM_CLIENT_CTL").into(),
            ],
            shim: var("CONFORM_SHIM").into(),
            transport: var("CONFORM_TRANSPORT"),
            ctl_bin: std::env::var("CONFORM_CTL_BIN")
                .unwrap_or_else(|_| "ringsock-ctl".into())
                .into(),
            deadline: Duration::from_secs(
                std::env::var("CONFORM_DEADLINE_S")
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(60),
            ),
        })
    }

    /// Both daemons' connections, merged (an unreadable status counts as
    /// none).
    fn status(&self) -> Vec<Conn> {
        self.ctl
            .iter()
            .flat_map(|sock| status_of(&self.ctl_bin, sock).unwrap_or_default())
            .collect()
    }

    /// Waits (up to `within`) until the daemons list `n` connections to
    /// `port` with both ends reported, every end of that port on this
    /// setup's transport; the problem if that never happens.
    pub fn ring_check(&self, port: u16, barrier: &str, n: u32, within: Duration) -> Option<String> {
        let end = Instant::now() + within;
        loop {
            let all = self.status();
            let both = links(&all, port).len() >= n as usize;
            let on_it = all
                .iter()
                .filter(|c| c.peer.port() == port || c.local.port() == port)
                .all(|c| c.transport == self.transport);
            if both && on_it {
                return None;
            }
            if Instant::now() >= end {
                return Some(format!(
                    "not on {} at barrier `{barrier}` (wanted {n} link(s) to the server port):\n{}",
                    self.transport,
                    show(&all)
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}
