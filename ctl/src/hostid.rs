//! A stable 64-bit identifier of this host, for peers to tell hosts apart.

use std::fs;

/// FNV-1a: tiny, stable across versions (unlike std's hasher).
fn fnv1a(data: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in data {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Derived from /etc/machine-id (stable across reboots), else the boot id,
/// else the hostname.
pub fn host_id() -> u64 {
    for path in [
        "/etc/machine-id",
        "/var/lib/dbus/machine-id",
        "/proc/sys/kernel/random/boot_id",
        "/proc/sys/kernel/hostname",
    ] {
        if let Ok(s) = fs::read_to_string(path) {
            let s = s.trim();
            if !s.is_empty() {
                return fnv1a(s.as_bytes());
            }
        }
    }
    fnv1a(b"ringsock-unknown-host")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv_known_value() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }

    #[test]
    fn stable() {
        assert_eq!(host_id(), host_id());
    }
}
