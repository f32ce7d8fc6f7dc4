//! The Debian package of scripts/package-deb, installed and used: its
//! control fields and file list, an install into a temporary root with
//! dpkg (its Depends satisfied by this system's own packages), the
//! installed unit's ExecStart run as written, one connection of
//! `ringsock-ctl run` with the installed shim on `shm` in the installed
//! ctl's status (every byte checked), the man pages rendered without
//! warnings, and a purge. The container and Kubernetes files are parsed
//! and compared with the unit (no image is built here).
//!
//! The installed files are seen at their real paths (/usr/bin/ringsock-ctl,
//! /usr/lib/ringsock/libringsock.so) by processes started in a private
//! mount namespace whose /usr is an overlay of ROOT/usr over the host's
//! (`unshare --mount`, needs root), so the installed ctl finds the
//! installed shim exactly as it would on a system with the package.
//!
//! RINGSOCK_DEB_BIN_DIR=DIR packages release binaries from DIR instead of
//! building them (scripts/package-deb --bin-dir).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use ringsock_integration::{streamcheck_hashes, Cmd, Server, TempDir};

const STREAMCHECK: &str = env!("CARGO_BIN_EXE_streamcheck");
const CTL: &str = "/usr/bin/ringsock-ctl";
const LIB: &str = "/usr/lib/ringsock/libringsock.so";
const UNIT: &str = "lib/systemd/system/ringsock-ctl.service";

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

/// Runs `cmd` to completion (bounded) and returns stdout; panics with
/// its output on failure.
fn ok(cmd: &mut Command, what: &str) -> String {
    let out = ringsock_integration::run(
        std::mem::replace(cmd, Command::new("true")),
        what,
        Duration::from_secs(300),
    );
    let (o, e) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(
        out.status.success(),
        "{what} failed ({}):\nstdout:\n{o}\nstderr:\n{e}",
        out.status
    );
    o
}

fn build_package(out: &Path) -> PathBuf {
    let mut c = Command::new(workspace().join("scripts/package-deb"));
    c.arg("--out").arg(out);
    if let Some(dir) = std::env::var_os("RINGSOCK_DEB_BIN_DIR") {
        c.arg("--bin-dir").arg(dir);
    }
    let printed = ok(&mut c, "scripts/package-deb");
    let deb = PathBuf::from(printed.lines().last().expect("package-deb printed nothing"));
    assert!(deb.is_file(), "{} missing", deb.display());
    deb
}

/// `dpkg-deb --contents`: path (without the leading `.`) -> (mode, owner).
fn contents(deb: &Path) -> BTreeMap<String, (String, String)> {
    let text = ok(
        Command::new("dpkg-deb").arg("--contents").arg(deb),
        "dpkg-deb --contents",
    );
    text.lines()
        .map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            assert!(w.len() >= 6, "unexpected --contents line: {l}");
            let path = w[5]
                .trim_start_matches('.')
                .trim_end_matches('/')
                .to_string();
            (path, (w[0].to_string(), w[1].to_string()))
        })
        .collect()
}

/// The subcommands `ringsock-ctl --help` lists (without `help`).
fn subcommands(ctl_help: &str) -> Vec<String> {
    ctl_help
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(String::from)
        .collect()
}

/// `argv` started in a private mount namespace where ROOT/usr lies over
/// /usr.
fn installed(root: &Path, argv: &[&str]) -> Cmd {
    Cmd::plain("unshare")
        .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
        .arg(r#"mount -t overlay ringsock-pkg -o "lowerdir=$0/usr:/usr" /usr && exec "$@""#)
        .arg(root)
        .args(argv)
}

/// The ExecStart command line of a unit file, split into words; only the
/// plain form (no prefix characters, quotes or specifiers) is accepted.
fn exec_start(unit: &str) -> Vec<String> {
    let lines: Vec<&str> = unit
        .lines()
        .filter_map(|l| l.strip_prefix("ExecStart="))
        .collect();
    assert_eq!(lines.len(), 1, "one ExecStart= expected:\n{unit}");
    let line = lines[0].trim();
    assert!(
        !line.starts_with(['-', '@', ':', '+', '!']) && !line.contains(['"', '\'', '$', '%', '\\']),
        "ExecStart uses syntax this test does not parse: {line}"
    );
    line.split_whitespace().map(String::from).collect()
}

/// The RINGSOCK_* variables the tables of docs/shim.md's Knobs section
/// name.
fn documented_knobs() -> Vec<String> {
    let md = std::fs::read_to_string(workspace().join("docs/shim.md")).unwrap();
    let section: Vec<&str> = md
        .lines()
        .skip_while(|l| l.trim_end() != "## Knobs")
        .skip(1)
        .take_while(|l| !l.starts_with("## "))
        .collect();
    let mut vars = Vec::new();
    for l in section.iter().filter(|l| l.starts_with("| `RINGSOCK_")) {
        let cell = l.split('|').nth(1).unwrap();
        for part in cell.split('`').filter(|p| p.starts_with("RINGSOCK_")) {
            vars.push(part.trim_end_matches('*').to_string());
        }
    }
    assert!(
        vars.len() >= 10,
        "too few knobs found in docs/shim.md: {vars:?}"
    );
    vars
}

/// Renders a man page with warnings on; panics on any warning.
fn man_page(page: &Path) -> String {
    let out = Command::new("man")
        .args(["--warnings", "-l"])
        .arg(page)
        .env("MANWIDTH", "80")
        .env("LC_ALL", "C.UTF-8")
        .env_remove("MANPAGER")
        .env_remove("PAGER")
        .output()
        .expect("running man");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && err.trim().is_empty(),
        "man --warnings -l {}: {}\n{err}",
        page.display(),
        out.status
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Seeds ROOT's dpkg database with this system's entries of the packages
/// `depends` names, so dpkg checks the package's Depends against them.
fn dpkg_root(root: &Path, depends: &str) {
    let admin = root.join("var/lib/dpkg");
    for d in ["info", "updates", "triggers"] {
        std::fs::create_dir_all(admin.join(d)).unwrap();
    }
    std::fs::create_dir_all(root.join("var/log")).unwrap();
    let names: Vec<&str> = depends
        .split(',')
        .map(|d| d.split_whitespace().next().expect("empty Depends clause"))
        .collect();
    let status = ok(
        Command::new("dpkg-query").arg("--status").args(&names),
        "dpkg-query --status (the package's dependencies on this system)",
    );
    std::fs::write(admin.join("status"), status).unwrap();
}

fn dpkg(root: &Path, args: &[&str]) -> String {
    let mut c = Command::new("dpkg");
    c.arg(format!("--root={}", root.display()))
        .arg(format!("--log={}", root.join("var/log/dpkg.log").display()))
        .args(["--force-not-root", "--force-script-chrootless"])
        .args(args);
    ok(&mut c, &format!("dpkg {args:?}"))
}

/// Waits until the installed ctl's `status` answers on `sock`.
fn wait_daemon(root: &Path, sock: &Path, daemon: &mut Server) {
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        daemon.assert_running();
        let o = installed(root, &[CTL, "status", "--socket", sock.to_str().unwrap()])
            .run(Duration::from_secs(30));
        if o.status.success() {
            return;
        }
        assert!(
            Instant::now() < end,
            "installed daemon did not answer on {}: {:?}",
            sock.display(),
            daemon.output()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn debian_package_installs_and_carries_a_connection_on_shm() {
    assert_eq!(
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() },
        0,
        "the package test mounts an overlay in a mount namespace: run as root"
    );
    let tmp = TempDir::new("package");
    let deb = build_package(&tmp.path().join("out"));
    let name = deb.file_name().unwrap().to_str().unwrap().to_string();

    // Control fields.
    let field = |f: &str| {
        ok(
            Command::new("dpkg-deb").arg("--field").arg(&deb).arg(f),
            "dpkg-deb --field",
        )
        .trim()
        .to_string()
    };
    let (version, arch, depends) = (field("Version"), field("Architecture"), field("Depends"));
    assert_eq!(field("Package"), "ringsock");
    assert_eq!(name, format!("ringsock_{version}_{arch}.deb"));
    assert!(depends.contains("libc6 (>= 2."), "Depends: {depends}");
    let info = ok(
        Command::new("dpkg-deb").arg("--info").arg(&deb),
        "dpkg-deb --info",
    );
    for s in ["postinst", "prerm", "postrm", "md5sums"] {
        assert!(info.contains(&format!(" {s} ")), "{s} missing:\n{info}");
    }

    // Files, modes, owners.
    let files = contents(&deb);
    let regular: BTreeMap<&str, &str> = files
        .iter()
        .filter(|(_, (mode, _))| mode.starts_with('-'))
        .map(|(p, (mode, _))| (p.as_str(), mode.as_str()))
        .collect();
    assert!(
        files.values().all(|(_, owner)| owner == "root/root"),
        "{files:?}"
    );
    let mut expected: BTreeMap<String, &str> = [
        (CTL, "-rwxr-xr-x"),
        (LIB, "-rw-r--r--"),
        ("/lib/systemd/system/ringsock-ctl.service", "-rw-r--r--"),
        ("/usr/share/man/man8/ringsock-ctl.8.gz", "-rw-r--r--"),
        ("/usr/share/man/man7/ringsock.7.gz", "-rw-r--r--"),
        ("/usr/share/doc/ringsock/copyright", "-rw-r--r--"),
        ("/usr/share/doc/ringsock/changelog.Debian.gz", "-rw-r--r--"),
    ]
    .into_iter()
    .map(|(p, m)| (p.to_string(), m))
    .collect();

    // Install into a temporary root; dpkg checks Depends against the
    // seeded database and runs the maintainer scripts chrootless
    // (DPKG_ROOT set: they leave systemctl alone).
    let root = tmp.path().join("root");
    dpkg_root(&root, &depends);
    dpkg(&root, &["--install", deb.to_str().unwrap()]);
    let st = ok(
        Command::new("dpkg-query")
            .arg(format!(
                "--admindir={}",
                root.join("var/lib/dpkg").display()
            ))
            .args(["--show", "--showformat=${Status} ${Version}", "ringsock"]),
        "dpkg-query --show ringsock",
    );
    assert_eq!(st, format!("install ok installed {version}"));

    let help = ok(
        Command::new(root.join("usr/bin/ringsock-ctl")).arg("--help"),
        "installed ringsock-ctl --help",
    );
    let subs = subcommands(&help);
    assert!(subs.len() >= 6, "subcommands from --help: {subs:?}\n{help}");
    for s in &subs {
        expected.insert(
            format!("/usr/share/man/man8/ringsock-ctl-{s}.8.gz"),
            "-rw-r--r--",
        );
    }
    let expected: BTreeMap<&str, &str> = expected.iter().map(|(p, m)| (p.as_str(), *m)).collect();
    assert_eq!(regular, expected, "files of {name}");
    let unit_text = std::fs::read_to_string(root.join(UNIT)).unwrap();
    assert_eq!(
        unit_text,
        std::fs::read_to_string(workspace().join("packaging/systemd/ringsock-ctl.service"))
            .unwrap()
    );

    // Man pages: no warnings; each names what it documents.
    for (page, _) in expected.iter().filter(|(p, _)| p.contains("/man/")) {
        let text = man_page(&root.join(page.trim_start_matches('/')));
        let base = Path::new(page).file_name().unwrap().to_str().unwrap();
        let title = base.trim_end_matches(".gz");
        let title = &title[..title.rfind('.').unwrap()];
        assert!(
            text.contains(title),
            "{page} does not name {title}:\n{text}"
        );
        if title == "ringsock" {
            for v in documented_knobs() {
                assert!(text.contains(&v), "ringsock.7 lacks {v}:\n{text}");
            }
        }
        if title == "ringsock-ctl" {
            for s in &subs {
                assert!(
                    text.contains(&format!("ringsock-ctl-{s}(8)")),
                    "{s}:\n{text}"
                );
            }
        }
    }

    // The daemon, as the installed unit's ExecStart says; its socket in a
    // temp dir instead of the unit's RuntimeDirectory, no peer port.
    let argv = exec_start(&unit_text);
    assert_eq!(argv[0], CTL, "ExecStart: {argv:?}");
    let run_dir = tmp.path().join("run");
    std::fs::create_dir_all(&run_dir).unwrap();
    let sock = run_dir.join("ctl.sock");
    let sock_s = sock.to_str().unwrap();
    let argv_s: Vec<&str> = argv.iter().map(String::as_str).collect();
    let mut daemon = installed(&root, &argv_s)
        .env("RINGSOCK_CTL_SOCK", &sock)
        .env("RINGSOCK_CTL_PORT", "0")
        .env("RINGSOCK_LOG", "info")
        .spawn();
    wait_daemon(&root, &sock, &mut daemon);

    // One connection between two programs started by the installed
    // `ringsock-ctl run` (no --lib: it finds the installed shim).
    let common = [
        "--seed",
        "24",
        "--mib",
        "2",
        "--conns",
        "1",
        "--pause-ms",
        "4000",
        "--timeout-s",
        "90",
    ];
    let run = |side: &[&str]| {
        let mut a = vec![CTL, "run", "--socket", sock_s, "--", STREAMCHECK];
        a.extend_from_slice(side);
        a.extend_from_slice(&common);
        installed(&root, &a).spawn()
    };
    let mut server = run(&["server"]);
    let line = server.wait_line("listening ", Duration::from_secs(30));
    let port = line["listening ".len()..].trim().to_string();
    let maps = std::fs::read_to_string(format!("/proc/{}/maps", server.pid())).unwrap();
    assert!(maps.contains(LIB), "server has not mapped {LIB}:\n{maps}");
    let mut client = run(&["client", "--port", &port]);
    let (expect_out, _) = installed(
        &root,
        &[
            CTL,
            "status",
            "--socket",
            sock_s,
            "--port",
            &port,
            "--expect",
            "transport=shm,ends=2",
            "--wait-ms",
            "60000",
        ],
    )
    .run_ok(Duration::from_secs(120));
    let (c_out, c_err) = client.wait_ok(Duration::from_secs(120));
    let (s_out, s_err) = server.wait_ok(Duration::from_secs(60));
    let (c, s) = (streamcheck_hashes(&c_out), streamcheck_hashes(&s_out));
    assert_eq!(c.len(), 1, "client:\n{c_out}{c_err}");
    assert_eq!(s.len(), 1, "server:\n{s_out}{s_err}");
    assert_eq!(c[0].0, s[0].1, "client->server bytes");
    assert_eq!(s[0].0, c[0].1, "server->client bytes");
    assert!(
        c_out.contains("\nok") && s_out.contains("\nok"),
        "{c_out}\n{s_out}"
    );
    assert!(
        c_err.is_empty() && s_err.is_empty(),
        "the shim logged:\n{c_err}{s_err}\nstatus:\n{expect_out}"
    );
    let (status, _, log) = daemon.stop();
    assert!(
        status.is_some_and(|s| s.success()),
        "daemon on SIGTERM: {status:?}\n{log}"
    );
    assert!(!sock.exists(), "the daemon left its socket");

    // Purge: the maintainer scripts run again, every file goes.
    dpkg(&root, &["--purge", "ringsock"]);
    for p in expected.keys() {
        assert!(
            !root.join(p.trim_start_matches('/')).exists(),
            "{p} left after purge"
        );
    }
}

#[test]
fn container_and_daemonset_run_the_units_command() {
    let ws = workspace();
    let unit = std::fs::read_to_string(ws.join("packaging/systemd/ringsock-ctl.service")).unwrap();
    let argv = exec_start(&unit);

    let cf = std::fs::read_to_string(ws.join("packaging/container/Containerfile")).unwrap();
    let line = |kw: &str| {
        cf.lines()
            .find(|l| l.starts_with(kw))
            .unwrap_or_else(|| panic!("no {kw} in the Containerfile"))
            .to_string()
    };
    assert!(line("FROM ").contains("debian:12"), "{cf}");
    assert!(line("COPY ").contains("ringsock_*_amd64.deb"), "{cf}");
    assert_eq!(line("VOLUME "), "VOLUME /run/ringsock");
    let entry = line("ENTRYPOINT ");
    let entry: Vec<String> = serde_json::from_str(entry.trim_start_matches("ENTRYPOINT ")).unwrap();
    assert_eq!(
        entry, argv,
        "Containerfile ENTRYPOINT vs the unit's ExecStart"
    );

    // The DaemonSet and the commented example pod, through a YAML parser.
    let check = r##"
import json, sys, yaml
text = open(sys.argv[1]).read()
docs = [d for d in yaml.safe_load_all(text) if d]
marker = "# ---\n"
assert text.count(marker) == 1, "one commented example expected"
example = "\n".join(l[2:] if l.startswith("# ") else l.lstrip("#")
                    for l in text.split(marker, 1)[1].splitlines())
pod = yaml.safe_load(example)
print(json.dumps({"docs": docs, "pod": pod}))
"##;
    let out = ok(
        Command::new("python3")
            .args(["-c", check])
            .arg(ws.join("packaging/k8s/daemonset.yaml")),
        "python3 yaml",
    );
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let docs = v["docs"].as_array().unwrap();
    assert_eq!(docs.len(), 1);
    let ds = &docs[0];
    assert_eq!(ds["kind"], "DaemonSet");
    let spec = &ds["spec"]["template"]["spec"];
    assert_eq!(spec["hostNetwork"], true);
    let c = &spec["containers"][0];
    let cmd: Vec<String> = serde_json::from_value(c["command"].clone()).unwrap();
    assert_eq!(cmd, argv, "DaemonSet command vs the unit's ExecStart");
    let host_path = |spec: &serde_json::Value, mount: &str| {
        let vol = spec["containers"][0]["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["mountPath"] == mount)
            .unwrap_or_else(|| panic!("no mount at {mount}"))["name"]
            .clone();
        spec["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == vol)
            .unwrap()["hostPath"]["path"]
            .clone()
    };
    assert_eq!(host_path(spec, "/run/ringsock"), "/run/ringsock");
    assert_eq!(c["securityContext"]["capabilities"]["drop"][0], "ALL");

    let pod = &v["pod"];
    assert_eq!(pod["kind"], "Pod");
    assert_eq!(host_path(&pod["spec"], "/run/ringsock"), "/run/ringsock");
    let env = pod["spec"]["containers"][0]["env"].as_array().unwrap();
    let var = |n: &str| {
        env.iter()
            .find(|e| e["name"] == n)
            .map(|e| e["value"].clone())
    };
    assert_eq!(var("LD_PRELOAD"), Some(LIB.into()));
    assert_eq!(
        var("RINGSOCK_CTL_SOCK"),
        Some("/run/ringsock/ctl.sock".into())
    );
}
