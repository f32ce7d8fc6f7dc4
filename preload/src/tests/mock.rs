//! A test double for the ring layer: an `AttachedConn` pair over two
//! in-memory byte queues with eventfd doorbells, implementing the arm /
//! wait_fds / disarm protocol the way a ring transport must: the tests in
//! mod.rs check against it that the hooks dispatch ring fds correctly.
//!
//! Arms nest, as the contract says: every `arm`/`arm_edge` is paired with
//! one `disarm`/`disarm_edge`, and a sender rings the peer's doorbell while
//! any arm for that direction is outstanding. Level waiters (`arm`: a ppoll
//! on the doorbells) need the doorbell drained when the last of them
//! leaves, or their next sleep would return at once; edge waiters
//! (`arm_edge`: epoll sets holding arms across calls, watching the
//! doorbells edge-triggered) do not, so `disarm_edge` never drains. A
//! drain while edge arms are still outstanding could swallow a wake-up an
//! epoll set has not harvested yet (epoll re-checks an fd before reporting
//! it), so the drain rings again for every direction that is ready and
//! still has arms. Call counters let tests check how much work a wait does
//! per connection.

use std::collections::VecDeque;
use std::io::{IoSlice, IoSliceMut};
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use libc::c_int;

use crate::attached::{AttachedConn, Errno, Ready, ReleaseKind, WaitFd, WaitFds};
use crate::sys;

/// One direction: bytes, end-of-stream, and the two doorbells.
pub struct Pipe {
    buf: Mutex<VecDeque<u8>>,
    cap: usize,
    eof: AtomicBool,
    /// Reader waits for data / writer waits for room (some arm is
    /// outstanding for that side).
    reader_armed: AtomicBool,
    writer_armed: AtomicBool,
    /// Bytes ever pushed / popped: the event sequence.
    pushed: AtomicU64,
    popped: AtomicU64,
    data_bell: RawFd,
    room_bell: RawFd,
}

fn eventfd() -> RawFd {
    // SAFETY: plain eventfd creation.
    unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) }
}

fn ring(fd: RawFd) {
    let one = 1u64;
    // SAFETY: writing 8 bytes to our eventfd.
    unsafe { crate::sys::sys_call!(libc::SYS_write, fd, &one as *const u64, 8) };
}

fn drain(fd: RawFd) {
    let mut v = 0u64;
    // SAFETY: reading 8 bytes from our non-blocking eventfd.
    unsafe { crate::sys::sys_call!(libc::SYS_read, fd, &mut v as *mut u64, 8) };
}

impl Pipe {
    fn new(cap: usize) -> Arc<Pipe> {
        Arc::new(Pipe {
            buf: Mutex::new(VecDeque::new()),
            cap,
            eof: AtomicBool::new(false),
            reader_armed: AtomicBool::new(false),
            writer_armed: AtomicBool::new(false),
            pushed: AtomicU64::new(0),
            popped: AtomicU64::new(0),
            data_bell: eventfd(),
            room_bell: eventfd(),
        })
    }
}

impl Drop for Pipe {
    fn drop(&mut self) {
        sys::close(self.data_bell);
        sys::close(self.room_bell);
    }
}

/// Outstanding arms of one end.
#[derive(Default, Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arms {
    /// Level waiters (`arm`), any direction.
    pub level: u32,
    /// Arms waiting for data (level and edge).
    pub rx: u32,
    /// Arms waiting for room (level and edge).
    pub tx: u32,
}

pub struct MockConn {
    rx: Arc<Pipe>,
    tx: Arc<Pipe>,
    arms: Mutex<Arms>,
    pub releases: AtomicU32,
    pub last_release_owner: AtomicBool,
    /// Calls of `readiness`, and of `arm`/`arm_edge`.
    pub readiness_calls: AtomicU64,
    pub arm_calls: AtomicU64,
    /// Stands for the kernel socket under a ring connection (-1: none): an
    /// eventfd that `socket_news` makes readable, as the peer's FIN would.
    socket: RawFd,
    /// `socket_fired` found the news: the peer is gone (read end shut).
    peer_gone: AtomicBool,
    /// Calls of `socket_fired`.
    pub socket_looks: AtomicU64,
}

/// Two connected ends; each direction holds at most `cap` bytes.
pub fn pair(cap: usize) -> (Arc<MockConn>, Arc<MockConn>) {
    pair_of(cap, false)
}

/// `pair` whose ends also have a stand-in kernel socket each.
pub fn pair_with_sockets(cap: usize) -> (Arc<MockConn>, Arc<MockConn>) {
    pair_of(cap, true)
}

fn pair_of(cap: usize, sockets: bool) -> (Arc<MockConn>, Arc<MockConn>) {
    let (ab, ba) = (Pipe::new(cap), Pipe::new(cap));
    let mk = |rx: &Arc<Pipe>, tx: &Arc<Pipe>| {
        Arc::new(MockConn {
            rx: rx.clone(),
            tx: tx.clone(),
            arms: Mutex::new(Arms::default()),
            releases: AtomicU32::new(0),
            last_release_owner: AtomicBool::new(false),
            readiness_calls: AtomicU64::new(0),
            arm_calls: AtomicU64::new(0),
            socket: if sockets { eventfd() } else { -1 },
            peer_gone: AtomicBool::new(false),
            socket_looks: AtomicU64::new(0),
        })
    };
    (mk(&ba, &ab), mk(&ab, &ba))
}

fn wants_rx(interest: Ready) -> bool {
    interest.intersects(Ready::READ | Ready::RDHUP)
}

fn wants_tx(interest: Ready) -> bool {
    interest.intersects(Ready::WRITE)
}

impl Drop for MockConn {
    fn drop(&mut self) {
        if self.socket >= 0 {
            sys::close(self.socket);
        }
    }
}

impl MockConn {
    /// The peer process died: its FIN reaches the kernel socket only, and
    /// no doorbell rings.
    pub fn socket_news(&self) {
        assert!(self.socket >= 0, "a pair_with_sockets end");
        ring(self.socket);
    }

    /// Arms outstanding now.
    pub fn arms(&self) -> Arms {
        *self.arms.lock().unwrap()
    }

    /// Readiness without counting the call.
    fn state(&self) -> Ready {
        let mut r = Ready::NONE;
        if !self.rx.buf.lock().unwrap().is_empty() {
            r = r | Ready::READ;
        }
        if self.rx.eof.load(Ordering::Acquire) || self.peer_gone.load(Ordering::Acquire) {
            r = r | Ready::READ | Ready::RDHUP;
        }
        // After our own shutdown a send fails at once (EPIPE), which counts
        // as writable, as on TCP.
        let shut = self.tx.eof.load(Ordering::Acquire);
        if shut || self.tx.buf.lock().unwrap().len() < self.tx.cap {
            r = r | Ready::WRITE;
        }
        r
    }

    fn arm_inner(&self, interest: Ready, level: bool) -> Ready {
        self.arm_calls.fetch_add(1, Ordering::Relaxed);
        {
            let mut a = self.arms.lock().unwrap();
            if level {
                a.level += 1;
            }
            if wants_rx(interest) {
                a.rx += 1;
                self.rx.reader_armed.store(true, Ordering::SeqCst);
            }
            if wants_tx(interest) {
                a.tx += 1;
                self.tx.writer_armed.store(true, Ordering::SeqCst);
            }
        }
        // Re-check after the flags are visible (SeqCst on both sides).
        self.state()
    }

    fn disarm_inner(&self, interest: Ready, level: bool) {
        let mut a = self.arms.lock().unwrap();
        if level {
            a.level = a.level.checked_sub(1).expect("disarm without arm");
        }
        if wants_rx(interest) {
            a.rx = a.rx.checked_sub(1).expect("disarm without arm (rx)");
            if a.rx == 0 {
                self.rx.reader_armed.store(false, Ordering::SeqCst);
            }
        }
        if wants_tx(interest) {
            a.tx = a.tx.checked_sub(1).expect("disarm without arm (tx)");
            if a.tx == 0 {
                self.tx.writer_armed.store(false, Ordering::SeqCst);
            }
        }
        if level && a.level == 0 {
            drain(self.rx.data_bell);
            drain(self.tx.room_bell);
            // Edge waiters still armed must not lose a wake-up to the drain.
            let now = self.state();
            if a.rx > 0 && now.intersects(Ready::READ | Ready::RDHUP) {
                ring(self.rx.data_bell);
            }
            if a.tx > 0 && now.intersects(Ready::WRITE) {
                ring(self.tx.room_bell);
            }
        }
    }
}

impl AttachedConn for MockConn {
    fn try_recv(&self, bufs: &mut [IoSliceMut<'_>], peek: bool) -> Result<usize, Errno> {
        let mut q = self.rx.buf.lock().unwrap();
        if q.is_empty() {
            return if self.rx.eof.load(Ordering::Acquire) {
                Ok(0)
            } else {
                Err(Errno(libc::EAGAIN))
            };
        }
        let mut n = 0;
        for b in bufs.iter_mut() {
            for byte in b.iter_mut() {
                match q.get(n) {
                    Some(v) => *byte = *v,
                    None => break,
                }
                n += 1;
            }
        }
        if !peek {
            q.drain(..n);
            self.rx.popped.fetch_add(n as u64, Ordering::SeqCst);
            drop(q);
            if self.rx.writer_armed.load(Ordering::SeqCst) {
                ring(self.rx.room_bell);
            }
        }
        Ok(n)
    }

    fn try_send(&self, bufs: &[IoSlice<'_>]) -> Result<usize, Errno> {
        if self.tx.eof.load(Ordering::Acquire) {
            return Err(Errno(libc::EPIPE));
        }
        let mut q = self.tx.buf.lock().unwrap();
        let room = self.tx.cap - q.len();
        if room == 0 {
            return Err(Errno(libc::EAGAIN));
        }
        let mut n = 0;
        for b in bufs {
            let take = b.len().min(room - n);
            q.extend(&b[..take]);
            n += take;
        }
        self.tx.pushed.fetch_add(n as u64, Ordering::SeqCst);
        drop(q);
        // Publish, then check the sleeping flag (SeqCst on both sides).
        if self.tx.reader_armed.load(Ordering::SeqCst) {
            ring(self.tx.data_bell);
        }
        Ok(n)
    }

    fn flush(&self) {}

    fn readiness(&self) -> Ready {
        self.readiness_calls.fetch_add(1, Ordering::Relaxed);
        self.state()
    }

    fn arm_waiter(&self, interest: Ready, level: bool) -> Ready {
        self.arm_inner(interest, level)
    }

    fn disarm_waiter(&self, interest: Ready, level: bool) {
        self.disarm_inner(interest, level)
    }

    fn watched_socket(&self) -> RawFd {
        self.socket
    }

    fn socket_fired(&self) {
        self.socket_looks.fetch_add(1, Ordering::SeqCst);
        let mut v = 0u64;
        // SAFETY: reading 8 bytes from our non-blocking eventfd.
        let n =
            unsafe { crate::sys::sys_call!(libc::SYS_read, self.socket, &mut v as *mut u64, 8) };
        if n == 8 {
            self.peer_gone.store(true, Ordering::Release);
        }
    }

    fn wait_fds(&self, _fd: RawFd, _interest: Ready) -> WaitFds {
        [
            Some(WaitFd {
                fd: self.rx.data_bell,
                events: libc::POLLIN,
            }),
            Some(WaitFd {
                fd: self.tx.room_bell,
                events: libc::POLLIN,
            }),
            (self.socket >= 0).then_some(WaitFd {
                fd: self.socket,
                events: libc::POLLIN,
            }),
        ]
    }

    fn event_seq(&self) -> u64 {
        self.rx
            .pushed
            .load(Ordering::SeqCst)
            .wrapping_add(self.tx.popped.load(Ordering::SeqCst))
    }

    fn available(&self) -> usize {
        self.rx.buf.lock().unwrap().len()
    }

    fn shutdown(&self, _fd: RawFd, how: c_int) -> Result<(), Errno> {
        if how == libc::SHUT_WR || how == libc::SHUT_RDWR {
            self.tx.eof.store(true, Ordering::Release);
            ring(self.tx.data_bell);
        }
        Ok(())
    }

    fn take_error(&self) -> c_int {
        0
    }

    fn claim(&self) -> Result<(), Errno> {
        Ok(())
    }

    fn release(&self, fd: RawFd, kind: ReleaseKind) {
        self.releases.fetch_add(1, Ordering::SeqCst);
        self.last_release_owner
            .store(kind == ReleaseKind::Owner, Ordering::SeqCst);
        let _ = self.shutdown(fd, libc::SHUT_WR);
    }
}
