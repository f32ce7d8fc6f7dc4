//! The table of live offers a daemon shares, read-only, with the local
//! processes (the memfd that comes with `HelloOk`): a server that accepts
//! a connection looks its 4-tuple up here and asks the daemon for a ring
//! only when an offer may exist, so an accept from a client that offered
//! nothing costs no round trip.
//!
//! The daemon enters an offer before it answers the offerer, and the
//! offerer connects only after that answer, so an offer is in the table
//! before its connection can be accepted. The daemon is the only writer.
//! Each entry is a seqlock: odd while being written; a reader that sees
//! an entry change under it, or the overflow count above zero (an offer the
//! table had no room for), answers "maybe", and the server asks the daemon.
//!
//! A reader looks only at the entries of its window that the occupancy
//! bitmap marks, and compares only an entry's ports word until it
//! matches: the entry of an offer for its own connection, and its bit,
//! were written before that connection existed (the daemon's answer, the
//! client's connect and the server's accept order them), so a torn read
//! can only be of another offer's entry, or of its own being removed,
//! where any answer is right. An accept from a client that offered
//! nothing, in a table of few offers, reads one bitmap word instead of a
//! window of entries. The model is in tests/loom_offers.rs.
//!
//! Layout, in 8-byte words: `[magic, slots, overflow, 5 reserved]`, then
//! the bitmap (one bit per entry, set while the entry holds a key, in
//! `slots / 64` words rounded up), then `slots` entries of 8 words:
//! `[seq, key0..key4, 2 reserved]`. A key is the client address and port
//! and the server address and port; an entry whose `seq` is even and
//! nonzero holds one, zero or even-with-zero-key is free.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};

#[cfg(loom)]
use loom::sync::atomic::{fence, AtomicU64, Ordering};
#[cfg(not(loom))]
use std::sync::atomic::{fence, AtomicU64, Ordering};

/// `magic`: "RSOFFER3" as little-endian bytes (2: a key's home slot
/// leaves its client address out; 3: the occupancy bitmap).
pub const MAGIC: u64 = u64::from_le_bytes(*b"RSOFFER3");
/// Entries in a table.
pub const SLOTS: usize = 4096;
/// Entries probed from a key's home slot.
pub const WINDOW: usize = 16;
const HEADER_WORDS: usize = 8;
const ENTRY_WORDS: usize = 8;
/// Words, and bytes, of a whole table.
pub const WORDS: usize = words_for(SLOTS);
pub const BYTES: usize = WORDS * 8;

const W_MAGIC: usize = 0;
const W_SLOTS: usize = 1;
const W_OVERFLOW: usize = 2;

/// Words of a table of `slots` entries.
pub const fn words_for(slots: usize) -> usize {
    HEADER_WORDS + bitmap_words(slots) + slots * ENTRY_WORDS
}

const fn bitmap_words(slots: usize) -> usize {
    slots.div_ceil(64)
}

/// An offer's key: where it comes from and where it goes.
pub type Key = [u64; 5];

fn addr_words(a: &SocketAddr) -> (u64, u64) {
    let ip = match a {
        SocketAddr::V4(v4) => v4.ip().to_ipv6_mapped().octets(),
        SocketAddr::V6(v6) => v6.ip().octets(),
    };
    let hi = u64::from_le_bytes(ip[..8].try_into().expect("8 bytes"));
    let lo = u64::from_le_bytes(ip[8..].try_into().expect("8 bytes"));
    (hi, lo)
}

/// The key of an offer from `client` to `server` (IPv4 as mapped IPv6, so
/// either form of one address gives one key).
pub fn key(client: &SocketAddr, server: &SocketAddr) -> Key {
    let (c0, c1) = addr_words(client);
    let (s0, s1) = addr_words(server);
    let ports = u64::from(client.port()) << 16 | u64::from(server.port()) | 1 << 32;
    [c0, c1, s0, s1, ports]
}

/// The key that says a listener on this host (in some network namespace)
/// takes connections to `server`, an address that is not loopback: a
/// client whose own namespace does not have that address offers a ring
/// for it only when this key is in the table. Its client part, `[::]:0`,
/// is no real offer's (a client port is never 0).
pub fn served_key(server: &SocketAddr) -> Key {
    key(&SocketAddr::from((Ipv6Addr::UNSPECIFIED, 0)), server)
}

/// The key that says connections to `local`, a listener's address, may
/// have been translated (DNAT) from an address a client of another
/// namespace offered a ring for: a server whose peer is not local asks
/// the daemon when its accepted socket's address has this key. Its client
/// part is `[::]:1`.
pub fn target_key(local: &SocketAddr) -> Key {
    key(&SocketAddr::from((Ipv6Addr::UNSPECIFIED, 1)), local)
}

/// The keys an offer from `client` to `server` may be stored under: the
/// client's own address, then the wildcard addresses (0.0.0.0, ::) on its
/// port, which a client that bound one offered from. Built from one key:
/// they differ only in the client address, so they share one window
/// (`Table::may_have_any`).
pub fn client_keys(client: &SocketAddr, server: &SocketAddr) -> [Key; 3] {
    let own = key(client, server);
    let mut v4 = own;
    (v4[0], v4[1]) = addr_words(&SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)));
    let mut v6 = own;
    (v6[0], v6[1]) = addr_words(&SocketAddr::from((Ipv6Addr::UNSPECIFIED, 0)));
    [own, v4, v6]
}

/// The index of a key (`% slots`): of the server address and both ports,
/// so that keys differing only in the client address (a client's own and
/// the wildcard it may have bound) share one window.
fn spread(k: &Key) -> usize {
    // FNV-1a over the words: cheap, and spread enough for ports.
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for w in &k[2..] {
        h ^= *w;
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    (h ^ h >> 29) as usize
}

/// A table over shared words (a mapping of the memfd, or a test's array).
#[derive(Clone, Copy)]
pub struct Table<'a> {
    words: &'a [AtomicU64],
    slots: usize,
}

impl<'a> Table<'a> {
    /// A view of `words`, checked: the daemon's own fresh table (`init`
    /// writes the header), or one a process mapped, which must say what it
    /// is.
    pub fn new(words: &'a [AtomicU64]) -> Option<Table<'a>> {
        Self::with_slots(words, SLOTS)
    }

    /// A table of `slots` entries (the shared one has `SLOTS`; models use
    /// a few) over `words`, if they hold that many.
    pub fn with_slots(words: &'a [AtomicU64], slots: usize) -> Option<Table<'a>> {
        (slots > 0 && words.len() >= words_for(slots)).then_some(Table { words, slots })
    }

    /// The entries, after the header and the bitmap.
    fn entries(&self) -> &'a [AtomicU64] {
        let from = HEADER_WORDS + bitmap_words(self.slots);
        &self.words[from..from + self.slots * ENTRY_WORDS]
    }

    /// The bits of the window from `start`: bit i for slot `start + i`.
    fn window_bits(&self, start: usize) -> u64 {
        let n = WINDOW.min(self.slots);
        let (mut bits, mut i) = (0u64, 0);
        while i < n {
            let slot = (start + i) % self.slots;
            let off = slot % 64;
            // To the end of this bitmap word, of the window, of the table.
            let take = (64 - off).min(n - i).min(self.slots - slot);
            let word = self.words[HEADER_WORDS + slot / 64].load(Ordering::Acquire) >> off;
            bits |= (word & (u64::MAX >> (64 - take))) << i;
            i += take;
        }
        bits
    }

    /// The bitmap word holding `slot`'s bit, and the bit.
    fn occupancy(&self, slot: usize) -> (&'a AtomicU64, u64) {
        (&self.words[HEADER_WORDS + slot / 64], 1 << (slot % 64))
    }

    /// Writes the header of a fresh (zeroed) table.
    pub fn init(&self) {
        self.words[W_SLOTS].store(self.slots as u64, Ordering::Relaxed);
        self.words[W_MAGIC].store(MAGIC, Ordering::Release);
    }

    /// Whether the header is one this build can read.
    pub fn valid(&self) -> bool {
        self.words[W_MAGIC].load(Ordering::Acquire) == MAGIC
            && self.words[W_SLOTS].load(Ordering::Relaxed) == self.slots as u64
    }

    /// The entries a key may be in: from its home slot on, `WINDOW` at
    /// most, wrapping at the end of the table.
    fn window(&self, k: &Key) -> impl Iterator<Item = (usize, &'a [AtomicU64])> + use<'a> {
        let (entries, slots) = (self.entries(), self.slots);
        let start = spread(k) % slots;
        (0..WINDOW.min(slots)).map(move |i| {
            let slot = (start + i) % slots;
            (slot, &entries[slot * ENTRY_WORDS..(slot + 1) * ENTRY_WORDS])
        })
    }

    /// Reader: false only when no offer for `k` is live (the server need
    /// not ask the daemon); true when one is, or may be.
    pub fn may_have(&self, k: &Key) -> bool {
        self.may_have_any(std::slice::from_ref(k))
    }

    /// `may_have_any` of an offer from `client` to `server` under any of
    /// its keys (`client_keys`), which are built only when their window
    /// holds a key at all.
    pub fn may_have_offer(&self, client: &SocketAddr, server: &SocketAddr) -> bool {
        !self.all_empty(&[key(client, server)]) && self.may_have_any(&client_keys(client, server))
    }

    /// `may_have_offer`, or `may_have` of `server`'s `target_key` (a
    /// translated connection's offer is under its original tuple), with
    /// one look at the header for both.
    pub fn may_have_offer_or_target(&self, client: &SocketAddr, server: &SocketAddr) -> bool {
        let target = target_key(server);
        !self.all_empty(&[key(client, server), target])
            && (self.may_have_any(&client_keys(client, server)) || self.may_have(&target))
    }

    /// Whether the table is readable, has not overflowed, and no entry of
    /// the windows of `keys` holds a key: then none of them is there.
    fn all_empty(&self, keys: &[Key]) -> bool {
        self.valid()
            && self.words[W_OVERFLOW].load(Ordering::Acquire) == 0
            && keys
                .iter()
                .all(|k| self.window_bits(spread(k) % self.slots) == 0)
    }

    /// `may_have` for any of `keys`, which differ only in their client
    /// address (they share one window). Only an entry whose ports word is
    /// theirs is read whole (module docs).
    pub fn may_have_any(&self, keys: &[Key]) -> bool {
        let Some(first) = keys.first() else {
            return false;
        };
        debug_assert!(keys.iter().all(|k| k[2..] == first[2..]), "one window");
        if !self.valid() || self.words[W_OVERFLOW].load(Ordering::Acquire) != 0 {
            return true;
        }
        // The window's entries that hold a key, from the bitmap: others are
        // not read at all, most of these are passed over on their ports
        // word alone, and an accept asks on every connection.
        let entries = self.entries();
        let start = spread(first) % self.slots;
        let mut marked = self.window_bits(start);
        while marked != 0 {
            let slot = (start + marked.trailing_zeros() as usize) % self.slots;
            marked &= marked - 1;
            let at = slot * ENTRY_WORDS;
            if entries[at + 5].load(Ordering::Relaxed) != first[4] {
                continue;
            }
            let e = &entries[at..at + ENTRY_WORDS];
            let s1 = e[0].load(Ordering::Acquire);
            if s1 & 1 == 1 {
                return true;
            }
            let held: [u64; 5] = std::array::from_fn(|j| e[1 + j].load(Ordering::Relaxed));
            fence(Ordering::Acquire);
            if e[0].load(Ordering::Relaxed) != s1 {
                return true;
            }
            if s1 != 0 && keys.contains(&held) {
                return true;
            }
        }
        false
    }

    fn write(&self, e: &[AtomicU64], k: &Key) {
        let s = e[0].load(Ordering::Relaxed);
        e[0].store(s | 1, Ordering::Relaxed);
        fence(Ordering::Release);
        for j in 0..5 {
            e[1 + j].store(k[j], Ordering::Relaxed);
        }
        e[0].store((s | 1) + 1, Ordering::Release);
    }

    fn is_free(e: &[AtomicU64]) -> bool {
        e[5].load(Ordering::Relaxed) == 0
    }

    /// Writer (the daemon alone): enters `k`. False when its window is
    /// full; the overflow count then makes every reader ask the daemon
    /// until the matching `remove`.
    pub fn insert(&self, k: &Key) -> bool {
        for (slot, e) in self.window(k) {
            if Self::is_free(e) {
                self.write(e, k);
                // After the entry: a reader that sees the bit finds the
                // key or a write in progress (which says "maybe").
                let (word, bit) = self.occupancy(slot);
                word.fetch_or(bit, Ordering::Release);
                return true;
            }
        }
        self.words[W_OVERFLOW].fetch_add(1, Ordering::AcqRel);
        false
    }

    /// Writer: removes `k` (entered by `insert`, which said whether it had
    /// room: `stored`).
    pub fn remove(&self, k: &Key, stored: bool) {
        if !stored {
            self.words[W_OVERFLOW].fetch_sub(1, Ordering::AcqRel);
            return;
        }
        for (slot, e) in self.window(k) {
            if (0..5).all(|j| e[1 + j].load(Ordering::Relaxed) == k[j]) {
                self.write(e, &[0; 5]);
                let (word, bit) = self.occupancy(slot);
                word.fetch_and(!bit, Ordering::Release);
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> Vec<AtomicU64> {
        (0..WORDS).map(|_| AtomicU64::new(0)).collect()
    }

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn served_keys_are_no_offers_key() {
        let c = addr("10.0.0.1:40000");
        let s = addr("10.0.0.2:6379");
        let k = served_key(&s);
        assert!(!client_keys(&c, &s).contains(&k));
        assert_ne!(k, served_key(&addr("10.0.0.2:6380")));
        assert_eq!(k, served_key(&addr("[::ffff:10.0.0.2]:6379")));
    }

    #[test]
    fn entered_offers_are_found_and_others_are_not() {
        let w = table();
        let t = Table::new(&w).unwrap();
        t.init();
        let a = key(&addr("127.0.0.1:40000"), &addr("127.0.0.1:6379"));
        let b = key(&addr("127.0.0.1:40001"), &addr("127.0.0.1:6379"));
        assert!(!t.may_have(&a));
        assert!(t.insert(&a));
        assert!(t.may_have(&a));
        assert!(!t.may_have(&b));
        t.remove(&a, true);
        assert!(!t.may_have(&a));
        // An IPv4 address and its mapped IPv6 form are one key.
        let m = key(&addr("[::ffff:127.0.0.1]:40000"), &addr("127.0.0.1:6379"));
        assert_eq!(m, a);
    }

    #[test]
    fn an_offer_from_a_wildcard_bound_client_is_found_in_one_window() {
        let w = table();
        let t = Table::new(&w).unwrap();
        t.init();
        let server = addr("10.0.0.2:6379");
        let offered = key(&addr("0.0.0.0:40000"), &server);
        assert!(t.insert(&offered));
        let variants = |client: &str| {
            let port = addr(client).port();
            let keys = [
                key(&addr(client), &server),
                key(&SocketAddr::new("0.0.0.0".parse().unwrap(), port), &server),
                key(&SocketAddr::new("::".parse().unwrap(), port), &server),
            ];
            assert_eq!(client_keys(&addr(client), &server), keys);
            keys
        };
        assert!(t.may_have_any(&variants("10.0.0.1:40000")));
        assert!(!t.may_have(&variants("10.0.0.1:40000")[0]));
        assert!(!t.may_have_any(&variants("10.0.0.1:40001")));
        assert!(t.may_have_offer(&addr("10.0.0.1:40000"), &server));
        assert!(!t.may_have_offer(&addr("10.0.0.1:40001"), &server));
        assert!(!t.may_have_offer_or_target(&addr("10.0.0.1:40001"), &server));
        assert!(t.insert(&target_key(&server)));
        assert!(t.may_have_offer_or_target(&addr("10.0.0.1:40001"), &server));
        assert!(!t.may_have_offer(&addr("10.0.0.1:40001"), &server));
        assert!(!t.may_have_any(&[]));
    }

    #[test]
    fn a_full_window_makes_every_reader_ask() {
        let w = table();
        let t = Table::new(&w).unwrap();
        t.init();
        let mut keys = Vec::new();
        let mut stored = Vec::new();
        // Enough offers that some windows fill up.
        for port in 0..(SLOTS as u16 + 200) {
            let k = key(
                &addr("10.0.0.1:1"),
                &SocketAddr::new("10.0.0.2".parse().unwrap(), port),
            );
            stored.push(t.insert(&k));
            keys.push(k);
        }
        assert!(stored.iter().any(|s| !s), "some did not fit");
        let other = key(&addr("10.9.9.9:9"), &addr("10.9.9.9:9"));
        assert!(t.may_have(&other), "overflow: ask");
        for (k, s) in keys.iter().zip(&stored) {
            assert!(t.may_have(k));
            t.remove(k, *s);
        }
        assert!(!t.may_have(&other), "every overflowed offer is gone");
        for k in &keys {
            assert!(!t.may_have(k));
        }
    }

    #[test]
    fn the_bitmap_marks_exactly_the_entries_in_use() {
        let w = table();
        let t = Table::new(&w).unwrap();
        t.init();
        let bits = |w: &[AtomicU64]| -> u32 {
            w[HEADER_WORDS..HEADER_WORDS + bitmap_words(SLOTS)]
                .iter()
                .map(|b| b.load(Ordering::Relaxed).count_ones())
                .sum()
        };
        let keys: Vec<Key> = (0..300u16)
            .map(|p| {
                key(
                    &addr("10.0.0.1:1"),
                    &SocketAddr::new("10.0.0.2".parse().unwrap(), p),
                )
            })
            .collect();
        for k in &keys {
            assert!(t.insert(k));
        }
        assert_eq!(bits(&w), 300);
        for k in &keys[..100] {
            t.remove(k, true);
        }
        assert_eq!(bits(&w), 200);
        for k in &keys[100..] {
            assert!(t.may_have(k));
            t.remove(k, true);
        }
        assert_eq!(bits(&w), 0);
        assert!(!t.may_have(&keys[0]));
    }

    #[test]
    fn an_unfinished_or_foreign_table_says_maybe() {
        let w = table();
        let t = Table::new(&w).unwrap();
        let k = key(&addr("127.0.0.1:1"), &addr("127.0.0.1:2"));
        assert!(t.may_have(&k), "no header yet");
        assert!(Table::new(&w[..10]).is_none());
    }
}
