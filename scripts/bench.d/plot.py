#!/usr/bin/python3
"""Plots for scripts/bench: `plot.py RESULTS.csv OUT_DIR` writes
msgsize_throughput.png and msgsize_latency.png (log axes, one line per
system, min..max as error bars), and conns.png, and prints the names it wrote.
Run by scripts/bench with a python that has matplotlib (Debian's
python3-matplotlib)."""

import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load(path):
    with open(path, newline="") as f:
        return [r for r in csv.DictReader(f) if r["median"]]


def series(rows, suite, metric, pick=lambda r: True):
    """{system: [(x, median, min, max)]} sorted by x."""
    out = {}
    for r in rows:
        if r["suite"] != suite or r["metric"] != metric or not r["x"] or not pick(r):
            continue
        out.setdefault(r["system"], []).append(
            (float(r["x"]), float(r["median"]), float(r["min"]), float(r["max"])))
    return {k: sorted(v) for k, v in out.items()}


COLORS = {"kernel": "tab:blue", "ringsock": "tab:orange", "rsocket": "tab:green"}


def draw(ax, data, style="-", suffix=""):
    for system, pts in sorted(data.items()):
        xs = [p[0] for p in pts]
        ys = [p[1] for p in pts]
        lo = [p[1] - p[2] for p in pts]
        hi = [p[3] - p[1] for p in pts]
        ax.errorbar(xs, ys, yerr=[lo, hi], fmt=style, marker="o", ms=4, capsize=3,
                    color=COLORS.get(system), label=system + suffix)


def size_ticks(ax, xs):
    def lab(n):
        n = int(n)
        for u, k in (("MiB", 1 << 20), ("KiB", 1 << 10)):
            if n >= k and n % k == 0:
                return f"{n // k} {u}"
        return f"{n} B"
    ax.set_xticks(xs)
    ax.set_xticklabels([lab(x) for x in xs], rotation=30)
    ax.minorticks_off()


def main():
    rows, out = load(sys.argv[1]), sys.argv[2]
    written = []
    tput = series(rows, "msgsize", "tput")
    if tput and max(len(v) for v in tput.values()) > 1:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        draw(ax, tput)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        size_ticks(ax, sorted({p[0] for v in tput.values() for p in v}))
        ax.set_xlabel("write size (iperf3 -l)")
        ax.set_ylabel("throughput, MB/s (median, min..max)")
        ax.set_title("One-way throughput against message size, 127.0.0.1")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(f"{out}/msgsize_throughput.png", dpi=110)
        written.append("msgsize_throughput.png")
    p50 = series(rows, "msgsize", "p50")
    p99 = series(rows, "msgsize", "p99")
    if p50 and max(len(v) for v in p50.values()) > 1:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        draw(ax, p50, "-", " p50")
        draw(ax, p99, "--", " p99")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        size_ticks(ax, sorted({p[0] for v in p50.values() for p in v}))
        ax.set_xlabel("message size (sockperf up to 65507 B, shapes above)")
        ax.set_ylabel("round trip, µs (median of runs, min..max)")
        ax.set_title("Ping-pong round trip against message size, 127.0.0.1")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(f"{out}/msgsize_latency.png", dpi=110)
        written.append("msgsize_latency.png")
    conns = series(rows, "conns", "ops")
    if conns and max(len(v) for v in conns.values()) > 1:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        draw(ax, conns)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("concurrent connections (one client process, one server process)")
        ax.set_ylabel("64 B round trips per second")
        ax.set_title("Connection-count sweep, 127.0.0.1")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(f"{out}/conns.png", dpi=110)
        written.append("conns.png")
    print("\n".join(written))


if __name__ == "__main__":
    main()
