//! Blocking semantics of recv/send on a ring-attached connection, built on
//! its non-blocking `try_recv`/`try_send` (see attached.rs).
//!
//! Mirrors the kernel's TCP behaviour: a blocking recv returns as soon as
//! some bytes are there (all of them with MSG_WAITALL, unless interrupted,
//! timed out or at EOF); MSG_DONTWAIT or O_NONBLOCK give EAGAIN instead of
//! waiting; SO_RCVTIMEO/SO_SNDTIMEO bound the wait (EAGAIN, or the partial
//! count); a blocking send waits until every byte is queued; EPIPE raises
//! SIGPIPE on the calling thread unless MSG_NOSIGNAL; a signal returns the
//! partial count, or EINTR, or restarts (signals.rs).
//!
//! Return values use the C convention: bytes (>= 0) or -1 with errno set.

use std::io::{IoSlice, IoSliceMut};

use libc::{c_int, ssize_t};

use super::wait::{deadline_after, wait_conn, wait_conn_with, wanted, Woke};
use crate::attached::{Errno, Look, Ready};
use crate::fdtable::FdRef;
use crate::interpose::guard;
use crate::{signals, sys};

fn fail(e: c_int) -> ssize_t {
    sys::set_errno(e);
    -1
}

fn total_len(bufs: &[IoSliceMut<'_>]) -> usize {
    bufs.iter().map(|b| b.len()).sum()
}

/// recv/read/readv/recvmsg on a ring connection.
pub fn recv(fd: c_int, st: &FdRef, bufs: &mut [IoSliceMut<'_>], flags: c_int) -> ssize_t {
    let Some(conn) = st.conn() else {
        return fail(libc::EBADF);
    };
    let _g = guard::enter();
    if let Err(Errno(e)) = st.claim(conn) {
        return fail(e);
    }
    let want = total_len(bufs);
    if want == 0 {
        // TCP's zero-byte read waits as a one-byte one does (EAGAIN, or
        // blocking until data, EOF or an error) and then returns 0.
        let mut one = [0u8; 1];
        let r = recv(
            fd,
            st,
            &mut [IoSliceMut::new(&mut one)],
            flags | libc::MSG_PEEK,
        );
        return r.min(0);
    }
    let peek = flags & libc::MSG_PEEK != 0;
    if flags & libc::MSG_TRUNC != 0 {
        return discard(fd, st, conn, want, flags);
    }
    // The kernel ignores MSG_WAITALL together with MSG_PEEK only in the
    // sense that a peek never consumes; a ring cannot wait for "more than
    // is there" without consuming, so a peek returns what is available.
    let waitall = flags & libc::MSG_WAITALL != 0 && !peek;
    // A blocking read returns once it has SO_RCVLOWAT bytes (or all it
    // asked for, with MSG_WAITALL), as TCP's.
    let lowat = conn.rcvlowat();
    let target = if waitall { want } else { lowat.min(want) };
    let nonblock = flags & libc::MSG_DONTWAIT != 0 || st.nonblocking();
    let timeout = st.rcvtimeo_ns();
    let deadline = deadline_after(timeout);
    let mut bufs = bufs;
    let mut got = 0usize;
    // A blocking read looks with `recv_look`, which takes the bytes it
    // finds, before and while it waits: one hold of the receiver's lock a
    // look, with no readiness look besides, and an empty look asks the
    // kernel socket nothing (a syscall), where the wait's arm asks it
    // before any sleep. Where `recv_look` cannot tell, readiness for
    // reading alone decides (the sender's side would take its lock for
    // nothing). After a wait that ended on readiness, and for the other
    // reads, `try_recv` looks. Not with SO_RCVLOWAT: readiness counts the
    // bytes a first read would have taken, and TCP's reader that took
    // them waits for the low mark to be met again by new bytes alone.
    let plain_wait = !nonblock && !peek && lowat <= 1;
    let interest = Ready::READ | Ready::RDHUP;
    // What the wait's look read.
    let mut read: Option<Result<usize, Errno>> = None;
    let mut woken = false;
    loop {
        let look = plain_wait && !std::mem::take(&mut woken);
        let res = match read.take() {
            Some(r) => r,
            None if look => match conn.recv_look(bufs) {
                Look::Done(r) => r,
                Look::Empty => Err(Errno(libc::EAGAIN)),
                Look::Unsure => conn.try_recv(bufs, false),
            },
            None => conn.try_recv(bufs, peek),
        };
        match res {
            Ok(0) => return got as ssize_t,
            Ok(n) => {
                got += n;
                if got >= target || peek {
                    return got as ssize_t;
                }
                IoSliceMut::advance_slices(&mut bufs, n);
            }
            Err(Errno(libc::EAGAIN)) => {
                if nonblock {
                    return if got > 0 {
                        got as ssize_t
                    } else {
                        fail(libc::EAGAIN)
                    };
                }
                let woke = if plain_wait {
                    let want = wanted(interest);
                    wait_conn_with(fd, conn, interest, deadline, || {
                        match conn.recv_look(bufs) {
                            Look::Done(r) => {
                                read = Some(r);
                                true
                            }
                            Look::Empty => false,
                            Look::Unsure => conn.readiness_for(interest).intersects(want),
                        }
                    })
                } else {
                    wait_conn(fd, conn, interest, deadline)
                };
                woken = read.is_none();
                match woke {
                    Woke::Ready => {}
                    Woke::TimedOut => {
                        return if got > 0 {
                            got as ssize_t
                        } else {
                            fail(libc::EAGAIN)
                        };
                    }
                    Woke::Interrupted => {
                        if got > 0 {
                            return got as ssize_t;
                        }
                        if !signals::restart_allowed(timeout != 0) {
                            return fail(libc::EINTR);
                        }
                    }
                    Woke::Failed(e) => {
                        return if got > 0 { got as ssize_t } else { fail(e) };
                    }
                }
            }
            Err(Errno(e)) => return if got > 0 { got as ssize_t } else { fail(e) },
        }
    }
}

/// recv with MSG_TRUNC on a stream: the bytes are taken (or, with
/// MSG_PEEK, counted) without being copied, and the count returned, as
/// TCP does; otherwise as `recv`.
fn discard(
    fd: c_int,
    st: &FdRef,
    conn: &dyn crate::attached::AttachedConn,
    want: usize,
    flags: c_int,
) -> ssize_t {
    let peek = flags & libc::MSG_PEEK != 0;
    let mut scratch = vec![0u8; want.min(64 * 1024)];
    let mut got = 0usize;
    loop {
        if peek {
            let n = conn.available().min(want);
            if n > 0 {
                return n as ssize_t;
            }
        } else {
            let chunk = (want - got).min(scratch.len());
            match conn.try_recv(&mut [IoSliceMut::new(&mut scratch[..chunk])], false) {
                Ok(0) => return got as ssize_t,
                Ok(n) => {
                    got += n;
                    if got == want {
                        return got as ssize_t;
                    }
                    continue;
                }
                Err(Errno(libc::EAGAIN)) if got > 0 => return got as ssize_t,
                Err(Errno(libc::EAGAIN)) => {}
                Err(Errno(e)) => return if got > 0 { got as ssize_t } else { fail(e) },
            }
        }
        let mut one = [0u8; 1];
        let r = recv(
            fd,
            st,
            &mut [IoSliceMut::new(&mut one)],
            (flags & !libc::MSG_TRUNC) | libc::MSG_PEEK,
        );
        if r <= 0 {
            return if got > 0 { got as ssize_t } else { r };
        }
    }
}

/// The slices of `bufs` after its first `skip` bytes.
fn after<'a>(bufs: &'a [IoSlice<'_>], mut skip: usize) -> Vec<IoSlice<'a>> {
    let mut rest = Vec::with_capacity(bufs.len());
    for b in bufs {
        if skip >= b.len() {
            skip -= b.len();
            continue;
        }
        rest.push(IoSlice::new(&b[skip..]));
        skip = 0;
    }
    rest
}

/// send/write/writev/sendmsg on a ring connection.
pub fn send(fd: c_int, st: &FdRef, bufs: &[IoSlice<'_>], flags: c_int) -> ssize_t {
    let Some(conn) = st.conn() else {
        return fail(libc::EBADF);
    };
    let _g = guard::enter();
    if let Err(Errno(e)) = st.claim(conn) {
        return fail(e);
    }
    let want: usize = bufs.iter().map(|b| b.len()).sum();
    if want == 0 {
        return 0;
    }
    let nonblock = flags & libc::MSG_DONTWAIT != 0 || st.nonblocking();
    let timeout = st.sndtimeo_ns();
    let deadline = deadline_after(timeout);
    // What is left to send: the caller's slices until a partial send, then
    // `owned[first..]`, a copy of their rest (the only allocation, and only
    // for a send that did not fit at once).
    let mut owned: Vec<IoSlice<'_>> = Vec::new();
    let mut first = 0usize;
    let mut sent = 0usize;
    loop {
        let rest: &[IoSlice<'_>] = if sent == 0 { bufs } else { &owned[first..] };
        // Zero bytes accepted means no room, whatever the transport says.
        let res = match conn.try_send(rest) {
            Ok(0) => Err(Errno(libc::EAGAIN)),
            other => other,
        };
        match res {
            Ok(n) => {
                let was_whole = sent == 0;
                sent += n;
                if sent >= want {
                    return sent as ssize_t;
                }
                // Try again at once: a non-blocking send returns what fits,
                // a blocking one waits only when nothing fits.
                if was_whole {
                    owned = after(bufs, sent);
                } else {
                    let left = {
                        let mut rest = &mut owned[first..];
                        IoSlice::advance_slices(&mut rest, n);
                        rest.len()
                    };
                    first = owned.len() - left;
                }
            }
            Err(Errno(libc::EAGAIN)) => {
                if nonblock {
                    return if sent > 0 {
                        sent as ssize_t
                    } else {
                        fail(libc::EAGAIN)
                    };
                }
                match wait_conn(fd, conn, Ready::WRITE, deadline) {
                    Woke::Ready => {}
                    Woke::TimedOut => {
                        return if sent > 0 {
                            sent as ssize_t
                        } else {
                            fail(libc::EAGAIN)
                        };
                    }
                    Woke::Interrupted => {
                        if sent > 0 {
                            return sent as ssize_t;
                        }
                        if !signals::restart_allowed(timeout != 0) {
                            return fail(libc::EINTR);
                        }
                    }
                    Woke::Failed(e) => {
                        return if sent > 0 { sent as ssize_t } else { fail(e) };
                    }
                }
            }
            Err(Errno(libc::EPIPE)) => {
                if sent > 0 {
                    return sent as ssize_t;
                }
                if flags & libc::MSG_NOSIGNAL == 0 {
                    sys::raise_on_this_thread(libc::SIGPIPE);
                }
                return fail(libc::EPIPE);
            }
            Err(Errno(e)) => return if sent > 0 { sent as ssize_t } else { fail(e) },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flat(bufs: &[IoSlice<'_>]) -> Vec<u8> {
        bufs.iter().flat_map(|b| b.iter().copied()).collect()
    }

    #[test]
    fn after_skips_whole_and_partial_slices() {
        let (a, b, c) = (*b"abc", *b"", *b"defg");
        let bufs = [IoSlice::new(&a), IoSlice::new(&b), IoSlice::new(&c)];
        for skip in 0..=7 {
            let rest = after(&bufs, skip);
            assert_eq!(flat(&rest), b"abcdefg"[skip..].to_vec(), "skip {skip}");
            assert!(rest.iter().all(|s| !s.is_empty()) || skip == 0);
        }
    }
}
