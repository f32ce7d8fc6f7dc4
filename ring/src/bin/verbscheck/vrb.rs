//! The verbs side: QP parameters over a TCP control connection, then the
//! workloads over a ring each way.

use crate::{
    env, fnv, median, median_us, Header, Opts, Rng, FNV_INIT, MODE_BW, MODE_PINGPONG, MODE_STREAM,
};
use ringsock_ring::transport::verbs::{settle, Connected, Device, QpParams, VerbsConn, PARAMS_LEN};
use ringsock_ring::{RingConfig, RingError};
use std::io::{Read, Write};
use std::net::{IpAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A doorbell wait longer than this during a transfer means a lost wakeup:
/// the wait gives up, the transfer goes on, and the run reports it.
const LOST_WAKEUP: Duration = Duration::from_secs(5);

fn e2s(e: RingError) -> String {
    e.to_string()
}

/// This end's verbs counters as `ringsock-ctl status` would see them: read
/// through a read-only mapping of `share_fd` (the memfd the shim hands the
/// daemon), checked against the in-process view. `key=value` pairs for a
/// RESULT line.
fn shared_counters(c: &Connected) -> Result<String, String> {
    use ringsock_ring::transport::verbs::stats::{offsets as o, VERBS_MAGIC};
    use std::os::fd::AsRawFd;
    use std::sync::atomic::{AtomicU64, Ordering};
    let fd = c.share_fd().map_err(e2s)?;
    // SAFETY: read-only shared mapping of one page of a sealed memfd that
    // is at least that long; unmapped below.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(format!(
            "mmap of share_fd: {}",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: 8-aligned offsets inside the mapped page; the owner updates
    // the words atomically.
    let at = |off: usize| unsafe {
        (*(p.cast::<u8>().add(off) as *const AtomicU64)).load(Ordering::Relaxed)
    };
    let mine = c.verbs_counters();
    let pairs = [
        ("wr_posted", at(o::WR_POSTED)),
        ("wr_signaled", at(o::WR_SIGNALED)),
        ("wr_inline", at(o::WR_INLINE)),
        ("slot_writes", at(o::SLOT_WRITES)),
        ("slot_bytes", at(o::SLOT_BYTES)),
        ("word_writes", at(o::WORD_WRITES)),
        ("kicks_sent", at(o::KICKS_SENT)),
        ("rings_received", at(o::RINGS_RECEIVED)),
        ("completions", at(o::COMPLETIONS)),
        ("cq_errors", at(o::CQ_ERRORS)),
        ("headerless_writes", at(o::HEADERLESS_WRITES)),
        ("headers_resent", at(o::HEADERS_RESENT)),
    ];
    let ok = at(o::MAGIC) == VERBS_MAGIC
        && pairs[0].1 == mine.wr_posted
        && pairs[4].1 == mine.slot_bytes;
    // SAFETY: the mapping made above.
    unsafe { libc::munmap(p, 4096) };
    let mut out = format!("stats_fd_ok={}", ok as u8);
    for (k, v) in pairs {
        out.push_str(&format!(" {k}={v}"));
    }
    Ok(out)
}

/// This end's pull-mode counters (`transport::verbs::pull`), `key=value`
/// pairs for a RESULT line: `pull_tx_*` are switches of our outgoing
/// ring, `pull_rx_*` mode words our receiver followed.
pub(crate) fn pull_kv(c: &Connected) -> String {
    let p = c.pull_stats();
    format!(
        "pull_tx_to_pull={} pull_tx_to_push={} pull_rx_to_pull={} pull_rx_to_push={} \
         pull_tail_reads={} pull_slot_reads={} pull_read_bytes={} pull_catchup_writes={}",
        p.tx_to_pull,
        p.tx_to_push,
        p.rx_to_pull,
        p.rx_to_push,
        p.tail_reads,
        p.slot_reads,
        p.read_bytes,
        p.catchup_writes
    )
}

pub fn info() -> Result<(), String> {
    let dev = Device::open(&env::options()?.device).map_err(e2s)?;
    let g = dev.gid();
    println!(
        "device={} port={} gid_index={} gid={}",
        dev.name(),
        dev.port(),
        dev.gid_index(),
        g.chunks(2)
            .map(|c| format!("{:02x}{:02x}", c[0], c[1]))
            .collect::<Vec<_>>()
            .join(":")
    );
    Ok(())
}

/// `conn-loop --iters N`: creates and drops N unconnected connection ends
/// (region, registration, CQs, QP) and counts descriptors and mappings
/// before and after: a failing setup (e.g. a registration over
/// RLIMIT_MEMLOCK) must release everything it had created, like a
/// successful one that is dropped.
pub fn conn_loop(o: &Opts) -> Result<(), String> {
    let fds = || std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count());
    let maps = || std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let dev = Device::open(&env::options()?.device).map_err(e2s)?;
    let cfg = RingConfig::default();
    let mut first_err = None;
    let (mut ok, mut failed) = (0u64, 0u64);
    let knobs = env::options()?.pull;
    let mut attempt = || match VerbsConn::new(&dev, cfg, cfg, knobs) {
        Ok(c) => {
            ok += 1;
            drop(c);
        }
        Err(e) => {
            failed += 1;
            first_err.get_or_insert(e.to_string());
        }
    };
    // One round first: the library opens what it keeps for the process
    // (e.g. its async event fd) on first use.
    attempt();
    let (f0, m0) = (fds(), maps().lines().count());
    for _ in 1..o.iters.max(1) {
        attempt();
    }
    let (f1, m) = (fds(), maps());
    let region_maps = m.lines().filter(|l| l.contains("ringsock-verbs")).count();
    println!(
        "RESULT test=conn-loop device={} iters={} ok={ok} failed={failed} fds_before={f0} \
         fds_after={f1} maps_before={m0} maps_after={} region_maps_after={region_maps} \
         leak={}",
        dev.name(),
        o.iters.max(1),
        m.lines().count(),
        u8::from(f1 != f0 || m.lines().count() != m0 || region_maps != 0)
    );
    if let Some(e) = first_err {
        println!("ERROR {e}");
    }
    Ok(())
}

/// `pick ADDR...`: which device `Device::open_for` chooses for each peer,
/// what the route lookup found, and whether a second call shares the
/// first one's device (the per-process cache).
pub fn pick(addrs: &[String]) -> Result<(), String> {
    for a in addrs {
        let peer: IpAddr = a.parse().map_err(|_| format!("not an IP address: {a}"))?;
        let route = match Device::route(peer) {
            Some(r) => format!(
                "source={} netdev={} route_device={} route_port={} route_gid_index={}",
                r.source, r.netdev, r.device, r.port, r.gid_index
            ),
            None => {
                let src = ringsock_ring::transport::verbs::route_source(peer);
                let nd = src.and_then(ringsock_ring::transport::verbs::netdev_of);
                format!(
                    "source={} netdev={} route_device=none",
                    src.map_or("none".into(), |s| s.to_string()),
                    nd.as_deref().unwrap_or("none")
                )
            }
        };
        let choice = &env::options()?.device;
        let d1 = Device::open_for(peer, choice).map_err(e2s)?;
        let d2 = Device::open_for(peer, choice).map_err(e2s)?;
        println!(
            "PICK peer={peer} {route} device={} port={} gid_index={} shared={}",
            d1.name(),
            d1.port(),
            d1.gid_index(),
            Arc::ptr_eq(&d1, &d2) as u8
        );
    }
    Ok(())
}

/// Counters of one connection end, printed with the results: they show the
/// bytes went through the rings.
#[derive(Default, Debug)]
pub(crate) struct Waits {
    pub(crate) sleeps: u64,
    pub(crate) wakeups: u64,
    pub(crate) lost: u64,
}

pub(crate) struct End {
    pub(crate) c: Connected,
    pub(crate) spin: Duration,
    pub(crate) waits: Waits,
}

/// The ring configuration of this end: the library's defaults, with
/// `--gamma` where given.
pub(crate) fn ring_config(o: &Opts) -> RingConfig {
    let d = RingConfig::default();
    RingConfig {
        gamma: o.gamma.unwrap_or(d.gamma),
        ..d
    }
}

pub(crate) fn setup(
    dev: &Arc<Device>,
    ctl: &mut TcpStream,
    client: bool,
    cfg: RingConfig,
) -> Result<Connected, String> {
    let conn = VerbsConn::new(dev, cfg, cfg, env::options()?.pull).map_err(e2s)?;
    let mine = conn.local_params().encode();
    let mut theirs = [0u8; PARAMS_LEN];
    if client {
        ctl.write_all(&mine).map_err(|e| e.to_string())?;
        ctl.read_exact(&mut theirs).map_err(|e| e.to_string())?;
    } else {
        ctl.read_exact(&mut theirs).map_err(|e| e.to_string())?;
        ctl.write_all(&mine).map_err(|e| e.to_string())?;
    }
    let peer = QpParams::decode(&theirs).map_err(e2s)?;
    let c = conn.connect(&peer).map_err(e2s)?;
    // Barrier: both queue pairs are in RTS before any WRITE.
    ctl.write_all(&[1]).map_err(|e| e.to_string())?;
    let mut b = [0u8; 1];
    ctl.read_exact(&mut b).map_err(|e| e.to_string())?;
    Ok(c)
}

impl End {
    /// Waits until the sender may write (`want_tx`) or the receiver may
    /// read (`want_rx`): spins for the budget, then announces it sleeps and
    /// blocks on the doorbell.
    fn block(&mut self, want_tx: bool, want_rx: bool) -> Result<(), RingError> {
        let start = Instant::now();
        let mut n = 0u32;
        loop {
            self.c.tx.poll()?;
            self.c.rx.poll()?;
            if (want_tx && self.c.tx.writable()?) || (want_rx && self.c.rx.readable()?) {
                return Ok(());
            }
            n += 1;
            if n.is_multiple_of(32) && start.elapsed() >= self.spin {
                break;
            }
            std::hint::spin_loop();
        }
        self.sleep(want_tx, want_rx)
    }

    fn sleep(&mut self, want_tx: bool, want_rx: bool) -> Result<(), RingError> {
        let c = &mut self.c;
        c.tx.flush()?;
        settle(&mut c.tx, &mut c.rx)?;
        let mut armed_tx = false;
        // An unconfirmed flag (`Err(WouldBlock)`) is no safe sleep: the
        // caller looks again, as after data arrived.
        if want_tx {
            if !armed(c.tx.prepare_wait())? {
                return Ok(());
            }
            armed_tx = true;
        }
        let mut armed_rx = false;
        if want_rx {
            if !armed(c.rx.prepare_wait())? {
                if armed_tx {
                    c.tx.finish_wait(false)?;
                }
                return Ok(());
            }
            armed_rx = true;
        }
        settle(&mut c.tx, &mut c.rx)?;
        self.waits.sleeps += 1;
        let slept = Instant::now();
        let woken = c.bell.wait(Some(LOST_WAKEUP))?;
        if woken {
            self.waits.wakeups += 1;
        } else if slept.elapsed() >= LOST_WAKEUP {
            self.waits.lost += 1;
        }
        // Else the wait returned early without a ring (a stale completion
        // event: the CQ was armed when a kick we had already reaped came
        // in; or EINTR): not a lost wakeup, the caller looks again.
        if armed_tx {
            c.tx.finish_wait(woken)?;
        }
        if armed_rx {
            c.rx.finish_wait(woken)?;
        }
        Ok(())
    }

    pub(crate) fn send_all(&mut self, buf: &[u8]) -> Result<(), RingError> {
        self.send_batched(buf)?;
        self.c.tx.flush()
    }

    /// Like `send_all` but leaves the last batch to the ring's batching.
    fn send_batched(&mut self, mut buf: &[u8]) -> Result<(), RingError> {
        while !buf.is_empty() {
            match self.c.tx.write(buf) {
                Ok(n) => buf = &buf[n..],
                Err(RingError::WouldBlock) => self.block(true, false)?,
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    pub(crate) fn recv_exact(&mut self, mut buf: &mut [u8]) -> Result<(), RingError> {
        while !buf.is_empty() {
            match self.c.rx.read(buf) {
                Ok(0) => return Err(RingError::PeerClosed),
                Ok(n) => buf = &mut buf[n..],
                Err(RingError::WouldBlock) => self.block(false, true)?,
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Both directions at once: send `total` generated bytes in random
    /// sizes, then the end mark; receive until the peer's end mark.
    /// Returns (fnv sent, fnv received, bytes received).
    fn stream(&mut self, total: u64, seed: u64) -> Result<(u64, u64, u64), RingError> {
        let mut data = Rng::new(seed);
        let mut sizes = Rng::new(seed ^ 0x9e37_79b9_7f4a_7c15);
        let mut pending: Vec<u8> = Vec::new();
        let mut off = 0usize;
        let (mut sent, mut tx_fnv, mut rx_fnv, mut got) = (0u64, FNV_INIT, FNV_INIT, 0u64);
        let (mut closed, mut eof) = (false, false);
        let mut buf = vec![0u8; 1 << 16];
        while !(closed && eof) {
            let mut progress = false;
            if !closed {
                if off == pending.len() && sent < total {
                    let n = sizes.size(1 << 16).min((total - sent) as usize);
                    pending.resize(n, 0);
                    data.fill(&mut pending);
                    tx_fnv = fnv(tx_fnv, &pending);
                    sent += n as u64;
                    off = 0;
                }
                if off < pending.len() {
                    match self.c.tx.write(&pending[off..]) {
                        Ok(n) => {
                            off += n;
                            progress = true;
                        }
                        Err(RingError::WouldBlock) => {}
                        Err(e) => return Err(e),
                    }
                } else {
                    match self.c.tx.close() {
                        Ok(()) => {
                            closed = true;
                            progress = true;
                        }
                        Err(RingError::WouldBlock) => {}
                        Err(e) => return Err(e),
                    }
                }
            }
            if !eof {
                match self.c.rx.read(&mut buf) {
                    Ok(0) => {
                        eof = true;
                        progress = true;
                    }
                    Ok(n) => {
                        rx_fnv = fnv(rx_fnv, &buf[..n]);
                        got += n as u64;
                        progress = true;
                    }
                    Err(RingError::WouldBlock) => {}
                    Err(e) => return Err(e),
                }
            }
            if !progress {
                self.c.tx.flush()?;
                self.block(!closed, !eof)?;
            }
        }
        settle(&mut self.c.tx, &mut self.c.rx)?;
        Ok((tx_fnv, rx_fnv, got))
    }
}

fn session(dev: &Arc<Device>, mut ctl: TcpStream, o: &Opts) -> Result<(), String> {
    let spin = o.spin;
    ctl.set_nodelay(true).map_err(|e| e.to_string())?;
    let mut hb = [0u8; Header::LEN];
    ctl.read_exact(&mut hb).map_err(|e| e.to_string())?;
    let h = Header::decode(&hb)?;
    let c = setup(dev, &mut ctl, false, ring_config(o))?;
    let mut end = End {
        c,
        spin,
        waits: Waits::default(),
    };
    match h.mode {
        MODE_STREAM => {
            let (tx_fnv, rx_fnv, got) = end.stream(h.count, h.seed ^ 0xffff).map_err(e2s)?;
            let mut out = [0u8; 32];
            out[0..8].copy_from_slice(&tx_fnv.to_le_bytes());
            out[8..16].copy_from_slice(&rx_fnv.to_le_bytes());
            out[16..24].copy_from_slice(&got.to_le_bytes());
            out[24..32].copy_from_slice(&end.waits.lost.to_le_bytes());
            ctl.write_all(&out).map_err(|e| e.to_string())?;
        }
        MODE_PINGPONG => {
            let mut buf = vec![0u8; h.size as usize];
            for _ in 0..h.count {
                end.recv_exact(&mut buf).map_err(e2s)?;
                end.send_all(&buf).map_err(e2s)?;
            }
        }
        _ => {
            let mut buf = vec![0u8; 1 << 16];
            let mut left = h.count;
            while left > 0 {
                let n = (left as usize).min(buf.len());
                end.recv_exact(&mut buf[..n]).map_err(e2s)?;
                left -= n as u64;
            }
            end.send_all(&[1]).map_err(e2s)?;
        }
    }
    settle(&mut end.c.tx, &mut end.c.rx).map_err(e2s)?;
    // Wait for the client to finish before tearing the QP down.
    let mut b = [0u8; 1];
    let _ = ctl.read(&mut b);
    Ok(())
}

/// The device for a connection whose control peer is `peer`: chosen by
/// the route to `--via` when given, else to the peer
/// (`Device::open_for`; `RINGSOCK_DEVICE` still wins).
pub(crate) fn device_for(o: &Opts, peer: IpAddr) -> Result<Arc<Device>, String> {
    Device::open_for(o.via.unwrap_or(peer), &env::options()?.device).map_err(e2s)
}

pub fn serve(o: &Opts) -> Result<(), String> {
    let l = TcpListener::bind(&o.addr).map_err(|e| format!("bind {}: {e}", o.addr))?;
    let local = l.local_addr().map_err(|e| e.to_string())?.ip();
    // Named at start for the log (and to fail early without a device);
    // each session then picks by its peer's route.
    let dev = device_for(o, local)?;
    println!("verbscheck: serving verbs on {} via {}", o.addr, dev.name());
    for s in l.incoming() {
        match s {
            Ok(s) => {
                let r = s
                    .peer_addr()
                    .map_err(|e| e.to_string())
                    .and_then(|p| device_for(o, p.ip()))
                    .and_then(|dev| session(&dev, s, o));
                if let Err(e) = r {
                    eprintln!("verbscheck serve: session failed: {e}");
                }
            }
            Err(e) => eprintln!("verbscheck serve: accept: {e}"),
        }
    }
    Ok(())
}

pub(crate) fn client(o: &Opts, h: Header) -> Result<(End, TcpStream, Arc<Device>), String> {
    let mut ctl = TcpStream::connect(&o.addr).map_err(|e| format!("connect {}: {e}", o.addr))?;
    ctl.set_nodelay(true).map_err(|e| e.to_string())?;
    let dev = device_for(o, ctl.peer_addr().map_err(|e| e.to_string())?.ip())?;
    ctl.write_all(&h.encode()).map_err(|e| e.to_string())?;
    let c = setup(&dev, &mut ctl, true, ring_config(o))?;
    Ok((
        End {
            c,
            spin: o.spin,
            waits: Waits::default(),
        },
        ctl,
        dev,
    ))
}

pub(crate) fn finish(ctl: &mut TcpStream) {
    let _ = ctl.write_all(&[0]);
}

pub fn stream(o: &Opts) -> Result<(), String> {
    let total = o.mib << 20;
    let h = Header {
        mode: MODE_STREAM,
        size: 0,
        count: total,
        seed: o.seed,
    };
    let (mut end, mut ctl, dev) = client(o, h)?;
    let t = Instant::now();
    let (tx_fnv, rx_fnv, got) = end.stream(total, o.seed).map_err(e2s)?;
    let secs = t.elapsed().as_secs_f64();
    let mut r = [0u8; 32];
    ctl.read_exact(&mut r).map_err(|e| e.to_string())?;
    let w = |i: usize| u64::from_le_bytes(r[i..i + 8].try_into().unwrap_or_default());
    let (peer_tx, peer_rx, peer_got, peer_lost) = (w(0), w(8), w(16), w(24));
    finish(&mut ctl);
    let ok = peer_tx == rx_fnv && peer_rx == tx_fnv && got == total && peer_got == total;
    let st = end.c.tx.stats();
    let rs = end.c.rx.stats();
    let vc = shared_counters(&end.c)?;
    let pk = pull_kv(&end.c);
    println!(
        "RESULT transport=verbs test=stream device={} huge={} bytes_each_way={} secs={:.3} \
         mbps_both={:.1} tx_fnv={:016x} peer_rx_fnv={:016x} rx_fnv={:016x} peer_tx_fnv={:016x} \
         ring_tx_bytes={} ring_tx_records={} ring_tail_writes={} ring_rx_bytes={} \
         sleeps={} wakeups={} lost_wakeups={} peer_lost_wakeups={} ok={} {vc} {pk}",
        dev.name(),
        end.c.tx.transport_mut().huge_pages() as u8,
        total,
        secs,
        2.0 * total as f64 / secs / 1e6,
        tx_fnv,
        peer_rx,
        rx_fnv,
        peer_tx,
        st.tx_bytes,
        st.tx_records,
        st.tx_tail_writes,
        rs.rx_bytes,
        end.waits.sleeps,
        end.waits.wakeups,
        end.waits.lost,
        peer_lost,
        ok as u8
    );
    if !ok {
        return Err("checksum mismatch".into());
    }
    Ok(())
}

pub fn pingpong(o: &Opts) -> Result<(), String> {
    for &size in &o.sizes {
        let warm = (o.iters / 10).max(1);
        let h = Header {
            mode: MODE_PINGPONG,
            size,
            count: o.iters + warm,
            seed: 0,
        };
        let (mut end, mut ctl, _) = client(o, h)?;
        let mut buf = vec![0x5au8; size as usize];
        let mut rtts = Vec::with_capacity(o.iters as usize);
        for i in 0..h.count {
            let t = Instant::now();
            end.send_all(&buf).map_err(e2s)?;
            end.recv_exact(&mut buf).map_err(e2s)?;
            if i >= warm {
                rtts.push(t.elapsed());
            }
        }
        settle(&mut end.c.tx, &mut end.c.rx).map_err(e2s)?;
        finish(&mut ctl);
        let (med, p99) = median_us(rtts);
        // The ring and verbs counters say how the messages went: tails
        // published against word WRITEs and rings sent (a tail carried in
        // a ring is no word WRITE).
        let vc = shared_counters(&end.c)?;
        println!(
            "RESULT transport=verbs test=pingpong size={size} iters={} rtt_med_us={med:.1} \
             rtt_p99_us={p99:.1} sleeps={} lost_wakeups={} messages={} ring_tail_writes={} {vc} {}",
            o.iters,
            end.waits.sleeps,
            end.waits.lost,
            h.count,
            end.c.tx.stats().tx_tail_writes,
            pull_kv(&end.c)
        );
    }
    for &size in &o.sizes {
        let total = o.bw_mib << 20;
        let mut rates = Vec::new();
        for _ in 0..o.reps {
            let h = Header {
                mode: MODE_BW,
                size,
                count: total,
                seed: 0,
            };
            let (mut end, mut ctl, _) = client(o, h)?;
            let buf = vec![0xa5u8; size as usize];
            let t = Instant::now();
            let mut left = total;
            while left > 0 {
                let n = (left as usize).min(buf.len());
                end.send_batched(&buf[..n]).map_err(e2s)?;
                left -= n as u64;
            }
            end.c.tx.flush().map_err(e2s)?;
            let mut ack = [0u8; 1];
            end.recv_exact(&mut ack).map_err(e2s)?;
            rates.push(total as f64 / t.elapsed().as_secs_f64() / 1e6);
            settle(&mut end.c.tx, &mut end.c.rx).map_err(e2s)?;
            finish(&mut ctl);
        }
        println!(
            "RESULT transport=verbs test=bw size={size} mib={} reps={} mbps_med={:.1}",
            o.bw_mib,
            o.reps,
            median(rates)
        );
    }
    Ok(())
}

/// A `prepare_wait` result as "safe to sleep": an unconfirmed flag is not.
fn armed(r: Result<bool, RingError>) -> Result<bool, RingError> {
    match r {
        Err(RingError::WouldBlock) => Ok(false),
        other => other,
    }
}
