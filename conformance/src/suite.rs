//! Running many scenarios (a few at a time) and judging each against the
//! known-differences table.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use crate::known::known;
use crate::runner::{check, Place, Verdict};

/// One scenario's result.
pub struct Outcome {
    pub name: String,
    pub verdict: Verdict,
    pub secs: f64,
}

impl Outcome {
    /// Ok when the verdict is what the known table says: the same as the
    /// kernel for a scenario not listed, different for one listed (either,
    /// for one listed as `sometimes`).
    pub fn judge(&self) -> Result<(), String> {
        let k = known(&self.name);
        match (&self.verdict, k) {
            (Verdict::Broken(r), _) => Err(format!("BROKEN {}\n{r}", self.name)),
            (Verdict::Same, None) | (Verdict::Differs(_), Some(_)) => Ok(()),
            (Verdict::Same, Some(k)) if k.sometimes => Ok(()),
            (Verdict::Differs(r), None) => {
                Err(format!("DIFFERS {} (not in known.rs)\n{r}", self.name))
            }
            (Verdict::Same, Some(k)) => Err(format!(
                "MATCHES {}: it is kernel-exact now; remove it from known.rs (it said: {})",
                self.name, k.diff
            )),
        }
    }

    /// One status word: same, differs, broken.
    pub fn word(&self) -> &'static str {
        match self.verdict {
            Verdict::Same => "same",
            Verdict::Differs(_) => "differs",
            Verdict::Broken(_) => "broken",
        }
    }
}

/// Runs `names` with `jobs` scenarios at a time; `each` sees every
/// outcome as it completes. Returns them in the order of `names`.
pub fn run_all(
    bin: &Path,
    names: &[String],
    jobs: usize,
    place: &Place,
    each: impl Fn(&Outcome) + Sync,
) -> Vec<Outcome> {
    let next = AtomicUsize::new(0);
    let out: Mutex<Vec<Outcome>> = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..jobs.max(1) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(name) = names.get(i) else { break };
                let t = Instant::now();
                let verdict = check(bin, name, place);
                let o = Outcome {
                    name: name.clone(),
                    verdict,
                    secs: t.elapsed().as_secs_f64(),
                };
                each(&o);
                out.lock().expect("outcomes").push(o);
            });
        }
    });
    let mut v = out.into_inner().expect("outcomes");
    v.sort_by_key(|o| names.iter().position(|n| *n == o.name));
    v
}
