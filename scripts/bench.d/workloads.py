"""scripts/bench workloads.

A `Case` is one row group of the results: it runs one workload once on one
system and returns {metric: value}. Cases are built per suite by
`build_cases(cfg)`; every program they start goes through `ctx.procs`, so
scripts/bench can kill it whatever happens.
"""

import glob
import json
import os
import pwd
import re
import shutil
import struct
import subprocess
import time

from common import BIN, SHAPES, BenchError, free_port, free_ports, wait_port

SOCKPERF_MAX = 65507  # sockperf refuses larger messages


def size_label(n):
    for unit, k in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= k and n % k == 0:
            return f"{n // k} {unit}"
    return f"{n} B"


class Case:
    """suite, workload (row label), metrics [(key, unit, better)], tools
    (programs it needs on PATH), fn(ctx, system, run_dir) -> {key: value},
    x: the message size where the suite is a message-size sweep (plots),
    bare: None, or fn(ctx, run_dir) -> {name: {key: value}}, run once per
    round after the systems, for references measured without sockets (the
    ring library, the floor)."""

    def __init__(self, suite, workload, metrics, tools, fn, x=None, bare=None):
        self.suite, self.workload, self.metrics = suite, workload, metrics
        self.tools, self.fn, self.x, self.bare = tools, fn, x, bare


class Ctx:
    """What every run shares: the process list, seconds per run, quick
    mode, and `work`, a directory that lives as long as the bench (for
    inputs built once, such as data files and database templates)."""

    def __init__(self, procs, secs, quick, work):
        self.procs, self.secs, self.quick, self.work = procs, secs, quick, work


# ---- running clients ------------------------------------------------------


def run_clients(ctx, system, run_dir, argvs, sample_at, timeout, first_line=False, env=None,
                before=None):
    """Starts every client in argvs (stdout to files), samples the system's
    connections once `sample_at` s in (if a client still runs), and waits
    for all to exit (or, with first_line, for each to print a line).
    Returns (outputs, sample)."""
    env = env or system.env
    outs, procs = [], []
    for i, argv in enumerate(argvs):
        path = os.path.join(run_dir, f"client{i}.out")
        outs.append(path)
        with open(path, "wb") as f:
            procs.append(ctx.procs.start(argv, env, log=os.path.join(run_dir, f"client{i}.err"),
                                         stdout=f))
    if before:
        before()
    t0 = time.time()
    # Two samples at fixed times, whatever they see: an early one (a fast
    # system may finish before sample_at: redis-benchmark's 40,000
    # requests through the shim take under 0.1 s here) and the main one.
    # Every system samples on this schedule, each sample starting one
    # process (System.sample), so the observer loads every system alike;
    # a sample retaken until it saw a connection would load only a system
    # whose status lists nothing (a shimmed plain-TCP connection that
    # closes within the report delay is never listed).
    early_at = min(0.02, sample_at)
    sample, sampled, early, early_taken = None, False, None, False
    deadline = t0 + timeout

    def done(i):
        if first_line:
            with open(outs[i], "rb") as f:
                if b"\n" in f.read():
                    return True
        return procs[i].poll() is not None

    while True:
        now = time.time()
        if not early_taken and now - t0 >= early_at:
            if not all(done(i) for i in range(len(procs))):
                early = system.sample()
            early_taken = True
        if not sampled and now - t0 >= sample_at:
            if not all(done(i) for i in range(len(procs))):
                sample = system.sample()
            sampled = True
        if all(done(i) for i in range(len(procs))):
            if not seen(sample) and seen(early):
                sample = early
            break
        if now > deadline:
            raise BenchError(f"{os.path.basename(argvs[0][0])} did not finish in {timeout:.0f} s")
        time.sleep(0.02)
    texts = []
    for i, p in enumerate(procs):
        with open(outs[i], "rb") as f:
            text = f.read().decode(errors="replace")
        if not first_line and p.returncode != 0:
            raise BenchError(f"{argvs[i][0]} exited {p.returncode}:\n{text[-800:]}"
                             + tail(os.path.join(run_dir, f"client{i}.err")))
        if first_line and p.poll() is not None and p.returncode != 0:
            raise BenchError(f"{argvs[i][0]} exited {p.returncode}"
                             + tail(os.path.join(run_dir, f"client{i}.err")))
        texts.append(text)
    return texts, sample


def seen(sample):
    """Whether a status sample observed the run: it failed (an error to
    report) or counted at least one connection end."""
    if sample is None:
        return False
    return "error" in sample or any(isinstance(v, int) and v > 0 for v in sample.values())


def tail(path, n=800):
    try:
        with open(path, "rb") as f:
            return "\n" + f.read()[-n:].decode(errors="replace")
    except OSError:
        return ""


def server(ctx, system, run_dir, argv, port, name="server", ready_text=None, **kw):
    """Starts a server and waits until it listens: by connecting to its
    port, or, with ready_text, by waiting for that text in its log (iperf3
    takes a probe connection for a client and fails the real one)."""
    log = os.path.join(run_dir, f"{name}.log")
    p = ctx.procs.start(argv, system.env, log=log, **kw)
    if ready_text is None:
        wait_port(port, p)
        return p
    end = time.time() + 15
    while True:
        with open(log, "rb") as f:
            if ready_text.encode() in f.read():
                return p
        if p.poll() is not None or time.time() > end:
            raise BenchError(f"{argv[0]} did not start listening on {port}" + tail(log))
        time.sleep(0.02)


def grab(pattern, text, what):
    m = re.search(pattern, text)
    if not m:
        raise BenchError(f"could not find {what} in the output:\n{text[-800:]}")
    return float(m.group(1))


# ---- iperf3 -----------------------------------------------------------------


def iperf3(ctx, system, run_dir, extra):
    port = free_port()
    server(ctx, system, run_dir, ["iperf3", "-s", "--forceflush", "-B", "127.0.0.1", "-p", str(port)], port,
           ready_text="Server listening")
    secs = max(1, round(ctx.secs))
    (out,), sample = run_clients(
        ctx, system, run_dir,
        [["iperf3", "-c", "127.0.0.1", "-p", str(port), "-t", str(secs), "-J"] + extra],
        sample_at=0.3 + secs / 2, timeout=secs + 30)
    try:
        d = json.loads(out)
    except ValueError as e:
        raise BenchError(f"iperf3 printed no JSON: {out[-500:]}") from e
    if "error" in d:
        raise BenchError(f"iperf3: {d['error']}")
    return d["end"]["sum_received"]["bits_per_second"], sample


def iperf3_size(size):
    def fn(ctx, system, run_dir):
        bps, sample = iperf3(ctx, system, run_dir, ["-l", str(size)])
        return {"tput": bps / 8 / 1e6}, sample
    return fn


def iperf3_streams(n):
    def fn(ctx, system, run_dir):
        bps, sample = iperf3(ctx, system, run_dir, ["-P", str(n)])
        return {"tput": bps / 1e9}, sample
    return fn


# ---- ping-pong latency --------------------------------------------------------


def sockperf_pingpong(size, srv_prefix=(), cli_prefix=()):
    """sockperf ping-pong RTT percentiles; the prefixes go before the
    server's and the client's argv (taskset, to pin them)."""
    def fn(ctx, system, run_dir):
        port = free_port()
        server(ctx, system, run_dir,
               [*srv_prefix, "sockperf", "server", "--tcp", "-i", "127.0.0.1", "-p", str(port)], port)
        secs = max(1, round(ctx.secs))
        (out,), sample = run_clients(
            ctx, system, run_dir,
            # sockperf's default rate cap (about 600k messages/s) aborts a
            # faster run (`_seqN > m_maxSequenceNo`): the cap is raised past
            # what a ring reaches.
            [[*cli_prefix, "sockperf", "ping-pong", "--tcp", "-i", "127.0.0.1", "-p", str(port),
              "-t", str(secs), "-m", str(size), "--full-rtt", "--mps", "5000000"]],
            sample_at=0.3 + secs / 2, timeout=secs + 30)
        pct = lambda p: grab(rf"percentile {p} =\s+([\d.]+)", out, f"sockperf percentile {p}")
        return {"p50": pct("50.000"), "p99": pct("99.000"), "p999": pct("99.900")}, sample
    return fn


def shapes_pingpong(size):
    def fn(ctx, system, run_dir):
        port = free_port()
        server(ctx, system, run_dir, [SHAPES, "--listen", str(port)], port)
        (out,), sample = run_clients(
            ctx, system, run_dir,
            [[SHAPES, "--connect", str(port), "--conns", "1", "--msg", str(size),
              "--secs", str(ctx.secs), "--lat"]],
            sample_at=ctx.secs / 2 + 0.3, timeout=ctx.secs + 30)
        d = shapes_json(out)
        return {"p50": d["p50_us"], "p99": d["p99_us"], "p999": d["p999_us"]}, sample
    return fn


def shapes_json(text):
    line = text.strip().splitlines()[0] if text.strip() else ""
    try:
        return json.loads(line)
    except ValueError as e:
        raise BenchError(f"shapes printed no result: {text[-300:]!r}") from e


# ---- shapes: connections, processes, communication shapes ------------------


def shapes_run(ctx, system, run_dir, servers, clients, first_line=False, before=None):
    """servers: list of (port, argv); clients: list of argv. Returns the
    summed ops/s of the clients and the sample."""
    for i, (port, argv) in enumerate(servers):
        p = ctx.procs.start(argv, system.env, log=os.path.join(run_dir, f"server{i}.log"))
        wait_port(port, p)
    outs, sample = run_clients(ctx, system, run_dir, clients,
                               sample_at=min(0.5, ctx.secs / 5) + ctx.secs / 2 + 0.2,
                               timeout=ctx.secs + 60, first_line=first_line, before=before)
    return sum(shapes_json(o)["ops_per_s"] for o in outs), sample


def common_args(ctx, conns, msg=64):
    return ["--conns", str(conns), "--msg", str(msg), "--secs", str(ctx.secs)]


def conns_sweep(n):
    def fn(ctx, system, run_dir):
        port = free_port()
        ops, sample = shapes_run(ctx, system, run_dir, [(port, [SHAPES, "--listen", str(port)])],
                                 [[SHAPES, "--connect", str(port)] + common_args(ctx, n)])
        return {"ops": ops}, sample
    return fn


def procs_sweep(n):
    """n independent client/server process pairs, one connection each."""
    def fn(ctx, system, run_dir):
        ports = free_ports(n)
        ops, sample = shapes_run(ctx, system, run_dir,
                                 [(p, [SHAPES, "--listen", str(p)]) for p in ports],
                                 [[SHAPES, "--connect", str(p)] + common_args(ctx, 1) for p in ports])
        return {"ops": ops}, sample
    return fn


def fan_in(nclients, k):
    def fn(ctx, system, run_dir):
        port = free_port()
        ops, sample = shapes_run(ctx, system, run_dir, [(port, [SHAPES, "--listen", str(port)])],
                                 [[SHAPES, "--connect", str(port)] + common_args(ctx, k)
                                  for _ in range(nclients)])
        return {"ops": ops}, sample
    return fn


def fan_out(nservers, k):
    def fn(ctx, system, run_dir):
        ports = free_ports(nservers)
        ops, sample = shapes_run(ctx, system, run_dir,
                                 [(p, [SHAPES, "--listen", str(p)]) for p in ports],
                                 [[SHAPES, "--connect", ",".join(map(str, ports))] + common_args(ctx, k)])
        return {"ops": ops}, sample
    return fn


def all_to_all(npeers, k):
    """Every peer listens and connects to every other; nobody connects
    before every peer listens (--wait-for), so no connect meets a port
    without a listener (the shim would remember that as "no shimmed
    listener" and keep later connections on TCP)."""
    def fn(ctx, system, run_dir):
        ports = free_ports(npeers)
        go = os.path.join(run_dir, "go")
        peers = [[SHAPES, "--listen", str(p), "--wait-for", go,
                  "--connect", ",".join(str(q) for q in ports if q != p)] + common_args(ctx, k)
                 for p in ports]
        ops, sample = shapes_run(ctx, system, run_dir, [], peers, first_line=True,
                                 before=lambda: ready(ports, go))
        return {"ops": ops}, sample
    return fn


def ready(ports, go):
    for p in ports:
        wait_port(p)
    with open(go, "w"):
        pass


# ---- redis, nginx, memcached ---------------------------------------------------


def redis(pipeline):
    def fn(ctx, system, run_dir):
        port = free_port()
        server(ctx, system, run_dir,
               ["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--save", "",
                "--appendonly", "no", "--daemonize", "no"], port)
        # redis-benchmark counts requests, not seconds: sized for about
        # ctx.secs per test on kernel TCP here.
        n = int((40000 if pipeline == 1 else 300000) * ctx.secs)
        (out,), sample = run_clients(
            ctx, system, run_dir,
            [["redis-benchmark", "-h", "127.0.0.1", "-p", str(port), "-t", "set,get", "-n", str(n),
              "-c", "50", "-P", str(pipeline), "-q"]],
            sample_at=min(0.4, ctx.secs / 3), timeout=30 + 20 * ctx.secs)
        out = out.replace("\r", "\n")
        return {"set": grab(r"SET: ([\d.]+) requests per second", out, "SET rate"),
                "get": grab(r"GET: ([\d.]+) requests per second", out, "GET rate")}, sample
    return fn


NGINX_CONF = """worker_processes {workers};
daemon off;
master_process on;
error_log {d}/error.log warn;
pid {d}/nginx.pid;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  sendfile off;
  client_body_temp_path {d}/tmp; proxy_temp_path {d}/tmp; fastcgi_temp_path {d}/tmp;
  uwsgi_temp_path {d}/tmp; scgi_temp_path {d}/tmp;
  server {{ listen 127.0.0.1:{port}; root {d}/www; }}
}}
"""


def nginx_site(run_dir, workers=1):
    """A private nginx (128 B file `small`, 1 MiB file `big`) under run_dir;
    returns (argv, port)."""
    port = free_port()
    d = os.path.join(run_dir, "nginx")
    os.makedirs(os.path.join(d, "www"))
    os.makedirs(os.path.join(d, "tmp"))
    with open(os.path.join(d, "www", "small"), "wb") as f:
        f.write(b"x" * 128)
    with open(os.path.join(d, "www", "big"), "wb") as f:
        f.write(os.urandom(1 << 20))
    for root, dirs, files in os.walk(d):
        for x in dirs:
            os.chmod(os.path.join(root, x), 0o755)
        for x in files:
            os.chmod(os.path.join(root, x), 0o644)
    os.chmod(d, 0o755)
    conf = os.path.join(d, "nginx.conf")
    with open(conf, "w") as f:
        f.write(NGINX_CONF.format(workers=workers, d=d, port=port))
    return ["nginx", "-c", conf, "-p", d + "/"], port


def start_nginx(ctx, system, run_dir, workers=1):
    """nginx serving /small (128 B) and /big (1 MiB) on a free port; returns
    the port."""
    argv, port = nginx_site(run_dir, workers)
    server(ctx, system, run_dir, argv, port, name="nginx")
    return port


def wrk(ctx, system, run_dir, url, conns, threads=1):
    """Requests/s of wrk against url (an error if wrk saw any)."""
    secs = max(1, round(ctx.secs))
    (out,), sample = run_clients(
        ctx, system, run_dir,
        [["wrk", f"-t{threads}", f"-c{conns}", f"-d{secs}s", url]],
        sample_at=secs / 2 + 0.2, timeout=secs + 30)
    if "Socket errors" in out or "Non-2xx" in out:
        raise BenchError("wrk reported errors:\n" + out)
    return {"rps": grab(r"Requests/sec:\s+([\d.]+)", out, "Requests/sec")}, sample


def nginx(fname, conns):
    def fn(ctx, system, run_dir):
        port = start_nginx(ctx, system, run_dir)
        return wrk(ctx, system, run_dir, f"http://127.0.0.1:{port}/{fname}", conns)
    return fn


def memcached(threads):
    def fn(ctx, system, run_dir):
        return memcached_run(ctx, system, run_dir, threads)
    return fn


def memcached_run(ctx, system, run_dir, threads):
    port = free_port()
    argv = ["memcached", "-l", "127.0.0.1", "-p", str(port), "-U", "0", "-t", str(threads)]
    if os.geteuid() == 0:
        argv += ["-u", "nobody"]
    server(ctx, system, run_dir, argv, port)
    # Long enough on the fastest system (120k ops/s under the shim here)
    # that its status sample at sample_at falls inside the run.
    n = int(20000 * ctx.secs)
    res, sample = {}, None
    for test in ("set", "get"):
        (out,), s = run_clients(
            ctx, system, run_dir,
            [["memcslap", f"--servers=127.0.0.1:{port}", "--concurrency=4",
              f"--execute-number={n}", f"--test={test}", "--tcp-nodelay"]],
            sample_at=min(0.4, ctx.secs / 3), timeout=30 + 20 * ctx.secs)
        if "Fatal error" in out or "FAILURE" in out:
            raise BenchError(f"memcslap {test} reported errors:\n{out[-800:]}")
        m = re.search(r"Time to \w+\s+(\d+) keys by\s+\d+ threads:\s+([\d.]+) seconds", out)
        if not m:
            raise BenchError(f"memcslap {test}: no timing line:\n{out[-800:]}")
        res[test] = int(m.group(1)) / max(float(m.group(2)), 1e-6)
        sample = sample or s
    return res, sample


# ---- short connections ---------------------------------------------------------


CONNRR = os.path.join(BIN, "connrr")


def ab_close(ctx, system, run_dir):
    """ab without keep-alive: a new connection per request."""
    argv, port = nginx_site(run_dir)
    server(ctx, system, run_dir, argv, port, name="nginx")
    n = int(8000 * ctx.secs)
    (out,), sample = run_clients(
        ctx, system, run_dir,
        [["ab", "-q", "-c", "16", "-n", str(n), f"http://127.0.0.1:{port}/small"]],
        sample_at=min(0.4, ctx.secs / 3), timeout=60 + 30 * ctx.secs)
    failed = grab(r"Failed requests:\s+(\d+)", out, "Failed requests")
    complete = grab(r"Complete requests:\s+(\d+)", out, "Complete requests")
    if failed or complete != n or "Non-2xx" in out:
        raise BenchError("ab reported failed or missing requests:\n" + out[-800:])
    return {"rps": grab(r"Requests per second:\s+([\d.]+)", out, "Requests per second")}, sample


def redis_close(ctx, system, run_dir):
    """redis-benchmark -k 0: a new connection per request."""
    port = free_port()
    server(ctx, system, run_dir,
           ["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--save", "",
            "--appendonly", "no", "--daemonize", "no"], port)
    n = int(4000 * ctx.secs)
    (out,), sample = run_clients(
        ctx, system, run_dir,
        [["redis-benchmark", "-h", "127.0.0.1", "-p", str(port), "-t", "set,get", "-n", str(n),
          "-c", "16", "-k", "0", "-q"]],
        sample_at=min(0.4, ctx.secs / 3), timeout=60 + 30 * ctx.secs)
    out = out.replace("\r", "\n")
    return {"set": grab(r"SET: ([\d.]+) requests per second", out, "SET rate"),
            "get": grab(r"GET: ([\d.]+) requests per second", out, "GET rate")}, sample


def pg_bin(program):
    """`program` of the newest PostgreSQL under /usr/lib/postgresql (Debian
    keeps the server's binaries off PATH), else from PATH."""
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{program}"),
                   key=lambda p: [int(x) if x.isdigit() else 0 for x in p.split("/")[4].split(".")])
    return found[-1] if found else shutil.which(program)


def as_postgres(argv):
    """argv as the `postgres` user when running as root (initdb and the
    postmaster refuse root)."""
    if os.geteuid() != 0:
        return argv
    return ["setpriv", "--reuid", "postgres", "--regid", "postgres", "--init-groups", "--"] + argv


def pgbench_connect(ctx, system, run_dir):
    """pgbench -C -S: a new connection per select-only transaction, against
    a private cluster made under run_dir (removed with it)."""
    tools = {p: pg_bin(p) for p in ("initdb", "postgres", "pgbench")}
    missing = [p for p, path in tools.items() if not path]
    if missing:
        raise BenchError(f"PostgreSQL programs not found: {', '.join(missing)}")
    data = os.path.join(run_dir, "pgdata")
    os.makedirs(data)
    if os.geteuid() == 0:
        pw = pwd.getpwnam("postgres")
        os.chown(data, pw.pw_uid, pw.pw_gid)
    env = {k: v for k, v in system.env.items() if k != "LD_PRELOAD"}
    p = subprocess.run(as_postgres([tools["initdb"], "-D", data, "-U", "postgres", "--auth=trust",
                                    "-E", "UTF8", "--no-sync"]),
                       env=env, capture_output=True, text=True, timeout=180)
    if p.returncode != 0:
        raise BenchError(f"initdb failed ({p.returncode}):\n{p.stderr[-800:]}")
    port = free_port()
    server(ctx, system, run_dir,
           as_postgres([tools["postgres"], "-D", data, "-p", str(port), "-k", "",
                        "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off"]),
           port, name="postgres", ready_text="database system is ready to accept connections")
    base = [tools["pgbench"], "-h", "127.0.0.1", "-p", str(port), "-U", "postgres"]
    p = subprocess.run(base + ["-i", "-s", "1", "-q", "postgres"], env=env, capture_output=True,
                       text=True, timeout=180)
    if p.returncode != 0:
        raise BenchError(f"pgbench -i failed ({p.returncode}):\n{(p.stdout + p.stderr)[-800:]}")
    secs = max(1, round(ctx.secs))
    (out,), sample = run_clients(
        ctx, system, run_dir,
        [base + ["-C", "-S", "-c", "4", "-j", "2", "-T", str(secs), "postgres"]],
        sample_at=secs / 2 + 0.2, timeout=secs + 60)
    if not re.search(r"number of failed transactions: 0 ", out):
        raise BenchError("pgbench reported failed transactions:\n" + out[-800:])
    return {"tps": grab(r"tps = ([\d.]+)", out, "tps")}, sample


def time_wait_count():
    """TCP sockets in TIME-WAIT on this host now (every run's closed
    connections leave some for 60 s, and the machine's other jobs too); a
    ring's set-up binds a port first, which gets slower the more there
    are."""
    n = 0
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(path) as f:
                next(f, None)
                n += sum(1 for line in f if line.split(None, 4)[3] == "06")
        except OSError:
            pass
    return n


def connrr_server(ctx, system, run_dir, threads=1, env=None):
    port = free_port()
    sys_env = system.env
    if env:
        system.env = env
    try:
        p = server(ctx, system, run_dir, [CONNRR, "server", "--port", str(port),
                                          "--threads", str(threads)],
                   port, name="connrr-server", ready_text="listening")
    finally:
        system.env = sys_env
    return p, port


def short_env(system, short_ms):
    """The system's environment with RINGSOCK_SHORT_MS=short_ms where the
    shim is loaded (None: the shim's default)."""
    env = dict(system.env)
    if short_ms is not None and "LD_PRELOAD" in env:
        env["RINGSOCK_SHORT_MS"] = str(short_ms)
    return env


def connrr_latency(short_ms=None):
    """connect + 64 B request/response + close, one connection at a time;
    short_ms sets RINGSOCK_SHORT_MS for both ends (0: every connection is
    offered a ring). Connections this short seldom show in a status
    sample, so the run's sample is connrr's own probes (every 100th
    connection: was a ring mapped while it was open)."""
    def fn(ctx, system, run_dir):
        env = short_env(system, short_ms)
        _, port = connrr_server(ctx, system, run_dir, env=env)
        tw = time_wait_count()
        n = int(1500 * ctx.secs)
        (out,), _ = run_clients(
            ctx, system, run_dir,
            [[CONNRR, "client", "--port", str(port), "--n", str(n), "--size", "64"]],
            sample_at=3600, timeout=60 + 30 * ctx.secs, env=env)
        d = shapes_json(out)
        sample = None
        if "LD_PRELOAD" in env:
            sample = {"shm": d["probes_on_ring"], "tcp": d["probes"] - d["probes_on_ring"]}
        return {"p50": d["p50_us"], "p99": d["p99_us"], "tw": float(tw)}, sample
    return fn


def proc_holdings(pid):
    """(fds, ring memfds, RSS KiB) of pid, or None once it is gone."""
    try:
        fds = rings = 0
        for name in os.listdir(f"/proc/{pid}/fd"):
            fds += 1
            try:
                target = os.readlink(f"/proc/{pid}/fd/{name}")
            except OSError:
                continue
            if target.removesuffix(" (deleted)").endswith(("/memfd:ringsock", "/memfd:ringsock-verbs")):
                rings += 1
        with open(f"/proc/{pid}/status") as f:
            rss = next((int(line.split()[1]) for line in f if line.startswith("VmRSS:")), 0)
        return fds, rings, rss
    except (OSError, ValueError):
        return None


# ringsock_proto::offers: 8 header words ([magic, slots, overflow, ..]),
# the occupancy bitmap (slots / 64 words, rounded up), then entries of 8
# words ([seq, key0..key4, ..]); key4 (ports and a set bit) is zero in a
# free entry.
OFFERS_MAGIC = int.from_bytes(b"RSOFFER3", "little")


def offer_table(pid):
    """(live entries, overflow count) of the offer table the daemon `pid`
    shares with its processes (read through its memfd), or None."""
    try:
        for name in os.listdir(f"/proc/{pid}/fd"):
            path = f"/proc/{pid}/fd/{name}"
            try:
                if not os.readlink(path).startswith("/memfd:ringsock-offers"):
                    continue
                with open(path, "rb") as f:
                    data = f.read()
            except OSError:
                continue
            words = struct.unpack(f"<{len(data) // 8}Q", data[:len(data) // 8 * 8])
            if len(words) < 8 or words[0] != OFFERS_MAGIC:
                return None
            base = 8 + (words[1] + 63) // 64
            slots = min(words[1], (len(words) - base) // 8)
            live = sum(1 for i in range(slots) if words[base + 8 * i + 5] != 0)
            return live, words[2]
    except OSError:
        pass
    return None


def churn(rate, threads=2, short_ms=None):
    """connrr churn at `rate` conn/s for the run's length (60 s full, 10 s
    quick), sampling the client's, the server's and the daemon's holdings
    every few seconds. The baseline is taken after a few warm-up
    connections (the shim opens its daemon session and maps the offer
    table once, on first use). Flat: the server and the daemon hold as
    many fds and ring memfds after the churn (settled) as before it, the
    daemon's offer table holds no more entries (and no overflow) than
    before, and no process's RSS grew by more than 1 MiB from the first
    sample under load to the last."""
    def fn(ctx, system, run_dir):
        secs = 10 if ctx.quick else 60
        every = 2.0 if ctx.quick else 5.0
        env = short_env(system, short_ms)
        srv, port = connrr_server(ctx, system, run_dir, threads=threads, env=env)
        warm = subprocess.run([CONNRR, "client", "--port", str(port), "--n", "20"], env=env,
                              capture_output=True, text=True, timeout=60)
        if warm.returncode != 0:
            raise BenchError(f"connrr warm-up failed ({warm.returncode}):\n{warm.stderr[-800:]}")
        daemon = getattr(system, "daemon", None)
        idle = {n: p for n, p in (("server", srv), ("daemon", daemon)) if p is not None}
        tw = time_wait_count()
        before = {n: proc_holdings(p.pid) for n, p in idle.items()}
        offers_before = offer_table(daemon.pid) if daemon is not None else None
        offers_peak = 0
        out_path = os.path.join(run_dir, "churn.out")
        with open(out_path, "wb") as f:
            cli = ctx.procs.start([CONNRR, "churn", "--port", str(port), "--secs", str(secs),
                                   "--rate", str(rate), "--threads", str(threads)],
                                  env, log=os.path.join(run_dir, "churn.err"), stdout=f)
        watched = dict(idle, client=cli)
        series, sample = [], None
        t0 = time.time()
        next_at = t0 + 1.0
        while cli.poll() is None:
            if time.time() > t0 + secs + 60:
                raise BenchError(f"connrr churn did not finish in {secs + 60} s")
            if time.time() >= next_at:
                series.append({n: proc_holdings(p.pid) for n, p in watched.items()})
                if daemon is not None:
                    live = offer_table(daemon.pid)
                    offers_peak = max(offers_peak, live[0] if live else 0)
                if sample is None:
                    sample = system.sample()
                next_at += every
            time.sleep(0.05)
        if cli.returncode != 0:
            raise BenchError(f"connrr churn exited {cli.returncode}" + tail(os.path.join(run_dir, "churn.err")))
        d = shapes_json(open(out_path).read())
        after = settle(idle, before)
        offers_after = offer_table(daemon.pid) if daemon is not None else None
        if daemon is not None and (offers_before is None or offers_after is None):
            raise BenchError("could not read the daemon's offer table")
        under = [s for s in series if all(v is not None for v in s.values())]
        if len(under) < 2:
            raise BenchError(f"fewer than 2 samples under load ({len(under)})")
        first, last = under[0], under[-1]
        rss_growth = {n: last[n][2] - first[n][2] for n in watched}
        fd_growth = {n: after[n][0] - before[n][0] for n in idle}
        ring_left = sum(after[n][1] for n in idle)
        offers_left = offers_after[0] - offers_before[0] if daemon is not None else 0
        overflow = offers_after[1] if daemon is not None else 0
        flat = all(g <= 0 for g in fd_growth.values()) and ring_left == 0 and \
            all(g <= 1024 for g in rss_growth.values()) and offers_left <= 0 and overflow == 0
        with open(os.path.join(run_dir, "churn-samples.json"), "w") as f:
            json.dump({"before": before, "under": under, "after": after,
                       "offers_before": offers_before, "offers_after": offers_after}, f)
        vals = {"rate": d["rate"], "flat": 1.0 if flat else 0.0, "tw": float(tw),
                "fds": float(sum(fd_growth.values())), "rings": float(ring_left),
                "rss_srv": float(rss_growth["server"]), "rss_cli": float(rss_growth["client"]),
                "peak_fds": float(max(s["client"][0] + s["server"][0] for s in under)),
                "peak_rings": float(max(s["client"][1] + s["server"][1] for s in under))}
        if daemon is not None:
            vals["rss_daemon"] = float(rss_growth["daemon"])
            vals["fds_daemon"] = float(fd_growth["daemon"])
        else:
            vals["rss_daemon"] = vals["fds_daemon"] = 0.0
        vals["offers_left"], vals["offers_peak"] = float(offers_left), float(offers_peak)
        vals["offers_overflow"] = float(overflow)
        return vals, sample
    return fn


def settle(idle, before, wait=10.0):
    """The holdings of the idle processes once they are back at or below
    `before` (a shim may close a ring on its background thread), or as
    they stand after `wait` s."""
    end = time.time() + wait
    while True:
        now = {n: proc_holdings(p.pid) for n, p in idle.items()}
        if any(v is None for v in now.values()):
            gone = [n for n, v in now.items() if v is None]
            raise BenchError(f"{', '.join(gone)} exited during the churn")
        if all(now[n][0] <= before[n][0] and now[n][1] <= before[n][1] for n in idle) \
                or time.time() > end:
            return now
        time.sleep(0.1)


# ---- the suites -------------------------------------------------------------------


SUITES = ["msgsize", "conns", "procs", "shapes", "redis", "nginx", "memcached", "iperf3", "short",
          "programs", "shimpath", "ablation"]
# Suites run only when named.
NAMED_ONLY = ("short", "programs", "shimpath")
# What a run without --suites runs: all but `short` (its churn rows alone
# take 12 minutes in a full run), `programs` (it needs databases, node,
# haproxy and, for its sockmap column, root) and `shimpath` (its sockmap
# column needs root too).
DEFAULT_SUITES = [x for x in SUITES if x not in NAMED_ONLY]


CHURN_RATE = 20000


def build_cases(quick, nproc):
    """{suite: [Case]} for every suite, quick or full."""
    sizes = [64, 65536, 1 << 20] if quick else \
        [64, 256, 1024, 4096, 16384, 65536, 262144, 1 << 20]
    conns = [1, 256] if quick else [1, 4, 16, 64, 256, 1024]
    procs = sorted({1, nproc}) if quick else sorted({1, nproc} | {p for p in (2, 4, 8, 16, 32) if p < nproc})
    per = [1, 4] if quick else [1, 4, 16]
    lat = [("p50", "RTT p50 µs", "lower"), ("p99", "RTT p99 µs", "lower"),
           ("p999", "RTT p99.9 µs", "lower")]
    ops = [("ops", "ops/s", "higher")]
    s = {k: [] for k in SUITES}
    for n in sizes:
        s["msgsize"].append(Case("msgsize", f"iperf3 -l {size_label(n)} one-way", [("tput", "MB/s", "higher")],
                                 ["iperf3"], iperf3_size(n), x=n))
    for n in sizes:
        if n <= SOCKPERF_MAX:
            s["msgsize"].append(Case("msgsize", f"ping-pong {size_label(n)} RTT (sockperf)", lat,
                                     ["sockperf"], sockperf_pingpong(n), x=n))
        else:
            s["msgsize"].append(Case("msgsize", f"ping-pong {size_label(n)} RTT (shapes)", lat,
                                     [], shapes_pingpong(n), x=n))
    for n in conns:
        s["conns"].append(Case("conns", f"{n} conns, 1 client -> 1 server, 64 B echo", ops, [],
                               conns_sweep(n), x=n))
    for n in procs:
        s["procs"].append(Case("procs", f"{n} client/server pairs, 64 B echo", ops, [],
                               procs_sweep(n), x=n))
    for k in per:
        s["shapes"].append(Case("shapes", f"many-to-one: 4 clients x {k} conns -> 1 server", ops, [],
                                fan_in(4, k), x=k))
    for k in per:
        s["shapes"].append(Case("shapes", f"one-to-many: 1 client -> 4 servers x {k} conns", ops, [],
                                fan_out(4, k), x=k))
    for k in per:
        s["shapes"].append(Case("shapes", f"all-to-all: 4 peers, {k} conns to each other", ops, [],
                                all_to_all(4, k), x=k))
    rps = [("set", "SET req/s", "higher"), ("get", "GET req/s", "higher")]
    for p in (1, 16):
        s["redis"].append(Case("redis", f"redis-benchmark -c 50 -P {p}", rps,
                               ["redis-server", "redis-benchmark"], redis(p)))
    s["nginx"].append(Case("nginx", "wrk -c 16 / nginx, 128 B file", [("rps", "req/s", "higher")],
                           ["nginx", "wrk"], nginx("small", 16)))
    s["nginx"].append(Case("nginx", "wrk -c 4 / nginx, 1 MiB file", [("rps", "req/s", "higher")],
                           ["nginx", "wrk"], nginx("big", 4)))
    s["memcached"].append(Case("memcached", "memcslap -c 4 / memcached",
                               [("set", "SET ops/s", "higher"), ("get", "GET ops/s", "higher")],
                               ["memcached", "memcslap"], memcached(2)))
    s["short"].append(Case("short", "ab -c 16 / nginx, 128 B file, no keep-alive",
                           [("rps", "req/s", "higher")], ["nginx", "ab"], ab_close))
    s["short"].append(Case("short", "redis-benchmark -c 16 -k 0 (connection per request)", rps,
                           ["redis-server", "redis-benchmark"], redis_close))
    s["short"].append(Case("short", "pgbench -C -S -c 4 (connection per transaction)",
                           [("tps", "tps", "higher")], ["setpriv"], pgbench_connect))
    tw = ("tw", "TIME-WAIT sockets at start", "info")
    rr = [("p50", "p50 µs", "lower"), ("p99", "p99 µs", "lower"), tw]
    s["short"].append(Case("short", "connrr: connect + 64 B request/response + close", rr, [],
                           connrr_latency()))
    s["short"].append(Case("short", "connrr, RINGSOCK_SHORT_MS=0 (every connection offered a ring)",
                           rr, [], connrr_latency(0)))
    churn_metrics = [("rate", "conn/s achieved", "higher"),
                     ("flat", "flat (1 yes, 0 no)", "info"),
                     ("fds", "fds left, server+daemon", "info"),
                     ("rings", "ring memfds left", "info"),
                     ("peak_fds", "fds peak, client+server", "info"),
                     ("peak_rings", "ring memfds peak, client+server", "info"),
                     ("rss_cli", "client RSS growth KiB", "info"),
                     ("rss_srv", "server RSS growth KiB", "info"),
                     ("rss_daemon", "daemon RSS growth KiB", "info"),
                     ("fds_daemon", "daemon fds left", "info"),
                     ("offers_left", "offer table entries left", "info"),
                     ("offers_peak", "offer table entries peak", "info"),
                     ("offers_overflow", "offer table overflow left", "info"), tw]
    s["short"].append(Case("short", f"connrr churn, 2 threads, target {CHURN_RATE} conn/s",
                           churn_metrics, [], churn(CHURN_RATE)))
    s["short"].append(Case("short", f"connrr churn, RINGSOCK_SHORT_MS=0, target {CHURN_RATE} conn/s",
                           churn_metrics, [], churn(CHURN_RATE, short_ms=0)))
    for p in (1, 4):
        s["iperf3"].append(Case("iperf3", f"iperf3 -P {p}", [("tput", "Gbit/s", "higher")],
                                ["iperf3"], iperf3_streams(p)))
    import programs  # imports this module's pieces
    import shimpath
    s["programs"] = programs.cases()
    s["shimpath"] = shimpath.cases()
    return s


def which(tool):
    return shutil.which(tool)
