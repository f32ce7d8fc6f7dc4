//! The kernel TCP baseline, on raw libc sockets (one socket per session,
//! the session header first), so it also runs under rsocket's preload.

use crate::{
    fnv, median, median_us, Header, Opts, Rng, FNV_INIT, MODE_BW, MODE_PINGPONG, MODE_STREAM,
};
use std::io;
use std::net::{Ipv4Addr, SocketAddr, ToSocketAddrs};
use std::time::Instant;

/// An owned TCP socket; closed on drop.
struct Sock(i32);

impl Drop for Sock {
    fn drop(&mut self) {
        // SAFETY: we own the descriptor.
        unsafe { libc::close(self.0) };
    }
}

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn sockaddr(a: &SocketAddr) -> io::Result<libc::sockaddr_in> {
    let SocketAddr::V4(v4) = a else {
        return Err(io::Error::other("IPv4 addresses only"));
    };
    // SAFETY: sockaddr_in is plain data.
    let mut sa: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    sa.sin_family = libc::AF_INET as libc::sa_family_t;
    sa.sin_port = v4.port().to_be();
    sa.sin_addr.s_addr = u32::from_ne_bytes(v4.ip().octets());
    Ok(sa)
}

fn resolve(addr: &str) -> io::Result<SocketAddr> {
    addr.to_socket_addrs()?
        .find(|a| a.is_ipv4())
        .ok_or_else(|| io::Error::other(format!("no IPv4 address for {addr}")))
}

impl Sock {
    fn new() -> io::Result<Sock> {
        // SAFETY: plain call.
        Ok(Sock(cvt(unsafe {
            libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0)
        })?))
    }

    fn nodelay(&self) -> io::Result<()> {
        let one: libc::c_int = 1;
        // SAFETY: valid fd and option buffer.
        cvt(unsafe {
            libc::setsockopt(
                self.0,
                libc::IPPROTO_TCP,
                libc::TCP_NODELAY,
                &one as *const _ as *const libc::c_void,
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        })?;
        Ok(())
    }

    fn bind(&self, sa: &libc::sockaddr_in) -> io::Result<()> {
        // SAFETY: valid fd and address.
        cvt(unsafe {
            libc::bind(
                self.0,
                sa as *const _ as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
            )
        })?;
        Ok(())
    }

    fn connect(addr: &str, bind: Option<Ipv4Addr>) -> io::Result<Sock> {
        let sa = sockaddr(&resolve(addr)?)?;
        let s = Sock::new()?;
        if let Some(ip) = bind {
            s.bind(&sockaddr(&SocketAddr::from((ip, 0)))?)?;
        }
        // SAFETY: valid fd and address.
        cvt(unsafe {
            libc::connect(
                s.0,
                &sa as *const _ as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
            )
        })?;
        s.nodelay()?;
        Ok(s)
    }

    fn listen(addr: &str) -> io::Result<Sock> {
        let sa = sockaddr(&resolve(addr)?)?;
        let s = Sock::new()?;
        let one: libc::c_int = 1;
        // SAFETY: valid fd and option buffer.
        cvt(unsafe {
            libc::setsockopt(
                s.0,
                libc::SOL_SOCKET,
                libc::SO_REUSEADDR,
                &one as *const _ as *const libc::c_void,
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        })?;
        s.bind(&sa)?;
        // SAFETY: valid fd.
        cvt(unsafe { libc::listen(s.0, 16) })?;
        Ok(s)
    }

    fn accept(&self) -> io::Result<Sock> {
        // SAFETY: valid fd; no address wanted.
        let fd = cvt(unsafe { libc::accept(self.0, std::ptr::null_mut(), std::ptr::null_mut()) })?;
        let s = Sock(fd);
        s.nodelay()?;
        Ok(s)
    }

    fn send(&self, buf: &[u8]) -> io::Result<usize> {
        // SAFETY: valid fd and buffer.
        let n = unsafe { libc::send(self.0, buf.as_ptr().cast(), buf.len(), libc::MSG_NOSIGNAL) };
        if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    }

    fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        // SAFETY: valid fd and buffer.
        let n = unsafe { libc::recv(self.0, buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    }

    fn send_all(&self, mut buf: &[u8]) -> io::Result<()> {
        while !buf.is_empty() {
            match self.send(buf) {
                Ok(n) => buf = &buf[n..],
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn recv_exact(&self, mut buf: &mut [u8]) -> io::Result<()> {
        while !buf.is_empty() {
            match self.recv(buf) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => buf = &mut buf[n..],
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Both directions at once over one blocking socket pair would
    /// deadlock once both send buffers fill, so the stream test polls.
    fn stream(&self, total: u64, seed: u64) -> io::Result<(u64, u64, u64)> {
        let mut data = Rng::new(seed);
        let mut sizes = Rng::new(seed ^ 0x9e37_79b9_7f4a_7c15);
        let mut pending: Vec<u8> = Vec::new();
        let mut off = 0usize;
        let (mut sent, mut tx_fnv, mut rx_fnv, mut got) = (0u64, FNV_INIT, FNV_INIT, 0u64);
        let (mut closed, mut eof) = (false, total == 0);
        let mut buf = vec![0u8; 1 << 16];
        while !(closed && eof) {
            if !closed && off == pending.len() {
                if sent < total {
                    let n = sizes.size(1 << 16).min((total - sent) as usize);
                    pending.resize(n, 0);
                    data.fill(&mut pending);
                    tx_fnv = fnv(tx_fnv, &pending);
                    sent += n as u64;
                    off = 0;
                } else {
                    closed = true;
                    continue;
                }
            }
            let mut pfd = libc::pollfd {
                fd: self.0,
                events: if eof { 0 } else { libc::POLLIN } | if closed { 0 } else { libc::POLLOUT },
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            cvt(unsafe { libc::poll(&mut pfd, 1, 10_000) })?;
            if pfd.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0 && !eof {
                // Both ends know the length: read exactly `total`, so the
                // results can follow on the same socket.
                let want = ((total - got) as usize).min(buf.len());
                match self.recv(&mut buf[..want])? {
                    0 => return Err(io::ErrorKind::UnexpectedEof.into()),
                    n => {
                        rx_fnv = fnv(rx_fnv, &buf[..n]);
                        got += n as u64;
                        eof = got == total;
                    }
                }
            }
            if pfd.revents & libc::POLLOUT != 0 && !closed {
                // SAFETY: valid fd and buffer; MSG_DONTWAIT keeps it
                // non-blocking without changing the socket's flags.
                let n = unsafe {
                    libc::send(
                        self.0,
                        pending[off..].as_ptr().cast(),
                        pending.len() - off,
                        libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                    )
                };
                if n > 0 {
                    off += n as usize;
                } else if n < 0 {
                    let e = io::Error::last_os_error();
                    if e.kind() != io::ErrorKind::WouldBlock {
                        return Err(e);
                    }
                }
            }
        }
        Ok((tx_fnv, rx_fnv, got))
    }
}

fn session(s: Sock) -> io::Result<()> {
    let mut hb = [0u8; Header::LEN];
    s.recv_exact(&mut hb)?;
    let h = Header::decode(&hb).map_err(io::Error::other)?;
    match h.mode {
        MODE_STREAM => {
            let (tx_fnv, rx_fnv, got) = s.stream(h.count, h.seed ^ 0xffff)?;
            let mut out = [0u8; 24];
            out[0..8].copy_from_slice(&tx_fnv.to_le_bytes());
            out[8..16].copy_from_slice(&rx_fnv.to_le_bytes());
            out[16..24].copy_from_slice(&got.to_le_bytes());
            s.send_all(&out)?;
        }
        MODE_PINGPONG => {
            let mut buf = vec![0u8; h.size as usize];
            for _ in 0..h.count {
                s.recv_exact(&mut buf)?;
                s.send_all(&buf)?;
            }
        }
        _ => {
            // Ready: the client starts its clock on this byte, so the
            // rate is the connection's, not its setup's (under the shim a
            // connect returns before the ring is set up; verbs mode sets
            // its queue pair up before the clock too).
            s.send_all(&[0])?;
            let mut buf = vec![0u8; 1 << 16];
            let mut left = h.count;
            while left > 0 {
                let n = (left as usize).min(buf.len());
                s.recv_exact(&mut buf[..n])?;
                left -= n as u64;
            }
            s.send_all(&[1])?;
        }
    }
    Ok(())
}

pub fn serve(o: &Opts) -> Result<(), String> {
    let l = Sock::listen(&o.addr).map_err(|e| format!("listen {}: {e}", o.addr))?;
    println!("verbscheck: serving tcp on {}", o.addr);
    loop {
        match l.accept() {
            Ok(s) => {
                if let Err(e) = session(s) {
                    eprintln!("verbscheck tcp-serve: session failed: {e}");
                }
            }
            Err(e) => eprintln!("verbscheck tcp-serve: accept: {e}"),
        }
    }
}

fn client(o: &Opts, h: Header) -> Result<Sock, String> {
    let s = Sock::connect(&o.addr, o.bind).map_err(|e| format!("connect {}: {e}", o.addr))?;
    s.send_all(&h.encode()).map_err(|e| e.to_string())?;
    Ok(s)
}

pub fn stream(o: &Opts) -> Result<(), String> {
    let total = o.mib << 20;
    let h = Header {
        mode: MODE_STREAM,
        size: 0,
        count: total,
        seed: o.seed,
    };
    let s = client(o, h)?;
    let t = Instant::now();
    let (tx_fnv, rx_fnv, got) = s.stream(total, o.seed).map_err(|e| e.to_string())?;
    let secs = t.elapsed().as_secs_f64();
    let mut r = [0u8; 24];
    s.recv_exact(&mut r).map_err(|e| e.to_string())?;
    let w = |i: usize| u64::from_le_bytes(r[i..i + 8].try_into().unwrap_or_default());
    let (peer_tx, peer_rx, peer_got) = (w(0), w(8), w(16));
    let ok = peer_tx == rx_fnv && peer_rx == tx_fnv && got == total && peer_got == total;
    println!(
        "RESULT transport=tcp test=stream bytes_each_way={total} secs={secs:.3} mbps_both={:.1} \
         tx_fnv={tx_fnv:016x} peer_rx_fnv={peer_rx:016x} rx_fnv={rx_fnv:016x} \
         peer_tx_fnv={peer_tx:016x} ok={}",
        2.0 * total as f64 / secs / 1e6,
        ok as u8
    );
    if !ok {
        return Err("checksum mismatch".into());
    }
    Ok(())
}

pub fn pingpong(o: &Opts) -> Result<(), String> {
    let e2s = |e: io::Error| e.to_string();
    for &size in &o.sizes {
        let warm = (o.iters / 10).max(1);
        let h = Header {
            mode: MODE_PINGPONG,
            size,
            count: o.iters + warm,
            seed: 0,
        };
        let s = client(o, h)?;
        let mut buf = vec![0x5au8; size as usize];
        let mut rtts = Vec::with_capacity(o.iters as usize);
        for i in 0..h.count {
            let t = Instant::now();
            s.send_all(&buf).map_err(e2s)?;
            s.recv_exact(&mut buf).map_err(e2s)?;
            if i >= warm {
                rtts.push(t.elapsed());
            }
        }
        let (med, p99) = median_us(rtts);
        println!(
            "RESULT transport=tcp test=pingpong size={size} iters={} rtt_med_us={med:.1} \
             rtt_p99_us={p99:.1}",
            o.iters
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
            let s = client(o, h)?;
            let buf = vec![0xa5u8; size as usize];
            let mut ready = [0u8; 1];
            s.recv_exact(&mut ready).map_err(e2s)?;
            let t = Instant::now();
            let mut left = total;
            while left > 0 {
                let n = (left as usize).min(buf.len());
                s.send_all(&buf[..n]).map_err(e2s)?;
                left -= n as u64;
            }
            let mut ack = [0u8; 1];
            s.recv_exact(&mut ack).map_err(e2s)?;
            rates.push(total as f64 / t.elapsed().as_secs_f64() / 1e6);
        }
        println!(
            "RESULT transport=tcp test=bw size={size} mib={} reps={} mbps_med={:.1}",
            o.bw_mib,
            o.reps,
            median(rates)
        );
    }
    Ok(())
}
