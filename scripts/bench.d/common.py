"""scripts/bench helpers: paths, process bookkeeping, the systems under test.

Everything started through `Procs` runs in its own process group and is
killed (TERM, then KILL) by `Procs.kill_all()`, which scripts/bench calls
after every run and again on exit, Ctrl-C, SIGTERM or an error.
"""

import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pylib"))
import ringsock_status  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Binaries: $RINGSOCK_BIN, else the repo's normal release dir.
BIN = os.path.abspath(os.environ.get("RINGSOCK_BIN", os.path.join(ROOT, "target", "release")))
LIB = os.path.join(BIN, "libringsock.so")
CTL = os.path.join(BIN, "ringsock-ctl")
SHAPES = os.path.join(BIN, "shapes")
RINGBENCH = os.path.join(BIN, "ringbench")

RSOCKET_LIBS = [
    os.environ.get("RSOCKET_LIB", ""),
    "/usr/lib/x86_64-linux-gnu/rsocket/librspreload.so",
    "/usr/lib/aarch64-linux-gnu/rsocket/librspreload.so",
    "/usr/lib64/rsocket/librspreload.so",
    "/usr/lib/rsocket/librspreload.so",
]


class BenchError(Exception):
    """A run that could not produce a number (the message says why)."""


def free_port(wait=60.0):
    """A free loopback port. While TIME-WAIT sockets hold every ephemeral
    port (after a burst of short connections) bind() finds none; they
    expire within a minute, so it is retried for up to `wait` s."""
    end = time.time() + wait
    while True:
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
        except OSError as e:
            if time.time() > end:
                raise BenchError(f"no free port: {e}") from e
            time.sleep(0.5)
        finally:
            s.close()


def free_ports(n):
    """n distinct free loopback ports (held open together while choosing)."""
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


def wait_port(port, proc=None, timeout=15.0):
    end = time.time() + timeout
    while time.time() < end:
        if proc is not None and proc.poll() is not None:
            raise BenchError(f"server {proc.args[0]} exited ({proc.returncode}) before port {port} opened"
                             + proc_tail(proc))
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise BenchError(f"port {port} never opened")


def proc_tail(proc, n=600):
    path = getattr(proc, "logpath", None)
    if not path or not os.path.exists(path):
        return ""
    with open(path, "rb") as f:
        data = f.read()[-n:].decode(errors="replace")
    return "\n--- " + os.path.basename(path) + " ---\n" + data


class Procs:
    """Every process the harness starts; each in its own process group."""

    def __init__(self):
        self.procs = []
        # A cgroup2 directory every process started joins before its exec
        # (the sockmap system's), or None.
        self.cgroup = None

    def start(self, argv, env, log=None, stdout=None, **kw):
        """Starts argv in the background; stderr (and stdout unless given)
        go to `log` (a path) or nowhere."""
        f = open(log, "ab") if log else subprocess.DEVNULL
        if self.cgroup:
            kw["preexec_fn"] = join_cgroup(self.cgroup)
        try:
            p = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL,
                                 stdout=stdout if stdout is not None else f,
                                 stderr=f, start_new_session=True, **kw)
        except FileNotFoundError as e:
            raise BenchError(f"cannot run {argv[0]}: {e}") from e
        finally:
            if log:
                f.close()
        p.logpath = log
        self.procs.append(p)
        return p

    def kill_all(self):
        procs, self.procs = self.procs, []
        for p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except (ProcessLookupError, PermissionError):
                    pass
        end = time.time() + 2.0
        for p in procs:
            try:
                p.wait(timeout=max(0.05, end - time.time()))
            except subprocess.TimeoutExpired:
                pass
        for p in procs:
            # The group too: servers that forked workers (nginx) or left
            # children behind.
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            for s in (p.stdout, p.stderr):
                if s:
                    s.close()


def join_cgroup(path):
    """A preexec_fn moving the child into the cgroup `path` before its exec,
    so none of its sockets is created outside it."""
    procs = os.path.join(path, "cgroup.procs")

    def move():
        with open(procs, "w") as f:
            f.write("0")
    return move


def summarize(values):
    v = sorted(values)
    return {"median": statistics.median(v), "min": v[0], "max": v[-1], "n": len(v)}


# ---- systems under test ---------------------------------------------------


class System:
    """A way to run both ends of a workload. `begin(run_dir)` before a run,
    `end()` after it; `env` is the environment for every program of the run
    (servers and clients alike); `sample()` counts the connections of the
    run by transport."""

    name = "?"
    label = "?"

    def __init__(self, procs):
        self.procs = procs
        self.env = dict(os.environ)
        for k in list(self.env):
            if k == "LD_PRELOAD" or k.startswith("RINGSOCK_"):
                del self.env[k]

    def begin(self, run_dir):
        pass

    def end(self):
        pass

    def sample(self):
        """{'tcp': n}: established TCP sockets, from one `ss` process, so
        that a system without an observer of its own pays for sampling as
        a shimmed one pays for `ringsock-ctl status` (run_clients)."""
        try:
            p = subprocess.run(["ss", "-tnH", "state", "established"], capture_output=True,
                               text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return {"error": 1}
        return {"tcp": len(p.stdout.splitlines())}


class Kernel(System):
    """Plain kernel TCP: no preload at all."""

    name = "kernel"
    label = "kernel TCP"


class Ringsock(System):
    """Both ends under libringsock.so, with a private ringsock-ctl daemon
    per run (RINGSOCK_CTL_SOCK passed to both ends)."""

    name = "ringsock"
    label = "ringsock"

    def __init__(self, procs):
        super().__init__(procs)
        self.daemon = None
        self.sock = None

    def begin(self, run_dir):
        # Servers that drop privileges (nginx workers run as nobody) must
        # reach the socket (itself mode 0666).
        os.chmod(run_dir, 0o755)
        self.sock = os.path.join(run_dir, "ctl.sock")
        self.daemon = self.procs.start(
            [CTL, "daemon", "--socket", self.sock, "--foreground", "--log-level", "warn"],
            self.env, log=os.path.join(run_dir, "ctl.log"))
        end = time.time() + 10
        while not os.path.exists(self.sock):
            if self.daemon.poll() is not None or time.time() > end:
                raise BenchError("ringsock-ctl daemon did not start" + proc_tail(self.daemon))
            time.sleep(0.02)
        self.env = dict(self.env)
        self.env["LD_PRELOAD"] = LIB
        self.env["RINGSOCK_CTL_SOCK"] = self.sock
        self.env.setdefault("RINGSOCK_LOG", "warn")

    def end(self):
        self.env.pop("LD_PRELOAD", None)
        self.env.pop("RINGSOCK_CTL_SOCK", None)
        self.daemon = None

    def sample(self):
        """{'shm': n, 'tcp': n, ...}: connection ends the shims reported,
        by transport, from `ringsock-ctl status --json`."""
        env = dict(self.env)
        env.pop("LD_PRELOAD", None)
        try:
            conns = ringsock_status.status(CTL, self.sock, env=env, timeout=10)
        except ringsock_status.StatusError:
            return {"error": 1}
        counts, reasons = {}, {}
        for c in conns:
            counts[c.transport] = counts.get(c.transport, 0) + 1
            if not c.on_ring:
                r = c.reason or "no reason given"
                reasons[r] = reasons.get(r, 0) + 1
        if reasons:
            counts["reasons"] = reasons
        return counts


class Sockmap(System):
    """Plain programs, no preload, in the cgroup scripts/sockmap attached its
    BPF programs to: loopback sends go straight to the peer socket.
    scripts/bench attaches once before the first run and detaches on every
    way out (`sockmap_attached`)."""

    name = "sockmap"
    label = "BPF sockmap"

    def begin(self, run_dir):
        self.procs.cgroup = sockmap_cgroup()

    def end(self):
        self.procs.cgroup = None

    def sample(self):
        """{'sockmap': n}: sockets in the SOCKHASH now."""
        try:
            p = subprocess.run([SOCKMAP, "status"], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return {"error": 1}
        for line in p.stdout.splitlines():
            if line.startswith("sockets in the map:"):
                return {"sockmap": int(line.split(":")[1])}
        return {"error": 1}


SOCKMAP = os.path.join(ROOT, "scripts", "sockmap")


def sockmap_cgroup():
    with open("/proc/mounts") as f:
        for line in f:
            parts = line.split()
            if len(parts) > 2 and parts[2] == "cgroup2":
                return os.path.join(parts[1], "ringsock-sockmap")
    raise BenchError("no cgroup2 file system mounted")


class sockmap_attached:
    """Context manager: scripts/sockmap attach on entry (when `on`), detach on
    exit, whatever the exit."""

    def __init__(self, on):
        self.on = on

    def __enter__(self):
        if self.on:
            p = subprocess.run([SOCKMAP, "attach"], capture_output=True, text=True, timeout=120)
            if p.returncode != 0:
                subprocess.run([SOCKMAP, "detach"], capture_output=True, timeout=120)
                raise BenchError(f"scripts/sockmap attach failed:\n{p.stdout}{p.stderr}")
        return self

    def __exit__(self, *exc):
        if self.on:
            subprocess.run([SOCKMAP, "detach"], capture_output=True, timeout=120)
        return False


class Rsocket(System):
    """rsocket's preload (librspreload.so): only meaningful with an RDMA
    device, e.g. inside the Soft-RoCE guest."""

    name = "rsocket"
    label = "rsocket"

    @staticmethod
    def find():
        lib = next((p for p in RSOCKET_LIBS if p and os.path.exists(p)), None)
        ib = "/sys/class/infiniband"
        devs = os.listdir(ib) if os.path.isdir(ib) else []
        return lib, devs

    def __init__(self, procs):
        super().__init__(procs)
        lib, _ = Rsocket.find()
        self.env["LD_PRELOAD"] = lib


SYSTEMS = {"kernel": Kernel, "ringsock": Ringsock, "sockmap": Sockmap, "rsocket": Rsocket}


def check_system(name):
    """None if the system can run here, else the reason it cannot."""
    if name == "ringsock":
        missing = [p for p in (LIB, CTL) if not os.path.exists(p)]
        if missing:
            return (f"missing {', '.join(missing)}: build with `cargo build --release --workspace` "
                    f"or point RINGSOCK_BIN at the directory holding them")
    if name == "sockmap":
        if os.geteuid() != 0:
            return "sockmap needs root (BPF programs, cgroup attach)"
        missing = [t for t in ("clang", "bpftool") if not shutil.which(t)]
        if missing:
            return f"sockmap needs {', '.join(missing)} (scripts/install-deps installs them)"
    if name == "rsocket":
        lib, devs = Rsocket.find()
        if not lib:
            return ("rsocket needs librspreload.so (Debian: librdmacm1, in "
                    "/usr/lib/<arch>/rsocket/; or set RSOCKET_LIB)")
        if not devs:
            return ("rsocket needs an RDMA device (none in /sys/class/infiniband); run it inside "
                    "the Soft-RoCE guest, or add one with `rdma link add rxe0 type rxe netdev <if>`")
    return None


def via_ring(samples):
    """Verdict over the status samples of one system's runs of a workload:
    ('yes' | 'no' | 'partial' | 'n/a', 'shm/tcp' counts of the run with the
    fewest rings)."""
    samples = [s for s in samples if s is not None]
    if not samples:
        return "n/a", ""
    ring = lambda s: s.get("shm", 0) + s.get("rdma", 0)
    worst = min(samples, key=lambda s: (ring(s), -s.get("tcp", 0)))
    counts = f"{ring(worst)} shm / {worst.get('tcp', 0)} tcp"
    if any("error" in s for s in samples):  # status itself failed
        return "?", "status failed"
    if all(ring(s) > 0 and s.get("tcp", 0) == 0 for s in samples):
        return "yes", counts
    if all(ring(s) == 0 for s in samples):
        return "no", counts
    return "partial", counts


def tcp_reasons(samples):
    """{reason: count} over the samples' non-ring connection ends."""
    out = {}
    for s in samples:
        for r, n in ((s or {}).get("reasons") or {}).items():
            out[r] = out.get(r, 0) + n
    return out
