//! intruder: a hostile local process for tests/tests/hostile_local.rs. It
//! tries every way we know to reach other processes' rings and offers, and
//! reports each attempt on stdout:
//!
//! ```text
//! intruder [--pid P]... [--fd P:N]... [--map P:START-END]...
//!          [--ctl SOCKET] [--server IP:PORT] [--client IP:PORT]
//!          [--victim-fd N] [--offer-ids K]
//! ```
//!
//! * `--pid`: /proc/P/fd and /proc/P/map_files listings, /proc/P/mem,
//!   ptrace(PTRACE_SEIZE);
//! * `--fd P:N`: open /proc/P/fd/N read-only and read-write, readlink it,
//!   pidfd_getfd(P, N);
//! * `--map P:START-END`: open /proc/P/map_files/START-END, and
//!   process_vm_readv of its first bytes;
//! * always: every /dev/shm entry whose name mentions ringsock, read-write;
//! * `--ctl`: talks to the daemon with hand-made frames (no ringsock code):
//!   Hello and Status (open to any local user by the daemon's policy), then
//!   claims with a forged proof (a UDP socket bound to `--server` and
//!   connected to `--client`: the very 4-tuple of the victims' TCP
//!   connection), with its own accepted TCP socket, with a listening
//!   socket, an eventfd and a memfd; Collect, Cancel, Decline and Answer for
//!   offer ids 1..=K; an Offer for the victim client's 4-tuple with its own
//!   socket as proof; ListenerRemove of `--server`; ConnClosed of the
//!   victims' connection (`--victim-fd`, both orders of the 4-tuple).
//!
//! Each attempt prints one line: `denied WHAT: WHY` (the attempt failed),
//! `open WHAT: WHAT IT GOT` (allowed by policy: the daemon's socket, Hello,
//! Status, pidfd_open), or `BREACH WHAT: WHAT IT GOT`. Ctl replies are also
//! printed as `reply WHAT KIND [CODE]`. The last line is `intruder: uid U
//! attempts A denied D open O breaches B`; exit status 1 when B > 0, 2 on a
//! usage error.

use std::ffi::CString;
use std::io::Error;
use std::net::{SocketAddr, SocketAddrV4};
use std::os::fd::RawFd;

const PROTO_VERSION: u16 = 1;
const HELLO: u16 = 0x0001;
const LISTENER_REMOVE: u16 = 0x0003;
const OFFER: u16 = 0x0004;
const CLAIM: u16 = 0x0005;
const ANSWER: u16 = 0x0006;
const DECLINE: u16 = 0x0007;
const COLLECT: u16 = 0x0008;
const CANCEL: u16 = 0x0009;
const CONN_CLOSED: u16 = 0x000b;
const STATUS: u16 = 0x000c;

#[derive(Default)]
struct Tally {
    attempts: u32,
    denied: u32,
    open: u32,
    breaches: u32,
}

impl Tally {
    fn denied(&mut self, what: &str, why: impl std::fmt::Display) {
        self.attempts += 1;
        self.denied += 1;
        println!("denied {what}: {why}");
    }
    fn open(&mut self, what: &str, got: impl std::fmt::Display) {
        self.attempts += 1;
        self.open += 1;
        println!("open {what}: {got}");
    }
    fn breach(&mut self, what: &str, got: impl std::fmt::Display) {
        self.attempts += 1;
        self.breaches += 1;
        println!("BREACH {what}: {got}");
    }
}

fn errno() -> Error {
    Error::last_os_error()
}

fn cstr(s: &str) -> CString {
    CString::new(s).expect("no NUL in paths")
}

fn close(fd: RawFd) {
    // SAFETY: closing a descriptor this process opened.
    unsafe { libc::close(fd) };
}

/// open(2) of `path`; a success is a breach.
fn try_open(t: &mut Tally, path: &str, flags: i32) {
    let what = format!(
        "open {path} {}",
        if flags & libc::O_RDWR != 0 {
            "rdwr"
        } else {
            "rdonly"
        }
    );
    let c = cstr(path);
    // SAFETY: c is a valid NUL-terminated path.
    let fd = unsafe { libc::open(c.as_ptr(), flags | libc::O_CLOEXEC) };
    if fd < 0 {
        t.denied(&what, errno());
    } else {
        // Prove it: read a byte of whatever it is.
        let mut b = [0u8; 1];
        // SAFETY: reading into a 1-byte buffer.
        let n = unsafe { libc::read(fd, b.as_mut_ptr().cast(), 1) };
        close(fd);
        t.breach(&what, format!("opened (read returned {n})"));
    }
}

/// Lists a /proc directory; a listing is a breach.
fn try_list(t: &mut Tally, path: &str) {
    match std::fs::read_dir(path) {
        Ok(d) => {
            let n = d.count();
            t.breach(&format!("list {path}"), format!("{n} entries"));
        }
        Err(e) => t.denied(&format!("list {path}"), e),
    }
}

fn proc_attacks(t: &mut Tally, pid: i32) {
    try_list(t, &format!("/proc/{pid}/fd"));
    try_list(t, &format!("/proc/{pid}/map_files"));
    try_open(t, &format!("/proc/{pid}/mem"), libc::O_RDONLY);
    try_open(t, &format!("/proc/{pid}/maps"), libc::O_RDONLY);
    // SAFETY: PTRACE_SEIZE takes no pointers.
    let r = unsafe {
        libc::ptrace(
            libc::PTRACE_SEIZE,
            pid,
            std::ptr::null_mut::<libc::c_void>(),
            std::ptr::null_mut::<libc::c_void>(),
        )
    };
    let what = format!("ptrace seize {pid}");
    if r == 0 {
        // SAFETY: detaching what we just seized.
        unsafe {
            libc::ptrace(
                libc::PTRACE_DETACH,
                pid,
                std::ptr::null_mut::<libc::c_void>(),
                std::ptr::null_mut::<libc::c_void>(),
            )
        };
        t.breach(&what, "attached");
    } else {
        t.denied(&what, errno());
    }
}

fn fd_attacks(t: &mut Tally, pid: i32, fd: i32) {
    let path = format!("/proc/{pid}/fd/{fd}");
    try_open(t, &path, libc::O_RDONLY);
    try_open(t, &path, libc::O_RDWR);
    match std::fs::read_link(&path) {
        Ok(target) => t.breach(&format!("readlink {path}"), format!("{}", target.display())),
        Err(e) => t.denied(&format!("readlink {path}"), e),
    }
    // SAFETY: pidfd_open takes a pid and flags.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as i32;
    if pidfd < 0 {
        t.denied(&format!("pidfd_open {pid}"), errno());
        return;
    }
    // Anyone may hold a pidfd (it only names the process).
    t.open(
        &format!("pidfd_open {pid}"),
        "a pidfd (names the process only)",
    );
    // SAFETY: pidfd_getfd on a pidfd we hold.
    let got = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd, fd, 0) } as i32;
    let what = format!("pidfd_getfd {pid} {fd}");
    if got >= 0 {
        close(got);
        t.breach(&what, format!("got descriptor {got}"));
    } else {
        t.denied(&what, errno());
    }
    close(pidfd);
}

fn map_attacks(t: &mut Tally, pid: i32, range: &str) {
    try_open(t, &format!("/proc/{pid}/map_files/{range}"), libc::O_RDONLY);
    try_open(t, &format!("/proc/{pid}/map_files/{range}"), libc::O_RDWR);
    let start = range
        .split('-')
        .next()
        .and_then(|s| u64::from_str_radix(s, 16).ok())
        .unwrap_or_else(|| usage());
    let mut buf = [0u8; 64];
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let remote = libc::iovec {
        iov_base: start as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: one local iovec over our buffer; the remote one is only
    // interpreted by the kernel in the other process.
    let n = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
    let what = format!("process_vm_readv {pid} {start:#x}");
    if n > 0 {
        t.breach(&what, format!("read {n} bytes"));
    } else {
        t.denied(&what, errno());
    }
}

fn dev_shm(t: &mut Tally) {
    let Ok(dir) = std::fs::read_dir("/dev/shm") else {
        return;
    };
    for e in dir.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.contains("ringsock") {
            try_open(t, &format!("/dev/shm/{name}"), libc::O_RDWR);
        }
    }
}

// ---- the daemon, by hand ----

fn frame(kind: u16, body: &[u8]) -> Vec<u8> {
    let mut f = ((body.len() + 4) as u32).to_le_bytes().to_vec();
    f.extend_from_slice(&PROTO_VERSION.to_le_bytes());
    f.extend_from_slice(&kind.to_le_bytes());
    f.extend_from_slice(body);
    f
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u32).to_le_bytes());
    out.extend_from_slice(b);
}

fn put_addr(out: &mut Vec<u8>, a: SocketAddrV4) {
    out.push(4);
    out.extend_from_slice(&a.ip().octets());
    out.extend_from_slice(&a.port().to_le_bytes());
}

struct Session {
    fd: RawFd,
}

impl Drop for Session {
    fn drop(&mut self) {
        close(self.fd);
    }
}

fn connect_ctl(path: &str) -> Result<Session, Error> {
    // SAFETY: plain socket(2).
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(errno());
    }
    let s = Session { fd };
    // SAFETY: sockaddr_un is plain data.
    let mut sun: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    sun.sun_family = libc::AF_UNIX as libc::sa_family_t;
    if path.len() >= sun.sun_path.len() {
        return Err(Error::from_raw_os_error(libc::ENAMETOOLONG));
    }
    for (d, b) in sun.sun_path.iter_mut().zip(path.bytes()) {
        *d = b as libc::c_char;
    }
    // SAFETY: sun is a valid sockaddr_un.
    let r = unsafe {
        libc::connect(
            fd,
            &sun as *const _ as *const libc::sockaddr,
            std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(errno());
    }
    let tv = libc::timeval {
        tv_sec: 5,
        tv_usec: 0,
    };
    // SAFETY: setting a receive timeout from a timeval.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            &tv as *const _ as *const libc::c_void,
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    Ok(s)
}

/// A reply: its kind, the error code when it is an Error, its text, and how
/// many descriptors came with it (closed at once).
struct Reply {
    kind: u16,
    code: u16,
    text: String,
    fds: usize,
}

impl Reply {
    fn name(&self) -> String {
        let n = match self.kind {
            0x8001 => "HelloOk",
            0x8002 => "Ok",
            0x8003 => "Error",
            0x8004 => "OfferOk",
            0x8005 => "OfferRefused",
            0x8006 => "ClaimOk",
            0x8007 => "NoOffer",
            0x8008 => "Pending",
            0x8009 => "Answered",
            0x800a => "Declined",
            0x800b => "Expired",
            0x800c => "StatusReply",
            0 => "closed",
            _ => "unknown",
        };
        if self.kind == 0x8003 {
            let code = match self.code {
                1 => "bad-request",
                2 => "not-found",
                3 => "not-owner",
                4 => "bad-proof",
                5 => "limit",
                6 => "bad-state",
                _ => "?",
            };
            format!("Error {code} ({})", self.text)
        } else {
            n.to_string()
        }
    }
}

/// Sends one request with `fds` and reads its reply.
fn call(s: &Session, kind: u16, body: &[u8], fds: &[RawFd]) -> Result<Reply, Error> {
    let f = frame(kind, body);
    let mut iov = libc::iovec {
        iov_base: f.as_ptr() as *mut libc::c_void,
        iov_len: f.len(),
    };
    let mut cbuf = [0u64; 16];
    // SAFETY: msghdr is plain data.
    let mut mh: libc::msghdr = unsafe { std::mem::zeroed() };
    mh.msg_iov = &mut iov;
    mh.msg_iovlen = 1;
    if !fds.is_empty() {
        let bytes = std::mem::size_of_val(fds);
        // SAFETY: CMSG_SPACE is a pure computation.
        let space = unsafe { libc::CMSG_SPACE(bytes as u32) } as usize;
        mh.msg_control = cbuf.as_mut_ptr().cast();
        mh.msg_controllen = space;
        // SAFETY: the control buffer is larger than `space`; CMSG_FIRSTHDR
        // points into it.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&mh);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(bytes as u32) as usize;
            std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(c).cast(), fds.len());
        }
    }
    // SAFETY: mh points at live buffers.
    if unsafe { libc::sendmsg(s.fd, &mh, libc::MSG_NOSIGNAL) } < 0 {
        return Err(errno());
    }
    let mut buf = vec![0u8; 70_000];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: as above, for receiving.
    let mut mh: libc::msghdr = unsafe { std::mem::zeroed() };
    mh.msg_iov = &mut iov;
    mh.msg_iovlen = 1;
    mh.msg_control = cbuf.as_mut_ptr().cast();
    mh.msg_controllen = std::mem::size_of_val(&cbuf);
    // SAFETY: mh points at live buffers.
    let n = unsafe { libc::recvmsg(s.fd, &mut mh, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(errno());
    }
    let mut got = 0;
    // SAFETY: walking the control messages the kernel wrote into cbuf.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&mh);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c) as *const RawFd;
                let k = ((*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize) / 4;
                for i in 0..k {
                    close(*data.add(i));
                    got += 1;
                }
            }
            c = libc::CMSG_NXTHDR(&mh, c);
        }
    }
    let n = n as usize;
    if n < 8 {
        return Ok(Reply {
            kind: 0,
            code: 0,
            text: String::new(),
            fds: got,
        });
    }
    let kind = u16::from_le_bytes([buf[6], buf[7]]);
    let (mut code, mut text) = (0, String::new());
    if kind == 0x8003 && n >= 14 {
        code = u16::from_le_bytes([buf[8], buf[9]]);
        let len = u32::from_le_bytes([buf[10], buf[11], buf[12], buf[13]]) as usize;
        text = String::from_utf8_lossy(&buf[14..(14 + len).min(n)]).into_owned();
    }
    Ok(Reply {
        kind,
        code,
        text,
        fds: got,
    })
}

/// One request whose every acceptable answer is a refusal: `ok` lists the
/// reply kinds that count as refused (Errors always do).
fn attempt(
    t: &mut Tally,
    s: &Session,
    what: &str,
    kind: u16,
    body: &[u8],
    fds: &[RawFd],
    refusals: &[u16],
) {
    match call(s, kind, body, fds) {
        Ok(r) => {
            println!("reply {what} {}", r.name());
            if r.kind == 0x8003 || refusals.contains(&r.kind) {
                t.denied(what, r.name());
            } else if r.kind == 0 {
                t.denied(what, "session closed by the daemon");
            } else {
                t.breach(what, format!("{} with {} descriptor(s)", r.name(), r.fds));
            }
        }
        Err(e) => t.denied(what, format!("session failed: {e}")),
    }
}

fn v4(a: SocketAddr) -> SocketAddrV4 {
    match a {
        SocketAddr::V4(a) => a,
        SocketAddr::V6(_) => usage(),
    }
}

fn sockaddr(a: SocketAddrV4) -> libc::sockaddr_in {
    // SAFETY: sockaddr_in is plain data.
    let mut sin: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    sin.sin_family = libc::AF_INET as libc::sa_family_t;
    sin.sin_port = a.port().to_be();
    sin.sin_addr.s_addr = u32::from(*a.ip()).to_be();
    sin
}

/// A TCP connection of our own from `client` to `server`, accepted by a
/// listener of our own: the victims' very 4-tuple, which only another
/// network namespace than theirs lets us bind. Returns the accepted end
/// and the two others (kept open while it is tried).
fn own_tcp_tuple(
    server: SocketAddrV4,
    client: SocketAddrV4,
) -> Result<[std::os::fd::OwnedFd; 3], Error> {
    use std::os::fd::{FromRawFd, OwnedFd};
    let l = std::net::TcpListener::bind(server)?;
    // SAFETY: plain socket/bind/connect on our own descriptor, owned at
    // once so every path closes it.
    let c = unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(errno());
        }
        let c = OwnedFd::from_raw_fd(fd);
        let (ca, sa) = (sockaddr(client), sockaddr(server));
        let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        if libc::bind(fd, &ca as *const _ as *const libc::sockaddr, len) < 0
            || libc::connect(fd, &sa as *const _ as *const libc::sockaddr, len) < 0
        {
            return Err(errno());
        }
        c
    };
    let (acc, _) = l.accept()?;
    Ok([OwnedFd::from(acc), c, OwnedFd::from(l)])
}

/// A UDP socket whose getsockname/getpeername are exactly (`local`,
/// `peer`): the victims' 4-tuple, without owning their TCP socket.
fn forged_udp(local: SocketAddrV4, peer: SocketAddrV4) -> Result<RawFd, Error> {
    // SAFETY: plain socket/bind/connect on our own descriptor.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(errno());
        }
        let (l, p) = (sockaddr(local), sockaddr(peer));
        let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        if libc::bind(fd, &l as *const _ as *const libc::sockaddr, len) < 0
            || libc::connect(fd, &p as *const _ as *const libc::sockaddr, len) < 0
        {
            let e = errno();
            close(fd);
            return Err(e);
        }
        Ok(fd)
    }
}

fn ctl_attacks(t: &mut Tally, o: &Opts) {
    let path = o.ctl.as_deref().expect("--ctl");
    let s = match connect_ctl(path) {
        Ok(s) => {
            t.open(&format!("connect {path}"), "connected");
            s
        }
        Err(e) => {
            // A stricter policy than today's: nothing more to try.
            t.denied(&format!("connect {path}"), e);
            return;
        }
    };
    let mut hello = std::process::id().to_le_bytes().to_vec();
    put_bytes(&mut hello, b"intruder");
    match call(&s, HELLO, &hello, &[]) {
        Ok(r) if r.kind == 0x8001 => t.open("hello", r.name()),
        Ok(r) => {
            t.denied("hello", r.name());
            return;
        }
        Err(e) => {
            t.denied("hello", e);
            return;
        }
    }
    match call(&s, STATUS, &[0], &[]) {
        Ok(r) => t.open("status", r.name()),
        Err(e) => t.denied("status", e),
    }

    // Claims: a forged proof carrying the victims' exact 4-tuple.
    if let (Some(server), Some(client)) = (o.server, o.client) {
        match forged_udp(server, client) {
            Ok(fd) => {
                attempt(
                    t,
                    &s,
                    "claim with a forged udp proof",
                    CLAIM,
                    &[],
                    &[fd],
                    &[0x8007],
                );
                close(fd);
            }
            Err(e) => println!("note: cannot forge a udp proof: {e}"),
        }
        // The victims' 4-tuple on a real TCP connection of ours: where the
        // addresses are free (another network namespace).
        match own_tcp_tuple(server, client) {
            Ok(fds) => {
                use std::os::fd::AsRawFd;
                attempt(
                    t,
                    &s,
                    "claim with our own connection of their 4-tuple",
                    CLAIM,
                    &[],
                    &[fds[0].as_raw_fd()],
                    &[0x8007],
                );
            }
            Err(e) => println!("note: cannot make a connection of their 4-tuple: {e}"),
        }
        // Our own TCP connection: a real accepted socket, not theirs.
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("listener");
        let _c = std::net::TcpStream::connect(l.local_addr().unwrap()).expect("connect");
        let (acc, _) = l.accept().expect("accept");
        use std::os::fd::AsRawFd;
        attempt(
            t,
            &s,
            "claim with our own accepted socket",
            CLAIM,
            &[],
            &[acc.as_raw_fd()],
            &[0x8007],
        );
        attempt(
            t,
            &s,
            "claim with a listening socket",
            CLAIM,
            &[],
            &[l.as_raw_fd()],
            &[0x8007],
        );
        // An offer for the victim client's 4-tuple, proven with our socket.
        let mut body = Vec::new();
        put_addr(&mut body, client);
        put_addr(&mut body, server);
        put_bytes(&mut body, b"hijack");
        attempt(
            t,
            &s,
            "offer for the victim client's address",
            OFFER,
            &body,
            &[acc.as_raw_fd()],
            &[0x8005],
        );
        let mut body = Vec::new();
        put_addr(&mut body, server);
        attempt(
            t,
            &s,
            "listener-remove of the victim server",
            LISTENER_REMOVE,
            &body,
            &[],
            &[],
        );
        if let Some(vfd) = o.victim_fd {
            for (a, b) in [(client, server), (server, client)] {
                let mut body = vfd.to_le_bytes().to_vec();
                put_addr(&mut body, a);
                put_addr(&mut body, b);
                attempt(
                    t,
                    &s,
                    &format!("conn-closed of the victims' fd {vfd} {a} -> {b}"),
                    CONN_CLOSED,
                    &body,
                    &[],
                    &[],
                );
            }
        }
    }
    // SAFETY: eventfd makes a fresh descriptor of our own.
    let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    // SAFETY: so does memfd_create, from a NUL-terminated name.
    let mfd = unsafe { libc::memfd_create(c"ringsock".as_ptr(), libc::MFD_CLOEXEC) };
    for (what, fd) in [("an eventfd", efd), ("a memfd", mfd)] {
        attempt(
            t,
            &s,
            &format!("claim with {what}"),
            CLAIM,
            &[],
            &[fd],
            &[0x8007],
        );
    }
    close(efd);
    close(mfd);

    // Other sessions' offers, by id.
    for id in 1..=o.offer_ids {
        let idb = id.to_le_bytes();
        attempt(
            t,
            &s,
            &format!("collect offer {id}"),
            COLLECT,
            &idb,
            &[],
            &[],
        );
        attempt(t, &s, &format!("cancel offer {id}"), CANCEL, &idb, &[], &[]);
        let mut body = idb.to_vec();
        put_bytes(&mut body, b"intruder says no");
        attempt(
            t,
            &s,
            &format!("decline offer {id}"),
            DECLINE,
            &body,
            &[],
            &[],
        );
        let mut body = idb.to_vec();
        put_bytes(&mut body, b"intruder says yes");
        attempt(
            t,
            &s,
            &format!("answer offer {id}"),
            ANSWER,
            &body,
            &[],
            &[],
        );
    }
}

#[derive(Default)]
struct Opts {
    pids: Vec<i32>,
    fds: Vec<(i32, i32)>,
    maps: Vec<(i32, String)>,
    ctl: Option<String>,
    server: Option<SocketAddrV4>,
    client: Option<SocketAddrV4>,
    victim_fd: Option<i32>,
    offer_ids: u64,
}

fn usage() -> ! {
    eprintln!(
        "usage: intruder [--pid P]... [--fd P:N]... [--map P:START-END]... [--ctl SOCKET] \
         [--server IP:PORT] [--client IP:PORT] [--victim-fd N] [--offer-ids K]"
    );
    std::process::exit(2);
}

fn parse() -> Opts {
    let mut o = Opts::default();
    let mut a = std::env::args().skip(1);
    while let Some(k) = a.next() {
        let v = a.next().unwrap_or_else(|| usage());
        let pair = |v: &str| -> (i32, String) {
            let (p, rest) = v.split_once(':').unwrap_or_else(|| usage());
            (p.parse().unwrap_or_else(|_| usage()), rest.to_string())
        };
        match k.as_str() {
            "--pid" => o.pids.push(v.parse().unwrap_or_else(|_| usage())),
            "--fd" => {
                let (p, n) = pair(&v);
                o.fds.push((p, n.parse().unwrap_or_else(|_| usage())));
            }
            "--map" => o.maps.push(pair(&v)),
            "--ctl" => o.ctl = Some(v),
            "--server" => o.server = Some(v4(v.parse().unwrap_or_else(|_| usage()))),
            "--client" => o.client = Some(v4(v.parse().unwrap_or_else(|_| usage()))),
            "--victim-fd" => o.victim_fd = Some(v.parse().unwrap_or_else(|_| usage())),
            "--offer-ids" => o.offer_ids = v.parse().unwrap_or_else(|_| usage()),
            _ => usage(),
        }
    }
    o
}

fn main() {
    let o = parse();
    let mut t = Tally::default();
    // SAFETY: getuid/geteuid cannot fail.
    let (uid, euid) = unsafe { (libc::getuid(), libc::geteuid()) };
    let caps = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:").map(|v| v.trim().to_string()))
        })
        .unwrap_or_default();
    println!(
        "intruder: pid {} uid {uid} euid {euid} CapEff {caps}",
        std::process::id()
    );
    for &p in &o.pids {
        proc_attacks(&mut t, p);
    }
    for &(p, n) in &o.fds {
        fd_attacks(&mut t, p, n);
    }
    for (p, r) in &o.maps {
        map_attacks(&mut t, *p, r);
    }
    dev_shm(&mut t);
    if o.ctl.is_some() {
        ctl_attacks(&mut t, &o);
    }
    println!(
        "intruder: uid {uid} attempts {} denied {} open {} breaches {}",
        t.attempts, t.denied, t.open, t.breaches
    );
    std::process::exit(i32::from(t.breaches > 0));
}
