//! Record framing inside the slots.
//!
//! A record is an 8-byte header followed by its payload, laid out over
//! consecutive slots starting at a slot boundary and never wrapping past the
//! end of the ring. Header (little endian): `magic: u16, flags: u16,
//! len: u32`. Small writes share one record (coalescing); a large write
//! becomes a few large records, one memcpy each.

/// Bytes of a record header.
pub const HEADER_BYTES: usize = 8;
/// Marks a slot that starts a record; anything else there is corruption.
pub const MAGIC: u16 = 0x5253; // "RS"
/// Flag: end of stream; the record carries no payload.
pub const FLAG_EOS: u16 = 1;
const KNOWN_FLAGS: u16 = FLAG_EOS;

/// A decoded record header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub flags: u16,
    pub len: u32,
}

impl Header {
    pub fn encode(self) -> u64 {
        MAGIC as u64 | (self.flags as u64) << 16 | (self.len as u64) << 32
    }

    /// Parses a raw header word; `None` when the magic or flags are wrong or
    /// an end-of-stream mark carries payload.
    pub fn decode(raw: u64) -> Option<Header> {
        let magic = raw as u16;
        let flags = (raw >> 16) as u16;
        let len = (raw >> 32) as u32;
        if magic != MAGIC || flags & !KNOWN_FLAGS != 0 || (flags & FLAG_EOS != 0 && len != 0) {
            return None;
        }
        Some(Header { flags, len })
    }

    pub fn is_eos(self) -> bool {
        self.flags & FLAG_EOS != 0
    }
}

/// Slots a record with `len` payload bytes occupies.
#[inline]
pub fn slots_for(len: usize, slot_size: usize) -> usize {
    (HEADER_BYTES + len).div_ceil(slot_size)
}

/// Bytes of a record with `len` payload bytes in its final slot
/// (`1..=slot_size`).
#[inline]
pub fn bytes_in_last_slot(len: usize, slot_size: usize) -> usize {
    HEADER_BYTES + len - (slots_for(len, slot_size) - 1) * slot_size
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip() {
        for h in [
            Header { flags: 0, len: 0 },
            Header {
                flags: 0,
                len: u32::MAX,
            },
            Header {
                flags: FLAG_EOS,
                len: 0,
            },
        ] {
            assert_eq!(Header::decode(h.encode()), Some(h));
        }
    }

    #[test]
    fn header_rejects_garbage() {
        assert_eq!(Header::decode(0), None);
        assert_eq!(Header::decode(u64::MAX), None);
        assert_eq!(Header::decode(Header { flags: 2, len: 1 }.encode()), None);
        assert_eq!(
            Header::decode(
                Header {
                    flags: FLAG_EOS,
                    len: 3
                }
                .encode()
            ),
            None
        );
    }

    #[test]
    fn slot_math() {
        assert_eq!(slots_for(0, 64), 1);
        assert_eq!(slots_for(56, 64), 1);
        assert_eq!(slots_for(57, 64), 2);
        assert_eq!(slots_for(65536, 256), 257);
        assert_eq!(bytes_in_last_slot(0, 64), 8);
        assert_eq!(bytes_in_last_slot(56, 64), 64);
        assert_eq!(bytes_in_last_slot(57, 64), 1);
        assert_eq!(bytes_in_last_slot(64, 256), 72);
        assert_eq!(bytes_in_last_slot(65536, 256), 8);
    }
}
