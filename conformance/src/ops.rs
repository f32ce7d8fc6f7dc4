//! Raw libc socket calls, each returning the observation line it makes
//! (`recv(5, 100, MSG_DONTWAIT) = -1 EAGAIN`) with its typed result.
//! Nothing here logs or waits by itself, so the calls can run on a probe
//! thread (see `probe`) and be logged by the role's main thread.
//!
//! Lines print what is comparable between two runs: return values, errno
//! names, masks by name, short data quoted and long data by fingerprint,
//! addresses through `addr::show`. Descriptor numbers are printed: the
//! kernel hands out the lowest free one, so they are the same in both
//! runs unless something took a number the program would have had.

use std::fmt;
use std::os::fd::RawFd;

use crate::{addr, names, obs};

/// The calling thread's errno.
pub fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// A call's return value, with its errno when it failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ret {
    pub v: i64,
    pub e: i32,
}

impl Ret {
    /// Reads errno now when `v` says the call failed.
    pub fn of(v: i64) -> Ret {
        Ret {
            v,
            e: if v < 0 { errno() } else { 0 },
        }
    }

    pub fn ok(&self) -> bool {
        self.v >= 0
    }

    /// The value as a count (0 on failure).
    pub fn n(&self) -> usize {
        self.v.max(0) as usize
    }
}

impl fmt::Display for Ret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.v < 0 {
            write!(f, "-1 {}", names::errno(self.e))
        } else {
            write!(f, "{}", self.v)
        }
    }
}

/// An observation line and the call's result.
pub type Obs<T> = (String, T);

fn sock_type(ty: i32) -> String {
    let base = match ty & 0xf {
        libc::SOCK_STREAM => "SOCK_STREAM".to_string(),
        libc::SOCK_DGRAM => "SOCK_DGRAM".to_string(),
        libc::SOCK_SEQPACKET => "SOCK_SEQPACKET".to_string(),
        n => format!("SOCK?{n}"),
    };
    let mut s = base;
    if ty & libc::SOCK_NONBLOCK != 0 {
        s.push_str("|SOCK_NONBLOCK");
    }
    if ty & libc::SOCK_CLOEXEC != 0 {
        s.push_str("|SOCK_CLOEXEC");
    }
    s
}

pub fn socket(domain: i32, ty: i32) -> Obs<Ret> {
    // SAFETY: plain system call.
    let r = Ret::of(i64::from(unsafe { libc::socket(domain, ty, 0) }));
    (
        format!("socket({}, {}) = {r}", names::family(domain), sock_type(ty)),
        r,
    )
}

/// An int-valued socket option.
pub fn setsockopt_int(fd: RawFd, level: i32, opt: i32, name: &str, val: i32) -> Obs<Ret> {
    // SAFETY: the value is an int of the length given.
    let r = Ret::of(i64::from(unsafe {
        libc::setsockopt(
            fd,
            level,
            opt,
            (&val as *const i32).cast(),
            std::mem::size_of::<i32>() as libc::socklen_t,
        )
    }));
    (format!("setsockopt({fd}, {name}, {val}) = {r}"), r)
}

/// An int-valued socket option: (result, value).
pub fn getsockopt_int(fd: RawFd, level: i32, opt: i32, name: &str) -> Obs<(Ret, i32)> {
    let mut val: i32 = -1;
    let mut len = std::mem::size_of::<i32>() as libc::socklen_t;
    // SAFETY: val and len are ours and sized as declared.
    let r = Ret::of(i64::from(unsafe {
        libc::getsockopt(fd, level, opt, (&mut val as *mut i32).cast(), &mut len)
    }));
    let line = if r.ok() {
        format!("getsockopt({fd}, {name}) = {r} val={val} len={len}")
    } else {
        format!("getsockopt({fd}, {name}) = {r}")
    };
    (line, (r, val))
}

/// SO_ERROR, with the pending error by name.
pub fn so_error(fd: RawFd) -> Obs<i32> {
    let mut val: i32 = -1;
    let mut len = std::mem::size_of::<i32>() as libc::socklen_t;
    // SAFETY: val and len are ours and sized as declared.
    let r = Ret::of(i64::from(unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_ERROR,
            (&mut val as *mut i32).cast(),
            &mut len,
        )
    }));
    let shown = if val == 0 {
        "0".to_string()
    } else {
        names::errno(val)
    };
    (format!("getsockopt({fd}, SO_ERROR) = {r} val={shown}"), val)
}

/// A struct-valued option (timeval, linger) set from raw bytes.
pub fn setsockopt_raw<T>(fd: RawFd, level: i32, opt: i32, name: &str, val: &T) -> Obs<Ret> {
    // SAFETY: `val` is a plain C struct of the length given.
    let r = Ret::of(i64::from(unsafe {
        libc::setsockopt(
            fd,
            level,
            opt,
            (val as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    }));
    (format!("setsockopt({fd}, {name}) = {r}"), r)
}

/// A timeval option (SO_RCVTIMEO, SO_SNDTIMEO) read back.
pub fn get_timeval(fd: RawFd, opt: i32, name: &str) -> Obs<Ret> {
    let mut tv = libc::timeval {
        tv_sec: -1,
        tv_usec: -1,
    };
    let mut len = std::mem::size_of::<libc::timeval>() as libc::socklen_t;
    // SAFETY: tv and len are ours and sized as declared.
    let r = Ret::of(i64::from(unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            opt,
            (&mut tv as *mut libc::timeval).cast(),
            &mut len,
        )
    }));
    (
        format!(
            "getsockopt({fd}, {name}) = {r} {}s {}us len={len}",
            tv.tv_sec, tv.tv_usec
        ),
        r,
    )
}

pub fn bind(fd: RawFd, sa: &(libc::sockaddr_storage, libc::socklen_t)) -> Obs<Ret> {
    // SAFETY: the address is initialised to the length given.
    let r = Ret::of(i64::from(unsafe {
        libc::bind(fd, (&sa.0 as *const libc::sockaddr_storage).cast(), sa.1)
    }));
    (format!("bind({fd}, {}) = {r}", addr::show(&sa.0, sa.1)), r)
}

pub fn listen(fd: RawFd, backlog: i32) -> Obs<Ret> {
    // SAFETY: plain system call.
    let r = Ret::of(i64::from(unsafe { libc::listen(fd, backlog) }));
    (format!("listen({fd}, {backlog}) = {r}"), r)
}

/// accept (flags None) or accept4; the line has the peer as returned.
pub fn accept(fd: RawFd, flags: Option<i32>) -> Obs<Ret> {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    let sa = (&mut ss as *mut libc::sockaddr_storage).cast();
    // SAFETY: ss and len are ours and sized as declared.
    let r = Ret::of(i64::from(unsafe {
        match flags {
            None => libc::accept(fd, sa, &mut len),
            Some(f) => libc::accept4(fd, sa, &mut len, f),
        }
    }));
    let call = match flags {
        None => format!("accept({fd})"),
        Some(f) => format!(
            "accept4({fd}, {})",
            names::bits(
                i64::from(f),
                &[
                    (libc::SOCK_NONBLOCK as i64, "SOCK_NONBLOCK"),
                    (libc::SOCK_CLOEXEC as i64, "SOCK_CLOEXEC"),
                ]
            )
        ),
    };
    let line = if r.ok() {
        format!("{call} = {r} {} len={len}", addr::show(&ss, len))
    } else {
        format!("{call} = {r}")
    };
    (line, r)
}

pub fn connect(fd: RawFd, sa: &(libc::sockaddr_storage, libc::socklen_t)) -> Obs<Ret> {
    // SAFETY: the address is initialised to the length given.
    let r = Ret::of(i64::from(unsafe {
        libc::connect(fd, (&sa.0 as *const libc::sockaddr_storage).cast(), sa.1)
    }));
    (
        format!("connect({fd}, {}) = {r}", addr::show(&sa.0, sa.1)),
        r,
    )
}

pub fn send(fd: RawFd, data: &[u8], flags: i32) -> Obs<Ret> {
    // SAFETY: sending from a live buffer of the length given.
    let r = Ret::of(unsafe { libc::send(fd, data.as_ptr().cast(), data.len(), flags) } as i64);
    (
        format!("send({fd}, {}, {}) = {r}", data.len(), names::msg(flags)),
        r,
    )
}

/// What a receive returned; prints the bytes it filled in.
pub struct Got {
    pub r: Ret,
    pub data: Vec<u8>,
}

impl fmt::Display for Got {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.r.v > 0 {
            write!(f, "{} {}", self.r, obs::show(&self.data))
        } else {
            write!(f, "{}", self.r)
        }
    }
}

fn got(r: Ret, mut buf: Vec<u8>) -> Got {
    buf.truncate(r.n().min(buf.len()));
    Got { r, data: buf }
}

pub fn recv(fd: RawFd, len: usize, flags: i32) -> Obs<Got> {
    let mut buf = vec![0u8; len];
    // SAFETY: receiving into a live buffer of the length given.
    let r = Ret::of(unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), len, flags) } as i64);
    let g = got(r, buf);
    (format!("recv({fd}, {len}, {}) = {g}", names::msg(flags)), g)
}

/// recvfrom with (or without) room for an address; prints what the
/// kernel said about the address (a connected TCP socket gives none).
pub fn recvfrom(fd: RawFd, len: usize, flags: i32, with_addr: bool) -> Obs<Got> {
    let mut buf = vec![0u8; len];
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut alen = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    let (sa, lp) = if with_addr {
        (
            (&mut ss as *mut libc::sockaddr_storage).cast(),
            &mut alen as *mut libc::socklen_t,
        )
    } else {
        (std::ptr::null_mut(), std::ptr::null_mut())
    };
    // SAFETY: buffers are ours and sized as declared (or null).
    let r =
        Ret::of(unsafe { libc::recvfrom(fd, buf.as_mut_ptr().cast(), len, flags, sa, lp) } as i64);
    let g = got(r, buf);
    let from = if with_addr {
        format!(" from={} addrlen={alen}", addr::show(&ss, alen))
    } else {
        String::new()
    };
    (
        format!(
            "recvfrom({fd}, {len}, {}, {}) = {g}{from}",
            names::msg(flags),
            if with_addr { "addr" } else { "null" }
        ),
        g,
    )
}

/// recvmsg into iovecs of the given sizes, with room for a name and 64
/// bytes of control data; prints what the kernel left in each.
pub fn recvmsg(fd: RawFd, sizes: &[usize], flags: i32) -> Obs<Got> {
    let mut bufs: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0u8; n]).collect();
    let mut iov: Vec<libc::iovec> = bufs
        .iter_mut()
        .map(|b| libc::iovec {
            iov_base: b.as_mut_ptr().cast(),
            iov_len: b.len(),
        })
        .collect();
    // SAFETY: all-zero is a valid sockaddr_storage and msghdr.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut ctl = [0u8; 64];
    // SAFETY: all-zero is a valid msghdr.
    let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
    m.msg_name = (&mut ss as *mut libc::sockaddr_storage).cast();
    m.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    m.msg_iov = iov.as_mut_ptr();
    m.msg_iovlen = iov.len();
    m.msg_control = ctl.as_mut_ptr().cast();
    m.msg_controllen = ctl.len();
    // SAFETY: every pointer in m is to our live buffers, sized as declared.
    let r = Ret::of(unsafe { libc::recvmsg(fd, &mut m, flags) } as i64);
    let (parts, all) = scatter(&bufs, r.n());
    let g = Got { r, data: all };
    (
        format!(
            "recvmsg({fd}, {sizes:?}, {}) = {}{parts} namelen={} controllen={} msg_flags={}",
            names::msg(flags),
            g.r,
            m.msg_namelen,
            m.msg_controllen,
            names::msg(m.msg_flags)
        ),
        g,
    )
}

/// How `n` received bytes fell into `bufs`: ` ["ab","c"]` (empty when
/// nothing came), and the bytes in one vector.
fn scatter(bufs: &[Vec<u8>], n: usize) -> (String, Vec<u8>) {
    if n == 0 {
        return (String::new(), Vec::new());
    }
    let mut left = n;
    let mut shown = Vec::new();
    let mut all = Vec::new();
    for b in bufs {
        let k = left.min(b.len());
        shown.push(obs::show(&b[..k]));
        all.extend_from_slice(&b[..k]);
        left -= k;
    }
    (format!(" [{}]", shown.join(",")), all)
}

fn iovecs(parts: &[&[u8]]) -> Vec<libc::iovec> {
    parts
        .iter()
        .map(|p| libc::iovec {
            iov_base: p.as_ptr() as *mut libc::c_void,
            iov_len: p.len(),
        })
        .collect()
}

pub fn sendmsg(fd: RawFd, parts: &[&[u8]], flags: i32) -> Obs<Ret> {
    let mut iov = iovecs(parts);
    // SAFETY: all-zero is a valid msghdr.
    let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
    m.msg_iov = iov.as_mut_ptr();
    m.msg_iovlen = iov.len();
    // SAFETY: the iovecs point at live buffers; the kernel only reads.
    let r = Ret::of(unsafe { libc::sendmsg(fd, &m, flags) } as i64);
    let sizes: Vec<usize> = parts.iter().map(|p| p.len()).collect();
    (
        format!("sendmsg({fd}, {sizes:?}, {}) = {r}", names::msg(flags)),
        r,
    )
}

pub fn writev(fd: RawFd, parts: &[&[u8]]) -> Obs<Ret> {
    let iov = iovecs(parts);
    // SAFETY: the iovecs point at live buffers; the kernel only reads.
    let r = Ret::of(unsafe { libc::writev(fd, iov.as_ptr(), iov.len() as i32) } as i64);
    let sizes: Vec<usize> = parts.iter().map(|p| p.len()).collect();
    (format!("writev({fd}, {sizes:?}) = {r}"), r)
}

pub fn readv(fd: RawFd, sizes: &[usize]) -> Obs<Got> {
    let mut bufs: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0u8; n]).collect();
    let iov: Vec<libc::iovec> = bufs
        .iter_mut()
        .map(|b| libc::iovec {
            iov_base: b.as_mut_ptr().cast(),
            iov_len: b.len(),
        })
        .collect();
    // SAFETY: the iovecs point at our live buffers, sized as declared.
    let r = Ret::of(unsafe { libc::readv(fd, iov.as_ptr(), iov.len() as i32) } as i64);
    let (parts, all) = scatter(&bufs, r.n());
    (
        format!("readv({fd}, {sizes:?}) = {r}{parts}"),
        Got { r, data: all },
    )
}

pub fn read(fd: RawFd, len: usize) -> Obs<Got> {
    let mut buf = vec![0u8; len];
    // SAFETY: reading into a live buffer of the length given.
    let r = Ret::of(unsafe { libc::read(fd, buf.as_mut_ptr().cast(), len) } as i64);
    let g = got(r, buf);
    (format!("read({fd}, {len}) = {g}"), g)
}

pub fn write(fd: RawFd, data: &[u8]) -> Obs<Ret> {
    // SAFETY: writing from a live buffer of the length given.
    let r = Ret::of(unsafe { libc::write(fd, data.as_ptr().cast(), data.len()) } as i64);
    (format!("write({fd}, {}) = {r}", data.len()), r)
}

pub fn shutdown(fd: RawFd, how: i32) -> Obs<Ret> {
    let name = match how {
        libc::SHUT_RD => "SHUT_RD",
        libc::SHUT_WR => "SHUT_WR",
        libc::SHUT_RDWR => "SHUT_RDWR",
        _ => "SHUT_?",
    };
    // SAFETY: plain system call.
    let r = Ret::of(i64::from(unsafe { libc::shutdown(fd, how) }));
    (format!("shutdown({fd}, {name}) = {r}"), r)
}

/// read(2) through libc's generic syscall(SYS_read, ...).
pub fn sys_read(fd: RawFd, len: usize) -> Obs<Got> {
    let mut buf = vec![0u8; len];
    // SAFETY: reading into a live buffer of the length given.
    let r = Ret::of(unsafe { libc::syscall(libc::SYS_read, fd, buf.as_mut_ptr(), len) });
    let g = got(r, buf);
    (format!("syscall(SYS_read, {fd}, {len}) = {g}"), g)
}

/// write(2) through libc's generic syscall(SYS_write, ...).
pub fn sys_write(fd: RawFd, data: &[u8]) -> Obs<Ret> {
    // SAFETY: writing from a live buffer of the length given.
    let r = Ret::of(unsafe { libc::syscall(libc::SYS_write, fd, data.as_ptr(), data.len()) });
    (format!("syscall(SYS_write, {fd}, {}) = {r}", data.len()), r)
}

/// close(2) through libc's generic syscall(SYS_close, ...), as libuv
/// closes descriptors.
pub fn sys_close(fd: RawFd) -> Obs<Ret> {
    // SAFETY: closing a descriptor the scenario owns.
    let r = Ret::of(unsafe { libc::syscall(libc::SYS_close, fd) });
    (format!("syscall(SYS_close, {fd}) = {r}"), r)
}

pub fn close(fd: RawFd) -> Obs<Ret> {
    // SAFETY: closing a descriptor the scenario owns.
    let r = Ret::of(i64::from(unsafe { libc::close(fd) }));
    (format!("close({fd}) = {r}"), r)
}

pub fn dup(fd: RawFd) -> Obs<Ret> {
    // SAFETY: plain system call.
    let r = Ret::of(i64::from(unsafe { libc::dup(fd) }));
    (format!("dup({fd}) = {r}"), r)
}

pub fn dup2(fd: RawFd, to: RawFd) -> Obs<Ret> {
    // SAFETY: `to` is a number the scenario chose for this.
    let r = Ret::of(i64::from(unsafe { libc::dup2(fd, to) }));
    (format!("dup2({fd}, {to}) = {r}"), r)
}

const O_FLAGS: &[(i64, &str)] = &[
    (libc::O_NONBLOCK as i64, "O_NONBLOCK"),
    (libc::O_APPEND as i64, "O_APPEND"),
    (libc::O_ASYNC as i64, "O_ASYNC"),
];

/// F_GETFL (status flags by name, access mode left out) or F_GETFD.
pub fn fcntl_get(fd: RawFd, cmd: i32) -> Obs<Ret> {
    // SAFETY: a query without argument.
    let r = Ret::of(i64::from(unsafe { libc::fcntl(fd, cmd) }));
    let (name, shown) = match cmd {
        libc::F_GETFL => ("F_GETFL", names::bits(r.v & !3, O_FLAGS)),
        libc::F_GETFD => ("F_GETFD", names::bits(r.v, &[(1, "FD_CLOEXEC")])),
        _ => ("F_?", r.v.to_string()),
    };
    let line = if r.ok() {
        format!("fcntl({fd}, {name}) = {shown}")
    } else {
        format!("fcntl({fd}, {name}) = {r}")
    };
    (line, r)
}

/// F_SETFL with O_NONBLOCK on or off (other status flags kept).
pub fn set_nonblock(fd: RawFd, on: bool) -> Obs<Ret> {
    // SAFETY: plain fcntl queries and updates on the scenario's fd.
    let r = unsafe {
        let fl = libc::fcntl(fd, libc::F_GETFL);
        let fl = if on {
            fl | libc::O_NONBLOCK
        } else {
            fl & !libc::O_NONBLOCK
        };
        Ret::of(i64::from(libc::fcntl(fd, libc::F_SETFL, fl)))
    };
    (
        format!(
            "fcntl({fd}, F_SETFL, {}O_NONBLOCK) = {r}",
            if on { "+" } else { "-" }
        ),
        r,
    )
}

pub fn fcntl_dupfd(fd: RawFd, min: RawFd, cloexec: bool) -> Obs<Ret> {
    let (cmd, name) = if cloexec {
        (libc::F_DUPFD_CLOEXEC, "F_DUPFD_CLOEXEC")
    } else {
        (libc::F_DUPFD, "F_DUPFD")
    };
    // SAFETY: plain fcntl on the scenario's fd.
    let r = Ret::of(i64::from(unsafe { libc::fcntl(fd, cmd, min) }));
    (format!("fcntl({fd}, {name}, {min}) = {r}"), r)
}

/// poll over (fd, events); returns each entry's revents.
pub fn poll(set: &[(RawFd, i16)], timeout_ms: i32) -> Obs<(Ret, Vec<i16>)> {
    let mut fds: Vec<libc::pollfd> = set
        .iter()
        .map(|&(fd, events)| libc::pollfd {
            fd,
            events,
            revents: 0,
        })
        .collect();
    // SAFETY: fds is a live array of the length given.
    let r = Ret::of(i64::from(unsafe {
        libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms)
    }));
    let asked: Vec<String> = set
        .iter()
        .map(|(fd, ev)| format!("{fd} {}", names::poll(*ev)))
        .collect();
    let got: Vec<String> = fds
        .iter()
        .map(|p| format!("{} {}", p.fd, names::poll(p.revents)))
        .collect();
    (
        format!(
            "poll([{}], {timeout_ms}) = {r} [{}]",
            asked.join(", "),
            got.join(", ")
        ),
        (r, fds.iter().map(|p| p.revents).collect()),
    )
}

/// The three sets of a select call, by descriptor.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Sets {
    pub r: Vec<RawFd>,
    pub w: Vec<RawFd>,
    pub e: Vec<RawFd>,
}

impl fmt::Display for Sets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "r={:?} w={:?} e={:?}", self.r, self.w, self.e)
    }
}

/// select with a timeout in ms (None: wait forever); returns the sets
/// the kernel left.
pub fn select(sets: &Sets, timeout_ms: Option<i64>) -> Obs<(Ret, Sets)> {
    fn fill(fds: &[RawFd]) -> libc::fd_set {
        // SAFETY: FD_ZERO/FD_SET on our own set with small fd numbers.
        unsafe {
            let mut s: libc::fd_set = std::mem::zeroed();
            libc::FD_ZERO(&mut s);
            for &fd in fds {
                libc::FD_SET(fd, &mut s);
            }
            s
        }
    }
    fn left(s: &libc::fd_set, fds: &[RawFd]) -> Vec<RawFd> {
        // SAFETY: FD_ISSET reads our own set.
        fds.iter()
            .copied()
            .filter(|&fd| unsafe { libc::FD_ISSET(fd, s) })
            .collect()
    }
    let (mut r, mut w, mut e) = (fill(&sets.r), fill(&sets.w), fill(&sets.e));
    let nfds = sets
        .r
        .iter()
        .chain(&sets.w)
        .chain(&sets.e)
        .max()
        .map_or(0, |m| m + 1);
    let mut tv = timeout_ms.map(|ms| libc::timeval {
        tv_sec: ms / 1000,
        tv_usec: (ms % 1000) * 1000,
    });
    let tvp = tv
        .as_mut()
        .map_or(std::ptr::null_mut(), |t| t as *mut libc::timeval);
    // SAFETY: the sets and timeval are ours; nfds bounds the fds in them.
    let ret = Ret::of(i64::from(unsafe {
        libc::select(nfds, &mut r, &mut w, &mut e, tvp)
    }));
    let out = if ret.ok() {
        Sets {
            r: left(&r, &sets.r),
            w: left(&w, &sets.w),
            e: left(&e, &sets.e),
        }
    } else {
        Sets::default()
    };
    let t = timeout_ms.map_or("inf".to_string(), |ms| format!("{ms}ms"));
    (format!("select({sets}, {t}) = {ret} {out}"), (ret, out))
}

pub fn epoll_create() -> Obs<Ret> {
    // SAFETY: plain system call.
    let r = Ret::of(i64::from(unsafe {
        libc::epoll_create1(libc::EPOLL_CLOEXEC)
    }));
    (format!("epoll_create1(EPOLL_CLOEXEC) = {r}"), r)
}

/// epoll_ctl with the fd itself as the event data.
pub fn epoll_ctl(ep: RawFd, op: i32, fd: RawFd, events: u32) -> Obs<Ret> {
    let name = match op {
        libc::EPOLL_CTL_ADD => "ADD",
        libc::EPOLL_CTL_MOD => "MOD",
        libc::EPOLL_CTL_DEL => "DEL",
        _ => "?",
    };
    let mut ev = libc::epoll_event {
        events,
        u64: fd as u64,
    };
    // SAFETY: ev is ours; the kernel copies it.
    let r = Ret::of(i64::from(unsafe { libc::epoll_ctl(ep, op, fd, &mut ev) }));
    (
        format!(
            "epoll_ctl({ep}, {name}, {fd}, {}) = {r}",
            names::epoll(events)
        ),
        r,
    )
}

/// epoll_wait; returns (data, events) pairs (data = the fd).
pub fn epoll_wait(ep: RawFd, max: usize, timeout_ms: i32) -> Obs<(Ret, Vec<(u64, u32)>)> {
    let mut evs = vec![libc::epoll_event { events: 0, u64: 0 }; max];
    // SAFETY: evs is a live array of `max` events.
    let r = Ret::of(i64::from(unsafe {
        libc::epoll_wait(ep, evs.as_mut_ptr(), max as i32, timeout_ms)
    }));
    let got: Vec<(u64, u32)> = evs[..r.n()].iter().map(|e| (e.u64, e.events)).collect();
    let shown: Vec<String> = got
        .iter()
        .map(|(d, e)| format!("{d} {}", names::epoll(*e)))
        .collect();
    (
        format!(
            "epoll_wait({ep}, {max}, {timeout_ms}) = {r} [{}]",
            shown.join(", ")
        ),
        (r, got),
    )
}

/// Socket ioctls the libc crate does not name (linux/sockios.h,
/// asm-generic/sockios.h).
pub const SIOCINQ: libc::Ioctl = libc::FIONREAD;
pub const SIOCOUTQ: libc::Ioctl = libc::TIOCOUTQ;
pub const SIOCATMARK: libc::Ioctl = 0x8905;

/// An ioctl that fills an int (FIONREAD, SIOCATMARK, SIOCOUTQ, ...).
pub fn ioctl_int(fd: RawFd, req: libc::Ioctl, name: &str) -> Obs<(Ret, i32)> {
    let mut v: i32 = -1;
    // SAFETY: the request fills one int, which v is.
    let r = Ret::of(i64::from(unsafe {
        libc::ioctl(fd, req, &mut v as *mut i32)
    }));
    let line = if r.ok() {
        format!("ioctl({fd}, {name}) = {r} val={v}")
    } else {
        format!("ioctl({fd}, {name}) = {r}")
    };
    (line, (r, v))
}

/// getsockname (peer false) or getpeername (peer true): the address as
/// printed, which the roles also compare with each other.
pub fn name(fd: RawFd, peer: bool) -> Obs<(Ret, String)> {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    let sa = (&mut ss as *mut libc::sockaddr_storage).cast();
    // SAFETY: ss and len are ours and sized as declared.
    let r = Ret::of(i64::from(unsafe {
        if peer {
            libc::getpeername(fd, sa, &mut len)
        } else {
            libc::getsockname(fd, sa, &mut len)
        }
    }));
    let call = if peer { "getpeername" } else { "getsockname" };
    if r.ok() {
        let a = addr::show(&ss, len);
        (format!("{call}({fd}) = {r} {a} len={len}"), (r, a))
    } else {
        (format!("{call}({fd}) = {r}"), (r, String::new()))
    }
}

/// sendfile from `file` at `offset` (None: the file position).
pub fn sendfile(out: RawFd, file: RawFd, offset: Option<i64>, count: usize) -> Obs<Ret> {
    let mut off = offset.unwrap_or(0) as libc::off_t;
    let offp = if offset.is_some() {
        &mut off as *mut libc::off_t
    } else {
        std::ptr::null_mut()
    };
    // SAFETY: offp is null or our own off_t.
    let r = Ret::of(unsafe { libc::sendfile(out, file, offp, count) } as i64);
    let shown = match offset {
        Some(o) => format!("off {o}->{off}"),
        None => "off=null".into(),
    };
    (
        format!("sendfile({out}, {file}, {shown}, {count}) = {r}"),
        r,
    )
}

/// Sends all of `n` seeded bytes (`role::payload`) in blocking sends; one
/// line for the whole, since how the kernel splits it is its business.
pub fn send_all(fd: RawFd, n: usize, seed: u64, flags: i32) -> Obs<usize> {
    let data = crate::role::payload(n, seed);
    let mut off = 0;
    let mut end = String::new();
    while off < n {
        // SAFETY: sending from a live buffer within its bounds.
        let r =
            Ret::of(unsafe { libc::send(fd, data[off..].as_ptr().cast(), n - off, flags) } as i64);
        if !r.ok() {
            end = format!(" then {r}");
            break;
        }
        off += r.n();
    }
    (
        format!("send_all({fd}, {n}, {}) = {off}{end}", names::msg(flags)),
        off,
    )
}

/// Receives until `n` bytes, end of stream or an error; one line with
/// the count, the fingerprint and how it ended.
pub fn recv_all(fd: RawFd, n: usize) -> Obs<Vec<u8>> {
    let mut data = Vec::new();
    let mut buf = vec![0u8; n.min(1 << 20)];
    let mut end = String::new();
    while data.len() < n {
        let want = (n - data.len()).min(buf.len());
        // SAFETY: receiving into a live buffer within its bounds.
        let r = Ret::of(unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), want, 0) } as i64);
        if r.v == 0 {
            end = " then EOF".into();
            break;
        }
        if !r.ok() {
            end = format!(" then {r}");
            break;
        }
        data.extend_from_slice(&buf[..r.n()]);
    }
    (
        format!(
            "recv_all({fd}, {n}) = {} {}{end}",
            data.len(),
            obs::show(&data)
        ),
        data,
    )
}

/// Reads and drops everything until end of stream or an error; the line
/// says only how it ended (how much came is the sender's buffer sizes).
pub fn drain(fd: RawFd) -> Obs<()> {
    let mut buf = vec![0u8; 1 << 16];
    loop {
        // SAFETY: receiving into a live buffer of its length.
        let r = Ret::of(unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), 0) } as i64);
        if r.v == 0 {
            return (format!("drain({fd}) until EOF"), ());
        }
        if !r.ok() {
            return (format!("drain({fd}) until {r}"), ());
        }
    }
}
