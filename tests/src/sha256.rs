//! SHA-256 checksums of what the programs under test sent and received,
//! as the lowercase hex `sha256sum` and Python's `hexdigest()` print.

use sha2::{Digest, Sha256};

/// The SHA-256 of `data`, as lowercase hex.
pub fn hex(data: &[u8]) -> String {
    Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Panics unless `got` is `want`, by length and then by checksum (a
/// message that names the difference without dumping megabytes).
pub fn assert_same(what: &str, got: &[u8], want: &[u8]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    assert_eq!(hex(got), hex(want), "{what}: checksum");
}

/// Panics unless the file at `path` holds exactly `want`.
pub fn assert_file(what: &str, path: &std::path::Path, want: &[u8]) {
    let got = std::fs::read(path).unwrap_or_else(|e| panic!("{what}: {}: {e}", path.display()));
    assert_same(what, &got, want);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_vectors() {
        assert_eq!(
            hex(b""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(
            hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        let million = vec![b'a'; 1_000_000];
        assert_eq!(
            hex(&million),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"
        );
    }
}
