//! `ringsock-ctl enable UNIT` / `disable UNIT`: a systemd drop-in
//! (`/etc/systemd/system/UNIT.d/ringsock.conf`) that starts a service's
//! program under libringsock.so, pointed at the daemon's socket.
//!
//! systemd's `Environment=` replaces a variable, never appends to it: when
//! the unit's own files set LD_PRELOAD, the drop-in sets the shim followed
//! by that value. `--root DIR` writes under DIR (image builds, tests) and
//! never asks systemd to reload.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::run::preload_value;

/// The drop-in's file name inside `UNIT.d/`.
pub const DROP_IN: &str = "ringsock.conf";
/// First line of every drop-in we write; `disable` removes only those.
pub const MARKER: &str = "# Written by ringsock-ctl enable; removed by ringsock-ctl disable.";
/// Where the Debian package installs the shim.
pub const PACKAGED_LIB: &str = "/usr/lib/ringsock/libringsock.so";
/// Unit directories searched for the unit's own LD_PRELOAD, most
/// important first (the order systemd gives them).
const UNIT_DIRS: [&str; 4] = [
    "etc/systemd/system",
    "run/systemd/system",
    "usr/lib/systemd/system",
    "lib/systemd/system",
];
/// Unit types other than services: naming one is a mistake, not a
/// service name to extend.
const OTHER_TYPES: [&str; 10] = [
    ".socket",
    ".timer",
    ".target",
    ".mount",
    ".automount",
    ".path",
    ".slice",
    ".scope",
    ".device",
    ".swap",
];

/// A valid service unit name: `NAME` or `NAME.service`, NAME of the
/// characters systemd allows (no slash, no `..`), `.service` appended
/// when missing.
pub fn unit_name(raw: &str) -> Result<String, String> {
    let bad = |why: &str| Err(format!("invalid unit name {raw:?}: {why}"));
    if raw.is_empty() || raw.len() > 255 {
        return bad("empty or longer than 255 bytes");
    }
    if raw.contains('/') || raw.contains("..") {
        return bad("no '/' or '..' allowed");
    }
    if !raw
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || ":-_.@\\".contains(c))
    {
        return bad("only ASCII letters, digits and :-_.@\\ are allowed");
    }
    if raw.starts_with('.') || raw.starts_with('-') {
        return bad("must not start with '.' or '-'");
    }
    if let Some(t) = OTHER_TYPES.iter().find(|t| raw.ends_with(*t)) {
        return bad(&format!("a {} unit, not a service", &t[1..]));
    }
    let name = if raw.ends_with(".service") {
        raw.to_owned()
    } else {
        format!("{raw}.service")
    };
    if name.len() > 255 || name == ".service" {
        return bad("too long");
    }
    Ok(name)
}

/// The drop-in directory and file of `unit` under `root`.
pub fn drop_in_path(root: &Path, unit: &str) -> PathBuf {
    root.join("etc/systemd/system")
        .join(format!("{unit}.d"))
        .join(DROP_IN)
}

/// The assignments of one `Environment=` value: space-separated, each
/// optionally in double quotes (with `\"` and `\\` escapes).
fn assignments(v: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let (mut quoted, mut chars) = (false, v.chars());
    while let Some(c) = chars.next() {
        match c {
            '"' => quoted = !quoted,
            '\\' if quoted => cur.extend(chars.next()),
            c if c.is_whitespace() && !quoted => {
                if !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                }
            }
            c => cur.push(c),
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// The LD_PRELOAD the unit's own file and drop-ins (not ours) set last,
/// if any: the file itself first, then its drop-ins in name order.
pub fn unit_preload(root: &Path, unit: &str) -> Option<String> {
    let dir = UNIT_DIRS
        .iter()
        .map(|d| root.join(d))
        .find(|d| d.join(unit).is_file())?;
    let mut files = vec![dir.join(unit)];
    let mut drop_ins: Vec<PathBuf> = UNIT_DIRS
        .iter()
        .filter_map(|d| fs::read_dir(root.join(d).join(format!("{unit}.d"))).ok())
        .flatten()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "conf") && !p.ends_with(DROP_IN))
        .collect();
    drop_ins.sort_by_key(|p| p.file_name().map(|n| n.to_owned()));
    files.extend(drop_ins);
    let mut found = None;
    for f in files {
        let Ok(text) = fs::read_to_string(&f) else {
            continue;
        };
        for line in text.lines() {
            if let Some(v) = line.trim().strip_prefix("Environment=") {
                for a in assignments(v) {
                    if let Some(p) = a.strip_prefix("LD_PRELOAD=") {
                        found = Some(p.to_owned());
                    }
                }
            }
        }
    }
    found.filter(|p| !p.is_empty())
}

/// A value quoted for `Environment=`.
fn quote(assignment: &str) -> String {
    format!(
        "\"{}\"",
        assignment.replace('\\', "\\\\").replace('"', "\\\"")
    )
}

/// The drop-in text.
pub fn drop_in_text(lib: &Path, socket: &Path, existing: Option<&str>) -> Result<String, String> {
    let preload = preload_value(lib, existing.map(std::ffi::OsStr::new))?;
    let preload = preload
        .to_str()
        .ok_or("the shim's path is not UTF-8")?
        .to_owned();
    let socket = socket.to_str().ok_or("the socket path is not UTF-8")?;
    if socket.contains('\n') || preload.contains('\n') {
        return Err("a path contains a line feed".into());
    }
    Ok(format!(
        "{MARKER}\n[Service]\nEnvironment={}\nEnvironment={}\n",
        quote(&format!("LD_PRELOAD={preload}")),
        quote(&format!("RINGSOCK_CTL_SOCK={socket}"))
    ))
}

/// Whether systemd manages this system (what sd_booted checks).
pub fn systemd_running() -> bool {
    Path::new("/run/systemd/system").is_dir()
}

/// Asks systemd to reload units when it runs and `root` is `/`; says what
/// it did either way. A failed reload is reported, not fatal: the drop-in
/// is in place and applies at the next reload.
fn reload(root: &Path) {
    if root != Path::new("/") {
        println!(
            "not reloading systemd: files written under {}",
            root.display()
        );
        return;
    }
    if !systemd_running() {
        let init = fs::read_to_string("/proc/1/comm").unwrap_or_default();
        println!(
            "systemd is not running (PID 1 is {}): skipped systemctl daemon-reload",
            init.trim()
        );
        return;
    }
    match Command::new("systemctl").arg("daemon-reload").status() {
        Ok(s) if s.success() => println!("ran systemctl daemon-reload"),
        Ok(s) => eprintln!("ringsock-ctl: systemctl daemon-reload failed ({s})"),
        Err(e) => eprintln!("ringsock-ctl: cannot run systemctl: {e}"),
    }
}

/// `enable`: writes the drop-in (replacing ours if present).
pub fn enable(unit: &str, root: &Path, lib: &Path, socket: &Path) -> Result<(), String> {
    let unit = unit_name(unit)?;
    let path = drop_in_path(root, &unit);
    let text = drop_in_text(lib, socket, unit_preload(root, &unit).as_deref())?;
    let dir = path.parent().ok_or("no drop-in directory")?;
    fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let tmp = dir.join(format!(".{DROP_IN}.tmp"));
    fs::write(&tmp, text)
        .and_then(|()| fs::rename(&tmp, &path))
        .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    println!("wrote {}", path.display());
    reload(root);
    Ok(())
}

/// `disable`: removes our drop-in (and its directory if it is left
/// empty); a drop-in we did not write is left alone.
pub fn disable(unit: &str, root: &Path) -> Result<(), String> {
    let unit = unit_name(unit)?;
    let path = drop_in_path(root, &unit);
    match fs::read_to_string(&path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            println!("{unit} is not enabled ({} does not exist)", path.display());
            return Ok(());
        }
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
        Ok(t) if !t.starts_with(MARKER) => {
            return Err(format!(
                "{} was not written by ringsock-ctl; not removing it",
                path.display()
            ))
        }
        Ok(_) => {}
    }
    fs::remove_file(&path).map_err(|e| format!("cannot remove {}: {e}", path.display()))?;
    println!("removed {}", path.display());
    if let Some(dir) = path.parent() {
        // Fails (and stays) when other drop-ins are there.
        let _ = fs::remove_dir(dir);
    }
    reload(root);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_names() {
        assert_eq!(unit_name("redis").unwrap(), "redis.service");
        assert_eq!(unit_name("redis.service").unwrap(), "redis.service");
        assert_eq!(unit_name("getty@tty1").unwrap(), "getty@tty1.service");
        for bad in [
            "",
            "a/b",
            "../x",
            "x..y",
            "redis.socket",
            "a b",
            "-x",
            ".hidden",
            "a\nb",
            "é",
        ] {
            assert!(unit_name(bad).is_err(), "{bad:?}");
        }
        assert!(unit_name(&"a".repeat(250)).is_err());
    }

    #[test]
    fn environment_values_split_like_systemd() {
        assert_eq!(
            assignments(r#"A=1 "LD_PRELOAD=/a b.so" C="x\"y""#),
            vec!["A=1", "LD_PRELOAD=/a b.so", "C=x\"y"]
        );
        let t = drop_in_text(
            Path::new("/usr/lib/ringsock/libringsock.so"),
            Path::new("/run/ringsock/ctl.sock"),
            Some("/opt/x.so"),
        )
        .unwrap();
        assert!(t.starts_with(MARKER));
        assert!(
            t.contains("Environment=\"LD_PRELOAD=/usr/lib/ringsock/libringsock.so:/opt/x.so\"\n")
        );
        assert!(t.contains("Environment=\"RINGSOCK_CTL_SOCK=/run/ringsock/ctl.sock\"\n"));
    }
}
