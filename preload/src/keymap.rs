//! Hash maps keyed by descriptors, ids and socket addresses, with a cheap
//! mixing hasher instead of SipHash: the shim looks these up on every
//! connect and close, and their keys come from the program itself (its
//! descriptors and destinations, in maps of bounded size), so hash
//! flooding buys an attacker nothing it could not do to itself.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A `HashMap` with `KeyHasher`.
pub type KeyMap<K, V> = HashMap<K, V, BuildHasherDefault<KeyHasher>>;

/// Folds the key's words and bytes in, then spreads them with splitmix64's
/// finaliser: descriptors, counters, addresses and ports all spread well.
#[derive(Default)]
pub struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }

    fn write_u16(&mut self, n: u16) {
        self.write_u64(u64::from(n));
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = self.0.rotate_left(17) ^ n;
    }

    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;
    use std::net::SocketAddr;

    fn hash<T: std::hash::Hash>(v: T) -> u64 {
        BuildHasherDefault::<KeyHasher>::default().hash_one(v)
    }

    #[test]
    fn every_part_of_a_key_counts() {
        let a: SocketAddr = "127.0.0.1:80".parse().unwrap();
        let b: SocketAddr = "127.0.0.1:81".parse().unwrap();
        let c: SocketAddr = "127.0.0.2:80".parse().unwrap();
        let d: SocketAddr = "[::ffff:127.0.0.1]:80".parse().unwrap();
        let hs = [hash(a), hash(b), hash(c), hash(d)];
        for i in 0..hs.len() {
            for j in i + 1..hs.len() {
                assert_ne!(hs[i], hs[j], "{i} and {j}");
            }
        }
        assert_ne!(hash(3i32), hash(4i32));
        assert_eq!(hash(7u64), hash(7u64));
    }

    #[test]
    fn a_map_of_descriptors_finds_each() {
        let mut m: KeyMap<i32, i32> = KeyMap::default();
        for fd in 0..5000 {
            m.insert(fd, fd * 2);
        }
        for fd in 0..5000 {
            assert_eq!(m.get(&fd), Some(&(fd * 2)));
        }
        assert_eq!(m.remove(&17), Some(34));
        assert_eq!(m.len(), 4999);
    }
}
