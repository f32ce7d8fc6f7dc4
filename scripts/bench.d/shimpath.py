"""scripts/bench --suites shimpath: the shim's own cost (issue 27).

Ping-pong round trips through sockperf on every system, and in the same
rounds the bare ring library and the floor under it (`ringbench --suites
floor`: the ring's ping-pong, one cache line bounced between the same two
cores, and the bounce with the message copied in and out each way);
sockperf throughput and redis-benchmark -P 1 on every system. The ring
and floor runs are the case's `bare` runs: once per round, after the
systems.
"""

import csv
import os
import subprocess

from common import RINGBENCH, BenchError, free_port
from workloads import Case, grab, redis, run_clients, server, size_label, sockperf_pingpong

# Far above what a ring reaches (about 17 M msg/s of 64 B here), so the
# sender is never held back by sockperf's own pacing.
THROUGHPUT_MPS = 100_000_000

# The bare runs' columns: (name, label). `floor` is the bare cache-line
# bounce; `copy` the bounce with the message copied each way.
BARE = [("ring", "bare ring (ringbench)"), ("copy", "copy floor (bounce + copy)"),
        ("floor", "floor (cache-line bounce)")]


def pinned():
    """taskset prefixes putting the server on core 1 and the client on core
    0, the cores ringbench pins its two processes to; none on one core."""
    if (os.cpu_count() or 1) < 2:
        return [], []
    return ["taskset", "-c", "1"], ["taskset", "-c", "0"]


def ringbench_floor(size):
    """One round of `ringbench --suites floor --reps 1 --msg size`:
    {"ring" | "copy" | "floor": {"p50", "p99", "p999"}} in µs of round trip."""
    def fn(ctx, run_dir):
        path = os.path.join(run_dir, "ringbench.csv")
        argv = [RINGBENCH, "--suites", "floor", "--reps", "1", "--msg", str(size), "--csv", path]
        if ctx.quick:
            argv.insert(1, "--quick")
        try:
            p = subprocess.run(argv, capture_output=True, text=True, timeout=300)
        except subprocess.TimeoutExpired as e:
            raise BenchError("ringbench --suites floor did not finish in 300 s") from e
        if p.returncode != 0:
            raise BenchError(f"ringbench failed ({p.returncode}):\n{p.stderr[-800:]}")
        key = {"median_us": "p50", "p99_us": "p99", "p999_us": "p999"}
        out = {}
        with open(path) as f:
            for row in csv.DictReader(f):
                if row["suite"] != "floor" or row["metric"] not in key:
                    continue
                name = "floor" if row["case"] == "bounce" else \
                    ("ring" if row["system"] == "ring" else "copy")
                out.setdefault(name, {})[key[row["metric"]]] = float(row["median"])
        if sorted(out) != ["copy", "floor", "ring"]:
            raise BenchError(f"ringbench printed no floor rows:\n{p.stdout[-800:]}")
        return out
    return fn


def sockperf_throughput(size):
    def fn(ctx, system, run_dir):
        port = free_port()
        server(ctx, system, run_dir,
               ["sockperf", "server", "--tcp", "-i", "127.0.0.1", "-p", str(port)], port)
        secs = max(1, round(ctx.secs))
        (out,), sample = run_clients(
            ctx, system, run_dir,
            [["sockperf", "throughput", "--tcp", "-i", "127.0.0.1", "-p", str(port),
              "-t", str(secs), "-m", str(size), "--mps", str(THROUGHPUT_MPS)]],
            sample_at=0.3 + secs / 2, timeout=secs + 30)
        return {"rate": grab(r"Message Rate is ([\d.]+)", out, "sockperf message rate")}, sample
    return fn


def cases():
    lat = [("p50", "RTT p50 µs", "lower"), ("p99", "RTT p99 µs", "lower")]
    srv, cli = pinned()
    c = []
    for n in (64, 4096):
        c.append(Case("shimpath", f"ping-pong {size_label(n)} RTT (sockperf --full-rtt)", lat,
                      ["sockperf", "taskset"] if srv else ["sockperf"],
                      sockperf_pingpong(n, srv, cli), x=n, bare=ringbench_floor(n)))
    c.append(Case("shimpath", f"sockperf throughput 64 B (--mps {THROUGHPUT_MPS})",
                  [("rate", "msg/s", "higher")], ["sockperf"], sockperf_throughput(64)))
    c.append(Case("shimpath", "redis-benchmark -c 50 -P 1",
                  [("set", "SET req/s", "higher"), ("get", "GET req/s", "higher")],
                  ["redis-server", "redis-benchmark"], redis(1)))
    return c
