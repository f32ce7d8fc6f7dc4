//! Hostile local processes against real shimmed programs (docs/design.md,
//! "Security"): a python3 echo client and server under the shim with a
//! private daemon carry 2 MiB over a shared-memory ring in two halves; in
//! between, with the ring live, something hostile happens, and afterwards
//! the stream must still check out byte for byte (sha256 of what came back)
//! or, where the ring was attacked itself, end in an error without ever
//! delivering a wrong byte.
//!
//! * `other_uid_cannot_reach_rings_or_offers`: the `intruder` program
//!   (tests/src/bin/intruder.rs) runs as `nobody` and tries /proc/PID/fd,
//!   /proc/PID/map_files, /proc/PID/mem, ptrace, pidfd_getfd and
//!   process_vm_readv on the victims' (and the daemon's) ring memfds and
//!   mappings, then the daemon: forged and foreign claim proofs, Collect/
//!   Cancel/Decline/Answer of offer ids, an offer for the victim's address,
//!   ListenerRemove and ConnClosed of the victims' entries. Every attempt
//!   must fail; the daemon's policy lets any local user connect, say Hello
//!   and read Status (reported as `open`, not a failure).
//! * `same_uid_intruder_cannot_claim_or_settle_an_open_offer`: the server
//!   holds off accepting, so the client's offer stays open; a second
//!   process of the same uid (not the socket's owner) claims it with a UDP
//!   socket carrying the connection's exact 4-tuple, with its own TCP
//!   connection, and tries to settle it by id: refused, and the real owner
//!   then gets its ring.
//! * `ctl_socket_and_directory_modes`: what the daemon creates.
//! * `scribbled_ring_fails_the_connection_not_the_process`: with the ring
//!   live, garbage is written over the shared segment (everything after its
//!   header page: control words and slots), as a malicious peer could; the
//!   ends must report an error or deliver exactly the right bytes, never
//!   crash, hang or deliver garbage.

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use ringsock_integration::{
    ctl_bin, payload, require, resources, sha256, Cmd, Ctl, Server, TempDir,
};

const INTRUDER: &str = env!("CARGO_BIN_EXE_intruder");
const SIZE: usize = 2 << 20;
const NOBODY: u32 = 65534;

/// Echo server: listens, prints its port, accepts one connection only once
/// the `go` file exists, echoes until EOF.
const SERVER_PY: &str = r#"
import os, socket, sys, time
go = sys.argv[1]
l = socket.socket()
l.bind(("127.0.0.1", 0))
l.listen(8)
print("port", l.getsockname()[1], flush=True)
while not os.path.exists(go):
    time.sleep(0.01)
c, a = l.accept()
print("accepted", a[1], flush=True)
n = 0
try:
    while True:
        b = c.recv(65536)
        if not b:
            break
        c.sendall(b)
        n += len(b)
    c.shutdown(socket.SHUT_WR)
except OSError as e:
    print("error", type(e).__name__, e.errno, n, flush=True)
    sys.exit(3)
print("echoed", n, flush=True)
"#;

/// Echo client: connects (prints its port and fd), waits for `go`, sends
/// the first half of the payload file, waits for it to come back, prints
/// `half`, waits for `stage`, sends the rest, shuts down and reads to EOF.
/// Prints what it got back and whether it is a prefix of what it sent.
const CLIENT_PY: &str = r#"
import hashlib, os, socket, sys, threading, time
port, go, stage, path = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
data = open(path, "rb").read()
half = len(data) // 2
s = socket.create_connection(("127.0.0.1", port))
print("client", s.getsockname()[1], s.fileno(), flush=True)
def wait(p):
    while not os.path.exists(p):
        time.sleep(0.01)
got = bytearray()
err = []
def reader():
    try:
        while True:
            b = s.recv(65536)
            if not b:
                break
            got.extend(b)
    except OSError as e:
        err.append(e)
wait(go)
t = threading.Thread(target=reader)
t.start()
try:
    s.sendall(data[:half])
    while len(got) < half and t.is_alive():
        time.sleep(0.005)
    print("half", len(got), flush=True)
    wait(stage)
    s.sendall(data[half:])
    s.shutdown(socket.SHUT_WR)
except OSError as e:
    err.append(e)
t.join()
g = bytes(got)
prefix = g == data[: len(g)]
print("recv", len(g), hashlib.sha256(g).hexdigest(), "prefix", "ok" if prefix else "GARBAGE", flush=True)
if err:
    print("error", type(err[0]).__name__, err[0].errno, flush=True)
    sys.exit(3)
sys.exit(0 if prefix and len(g) == len(data) else 4)
"#;

/// The victims: a shimmed python echo pair on one daemon.
struct Pair {
    dir: TempDir,
    srv: Server,
    cli: Server,
    port: u16,
    cport: u16,
    cfd: i32,
    data: Vec<u8>,
}

impl Pair {
    fn start(ctl: &Ctl, seed: u64, client_env: &[(&str, &str)]) -> Pair {
        let dir = TempDir::new("hostile");
        let data = payload(SIZE, seed);
        let srv_py = dir.write("server.py", SERVER_PY.as_bytes());
        let cli_py = dir.write("client.py", CLIENT_PY.as_bytes());
        let file = dir.write("payload", &data);
        let (go, stage) = (dir.path().join("go"), dir.path().join("stage"));
        let mut srv = ctl.shimmed("python3").arg(&srv_py).arg(&go).spawn();
        let line = srv.wait_line("port ", Duration::from_secs(20));
        let port: u16 = line[5..].trim().parse().unwrap();
        let cli = client_env
            .iter()
            .fold(ctl.shimmed("python3"), |c, (k, v)| c.env(k, v));
        let mut cli = cli
            .arg(&cli_py)
            .arg(port.to_string())
            .arg(&go)
            .arg(&stage)
            .arg(&file)
            .spawn();
        let line = cli.wait_line("client ", Duration::from_secs(20));
        let w: Vec<&str> = line.split_whitespace().collect();
        Pair {
            cport: w[1].parse().unwrap(),
            cfd: w[2].parse().unwrap(),
            dir,
            srv,
            cli,
            port,
            data,
        }
    }

    fn touch(&self, name: &str) {
        self.dir.write(name, b"");
    }

    /// Releases the server's accept and waits until the first half came
    /// back.
    fn go(&mut self) {
        self.touch("go");
        self.cli.wait_line("half ", Duration::from_secs(30));
    }

    /// Sends the second half; returns the client's exit status and output
    /// and the server's (each bounded in time).
    fn finish(&mut self, limit: Duration) -> (Option<std::process::ExitStatus>, String, String) {
        self.touch("stage");
        let status = self.cli.wait(limit);
        let (o, e) = self.cli.output();
        let srv = self.srv.wait(Duration::from_secs(30));
        let (so, se) = self.srv.output();
        assert!(
            srv.is_some(),
            "the echo server hung after the client ended:\n{so}\n{se}"
        );
        if let Some(sig) = srv.and_then(|s| s.signal()) {
            panic!("the echo server died of signal {sig}:\n{so}\n{se}");
        }
        (
            status,
            o,
            format!("{e}\nserver stdout:\n{so}\nserver stderr:\n{se}"),
        )
    }

    /// Finishes and asserts every byte came back.
    fn finish_intact(&mut self) {
        let (status, o, e) = self.finish(Duration::from_secs(60));
        assert!(
            status.is_some_and(|s| s.success()),
            "client failed ({status:?}):\n{o}\n{e}"
        );
        let want = format!("recv {} {} prefix ok", SIZE, sha256::hex(&self.data));
        assert!(o.contains(&want), "want `{want}`, client said:\n{o}\n{e}");
        let (so, _) = self.srv.output();
        assert!(so.contains(&format!("echoed {SIZE}")), "{so}");
    }

    fn pids(&self) -> [u32; 2] {
        [self.cli.pid(), self.srv.pid()]
    }
}

/// Asserts the pair's connection is on one shm ring (both ends reported).
fn assert_on_ring(ctl: &Ctl, port: u16) {
    let links = ctl.wait_links(port, 1, Duration::from_secs(10));
    assert!(
        links.iter().all(|l| l.is_shm()),
        "not on a ring: {}",
        links
            .iter()
            .map(|l| l.to_string())
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// Ring memfd descriptors and mappings of `pid`: ([fd], [START-END]).
fn rings_of(pid: u32) -> (Vec<i32>, Vec<String>) {
    let mut fds = Vec::new();
    if let Ok(d) = std::fs::read_dir(format!("/proc/{pid}/fd")) {
        for e in d.flatten() {
            let is_ring = std::fs::read_link(e.path())
                .is_ok_and(|t| resources::is_ring(&t.to_string_lossy()));
            if is_ring {
                if let Some(n) = e.file_name().to_str().and_then(|s| s.parse().ok()) {
                    fds.push(n);
                }
            }
        }
    }
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    let ranges = maps
        .lines()
        .filter(|l| resources::is_ring(l))
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect();
    (fds, ranges)
}

fn run_intruder(args: &[String], uid: Option<u32>) -> String {
    let mut cmd = Command::new(INTRUDER);
    cmd.args(args).env_remove("LD_PRELOAD");
    if let Some(u) = uid {
        // std drops supplementary groups when root changes uid.
        cmd.uid(u).gid(u);
    }
    let out = ringsock_integration::run(cmd, "intruder", Duration::from_secs(30));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{text}");
    assert!(
        out.status.success() && text.contains(" breaches 0"),
        "the intruder got through ({}):\n{text}",
        out.status
    );
    text
}

fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

#[test]
fn other_uid_cannot_reach_rings_or_offers() {
    require!("python3");
    if !is_root() {
        println!("SKIP: needs root to run the intruder as another uid");
        return;
    }
    let ctl = Ctl::start();
    let mut pair = Pair::start(&ctl, 11, &[]);
    pair.go();
    assert_on_ring(&ctl, pair.port);

    // Everything the victims and the daemon hold of their rings.
    let mut args = Vec::new();
    let mut targets = pair.pids().to_vec();
    let dpid = ctl.daemon_pid().expect("the daemon's pid");
    targets.push(dpid);
    let mut want = Vec::new();
    for &pid in &targets {
        let (fds, maps) = rings_of(pid);
        if pid != dpid {
            assert!(!maps.is_empty(), "pid {pid} maps no ring");
        }
        args.extend(["--pid".to_string(), pid.to_string()]);
        want.push(format!("denied list /proc/{pid}/fd:"));
        want.push(format!("denied list /proc/{pid}/map_files:"));
        want.push(format!("denied open /proc/{pid}/mem rdonly:"));
        want.push(format!("denied ptrace seize {pid}:"));
        for fd in fds {
            args.extend(["--fd".to_string(), format!("{pid}:{fd}")]);
            want.push(format!("denied open /proc/{pid}/fd/{fd} rdwr:"));
            want.push(format!("denied pidfd_getfd {pid} {fd}:"));
        }
        for m in maps {
            want.push(format!("denied open /proc/{pid}/map_files/{m} rdwr:"));
            want.push(format!("denied process_vm_readv {pid} 0x"));
            args.extend(["--map".to_string(), format!("{pid}:{m}")]);
        }
    }
    assert!(
        args.iter().any(|a| a == "--fd"),
        "no process holds a ring descriptor (the daemon keeps one per reported ring): {args:?}"
    );
    args.extend(
        [
            "--ctl",
            &ctl.sock().to_string_lossy(),
            "--server",
            &format!("127.0.0.1:{}", pair.port),
            "--client",
            &format!("127.0.0.1:{}", pair.cport),
            "--victim-fd",
            &pair.cfd.to_string(),
            "--offer-ids",
            "4",
        ]
        .map(str::to_string),
    );
    let out = run_intruder(&args, Some(NOBODY));
    assert!(
        out.contains(&format!(
            "uid {NOBODY} euid {NOBODY} CapEff 0000000000000000"
        )),
        "{out}"
    );
    for w in &want {
        assert!(out.contains(w.as_str()), "no `{w}` line:\n{out}");
    }
    // The daemon refused everything past its open door (Hello, Status).
    assert!(out.contains("denied claim with a forged udp proof: Error bad-proof"));
    assert!(out.contains("denied offer for the victim client's address: OfferRefused"));
    assert!(out.contains("denied listener-remove of the victim server: Error not-found"));
    // The victims' status entries survived the forged ConnClosed.
    assert_on_ring(&ctl, pair.port);
    pair.finish_intact();
}

#[test]
fn same_uid_intruder_cannot_claim_or_settle_an_open_offer() {
    require!("python3");
    let ctl = Ctl::start();
    // The client waits long enough for the held-off server to claim.
    let mut pair = Pair::start(&ctl, 12, &[("RINGSOCK_CLAIM_WAIT_MS", "20000")]);
    let args = [
        "--ctl",
        &ctl.sock().to_string_lossy(),
        "--server",
        &format!("127.0.0.1:{}", pair.port),
        "--client",
        &format!("127.0.0.1:{}", pair.cport),
        "--victim-fd",
        &pair.cfd.to_string(),
        "--offer-ids",
        "8",
    ]
    .map(str::to_string);
    let out = run_intruder(&args, None);
    // The forged 4-tuple and our own connection prove nothing.
    assert!(
        out.contains("denied claim with a forged udp proof: Error bad-proof"),
        "{out}"
    );
    assert!(
        out.contains("denied claim with our own accepted socket: NoOffer"),
        "{out}"
    );
    // The open offer was there, and only its claimer could settle it.
    assert!(
        out.lines()
            .any(|l| l.starts_with("denied decline offer") && l.contains("not-owner")),
        "the intruder never hit the open offer:\n{out}"
    );
    // The real owner of the accepted socket still gets the ring.
    pair.go();
    assert_on_ring(&ctl, pair.port);
    pair.finish_intact();
}

#[test]
fn ctl_socket_and_directory_modes() {
    // A daemon on a socket whose directory does not exist yet, as on a
    // fresh host (/run/ringsock).
    let dir = TempDir::new("modes");
    let sock: PathBuf = dir.path().join("run/ringsock/ctl.sock");
    let mut d = Cmd::plain(ctl_bin().to_str().unwrap())
        .args(["daemon", "--foreground", "--socket"])
        .arg(&sock)
        .spawn();
    for _ in 0..500 {
        if sock.exists() {
            break;
        }
        d.assert_running();
        std::thread::sleep(Duration::from_millis(10));
    }
    let meta = std::fs::symlink_metadata(&sock).expect("socket created");
    assert!(meta.file_type().is_socket());
    // Any local user may talk to the daemon (descriptor proofs protect
    // rings), so it is rw for all; nobody else may replace it: its
    // directory is writable by the daemon's user only.
    assert_eq!(meta.permissions().mode() & 0o777, 0o666);
    let dmeta = std::fs::metadata(sock.parent().unwrap()).unwrap();
    assert_eq!(dmeta.permissions().mode() & 0o777, 0o755);
    let lock = std::fs::metadata(dir.path().join("run/ringsock/ctl.sock.lock")).unwrap();
    assert_eq!(
        lock.permissions().mode() & 0o022,
        0,
        "lock writable by others"
    );
    d.stop();
}

#[test]
fn scribbled_ring_fails_the_connection_not_the_process() {
    require!("python3");
    if !is_root() {
        println!("SKIP: needs root to open another process's ring mapping");
        return;
    }
    let ctl = Ctl::start();
    let mut pair = Pair::start(&ctl, 13, &[]);
    pair.go();
    assert_on_ring(&ctl, pair.port);
    // The server's mapping of the segment, opened read-write as a hostile
    // peer holding the memfd could.
    let spid = pair.srv.pid();
    let (_, maps) = rings_of(spid);
    let range = maps.first().expect("the server maps its ring").clone();
    let path = format!("/proc/{spid}/map_files/{range}");
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("{path}: {e}"));
    let len = f.metadata().unwrap().len() as usize;
    assert!(len > 8192, "segment of {len} bytes");
    let garbage = payload(len - 4096, 0xbad);
    std::os::unix::fs::FileExt::write_all_at(&f, &garbage, 4096).unwrap();
    drop(f);
    let (status, o, e) = pair.finish(Duration::from_secs(20));
    println!("client after the scribble ({status:?}):\n{o}\n{e}");
    let status = status.unwrap_or_else(|| panic!("the client hung:\n{o}\n{e}"));
    assert!(
        status.signal().is_none(),
        "the client died of a signal: {status:?}\n{o}\n{e}"
    );
    // Either an error, or exactly the right bytes; never a wrong one, and
    // never a cut stream that ends as if whole (exit 4).
    assert!(o.contains(" prefix ok"), "garbage delivered:\n{o}\n{e}");
    let intact = format!("recv {} {} prefix ok", SIZE, sha256::hex(&pair.data));
    assert!(o.contains(&intact) || status.code() == Some(3), "{o}\n{e}");
    // The server too: the whole stream, or the reset; never an early EOF.
    let (so, _) = pair.srv.output();
    assert!(
        so.contains(&format!("echoed {SIZE}")) || so.contains("error ConnectionResetError"),
        "{so}"
    );
}
