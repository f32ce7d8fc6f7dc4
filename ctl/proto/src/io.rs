//! Every system call of the protocol, on raw descriptors, in one place.
//!
//! The LD_PRELOAD shim interposes many of these libc symbols; it will route
//! the calls made here to the real libc itself. Keeping them in this one
//! small module makes that a local change. Nothing here allocates.
//!
//! Transport: AF_UNIX SOCK_SEQPACKET. One datagram is exactly one frame,
//! and the SCM_RIGHTS descriptors of a datagram arrive with that datagram
//! and no other. With SOCK_STREAM the kernel may split a frame across reads
//! and attach its descriptors to whichever read crosses the first byte,
//! which makes "these fds belong to that message" a guess; SEQPACKET also
//! reports oversize datagrams (MSG_TRUNC) instead of letting a reader
//! buffer them.

use std::io;
use std::mem;
use std::net::SocketAddr;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::ptr;
use std::time::Duration;

use crate::{addr, Error, Fds, ProtoError, MAX_FDS};

/// Control-message buffer with the alignment `cmsghdr` needs.
#[repr(C)]
union CmsgBuf {
    _align: libc::cmsghdr,
    bytes: [u8; CMSG_CAP],
}

/// Room for one SCM_RIGHTS header and MAX_FDS descriptors (and then some).
const CMSG_CAP: usize = 64;

/// Exact control-buffer size for MAX_FDS descriptors. Receiving with exactly
/// this much room makes the kernel set MSG_CTRUNC (and close the excess
/// itself) when a peer sends more.
fn cmsg_space(nfds: usize) -> usize {
    // SAFETY: CMSG_SPACE is pure arithmetic.
    unsafe { libc::CMSG_SPACE((nfds * mem::size_of::<RawFd>()) as u32) as usize }
}

fn retry_eintr<T: PartialEq + From<i8>>(mut f: impl FnMut() -> T) -> io::Result<T> {
    loop {
        let r = f();
        if r != T::from(-1) {
            return Ok(r);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Sends one frame and its descriptors as one datagram. `flags` is added to
/// MSG_NOSIGNAL (a dead peer must be an EPIPE, not a SIGPIPE that kills the
/// host program); pass MSG_DONTWAIT for a non-blocking attempt.
pub fn send_frame(sock: RawFd, frame: &[u8], fds: &[RawFd], flags: i32) -> io::Result<()> {
    if fds.len() > MAX_FDS {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let mut cbuf = CmsgBuf {
        bytes: [0; CMSG_CAP],
    };
    let mut iov = libc::iovec {
        iov_base: frame.as_ptr() as *mut libc::c_void,
        iov_len: frame.len(),
    };
    // SAFETY: msghdr is plain old data; all-zero is a valid empty header.
    let mut msg: libc::msghdr = unsafe { mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        msg.msg_control = &mut cbuf as *mut CmsgBuf as *mut libc::c_void;
        msg.msg_controllen = cmsg_space(fds.len()) as _;
        // SAFETY: the control buffer is aligned for cmsghdr and at least
        // CMSG_SPACE(fds) long (CMSG_CAP >= cmsg_space(MAX_FDS), tested), so
        // the first header and its data area lie inside it.
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(mem::size_of_val(fds) as u32) as _;
            ptr::copy_nonoverlapping(
                fds.as_ptr() as *const u8,
                libc::CMSG_DATA(cmsg),
                mem::size_of_val(fds),
            );
        }
    }
    // SAFETY: msg points at live buffers (iov -> frame, control -> cbuf)
    // for the duration of the call.
    let sent = retry_eintr(|| unsafe { libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL | flags) })?;
    if sent as usize != frame.len() {
        // Cannot happen on SOCK_SEQPACKET (datagrams are atomic); refuse to
        // pretend a partial frame went out on any other socket type.
        return Err(io::Error::new(io::ErrorKind::WriteZero, "short send"));
    }
    Ok(())
}

/// Receives one datagram into `buf` (size it [`crate::MAX_FRAME_TOTAL`]).
/// `Ok(None)`: the peer closed. Descriptors arrive close-on-exec. A datagram
/// longer than `buf` or with cut ancillary data is an error, and the
/// descriptors that came with it are closed before returning.
pub fn recv_frame(sock: RawFd, buf: &mut [u8], flags: i32) -> Result<Option<(usize, Fds)>, Error> {
    let mut cbuf = CmsgBuf {
        bytes: [0; CMSG_CAP],
    };
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: msghdr is plain old data; all-zero is a valid empty header.
    let mut msg: libc::msghdr = unsafe { mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = &mut cbuf as *mut CmsgBuf as *mut libc::c_void;
    msg.msg_controllen = cmsg_space(MAX_FDS) as _;
    // SAFETY: msg points at live buffers of the stated sizes.
    let n =
        retry_eintr(|| unsafe { libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC | flags) })?;
    // Take ownership of every descriptor first, so each early return below
    // closes them.
    let fds = collect_fds(&msg);
    if msg.msg_flags & libc::MSG_TRUNC != 0 {
        return Err(Error::Proto(ProtoError::Oversized));
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(Error::Proto(ProtoError::FdsTruncated));
    }
    if n == 0 && fds.is_empty() {
        return Ok(None);
    }
    Ok(Some((n as usize, fds)))
}

/// Moves every SCM_RIGHTS descriptor of a received message into an `Fds`.
fn collect_fds(msg: &libc::msghdr) -> Fds {
    let mut fds = Fds::new();
    // SAFETY: msg was filled by recvmsg: msg_controllen bytes of its control
    // buffer are valid cmsg headers, which CMSG_FIRSTHDR/NXTHDR walk within
    // bounds; each SCM_RIGHTS data area holds (cmsg_len - CMSG_LEN(0)) / 4
    // ints, read unaligned because CMSG_DATA need not be int-aligned.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg) as *const RawFd;
                let bytes = ((*cmsg).cmsg_len as usize).saturating_sub(libc::CMSG_LEN(0) as usize);
                for i in 0..bytes / mem::size_of::<RawFd>() {
                    fds.push_raw(ptr::read_unaligned(data.add(i)));
                }
            }
            cmsg = libc::CMSG_NXTHDR(msg, cmsg);
        }
    }
    fds
}

/// Closes a descriptor; errors are ignored (on Linux the number is released
/// even when close reports EINTR or EIO, so retrying would be wrong).
pub fn close_fd(fd: RawFd) {
    // SAFETY: the caller owns `fd` and gives it up here.
    unsafe {
        libc::close(fd);
    }
}

/// Credentials of the process at the other end of a unix socket, as the
/// kernel recorded them at connect time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerCred {
    pub pid: u32,
    pub uid: u32,
    pub gid: u32,
}

/// SO_PEERCRED of a connected unix socket.
pub fn peer_cred(sock: RawFd) -> io::Result<PeerCred> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: cred is a writable ucred and len its size.
    let r = unsafe {
        libc::getsockopt(
            sock,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            &mut cred as *mut libc::ucred as *mut libc::c_void,
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(PeerCred {
        pid: cred.pid as u32,
        uid: cred.uid,
        gid: cred.gid,
    })
}

/// An integer socket option (SO_ACCEPTCONN, SO_TYPE, SO_PROTOCOL...).
pub fn sockopt_int(sock: RawFd, level: i32, name: i32) -> io::Result<i32> {
    let mut v: libc::c_int = 0;
    let mut len = mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: v is a writable c_int and len its size.
    let r = unsafe {
        libc::getsockopt(
            sock,
            level,
            name,
            &mut v as *mut libc::c_int as *mut libc::c_void,
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(v)
}

type NameFn =
    unsafe extern "C" fn(libc::c_int, *mut libc::sockaddr, *mut libc::socklen_t) -> libc::c_int;

fn sock_addr(sock: RawFd, f: NameFn) -> io::Result<SocketAddr> {
    // SAFETY: sockaddr_storage is plain old data; all-zero is valid.
    let mut st: libc::sockaddr_storage = unsafe { mem::zeroed() };
    let mut len = mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: st is a writable buffer of `len` bytes.
    let r = unsafe { f(sock, &mut st as *mut _ as *mut libc::sockaddr, &mut len) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    addr::from_raw(&st, len).ok_or_else(|| io::Error::from_raw_os_error(libc::EAFNOSUPPORT))
}

/// getsockname of an AF_INET/AF_INET6 socket (EAFNOSUPPORT for others).
pub fn local_addr(sock: RawFd) -> io::Result<SocketAddr> {
    sock_addr(sock, libc::getsockname)
}

/// getpeername of an AF_INET/AF_INET6 socket (ENOTCONN if unconnected).
pub fn peer_addr(sock: RawFd) -> io::Result<SocketAddr> {
    sock_addr(sock, libc::getpeername)
}

/// The C form of a unix socket path (ENAMETOOLONG when it does not fit,
/// EINVAL for an interior NUL).
pub fn unix_addr(path: &Path) -> io::Result<(libc::sockaddr_un, libc::socklen_t)> {
    let bytes = path.as_os_str().as_bytes();
    // SAFETY: sockaddr_un is plain old data; all-zero is valid.
    let mut sun: libc::sockaddr_un = unsafe { mem::zeroed() };
    if bytes.is_empty() || bytes.contains(&0) {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    if bytes.len() >= sun.sun_path.len() {
        return Err(io::Error::from_raw_os_error(libc::ENAMETOOLONG));
    }
    sun.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (dst, &src) in sun.sun_path.iter_mut().zip(bytes) {
        *dst = src as libc::c_char;
    }
    let len = mem::size_of::<libc::sa_family_t>() + bytes.len() + 1;
    Ok((sun, len as libc::socklen_t))
}

/// A close-on-exec AF_UNIX SOCK_SEQPACKET socket connected to `path`.
pub fn connect_unix(path: &Path) -> io::Result<OwnedFd> {
    let (sun, len) = unix_addr(path)?;
    // SAFETY: plain socket(2) call.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd was just created and is owned by nobody else.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: sun is a valid sockaddr_un of `len` bytes. A unix connect
    // interrupted by a signal completes in the kernel or fails; retrying on
    // EINTR is what glibc callers do for AF_UNIX.
    retry_eintr(|| unsafe { libc::connect(fd, &sun as *const _ as *const libc::sockaddr, len) })?;
    Ok(owned)
}

/// Sets SO_RCVTIMEO and SO_SNDTIMEO so blocking calls give up with EAGAIN.
pub fn set_timeouts(sock: RawFd, timeout: Duration) -> io::Result<()> {
    let tv = libc::timeval {
        tv_sec: timeout.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_usec: timeout.subsec_micros() as libc::suseconds_t,
    };
    for opt in [libc::SO_RCVTIMEO, libc::SO_SNDTIMEO] {
        // SAFETY: tv is a valid timeval of the given size.
        let r = unsafe {
            libc::setsockopt(
                sock,
                libc::SOL_SOCKET,
                opt,
                &tv as *const libc::timeval as *const libc::c_void,
                mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    fn pair() -> (OwnedFd, OwnedFd) {
        let mut sv = [0; 2];
        // SAFETY: sv is a writable array of two ints.
        let r = unsafe {
            libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
                0,
                sv.as_mut_ptr(),
            )
        };
        assert_eq!(r, 0);
        // SAFETY: both fds were just created and are owned here only.
        unsafe { (OwnedFd::from_raw_fd(sv[0]), OwnedFd::from_raw_fd(sv[1])) }
    }

    #[test]
    fn cmsg_buffer_is_large_enough() {
        assert!(cmsg_space(MAX_FDS) <= CMSG_CAP);
    }

    #[test]
    fn frames_and_fds_travel_together() {
        let (a, b) = pair();
        let (rd, wr) = pipe();
        send_frame(
            a.as_raw_fd(),
            b"hello",
            &[wr.as_raw_fd(), wr.as_raw_fd()],
            0,
        )
        .unwrap();
        drop(wr);
        let mut buf = [0u8; 64];
        let (n, fds) = recv_frame(b.as_raw_fd(), &mut buf, 0).unwrap().unwrap();
        assert_eq!(&buf[..n], b"hello");
        assert_eq!(fds.len(), 2);
        for &fd in fds.as_raw() {
            // SAFETY: F_GETFD only queries the descriptor table.
            let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
            assert!(flags & libc::FD_CLOEXEC != 0);
        }
        assert!(!all_writers_closed(&rd));
        drop(fds);
        assert!(all_writers_closed(&rd));
    }

    #[test]
    fn oversized_datagram_closes_its_fds() {
        let (a, b) = pair();
        let (rd, wr) = pipe();
        send_frame(a.as_raw_fd(), &[0u8; 100], &[wr.as_raw_fd()], 0).unwrap();
        drop(wr);
        let mut buf = [0u8; 10];
        let r = recv_frame(b.as_raw_fd(), &mut buf, 0);
        assert!(matches!(r, Err(Error::Proto(ProtoError::Oversized))));
        assert!(all_writers_closed(&rd));
    }

    #[test]
    fn too_many_fds_are_cut_and_closed() {
        let (a, b) = pair();
        let (rd, wr) = pipe();
        // Bypass send_frame's check to play a hostile sender with 9 fds.
        let nine = [wr.as_raw_fd(); MAX_FDS + 1];
        let mut cbuf = [0u64; 16];
        let mut iov = libc::iovec {
            iov_base: b"x".as_ptr() as *mut libc::c_void,
            iov_len: 1,
        };
        // SAFETY: builds a valid msghdr with one SCM_RIGHTS header inside
        // cbuf (128 bytes, enough for 9 ints) and sends it.
        unsafe {
            let mut msg: libc::msghdr = mem::zeroed();
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = cbuf.as_mut_ptr() as *mut libc::c_void;
            msg.msg_controllen = cmsg_space(nine.len()) as _;
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(mem::size_of_val(&nine) as u32) as _;
            ptr::copy_nonoverlapping(
                nine.as_ptr() as *const u8,
                libc::CMSG_DATA(c),
                mem::size_of_val(&nine),
            );
            assert_eq!(libc::sendmsg(a.as_raw_fd(), &msg, 0), 1);
        }
        drop(wr);
        let mut buf = [0u8; 16];
        let r = recv_frame(b.as_raw_fd(), &mut buf, 0);
        assert!(matches!(r, Err(Error::Proto(ProtoError::FdsTruncated))));
        assert!(all_writers_closed(&rd));
    }

    #[test]
    fn eof_is_none() {
        let (a, b) = pair();
        drop(a);
        let mut buf = [0u8; 8];
        assert!(recv_frame(b.as_raw_fd(), &mut buf, 0).unwrap().is_none());
    }

    #[test]
    fn peer_cred_is_ours() {
        let (a, _b) = pair();
        let c = peer_cred(a.as_raw_fd()).unwrap();
        assert_eq!(c.pid, std::process::id());
    }

    #[test]
    fn unix_path_limits() {
        assert!(unix_addr(Path::new("/tmp/x.sock")).is_ok());
        let long = "/".to_string() + &"a".repeat(200);
        assert_eq!(
            unix_addr(Path::new(&long)).unwrap_err().raw_os_error(),
            Some(libc::ENAMETOOLONG)
        );
    }

    fn pipe() -> (OwnedFd, OwnedFd) {
        let mut p = [0; 2];
        // SAFETY: p is a writable array of two ints.
        let r = unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) };
        assert_eq!(r, 0);
        // SAFETY: both fds were just created and are owned here only.
        unsafe { (OwnedFd::from_raw_fd(p[0]), OwnedFd::from_raw_fd(p[1])) }
    }

    /// A pipe reads EOF only once every copy of its write end is closed:
    /// proof that no received copy leaked (unlike fd-number checks, immune
    /// to other tests opening descriptors concurrently).
    fn all_writers_closed(rd: &OwnedFd) -> bool {
        let mut b = [0u8; 1];
        // SAFETY: b is a writable 1-byte buffer.
        let n = unsafe { libc::read(rd.as_raw_fd(), b.as_mut_ptr() as *mut libc::c_void, 1) };
        n == 0
    }
}
