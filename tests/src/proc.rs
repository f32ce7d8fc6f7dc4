//! Spawning programs under the shim, with time bounds everywhere.

use std::ffi::OsStr;
use std::fs::File;
use std::io::Read;
use std::net::{Ipv4Addr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use crate::ctl::Ctl;
use crate::shim::shim;
use crate::tmp::TempDir;

/// A control socket path no daemon listens on.
pub fn no_daemon_sock() -> PathBuf {
    std::env::temp_dir().join("ringsock-test-no-daemon-here/ctl.sock")
}

/// A command that runs under `LD_PRELOAD=libringsock.so` (or without it,
/// for comparison runs).
pub struct Cmd {
    cmd: Command,
    label: String,
    /// Where a spawned program's stdout goes instead of its temp dir.
    stdout: Option<PathBuf>,
}

impl Cmd {
    /// `program` with the shim preloaded (default knobs: log level warn, so
    /// a healthy run prints nothing of ours; RINGSOCK_TEST_LOG in the test's
    /// environment sets another level, to debug one test). Its RINGSOCK_CTL_SOCK names a
    /// path where no daemon ever answers (so a daemon running on the host
    /// cannot change the result): every connection stays TCP unless
    /// `.ctl(&ctl)` points it at a test's own daemon.
    pub fn shimmed(program: &str) -> Cmd {
        let mut c = Cmd::plain(program);
        c.cmd
            .env("LD_PRELOAD", shim())
            .env(
                "RINGSOCK_LOG",
                std::env::var("RINGSOCK_TEST_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .env("RINGSOCK_CTL_SOCK", no_daemon_sock());
        c
    }

    /// Makes the program use `ctl`'s daemon (RINGSOCK_CTL_SOCK).
    pub fn ctl(self, ctl: &Ctl) -> Cmd {
        self.env("RINGSOCK_CTL_SOCK", ctl.sock())
    }

    /// `program` without the shim.
    pub fn plain(program: &str) -> Cmd {
        let mut cmd = Command::new(program);
        cmd.env_remove("LD_PRELOAD").stdin(Stdio::null());
        Cmd {
            cmd,
            label: program.to_string(),
            stdout: None,
        }
    }

    pub fn arg(mut self, a: impl AsRef<OsStr>) -> Cmd {
        self.cmd.arg(a);
        self
    }

    pub fn args<I: IntoIterator<Item = S>, S: AsRef<OsStr>>(mut self, a: I) -> Cmd {
        self.cmd.args(a);
        self
    }

    pub fn env(mut self, k: &str, v: impl AsRef<OsStr>) -> Cmd {
        self.cmd.env(k, v);
        self
    }

    pub fn current_dir(mut self, d: impl AsRef<std::path::Path>) -> Cmd {
        self.cmd.current_dir(d);
        self
    }

    /// Reads stdin from the file at `path` (default: /dev/null).
    pub fn stdin_from(mut self, path: impl AsRef<std::path::Path>) -> Cmd {
        let f = File::open(path.as_ref())
            .unwrap_or_else(|e| panic!("{}: {e}", path.as_ref().display()));
        self.cmd.stdin(f);
        self
    }

    /// `spawn` only: stdout (bytes as written) goes to a new file at `path`
    /// rather than to the output `Server::output` reads.
    pub fn stdout_to(mut self, path: impl AsRef<std::path::Path>) -> Cmd {
        self.stdout = Some(path.as_ref().to_path_buf());
        self
    }

    /// Runs to completion within `timeout`, capturing output; panics (after
    /// killing it) if it takes longer.
    pub fn run(self, timeout: Duration) -> Output {
        run(self.cmd, &self.label, timeout)
    }

    /// Runs and asserts success; returns stdout as text.
    pub fn run_ok(self, timeout: Duration) -> (String, String) {
        let label = self.label.clone();
        let out = self.run(timeout);
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(
            out.status.success(),
            "{label} failed ({}):\nstdout:\n{stdout}\nstderr:\n{stderr}",
            out.status
        );
        (stdout, stderr)
    }

    /// Starts it in the background; output goes to files in a temp dir.
    pub fn spawn(mut self) -> Server {
        let dir = TempDir::new("server");
        let out = self
            .stdout
            .take()
            .unwrap_or_else(|| dir.path().join("stdout"));
        let err = dir.path().join("stderr");
        self.cmd
            .stdout(File::create(&out).expect("stdout file"))
            .stderr(File::create(&err).expect("stderr file"));
        let child = self
            .cmd
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {}: {e}", self.label));
        Server {
            child: Some(child),
            status: None,
            label: self.label,
            out,
            err,
            _dir: dir,
        }
    }
}

/// Runs `cmd` within `timeout` with captured output.
pub fn run(mut cmd: Command, label: &str, timeout: Duration) -> Output {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("spawning {label}: {e}"));
    let mut so = child.stdout.take().expect("stdout pipe");
    let mut se = child.stderr.take().expect("stderr pipe");
    let t_out = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = so.read_to_end(&mut v);
        v
    });
    let t_err = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = se.read_to_end(&mut v);
        v
    });
    let status = wait_until(&mut child, timeout);
    let stdout = t_out.join().unwrap_or_default();
    let stderr = t_err.join().unwrap_or_default();
    match status {
        Some(status) => Output {
            status,
            stdout,
            stderr,
        },
        None => panic!(
            "{label} did not finish within {timeout:?}\nstdout:\n{}\nstderr:\n{}",
            String::from_utf8_lossy(&stdout),
            String::from_utf8_lossy(&stderr)
        ),
    }
}

/// Waits for `child` up to `timeout`; kills and reaps it and returns None
/// if it is still running then.
fn wait_until(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let end = Instant::now() + timeout;
    loop {
        if let Ok(Some(s)) = child.try_wait() {
            return Some(s);
        }
        if Instant::now() >= end {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A background program, stopped and reaped on drop.
pub struct Server {
    child: Option<Child>,
    /// Its exit status, once reaped.
    status: Option<ExitStatus>,
    label: String,
    out: PathBuf,
    err: PathBuf,
    _dir: TempDir,
}

impl Server {
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// What it has written to stdout and stderr so far.
    pub fn output(&self) -> (String, String) {
        let read = |p: &PathBuf| std::fs::read_to_string(p).unwrap_or_default();
        (read(&self.out), read(&self.err))
    }

    pub fn label(&self) -> &str {
        &self.label
    }

    /// Its exit status if it has exited (reaping it), without waiting.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(s)) = c.try_wait() {
                    self.status = Some(s);
                    self.child = None;
                }
            }
        }
        self.status
    }

    /// Panics, with its output, if it has exited.
    pub fn assert_running(&mut self) {
        if let Some(status) = self.exited() {
            let (o, e) = self.output();
            panic!(
                "{} exited early ({status}):\nstdout:\n{o}\nstderr:\n{e}",
                self.label
            );
        }
    }

    /// Waits until its stdout has a line starting with `prefix` and returns
    /// that line (the first such); panics with its output if it exits or
    /// `timeout` passes first.
    pub fn wait_line(&mut self, prefix: &str, timeout: Duration) -> String {
        let end = Instant::now() + timeout;
        loop {
            let exited = self.exited().is_some();
            let (o, e) = self.output();
            // Whole lines only, while it runs: one still being written may
            // be cut short.
            let whole = if exited {
                &o[..]
            } else {
                &o[..o.rfind('\n').map_or(0, |i| i + 1)]
            };
            if let Some(l) = whole.lines().find(|l| l.starts_with(prefix)) {
                return l.to_string();
            }
            if exited || Instant::now() >= end {
                let (o, e2) = self.output();
                panic!(
                    "{} printed no `{prefix}` line ({:?}):\nstdout:\n{o}\nstderr:\n{e}{e2}",
                    self.label, self.status
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Stops it (SIGTERM, then SIGKILL after 3 s) and returns its status
    /// and output.
    pub fn stop(&mut self) -> (Option<ExitStatus>, String, String) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: signalling our own child by pid.
            unsafe { libc::kill(c.id() as libc::pid_t, libc::SIGTERM) };
            self.status = wait_until(&mut c, Duration::from_secs(3));
        }
        let (o, e) = self.output();
        (self.status, o, e)
    }

    /// Waits for it to exit by itself within `timeout` (killing it if it
    /// does not); its status, None if it had to be killed.
    pub fn wait(&mut self, timeout: Duration) -> Option<ExitStatus> {
        if let Some(mut c) = self.child.take() {
            self.status = wait_until(&mut c, timeout);
        }
        self.status
    }

    /// As `wait_ok` for a client of `server`, which is stopped once the
    /// client is done; a failure shows both outputs. Returns the client's
    /// stdout and stderr and the server's stderr.
    pub fn wait_ok_beside(
        &mut self,
        server: &mut Server,
        timeout: Duration,
    ) -> (String, String, String) {
        let status = self.wait(timeout);
        let (o, e) = self.output();
        let (_, so, se) = server.stop();
        assert!(
            status.is_some_and(|s| s.success()),
            "{} {status:?}:\n{o}{e}\n{}:\n{so}{se}",
            self.label,
            server.label
        );
        (o, e, se)
    }

    /// Waits for it to exit within `timeout` and asserts success; returns
    /// its output.
    pub fn wait_ok(&mut self, timeout: Duration) -> (String, String) {
        let status = self.wait(timeout);
        let (o, e) = self.output();
        assert!(
            status.is_some_and(|s| s.success()),
            "{} failed or timed out after {timeout:?} ({status:?}):\nstdout:\n{o}\nstderr:\n{e}",
            self.label
        );
        (o, e)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A TCP port on 127.0.0.1 that was free a moment ago, for a server to
/// listen on. Taken below the kernel's ephemeral range (32768.. by
/// default): a port the kernel picked for `bind(0)` is exactly what the
/// next client connect() of a test running beside this one may take
/// before our server binds it ("Address already in use").
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const LOW: u32 = 20_000;
    const SPAN: u32 = 12_000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    // Spread test processes apart by pid, then walk.
    let start = std::process::id().wrapping_mul(7919) % SPAN;
    for _ in 0..SPAN {
        let k = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = (LOW + (start + k * 37) % SPAN) as u16;
        if TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in {LOW}..{}", LOW + SPAN);
}

/// Waits until a socket listens on `port` (any local address, IPv4 or
/// IPv6), as /proc/net/tcp and tcp6 show it. It never connects: a probe
/// connection would be one more connection the server sees (status would
/// list its end on plain TCP while the server had not closed it yet, which
/// a loaded machine makes last) and would use up a server that serves one
/// connection and exits (ncat -l, socat without fork). Panics with the
/// server's output if it exits or `timeout` passes first.
pub fn wait_port(server: &mut Server, port: u16, timeout: Duration) {
    wait_ready(server, port, timeout, || listens(port));
}

/// Whether /proc/net/tcp or tcp6 has a socket in LISTEN (state 0A) whose
/// local port is `port`.
fn listens(port: u16) -> bool {
    let want = format!(":{port:04X}");
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|path| {
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .skip(1)
            .any(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                f.len() > 3 && f[3] == "0A" && f[1].ends_with(&want)
            })
    })
}

/// Polls `ready` until it holds; panics with `server`'s output if the
/// server exits or `timeout` passes first.
fn wait_ready(server: &mut Server, port: u16, timeout: Duration, ready: impl Fn() -> bool) {
    let end = Instant::now() + timeout;
    loop {
        server.assert_running();
        if ready() {
            return;
        }
        if Instant::now() >= end {
            let (o, e) = server.output();
            panic!(
                "{} never listened on port {port}:\nstdout:\n{o}\nstderr:\n{e}",
                server.label
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
