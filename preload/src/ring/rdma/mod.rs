//! Rings between hosts over RDMA verbs (cargo feature `verbs`): the
//! process's device, the handshake through the two hosts' ctl daemons
//! (`handshake`), and the connection's wire (`wire`).
//!
//! The offer's payload is `PREFIX` followed by the client's `QpParams`
//! (GID, QPN, PSN, rkey, both ring copies' addresses and geometry); the
//! answer's is `PREFIX` followed by the server's. Descriptors cannot cross
//! hosts, so nothing else travels: the daemons check who may offer and
//! claim (ctl/README.md, "Between hosts").

mod handshake;
mod wire;
mod zerocopy;

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};

use ringsock_proto::Msg;
use ringsock_ring::transport::verbs::{Device, DeviceChoice};

use super::ctl;
use super::sockio::lock;
use crate::{config, process, sys};

pub use handshake::{accept, accept_claimed, connect};

/// Marks a verbs offer or answer (and its version).
pub const PREFIX: &[u8] = b"ringsock-verbs/1 ";

/// How long a host whose server side had no RDMA is not offered rings
/// again (its connections go straight to TCP meanwhile).
const NO_RDMA_RETRY_NS: u64 = 30_000_000_000;

/// The reason a server without a usable device declines with; a client
/// that reads it remembers the host.
pub const NO_DEVICE_REASON: &str = "no RDMA device on the server's host";

/// Hosts whose server declined for want of RDMA, with when to try again.
static NO_RDMA: Mutex<Option<HashMap<IpAddr, u64>>> = Mutex::new(None);

/// The pid that found no RDMA device at all (its connections to other
/// hosts stay TCP without asking again); a forked child looks for itself.
static NO_DEVICE_PID: AtomicI32 = AtomicI32::new(0);
/// The pid that logged its first device.
static LOGGED_PID: AtomicI32 = AtomicI32::new(0);

/// The device for connections to `peer`: the one whose netdev the route
/// to `peer` leaves through, `RINGSOCK_DEVICE` if set, else the first
/// active one (the ring crate caches opened devices per process).
pub fn device_for(peer: IpAddr) -> Result<Arc<Device>, String> {
    let me = process::pid();
    if NO_DEVICE_PID.load(Ordering::Relaxed) == me {
        return Err("no RDMA device".into());
    }
    match open_device(peer) {
        Ok(dev) => {
            if LOGGED_PID.swap(me, Ordering::Relaxed) != me {
                log::info!(
                    "RDMA device {}: connections to other hosts can use rings",
                    describe(&dev)
                );
            }
            Ok(dev)
        }
        Err(e) => {
            NO_DEVICE_PID.store(me, Ordering::Relaxed);
            log::info!("no RDMA device ({e}): connections to other hosts stay TCP");
            Err(e)
        }
    }
}

/// Opens the device `RINGSOCK_DEVICE` and `RINGSOCK_GID_INDEX` choose
/// for `peer` (`Device::open_for`).
fn open_device(peer: IpAddr) -> Result<Arc<Device>, String> {
    // The transport's descriptors (device context, completion channels,
    // region memfds) live where the shim keeps its own (`fdspace`).
    ringsock_ring::transport::verbs::set_fd_placement(crate::fdspace::high);
    let cfg = config::get();
    let choice = DeviceChoice {
        name: cfg.rdma_device.clone(),
        gid_index: cfg.rdma_gid_index.clone()?,
    };
    Device::open_for(peer, &choice).map_err(|e| e.to_string())
}

/// "rxe0 port 1 gid 1", for status.
pub fn describe(dev: &Device) -> String {
    format!("{} port {} gid {}", dev.name(), dev.port(), dev.gid_index())
}

/// Whether `host` recently declined rings for want of RDMA.
pub fn host_without_rdma(host: IpAddr) -> bool {
    let now = sys::monotonic_ns();
    let mut m = lock(&NO_RDMA);
    let map = m.get_or_insert_with(HashMap::new);
    match map.get(&host) {
        Some(until) if *until > now => true,
        Some(_) => {
            map.remove(&host);
            false
        }
        None => false,
    }
}

/// Remembers that `host` has no RDMA for a while.
pub fn note_host_without_rdma(host: IpAddr) {
    let until = sys::monotonic_ns() + NO_RDMA_RETRY_NS;
    lock(&NO_RDMA)
        .get_or_insert_with(HashMap::new)
        .insert(host, until);
}

/// What the daemon says of an offer.
pub enum Collected {
    Answer(Vec<u8>),
    /// Declined (with the server's reason), expired, or the daemon is gone.
    Refused(Option<String>),
    Pending,
}

/// Asks the daemon once about our offer.
pub fn collect(offer_id: u64) -> Collected {
    match ctl::call(&Msg::Collect { offer_id }, &[]) {
        Ok((Msg::Answered { payload }, _)) => Collected::Answer(payload),
        Ok((Msg::Pending, _)) => Collected::Pending,
        Ok((Msg::Declined { reason }, _)) => Collected::Refused(Some(reason)),
        Ok(_) | Err(_) => Collected::Refused(None),
    }
}
