//! Symbolic names for what the observation logs print: errno and signal
//! names, and bit masks (poll, epoll, MSG_*) as `A|B` lists, so that two
//! logs compare by meaning and a diff reads without a header file.

/// `EAGAIN`, `ECONNRESET`, ... (`E?N` for a number nix does not know).
pub fn errno(e: i32) -> String {
    match nix::errno::Errno::from_raw(e) {
        nix::errno::Errno::UnknownErrno => format!("E?{e}"),
        known => format!("{known:?}"),
    }
}

/// `SIGPIPE`, `SIGKILL`, ... (`SIG?N` for an unknown number).
pub fn signal(sig: i32) -> String {
    nix::sys::signal::Signal::try_from(sig)
        .map(|s| s.as_str().to_string())
        .unwrap_or_else(|_| format!("SIG?{sig}"))
}

/// The set bits of `value` by name, in table order, `|`-joined; bits
/// the table lacks as one hex number; `0` when nothing is set.
pub fn bits(value: i64, table: &[(i64, &str)]) -> String {
    let mut rest = value;
    let mut out: Vec<String> = Vec::new();
    for &(bit, name) in table {
        if bit != 0 && value & bit == bit && rest & bit != 0 {
            out.push(name.to_string());
            rest &= !bit;
        }
    }
    if rest != 0 {
        out.push(format!("{rest:#x}"));
    }
    if out.is_empty() {
        "0".to_string()
    } else {
        out.join("|")
    }
}

macro_rules! table {
    ($($name:ident),* $(,)?) => {
        &[$((libc::$name as u32 as i64, stringify!($name))),*]
    };
}

pub const POLL: &[(i64, &str)] = table!(
    POLLIN, POLLPRI, POLLOUT, POLLERR, POLLHUP, POLLNVAL, POLLRDNORM, POLLRDBAND, POLLWRNORM,
    POLLWRBAND, POLLRDHUP
);

pub const EPOLL: &[(i64, &str)] = table!(
    EPOLLIN,
    EPOLLPRI,
    EPOLLOUT,
    EPOLLERR,
    EPOLLHUP,
    EPOLLRDNORM,
    EPOLLRDBAND,
    EPOLLWRNORM,
    EPOLLWRBAND,
    EPOLLMSG,
    EPOLLRDHUP,
    EPOLLEXCLUSIVE,
    EPOLLWAKEUP,
    EPOLLONESHOT,
    EPOLLET
);

pub const MSG: &[(i64, &str)] = table!(
    MSG_OOB,
    MSG_PEEK,
    MSG_DONTROUTE,
    MSG_CTRUNC,
    MSG_TRUNC,
    MSG_DONTWAIT,
    MSG_EOR,
    MSG_WAITALL,
    MSG_NOSIGNAL,
    MSG_MORE,
    MSG_ERRQUEUE,
    MSG_CMSG_CLOEXEC
);

pub fn poll(mask: i16) -> String {
    bits(i64::from(mask as u16), POLL)
}

pub fn epoll(mask: u32) -> String {
    bits(i64::from(mask), EPOLL)
}

pub fn msg(flags: i32) -> String {
    bits(i64::from(flags as u32), MSG)
}

/// `AF_INET`, `AF_INET6`, `AF_UNIX`, or the number.
pub fn family(f: i32) -> String {
    match f {
        libc::AF_INET => "AF_INET".into(),
        libc::AF_INET6 => "AF_INET6".into(),
        libc::AF_UNIX => "AF_UNIX".into(),
        libc::AF_UNSPEC => "AF_UNSPEC".into(),
        n => format!("AF?{n}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_read_as_the_headers_spell_them() {
        assert_eq!(errno(libc::EAGAIN), "EAGAIN");
        assert_eq!(errno(libc::ECONNRESET), "ECONNRESET");
        assert_eq!(signal(libc::SIGPIPE), "SIGPIPE");
        assert_eq!(
            poll(libc::POLLIN | libc::POLLRDNORM | libc::POLLRDHUP),
            "POLLIN|POLLRDNORM|POLLRDHUP"
        );
        assert_eq!(poll(0), "0");
        assert_eq!(
            epoll((libc::EPOLLIN | libc::EPOLLET) as u32),
            "EPOLLIN|EPOLLET"
        );
        assert_eq!(msg(libc::MSG_PEEK | 0x0100_0000), "MSG_PEEK|0x1000000");
    }
}
