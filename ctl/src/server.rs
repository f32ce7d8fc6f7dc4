//! The event loop: one thread, epoll over the listening socket, a signalfd
//! and every session; non-blocking throughout.
//!
//! Each readable session yields at most a few datagrams per wakeup
//! (fairness), each is handled and its reply queued. While a session has
//! unsent replies it is not read from (backpressure: a process that never
//! reads its replies stops being served instead of growing our memory).
//! Any protocol fault or I/O error closes that one session; nothing a
//! session sends can stop the loop.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::time::Instant;

use log::{debug, error, info, warn};
use ringsock_proto::{frame, io as pio, Error, MAX_FDS, MAX_FRAME_TOTAL};

use crate::handler::{Handler, Reply};
use crate::proof::SysEnv;
use crate::registry::{Cred, SessionId};
use crate::sys::{self, Epoll, SignalFd};

const TOKEN_LISTENER: u64 = 0;
const TOKEN_SIGNAL: u64 = 1;
const FIRST_SESSION: SessionId = 16;

/// Datagrams read from one session per wakeup before serving others.
const FRAMES_PER_WAKEUP: usize = 16;
/// Unsent reply bytes a session may have queued before it is closed.
pub const MAX_BUFFERED: usize = 64 * 1024;

const EV_READ: u32 = (libc::EPOLLIN | libc::EPOLLRDHUP) as u32;
const EV_WRITE: u32 = libc::EPOLLOUT as u32;

/// A reply on its way out, holding the descriptors it relays.
struct Outgoing {
    frame: Vec<u8>,
    fds: Vec<OwnedFd>,
}

struct Conn {
    sock: OwnedFd,
    pid: u32,
    out: VecDeque<Outgoing>,
    out_bytes: usize,
    /// Registered for EPOLLOUT (and not EPOLLIN) because `out` is non-empty.
    writing: bool,
}

pub struct Server {
    epoll: Epoll,
    listener: OwnedFd,
    signals: SignalFd,
    handler: Handler<SysEnv>,
    conns: HashMap<SessionId, Conn>,
    next_id: SessionId,
    max_sessions: usize,
    rbuf: Vec<u8>,
    /// A descriptor kept in reserve: when accept fails with EMFILE it is
    /// released to accept-and-close the pending connection, instead of
    /// spinning on a listener that stays readable.
    spare: Option<File>,
}

fn spare_fd() -> Option<File> {
    File::open("/dev/null").ok()
}

impl Server {
    pub fn new(
        listener: OwnedFd,
        handler: Handler<SysEnv>,
        max_sessions: usize,
    ) -> io::Result<Server> {
        let epoll = Epoll::new()?;
        let signals = SignalFd::new(&[libc::SIGTERM, libc::SIGINT])?;
        epoll.add(listener.as_raw_fd(), libc::EPOLLIN as u32, TOKEN_LISTENER)?;
        epoll.add(signals.as_raw_fd(), libc::EPOLLIN as u32, TOKEN_SIGNAL)?;
        Ok(Server {
            epoll,
            listener,
            signals,
            handler,
            conns: HashMap::new(),
            next_id: FIRST_SESSION,
            max_sessions,
            rbuf: vec![0; MAX_FRAME_TOTAL],
            spare: spare_fd(),
        })
    }

    /// Serves until SIGTERM or SIGINT; errors only if epoll itself fails.
    pub fn run(&mut self) -> io::Result<()> {
        let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 64];
        loop {
            let timeout = self
                .handler
                .next_deadline()
                .map(|d| d.saturating_duration_since(Instant::now()));
            let n = self.epoll.wait(&mut events, timeout)?;
            for ev in &events[..n] {
                // Copies out of the (packed) epoll_event.
                let (token, flags) = (ev.u64, ev.events);
                match token {
                    TOKEN_LISTENER => self.accept_all(),
                    TOKEN_SIGNAL => {
                        if let Some(sig) = self.signals.read() {
                            let name = match sig as i32 {
                                libc::SIGTERM => "SIGTERM",
                                libc::SIGINT => "SIGINT",
                                _ => "a signal",
                            };
                            info!("received {name}, shutting down");
                            return Ok(());
                        }
                    }
                    id => self.on_session(id, flags),
                }
            }
            let fired = self.handler.tick(Instant::now());
            if fired > 0 {
                debug!("{fired} offer deadline(s) passed");
            }
        }
    }

    fn accept_all(&mut self) {
        loop {
            match sys::accept(self.listener.as_raw_fd()) {
                Ok(sock) => self.open_session(sock),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.raw_os_error() == Some(libc::ECONNABORTED) => continue,
                Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
                    warn!("out of file descriptors, refusing a connection");
                    if self.spare.take().is_none() {
                        return;
                    }
                    drop(sys::accept(self.listener.as_raw_fd()));
                    self.spare = spare_fd();
                }
                Err(e) => {
                    error!("accept: {e}");
                    return;
                }
            }
        }
    }

    fn open_session(&mut self, sock: OwnedFd) {
        let cred = match pio::peer_cred(sock.as_raw_fd()) {
            Ok(c) => Cred {
                pid: c.pid,
                uid: c.uid,
                gid: c.gid,
            },
            Err(e) => {
                warn!("SO_PEERCRED failed ({e}), refusing the connection");
                return;
            }
        };
        if self.conns.len() >= self.max_sessions {
            warn!(
                "pid {}: {} sessions open, refusing another",
                cred.pid, self.max_sessions
            );
            return;
        }
        let id = self.next_id;
        self.next_id += 1;
        if let Err(e) = self.epoll.add(sock.as_raw_fd(), EV_READ, id) {
            error!("epoll add: {e}");
            return;
        }
        debug!("session {id}: pid {} uid {} connected", cred.pid, cred.uid);
        self.handler.open_session(id, cred);
        self.conns.insert(
            id,
            Conn {
                sock,
                pid: cred.pid,
                out: VecDeque::new(),
                out_bytes: 0,
                writing: false,
            },
        );
    }

    fn close_session(&mut self, id: SessionId) {
        if let Some(c) = self.conns.remove(&id) {
            // Closing the descriptor removes it from epoll as well; the
            // explicit delete only makes that independent of dup'd copies.
            let _ = self.epoll.delete(c.sock.as_raw_fd());
            self.handler.close_session(id, Instant::now());
            debug!("session {id}: closed");
        }
    }

    /// Closes a session for something it did, with the one log line.
    fn evict(&mut self, id: SessionId, why: impl std::fmt::Display) {
        let pid = self.conns.get(&id).map_or(0, |c| c.pid);
        warn!("session {id} (pid {pid}): {why}; closing it");
        self.close_session(id);
    }

    fn on_session(&mut self, id: SessionId, flags: u32) {
        let Some(conn) = self.conns.get(&id) else {
            return;
        };
        if conn.writing {
            if flags & (libc::EPOLLHUP | libc::EPOLLERR) as u32 != 0 {
                // Replies pending and nobody left to read them.
                self.close_session(id);
            } else if flags & EV_WRITE != 0 {
                self.flush(id);
            }
            return;
        }
        // Readable, hung up or in error: reading tells which.
        self.read_frames(id);
    }

    fn read_frames(&mut self, id: SessionId) {
        for _ in 0..FRAMES_PER_WAKEUP {
            let Some(conn) = self.conns.get(&id) else {
                return;
            };
            let sock = conn.sock.as_raw_fd();
            let (n, fds) = match pio::recv_frame(sock, &mut self.rbuf, libc::MSG_DONTWAIT) {
                Ok(Some(x)) => x,
                Ok(None) => return self.close_session(id),
                Err(Error::Io(e)) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(Error::Io(e)) => {
                    debug!("session {id}: receive failed: {e}");
                    return self.close_session(id);
                }
                Err(e) => return self.evict(id, e),
            };
            let now = Instant::now();
            match self
                .handler
                .handle_frame(id, &self.rbuf[..n], fds.into_owned(), now)
            {
                Ok(reply) => {
                    if !self.queue(id, reply) {
                        return;
                    }
                }
                Err(fault) => return self.evict(id, fault),
            }
            if self.conns.get(&id).is_none_or(|c| c.writing) {
                return;
            }
        }
    }

    /// Queues a reply and tries to send it; false if the session is gone.
    fn queue(&mut self, id: SessionId, reply: Reply<OwnedFd>) -> bool {
        let bytes = match frame::encode(&reply.msg) {
            Ok(b) => b,
            Err(e) => {
                error!("session {id}: cannot encode {}: {e}", reply.msg.name());
                self.close_session(id);
                return false;
            }
        };
        let Some(conn) = self.conns.get_mut(&id) else {
            return false;
        };
        conn.out_bytes += bytes.len();
        conn.out.push_back(Outgoing {
            frame: bytes,
            fds: reply.fds,
        });
        if conn.out_bytes > MAX_BUFFERED {
            self.evict(id, "too many unread replies");
            return false;
        }
        self.flush(id)
    }

    /// Sends queued replies until done or the socket is full, switching
    /// epoll interest between reading and writing; false if closed.
    fn flush(&mut self, id: SessionId) -> bool {
        let Some(conn) = self.conns.get_mut(&id) else {
            return false;
        };
        while let Some(front) = conn.out.front() {
            let mut raw = [0 as RawFd; MAX_FDS];
            let nfds = front.fds.len().min(MAX_FDS);
            for (slot, fd) in raw.iter_mut().zip(&front.fds) {
                *slot = fd.as_raw_fd();
            }
            match pio::send_frame(
                conn.sock.as_raw_fd(),
                &front.frame,
                &raw[..nfds],
                libc::MSG_DONTWAIT,
            ) {
                Ok(()) => {
                    conn.out_bytes -= front.frame.len();
                    // Dropping the entry closes our copies of relayed fds:
                    // the receiver has its own now.
                    conn.out.pop_front();
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    debug!("session {id}: send failed: {e}");
                    self.close_session(id);
                    return false;
                }
            }
        }
        let want_write = !conn.out.is_empty();
        if want_write != conn.writing {
            conn.writing = want_write;
            let interest = if want_write { EV_WRITE } else { EV_READ };
            if let Err(e) = self.epoll.modify(conn.sock.as_raw_fd(), interest, id) {
                error!("epoll modify: {e}");
                self.close_session(id);
                return false;
            }
        }
        true
    }
}
