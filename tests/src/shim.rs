//! Locating (and building) `libringsock.so` and the `ringsock-ctl` binary.
//!
//! A test binary lives in `<target>/<profile>/deps/`, a crate's binary
//! (such as the conformance suite's `conform`) in `<target>/<profile>/`;
//! the shim is built as `<target>/<profile>/libringsock.so`. Deriving the
//! path from the running binary's own location honours CARGO_TARGET_DIR,
//! `--target-dir` and the profile without any build script. The first call runs
//! `cargo build -p ringsock-preload` for that target dir and profile (a
//! no-op when up to date), using the cargo that runs the tests ($CARGO).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

static SHIM: OnceLock<PathBuf> = OnceLock::new();
static CTL: OnceLock<PathBuf> = OnceLock::new();

/// Absolute path of a freshly built `libringsock.so`. Panics with the
/// build's output if it cannot be built.
pub fn shim() -> &'static Path {
    SHIM.get_or_init(|| build("ringsock-preload", "libringsock.so"))
}

/// Absolute path of a freshly built `ringsock-ctl` (same target dir and
/// profile as the shim).
pub fn ctl_bin() -> &'static Path {
    CTL.get_or_init(|| build("ringsock-ctl", "ringsock-ctl"))
}

fn build(package: &str, artifact: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let dir = exe.parent().expect("exe dir");
    let profile_dir = if dir.file_name().is_some_and(|n| n == "deps") {
        dir.parent().expect("profile dir")
    } else {
        dir
    };
    let target = profile_dir.parent().expect("target dir");
    let profile = profile_dir
        .file_name()
        .and_then(|s| s.to_str())
        .unwrap_or("debug");
    let so = profile_dir.join(artifact);
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(workspace)
        .args(["build", "--quiet", "-p", package, "--target-dir"])
        .arg(target);
    if profile == "release" {
        cmd.arg("--release");
    }
    let out = cmd.output().expect("running cargo build");
    assert!(
        out.status.success(),
        "building {artifact} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(so.exists(), "{} missing after the build", so.display());
    so
}

/// Full path of `bin` if it is an executable on PATH (or a path to one).
pub fn which(bin: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let is_exe = |p: &Path| {
        p.metadata()
            .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            .unwrap_or(false)
    };
    if bin.contains('/') {
        let p = PathBuf::from(bin);
        return is_exe(&p).then_some(p);
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(bin))
        .find(|p| is_exe(p))
}
