//! The script's byte reader and the few addresses it picks from.

use std::net::SocketAddr;

/// Addresses the script picks from: few, so that offers, listeners and
/// claims collide often, with wildcard, v6 and v4-mapped forms.
/// 192.0.2.1 is another host (offers for it are forwarded).
pub const ADDRS: [&str; 16] = [
    "127.0.0.1:80",
    "127.0.0.1:5000",
    "0.0.0.0:80",
    "[::]:80",
    "[::ffff:127.0.0.1]:5000",
    "127.0.0.1:5001",
    "[::1]:80",
    "0.0.0.0:5000",
    "[::1]:5002",
    "[::]:5002",
    "10.0.0.1:80",
    "127.0.0.1:0",
    "[fe80::1%2]:80",
    "[::ffff:127.0.0.1]:80",
    "192.0.2.1:80",
    "10.0.0.1:5003",
];

pub fn addr(i: u8) -> SocketAddr {
    ADDRS[usize::from(i) % ADDRS.len()]
        .parse()
        .unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 1)))
}

/// Reads script bytes; past the end every read is 0, so any input is a
/// complete script.
pub(super) struct Script<'a> {
    pub(super) data: &'a [u8],
}

impl Script<'_> {
    pub(super) fn done(&self) -> bool {
        self.data.is_empty()
    }

    pub(super) fn u8(&mut self) -> u8 {
        match self.data.split_first() {
            Some((&b, rest)) => {
                self.data = rest;
                b
            }
            None => 0,
        }
    }

    pub(super) fn u16(&mut self) -> u16 {
        u16::from(self.u8()) | u16::from(self.u8()) << 8
    }

    pub(super) fn u64(&mut self) -> u64 {
        u64::from(self.u8()) % 16
    }

    pub(super) fn take(&mut self, n: usize) -> Vec<u8> {
        let (b, rest) = self.data.split_at(n.min(self.data.len()));
        self.data = rest;
        b.to_vec()
    }

    /// Up to `max` bytes; usually short, so one field does not swallow
    /// the rest of the script.
    pub(super) fn bytes(&mut self, max: usize) -> Vec<u8> {
        let r = self.u8();
        let n = if r == 0xff {
            usize::from(self.u16()) % (max + 1)
        } else {
            usize::from(r % 16).min(max)
        };
        self.take(n)
    }

    pub(super) fn text(&mut self, max: usize) -> String {
        // Lossy decoding may triple a byte's size: stay under `max`.
        String::from_utf8_lossy(&self.bytes(max / 3)).into_owned()
    }
}
