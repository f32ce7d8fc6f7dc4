"""scripts/bench's programs suite: the program matrix's servers and clients
(tests/tests/programs/ starts them the same way) where a speed figure makes
sense, each row one program pair on 127.0.0.1.
"""

import glob
import hashlib
import os
import pwd
import shutil
import subprocess
import time

from common import BenchError, free_port
from workloads import (Case, grab, iperf3_streams, memcached, nginx, redis, run_clients, server,
                       sockperf_pingpong, start_nginx, tail, wrk)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NODE_HTTP = os.path.join(ROOT, "tests", "tests", "scripts", "node_http.js")
GIB = 1 << 30


# ---- inputs built once per bench ---------------------------------------------


def data_file(ctx, size):
    """A file of `size` pseudo-random bytes under ctx.work and its sha256,
    made on first use."""
    path = os.path.join(ctx.work, f"data-{size}")
    if not os.path.exists(path + ".sha256"):
        h = hashlib.sha256()
        block = os.urandom(1 << 20)
        with open(path, "wb") as f:
            for i in range(size >> 20):
                # A different block each MiB, cheaply: rotate the random one.
                b = block[i % len(block):] + block[:i % len(block)]
                f.write(b)
                h.update(b)
        with open(path + ".sha256", "w") as f:
            f.write(h.hexdigest())
    with open(path + ".sha256") as f:
        return path, f.read()


def elapsed_transfer(ctx, system, run_dir, receiver, sender, size, expect=None):
    """Starts `receiver` (a shell line that listens with socat/ncat and
    prints what it got: a byte count or a sha256), waits until it listens,
    runs `sender` and waits for both. Returns MB/s over the whole transfer
    and the sample; a short or corrupt transfer is an error."""
    port = free_port()
    out = os.path.join(run_dir, "received")
    with open(out, "wb") as f:
        rx = ctx.procs.start(["bash", "-c", receiver.format(port=port)], system.env,
                             log=os.path.join(run_dir, "receiver.err"), stdout=f)
    wait_listening(port, rx)
    t0 = time.time()
    _, sample = run_clients(ctx, system, run_dir, [["bash", "-c", sender.format(port=port)]],
                            sample_at=0.5, timeout=120 + size / 20e6)
    try:
        rx.wait(timeout=60)
    except subprocess.TimeoutExpired as e:
        raise BenchError("the receiver did not finish in 60 s after the sender") from e
    secs = time.time() - t0
    with open(out) as f:
        got = f.read().split()
    want = expect or str(size)
    if not got or got[0] != want:
        raise BenchError(f"receiver got {got[:1]}, expected {want}" + tail(rx.logpath))
    return size / secs / 1e6, sample


def wait_listening(port, proc, timeout=15.0):
    """Waits until something listens on 127.0.0.1:port without connecting
    (socat and ncat accept exactly one connection)."""
    end = time.time() + timeout
    want = f":{port:04X} "
    while time.time() < end:
        if proc.poll() is not None:
            raise BenchError(f"receiver exited ({proc.returncode}) before listening" + tail(proc.logpath))
        with open("/proc/net/tcp") as f:
            if any(want in line and line.split()[3] == "0A" for line in f):
                return
        time.sleep(0.02)
    raise BenchError(f"nothing listened on {port} within {timeout:.0f} s")


# ---- transfers -----------------------------------------------------------------


def transfer(receiver, sender, digest):
    """A 1 GiB transfer: `receiver` pipes what it gets into `wc -c` or, with
    digest, `sha256sum` (a slow consumer); `sender` reads the data file
    ({path}). Both are shell lines with {port}."""
    def fn(ctx, system, run_dir):
        path, sha = data_file(ctx, GIB)
        mbs, sample = elapsed_transfer(
            ctx, system, run_dir, receiver + (" | sha256sum" if digest else " | wc -c"),
            sender.replace("{path}", path), GIB, expect=sha if digest else None)
        return {"mbs": mbs}, sample
    return fn


SOCAT_RX = "socat -u TCP-LISTEN:{port},bind=127.0.0.1,reuseaddr STDOUT"
SOCAT_TX = "socat -u OPEN:{path} TCP:127.0.0.1:{port}"
# ncat --send-only writes what it reads from stdin, 8 KiB at a time.
NCAT_RX = "ncat -l 127.0.0.1 {port} --recv-only"
NCAT_TX = "cat {path} | ncat --send-only 127.0.0.1 {port}"


# ---- HTTP ------------------------------------------------------------------------


def node_wrk(ctx, system, run_dir):
    port = free_port()
    body = os.path.join(run_dir, "body")
    with open(body, "wb") as f:
        f.write(b"x" * 128)
    server(ctx, system, run_dir, ["node", NODE_HTTP, "server", str(port), body], port,
           ready_text="listening")
    return wrk(ctx, system, run_dir, f"http://127.0.0.1:{port}/", 16)


HAPROXY_CONF = """global
  nbthread 2
defaults
  mode http
  timeout connect 5s
  timeout client 30s
  timeout server 30s
  http-reuse always
frontend f
  bind 127.0.0.1:{port}
  default_backend b
backend b
  server s1 127.0.0.1:{back}
"""


def haproxy_nginx(ctx, system, run_dir):
    back = start_nginx(ctx, system, run_dir)
    port = free_port()
    conf = os.path.join(run_dir, "haproxy.cfg")
    with open(conf, "w") as f:
        f.write(HAPROXY_CONF.format(port=port, back=back))
    server(ctx, system, run_dir, [shutil.which("haproxy") or "/usr/sbin/haproxy", "-db", "-f", conf],
           port, name="haproxy")
    return wrk(ctx, system, run_dir, f"http://127.0.0.1:{port}/small", 16, threads=2)


def python_http(ctx, system, run_dir):
    """python3 -m http.server (a connection per request, HTTP/1.0) and one
    curl fetching a 64 KiB file n times in a row."""
    port = free_port()
    www = os.path.join(run_dir, "www")
    os.makedirs(www)
    with open(os.path.join(www, "f"), "wb") as f:
        f.write(os.urandom(64 << 10))
    server(ctx, system, run_dir, ["python3", "-m", "http.server", "-b", "127.0.0.1", "-d", www,
                                  str(port)], port, name="http.server")
    n = int(300 * ctx.secs)
    url = f"http://127.0.0.1:{port}/f"
    t0 = time.time()
    (out,), sample = run_clients(
        ctx, system, run_dir,
        [["curl", "-sS", "-w", "%{http_code}\\n"] + ["-o", "/dev/null", url] * n],
        sample_at=0.3, timeout=60 + 10 * ctx.secs)
    secs = time.time() - t0
    codes = out.split()
    if len(codes) != n or any(c != "200" for c in codes):
        raise BenchError(f"curl: {len(codes)} answers, not {n} times 200: {codes[:5]}")
    return {"rps": n / secs}, sample


# ---- databases ---------------------------------------------------------------------


def pg_bin(name):
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"),
                   key=lambda p: int(p.split("/")[4]) if p.split("/")[4].isdigit() else 0)
    return found[-1] if found else None


def as_postgres(argv):
    """argv run as the postgres user when we are root (initdb and the
    postmaster refuse root)."""
    if os.geteuid() != 0:
        return argv
    return ["setpriv", "--reuid", "postgres", "--regid", "postgres", "--init-groups", "--"] + argv


def chown_postgres(path):
    if os.geteuid() != 0:
        return
    pw = pwd.getpwnam("postgres")
    for root, dirs, files in os.walk(path):
        os.chown(root, pw.pw_uid, pw.pw_gid)
        for x in files:
            os.chown(os.path.join(root, x), pw.pw_uid, pw.pw_gid)


def setup(argv):
    """Runs a one-time set-up command (initdb and the like) to completion."""
    p = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        raise BenchError(f"{os.path.basename(argv[0])} failed:\n{p.stdout[-400:]}{p.stderr[-400:]}")


def pg_template(ctx):
    """A cluster made by initdb once per bench (trust auth, no fsync)."""
    tpl = os.path.join(ctx.work, "pg-template")
    if not os.path.exists(os.path.join(tpl, "PG_VERSION")):
        os.makedirs(tpl, exist_ok=True)
        os.chmod(ctx.work, 0o755)
        chown_postgres(tpl)
        setup(as_postgres([pg_bin("initdb"), "-D", tpl, "-U", "postgres", "--auth=trust", "-E",
                           "UTF8", "--no-sync"]))
    return tpl


def start_postgres(ctx, system, run_dir):
    data = os.path.join(run_dir, "pgdata")
    shutil.copytree(pg_template(ctx), data, symlinks=True)
    os.chmod(data, 0o700)
    chown_postgres(data)
    os.chmod(run_dir, 0o755)
    port = free_port()
    server(ctx, system, run_dir,
           as_postgres([pg_bin("postgres"), "-D", data, "-p", str(port), "-k", "",
                        "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off",
                        "-c", "synchronous_commit=off", "-c", "max_connections=50"]),
           port, name="postgres")
    # Listening is not ready: it refuses sessions until start-up finished.
    end = time.time() + 60
    while True:
        p = subprocess.run([pg_bin("psql"), "-h", "127.0.0.1", "-p", str(port), "-U", "postgres",
                            "-X", "-q", "-d", "postgres", "-c", "select 1"],
                           capture_output=True, timeout=30, env=system.env)
        if p.returncode == 0:
            return port
        if time.time() > end:
            raise BenchError(f"postgres refused sessions for 60 s: {p.stderr[-300:]!r}")
        time.sleep(0.2)


def pgbench(select_only):
    def fn(ctx, system, run_dir):
        port = start_postgres(ctx, system, run_dir)
        conn = ["-h", "127.0.0.1", "-p", str(port), "-U", "postgres"]
        run_clients(ctx, system, run_dir, [[pg_bin("pgbench")] + conn + ["-i", "-q", "-s", "1",
                                                                          "postgres"]],
                    sample_at=60, timeout=120)
        secs = max(1, round(ctx.secs))
        (out,), sample = run_clients(
            ctx, system, run_dir,
            [[pg_bin("pgbench")] + conn + ["-c", "8", "-j", "2", "-T", str(secs)]
             + (["-S"] if select_only else []) + ["postgres"]],
            sample_at=secs / 2 + 0.2, timeout=secs + 60)
        return {"tps": grab(r"tps = ([\d.]+)", out, "tps")}, sample
    return fn


def mariadbd():
    return shutil.which("mariadbd") or (os.path.exists("/usr/sbin/mariadbd") and "/usr/sbin/mariadbd")


def maria_template(ctx):
    tpl = os.path.join(ctx.work, "maria-template")
    if not os.path.exists(os.path.join(tpl, "mysql")):
        user = ["--user=root"] if os.geteuid() == 0 else []
        setup(["mariadb-install-db", "--no-defaults", "--auth-root-authentication-method=normal",
               "--skip-test-db", f"--datadir={tpl}"] + user)
    return tpl


def mysqlslap(ctx, system, run_dir):
    data = os.path.join(run_dir, "mariadb")
    shutil.copytree(maria_template(ctx), data, symlinks=True)
    port = free_port()
    user = ["--user=root"] if os.geteuid() == 0 else []
    server(ctx, system, run_dir,
           [mariadbd(), "--no-defaults", f"--datadir={data}", f"--port={port}",
            f"--socket={run_dir}/mysqld.sock", f"--pid-file={run_dir}/mysqld.pid",
            "--bind-address=127.0.0.1", "--skip-name-resolve", "--skip-log-bin",
            "--innodb-buffer-pool-size=32M"] + user, port, name="mariadbd")
    # About ctx.secs of queries at 20-30k queries/s: a shorter run is
    # mostly mysqlslap's start and its clients' connections.
    n = int(20000 * ctx.secs)
    (out,), sample = run_clients(
        ctx, system, run_dir,
        [["mysqlslap", "--host=127.0.0.1", f"--port={port}", "--user=root", "--concurrency=4",
          "--iterations=1", f"--number-of-queries={n}", "--auto-generate-sql",
          "--auto-generate-sql-load-type=read"]],
        sample_at=0.5, timeout=120 + 20 * ctx.secs)
    secs = grab(r"Average number of seconds to run all queries: ([\d.]+)", out, "mysqlslap time")
    return {"qps": n / max(secs, 1e-3)}, sample


# ---- the rows ----------------------------------------------------------------------------


def cases():
    rps = [("set", "SET req/s", "higher"), ("get", "GET req/s", "higher")]
    req = [("rps", "req/s", "higher")]
    mbs = [("mbs", "MB/s", "higher")]
    tps = [("tps", "tps", "higher")]
    c = [
        Case("programs", "redis-benchmark -c 50 -P 1", rps, ["redis-server", "redis-benchmark"], redis(1)),
        Case("programs", "redis-benchmark -c 50 -P 16", rps, ["redis-server", "redis-benchmark"],
             redis(16)),
        Case("programs", "nginx keep-alive, 128 B (wrk -c 16)", req, ["nginx", "wrk"], nginx("small", 16)),
        Case("programs", "memcached -t 4 (memcslap -c 4)",
             [("set", "SET ops/s", "higher"), ("get", "GET ops/s", "higher")],
             ["memcached", "memcslap"], memcached(4)),
        Case("programs", "pgbench -c 8 -S (select only)", tps, ["setpriv"], pgbench(True)),
        Case("programs", "pgbench -c 8 (TPC-B like)", tps, ["setpriv"], pgbench(False)),
        Case("programs", "mysqlslap -c 4, read (mariadb)", [("qps", "queries/s", "higher")],
             ["mariadb-install-db", "mysqlslap"], mysqlslap),
        Case("programs", "iperf3 -P 1", [("tput", "Gbit/s", "higher")], ["iperf3"], iperf3_streams(1)),
        Case("programs", "sockperf ping-pong 64 B", [("p50", "RTT p50 µs", "lower"),
                                                     ("p99", "RTT p99 µs", "lower")],
             ["sockperf"], sockperf_pingpong(64)),
        Case("programs", "socat 1 GiB", mbs, ["socat"], transfer(SOCAT_RX, SOCAT_TX, False)),
        Case("programs", "socat 1 GiB into sha256sum (slow consumer)", mbs, ["socat", "sha256sum"],
             transfer(SOCAT_RX, SOCAT_TX, True)),
        Case("programs", "ncat 1 GiB, 8 KiB writes, into sha256sum", mbs, ["ncat", "sha256sum"],
             transfer(NCAT_RX, NCAT_TX, True)),
        Case("programs", "node http server (wrk -c 16)", req, ["node", "wrk"], node_wrk),
        Case("programs", "haproxy nbthread 2 -> nginx (wrk -t 2 -c 16)", req, ["haproxy", "nginx", "wrk"],
             haproxy_nginx),
        Case("programs", "python3 http.server, curl 64 KiB sequential", req, ["python3", "curl"],
             python_http),
    ]
    missing = []
    if not pg_bin("pgbench"):
        missing.append("pgbench")
    if not mariadbd():
        missing.append("mysqlslap")
    return [x for x in c if not any(x.workload.startswith(m) for m in missing)]
