//! The scenario registry: a name, what it checks, and the code both roles
//! run (one function; it branches on `Role::side` where the ends differ).

use crate::role::Role;
use crate::scenarios;

pub type Body = Box<dyn Fn(&mut Role) + Send + Sync>;

pub struct Scenario {
    pub name: &'static str,
    /// One line: what the scenario checks.
    pub about: &'static str,
    pub body: Body,
}

/// A scenario whose roles run `f`.
pub fn sc(name: &'static str, about: &'static str, f: fn(&mut Role)) -> Scenario {
    Scenario {
        name,
        about,
        body: Box::new(f),
    }
}

/// Every scenario, in the order the suite runs and lists them.
pub fn all() -> Vec<Scenario> {
    let mut v = Vec::new();
    v.extend(scenarios::basics::list());
    v.extend(scenarios::calls::list());
    v.extend(scenarios::options::list());
    v.extend(scenarios::readiness::list());
    v.extend(scenarios::epoll::list());
    v.extend(scenarios::oob::list());
    v.extend(scenarios::death::list());
    v.extend(scenarios::fds::list());
    v.extend(scenarios::share::list());
    v.extend(scenarios::spawn::list());
    v.extend(scenarios::python::list());
    v
}

/// The scenario called `name`.
pub fn find(name: &str) -> Option<Scenario> {
    all().into_iter().find(|s| s.name == name)
}

#[cfg(test)]
mod tests {
    use super::all;

    #[test]
    fn names_are_unique_and_there_are_enough() {
        let list = all();
        let mut names: Vec<&str> = list.iter().map(|s| s.name).collect();
        names.sort_unstable();
        let n = names.len();
        names.dedup();
        assert_eq!(names.len(), n, "duplicate scenario names");
        assert!(n >= 80, "only {n} scenarios");
    }
}
