//! Hand-written little-endian encoder and bounds-checked decoder.
//!
//! No serde: the shim links this crate, and a tiny explicit codec keeps every
//! length check visible. The decoder never indexes out of range and never
//! allocates more than the bytes actually present justify.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

use crate::ProtoError;

const ADDR_V4: u8 = 4;
const ADDR_V6: u8 = 6;

/// Appends fields to a byte vector.
pub struct Encoder<'a> {
    out: &'a mut Vec<u8>,
}

impl<'a> Encoder<'a> {
    pub fn new(out: &'a mut Vec<u8>) -> Self {
        Encoder { out }
    }

    pub fn u8(&mut self, v: u8) {
        self.out.push(v);
    }

    pub fn u16(&mut self, v: u16) {
        self.out.extend_from_slice(&v.to_le_bytes());
    }

    pub fn u32(&mut self, v: u32) {
        self.out.extend_from_slice(&v.to_le_bytes());
    }

    pub fn i32(&mut self, v: i32) {
        self.out.extend_from_slice(&v.to_le_bytes());
    }

    pub fn u64(&mut self, v: u64) {
        self.out.extend_from_slice(&v.to_le_bytes());
    }

    /// A `u32` length then the bytes; refuses what the decoder would refuse.
    pub fn bytes(&mut self, field: &'static str, v: &[u8], max: usize) -> Result<(), ProtoError> {
        if v.len() > max {
            return Err(ProtoError::FieldTooLong {
                field,
                len: v.len(),
                max,
            });
        }
        // `max` is always far below u32::MAX (frames are <= 64 KiB).
        self.u32(v.len() as u32);
        self.out.extend_from_slice(v);
        Ok(())
    }

    pub fn string(&mut self, field: &'static str, v: &str, max: usize) -> Result<(), ProtoError> {
        self.bytes(field, v.as_bytes(), max)
    }

    /// Family tag, address, port; IPv6 also carries flowinfo and scope id so
    /// link-local addresses round-trip exactly.
    pub fn addr(&mut self, v: &SocketAddr) {
        match v {
            SocketAddr::V4(a) => {
                self.u8(ADDR_V4);
                self.out.extend_from_slice(&a.ip().octets());
                self.u16(a.port());
            }
            SocketAddr::V6(a) => {
                self.u8(ADDR_V6);
                self.out.extend_from_slice(&a.ip().octets());
                self.u16(a.port());
                self.u32(a.flowinfo());
                self.u32(a.scope_id());
            }
        }
    }

    /// Presence tag (0/1) then the value.
    pub fn opt_u64(&mut self, v: Option<u64>) {
        match v {
            None => self.u8(0),
            Some(x) => {
                self.u8(1);
                self.u64(x);
            }
        }
    }
}

/// Reads fields from a byte slice, each read checked against what is left.
pub struct Decoder<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Decoder<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Decoder { buf, pos: 0 }
    }

    /// Bytes not consumed yet.
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn take(&mut self, field: &'static str, n: usize) -> Result<&'a [u8], ProtoError> {
        if self.remaining() < n {
            return Err(ProtoError::Truncated { field });
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], ProtoError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(field, N)?);
        Ok(a)
    }

    pub fn u8(&mut self, field: &'static str) -> Result<u8, ProtoError> {
        Ok(self.array::<1>(field)?[0])
    }

    pub fn u16(&mut self, field: &'static str) -> Result<u16, ProtoError> {
        Ok(u16::from_le_bytes(self.array(field)?))
    }

    pub fn u32(&mut self, field: &'static str) -> Result<u32, ProtoError> {
        Ok(u32::from_le_bytes(self.array(field)?))
    }

    pub fn i32(&mut self, field: &'static str) -> Result<i32, ProtoError> {
        Ok(i32::from_le_bytes(self.array(field)?))
    }

    pub fn u64(&mut self, field: &'static str) -> Result<u64, ProtoError> {
        Ok(u64::from_le_bytes(self.array(field)?))
    }

    /// A length-prefixed byte string of at most `max` bytes. The limit is
    /// checked before the length is trusted, so a huge prefix costs nothing.
    pub fn bytes(&mut self, field: &'static str, max: usize) -> Result<&'a [u8], ProtoError> {
        let len = self.u32(field)? as usize;
        if len > max {
            return Err(ProtoError::FieldTooLong { field, len, max });
        }
        self.take(field, len)
    }

    pub fn byte_vec(&mut self, field: &'static str, max: usize) -> Result<Vec<u8>, ProtoError> {
        Ok(self.bytes(field, max)?.to_vec())
    }

    pub fn string(&mut self, field: &'static str, max: usize) -> Result<String, ProtoError> {
        let b = self.bytes(field, max)?;
        match std::str::from_utf8(b) {
            Ok(s) => Ok(s.to_owned()),
            Err(_) => Err(ProtoError::BadUtf8 { field }),
        }
    }

    pub fn addr(&mut self, field: &'static str) -> Result<SocketAddr, ProtoError> {
        match self.u8(field)? {
            ADDR_V4 => {
                let ip = Ipv4Addr::from(self.array::<4>(field)?);
                let port = self.u16(field)?;
                Ok(SocketAddr::V4(SocketAddrV4::new(ip, port)))
            }
            ADDR_V6 => {
                let ip = Ipv6Addr::from(self.array::<16>(field)?);
                let port = self.u16(field)?;
                let flow = self.u32(field)?;
                let scope = self.u32(field)?;
                Ok(SocketAddr::V6(SocketAddrV6::new(ip, port, flow, scope)))
            }
            other => Err(ProtoError::BadValue {
                field,
                value: u64::from(other),
            }),
        }
    }

    pub fn opt_u64(&mut self, field: &'static str) -> Result<Option<u64>, ProtoError> {
        match self.u8(field)? {
            0 => Ok(None),
            1 => Ok(Some(self.u64(field)?)),
            other => Err(ProtoError::BadValue {
                field,
                value: u64::from(other),
            }),
        }
    }

    /// A `u16` element count, refused when even the smallest elements could
    /// not fit in what is left (so `Vec::with_capacity(count)` is bounded by
    /// the input size, not by the attacker's number).
    pub fn count(
        &mut self,
        field: &'static str,
        max: usize,
        min_elem_size: usize,
    ) -> Result<usize, ProtoError> {
        let n = self.u16(field)? as usize;
        if n > max {
            return Err(ProtoError::FieldTooLong { field, len: n, max });
        }
        if n.saturating_mul(min_elem_size.max(1)) > self.remaining() {
            return Err(ProtoError::Truncated { field });
        }
        Ok(n)
    }

    /// Fails unless every byte was consumed.
    pub fn finish(&self, kind: &'static str) -> Result<(), ProtoError> {
        match self.remaining() {
            0 => Ok(()),
            extra => Err(ProtoError::Trailing { kind, extra }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_round_trip() {
        let mut v = Vec::new();
        let mut e = Encoder::new(&mut v);
        e.u8(7);
        e.u16(0xBEEF);
        e.u32(0xDEAD_BEEF);
        e.i32(-5);
        e.u64(u64::MAX - 1);
        let mut d = Decoder::new(&v);
        assert_eq!(d.u8("a").unwrap(), 7);
        assert_eq!(d.u16("b").unwrap(), 0xBEEF);
        assert_eq!(d.u32("c").unwrap(), 0xDEAD_BEEF);
        assert_eq!(d.i32("d").unwrap(), -5);
        assert_eq!(d.u64("e").unwrap(), u64::MAX - 1);
        d.finish("t").unwrap();
    }

    #[test]
    fn bytes_limits_are_enforced_both_ways() {
        let mut v = Vec::new();
        let err = Encoder::new(&mut v).bytes("p", &[0; 5], 4).unwrap_err();
        assert!(matches!(err, ProtoError::FieldTooLong { len: 5, .. }));
        Encoder::new(&mut v).bytes("p", &[1; 5], 5).unwrap();
        assert!(matches!(
            Decoder::new(&v).bytes("p", 4),
            Err(ProtoError::FieldTooLong { .. })
        ));
        assert_eq!(Decoder::new(&v).bytes("p", 5).unwrap(), &[1; 5]);
    }

    #[test]
    fn huge_length_prefix_is_rejected_without_allocating() {
        let v = u32::MAX.to_le_bytes();
        assert!(matches!(
            Decoder::new(&v).bytes("p", usize::MAX),
            Err(ProtoError::Truncated { .. })
        ));
    }

    #[test]
    fn strings_are_utf8_checked() {
        let mut v = Vec::new();
        Encoder::new(&mut v).bytes("s", &[0xff, 0xfe], 8).unwrap();
        assert_eq!(
            Decoder::new(&v).string("s", 8),
            Err(ProtoError::BadUtf8 { field: "s" })
        );
    }

    #[test]
    fn addresses_round_trip() {
        for a in [
            "127.0.0.1:80".parse::<SocketAddr>().unwrap(),
            "[fe80::1%3]:443".parse().unwrap(),
            SocketAddr::V6(SocketAddrV6::new(Ipv6Addr::LOCALHOST, 9, 77, 0)),
        ] {
            let mut v = Vec::new();
            Encoder::new(&mut v).addr(&a);
            let mut d = Decoder::new(&v);
            assert_eq!(d.addr("a").unwrap(), a);
            d.finish("t").unwrap();
        }
        assert!(matches!(
            Decoder::new(&[5, 0, 0]).addr("a"),
            Err(ProtoError::BadValue { value: 5, .. })
        ));
    }

    #[test]
    fn trailing_and_truncated_are_errors() {
        let d = Decoder::new(&[1, 2]);
        assert_eq!(
            d.finish("x"),
            Err(ProtoError::Trailing {
                kind: "x",
                extra: 2
            })
        );
        assert!(matches!(
            Decoder::new(&[1, 2, 3]).u32("f"),
            Err(ProtoError::Truncated { field: "f" })
        ));
    }

    #[test]
    fn count_is_bounded_by_input() {
        let v = 1000u16.to_le_bytes();
        assert!(Decoder::new(&v).count("n", 2000, 1).is_err());
        assert!(Decoder::new(&v).count("n", 10, 0).is_err());
    }
}
