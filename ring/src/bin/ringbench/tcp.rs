//! The kernel baseline: the same workloads over a TCP loopback connection.

use crate::proc::run_pair;
use crate::workload::{Latency, Throughput};
use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// A connected pair. Each closure of `run_pair` takes its end and drops
/// the other (fork gave each process a copy of both), so EOF works.
type End = std::cell::RefCell<Option<TcpStream>>;

fn pair() -> io::Result<(End, End)> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let c = TcpStream::connect(l.local_addr()?)?;
    let (s, _) = l.accept()?;
    Ok((End::new(Some(c)), End::new(Some(s))))
}

fn take(e: &End) -> TcpStream {
    e.borrow_mut().take().expect("end taken once per process")
}

/// One-way stream of `msg`-byte writes for `dur`; the receiver measures.
pub fn throughput(msg: usize, dur: Duration) -> io::Result<Throughput> {
    let (c, s) = pair()?;
    run_pair(
        || {
            drop(take(&s));
            let mut c = take(&c);
            let buf = vec![0x5au8; msg];
            let end = Instant::now() + dur;
            while Instant::now() < end {
                for _ in 0..16 {
                    c.write_all(&buf)?;
                }
            }
            Ok(())
        },
        || {
            drop(take(&c));
            let mut s = take(&s);
            let mut buf = vec![0u8; 1 << 16];
            let mut bytes = 0u64;
            let n = s.read(&mut buf)?;
            let start = Instant::now();
            bytes += n as u64;
            loop {
                match s.read(&mut buf)? {
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

/// `iters` round trips of `msg` bytes, TCP_NODELAY, as sockperf does.
pub fn ping_pong(msg: usize, iters: usize) -> io::Result<Latency> {
    let (c, s) = pair()?;
    run_pair(
        || {
            drop(take(&c));
            let mut s = take(&s);
            s.set_nodelay(true)?;
            let mut buf = vec![0u8; msg];
            loop {
                match s.read_exact(&mut buf) {
                    Ok(()) => s.write_all(&buf)?,
                    Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
                    Err(e) => return Err(e),
                }
            }
        },
        || {
            drop(take(&s));
            let mut c = take(&c);
            c.set_nodelay(true)?;
            let mut buf = vec![7u8; msg];
            let mut rtts = Vec::with_capacity(iters);
            for _ in 0..iters {
                let t = Instant::now();
                c.write_all(&buf)?;
                c.read_exact(&mut buf)?;
                rtts.push(t.elapsed());
            }
            Ok(Latency::from_samples(rtts))
        },
    )
}
