//! The RINGSOCK_* variables `verbscheck` reads and hands to the ring
//! library, which reads no environment itself: the device choice
//! (`RINGSOCK_DEVICE`, `RINGSOCK_GID_INDEX`) and the pull-mode knobs
//! (`RINGSOCK_VERBS_MODE`, `RINGSOCK_PULL_HIGH`, `_LOW`, `_WINDOW_US`,
//! `_DWELL_MS`). An unset or empty variable keeps the library's default;
//! anything unparsable is an error naming the variable and what it
//! accepts.

use ringsock_ring::transport::verbs::{DeviceChoice, ModeKnob, PullKnobs};
use std::sync::OnceLock;
use std::time::Duration;

/// What the environment asks of the verbs transport.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerbsOptions {
    pub device: DeviceChoice,
    pub pull: PullKnobs,
}

/// The process's options (environment read once).
pub fn options() -> Result<&'static VerbsOptions, String> {
    static O: OnceLock<Result<VerbsOptions, String>> = OnceLock::new();
    O.get_or_init(|| parse(&|k| std::env::var(k).ok()))
        .as_ref()
        .map_err(Clone::clone)
}

fn parse(get: &impl Fn(&str) -> Option<String>) -> Result<VerbsOptions, String> {
    Ok(VerbsOptions {
        device: device_choice(get)?,
        pull: pull_knobs(get)?,
    })
}

fn device_choice(get: &impl Fn(&str) -> Option<String>) -> Result<DeviceChoice, String> {
    let name = get("RINGSOCK_DEVICE").filter(|s| !s.is_empty());
    let gid_index = match get("RINGSOCK_GID_INDEX") {
        Some(s) if !s.is_empty() => Some(
            s.trim()
                .parse::<u8>()
                .map_err(|_| "RINGSOCK_GID_INDEX must be in 0..=255".to_string())?,
        ),
        _ => None,
    };
    Ok(DeviceChoice { name, gid_index })
}

fn pull_knobs(get: &impl Fn(&str) -> Option<String>) -> Result<PullKnobs, String> {
    let d = PullKnobs::default();
    let val = |k: &str| {
        get(k)
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
    };
    let num = |k: &str, def: u64, max: u64| -> Result<u64, String> {
        match val(k) {
            None => Ok(def),
            Some(v) => match v.parse::<u64>() {
                Ok(n) if n <= max => Ok(n),
                _ => Err(format!("{k}={v:?}: expected a whole number 0..={max}")),
            },
        }
    };
    let mode = match val("RINGSOCK_VERBS_MODE").as_deref() {
        None => d.mode,
        Some("push") => ModeKnob::Push,
        Some("pull") => ModeKnob::Pull,
        Some("adaptive") => ModeKnob::Adaptive,
        Some(v) => {
            return Err(format!(
                "RINGSOCK_VERBS_MODE={v:?}: expected push, pull or adaptive"
            ))
        }
    };
    let high = num("RINGSOCK_PULL_HIGH", d.high, 1 << 40)?;
    let low = num("RINGSOCK_PULL_LOW", d.low.min(high), 1 << 40)?;
    if low > high {
        return Err(format!(
            "RINGSOCK_PULL_LOW={low} is above RINGSOCK_PULL_HIGH={high}"
        ));
    }
    let window = num(
        "RINGSOCK_PULL_WINDOW_US",
        d.window.as_micros() as u64,
        10_000_000,
    )?;
    if window == 0 {
        return Err("RINGSOCK_PULL_WINDOW_US=0: expected 1..=10000000".into());
    }
    let dwell = num(
        "RINGSOCK_PULL_DWELL_MS",
        d.dwell.as_millis() as u64,
        600_000,
    )?;
    Ok(PullKnobs {
        mode,
        high,
        low,
        window: Duration::from_micros(window),
        dwell: Duration::from_millis(dwell),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn knobs_default_to_push_and_parse() {
        assert_eq!(pull_knobs(&env(&[])).unwrap(), PullKnobs::default());
        assert_eq!(PullKnobs::default().mode, ModeKnob::Push);
        let k = pull_knobs(&env(&[
            ("RINGSOCK_VERBS_MODE", "adaptive"),
            ("RINGSOCK_PULL_HIGH", "10"),
            ("RINGSOCK_PULL_LOW", " 5 "),
            ("RINGSOCK_PULL_WINDOW_US", "200"),
            ("RINGSOCK_PULL_DWELL_MS", "0"),
        ]))
        .unwrap();
        assert_eq!(k.mode, ModeKnob::Adaptive);
        assert_eq!((k.high, k.low), (10, 5));
        assert_eq!(k.window, Duration::from_micros(200));
        assert_eq!(k.dwell, Duration::ZERO);
        // A low high threshold pulls the default low down with it.
        let k = pull_knobs(&env(&[("RINGSOCK_PULL_HIGH", "7")])).unwrap();
        assert_eq!((k.high, k.low), (7, 7));
        for (m, want) in [
            ("push", ModeKnob::Push),
            ("pull", ModeKnob::Pull),
            ("", ModeKnob::Push),
        ] {
            let k = pull_knobs(&env(&[("RINGSOCK_VERBS_MODE", m)])).unwrap();
            assert_eq!(k.mode, want, "{m}");
        }
    }

    #[test]
    fn knob_errors_name_the_variable() {
        for (pairs, needle) in [
            (
                &[("RINGSOCK_VERBS_MODE", "fast")][..],
                "RINGSOCK_VERBS_MODE",
            ),
            (&[("RINGSOCK_PULL_HIGH", "-1")][..], "RINGSOCK_PULL_HIGH"),
            (&[("RINGSOCK_PULL_HIGH", "1e5")][..], "whole number"),
            (
                &[("RINGSOCK_PULL_HIGH", "5"), ("RINGSOCK_PULL_LOW", "6")][..],
                "above RINGSOCK_PULL_HIGH",
            ),
            (&[("RINGSOCK_PULL_WINDOW_US", "0")][..], "WINDOW"),
            (
                &[("RINGSOCK_PULL_DWELL_MS", "x")][..],
                "RINGSOCK_PULL_DWELL_MS",
            ),
        ] {
            let e = pull_knobs(&env(pairs)).unwrap_err();
            assert!(e.contains(needle), "{e}");
        }
    }

    #[test]
    fn device_choice_names_device_and_gid() {
        assert_eq!(device_choice(&env(&[])).unwrap(), DeviceChoice::default());
        let c = device_choice(&env(&[
            ("RINGSOCK_DEVICE", "rxeB"),
            ("RINGSOCK_GID_INDEX", " 3 "),
        ]))
        .unwrap();
        assert_eq!(c.name.as_deref(), Some("rxeB"));
        assert_eq!(c.gid_index, Some(3));
        let c = device_choice(&env(&[("RINGSOCK_DEVICE", ""), ("RINGSOCK_GID_INDEX", "")]));
        assert_eq!(c.unwrap(), DeviceChoice::default());
        for bad in ["256", "-1", "x"] {
            let e = device_choice(&env(&[("RINGSOCK_GID_INDEX", bad)])).unwrap_err();
            assert!(e.contains("RINGSOCK_GID_INDEX"), "{bad}: {e}");
        }
    }
}
