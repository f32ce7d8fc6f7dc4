//! curl as the tests fetch with it.

use std::path::Path;

use crate::proc::Cmd;

/// `base` (a shimmed or plain `curl`) fetching `url` into `dest`: an HTTP
/// error fails it, 30 s at most. `rate` (curl's --limit-rate, e.g. "4M")
/// slows a big fetch down so that status sees it while it runs.
pub fn curl(base: Cmd, url: &str, dest: &Path, rate: Option<&str>) -> Cmd {
    let mut c = base.args(["-sS", "--fail", "--max-time", "30"]);
    if let Some(r) = rate {
        c = c.args(["--limit-rate", r]);
    }
    c.arg("-o").arg(dest).arg(url)
}
