//! The observation log: one line per observable event, appended to a file
//! the runner names. Every process of a role (a forked child, an exec'd
//! image, a descriptor's receiver) appends to the same file under its own
//! tag; the protocol between them (barriers, batons) orders the lines, so
//! two runs of a scenario print the same lines exactly when the program
//! observed the same things.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::sync::Arc;

/// A tagged writer on a role's log file; clones share the file.
#[derive(Clone)]
pub struct Log {
    file: Arc<File>,
    tag: String,
}

impl Log {
    /// Opens (creating) `path` for appending; lines are tagged `tag`.
    pub fn open(path: &Path, tag: &str) -> Log {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .unwrap_or_else(|e| panic!("opening log {}: {e}", path.display()));
        Log {
            file: Arc::new(file),
            tag: tag.to_string(),
        }
    }

    /// The same file under another tag (a forked child's lines).
    pub fn tagged(&self, tag: &str) -> Log {
        Log {
            file: self.file.clone(),
            tag: tag.to_string(),
        }
    }

    /// Appends `tag: text` as one write: O_APPEND keeps lines of
    /// processes sharing the file whole.
    pub fn line(&self, text: impl AsRef<str>) {
        let line = format!("{}: {}\n", self.tag, text.as_ref());
        if (&*self.file).write_all(line.as_bytes()).is_err() {
            std::process::exit(90);
        }
    }
}

/// FNV-1a, 64 bits: a received stream's fingerprint.
pub fn fnv(data: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in data {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Short printable data quoted (`"ping"`), anything else by fingerprint
/// (`h=0123456789abcdef`).
pub fn show(data: &[u8]) -> String {
    if data.len() <= 48 && data.iter().all(|b| b.is_ascii_graphic() || *b == b' ') {
        format!("\"{}\"", String::from_utf8_lossy(data))
    } else {
        format!("h={:016x}", fnv(data))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv_matches_the_reference_values() {
        assert_eq!(fnv(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv(b"a"), 0xaf63_dc4c_8601_ec8c);
    }

    #[test]
    fn short_text_is_quoted_and_the_rest_hashed() {
        assert_eq!(show(b"ping"), "\"ping\"");
        assert_eq!(show(&[0u8, 1]), format!("h={:016x}", fnv(&[0, 1])));
    }
}
