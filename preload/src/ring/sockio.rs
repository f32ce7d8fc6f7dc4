//! Plain system calls on the kernel socket under a ring connection and
//! the error mapping every ring connection shares (shm and verbs): the
//! socket stays connected and idle underneath, and these calls never go
//! through the shim's own hooks and never block.

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Mutex, MutexGuard};

use libc::c_int;
use ringsock_ring::RingError;

use crate::attached::{Errno, Ready, WaitFd, WaitFds};
use crate::sys;

pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // panic = "abort": a poisoned lock cannot be observed; recover anyway.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Errno for a ring failure the program sees on its socket.
pub fn ring_errno(e: &RingError, what: &str) -> Errno {
    match e {
        RingError::WouldBlock => Errno(libc::EAGAIN),
        RingError::PeerClosed | RingError::Closed => Errno(libc::EPIPE),
        RingError::Corrupt(c) => {
            log::error!("{what}: corrupt ring ({c:?}); the connection is reset");
            Errno(libc::ECONNRESET)
        }
        RingError::Os(e) => Errno(*e),
        RingError::Config(_) | RingError::Unsupported(_) | RingError::Verbs(_) => {
            log::error!("{what}: {e}");
            Errno(e.errno())
        }
    }
}

pub fn poll_one(fd: RawFd, events: i16) -> i16 {
    let mut p = libc::pollfd {
        fd,
        events,
        revents: 0,
    };
    // SAFETY: one valid pollfd, zero timeout; raw syscall (never our hook).
    let r = unsafe {
        crate::sys::sys_call!(
            libc::SYS_ppoll,
            &mut p as *mut libc::pollfd,
            1,
            &libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            } as *const libc::timespec,
            std::ptr::null::<libc::sigset_t>(),
            8,
        )
    };
    if r > 0 {
        p.revents
    } else {
        0
    }
}

/// recv(2) on the kernel socket, never blocking, never our hook.
pub fn sys_recv(fd: RawFd, buf: &mut [u8], flags: c_int) -> Result<usize, Errno> {
    // SAFETY: buf is valid for its length.
    let n = unsafe {
        crate::sys::sys_call!(
            libc::SYS_recvfrom,
            fd,
            buf.as_mut_ptr(),
            buf.len(),
            flags | libc::MSG_DONTWAIT,
            std::ptr::null_mut::<libc::sockaddr>(),
            std::ptr::null_mut::<libc::socklen_t>(),
        )
    };
    if n < 0 {
        Err(Errno(sys::errno()))
    } else {
        Ok(n as usize)
    }
}

/// send(2) on the kernel socket, never blocking, never raising SIGPIPE.
pub fn sys_send(fd: RawFd, buf: &[u8]) -> Result<usize, Errno> {
    // SAFETY: buf is valid for its length.
    let n = unsafe {
        crate::sys::sys_call!(
            libc::SYS_sendto,
            fd,
            buf.as_ptr(),
            buf.len(),
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            std::ptr::null::<libc::sockaddr>(),
            0,
        )
    };
    if n < 0 {
        Err(Errno(sys::errno()))
    } else {
        Ok(n as usize)
    }
}

/// Sends `buf` whole on a possibly full socket, waiting at most a few
/// seconds in total (a server that turned the ring down reads its socket).
pub fn send_all_bounded(fd: RawFd, mut buf: &[u8]) -> Result<(), Errno> {
    let deadline = sys::monotonic_ns() + 5_000_000_000;
    while !buf.is_empty() {
        match sys_send(fd, buf) {
            Ok(n) => buf = &buf[n..],
            Err(Errno(libc::EAGAIN)) | Err(Errno(libc::EINTR)) => {
                if sys::monotonic_ns() > deadline {
                    return Err(Errno(libc::ETIMEDOUT));
                }
                let mut p = libc::pollfd {
                    fd,
                    events: libc::POLLOUT,
                    revents: 0,
                };
                // SAFETY: one valid pollfd; 10 ms timeout.
                unsafe {
                    crate::sys::sys_call!(
                        libc::SYS_ppoll,
                        &mut p as *mut libc::pollfd,
                        1,
                        &libc::timespec {
                            tv_sec: 0,
                            tv_nsec: 10_000_000,
                        } as *const libc::timespec,
                        std::ptr::null::<libc::sigset_t>(),
                        8,
                    )
                };
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The readiness of the kernel socket itself (a connection that fell back
/// to TCP), with ERR when the connection holds an error.
pub fn tcp_readiness(fd: RawFd, pending_error: c_int) -> Ready {
    let re = poll_one(
        fd,
        libc::POLLIN | libc::POLLOUT | libc::POLLRDHUP | libc::POLLPRI,
    );
    let mut r = Ready(re as u16 as u32);
    if pending_error != 0 {
        r = r | Ready::ERR;
    }
    r
}

/// recv into several buffers without blocking (one recv per buffer, as
/// far as the socket has bytes).
pub fn recv_vec(fd: RawFd, bufs: &mut [IoSliceMut<'_>], peek: bool) -> Result<usize, Errno> {
    let flags = if peek { libc::MSG_PEEK } else { 0 };
    if peek && bufs.iter().filter(|b| !b.is_empty()).count() > 1 {
        // Each peek starts at the head: several buffers get one gathered
        // copy of what is queued (at least a byte's look, for EOF or the
        // error), filled in turn.
        let room: usize = bufs.iter().map(|b| b.len()).sum();
        let mut whole = vec![0u8; fionread(fd).min(room).max(1)];
        let n = sys_recv(fd, &mut whole, flags)?;
        return Ok(scatter(&whole[..n], bufs, 0));
    }
    let mut total = 0;
    for b in bufs.iter_mut().filter(|b| !b.is_empty()) {
        match sys_recv(fd, b, flags) {
            Ok(n) => {
                total += n;
                if n < b.len() || peek {
                    break;
                }
            }
            Err(e) if total == 0 => return Err(e),
            Err(_) => break,
        }
    }
    Ok(total)
}

/// Copies `data` into `bufs` in turn from byte `skip` of them on; returns
/// the bytes copied.
pub fn scatter(data: &[u8], bufs: &mut [IoSliceMut<'_>], mut skip: usize) -> usize {
    let mut done = 0;
    for b in bufs.iter_mut() {
        if done == data.len() {
            break;
        }
        if skip >= b.len() {
            skip -= b.len();
            continue;
        }
        let n = (b.len() - skip).min(data.len() - done);
        b[skip..skip + n].copy_from_slice(&data[done..done + n]);
        skip = 0;
        done += n;
    }
    done
}

/// recv on the kernel socket of a connection that fell back to TCP or
/// whose peer is gone, with `error` the failure the connection holds
/// (a resend of the early bytes that met the peer's reset, say). As on
/// kernel TCP, bytes the socket already holds come first and the error
/// after them, once: a server that wrote one byte and closed (iperf3's
/// "busy" answer) must not read as a bare reset.
pub fn recv_then_error(
    fd: RawFd,
    error: &AtomicI32,
    bufs: &mut [IoSliceMut<'_>],
    peek: bool,
) -> Result<usize, Errno> {
    let got = recv_vec(fd, bufs, peek);
    if matches!(got, Ok(n) if n > 0) {
        return got;
    }
    match take_recv_error(error) {
        Some(e) => Err(Errno(e)),
        None => got,
    }
}

/// The error a receive reports, taken once; None when there is none for
/// it. EPIPE stays for the next send: the kernel holds EPIPE only for a
/// reset after the peer's FIN, and a receive after a FIN returns EOF
/// before it looks at the error (recv never fails with EPIPE).
pub fn take_recv_error(error: &AtomicI32) -> Option<c_int> {
    error
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |e| {
            (e != 0 && e != libc::EPIPE).then_some(0)
        })
        .ok()
}

/// Aborts the kernel connection under `fd` as a close with SO_LINGER
/// {1,0} would, though other descriptors share the socket: connect with
/// AF_UNSPEC disconnects it, sending a reset where the state calls for
/// one. The peer reads a reset, never an end of stream that would pass
/// a cut stream off as whole.
pub fn abort(fd: RawFd) {
    // SAFETY: a zeroed sockaddr is a valid AF_UNSPEC address.
    let mut unspec: libc::sockaddr = unsafe { std::mem::zeroed() };
    unspec.sa_family = libc::AF_UNSPEC as libc::sa_family_t;
    let len = std::mem::size_of::<libc::sockaddr>() as libc::socklen_t;
    // SAFETY: connect reads `len` bytes of our own address.
    unsafe { crate::sys::sys_call!(libc::SYS_connect, fd, &unspec as *const libc::sockaddr, len) };
}

/// A send that met the peer's closed flag (its reader closed: the peer
/// program closed its socket) before its FIN reached us. Kernel TCP takes
/// the first such write (the peer's kernel then answers with a reset) and
/// fails the ones after with EPIPE; so does this: the first write is
/// taken and dropped, as the peer would drop it, and later ones fail. It
/// does not go to the kernel socket: the peer may still hold that open
/// for a moment and would read data there as a broken ring connection.
/// `taken` remembers that the one write was taken.
pub fn send_after_peer_closed(taken: &AtomicBool, bufs: &[IoSlice<'_>]) -> Result<usize, Errno> {
    if taken.swap(true, Ordering::AcqRel) {
        return Err(Errno(libc::EPIPE));
    }
    Ok(bufs.iter().map(|b| b.len()).sum())
}

/// send several buffers without blocking, as far as the socket takes them.
pub fn send_vec(fd: RawFd, bufs: &[IoSlice<'_>]) -> Result<usize, Errno> {
    let mut total = 0;
    for b in bufs.iter().filter(|b| !b.is_empty()) {
        match sys_send(fd, b) {
            Ok(n) => {
                total += n;
                if n < b.len() {
                    break;
                }
            }
            Err(e) if total == 0 => return Err(e),
            Err(_) => break,
        }
    }
    Ok(total)
}

/// What a connection that fell back to TCP sleeps on: its kernel socket,
/// with the events `interest` needs.
pub fn tcp_wait_fds(tcp: RawFd, interest: Ready) -> WaitFds {
    let mut ev = 0i16;
    if interest.intersects(Ready::READ | Ready::RDHUP | Ready::PRI) {
        ev |= libc::POLLIN | libc::POLLRDHUP | libc::POLLPRI;
    }
    if interest.intersects(Ready::WRITE) {
        ev |= libc::POLLOUT;
    }
    [
        Some(WaitFd {
            fd: tcp,
            events: ev,
        }),
        None,
        None,
    ]
}

/// The kernel socket's TCP_INFO, with the length the kernel wrote (an
/// older kernel writes fewer fields); None if it cannot tell.
fn tcp_info(fd: RawFd) -> Option<(libc::tcp_info, usize)> {
    // SAFETY: tcp_info is plain data; zeroes are a valid value.
    let mut ti: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: ti/len describe a tcp_info the kernel writes at most len
    // bytes of.
    let r = unsafe {
        crate::real::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut ti as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    (r == 0).then_some((ti, len as usize))
}

/// Data segments the kernel socket has sent and received (TCP_INFO's
/// tcpi_data_segs_out + tcpi_data_segs_in, Linux 4.6 on); None if it
/// cannot say.
pub fn data_segments(fd: RawFd) -> Option<u64> {
    let (ti, len) = tcp_info(fd)?;
    let end = std::mem::offset_of!(libc::tcp_info, tcpi_data_segs_out) + std::mem::size_of::<u32>();
    (len >= end).then(|| u64::from(ti.tcpi_data_segs_in) + u64::from(ti.tcpi_data_segs_out))
}

/// Bytes the kernel socket has received in all (TCP_INFO's
/// tcpi_bytes_received): a count that grows with every arrival.
pub fn bytes_received(fd: RawFd) -> u64 {
    let end =
        std::mem::offset_of!(libc::tcp_info, tcpi_bytes_received) + std::mem::size_of::<u64>();
    tcp_info(fd)
        .filter(|(_, len)| *len >= end)
        .map_or(0, |(ti, _)| ti.tcpi_bytes_received)
}

/// Whether the kernel socket is in TCP_CLOSE (after a reset, on a socket
/// that never sent its FIN); false if it cannot tell.
pub fn reset_state(fd: RawFd) -> bool {
    const TCP_CLOSE: u8 = 7;
    tcp_info(fd).is_some_and(|(ti, _)| ti.tcpi_state == TCP_CLOSE)
}

/// Whether the kernel socket's next byte is the urgent mark (SIOCATMARK):
/// TCP's read stops there.
pub fn at_urgent_mark(fd: RawFd) -> bool {
    const SIOCATMARK: libc::c_ulong = 0x8905;
    let mut at: c_int = 0;
    // SAFETY: SIOCATMARK writes one int.
    let r =
        unsafe { crate::sys::sys_call!(libc::SYS_ioctl, fd, SIOCATMARK, &mut at as *mut c_int) };
    r == 0 && at != 0
}

/// Bytes the kernel socket holds for reading (FIONREAD).
pub fn fionread(fd: RawFd) -> usize {
    let mut n: c_int = 0;
    // SAFETY: FIONREAD writes one int.
    unsafe { crate::sys::sys_call!(libc::SYS_ioctl, fd, libc::FIONREAD, &mut n as *mut c_int) };
    n.max(0) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    fn socketpair() -> (RawFd, RawFd) {
        let mut fds = [0; 2];
        // SAFETY: fds has room for the two descriptors.
        let r = unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM, 0, fds.as_mut_ptr()) };
        assert_eq!(r, 0);
        (fds[0], fds[1])
    }

    fn recv_one(fd: RawFd, error: &AtomicI32) -> Result<usize, Errno> {
        let mut b = [0u8; 8];
        recv_then_error(fd, error, &mut [IoSliceMut::new(&mut b)], false)
    }

    #[test]
    fn held_bytes_come_before_the_error_once() {
        let (a, b) = socketpair();
        assert_eq!(sys_send(b, b"\xfe"), Ok(1));
        let error = AtomicI32::new(libc::ECONNRESET);
        assert_eq!(recv_one(a, &error), Ok(1));
        assert_eq!(recv_one(a, &error), Err(Errno(libc::ECONNRESET)));
        assert_eq!(recv_one(a, &error), Err(Errno(libc::EAGAIN)));
        sys::close(b);
        assert_eq!(recv_one(a, &error), Ok(0));
        sys::close(a);
    }

    #[test]
    fn one_write_is_taken_after_the_peer_closed() {
        let taken = AtomicBool::new(false);
        let bufs = [IoSlice::new(b"cookie"), IoSlice::new(b"!")];
        assert_eq!(send_after_peer_closed(&taken, &bufs), Ok(7));
        assert_eq!(
            send_after_peer_closed(&taken, &bufs),
            Err(Errno(libc::EPIPE))
        );
    }
}
