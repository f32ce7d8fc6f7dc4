//! `rpc-serve` / `rpc`: many clients, one server (the shape RFP's remote
//! fetching is for). The server accepts any number of verbs connections
//! and serves all of them from one thread that polls every ring (it never
//! sleeps); each client connection (one thread each, all in one process)
//! sends a 64 B request (its sequence number) and reads a SIZE-byte reply
//! whose every byte is derived from that number, checked by the client.
//! How replies travel is the server's `RINGSOCK_VERBS_MODE` (push, pull,
//! adaptive); clients should push their requests (mode push).

use crate::vrb::{client as connect, device_for, finish, pull_kv, ring_config, setup, End, Waits};
use crate::{median_us, Header, Opts, MODE_PINGPONG};
use ringsock_ring::transport::verbs::settle;
use ringsock_ring::RingError;
use std::io::{ErrorKind, Read};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

const REQ: usize = 64;

fn e2s(e: RingError) -> String {
    e.to_string()
}

/// Reply byte `i` to request `seq`.
fn reply_byte(seq: u64, i: usize) -> u8 {
    (seq as u8).wrapping_add((i as u8).wrapping_mul(31))
}

struct Conn {
    end: End,
    ctl: TcpStream,
    req: [u8; REQ],
    got: usize,
    reply: Vec<u8>,
    sent: usize,
    served: u64,
    /// Saw the client's end mark and sent ours: waiting for its goodbye
    /// on the control connection before the queue pair goes away.
    closing: bool,
}

impl Conn {
    /// One polling step; returns Ok(true) when this connection is over.
    fn step(&mut self) -> Result<bool, RingError> {
        let c = &mut self.end.c;
        c.tx.poll()?;
        c.rx.poll()?;
        if self.closing {
            let mut b = [0u8; 1];
            return Ok(match self.ctl.read(&mut b) {
                Ok(_) => true,
                Err(e) => e.kind() != ErrorKind::WouldBlock,
            });
        }
        if self.sent < self.reply.len() {
            match c.tx.write(&self.reply[self.sent..]) {
                Ok(n) => {
                    self.sent += n;
                    if self.sent == self.reply.len() {
                        c.tx.flush()?;
                        self.served += 1;
                    }
                }
                Err(RingError::WouldBlock) => c.tx.flush()?,
                Err(e) => return Err(e),
            }
            return Ok(false);
        }
        match c.rx.read(&mut self.req[self.got..]) {
            Ok(0) => {
                // The client is done: our end mark, then its goodbye.
                while let Err(RingError::WouldBlock) = c.tx.close() {
                    c.tx.poll()?;
                }
                settle(&mut c.tx, &mut c.rx)?;
                self.closing = true;
            }
            Ok(n) => {
                self.got += n;
                if self.got == REQ {
                    self.got = 0;
                    let seq = u64::from_le_bytes(self.req[..8].try_into().unwrap_or_default());
                    for (i, b) in self.reply.iter_mut().enumerate() {
                        *b = reply_byte(seq, i);
                    }
                    self.sent = 0;
                }
            }
            Err(RingError::WouldBlock) => {}
            Err(e) => return Err(e),
        }
        Ok(false)
    }

    fn report(&self) {
        let v = self.end.c.verbs_counters();
        println!(
            "RESULT transport=verbs test=rpc-serve size={} replies={} wr_posted={} slot_writes={} \
             word_writes={} kicks_sent={} headerless_writes={} headers_resent={} \
             wr_per_reply={:.2} {}",
            self.reply.len(),
            self.served,
            v.wr_posted,
            v.slot_writes,
            v.word_writes,
            v.kicks_sent,
            v.headerless_writes,
            v.headers_resent,
            v.wr_posted as f64 / self.served.max(1) as f64,
            pull_kv(&self.end.c)
        );
    }
}

pub fn serve(o: &Opts) -> Result<(), String> {
    let l = TcpListener::bind(&o.addr).map_err(|e| format!("bind {}: {e}", o.addr))?;
    l.set_nonblocking(true).map_err(|e| e.to_string())?;
    println!("verbscheck: rpc serving on {}", o.addr);
    let mut conns: Vec<Conn> = Vec::new();
    loop {
        match l.accept() {
            Ok((mut s, peer)) => {
                let r = (|| -> Result<Conn, String> {
                    s.set_nonblocking(false).map_err(|e| e.to_string())?;
                    s.set_nodelay(true).map_err(|e| e.to_string())?;
                    let mut hb = [0u8; Header::LEN];
                    s.read_exact(&mut hb).map_err(|e| e.to_string())?;
                    let h = Header::decode(&hb)?;
                    let dev = device_for(o, peer.ip())?;
                    let c = setup(&dev, &mut s, false, ring_config(o))?;
                    s.set_nonblocking(true).map_err(|e| e.to_string())?;
                    Ok(Conn {
                        end: End {
                            c,
                            spin: o.spin,
                            waits: Waits::default(),
                        },
                        ctl: s,
                        req: [0; REQ],
                        got: 0,
                        reply: vec![0; h.size as usize],
                        sent: h.size as usize,
                        served: 0,
                        closing: false,
                    })
                })();
                match r {
                    Ok(c) => conns.push(c),
                    Err(e) => eprintln!("verbscheck rpc-serve: session setup failed: {e}"),
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(e) => eprintln!("verbscheck rpc-serve: accept: {e}"),
        }
        let mut i = 0;
        while i < conns.len() {
            match conns[i].step() {
                Ok(false) => i += 1,
                Ok(true) => {
                    conns[i].report();
                    conns.swap_remove(i);
                }
                Err(e) => {
                    eprintln!("verbscheck rpc-serve: connection failed: {e}");
                    conns.swap_remove(i);
                }
            }
        }
        if conns.is_empty() {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

struct Outcome {
    rtts: Vec<Duration>,
    bad: u64,
    waits: Waits,
    pull: String,
}

fn one(o: &Opts, size: u32, id: u64, start: &Barrier) -> Result<Outcome, String> {
    let h = Header {
        mode: MODE_PINGPONG,
        size,
        count: 0,
        seed: id,
    };
    let conn = connect(o, h);
    // Everyone meets here even after a failed setup (no one waits forever).
    start.wait();
    let (mut end, mut ctl, _) = conn?;
    let mut req = [0u8; REQ];
    let mut rep = vec![0u8; size as usize];
    let mut rtts = Vec::new();
    let mut bad = 0;
    let deadline = Instant::now() + Duration::from_secs(o.secs);
    let mut seq = id << 32;
    while Instant::now() < deadline {
        req[..8].copy_from_slice(&seq.to_le_bytes());
        let t = Instant::now();
        end.send_all(&req).map_err(e2s)?;
        end.recv_exact(&mut rep).map_err(e2s)?;
        rtts.push(t.elapsed());
        if rep
            .iter()
            .enumerate()
            .any(|(i, &b)| b != reply_byte(seq, i))
        {
            bad += 1;
        }
        seq += 1;
    }
    // End mark, the server's end mark back, then goodbye.
    let c = &mut end.c;
    while let Err(RingError::WouldBlock) = c.tx.close() {
        c.tx.poll().map_err(e2s)?;
    }
    let mut b = [0u8; 1];
    loop {
        match c.rx.read(&mut b) {
            Ok(0) => break,
            Ok(_) => bad += 1,
            Err(RingError::WouldBlock) => {
                c.tx.poll().map_err(e2s)?;
                c.rx.poll().map_err(e2s)?;
            }
            Err(e) => return Err(e2s(e)),
        }
    }
    settle(&mut c.tx, &mut c.rx).map_err(e2s)?;
    let pull = pull_kv(c);
    finish(&mut ctl);
    Ok(Outcome {
        rtts,
        bad,
        waits: end.waits,
        pull,
    })
}

pub fn client(o: &Opts) -> Result<(), String> {
    let o = Arc::new(Opts {
        addr: o.addr.clone(),
        sizes: o.sizes.clone(),
        ..*o
    });
    let mut failed = false;
    for &size in &o.sizes {
        let start = Arc::new(Barrier::new(o.clients));
        let threads: Vec<_> = (0..o.clients as u64)
            .map(|id| {
                let (o, start) = (o.clone(), start.clone());
                std::thread::spawn(move || one(&o, size, id, &start))
            })
            .collect();
        let mut rtts = Vec::new();
        let (mut bad, mut sleeps, mut lost, mut errors) = (0, 0, 0, 0);
        let mut pull = String::new();
        for t in threads {
            match t.join() {
                Ok(Ok(out)) => {
                    rtts.extend(out.rtts);
                    bad += out.bad;
                    sleeps += out.waits.sleeps;
                    lost += out.waits.lost;
                    pull = out.pull;
                }
                Ok(Err(e)) => {
                    eprintln!("verbscheck rpc: client failed: {e}");
                    errors += 1;
                }
                Err(_) => errors += 1,
            }
        }
        let n = rtts.len();
        let (med, p99) = median_us(rtts);
        let ops = n as f64 / o.secs as f64;
        println!(
            "RESULT transport=verbs test=rpc clients={} size={size} secs={} round_trips={n} \
             ops_per_s={ops:.1} rtt_med_us={med:.1} rtt_p99_us={p99:.1} bad_replies={bad} \
             client_errors={errors} sleeps={sleeps} lost_wakeups={lost} ok={} last_client: {pull}",
            o.clients,
            o.secs,
            (bad == 0 && errors == 0 && lost == 0 && n > 0) as u8
        );
        failed |= bad != 0 || errors != 0 || lost != 0 || n == 0;
    }
    if failed {
        return Err("bad replies, failed clients or lost wakeups".into());
    }
    Ok(())
}
