//! Just enough JSON output for `status --json`: escaped strings, numbers,
//! null. Hand-written to keep the daemon free of serde.

use std::fmt::Write;

/// Appends `s` as a JSON string literal: quotes, backslashes and control
/// characters escaped; everything else is valid UTF-8 already.
pub fn string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || c == '\u{7f}' || c == '\u{2028}' || c == '\u{2029}' => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// `"key":` with the key escaped.
pub fn key(out: &mut String, k: &str) {
    string(out, k);
    out.push(':');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes() {
        let mut s = String::new();
        string(&mut s, "a\"b\\c\nd\u{1}é\u{2028}");
        assert_eq!(s, r#""a\"b\\c\nd\u0001é\u2028""#);
    }
}
