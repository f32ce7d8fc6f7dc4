//! A readable difference between a role's plain and shim logs.

use similar::{ChangeTag, TextDiff};

/// The lines that differ, with two lines of context, `-` for the plain
/// run (the kernel: what should be) and `+` for the shim run.
pub fn diff(role: &str, plain: &[String], shim: &[String]) -> String {
    let a = plain.join("\n") + "\n";
    let b = shim.join("\n") + "\n";
    let d = TextDiff::from_lines(&a, &b);
    let mut out = format!("{role} log differs (- plain, + shim):\n");
    for group in d.grouped_ops(2) {
        out.push_str("  @@\n");
        for op in group {
            for change in d.iter_changes(&op) {
                let sign = match change.tag() {
                    ChangeTag::Delete => '-',
                    ChangeTag::Insert => '+',
                    ChangeTag::Equal => ' ',
                };
                out.push_str(&format!("  {sign} {}", change.value()));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::diff;

    #[test]
    fn shows_the_changed_line_against_the_kernel() {
        let a: Vec<String> = ["x", "recv = 5", "y"].map(String::from).to_vec();
        let b: Vec<String> = ["x", "recv = -1 EAGAIN", "y"].map(String::from).to_vec();
        let d = diff("server", &a, &b);
        assert!(d.contains("  - recv = 5\n"), "{d}");
        assert!(d.contains("  + recv = -1 EAGAIN\n"), "{d}");
    }
}
