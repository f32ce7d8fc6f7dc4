//! Blocking semantics of recv/send on a ring-attached connection, built on
//! its non-blocking `try_recv`/`try_send` (see attached.rs).
//!
//! Mirrors the kernel's TCP behaviour: a blocking recv returns as soon as
//! some bytes are there (all of them with MSG_WAITALL, unless interrupted,
//! timed out or at EOF), a peek as well, leaving them there; MSG_DONTWAIT
//! or O_NONBLOCK give EAGAIN instead of waiting; SO_RCVTIMEO/SO_SNDTIMEO
//! bound the wait (EAGAIN, or the partial count); a blocking send waits
//! until every byte is queued; EPIPE raises SIGPIPE on the calling thread
//! unless MSG_NOSIGNAL; a signal returns the partial count, or EINTR, or
//! restarts (signals.rs).
//!
//! Return values use the C convention: bytes (>= 0) or -1 with errno set.

use std::io::{IoSlice, IoSliceMut};

use libc::{c_int, ssize_t};

use super::wait::{
    deadline_after, pause, wait_conn, wait_conn_needing, wait_conn_with, wanted, Woke,
};
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
    let trunc = flags & libc::MSG_TRUNC != 0;
    let waitall = flags & libc::MSG_WAITALL != 0;
    // A blocking read returns once it has SO_RCVLOWAT bytes (or all it
    // asked for, with MSG_WAITALL), as TCP's.
    let lowat = conn.rcvlowat();
    let target = if waitall { want } else { lowat.min(want) };
    let nonblock = flags & libc::MSG_DONTWAIT != 0 || st.nonblocking();
    let timeout = st.rcvtimeo_ns();
    if peek {
        // TCP wakes a sleeping reader only once SO_RCVLOWAT bytes are
        // unread, then returns when it has its target.
        let need = target.max(lowat);
        let mut look = || {
            if trunc {
                peek_count(conn, want)
            } else {
                conn.try_recv(bufs, true)
            }
        };
        return peek_wait(fd, conn, &mut look, (target, need), nonblock, timeout);
    }
    if trunc {
        return discard(fd, st, conn, want, flags);
    }
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
    let plain_wait = !nonblock && lowat <= 1;
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
            None => conn.try_recv(bufs, false),
        };
        match res {
            Ok(0) => return got as ssize_t,
            Ok(n) => {
                got += n;
                if got >= target {
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

/// recv with MSG_PEEK: `look` copies (or, with MSG_TRUNC, counts) what
/// is there and leaves it. A blocking peek with fewer than `target` bytes
/// there waits (until `need` are, see `wait_conn_needing`) and looks
/// again from the start, as TCP's goes on copying into the same buffer;
/// it returns what it has at the end of the stream, an error or hang-up,
/// a timeout or a signal (EAGAIN or EINTR when that is nothing).
fn peek_wait(
    fd: c_int,
    conn: &dyn crate::attached::AttachedConn,
    look: &mut dyn FnMut() -> Result<usize, Errno>,
    (target, need): (usize, usize),
    nonblock: bool,
    timeout: u64,
) -> ssize_t {
    let deadline = deadline_after(timeout);
    // The stream has ended (or failed, or hung up) after the bytes the
    // last look saw: no more will come.
    let mut ended = false;
    // What the look before the last wait found, if that wait said ready.
    let mut woken_at: Option<usize> = None;
    loop {
        let have = match look() {
            // End of stream with nothing before it.
            Ok(0) => return 0,
            Ok(n) if n >= target || ended => return n as ssize_t,
            Ok(n) => n,
            Err(Errno(libc::EAGAIN)) => 0,
            Err(Errno(e)) => return fail(e),
        };
        if nonblock {
            return if have > 0 {
                have as ssize_t
            } else {
                fail(libc::EAGAIN)
            };
        }
        if have > 0 {
            // Everything the peer sent before its end is there once the
            // end is seen: one more look finds it all.
            let end = Ready::RDHUP | Ready::HUP | Ready::ERR;
            if conn
                .readiness_for(Ready::READ | Ready::RDHUP)
                .intersects(end)
            {
                ended = true;
                continue;
            }
        }
        // A wait that said ready and brought nothing the look could see
        // would say so again at once: pause instead of spinning.
        let stalled = woken_at.is_some_and(|was| have <= was);
        let woke = if stalled {
            pause(deadline)
        } else {
            wait_conn_needing(fd, conn, need, deadline)
        };
        if woke == Woke::Ready {
            woken_at = Some(have);
            continue;
        }
        // As TCP's, a wait that ends short copies what came meanwhile.
        let last = match look() {
            Err(Errno(libc::EAGAIN)) if have > 0 => Ok(have),
            r => r,
        };
        match (woke, last) {
            (_, Ok(n)) if n > 0 => return n as ssize_t,
            (_, Ok(_)) => return 0,
            (Woke::TimedOut, Err(Errno(libc::EAGAIN))) => return fail(libc::EAGAIN),
            (Woke::Interrupted, Err(Errno(libc::EAGAIN))) => {
                if !signals::restart_allowed(timeout != 0) {
                    return fail(libc::EINTR);
                }
                woken_at = None;
            }
            (Woke::Failed(e), Err(Errno(libc::EAGAIN))) => return fail(e),
            (_, Err(Errno(e))) => return fail(e),
        }
    }
}

/// A peek with MSG_TRUNC: the bytes there, up to `want`, counted without
/// being copied; `try_recv` of one byte tells the end of the stream, an
/// error or EAGAIN when there are none.
fn peek_count(conn: &dyn crate::attached::AttachedConn, want: usize) -> Result<usize, Errno> {
    match conn.available().min(want) {
        0 => {
            let mut one = [0u8; 1];
            let n = conn.try_recv(&mut [IoSliceMut::new(&mut one)], true)?;
            Ok(if n == 0 {
                0
            } else {
                conn.available().clamp(n, want)
            })
        }
        n => Ok(n),
    }
}

/// recv with MSG_TRUNC (without MSG_PEEK) on a stream: the bytes are
/// taken without being copied, and the count returned, as TCP does;
/// otherwise as `recv`.
fn discard(
    fd: c_int,
    st: &FdRef,
    conn: &dyn crate::attached::AttachedConn,
    want: usize,
    flags: c_int,
) -> ssize_t {
    let mut scratch = vec![0u8; want.min(64 * 1024)];
    let mut got = 0usize;
    loop {
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
