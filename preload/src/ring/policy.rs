//! Which connections are worth a ring: a connection that lives for a
//! request or two pays for setting its ring up (segment, doorbells, the
//! daemon's round trips) more than the ring saves it, while kernel TCP
//! costs it nothing extra. So a process learns, per destination, whether
//! its connections there are short: after `STREAK` short ones in a row it
//! connects there over plain TCP, trying a ring again after a number of
//! connections that grows `GROWTH`-fold each time (up to `MAX_SKIP`), and
//! at once when one of its TCP connections there turns out long. A tried
//! ring costs its connection the ring's setup (several times a kernel
//! connect), so tries stay far below one connection in a hundred: the
//! tail of a run of short connections is theirs otherwise. Only one connection at
//! a time tries a ring between skips: with several connections open at
//! once, the ones made before the tried one closes would otherwise all
//! offer rings before the record knows whether it was short.
//!
//! Short: closed within RINGSOCK_SHORT_MS of the connect (0 turns the
//! record off: every connection is offered a ring), unless it had a ring
//! that carried more than `MANY_RECORDS` records, or, for one that
//! skipped the ring, closed later having carried at most `FEW_SEGMENTS`
//! data segments: a request or two that waited on a slow server or a
//! busy CPU, which a ring would not have sped up. Lifetime alone would
//! count every connection long on a loaded machine, and have it pay a
//! ring's setup just when CPU is scarce. The record is per
//! process (a program that makes one connection per process keeps getting
//! rings), bounded to `MAX_DESTS` destinations.

use std::net::SocketAddr;
use std::os::fd::RawFd;

use crate::attached::TcpReason;
use crate::keymap::KeyMap;
use crate::plock::PLock;
use crate::{config, sys};

/// A connection closed within this of its connect is short; 0: none is.
fn short_ns() -> u64 {
    u64::from(config::get().short_ms) * 1_000_000
}

/// Short connections in a row before a destination's connections skip
/// the ring.
const STREAK: u32 = 2;
/// The first skip, and how much longer each next one is than the last.
const FIRST_SKIP: u32 = 16;
const GROWTH: u32 = 8;
/// Most connections skipped between two that try a ring.
const MAX_SKIP: u32 = 4096;
/// Destinations remembered.
const MAX_DESTS: usize = 1024;
/// Data segments (both ways) a connection carries at most and still
/// counts as short whatever its lifetime.
const FEW_SEGMENTS: u64 = 16;
/// Records (writes, both ways) past which a ring connection counts as
/// long whatever its lifetime: a few dozen round trips repay a ring's
/// set-up many times over.
const MANY_RECORDS: u64 = 64;

#[derive(Default)]
struct Dest {
    /// Short connections in a row.
    short: u32,
    /// The last of them was a ring the server turned down (`turned_down`).
    refused: bool,
    /// Connections still to skip, and the length of the last skip.
    skip: u32,
    last_skip: u32,
    /// When the connection trying a ring after a skip started (0: none
    /// open). Its close decides the next skip; one open longer than a
    /// short connection lives is not short, so it no longer holds others.
    probe_ns: u64,
}

/// The connections that skipped the ring are not kept here: each keeps
/// its destination and start with its socket (`TcpMemo::skipped`), so
/// its connect and close cost no look-up here.
struct Record {
    dests: KeyMap<SocketAddr, Dest>,
}

fn fresh() -> Record {
    Record {
        dests: KeyMap::default(),
    }
}

static RECORD: PLock<Option<Record>> = PLock::new(None, || None);

/// The unspecified address reaches this host's loopback (connect(2)), and
/// a ring connection records the loopback address as its peer.
fn canonical(dest: SocketAddr) -> SocketAddr {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
    match dest.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => {
            SocketAddr::new(Ipv4Addr::LOCALHOST.into(), dest.port())
        }
        IpAddr::V6(ip) if ip.is_unspecified() => {
            SocketAddr::new(Ipv6Addr::LOCALHOST.into(), dest.port())
        }
        _ => dest,
    }
}

/// Why a connection to `dest` should not be offered a ring now (counts a
/// skipped one down); None: offer it one.
pub fn skip_reason(dest: SocketAddr) -> Option<TcpReason> {
    if short_ns() == 0 {
        return None;
    }
    let dest = canonical(dest);
    let mut g = RECORD.lock();
    let r = g.get_or_insert_with(fresh);
    let d = r.dests.get_mut(&dest)?;
    let why = if d.refused {
        TcpReason::Declined
    } else {
        TcpReason::ShortLived
    };
    if d.skip > 0 {
        d.skip -= 1;
        return Some(why);
    }
    if d.short >= STREAK {
        let now = sys::monotonic_ns();
        if d.probe_ns != 0 && now.saturating_sub(d.probe_ns) < short_ns() {
            return Some(why);
        }
        d.probe_ns = now;
    }
    None
}

#[cfg(test)]
fn ring_worth_trying(dest: SocketAddr) -> bool {
    skip_reason(dest).is_none()
}

/// The last descriptor, `fd`, of a connection to `dest` that skipped the
/// ring, connected at `born` (monotonic ns), is being closed.
pub fn skipped_closed(fd: RawFd, dest: SocketAddr, born: u64) {
    let lifetime = sys::monotonic_ns().saturating_sub(born);
    // A short one only confirms the skip under way.
    if lifetime < short_ns() || super::sockio::data_segments(fd).is_some_and(|n| n <= FEW_SEGMENTS)
    {
        return;
    }
    note(
        RECORD.lock().get_or_insert_with(fresh),
        canonical(dest),
        lifetime,
    );
}

/// A connection to `dest` that had a ring closed after `lifetime_ns`,
/// having carried `records` records both ways. One that carried more than
/// `MANY_RECORDS` was worth its ring however soon it closed (a keep-alive
/// pool that a short benchmark ends): it counts as long.
pub fn ring_closed(dest: SocketAddr, lifetime_ns: u64, records: u64) {
    let dest = canonical(dest);
    let lifetime_ns = if records > MANY_RECORDS {
        u64::MAX
    } else {
        lifetime_ns
    };
    let mut g = RECORD.lock();
    let r = g.get_or_insert_with(fresh);
    note(r, dest, lifetime_ns);
}

/// A connection to `dest` offered a ring that the server turned down (no
/// shim there, or one that declines or did not claim in time): it counts
/// as a short connection, so a destination that never takes rings is
/// offered one only now and then, as short connections are.
pub fn turned_down(dest: SocketAddr) {
    let dest = canonical(dest);
    let mut g = RECORD.lock();
    let r = g.get_or_insert_with(fresh);
    note(r, dest, 0);
    if let Some(d) = r.dests.get_mut(&dest) {
        d.refused = true;
    }
}

fn note(r: &mut Record, dest: SocketAddr, lifetime_ns: u64) {
    if r.dests.len() >= MAX_DESTS && !r.dests.contains_key(&dest) {
        // Forget one at random (the map's order): a bounded record.
        if let Some(k) = r.dests.keys().next().copied() {
            r.dests.remove(&k);
        }
    }
    let d = r.dests.entry(dest).or_default();
    let short = short_ns();
    if short == 0 || lifetime_ns >= short {
        *d = Dest::default();
        return;
    }
    d.short += 1;
    d.refused = false;
    d.probe_ns = 0;
    if d.short >= STREAK && d.skip == 0 {
        d.last_skip = (d.last_skip * GROWTH).clamp(FIRST_SKIP, MAX_SKIP);
        d.skip = d.last_skip;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dest(port: u16) -> SocketAddr {
        SocketAddr::new("127.0.0.1".parse().unwrap(), port)
    }

    #[test]
    fn a_destination_that_turns_rings_down_is_skipped() {
        let d = dest(40_010);
        assert!(ring_worth_trying(d));
        turned_down(d);
        assert!(ring_worth_trying(d), "one refusal is not a pattern");
        turned_down(d);
        for _ in 0..FIRST_SKIP {
            assert!(!ring_worth_trying(d), "two refusals start a skip");
            skipped_closed(80, d, sys::monotonic_ns());
        }
        assert!(ring_worth_trying(d), "then one tries again");
        turned_down(d);
        assert_eq!(skip_reason(d), Some(TcpReason::Declined), "status says why");
        let n = (0..1000).take_while(|_| !ring_worth_trying(d)).count();
        assert_eq!(
            n + 1,
            (FIRST_SKIP * GROWTH) as usize,
            "a refused retry grows the skip"
        );
    }

    #[test]
    fn a_ring_that_carried_many_records_is_long_however_soon_it_closed() {
        let d = dest(40_030);
        ring_closed(d, 1_000, MANY_RECORDS + 1);
        ring_closed(d, 1_000, MANY_RECORDS + 1);
        assert!(
            ring_worth_trying(d),
            "a busy pool that a short run closed is not short"
        );
        ring_closed(d, 1_000, MANY_RECORDS);
        ring_closed(d, 1_000, 2);
        assert!(!ring_worth_trying(d), "two quiet short ones start a skip");
    }

    #[test]
    fn short_connections_skip_longer_and_longer_and_a_long_one_resets() {
        let d = dest(40_001);
        assert!(ring_worth_trying(d));
        ring_closed(d, 1_000, 2);
        assert!(
            ring_worth_trying(d),
            "one short connection is not a pattern"
        );
        ring_closed(d, 1_000, 2);
        // The skipped connections are short too: that does not extend
        // the skip.
        for _ in 0..FIRST_SKIP {
            assert!(!ring_worth_trying(d), "the first skip");
            skipped_closed(78, d, sys::monotonic_ns());
        }
        assert!(ring_worth_trying(d), "a ring is tried after the skip");
        ring_closed(d, 1_000, 2);
        let n = (0..1000).take_while(|_| !ring_worth_trying(d)).count();
        assert_eq!(n, (FIRST_SKIP * GROWTH) as usize, "grown");
        // A skipped connection that lives long brings the ring back.
        skipped_closed(77, d, sys::monotonic_ns() - short_ns() - 1);
        assert!(ring_worth_trying(d));
        assert!(ring_worth_trying(d));
    }

    /// A loopback TCP pair (client, server) that exchanged `turns` one-byte
    /// requests and replies.
    fn pair_after(turns: usize) -> (std::net::TcpStream, std::net::TcpStream) {
        use std::io::{Read, Write};
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut s, _) = l.accept().unwrap();
        let mut b = [0u8; 1];
        for _ in 0..turns {
            c.write_all(b"q").unwrap();
            s.read_exact(&mut b).unwrap();
            s.write_all(b"a").unwrap();
            c.read_exact(&mut b).unwrap();
        }
        (c, s)
    }

    /// Marks `fd` as a skipped connection to `d` born long enough ago to
    /// be long by its lifetime, then closes it.
    fn old_skipped_closes(fd: RawFd, d: SocketAddr) {
        skipped_closed(fd, d, sys::monotonic_ns() - short_ns() - 1);
    }

    #[test]
    fn a_long_lived_connection_with_a_request_or_two_counts_short() {
        use std::os::fd::AsRawFd;
        let d = dest(40_006);
        ring_closed(d, 1, 2);
        ring_closed(d, 1, 2);
        assert!(!ring_worth_trying(d), "the first skip");
        // Slow to close, but one request: the skip goes on.
        let (c, _s) = pair_after(1);
        old_skipped_closes(c.as_raw_fd(), d);
        assert!(!ring_worth_trying(d), "a slow request ended the skip");
        // Slow to close and busy: a ring is worth it again.
        let (c, _s) = pair_after(40);
        assert!(super::super::sockio::data_segments(c.as_raw_fd()).unwrap() > FEW_SEGMENTS);
        old_skipped_closes(c.as_raw_fd(), d);
        assert!(
            ring_worth_trying(d),
            "a busy connection did not end the skip"
        );
    }

    #[test]
    fn one_connection_at_a_time_tries_a_ring_between_skips() {
        let d = dest(40_004);
        ring_closed(d, 1, 2);
        ring_closed(d, 1, 2);
        for _ in 0..FIRST_SKIP {
            assert!(!ring_worth_trying(d), "the first skip");
        }
        assert!(ring_worth_trying(d), "a ring is tried after the skip");
        for _ in 0..5 {
            assert!(
                !ring_worth_trying(d),
                "connections opened while the tried one is open skip the ring"
            );
        }
        ring_closed(d, 1, 2);
        let n = (0..1000).take_while(|_| !ring_worth_trying(d)).count();
        assert_eq!(
            n,
            (FIRST_SKIP * GROWTH) as usize,
            "its close grows the skip"
        );
        // A tried connection open longer than a short one lives (or one
        // whose close the record never sees) holds the others no longer.
        {
            let mut g = RECORD.lock();
            let r = g.as_mut().unwrap();
            let p = &mut r.dests.get_mut(&d).unwrap().probe_ns;
            *p = p.saturating_sub(short_ns() + 1);
        }
        assert!(ring_worth_trying(d));
        assert!(!ring_worth_trying(d));
    }

    #[test]
    fn rings_are_tried_on_far_fewer_than_one_short_connection_in_a_hundred() {
        let d = dest(40_005);
        let mut tries = Vec::new();
        for i in 0..20_000 {
            if ring_worth_trying(d) {
                tries.push(i);
                ring_closed(d, 1, 2);
            } else {
                skipped_closed(90, d, sys::monotonic_ns());
            }
        }
        let early = tries.iter().filter(|&&i| i < 3_000).count();
        assert!(early <= 5, "tries in the first 3000: {tries:?}");
        assert!(
            tries
                .windows(2)
                .all(|w| w[1] - w[0] <= MAX_SKIP as usize + 1),
            "a ring is still tried after every skip: {tries:?}"
        );
    }

    #[test]
    fn destinations_are_apart() {
        let (a, b) = (dest(40_002), dest(40_003));
        ring_closed(a, 1, 2);
        ring_closed(a, 1, 2);
        assert!(!ring_worth_trying(a));
        assert!(ring_worth_trying(b));
    }
}
