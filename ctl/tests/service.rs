//! `enable` / `disable` under `--root`: the drop-in's text, the unit's own
//! LD_PRELOAD kept after the shim, bad names refused, a foreign drop-in
//! left alone; and `systemd-analyze verify` accepts the packaged unit and
//! a service with the drop-in (where systemd-analyze is installed).

mod common;

use std::fs;
use std::path::Path;
use std::process::{Command, Output};

use common::*;

fn ctl(args: &[&str], root: &Path) -> Output {
    Command::new(BIN)
        .args(args)
        .arg("--root")
        .arg(root)
        .env_remove("RINGSOCK_LIB")
        .env_remove("RINGSOCK_CTL_SOCK")
        .output()
        .unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

const UNIT: &str = "[Unit]\nDescription=demo\n[Service]\nExecStart=/usr/bin/ringsock-ctl status\nEnvironment=\"LD_PRELOAD=/opt/a.so\" OTHER=1\n";

#[test]
fn enable_writes_and_disable_removes_the_drop_in() {
    let dir = TempDir::new();
    let root = dir.path("root");
    let units = root.join("lib/systemd/system");
    fs::create_dir_all(&units).unwrap();
    fs::write(units.join("demo.service"), UNIT).unwrap();

    let o = ctl(&["enable", "demo"], &root);
    assert!(o.status.success(), "{}", text(&o));
    let drop_in = root.join("etc/systemd/system/demo.service.d/ringsock.conf");
    let t = fs::read_to_string(&drop_in).unwrap();
    assert!(
        t.contains("Environment=\"LD_PRELOAD=/usr/lib/ringsock/libringsock.so:/opt/a.so\"\n"),
        "{t}"
    );
    assert!(
        t.contains("Environment=\"RINGSOCK_CTL_SOCK=/run/ringsock/ctl.sock\"\n"),
        "{t}"
    );
    assert!(text(&o).contains("not reloading systemd"), "{}", text(&o));

    // --lib and --socket, enabling again replaces the drop-in.
    let o = ctl(
        &[
            "enable",
            "demo.service",
            "--lib",
            "/x/libringsock.so",
            "--socket",
            "/s/c.sock",
        ],
        &root,
    );
    assert!(o.status.success(), "{}", text(&o));
    let t = fs::read_to_string(&drop_in).unwrap();
    assert!(
        t.contains("LD_PRELOAD=/x/libringsock.so:/opt/a.so\""),
        "{t}"
    );
    assert!(t.contains("RINGSOCK_CTL_SOCK=/s/c.sock\""), "{t}");

    if let Some(out) = verify(&root, "demo.service") {
        panic!("systemd-analyze verify with the drop-in:\n{out}");
    }

    let o = ctl(&["disable", "demo"], &root);
    assert!(o.status.success(), "{}", text(&o));
    assert!(!drop_in.exists() && !drop_in.parent().unwrap().exists());
    let o = ctl(&["disable", "demo"], &root);
    assert!(
        o.status.success() && text(&o).contains("not enabled"),
        "{}",
        text(&o)
    );

    // A drop-in of that name we did not write stays.
    fs::create_dir_all(drop_in.parent().unwrap()).unwrap();
    fs::write(&drop_in, "[Service]\nEnvironment=A=1\n").unwrap();
    let o = ctl(&["disable", "demo"], &root);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(drop_in.exists());
}

#[test]
fn bad_unit_names_and_relative_libs_are_refused() {
    let dir = TempDir::new();
    let root = dir.path("root");
    for bad in ["../etc/passwd", "a/b", "x.socket", "", "a b", "x..y"] {
        for cmd in ["enable", "disable"] {
            let o = ctl(&[cmd, bad], &root);
            assert_eq!(o.status.code(), Some(1), "{cmd} {bad:?}: {}", text(&o));
            assert!(text(&o).contains("invalid unit name"), "{}", text(&o));
        }
    }
    let o = ctl(&["enable", "demo", "--lib", "rel/lib.so"], &root);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(!root.join("etc").exists(), "nothing written on refusal");
}

/// `systemd-analyze verify` of `unit` in `root` (with the packaged unit
/// and the host's targets beside it, and ringsock-ctl at /usr/bin): None
/// when it passes without a word or is not installed, else its output.
fn verify(root: &Path, unit: &str) -> Option<String> {
    let analyze = ["/usr/bin/systemd-analyze", "/bin/systemd-analyze"]
        .into_iter()
        .find(|p| Path::new(p).exists())?;
    let units = root.join("lib/systemd/system");
    fs::create_dir_all(root.join("usr/bin")).unwrap();
    fs::copy(BIN, root.join("usr/bin/ringsock-ctl")).unwrap();
    let packaged =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/systemd/ringsock-ctl.service");
    fs::copy(&packaged, units.join("ringsock-ctl.service")).unwrap();
    for e in fs::read_dir("/lib/systemd/system").ok()?.flatten() {
        let p = e.path();
        if p.extension().is_some_and(|x| x == "target") {
            let _ = fs::copy(&p, units.join(e.file_name()));
        }
    }
    for u in [unit, "ringsock-ctl.service"] {
        let o = Command::new(analyze)
            .args(["verify", "--man=no"])
            .arg(format!("--root={}", root.display()))
            .arg(units.join(u))
            .output()
            .ok()?;
        if !o.status.success() || !o.stderr.is_empty() || !o.stdout.is_empty() {
            return Some(format!("{u}: {}", text(&o)));
        }
    }
    None
}
