//! The floor under any same-host transport: two pinned processes handing a
//! turn back and forth through one shared cache line, optionally copying
//! a message into and out of shared memory each way, with nothing else
//! (no ring protocol, no doorbell, no socket).

use crate::proc::run_pair;
use crate::workload::Latency;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The turn word's value that tells the child to exit.
const STOP: u64 = u64::MAX;
/// A peer silent this long has died: the run fails instead of spinning on.
const PATIENCE: Duration = Duration::from_secs(10);

/// A shared anonymous mapping: the turn word on its own cache line, then
/// one message buffer per direction.
struct Shared {
    base: *mut u8,
    len: usize,
    msg: usize,
}

impl Shared {
    fn new(msg: usize) -> io::Result<Shared> {
        let len = 4096 + 2 * msg.next_multiple_of(4096);
        // SAFETY: a fresh anonymous shared mapping; the result is checked.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Shared {
            base: base.cast(),
            len,
            msg,
        })
    }

    fn turn(&self) -> &AtomicU64 {
        // SAFETY: the mapping is page-aligned, zero-filled and lives as
        // long as self; the word is only accessed atomically.
        unsafe { AtomicU64::from_ptr(self.base.cast()) }
    }

    /// The buffer the parent (`to_child`) or the child writes.
    fn buf(&self, to_child: bool) -> *mut u8 {
        let off = 4096
            + if to_child {
                0
            } else {
                self.msg.next_multiple_of(4096)
            };
        // SAFETY: within the mapping (see `new`).
        unsafe { self.base.add(off) }
    }

    /// Copies `src` into this side's outgoing buffer, then hands the turn
    /// over (the release store publishes the copy).
    fn send(&self, to_child: bool, src: &[u8], turn: u64) {
        // SAFETY: the buffer holds `msg` bytes and the peer does not touch
        // it until it sees `turn`.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.buf(to_child), src.len()) };
        self.turn().store(turn, Ordering::Release);
    }

    /// Spins until the turn word is `want` (or STOP), then copies the
    /// peer's buffer out into `dst`. Returns the word seen.
    fn recv(&self, from_parent: bool, dst: &mut [u8], want: u64) -> io::Result<u64> {
        let start = Instant::now();
        let mut n = 0u32;
        let seen = loop {
            let v = self.turn().load(Ordering::Acquire);
            if v == want || v == STOP {
                break v;
            }
            std::hint::spin_loop();
            n = n.wrapping_add(1);
            if n.is_multiple_of(65536) && start.elapsed() > PATIENCE {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "floor: peer silent",
                ));
            }
        };
        if seen == want {
            // SAFETY: the acquire load above saw the peer's release store
            // made after its copy; the peer waits for our reply.
            unsafe {
                std::ptr::copy_nonoverlapping(self.buf(from_parent), dst.as_mut_ptr(), dst.len())
            };
        }
        Ok(seen)
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // SAFETY: unmapping our own mapping once.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

/// `iters` round trips: the parent (core 0) copies `msg` bytes in and
/// hands the turn over, the child (core 1) copies them out, copies them
/// back in and hands the turn back. `msg` 0 is the bare cache-line bounce.
pub fn ping_pong(msg: usize, iters: usize) -> io::Result<Latency> {
    let sh = Shared::new(msg)?;
    run_pair(
        || {
            let mut buf = vec![0u8; msg];
            let mut want = 1u64;
            while sh.recv(true, &mut buf, want)? != STOP {
                sh.send(false, &buf, want + 1);
                want += 2;
            }
            Ok(())
        },
        || {
            let mut out = vec![7u8; msg];
            let mut back = vec![0u8; msg];
            let mut rtts = Vec::with_capacity(iters);
            let mut turn = 1u64;
            let mut result = Ok(());
            for _ in 0..iters {
                let t = Instant::now();
                sh.send(true, &out, turn);
                if let Err(e) = sh.recv(false, &mut back, turn + 1) {
                    result = Err(e);
                    break;
                }
                rtts.push(t.elapsed());
                std::mem::swap(&mut out, &mut back);
                turn += 2;
            }
            sh.turn().store(STOP, Ordering::Release);
            result.map(|()| Latency::from_samples(rtts))
        },
    )
}
