//! Scenarios that differ under the shim today, and how (kernel first,
//! then the shim). The suite fails when a scenario missing here differs,
//! and when one listed here matches the kernel again, so the table only
//! shrinks and stays true. An entry marked `sometimes` is a difference
//! that shows in some runs only (a race in the shim): the suite accepts
//! either verdict for it, so it cannot tell when it is fixed; keep those
//! few and remove one as soon as its fix is in.

/// A known difference.
pub struct Known {
    pub name: &'static str,
    /// What differs, in one line (the kernel's answer vs the shim's).
    pub diff: &'static str,
    /// The difference shows in some runs only.
    pub sometimes: bool,
}

// No scenario differs today; the runner honours entries made with these.
#[allow(dead_code)]
const fn k(name: &'static str, diff: &'static str) -> Known {
    Known {
        name,
        diff,
        sometimes: false,
    }
}

#[allow(dead_code)]
const fn sometimes(name: &'static str, diff: &'static str) -> Known {
    Known {
        name,
        diff,
        sometimes: true,
    }
}

pub const KNOWN: &[Known] = &[];

/// The known difference of scenario `name`, if any.
pub fn known(name: &str) -> Option<&'static Known> {
    KNOWN.iter().find(|k| k.name == name)
}

#[cfg(test)]
mod tests {
    use super::KNOWN;
    use crate::scenario::all;

    #[test]
    fn every_entry_names_a_scenario_once() {
        let names: Vec<&str> = all().iter().map(|s| s.name).collect();
        for (i, k) in KNOWN.iter().enumerate() {
            assert!(
                names.contains(&k.name),
                "known.rs lists `{}`, no such scenario",
                k.name
            );
            assert!(
                KNOWN[..i].iter().all(|o| o.name != k.name),
                "known.rs lists `{}` twice",
                k.name
            );
            assert!(
                !k.diff.is_empty() && !k.diff.contains('\n'),
                "`{}`: one line",
                k.name
            );
        }
    }
}
