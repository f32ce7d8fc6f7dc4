//! The kernel's connection-tracking table of the daemon's namespace, read
//! over netlink (NETLINK_NETFILTER, ctnetlink): what a translated
//! connection (DNAT, with or without masquerading) looked like before the
//! translation. Each entry has an original tuple (as the client sent it)
//! and a reply tuple (as the server answers it); the server's accepted
//! socket shows the reply tuple reversed. Needs CAP_NET_ADMIN.
//!
//! Hand-written requests: IPCTNL_MSG_CT_GET by reply tuple, and a dump.
//! Replies are parsed defensively: an attribute that does not fit is the
//! end of what is read, never a panic.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

const NETLINK_NETFILTER: i32 = 12;
const NFNL_SUBSYS_CTNETLINK: u16 = 1;
const IPCTNL_MSG_CT_NEW: u16 = 0;
const IPCTNL_MSG_CT_GET: u16 = 1;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_DUMP: u16 = 0x300;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLA_F_NESTED: u16 = 0x8000;
const NLA_TYPE_MASK: u16 = 0x3fff;

const CTA_TUPLE_ORIG: u16 = 1;
const CTA_TUPLE_REPLY: u16 = 2;
const CTA_TUPLE_IP: u16 = 1;
const CTA_TUPLE_PROTO: u16 = 2;
const CTA_IP_V4_SRC: u16 = 1;
const CTA_IP_V4_DST: u16 = 2;
const CTA_IP_V6_SRC: u16 = 3;
const CTA_IP_V6_DST: u16 = 4;
const CTA_PROTO_NUM: u16 = 1;
const CTA_PROTO_SRC_PORT: u16 = 2;
const CTA_PROTO_DST_PORT: u16 = 3;

const NLMSG_HDR: usize = 16;
const NFGENMSG: usize = 4;

/// One direction of a tracked TCP connection: from `src` to `dst`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tuple {
    pub src: SocketAddr,
    pub dst: SocketAddr,
}

/// A tracked TCP connection: as sent (`orig`) and as answered (`reply`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub orig: Tuple,
    pub reply: Tuple,
}

impl Entry {
    /// Whether its destination was translated (DNAT): the reply comes
    /// from another address than the one the client sent to.
    pub fn translated(&self) -> bool {
        self.reply.src != self.orig.dst
    }
}

fn align(n: usize) -> usize {
    (n + 3) & !3
}

fn put_attr(buf: &mut Vec<u8>, ty: u16, payload: &[u8]) {
    let len = 4 + payload.len();
    buf.extend_from_slice(&(len as u16).to_ne_bytes());
    buf.extend_from_slice(&ty.to_ne_bytes());
    buf.extend_from_slice(payload);
    buf.resize(align(buf.len()), 0);
}

fn nested(ty: u16, inner: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    put_attr(&mut out, ty | NLA_F_NESTED, inner);
    out
}

/// The nested CTA_TUPLE_* attribute `ty` for a TCP tuple.
fn tuple_attr(ty: u16, t: &Tuple) -> Vec<u8> {
    let mut ip = Vec::new();
    match (t.src.ip(), t.dst.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            put_attr(&mut ip, CTA_IP_V4_SRC, &s.octets());
            put_attr(&mut ip, CTA_IP_V4_DST, &d.octets());
        }
        (s, d) => {
            put_attr(&mut ip, CTA_IP_V6_SRC, &v6(s).octets());
            put_attr(&mut ip, CTA_IP_V6_DST, &v6(d).octets());
        }
    }
    let mut proto = Vec::new();
    put_attr(&mut proto, CTA_PROTO_NUM, &[libc::IPPROTO_TCP as u8]);
    put_attr(&mut proto, CTA_PROTO_SRC_PORT, &t.src.port().to_be_bytes());
    put_attr(&mut proto, CTA_PROTO_DST_PORT, &t.dst.port().to_be_bytes());
    let mut inner = nested(CTA_TUPLE_IP, &ip);
    inner.extend_from_slice(&nested(CTA_TUPLE_PROTO, &proto));
    nested(ty, &inner)
}

fn v6(ip: IpAddr) -> Ipv6Addr {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    }
}

fn family(t: &Tuple) -> u8 {
    if t.src.is_ipv4() && t.dst.is_ipv4() {
        libc::AF_INET as u8
    } else {
        libc::AF_INET6 as u8
    }
}

/// A ctnetlink request: header, nfgenmsg, attributes.
fn request(flags: u16, family: u8, seq: u32, attrs: &[u8]) -> Vec<u8> {
    let len = NLMSG_HDR + NFGENMSG + attrs.len();
    let mut m = Vec::with_capacity(len);
    m.extend_from_slice(&(len as u32).to_ne_bytes());
    let ty = NFNL_SUBSYS_CTNETLINK << 8 | IPCTNL_MSG_CT_GET;
    m.extend_from_slice(&ty.to_ne_bytes());
    m.extend_from_slice(&(NLM_F_REQUEST | flags).to_ne_bytes());
    m.extend_from_slice(&seq.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes());
    m.extend_from_slice(&[family, 0, 0, 0]);
    m.extend_from_slice(attrs);
    m
}

/// The request for the entry whose reply tuple is `reply`.
pub fn get_by_reply(reply: &Tuple, seq: u32) -> Vec<u8> {
    request(0, family(reply), seq, &tuple_attr(CTA_TUPLE_REPLY, reply))
}

/// The request for every entry (IPv4 and IPv6).
pub fn dump(seq: u32) -> Vec<u8> {
    request(NLM_F_DUMP, libc::AF_UNSPEC as u8, seq, &[])
}

/// The attributes in `buf`: (type without flags, payload).
fn attrs(mut buf: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if buf.len() < 4 {
            return None;
        }
        let len = usize::from(u16::from_ne_bytes([buf[0], buf[1]]));
        let ty = u16::from_ne_bytes([buf[2], buf[3]]) & NLA_TYPE_MASK;
        if len < 4 || len > buf.len() {
            return None;
        }
        let payload = &buf[4..len];
        buf = &buf[align(len).min(buf.len())..];
        Some((ty, payload))
    })
}

fn find(buf: &[u8], ty: u16) -> Option<&[u8]> {
    attrs(buf).find(|&(t, _)| t == ty).map(|(_, p)| p)
}

fn ip_of(p: &[u8]) -> Option<IpAddr> {
    match p.len() {
        4 => Some(IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(p).ok()?))),
        16 => Some(IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(p).ok()?))),
        _ => None,
    }
}

fn port_of(p: &[u8]) -> Option<u16> {
    Some(u16::from_be_bytes(p.try_into().ok()?))
}

/// A TCP tuple from the payload of a CTA_TUPLE_* attribute.
fn parse_tuple(buf: &[u8]) -> Option<Tuple> {
    let ip = find(buf, CTA_TUPLE_IP)?;
    let proto = find(buf, CTA_TUPLE_PROTO)?;
    if find(proto, CTA_PROTO_NUM)? != [libc::IPPROTO_TCP as u8] {
        return None;
    }
    let (s, d) = match (find(ip, CTA_IP_V4_SRC), find(ip, CTA_IP_V4_DST)) {
        (Some(s), Some(d)) => (ip_of(s)?, ip_of(d)?),
        _ => (
            ip_of(find(ip, CTA_IP_V6_SRC)?)?,
            ip_of(find(ip, CTA_IP_V6_DST)?)?,
        ),
    };
    Some(Tuple {
        src: SocketAddr::new(s, port_of(find(proto, CTA_PROTO_SRC_PORT)?)?),
        dst: SocketAddr::new(d, port_of(find(proto, CTA_PROTO_DST_PORT)?)?),
    })
}

/// What one received datagram says: its TCP entries, an error (negative
/// errno) and whether the exchange is over.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Parsed {
    pub entries: Vec<Entry>,
    pub error: Option<i32>,
    pub done: bool,
}

/// Parses one datagram of netlink messages answering sequence `seq`.
pub fn parse(mut buf: &[u8], seq: u32) -> Parsed {
    let mut out = Parsed::default();
    while buf.len() >= NLMSG_HDR {
        let len = u32::from_ne_bytes(buf[0..4].try_into().expect("4 bytes")) as usize;
        let ty = u16::from_ne_bytes([buf[4], buf[5]]);
        let mseq = u32::from_ne_bytes(buf[8..12].try_into().expect("4 bytes"));
        if len < NLMSG_HDR || len > buf.len() {
            break;
        }
        let body = &buf[NLMSG_HDR..len];
        buf = &buf[align(len).min(buf.len())..];
        if mseq != seq {
            continue;
        }
        match ty {
            NLMSG_DONE => out.done = true,
            NLMSG_ERROR => {
                let code = body
                    .get(..4)
                    .map_or(-libc::EIO, |b| i32::from_ne_bytes(b.try_into().expect("4")));
                if code != 0 {
                    out.error = Some(code);
                }
                out.done = true;
            }
            t if t == NFNL_SUBSYS_CTNETLINK << 8 | IPCTNL_MSG_CT_NEW => {
                let Some(a) = body.get(NFGENMSG..) else {
                    continue;
                };
                let entry = (|| {
                    Some(Entry {
                        orig: parse_tuple(find(a, CTA_TUPLE_ORIG)?)?,
                        reply: parse_tuple(find(a, CTA_TUPLE_REPLY)?)?,
                    })
                })();
                out.entries.extend(entry);
            }
            _ => {}
        }
    }
    out
}

/// One exchange with ctnetlink: sends `req` and reads until its answer
/// is complete (bounded by a receive timeout per datagram).
fn exchange(req: &[u8], seq: u32, one: bool) -> io::Result<Vec<Entry>> {
    // SAFETY: plain socket(2); the descriptor is owned at once.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            NETLINK_NETFILTER,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned `fd`.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    let tv = libc::timeval {
        tv_sec: 0,
        tv_usec: Duration::from_millis(200).as_micros() as libc::suseconds_t,
    };
    // SAFETY: a valid timeval of the right size.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    // SAFETY: a zeroed sockaddr_nl is the kernel's address (pid 0).
    let mut kernel: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    kernel.nl_family = libc::AF_NETLINK as libc::sa_family_t;
    // SAFETY: `req` and `kernel` are valid for the call.
    let sent = unsafe {
        libc::sendto(
            sock.as_raw_fd(),
            req.as_ptr().cast(),
            req.len(),
            0,
            (&kernel as *const libc::sockaddr_nl).cast(),
            std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
        )
    };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut entries = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    // A dump of a huge table is cut short rather than read for ever.
    for _ in 0..4096 {
        // SAFETY: `buf` is writable for its length.
        let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let p = parse(&buf[..n as usize], seq);
        entries.extend(p.entries);
        if let Some(e) = p.error {
            if e == -libc::ENOENT {
                return Ok(entries);
            }
            return Err(io::Error::from_raw_os_error(-e));
        }
        if p.done || (one && !entries.is_empty()) {
            return Ok(entries);
        }
    }
    Ok(entries)
}

/// The tracked connection whose reply tuple is `reply` (what a server's
/// accepted socket shows, reversed), if there is one.
pub fn by_reply(reply: &Tuple) -> io::Result<Option<Entry>> {
    let seq = 1;
    Ok(exchange(&get_by_reply(reply, seq), seq, true)?
        .into_iter()
        .find(|e| e.reply == *reply))
}

/// Every tracked TCP connection whose destination was translated.
pub fn translated() -> io::Result<Vec<Entry>> {
    let seq = 2;
    let mut all = exchange(&dump(seq), seq, false)?;
    all.retain(Entry::translated);
    Ok(all)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    /// A CT_NEW message for `e`, as the kernel sends it.
    fn message(e: &Entry, seq: u32) -> Vec<u8> {
        let mut attrs = tuple_attr(CTA_TUPLE_ORIG, &e.orig);
        attrs.extend_from_slice(&tuple_attr(CTA_TUPLE_REPLY, &e.reply));
        let mut m = request(0, family(&e.orig), seq, &attrs);
        let ty = NFNL_SUBSYS_CTNETLINK << 8 | IPCTNL_MSG_CT_NEW;
        m[4..6].copy_from_slice(&ty.to_ne_bytes());
        m
    }

    #[test]
    fn entries_round_trip_and_translation_shows() {
        let e = Entry {
            orig: Tuple {
                src: a("10.0.0.1:40000"),
                dst: a("10.0.0.254:8080"),
            },
            reply: Tuple {
                src: a("10.0.0.2:80"),
                dst: a("10.0.0.254:40000"),
            },
        };
        let mut buf = message(&e, 7);
        // Another sequence's message is not ours.
        buf.extend_from_slice(&message(&e, 8));
        let p = parse(&buf, 7);
        assert_eq!(p.entries, vec![e]);
        assert!(e.translated());
        let v6 = Entry {
            orig: Tuple {
                src: a("[fd00::1]:1"),
                dst: a("[fd00::2]:2"),
            },
            reply: Tuple {
                src: a("[fd00::2]:2"),
                dst: a("[fd00::1]:1"),
            },
        };
        assert_eq!(parse(&message(&v6, 1), 1).entries, vec![v6]);
        assert!(!v6.translated());
    }

    #[test]
    fn errors_and_garbage() {
        let mut err = vec![0u8; NLMSG_HDR + 4];
        err[0..4].copy_from_slice(&((NLMSG_HDR + 4) as u32).to_ne_bytes());
        err[4..6].copy_from_slice(&NLMSG_ERROR.to_ne_bytes());
        err[8..12].copy_from_slice(&3u32.to_ne_bytes());
        err[NLMSG_HDR..].copy_from_slice(&(-libc::ENOENT).to_ne_bytes());
        let p = parse(&err, 3);
        assert_eq!((p.error, p.done), (Some(-libc::ENOENT), true));
        // Truncated or nonsense input parses to nothing.
        for n in 0..err.len() {
            let _ = parse(&err[..n], 3);
        }
        assert_eq!(parse(&[0xff; 40], 0), Parsed::default());
        let e = Entry {
            orig: Tuple {
                src: a("1.2.3.4:5"),
                dst: a("6.7.8.9:10"),
            },
            reply: Tuple {
                src: a("6.7.8.9:10"),
                dst: a("1.2.3.4:5"),
            },
        };
        let m = message(&e, 1);
        for n in 0..m.len() {
            let p = parse(&m[..n], 1);
            assert!(p.entries.is_empty() || n == m.len());
        }
    }
}
