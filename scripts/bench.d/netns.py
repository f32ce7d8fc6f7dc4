"""scripts/bench --suites netns: connections between network namespaces of
one host (issue 24), against the same programs within one namespace.

Every run builds its own topology and deletes it afterwards, whatever
happens: namespaces A and B, each with a veth pair to a bridge in a third
namespace (the hub, standing for a container host's bridge), A at
10.213.0.2 and B at 10.213.0.3. The "within A" rows run both ends in A on
127.0.0.1; the "A -> B" rows run the server in B on its wildcard address
and the client in A against B's address, so kernel TCP crosses the veth
pairs and the bridge. The shimmed runs' daemon stays in the bench's own
namespace, reached through its socket path, as a containers' daemon is.
Needs root (namespaces) and `ip`.
"""

import os
import subprocess
import time

from common import BenchError, free_port
from workloads import Case, grab, run_clients, server

SUBNET = "10.213.0"
ADDR = {"a": f"{SUBNET}.2", "b": f"{SUBNET}.3"}


def ip(*args):
    p = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if p.returncode != 0:
        raise BenchError(f"ip {' '.join(args)}: {p.stderr.strip()}")


class Topology:
    """A, B and the hub, named after this bench process, built on entry;
    on exit (also after a failure) every process of the run is killed, so
    none keeps a namespace alive, and the namespaces are deleted."""

    def __init__(self, procs):
        self.procs = procs

    def __enter__(self):
        tag = f"rsb{os.getpid() % 100000}"
        self.ns = {"a": f"{tag}a", "b": f"{tag}b", "hub": f"{tag}h"}
        for n in self.ns.values():
            subprocess.run(["ip", "netns", "del", n], capture_output=True)
        try:
            for n in self.ns.values():
                ip("netns", "add", n)
                ip("-n", n, "link", "set", "lo", "up")
            hub = self.ns["hub"]
            ip("-n", hub, "link", "add", "br0", "type", "bridge", "forward_delay", "0")
            ip("-n", hub, "link", "set", "br0", "up")
            for side in ("a", "b"):
                ns = self.ns[side]
                ip("-n", hub, "link", "add", f"v{side}", "type", "veth", "peer", "name", "eth0",
                   "netns", ns)
                ip("-n", hub, "link", "set", f"v{side}", "master", "br0", "up")
                ip("-n", ns, "addr", "add", f"{ADDR[side]}/24", "dev", "eth0")
                ip("-n", ns, "link", "set", "eth0", "up")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc):
        self.procs.kill_all()
        for n in getattr(self, "ns", {}).values():
            subprocess.run(["ip", "netns", "del", n], capture_output=True)
        return False

    def run_in(self, side, argv):
        return ["ip", "netns", "exec", self.ns[side], *argv]


def wait_listen(topo, side, port, proc, timeout=15.0):
    """Waits until something listens on `port` in namespace `side`."""
    end = time.time() + timeout
    while time.time() < end:
        if proc.poll() is not None:
            raise BenchError(f"the server in namespace {side} exited ({proc.returncode})")
        p = subprocess.run(topo.run_in(side, ["ss", "-ltnH", f"sport = :{port}"]),
                           capture_output=True, text=True, timeout=10)
        if p.stdout.strip():
            return
        time.sleep(0.05)
    raise BenchError(f"nothing listens on {port} in namespace {side}")


def placed(across):
    """(server side, client side, address the server binds, address the
    client connects to) for a run within A or from A to B."""
    if across:
        return "b", "a", "0.0.0.0", ADDR["b"]
    return "a", "a", "127.0.0.1", "127.0.0.1"


def sockperf_pingpong(size, across):
    def fn(ctx, system, run_dir):
        srv, cli, bind, dest = placed(across)
        with Topology(ctx.procs) as topo:
            port = free_port()
            p = ctx.procs.start(topo.run_in(srv, ["sockperf", "server", "--tcp", "-i", bind,
                                                  "-p", str(port)]),
                                system.env, log=os.path.join(run_dir, "server.log"))
            wait_listen(topo, srv, port, p)
            secs = max(1, round(ctx.secs))
            (out,), sample = run_clients(
                ctx, system, run_dir,
                [topo.run_in(cli, ["sockperf", "ping-pong", "--tcp", "-i", dest, "-p", str(port),
                                   "-t", str(secs), "-m", str(size), "--full-rtt",
                                   "--mps", "5000000"])],
                sample_at=0.3 + secs / 2, timeout=secs + 30)
        pct = lambda q: grab(rf"percentile {q} =\s+([\d.]+)", out, f"sockperf percentile {q}")
        return {"p50": pct("50.000"), "p99": pct("99.000")}, sample
    return fn


def redis(across):
    def fn(ctx, system, run_dir):
        srv, cli, bind, dest = placed(across)
        with Topology(ctx.procs) as topo:
            port = free_port()
            p = ctx.procs.start(
                topo.run_in(srv, ["redis-server", "--bind", bind, "--port", str(port),
                                  "--protected-mode", "no", "--save", "", "--appendonly", "no",
                                  "--daemonize", "no"]),
                system.env, log=os.path.join(run_dir, "server.log"))
            wait_listen(topo, srv, port, p)
            n = int(40000 * ctx.secs)
            (out,), sample = run_clients(
                ctx, system, run_dir,
                [topo.run_in(cli, ["redis-benchmark", "-h", dest, "-p", str(port), "-t", "set,get",
                                   "-n", str(n), "-c", "50", "-P", "1", "-q"])],
                sample_at=min(0.4, ctx.secs / 3), timeout=30 + 20 * ctx.secs)
        out = out.replace("\r", "\n")
        return {"set": grab(r"SET: ([\d.]+) requests per second", out, "SET rate"),
                "get": grab(r"GET: ([\d.]+) requests per second", out, "GET rate")}, sample
    return fn


def cases():
    lat = [("p50", "RTT p50 µs", "lower"), ("p99", "RTT p99 µs", "lower")]
    rps = [("set", "SET req/s", "higher"), ("get", "GET req/s", "higher")]
    c = []
    for across, where in ((False, "within namespace A (127.0.0.1)"),
                          (True, "namespace A -> B over a bridge")):
        c.append(Case("netns", f"sockperf ping-pong 64 B, {where}", lat, ["sockperf", "ip", "ss"],
                      sockperf_pingpong(64, across)))
        c.append(Case("netns", f"redis-benchmark -c 50 -P 1, {where}", rps,
                      ["redis-server", "redis-benchmark", "ip", "ss"], redis(across)))
    return c
