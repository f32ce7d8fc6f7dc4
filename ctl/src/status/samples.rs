//! `status --from FILE`: listings a sampler saved, one `status --json`
//! output per line (blank lines skipped).

use std::path::Path;

use ringsock_proto::StatusEntry;

use super::json;

/// The listings in `files`, in order. A line that is not a listing (a
/// sample cut short when its sampler was stopped, an error message) is
/// reported on stderr and skipped: a check over the rest still means
/// what it says, and one that needs a sample fails for want of it.
pub fn read(files: &[impl AsRef<Path>]) -> Result<Vec<Vec<StatusEntry>>, String> {
    let mut out = Vec::new();
    for f in files {
        let f = f.as_ref();
        let text = std::fs::read_to_string(f)
            .map_err(|e| format!("cannot read samples from {}: {e}", f.display()))?;
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            match json::parse(line) {
                Ok(listing) => out.push(listing),
                Err(e) => eprintln!(
                    "ringsock-ctl: {}:{}: not a status listing ({e}); skipped",
                    f.display(),
                    i + 1
                ),
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::tests::entry;

    #[test]
    fn reads_listings_line_by_line() {
        let dir = std::env::temp_dir().join(format!("rsctl-samples-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (a, b) = (dir.join("a"), dir.join("b"));
        let one = json::render(&[entry()]);
        std::fs::write(&a, format!("{one}\n{}", json::render(&[]))).unwrap();
        std::fs::write(&b, format!("ringsock-ctl: no daemon\n{}{{\"conn", one)).unwrap();
        let got = read(&[&a, &b]).unwrap();
        assert_eq!(got, vec![vec![entry()], vec![], vec![entry()]]);
        assert!(read(&[dir.join("none")])
            .unwrap_err()
            .contains("cannot read samples from"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
