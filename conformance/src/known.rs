//! Scenarios that differ under the shim today, and how. The suite fails
//! when a scenario missing here differs, and when one listed here matches
//! the kernel again (so the table only shrinks, and stays true).

/// A known difference.
pub struct Known {
    pub name: &'static str,
    /// What differs, in one line (plain vs shim).
    pub diff: &'static str,
}

pub const KNOWN: &[Known] = &[];

/// The known difference of scenario `name`, if any.
pub fn known(name: &str) -> Option<&'static Known> {
    KNOWN.iter().find(|k| k.name == name)
}
