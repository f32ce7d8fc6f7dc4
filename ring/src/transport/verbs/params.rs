//! The connection parameters one end of a verbs ring connection gives the
//! other, and their versioned byte encoding (carried by the ctl daemons, or
//! by any out-of-band channel: `verbscheck` uses a plain TCP socket).
//!
//! Everything here is plain data and pure code: no device is needed to
//! build, encode or decode parameters, so the format is unit-tested on any
//! machine.

use crate::config::{RingConfig, MAX_SLOTS, MAX_SLOT_SIZE, MIN_SLOTS};
use crate::error::{RingError, VerbsError};

/// One ring copy of an end, as the peer needs it to WRITE into it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingDesc {
    /// Virtual address of the copy's control block (`RingControl`).
    pub ctrl_addr: u64,
    /// Virtual address of the copy's first slot.
    pub slots_addr: u64,
    /// Geometry: number of slots and bytes per slot.
    pub slots: u32,
    pub slot_size: u32,
}

impl RingDesc {
    /// Whether this copy has the geometry of `cfg`.
    pub fn matches(&self, cfg: &RingConfig) -> bool {
        self.slots == cfg.slots && self.slot_size == cfg.slot_size
    }

    fn valid(&self) -> bool {
        self.slots.is_power_of_two()
            && (MIN_SLOTS..=MAX_SLOTS).contains(&self.slots)
            && self.slot_size >= 64
            && self.slot_size.is_multiple_of(64)
            && self.slot_size <= MAX_SLOT_SIZE
            && self.ctrl_addr.is_multiple_of(64)
            && self.slots_addr.is_multiple_of(64)
    }
}

/// What one end of an RC connection tells the other: its queue pair's
/// address (GID, LID, QPN), the first packet sequence number it sends, the
/// path MTU it can do, and where its two ring copies are (one rkey covers
/// both: they live in one registered region).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpParams {
    /// Port GID (RoCE: the IPv4-mapped RoCE v2 GID by default).
    pub gid: [u8; 16],
    /// Port LID (InfiniBand; 0 on RoCE).
    pub lid: u16,
    /// Queue pair number (24 bits).
    pub qpn: u32,
    /// Initial packet sequence number (24 bits).
    pub psn: u32,
    /// The port's active MTU as an `ibv_mtu` value (1 = 256 .. 5 = 4096).
    pub mtu: u8,
    /// What this end's code does beyond version 1 (`FEATURE_*` bits).
    /// Encoded in the first byte that version 1 reserved as zero, so an
    /// older end reads 0 there: none.
    pub features: u8,
    /// Remote key of the region holding both ring copies.
    pub rkey: u32,
    /// This end's *sender* copy of its outgoing ring: the peer's receiver
    /// writes the head, `rx_waiting` and `rx_closed` here.
    pub out_ring: RingDesc,
    /// This end's *receiver* copy of its incoming ring: the peer's sender
    /// writes slots, the tail and `tx_waiting` here.
    pub in_ring: RingDesc,
}

/// First bytes of an encoded `QpParams`: "RSQP".
pub const PARAMS_MAGIC: [u8; 4] = *b"RSQP";
/// Version of the encoding; a decoder refuses any other.
pub const PARAMS_VERSION: u16 = 1;
/// Length of an encoded `QpParams` (version 1).
pub const PARAMS_LEN: usize = 4 + 2 + 2 + 16 + 2 + 4 + 4 + 1 + 3 + 4 + 2 * 24;

/// `features` bit: this end's sender honours *standing* sleep flags
/// (`crate::sleep::flags`): it rings with every tail and ends the flag after
/// its budget with a tagged ring. A receiver announces them only to a
/// sender that says so; an older one would never ring them.
pub const FEATURE_STANDING_WAITS: u8 = 1;

/// `features` bit: this end's receiver takes a tail from a ring's
/// immediate (`tail_hint`), so the peer's sender may send a small
/// batch as one WRITE_WITH_IMM of its slots that rings the doorbell and
/// carries the tail, without the tail WRITE. An older receiver would
/// never see such a tail.
pub const FEATURE_TAIL_IN_IMM: u8 = 2;

/// `features` bit: this end keeps a posted receive for every slot of its
/// incoming ring, on top of the doorbell's. Each immediate takes one, and
/// a tail in an immediate advances the tail by at least a slot, so the
/// immediates its receiver has not reaped never outnumber the slots the
/// sender may have in flight: the peer's sender may then carry *every*
/// small batch's tail in the immediate of its slot WRITE (one work
/// request and one packet less per message) without running this end out
/// of receives. Against an older end it writes the tail word instead.
pub const FEATURE_TAIL_CREDITS: u8 = 4;

/// `features` bit: this end's receiver (with `FEATURE_TAIL_CREDITS`, on a
/// ring of at most `headerless::MAX_RING_SLOTS` slots) writes the header
/// of a record the peer sent without it (`headerless`): a held
/// batch that is exactly one record may go out as its payload alone, with
/// the length and tail in the immediate. An older receiver would take
/// that immediate for a plain ring and never see the record.
pub const FEATURE_HEADERLESS: u8 = 8;

impl QpParams {
    /// Little-endian encoding: magic, version, total length, then the
    /// fields in declaration order (`features`, then 2 reserved zero bytes
    /// after `mtu`).
    pub fn encode(&self) -> [u8; PARAMS_LEN] {
        let mut out = [0u8; PARAMS_LEN];
        let mut w = Writer {
            buf: &mut out,
            at: 0,
        };
        w.put(&PARAMS_MAGIC);
        w.put(&PARAMS_VERSION.to_le_bytes());
        w.put(&(PARAMS_LEN as u16).to_le_bytes());
        w.put(&self.gid);
        w.put(&self.lid.to_le_bytes());
        w.put(&self.qpn.to_le_bytes());
        w.put(&self.psn.to_le_bytes());
        w.put(&[self.mtu, self.features, 0, 0]);
        w.put(&self.rkey.to_le_bytes());
        for r in [&self.out_ring, &self.in_ring] {
            w.put(&r.ctrl_addr.to_le_bytes());
            w.put(&r.slots_addr.to_le_bytes());
            w.put(&r.slots.to_le_bytes());
            w.put(&r.slot_size.to_le_bytes());
        }
        debug_assert_eq!(w.at, PARAMS_LEN);
        out
    }

    /// Parses and validates an encoding. Input comes from the network:
    /// every field is checked, and the error says which check failed.
    pub fn decode(buf: &[u8]) -> Result<QpParams, RingError> {
        let bad = |what| Err(VerbsError::Params(what).into());
        if buf.len() < 8 {
            return bad("too short");
        }
        if buf[0..4] != PARAMS_MAGIC {
            return bad("bad magic");
        }
        let mut r = Reader { buf, at: 4 };
        if r.u16() != PARAMS_VERSION {
            return bad("unsupported version");
        }
        if r.u16() as usize != PARAMS_LEN || buf.len() != PARAMS_LEN {
            return bad("wrong length");
        }
        let mut gid = [0u8; 16];
        gid.copy_from_slice(r.take(16));
        let lid = r.u16();
        let qpn = r.u32();
        let psn = r.u32();
        let (mtu, features) = {
            let b = r.take(4);
            (b[0], b[1])
        };
        let rkey = r.u32();
        let mut ring = || RingDesc {
            ctrl_addr: r.u64(),
            slots_addr: r.u64(),
            slots: r.u32(),
            slot_size: r.u32(),
        };
        let out_ring = ring();
        let in_ring = ring();
        if qpn == 0 || qpn >= 1 << 24 {
            return bad("QPN out of range");
        }
        if psn >= 1 << 24 {
            return bad("PSN out of range");
        }
        if !(1..=5).contains(&mtu) {
            return bad("MTU out of range");
        }
        if !out_ring.valid() || !in_ring.valid() {
            return bad("bad ring geometry or address");
        }
        Ok(QpParams {
            gid,
            lid,
            qpn,
            psn,
            mtu,
            features,
            rkey,
            out_ring,
            in_ring,
        })
    }
}

struct Writer<'a> {
    buf: &'a mut [u8],
    at: usize,
}

impl Writer<'_> {
    fn put(&mut self, b: &[u8]) {
        self.buf[self.at..self.at + b.len()].copy_from_slice(b);
        self.at += b.len();
    }
}

/// Reads fixed fields from a buffer whose length was checked up front.
struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> &'a [u8] {
        let s = &self.buf[self.at..self.at + n];
        self.at += n;
        s
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.take(2).try_into().unwrap_or_default())
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take(4).try_into().unwrap_or_default())
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take(8).try_into().unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> QpParams {
        QpParams {
            gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 1],
            lid: 0,
            qpn: 0x11,
            psn: 0x00ab_cdef,
            mtu: 3,
            features: FEATURE_STANDING_WAITS
                | FEATURE_TAIL_IN_IMM
                | FEATURE_TAIL_CREDITS
                | FEATURE_HEADERLESS,
            rkey: 0xdead_beef,
            out_ring: RingDesc {
                ctrl_addr: 0x7f00_0000_0000,
                slots_addr: 0x7f00_0000_1000,
                slots: 4096,
                slot_size: 256,
            },
            in_ring: RingDesc {
                ctrl_addr: 0x7f00_0010_1000,
                slots_addr: 0x7f00_0010_2000,
                slots: 64,
                slot_size: 1024,
            },
        }
    }

    #[test]
    fn round_trip() {
        let p = sample();
        let enc = p.encode();
        assert_eq!(&enc[0..4], b"RSQP");
        assert_eq!(QpParams::decode(&enc), Ok(p));
    }

    #[test]
    fn features_sit_in_a_byte_older_ends_leave_zero() {
        let enc = sample().encode();
        assert_eq!(
            enc[35],
            FEATURE_STANDING_WAITS
                | FEATURE_TAIL_IN_IMM
                | FEATURE_TAIL_CREDITS
                | FEATURE_HEADERLESS,
            "right after mtu"
        );
        let bits = [
            FEATURE_STANDING_WAITS,
            FEATURE_TAIL_IN_IMM,
            FEATURE_TAIL_CREDITS,
            FEATURE_HEADERLESS,
        ];
        for (i, a) in bits.iter().enumerate() {
            assert_eq!(a.count_ones(), 1);
            for b in &bits[i + 1..] {
                assert_eq!(a & b, 0, "distinct bits");
            }
        }
        let mut old = enc;
        old[35] = 0;
        assert_eq!(QpParams::decode(&old).map(|p| p.features), Ok(0));
    }

    #[test]
    fn rejects_bad_input() {
        let enc = sample().encode();
        assert!(QpParams::decode(&enc[..PARAMS_LEN - 1]).is_err());
        assert!(QpParams::decode(&[]).is_err());
        let mut v = enc;
        v[4] = 2; // version
        assert!(QpParams::decode(&v).is_err());
        let mut v = enc;
        v[0] = b'X';
        assert!(QpParams::decode(&v).is_err());
        let mut p = sample();
        p.qpn = 1 << 24;
        assert!(QpParams::decode(&p.encode()).is_err());
        let mut p = sample();
        p.in_ring.slots = 100;
        assert!(QpParams::decode(&p.encode()).is_err());
        let mut p = sample();
        p.out_ring.ctrl_addr += 8;
        assert!(QpParams::decode(&p.encode()).is_err());
        let mut p = sample();
        p.mtu = 0;
        assert!(QpParams::decode(&p.encode()).is_err());
    }

    #[test]
    fn any_bytes_never_panic() {
        let enc = sample().encode();
        for i in 0..PARAMS_LEN {
            for b in [0u8, 1, 0x7f, 0xff] {
                let mut v = enc;
                v[i] = b;
                let _ = QpParams::decode(&v);
            }
        }
    }
}
