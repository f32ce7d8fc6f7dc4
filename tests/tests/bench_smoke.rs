//! Smoke test of the benchmark harness: `scripts/bench --quick` runs every
//! suite on kernel TCP and under ringsock, and its report is well formed:
//! each table has its header, one row for every row the harness planned
//! (plan.txt), numeric medians, ranges and ratios, a `via ring` verdict;
//! the ablation table is there; the CSVs and the plots it names exist. The
//! figures themselves are not checked (they depend on the machine). A
//! workload that failed (a program that stalls or breaks under the shim)
//! is a well-formed `FAILED` row: it is printed here, and the harness's
//! own exit status 1 says so, but it is the program's integration test
//! that has to catch it; at least half the rows must carry numbers.
//!
//! Uses release binaries (`<target>/release`, built here if needed: the
//! figures of a debug shim would mean nothing and the runs are timed).
//! `RINGSOCK_SKIP_BENCH_SMOKE=1` skips it.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use ringsock_integration::{require, TempDir};

fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    // <target>/<profile>/deps/<test binary>
    exe.parent()
        .and_then(Path::parent)
        .and_then(Path::parent)
        .expect("target dir")
        .to_path_buf()
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

fn build_release(target: &Path) {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    for args in [
        &["-p", "ringsock-preload"][..],
        &[
            "--bins",
            "-p",
            "ringsock-ctl",
            "-p",
            "ringsock-ring",
            "-p",
            "ringsock-integration",
        ][..],
    ] {
        let out = Command::new(&cargo)
            .current_dir(workspace())
            .args(["build", "--quiet", "--release", "--target-dir"])
            .arg(target)
            .args(args)
            .output()
            .expect("running cargo build");
        assert!(
            out.status.success(),
            "cargo build --release {args:?} failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

fn is_num(s: &str) -> bool {
    s.trim().parse::<f64>().map(f64::is_finite).unwrap_or(false)
}

/// "123.4 (120.0–130.5)": median, then min–max in parentheses.
fn is_stat_cell(cell: &str) -> bool {
    let Some((median, rest)) = cell.split_once(" (") else {
        return false;
    };
    let Some(range) = rest.strip_suffix(')') else {
        return false;
    };
    let Some((lo, hi)) = range.split_once('–') else {
        return false;
    };
    is_num(median) && is_num(lo) && is_num(hi)
}

fn cells(line: &str) -> Vec<String> {
    let t = line.trim();
    let inner = t
        .strip_prefix('|')
        .and_then(|x| x.strip_suffix('|'))
        .unwrap_or(t);
    inner.split('|').map(|c| c.trim().to_string()).collect()
}

/// Every table whose header starts with `first`: (header, rows).
fn tables(md: &str, first: &str) -> Vec<(Vec<String>, Vec<Vec<String>>)> {
    let lines: Vec<&str> = md.lines().collect();
    let mut out = vec![];
    let mut i = 0;
    while i < lines.len() {
        let h = cells(lines[i]);
        if lines[i].starts_with('|') && h.first().map(String::as_str) == Some(first) {
            assert!(
                i + 1 < lines.len() && lines[i + 1].starts_with("|---"),
                "table header without separator: {}",
                lines[i]
            );
            let mut rows = vec![];
            let mut j = i + 2;
            while j < lines.len() && lines[j].starts_with('|') {
                let r = cells(lines[j]);
                assert_eq!(
                    r.len(),
                    h.len(),
                    "row has {} cells, header {}: {}",
                    r.len(),
                    h.len(),
                    lines[j]
                );
                rows.push(r);
                j += 1;
            }
            out.push((h, rows));
            i = j;
        } else {
            i += 1;
        }
    }
    out
}

#[test]
fn bench_quick_report_is_well_formed() {
    if std::env::var_os("RINGSOCK_SKIP_BENCH_SMOKE").is_some() {
        println!("SKIP: RINGSOCK_SKIP_BENCH_SMOKE is set");
        return;
    }
    require!(
        "python3",
        "iperf3",
        "sockperf",
        "redis-server",
        "redis-benchmark",
        "nginx",
        "wrk",
        "memcached",
        "memcslap"
    );
    let target = target_dir();
    build_release(&target);
    let out = TempDir::new("bench");
    let res = out.path().join("res");
    let mut child = Command::new(workspace().join("scripts/bench"))
        .arg("--quick")
        .arg("--out")
        .arg(&res)
        .env("RINGSOCK_BIN", target.join("release"))
        .env_remove("LD_PRELOAD")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running scripts/bench");
    // Quick mode is meant to finish in under 3 minutes on 2 cores; allow
    // a loaded machine more before calling it hung.
    let limit = Duration::from_secs(600);
    let t0 = std::time::Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if t0.elapsed() > limit {
            // SIGTERM: the harness kills its servers and exits.
            // SAFETY: kill(2) on our own child's pid.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            std::thread::sleep(Duration::from_secs(5));
            let _ = child.kill();
            panic!("scripts/bench --quick took over {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let output = child.wait_with_output().expect("output");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    println!("scripts/bench --quick: {status} in {:?}", t0.elapsed());
    // 0: all ran; 1: some workload failed (its row says FAILED); else broken.
    assert!(
        matches!(status.code(), Some(0 | 1)),
        "scripts/bench --quick failed ({status}):\n{stdout}\n{stderr}"
    );

    let md = std::fs::read_to_string(res.join("results.md")).expect("results.md");
    let plan = std::fs::read_to_string(res.join("plan.txt")).expect("plan.txt");
    let tabs = tables(&md, "workload");
    assert!(!tabs.is_empty(), "no result table in:\n{md}");
    let mut rows: Vec<Vec<String>> = vec![];
    for (h, r) in &tabs {
        assert_eq!(
            &h[..4],
            &["workload", "metric", "kernel TCP", "ringsock"],
            "header: {h:?}"
        );
        assert_eq!(h.last().map(String::as_str), Some("via ring"));
        assert_eq!(h.len(), 6, "header: {h:?}");
        rows.extend(r.iter().cloned());
    }
    let failed: Vec<&Vec<String>> = rows.iter().filter(|r| r[2] == "FAILED").collect();
    for r in &failed {
        assert!(
            r[2..5].iter().all(|c| c == "FAILED") && r[5] == "-",
            "FAILED row: {r:?}"
        );
        println!(
            "WARNING: scripts/bench workload failed: {} / {}",
            r[0], r[1]
        );
    }
    assert_eq!(
        failed.is_empty(),
        status.success(),
        "exit status {status} with {} FAILED rows:\n{stderr}",
        failed.len()
    );
    assert!(
        failed.len() * 2 <= rows.len(),
        "most workloads failed:\n{md}\n{stderr}"
    );
    for r in rows.iter().filter(|r| r[2] != "FAILED") {
        assert!(
            is_stat_cell(&r[2]) && is_stat_cell(&r[3]),
            "not numeric: {r:?}"
        );
        assert!(is_num(&r[4]), "ratio not numeric: {r:?}");
        let verdict = r[5].split_whitespace().next().unwrap_or("");
        assert!(
            ["yes", "no", "partial"].contains(&verdict),
            "via ring: {r:?}"
        );
    }
    let planned: Vec<&str> = plan.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(planned.len() > 10, "plan too short:\n{plan}");
    for p in &planned {
        let parts: Vec<&str> = p.split(" | ").collect();
        assert_eq!(parts.len(), 3, "plan line: {p}");
        let n = rows
            .iter()
            .filter(|r| r[0] == parts[1] && r[1] == parts[2])
            .count();
        assert_eq!(n, 1, "{n} rows for planned `{p}` in:\n{md}");
    }
    assert_eq!(rows.len(), planned.len(), "rows beyond the plan:\n{md}");
    for suite in [
        "msgsize",
        "conns",
        "procs",
        "shapes",
        "redis",
        "nginx",
        "memcached",
        "iperf3",
    ] {
        assert!(
            planned.iter().any(|p| p.starts_with(&format!("{suite} |"))),
            "suite {suite} not planned"
        );
    }

    let abl = tables(&md, "variant");
    assert_eq!(abl.len(), 1, "ablation table missing:\n{md}");
    let (h, r) = &abl[0];
    assert!(h.len() >= 2 && r.len() >= 3, "ablation table: {h:?} {r:?}");
    for row in r {
        assert!(row[1..].iter().all(|c| is_num(c)), "ablation row: {row:?}");
    }

    let csv = std::fs::read_to_string(res.join("results.csv")).expect("results.csv");
    assert!(csv.starts_with("suite,workload,x,metric,unit,better,system,median"));
    // One CSV line per planned row and system.
    assert_eq!(csv.lines().count() - 1, planned.len() * 2, "{csv}");
    assert!(res.join("raw.csv").exists());
    for line in md.lines().filter(|l| l.starts_with("![")) {
        let name = line
            .split_once("](")
            .and_then(|(_, x)| x.strip_suffix(')'))
            .expect("image line");
        let meta = std::fs::metadata(res.join(name)).expect("plot named in results.md");
        assert!(meta.len() > 1000, "{name} is empty");
    }
}
