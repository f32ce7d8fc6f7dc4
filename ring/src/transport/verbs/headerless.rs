//! A record sent without its header (verbs `FEATURE_HEADERLESS`): when a
//! held batch is exactly one record, the sender WRITEs only its payload
//! and carries the payload's length and the new tail's low bits in the
//! immediate; the receiver's end writes the header into its own copy when
//! it reaps that completion, then raises the tail over the record.
//!
//! Why: the 8-byte header pushes a 4 KiB message one packet over a whole
//! number of MTUs (4,104 bytes: five rxe packets at 1,024, two at a real
//! NIC's 4,096) where rsocket sends four (one), and every packet adds to
//! a round trip.
//!
//! The immediate's field (29 bits, beside the transport's kind bits): the
//! payload length in the high `LEN_BITS`, the tail's low `TAIL_BITS`
//! below. The tail decodes against the receiver copy's current tail as in
//! `tail_hint`, with a window of `2^(TAIL_BITS-1)` slots either
//! way: an unreaped immediate's tail lies within a ring of the copy's
//! tail, so rings of at most `MAX_RING_SLOTS` slots (half the window)
//! take headerless records.
//!
//! The header the receiver writes is the only one its copy gets for that
//! record until the sender writes a plain tail word: before one, the
//! sender re-sends the headers of the headerless records the receiver may
//! not have consumed (queue pair order places them first), so a receiver
//! that learns a tail from the word, before it reaped the immediate, still
//! finds every header. Why a late reap cannot write a header over a slot
//! the sender already reused: the verbs module documentation
//! ("Headerless records"); loom: `tests/loom_headerless.rs`.

// Without the verbs transport only the models, the fuzz targets and this
// module's tests use it, and not all of it.
#![cfg_attr(not(any(feature = "verbs", loom, fuzzing)), allow(dead_code))]

use crate::record::{self, Header};

/// Bits of the payload length: a held batch is at most 16 KiB.
pub const LEN_BITS: u32 = 14;
/// Bits of the tail.
pub const TAIL_BITS: u32 = 15;
/// Largest payload a headerless record carries.
pub const MAX_LEN: u32 = (1 << LEN_BITS) - 1;
/// Largest ring (in slots) that takes headerless records.
pub const MAX_RING_SLOTS: u32 = 1 << (TAIL_BITS - 2);
/// Bits of the field in all.
pub const FIELD_BITS: u32 = LEN_BITS + TAIL_BITS;

/// The immediate's field for a record of `len` payload bytes that ends at
/// `tail`; `None` when `len` does not fit.
pub fn encode(len: u32, tail: u64) -> Option<u32> {
    if len > MAX_LEN {
        return None;
    }
    Some(len << TAIL_BITS | (tail & tail_mask()) as u32)
}

/// Where the receiver's end puts a headerless record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    /// The record's first slot, as an index into the ring.
    pub slot: u64,
    /// The header word to write there.
    pub header: u64,
    /// The tail after the record.
    pub tail: u64,
}

/// What a reaped field means for a receiver copy whose tail is `current`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hint {
    /// The copy's tail is already at or past the record (reaped after a
    /// later tail was placed): nothing to write.
    Stale,
    /// Write `header` at `slot`, then raise the tail to `tail`.
    Place(Placement),
    /// No honest sender sends this (a record that starts before the tail
    /// the copy holds, runs past the ring's end or more than a ring
    /// ahead): the connection is corrupt.
    Bad { len: u32 },
}

/// Decodes `field` against `current`, the tail in the copy, for a ring of
/// `slots` slots of `slot_size` bytes.
pub fn place(current: u64, field: u32, slots: u64, slot_size: usize) -> Hint {
    let len = (field >> TAIL_BITS) & MAX_LEN;
    let hint = u64::from(field) & tail_mask();
    let ahead = hint.wrapping_sub(current) & tail_mask();
    if ahead == 0 || ahead >= 1 << (TAIL_BITS - 1) {
        return Hint::Stale;
    }
    let tail = current + ahead;
    let count = record::slots_for(len as usize, slot_size) as u64;
    if ahead > slots || count > ahead {
        return Hint::Bad { len };
    }
    let first = tail - count;
    let slot = first % slots;
    if slot + count > slots {
        return Hint::Bad { len };
    }
    Hint::Place(Placement {
        slot,
        header: Header { flags: 0, len }.encode(),
        tail,
    })
}

fn tail_mask() -> u64 {
    (1 << TAIL_BITS) - 1
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SLOTS: u64 = 4096;
    const SS: usize = 256;

    #[test]
    fn a_4k_message_round_trips() {
        let field = encode(4096, 100 + 17).unwrap();
        assert_eq!(
            place(100, field, SLOTS, SS),
            Hint::Place(Placement {
                slot: 100,
                header: Header {
                    flags: 0,
                    len: 4096
                }
                .encode(),
                tail: 117,
            })
        );
    }

    #[test]
    fn across_the_wrap_of_the_low_bits_and_the_ring() {
        let cur = (5 << TAIL_BITS) - 1;
        let field = encode(64, cur + 1).unwrap();
        match place(cur, field, SLOTS, SS) {
            Hint::Place(p) => {
                assert_eq!(p.tail, cur + 1);
                assert_eq!(p.slot, cur % SLOTS);
            }
            h => panic!("{h:?}"),
        }
    }

    #[test]
    fn a_record_at_or_behind_the_tail_is_stale() {
        let field = encode(64, 500).unwrap();
        assert_eq!(place(500, field, SLOTS, SS), Hint::Stale);
        assert_eq!(place(500 + SLOTS, field, SLOTS, SS), Hint::Stale);
    }

    #[test]
    fn dishonest_fields_are_bad() {
        // Starts before the tail the copy holds (17 slots under 1 slot).
        let bad = |len| Hint::Bad { len };
        assert_eq!(place(100, encode(4096, 101).unwrap(), SLOTS, SS), bad(4096));
        // More than a ring ahead (a ring of 64 slots).
        assert_eq!(place(0, encode(8, 65).unwrap(), 64, SS), bad(8));
        // Would run past the ring's end: slots 62..66 of 64.
        assert_eq!(place(62, encode(1000, 66).unwrap(), 64, SS), bad(1000));
    }

    #[test]
    fn lengths_that_do_not_fit_are_refused() {
        assert!(encode(MAX_LEN, 0).is_some());
        assert_eq!(encode(MAX_LEN + 1, 0), None);
    }

    proptest! {
        /// Whatever the field, a placement lies inside the ring, raises
        /// the tail by at most a ring and covers exactly the record.
        #[test]
        fn any_field_places_inside_the_ring(
            current in 0u64..1 << 40,
            field in any::<u32>(),
            slots_log in 2u32..=13,
            ss_log in 6u32..=12,
        ) {
            let slots = 1u64 << slots_log;
            let ss = 1usize << ss_log;
            if let Hint::Place(p) = place(current, field, slots, ss) {
                let h = Header::decode(p.header).unwrap();
                let count = record::slots_for(h.len as usize, ss) as u64;
                prop_assert!(p.tail > current && p.tail - current <= slots);
                prop_assert!(p.tail - count >= current);
                prop_assert!(p.slot + count <= slots);
                prop_assert_eq!(p.slot, (p.tail - count) % slots);
            }
        }

        /// An honest record (one that starts at or after the copy's tail,
        /// within a ring) decodes to itself.
        #[test]
        fn honest_records_round_trip(
            current in 0u64..1 << 40,
            gap in 0u64..64,
            len in 0u32..=MAX_LEN,
        ) {
            let slots = 4096u64;
            let count = record::slots_for(len as usize, 256) as u64;
            let first = current + gap;
            // Records never wrap past the ring's end.
            prop_assume!(first % slots + count <= slots);
            let tail = first + count;
            match place(current, encode(len, tail).unwrap(), slots, 256) {
                Hint::Place(p) => {
                    prop_assert_eq!(p.tail, tail);
                    prop_assert_eq!(p.slot, first % slots);
                    prop_assert_eq!(Header::decode(p.header), Some(Header { flags: 0, len }));
                }
                h => prop_assert!(false, "{:?}", h),
            }
        }
    }
}
