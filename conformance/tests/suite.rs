//! The differential conformance suite: every scenario runs plain and with
//! both ends under the shim (a private daemon, rings checked at the
//! barriers), two scenarios at a time. The test fails when a scenario
//! that is not in known.rs differs from the kernel or hangs, when one
//! that is listed there matches the kernel again, and when a plain run
//! itself fails (a broken scenario).
//!
//! `CONFORM_SCENARIOS=a,b` runs only those (for debugging one).

use std::path::PathBuf;

use ringsock_conformance::runner::Place;
use ringsock_conformance::{scenario, suite};

#[test]
fn every_scenario_is_kernel_exact_or_known() {
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_conform"));
    let names: Vec<String> = match std::env::var("CONFORM_SCENARIOS") {
        Ok(list) => list.split(',').map(str::to_string).collect(),
        Err(_) => scenario::all().iter().map(|s| s.name.to_string()).collect(),
    };
    let outcomes = suite::run_all(&bin, &names, 2, &Place::Local, |o| {
        let mark = if o.judge().is_ok() { "ok " } else { "BAD" };
        println!("{mark} {:8} {:5.1}s {}", o.word(), o.secs, o.name);
    });
    let failures: Vec<String> = outcomes.iter().filter_map(|o| o.judge().err()).collect();
    assert!(
        failures.is_empty(),
        "{} of {} scenarios are not as conformance/src/known.rs says:\n\n{}",
        failures.len(),
        outcomes.len(),
        failures.join("\n\n")
    );
}
