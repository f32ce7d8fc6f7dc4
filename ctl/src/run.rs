//! `ringsock-ctl run`: exec a program with libringsock.so preloaded.

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// File name of the shim.
pub const LIB_NAME: &str = "libringsock.so";

/// Where the shim is: `--lib`, else `$RINGSOCK_LIB`, else next to this
/// executable (cargo builds both into target/<profile>/), or for
/// /usr/bin/ringsock-ctl where the package puts it. Made absolute,
/// since the program may change directory before it loads anything.
pub fn find_lib(
    flag: Option<&Path>,
    env: Option<OsString>,
    exe: Option<PathBuf>,
) -> Result<PathBuf, String> {
    let (path, origin) = match (flag, env) {
        (Some(p), _) => (p.to_path_buf(), "--lib"),
        (None, Some(e)) if !e.is_empty() => (PathBuf::from(e), "RINGSOCK_LIB"),
        _ => {
            let dir = exe.as_deref().and_then(Path::parent).ok_or_else(|| {
                format!("cannot locate {LIB_NAME}: pass --lib or set RINGSOCK_LIB")
            })?;
            let beside = dir.join(LIB_NAME);
            // An installed ringsock-ctl (/usr/bin) finds the packaged shim.
            let packaged = Path::new(crate::service::PACKAGED_LIB);
            if !beside.is_file() && packaged.is_file() && dir == Path::new("/usr/bin") {
                (packaged.to_path_buf(), "the package's location")
            } else {
                (beside, "the ringsock-ctl directory")
            }
        }
    };
    if !path.is_file() {
        return Err(format!(
            "{LIB_NAME} not found at {} (from {origin}); pass --lib or set RINGSOCK_LIB",
            path.display()
        ));
    }
    path.canonicalize()
        .map_err(|e| format!("cannot resolve {}: {e}", path.display()))
}

/// The new LD_PRELOAD: the shim first, then whatever was there.
pub fn preload_value(lib: &Path, existing: Option<&OsStr>) -> Result<OsString, String> {
    // ld.so splits LD_PRELOAD on ':' and ' '; such a path cannot be named.
    if lib
        .as_os_str()
        .as_bytes()
        .iter()
        .any(|&b| b == b':' || b == b' ')
    {
        return Err(format!(
            "{} contains ':' or ' ', which LD_PRELOAD cannot express",
            lib.display()
        ));
    }
    let mut v = lib.as_os_str().to_owned();
    if let Some(old) = existing.filter(|o| !o.is_empty()) {
        v.push(":");
        v.push(old);
    }
    Ok(v)
}

/// Replaces this process with `argv`; returns only on failure, with the
/// shell's exit codes (127 not found, 126 not executable).
pub fn exec(lib: &Path, socket: Option<&Path>, argv: &[OsString]) -> i32 {
    let Some((cmd, args)) = argv.split_first() else {
        eprintln!("ringsock-ctl: run: no command given");
        return 2;
    };
    let preload = match preload_value(lib, std::env::var_os("LD_PRELOAD").as_deref()) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("ringsock-ctl: {e}");
            return 1;
        }
    };
    let mut c = Command::new(cmd);
    c.args(args).env("LD_PRELOAD", preload);
    if let Some(s) = socket {
        c.env("RINGSOCK_CTL_SOCK", s);
    }
    let err = c.exec();
    eprintln!(
        "ringsock-ctl: cannot execute {}: {err}",
        Path::new(cmd).display()
    );
    if err.kind() == io::ErrorKind::NotFound {
        127
    } else {
        126
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preload_is_prepended() {
        let lib = Path::new("/opt/r/libringsock.so");
        assert_eq!(preload_value(lib, None).unwrap(), "/opt/r/libringsock.so");
        assert_eq!(
            preload_value(lib, Some(OsStr::new(""))).unwrap(),
            "/opt/r/libringsock.so"
        );
        assert_eq!(
            preload_value(lib, Some(OsStr::new("/x/a.so b.so"))).unwrap(),
            "/opt/r/libringsock.so:/x/a.so b.so"
        );
        assert!(preload_value(Path::new("/a b/lib.so"), None).is_err());
    }

    #[test]
    fn lib_lookup_order() {
        let dir = std::env::temp_dir().join(format!("ringsock-run-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let lib = dir.join(LIB_NAME);
        std::fs::write(&lib, b"").unwrap();
        let lib = lib.canonicalize().unwrap();
        let exe = Some(dir.join("ringsock-ctl"));
        // Next to the executable.
        assert_eq!(find_lib(None, None, exe.clone()).unwrap(), lib);
        // The env var wins over the directory, the flag over both.
        assert!(find_lib(None, Some("/nonexistent.so".into()), exe.clone()).is_err());
        assert_eq!(
            find_lib(Some(&lib), Some("/nonexistent.so".into()), None).unwrap(),
            lib
        );
        assert!(find_lib(None, None, Some("/nonexistent/ringsock-ctl".into())).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
