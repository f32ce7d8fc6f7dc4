//! A test double for the ring layer: an `AttachedConn` pair over two
//! in-memory byte queues with eventfd doorbells, implementing the arm /
//! wait_fds / disarm protocol the way a ring transport must. Used to check
//! that the hooks dispatch ring fds correctly (tests.rs).

use std::collections::VecDeque;
use std::io::{IoSlice, IoSliceMut};
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use libc::c_int;

use crate::attached::{AttachedConn, Errno, Ready, ReleaseKind, WaitFd, WaitFds};
use crate::sys;

/// One direction: bytes, end-of-stream, and the two doorbells.
pub struct Pipe {
    buf: Mutex<VecDeque<u8>>,
    cap: usize,
    eof: AtomicBool,
    /// Reader waits for data / writer waits for room.
    reader_armed: AtomicBool,
    writer_armed: AtomicBool,
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
    unsafe { libc::syscall(libc::SYS_write, fd, &one as *const u64, 8) };
}

fn drain(fd: RawFd) {
    let mut v = 0u64;
    // SAFETY: reading 8 bytes from our non-blocking eventfd.
    unsafe { libc::syscall(libc::SYS_read, fd, &mut v as *mut u64, 8) };
}

impl Pipe {
    fn new(cap: usize) -> Arc<Pipe> {
        Arc::new(Pipe {
            buf: Mutex::new(VecDeque::new()),
            cap,
            eof: AtomicBool::new(false),
            reader_armed: AtomicBool::new(false),
            writer_armed: AtomicBool::new(false),
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

pub struct MockConn {
    rx: Arc<Pipe>,
    tx: Arc<Pipe>,
    pub releases: AtomicU32,
    pub last_release_owner: AtomicBool,
}

/// Two connected ends; each direction holds at most `cap` bytes.
pub fn pair(cap: usize) -> (Arc<MockConn>, Arc<MockConn>) {
    let (ab, ba) = (Pipe::new(cap), Pipe::new(cap));
    let mk = |rx: &Arc<Pipe>, tx: &Arc<Pipe>| {
        Arc::new(MockConn {
            rx: rx.clone(),
            tx: tx.clone(),
            releases: AtomicU32::new(0),
            last_release_owner: AtomicBool::new(false),
        })
    };
    (mk(&ba, &ab), mk(&ab, &ba))
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
        drop(q);
        // Publish, then check the sleeping flag (SeqCst on both sides).
        if self.tx.reader_armed.load(Ordering::SeqCst) {
            ring(self.tx.data_bell);
        }
        Ok(n)
    }

    fn flush(&self) {}

    fn readiness(&self) -> Ready {
        let mut r = Ready::NONE;
        if !self.rx.buf.lock().unwrap().is_empty() {
            r = r | Ready::READ;
        }
        if self.rx.eof.load(Ordering::Acquire) {
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

    fn arm(&self, interest: Ready) -> Ready {
        if interest.intersects(Ready::READ | Ready::RDHUP) {
            self.rx.reader_armed.store(true, Ordering::SeqCst);
        }
        if interest.intersects(Ready::WRITE) {
            self.tx.writer_armed.store(true, Ordering::SeqCst);
        }
        self.readiness()
    }

    fn disarm(&self, interest: Ready) {
        if interest.intersects(Ready::READ | Ready::RDHUP) {
            self.rx.reader_armed.store(false, Ordering::SeqCst);
            drain(self.rx.data_bell);
        }
        if interest.intersects(Ready::WRITE) {
            self.tx.writer_armed.store(false, Ordering::SeqCst);
            drain(self.tx.room_bell);
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
        ]
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
