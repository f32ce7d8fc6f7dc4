//! What setting a ring up needs whatever the wire: the shim's ring
//! parameters, the bind before an offer, the daemon's offer, claim and
//! decline calls, and descriptors at high numbers.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};

use ringsock_proto::{Fds, Msg, RefuseReason};
use ringsock_ring::{EventFd, RingConfig};

use super::ctl;
use crate::attached::Errno;
use crate::{config, fdspace, sockaddr, sys};

/// What carries a ring: shared memory or RDMA. The receiver's head goes
/// back to the sender by a store on the one and by a WRITE on the other,
/// so the lazy push interval's default differs (`default_gamma`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Medium {
    Shm,
    Rdma,
}

/// The shim's ring parameters: geometry and batching from the knobs, the
/// batching intervals clamped to what the geometry allows (a 64-slot ring
/// cannot publish every 16 slots and push the head every 64).
pub fn ring_config(medium: Medium) -> RingConfig {
    let c = config::get();
    config_for(c.ring_slots, c.slot_size, medium)
}

/// Our batching knobs on a geometry (ours, or one chosen by the peer and
/// never trusted: the result is validated by the ring constructors).
pub fn config_for(slots: u32, slot_size: u32, medium: Medium) -> RingConfig {
    let c = config::get();
    let half = (slots / 2).max(1);
    let alpha = c.alpha.min(half);
    RingConfig {
        slots,
        slot_size,
        alpha,
        beta: c.beta.min(alpha),
        gamma: c.gamma.unwrap_or(default_gamma(slots, medium)).min(half),
        max_record_slots: ringsock_ring::config::record_slots(slot_size).min(half),
        ..RingConfig::default()
    }
}

/// RINGSOCK_GAMMA when unset. On shared memory a push is a store, so a
/// short interval costs little: 64 slots. On RDMA each push is a WRITE; a
/// quarter of the ring still leaves the sender three quarters of it before
/// it must wait, and a sender that waits for space is pushed to at once
/// whatever the interval.
fn default_gamma(slots: u32, medium: Medium) -> u32 {
    match medium {
        Medium::Shm => 64,
        Medium::Rdma => (slots / 4).max(1),
    }
}

pub fn dup_cloexec(fd: RawFd) -> Result<RawFd, Errno> {
    fdspace::dup_high(fd).map_err(Errno)
}

/// A copy of a ring's memory descriptor for the daemon's status, at a
/// high fd number (the program's next socket gets the number the kernel
/// would give it); None when there is none to spare.
pub fn report_fd(fd: Result<OwnedFd, ringsock_ring::RingError>) -> Option<OwnedFd> {
    fdspace::high_or_emfile(fd.ok()?).ok()
}

/// A doorbell of ours, at a high fd number.
pub fn new_bell() -> Result<EventFd, ringsock_ring::RingError> {
    let b = EventFd::new()?;
    let fd = fdspace::high_or_emfile(b.into_owned()).map_err(ringsock_ring::RingError::Os)?;
    Ok(EventFd::from_owned(fd))
}

/// Set once the first "no resources for a ring" line is out: a program at
/// its fd or memory limit would otherwise log on every connect.
static NO_RESOURCES_LOGGED: AtomicBool = AtomicBool::new(false);

/// One warning per process when a ring cannot be built (fd limit, no
/// memfd, no memory); later connections say it at info level.
pub fn log_no_resources(fd: RawFd, why: &str) {
    if NO_RESOURCES_LOGGED.swap(true, Ordering::Relaxed) {
        log::info!("fd {fd}: no ring ({why}); plain TCP");
    } else {
        log::warn!(
            "fd {fd}: no ring ({why}); this and later connections that cannot get one use plain TCP"
        );
    }
}

/// The any-address of the family a connect from `local` to `dest` uses.
fn wildcard(dest: &SocketAddr, local: &SocketAddr) -> SocketAddr {
    if local.is_ipv6() || dest.is_ipv6() {
        SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), 0)
    } else {
        SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0)
    }
}

/// Makes sure `fd` has a local port (an unbound socket gets one the way
/// connect would have picked it: any address, ephemeral port).
pub fn ensure_bound(fd: RawFd, dest: &SocketAddr) -> Option<SocketAddr> {
    let local = sockaddr::query(fd, false)?;
    if local.port() != 0 {
        return Some(local);
    }
    // getsockname reports an unbound socket's family: `[::]:0` for AF_INET6.
    let any = wildcard(dest, &local);
    let (ss, sl) = sockaddr::from_std(&any);
    // SAFETY: ss/sl describe a valid sockaddr of our own.
    let r = unsafe {
        crate::sys::sys_call!(libc::SYS_bind, fd, &ss as *const libc::sockaddr_storage, sl)
    };
    if r < 0 {
        log::debug!("fd {fd}: bind before offer failed (errno {})", sys::errno());
        return None;
    }
    sockaddr::query(fd, false)
}

/// Sends the client's offer; its id, or None (logged unless nobody
/// listens there) when the daemon refused it or did not answer.
pub fn offer(fd: RawFd, dest: SocketAddr, offer: &Msg, fds: &[RawFd]) -> Option<u64> {
    match ctl::call(offer, fds) {
        Ok((Msg::OfferOk { offer_id }, _)) => Some(offer_id),
        Ok((Msg::OfferRefused { reason }, _)) => {
            if reason != RefuseReason::NoListener {
                log::info!("fd {fd}: offer to {dest} refused ({})", reason.as_str());
            }
            None
        }
        Ok((other, _)) => {
            log::warn!("fd {fd}: unexpected reply to an offer: {other:?}");
            None
        }
        Err(_) => None,
    }
}

/// After an accepted offer, whether the kernel connect is on its way. If
/// it failed outright no server can have claimed the offer: it is
/// withdrawn and the socket duplicate closed.
pub fn connect_started(res: &Result<(), Errno>, offer_id: u64, tcp_dup: RawFd) -> bool {
    let started = matches!(
        res,
        Ok(()) | Err(Errno(libc::EINPROGRESS)) | Err(Errno(libc::EINTR))
    );
    if !started {
        crate::fdspace::close(tcp_dup);
        let _ = ctl::call(&Msg::Cancel { offer_id }, &[]);
    }
    started
}

/// Claims the offer for the accepted socket `fd`: its id, payload and
/// descriptors, or None when there is none (or no daemon answers).
pub fn claim(fd: RawFd) -> Option<(u64, Vec<u8>, Fds)> {
    match ctl::call(&Msg::Claim, &[fd]) {
        Ok((
            Msg::ClaimOk {
                offer_id, payload, ..
            },
            fds,
        )) => Some((offer_id, payload, fds)),
        Ok((Msg::NoOffer, _)) | Err(_) => None,
        Ok((other, _)) => {
            log::warn!("fd {fd}: unexpected reply to a claim: {other:?}");
            None
        }
    }
}

pub fn decline(offer_id: u64, reason: &str) {
    let _ = ctl::call(
        &Msg::Decline {
            offer_id,
            reason: reason.to_owned(),
        },
        &[],
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn knobs_fit_the_geometry_and_the_wire() {
        // The tests run without RINGSOCK_* knobs: the defaults.
        let shm = config_for(4096, 256, Medium::Shm);
        let rdma = config_for(4096, 256, Medium::Rdma);
        assert_eq!((shm.alpha, shm.beta, shm.gamma), (16, 8, 64));
        assert_eq!((rdma.alpha, rdma.beta, rdma.gamma), (16, 8, 1024));
        // A record holds a 64 KiB write whatever the slot size.
        assert_eq!(rdma.max_record_slots, 257);
        assert_eq!(config_for(4096, 4096, Medium::Rdma).max_record_slots, 17);
        // A small ring clamps everything to half of it.
        let small = config_for(64, 256, Medium::Shm);
        assert_eq!(
            (small.alpha, small.gamma, small.max_record_slots),
            (16, 32, 32)
        );
        assert_eq!(config_for(64, 256, Medium::Rdma).gamma, 16);
        for c in [shm, rdma, small] {
            c.validate().unwrap();
        }
    }
}
