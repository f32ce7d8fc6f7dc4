//! The workloads over a shared-memory ring between two processes.

use crate::proc::run_pair;
use crate::workload::{Latency, Throughput};
use ringsock_ring::sleep::spin::{recv_blocking, send_all_blocking};
use ringsock_ring::{EventFd, Receiver, RingConfig, Segment, Sender, ShmTransport, SpinBudget};
use std::io;
use std::time::{Duration, Instant};

struct Ends {
    seg: Segment,
    a_bell: EventFd,
    b_bell: EventFd,
}

fn ends(cfg: &RingConfig) -> io::Result<Ends> {
    Ok(Ends {
        seg: Segment::create(cfg, 2)?,
        a_bell: EventFd::new()?,
        b_bell: EventFd::new()?,
    })
}

/// Side A sends on ring 0 and receives on ring 1; side B the opposite.
/// Each end gets the other's doorbell to ring.
fn side(
    e: &Ends,
    cfg: RingConfig,
    a: bool,
) -> io::Result<(Sender<ShmTransport>, Receiver<ShmTransport>, EventFd)> {
    let (out, inn) = if a { (0, 1) } else { (1, 0) };
    let (mine, peer) = if a {
        (&e.a_bell, &e.b_bell)
    } else {
        (&e.b_bell, &e.a_bell)
    };
    let tx = Sender::new(
        e.seg.ring(out),
        ShmTransport::new(e.seg.ring(out), Some(Box::new(peer.try_clone()?))),
        cfg,
    )?;
    let rx = Receiver::new(
        e.seg.ring(inn),
        ShmTransport::new(e.seg.ring(inn), Some(Box::new(peer.try_clone()?))),
        cfg,
    )?;
    Ok((tx, rx, mine.try_clone()?))
}

fn close(tx: &mut Sender<ShmTransport>) -> io::Result<()> {
    loop {
        match tx.close() {
            Ok(()) => return Ok(()),
            Err(ringsock_ring::RingError::WouldBlock) => std::thread::yield_now(),
            Err(e) => return Err(e.into()),
        }
    }
}

/// One-way stream of `msg`-byte writes for `dur`; the receiver measures.
pub fn throughput(
    cfg: RingConfig,
    spin: Duration,
    msg: usize,
    dur: Duration,
) -> io::Result<Throughput> {
    let e = ends(&cfg)?;
    run_pair(
        || {
            let (mut tx, _rx, bell) = side(&e, cfg, false)?;
            let mut spin = SpinBudget::new(spin);
            let buf = vec![0x5au8; msg];
            let end = Instant::now() + dur;
            while Instant::now() < end {
                for _ in 0..16 {
                    send_all_one(&mut tx, &bell, &mut spin, &buf)?;
                }
            }
            tx.flush()?;
            close(&mut tx)
        },
        || {
            let (_tx, mut rx, bell) = side(&e, cfg, true)?;
            let mut spin = SpinBudget::new(spin);
            let mut buf = vec![0u8; 1 << 16];
            let mut bytes = recv_blocking(&mut rx, &bell, &mut spin, &mut buf)? as u64;
            let start = Instant::now();
            loop {
                match recv_blocking(&mut rx, &bell, &mut spin, &mut buf)? {
                    0 => break,
                    n => bytes += n as u64,
                }
            }
            Ok(Throughput {
                bytes,
                secs: start.elapsed().as_secs_f64(),
            })
        },
    )
}

/// Like a socket `send`: writes everything, waiting while full, but leaves
/// the last batch to the batching rules instead of flushing each message.
fn send_all_one(
    tx: &mut Sender<ShmTransport>,
    bell: &EventFd,
    spin: &mut SpinBudget,
    mut buf: &[u8],
) -> io::Result<()> {
    while !buf.is_empty() {
        match tx.write(buf) {
            Ok(n) => buf = &buf[n..],
            Err(ringsock_ring::RingError::WouldBlock) => {
                let (ready, iters) = spin.spin(|| tx.writable())?;
                tx.note_spins(iters);
                if !ready && tx.prepare_wait()? {
                    let woken = bell.wait(None)?;
                    tx.finish_wait(woken)?;
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// `iters` round trips of `msg` bytes; each send is flushed before the
/// sender waits for the answer, as the shim does before any blocking call.
pub fn ping_pong(cfg: RingConfig, spin: Duration, msg: usize, iters: usize) -> io::Result<Latency> {
    let e = ends(&cfg)?;
    run_pair(
        || {
            let (mut tx, mut rx, bell) = side(&e, cfg, false)?;
            let mut spin = SpinBudget::new(spin);
            let mut buf = vec![0u8; msg];
            loop {
                let mut got = 0;
                while got < msg {
                    match recv_blocking(&mut rx, &bell, &mut spin, &mut buf[got..])? {
                        0 => return close(&mut tx),
                        n => got += n,
                    }
                }
                send_all_blocking(&mut tx, &bell, &mut spin, &buf)?;
            }
        },
        || {
            let (mut tx, mut rx, bell) = side(&e, cfg, true)?;
            let mut spin = SpinBudget::new(spin);
            let mut buf = vec![7u8; msg];
            let mut rtts = Vec::with_capacity(iters);
            for _ in 0..iters {
                let t = Instant::now();
                send_all_blocking(&mut tx, &bell, &mut spin, &buf)?;
                let mut got = 0;
                while got < msg {
                    got += recv_blocking(&mut rx, &bell, &mut spin, &mut buf[got..])?;
                }
                rtts.push(t.elapsed());
            }
            close(&mut tx)?;
            Ok(Latency::from_samples(rtts))
        },
    )
}
