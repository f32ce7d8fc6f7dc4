//! The daemon's own system calls (the ones a shim never needs): epoll,
//! signalfd, the listening unix socket, the instance lock, rlimits and
//! detaching from the terminal. Thin, safe wrappers; policy lives elsewhere.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::mem;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::Duration;

use ringsock_proto::io::unix_addr;

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn owned(fd: RawFd) -> OwnedFd {
    // SAFETY: only called with descriptors just returned by the kernel,
    // owned by nobody else yet.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// An epoll instance; each registration carries a u64 token.
pub struct Epoll {
    fd: OwnedFd,
}

impl Epoll {
    pub fn new() -> io::Result<Epoll> {
        // SAFETY: plain epoll_create1.
        let fd = cvt(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })?;
        Ok(Epoll { fd: owned(fd) })
    }

    fn ctl(&self, op: i32, fd: RawFd, events: u32, token: u64) -> io::Result<()> {
        let mut ev = libc::epoll_event { events, u64: token };
        // SAFETY: ev is a valid epoll_event for the duration of the call.
        cvt(unsafe { libc::epoll_ctl(self.fd.as_raw_fd(), op, fd, &mut ev) })?;
        Ok(())
    }

    pub fn add(&self, fd: RawFd, events: u32, token: u64) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_ADD, fd, events, token)
    }

    pub fn modify(&self, fd: RawFd, events: u32, token: u64) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_MOD, fd, events, token)
    }

    pub fn delete(&self, fd: RawFd) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_DEL, fd, 0, 0)
    }

    /// Waits up to `timeout` (forever if None); EINTR is an empty wakeup.
    pub fn wait(
        &self,
        events: &mut [libc::epoll_event],
        timeout: Option<Duration>,
    ) -> io::Result<usize> {
        let ms = match timeout {
            None => -1,
            // Round up so a deadline 0.4 ms away does not spin at 0 ms.
            Some(t) => t.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32,
        };
        // SAFETY: events is a writable array of its stated length.
        let n = unsafe {
            libc::epoll_wait(
                self.fd.as_raw_fd(),
                events.as_mut_ptr(),
                events.len().min(i32::MAX as usize) as i32,
                ms,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                return Ok(0);
            }
            return Err(e);
        }
        Ok(n as usize)
    }
}

/// SIGTERM and SIGINT delivered as readable data instead of handlers, so
/// the single-threaded loop exits cleanly at a point of its choosing.
pub struct SignalFd {
    fd: OwnedFd,
}

/// Blocks `signals` for this thread (and the threads and children it
/// makes from now on); returns the set.
pub fn block_signals(signals: &[i32]) -> io::Result<libc::sigset_t> {
    // SAFETY: sigset_t is plain data, initialised by sigemptyset.
    let mut set: libc::sigset_t = unsafe { mem::zeroed() };
    // SAFETY: set is a valid sigset_t; the calls only edit it and the
    // thread's signal mask.
    unsafe {
        libc::sigemptyset(&mut set);
        for &s in signals {
            libc::sigaddset(&mut set, s);
        }
        cvt(libc::pthread_sigmask(
            libc::SIG_BLOCK,
            &set,
            std::ptr::null_mut(),
        ))?;
    }
    Ok(set)
}

impl SignalFd {
    /// Blocks the signals for this thread and opens a signalfd for them.
    pub fn new(signals: &[i32]) -> io::Result<SignalFd> {
        let set = block_signals(signals)?;
        // SAFETY: set is a valid sigset_t.
        let fd = cvt(unsafe { libc::signalfd(-1, &set, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK) })?;
        Ok(SignalFd { fd: owned(fd) })
    }

    pub fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// The next pending signal number, if any.
    pub fn read(&self) -> Option<u32> {
        // SAFETY: signalfd_siginfo is plain data.
        let mut info: libc::signalfd_siginfo = unsafe { mem::zeroed() };
        let size = mem::size_of::<libc::signalfd_siginfo>();
        // SAFETY: info is a writable buffer of `size` bytes.
        let n = unsafe {
            libc::read(
                self.fd.as_raw_fd(),
                &mut info as *mut _ as *mut libc::c_void,
                size,
            )
        };
        (n == size as isize).then_some(info.ssi_signo)
    }
}

/// A non-blocking SOCK_SEQPACKET listener bound to `path`, mode 0666 (any
/// local user may talk to the daemon; descriptor proofs protect rings).
/// It is bound, made 0666 and listening under `path` + ".new" first and
/// then renamed into place, so that nobody finds `path` before it takes
/// every user's connections (bind makes it by the umask, 0755 under 022).
/// The caller holds the instance lock, so the temporary name is ours.
pub fn listen_unix(path: &Path, backlog: i32) -> io::Result<OwnedFd> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".new");
    let tmp = std::path::PathBuf::from(tmp);
    if unix_addr(&tmp).is_err() {
        // No room in sun_path for the suffix: bind in place.
        return listen_at(path, backlog);
    }
    let _ = std::fs::remove_file(&tmp);
    let published = listen_at(&tmp, backlog).and_then(|fd| {
        std::fs::rename(&tmp, path)?;
        Ok(fd)
    });
    if published.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    published
}

/// `listen_unix` without the rename: bound, chmod 0666, listening.
fn listen_at(path: &Path, backlog: i32) -> io::Result<OwnedFd> {
    let (sun, len) = unix_addr(path)?;
    // SAFETY: plain socket(2).
    let fd = owned(cvt(unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    })?);
    // SAFETY: sun is a valid sockaddr_un of `len` bytes.
    cvt(unsafe {
        libc::bind(
            fd.as_raw_fd(),
            &sun as *const _ as *const libc::sockaddr,
            len,
        )
    })?;
    chmod(path, 0o666)?;
    // SAFETY: plain listen(2) on our socket.
    cvt(unsafe { libc::listen(fd.as_raw_fd(), backlog) })?;
    Ok(fd)
}

pub fn chmod(path: &Path, mode: libc::mode_t) -> io::Result<()> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: c is a valid NUL-terminated path.
    cvt(unsafe { libc::chmod(c.as_ptr(), mode) })?;
    Ok(())
}

/// Accepts one connection, non-blocking and close-on-exec.
pub fn accept(listener: RawFd) -> io::Result<OwnedFd> {
    loop {
        // SAFETY: accept4 with null address buffers is allowed.
        let r = unsafe {
            libc::accept4(
                listener,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            )
        };
        match cvt(r) {
            Ok(fd) => return Ok(owned(fd)),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Takes an exclusive, non-blocking flock on `file`. `Ok(false)`: another
/// process holds it.
pub fn try_lock(file: &File) -> io::Result<bool> {
    // SAFETY: plain flock(2) on an open file.
    match cvt(unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) }) {
        Ok(_) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Raises the soft RLIMIT_NOFILE to the hard limit (the daemon holds relayed
/// descriptors for many processes); returns the resulting soft limit.
pub fn raise_nofile_limit() -> u64 {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: rl is a writable rlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } != 0 {
        return 1024;
    }
    if rl.rlim_cur < rl.rlim_max {
        let want = libc::rlimit {
            rlim_cur: rl.rlim_max,
            rlim_max: rl.rlim_max,
        };
        // SAFETY: want is a valid rlimit.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &want) } == 0 {
            rl = want;
        }
    }
    rl.rlim_cur
}

/// The child's end of the start-up pipe of a detached daemon: it tells
/// the waiting parent whether start-up worked.
pub struct Readiness {
    fd: OwnedFd,
}

impl Readiness {
    fn send(self, bytes: &[u8]) {
        // SAFETY: bytes is a readable buffer; a short or failed write only
        // means the parent reports a generic failure.
        unsafe {
            libc::write(self.fd.as_raw_fd(), bytes.as_ptr().cast(), bytes.len());
        }
    }

    /// Start-up succeeded: the parent exits 0.
    pub fn ready(self) {
        self.send(&[0]);
    }

    /// Start-up failed: the parent prints `msg` and exits 1.
    pub fn failed(self, msg: &str) {
        self.send(msg.as_bytes());
    }
}

/// Leaves the foreground. Forks; the parent waits until the child reports
/// through a pipe, then exits 0 (started: the socket is already listening,
/// so `ringsock-ctl daemon && cmd` never races) or prints the child's error
/// and exits 1. The child starts a new session and returns its end of the
/// pipe. Forking before the socket exists matters: SO_PEERCRED of the
/// listening socket names the process that called listen().
/// Call it before any thread exists.
pub fn detach() -> io::Result<Readiness> {
    let mut p = [0; 2];
    // SAFETY: p is a writable array of two ints.
    cvt(unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) })?;
    let (rd, wr) = (owned(p[0]), owned(p[1]));
    // SAFETY: the process is single-threaded here, so fork is safe.
    let pid = cvt(unsafe { libc::fork() })?;
    if pid != 0 {
        drop(wr);
        let mut msg = Vec::new();
        let _ = io::Read::read_to_end(&mut File::from(rd), &mut msg);
        let code = match msg.as_slice() {
            [0] => 0,
            [] => {
                eprintln!("ringsock-ctl: the daemon exited during start-up");
                1
            }
            m => {
                eprintln!("ringsock-ctl: {}", String::from_utf8_lossy(m));
                1
            }
        };
        // SAFETY: _exit skips destructors and atexit handlers: everything
        // the parent holds belongs to the child now.
        unsafe { libc::_exit(code) }
    }
    drop(rd);
    // SAFETY: plain setsid in the child (never a group leader after fork).
    cvt(unsafe { libc::setsid() })?;
    Ok(Readiness { fd: wr })
}

/// Points stdin and stdout at /dev/null. stderr stays: it is the log.
pub fn quiet_stdio() -> io::Result<()> {
    let null = File::options().read(true).write(true).open("/dev/null")?;
    for target in [libc::STDIN_FILENO, libc::STDOUT_FILENO] {
        // SAFETY: dup2 onto the standard descriptors, which we own.
        cvt(unsafe { libc::dup2(null.as_raw_fd(), target) })?;
    }
    Ok(())
}

// ---- ctl-to-ctl TCP ----

fn set_int_opt(fd: RawFd, level: i32, name: i32, v: i32) -> io::Result<()> {
    // SAFETY: v is a readable c_int of the stated size.
    cvt(unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            &v as *const i32 as *const libc::c_void,
            mem::size_of::<i32>() as libc::socklen_t,
        )
    })?;
    Ok(())
}

fn tcp_socket(ipv6: bool) -> io::Result<OwnedFd> {
    let family = if ipv6 { libc::AF_INET6 } else { libc::AF_INET };
    // SAFETY: plain socket(2).
    Ok(owned(cvt(unsafe {
        libc::socket(
            family,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    })?))
}

/// A non-blocking TCP listener on every address of the host, `port`:
/// dual-stack `[::]` where IPv6 exists, `0.0.0.0` otherwise.
pub fn listen_tcp(port: u16, backlog: i32) -> io::Result<OwnedFd> {
    let try_bind = |any: SocketAddr| -> io::Result<OwnedFd> {
        let fd = tcp_socket(any.is_ipv6())?;
        set_int_opt(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_REUSEADDR, 1)?;
        if any.is_ipv6() {
            set_int_opt(fd.as_raw_fd(), libc::IPPROTO_IPV6, libc::IPV6_V6ONLY, 0)?;
        }
        let (st, len) = ringsock_proto::addr::to_raw(&any);
        // SAFETY: st is a valid socket address of `len` bytes.
        cvt(unsafe {
            libc::bind(
                fd.as_raw_fd(),
                &st as *const _ as *const libc::sockaddr,
                len,
            )
        })?;
        // SAFETY: plain listen(2) on our socket.
        cvt(unsafe { libc::listen(fd.as_raw_fd(), backlog) })?;
        Ok(fd)
    };
    match try_bind(SocketAddr::new(Ipv6Addr::UNSPECIFIED.into(), port)) {
        Err(e) if e.raw_os_error() == Some(libc::EAFNOSUPPORT) => {
            try_bind(SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), port))
        }
        r => r,
    }
}

/// Starts a non-blocking connect (TCP_NODELAY); completion shows as
/// writability, the result in [`so_error`].
pub fn connect_tcp(to: SocketAddr) -> io::Result<OwnedFd> {
    let fd = tcp_socket(to.is_ipv6())?;
    set_int_opt(fd.as_raw_fd(), libc::IPPROTO_TCP, libc::TCP_NODELAY, 1)?;
    let (st, len) = ringsock_proto::addr::to_raw(&to);
    // SAFETY: st is a valid socket address of `len` bytes.
    let r = unsafe {
        libc::connect(
            fd.as_raw_fd(),
            &st as *const _ as *const libc::sockaddr,
            len,
        )
    };
    if r < 0 {
        let e = io::Error::last_os_error();
        if !matches!(e.raw_os_error(), Some(libc::EINPROGRESS | libc::EINTR)) {
            return Err(e);
        }
    }
    Ok(fd)
}

/// The pending error of a socket (0: none), e.g. a finished connect's.
pub fn so_error(fd: RawFd) -> io::Result<i32> {
    ringsock_proto::io::sockopt_int(fd, libc::SOL_SOCKET, libc::SO_ERROR)
}

pub fn set_nodelay(fd: RawFd) -> io::Result<()> {
    set_int_opt(fd, libc::IPPROTO_TCP, libc::TCP_NODELAY, 1)
}

/// Non-blocking read; Ok(0) is end of stream.
pub fn read_some(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        // SAFETY: buf is a writable buffer of its length.
        let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Non-blocking write without SIGPIPE.
pub fn write_some(fd: RawFd, buf: &[u8]) -> io::Result<usize> {
    loop {
        // SAFETY: buf is a readable buffer of its length.
        let n = unsafe {
            libc::send(
                fd,
                buf.as_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// The name `ps` shows for process `pid`: /proc/PID/comm, which the
/// kernel sets from the file name a program was executed by (a symlink's
/// own name: redis-server, not the redis-check-rdb it points to) and a
/// thread may change (prctl). None once the process is gone.
pub fn process_name(pid: u32) -> Option<String> {
    let comm = std::fs::read(format!("/proc/{pid}/comm")).ok()?;
    let name = String::from_utf8_lossy(&comm);
    let name = name.strip_suffix('\n').unwrap_or(&name);
    (!name.is_empty()).then(|| name.to_owned())
}

/// Whether `ip` is an address of this host (in this network namespace):
/// binding a socket to it succeeds. EADDRNOTAVAIL means another host; any
/// other failure counts as local, so a doubt never sends an offer away.
pub fn is_local_ip(ip: IpAddr) -> bool {
    if ip.is_loopback() || ip.is_unspecified() {
        return true;
    }
    let family = if ip.is_ipv6() {
        libc::AF_INET6
    } else {
        libc::AF_INET
    };
    // SAFETY: plain socket(2).
    let Ok(fd) =
        cvt(unsafe { libc::socket(family, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) }).map(owned)
    else {
        return true;
    };
    let (st, len) = ringsock_proto::addr::to_raw(&SocketAddr::new(ip, 0));
    // SAFETY: st is a valid socket address of `len` bytes.
    let r = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            &st as *const _ as *const libc::sockaddr,
            len,
        )
    };
    r == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::EADDRNOTAVAIL)
}
