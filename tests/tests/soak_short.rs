//! A 30-second `scripts/soak` (redis-benchmark -P 1 / -P 16 with redis-cli
//! readback, nginx + curl with sha256, streamcheck, iperf3 both ways,
//! python echo; all under the shim with one daemon, concurrently), with the
//! shim, daemon and streamcheck this test build made. It must exit 0, and
//! its table must show every workload run with verified traffic and no
//! mismatch or failure (the script's own leak checks are part of its exit
//! status).

use std::process::Command;
use std::time::Duration;

use ringsock_integration::{ctl_bin, require, shim};

const STREAMCHECK: &str = env!("CARGO_BIN_EXE_streamcheck");
const WORKLOADS: [&str; 7] = [
    "redis-P1",
    "redis-P16",
    "nginx",
    "streamcheck",
    "iperf3-up",
    "iperf3-down",
    "python-echo",
];

#[test]
fn soak_30_seconds() {
    require!(
        "python3",
        "redis-server",
        "redis-benchmark",
        "redis-cli",
        "nginx",
        "curl",
        "iperf3"
    );
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let mut cmd = Command::new(format!("{root}/scripts/soak"));
    cmd.args([
        "--seconds",
        "30",
        "--seed",
        "42",
        "--parallel",
        "2",
        "--no-build",
    ])
    .arg("--shim")
    .arg(shim())
    .arg("--ctl")
    .arg(ctl_bin())
    .args(["--streamcheck", STREAMCHECK])
    .env_remove("LD_PRELOAD");
    // 30 s of work, then the runs in flight finish (each bounded by the
    // script: 120 s at most).
    let out = ringsock_integration::run(cmd, "scripts/soak", Duration::from_secs(300));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let err = String::from_utf8_lossy(&out.stderr);
    println!("{text}{err}");
    assert!(
        out.status.success() && text.contains("soak: PASS"),
        "soak failed ({}):\n{text}\n{err}",
        out.status
    );
    for w in WORKLOADS {
        let row: Vec<&str> = text
            .lines()
            .find(|l| l.starts_with(&format!("| {w} |")))
            .unwrap_or_else(|| panic!("no row for {w}:\n{text}"))
            .split('|')
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .collect();
        let n = |i: usize| -> u64 { row[i].parse().unwrap_or_else(|_| panic!("{row:?}")) };
        let (runs, bytes, requests, mismatches, failures) = (n(1), n(2), n(3), n(4), n(5));
        assert!(runs >= 1, "{w} never ran: {row:?}");
        assert!(bytes > 0, "{w} verified no bytes: {row:?}");
        if w.starts_with("redis") || w == "nginx" {
            assert!(requests > 0, "{w} verified no requests: {row:?}");
        }
        assert_eq!((mismatches, failures), (0, 0), "{w}: {row:?}");
    }
    assert!(
        text.contains("leaks: 0; shim error lines: 0"),
        "leak or shim error:\n{text}"
    );
}
