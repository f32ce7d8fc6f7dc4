"""scripts/bench output: the Markdown report (BENCHMARKS.md style), CSVs."""

import csv
import datetime
import os
import platform
import subprocess

from common import BIN, LIB, ROOT

HEADER_FIXED = ["workload", "metric"]


def fmt(v):
    if v is None:
        return "-"
    a = abs(v)
    if a >= 1000:
        return f"{v:.0f}"
    if a >= 100:
        return f"{v:.1f}"
    if a >= 10:
        return f"{v:.2f}"
    return f"{v:.3f}"


def machine():
    """Lines describing the machine: cores, CPU model, kernel, memory."""
    model = "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = "?"
    try:
        with open("/proc/meminfo") as f:
            kb = int(f.readline().split()[1])
            mem = f"{kb / (1 << 20):.1f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    return {
        "cores (nproc)": str(os.cpu_count()),
        "CPU": model,
        "kernel": platform.release(),
        "memory": mem,
    }


def git_rev():
    try:
        rev = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return rev + (" (working tree with uncommitted changes)" if dirty else "")
    except (OSError, subprocess.TimeoutExpired):
        return "?"


def ratio_pairs(systems):
    """(numerator, base) system names of the ratio columns: every system
    over kernel TCP, and ringsock over sockmap when both ran."""
    names = [s.name for s in systems]
    pairs = [(n, names[0]) for n in names[1:]]
    if "ringsock" in names and "sockmap" in names:
        pairs.append(("ringsock", "sockmap"))
    return pairs


def header(systems):
    h = HEADER_FIXED + [s.label for s in systems]
    for num, den in ratio_pairs(systems):
        h.append(f"{num}/{den}")
    h.append("via ring")
    return h


def rows_for(res, systems):
    """res: one case's result dict (see scripts/bench). Yields table rows."""
    base = systems[0].name
    for key, unit, better in res["case"].metrics:
        row = [res["case"].workload, unit]
        if res.get("error"):
            row += ["FAILED"] * (len(systems) + len(ratio_pairs(systems))) + ["-"]
            yield row
            continue
        for s in systems:
            st = res["stats"][s.name][key]
            row.append(f"{fmt(st['median'])} ({fmt(st['min'])}–{fmt(st['max'])})")
        for pair in ratio_pairs(systems):
            r = res["ratio"][pair][key]
            row.append("-" if r is None else f"{r:.2f}")
        if "ringsock" in res["via"]:
            v, counts = res["via"]["ringsock"]
            row.append(f"{v} ({counts})" if counts else v)
        else:
            row.append("n/a")
        yield row


def table(head, rows):
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


SUITE_TITLES = {
    "msgsize": "Message-size sweep: one-way throughput (iperf3 -l) and ping-pong round trip",
    "conns": "Connection-count sweep: one shapes client process with N connections to one server",
    "procs": "Process-count sweep: N independent client/server process pairs",
    "shapes": "Communication shapes (shapes, 64 B echo, closed loop, ops/s summed over clients)",
    "redis": "redis-benchmark (SET and GET, 50 clients)",
    "nginx": "wrk against nginx (1 worker, 1 wrk thread)",
    "memcached": "memcslap against memcached (2 threads)",
    "iperf3": "iperf3 streams (default 128 KiB writes)",
    "programs": "the program matrix's programs against kernel TCP and a BPF sockmap redirect",
    "short": "Short connections: a new connection per request",
    "shimpath": "the shim's own cost: sockperf through the shim against the bare ring and the floor",
}

# Columns of the references a case measures without sockets (Case.bare).
BARE_LABELS = {"ring": "bare ring (ringbench)", "copy": "copy floor", "floor": "floor (cache line)"}


def bare_names(rs):
    return [n for n in BARE_LABELS if any(n in r.get("stats", {}) for r in rs)]


def bare_table(rs, systems):
    """A suite whose cases have bare references: the systems' columns, the
    references', the usual ratios, and ringsock's value over each
    reference's (time over time: 1.0 is the reference's speed)."""
    bare = bare_names(rs)
    shim = "ringsock" in [s.name for s in systems]
    head = header(systems)[:-1]
    head[2 + len(systems):2 + len(systems)] = [BARE_LABELS[n] for n in bare]
    if shim:
        head += [f"ringsock ÷ {n}" for n in bare]
    head.append("via ring")
    rows = []
    for r in rs:
        for base_row, (key, _, _) in zip(rows_for(r, systems), r["case"].metrics):
            cut = 2 + len(systems)
            if r.get("error"):
                row = base_row[:cut] + ["FAILED"] * len(bare) + base_row[cut:-1]
                row += ["-"] * len(bare) * shim + [base_row[-1]]
                rows.append(row)
                continue
            cells, over = [], []
            for n in bare:
                st = r["stats"].get(n, {}).get(key)
                cells.append("-" if st is None else f"{fmt(st['median'])} ({fmt(st['min'])}–{fmt(st['max'])})")
                if shim:
                    m = r["stats"]["ringsock"][key]["median"]
                    over.append("-" if not st or not st["median"] else f"{m / st['median']:.2f}")
            rows.append(base_row[:cut] + cells + base_row[cut:-1] + over + [base_row[-1]])
    return table(head, rows)


def bare_targets(rs, systems):
    """Issue 27's targets for each case with a ring reference: ringsock's
    p50 round trip over the bare ring's (target <= 1.2) and its p99 over
    its p50 (target <= 2)."""
    if "ringsock" not in [s.name for s in systems]:
        return []
    out = []
    for r in rs:
        st = r.get("stats", {})
        if r.get("error") or "ring" not in st or "p50" not in st.get("ring", {}):
            continue
        shim, ring = st["ringsock"], st["ring"]
        line = (f"- `{r['case'].workload}`: ringsock p50 ÷ bare ring p50 = "
                f"{shim['p50']['median'] / ring['p50']['median']:.2f} (target ≤ 1.2); "
                f"ringsock p99 ÷ its p50 = {shim['p99']['median'] / shim['p50']['median']:.2f} "
                "(target ≤ 2)")
        if "copy" in st:
            line += (f"; ringsock p50 ÷ copy floor p50 = "
                     f"{shim['p50']['median'] / st['copy']['p50']['median']:.2f}")
        out.append(line)
    return out


def markdown(meta, systems, results, ablation, plots):
    m = []
    m.append(f"# ringsock benchmarks ({meta['mode']})\n")
    m.append("## Conditions\n")
    m.append("| | |\n|---|---|")
    for k, v in machine().items():
        m.append(f"| {k} | {v} |")
    m.append(f"| git (at start) | {meta['git']} |")
    try:
        built = datetime.datetime.fromtimestamp(os.path.getmtime(LIB), datetime.timezone.utc)
        m.append(f"| binaries | `{BIN}` (libringsock.so built {built:%Y-%m-%d %H:%M} UTC) |")
    except OSError:
        pass
    m.append(f"| date (UTC) | {meta['date']} |")
    m.append(f"| load average at start / end | {meta['load0']} / {meta['load1']} |")
    m.append(f"| command | `{meta['command']}` |")
    m.append(f"| runs | {meta['reps']} per system and workload, {meta['secs']} s each, "
             f"alternating {' / '.join(s.name for s in systems)} |")
    m.append(f"| wall time | {meta['elapsed']:.0f} s |")
    m.append("")
    m.append(meta["ring_note"] + "\n")
    m.append("Cells: median (min–max) over the runs. Ratio columns: the system over "
             f"{systems[0].label}, oriented so that > 1 means better (throughput: "
             "system / kernel; latency: kernel / system), medians of the same session. "
             "Ratios here are measured against kernel TCP loopback on the same machine in the same "
             "session, interleaved run by run. `via ring`: what `ringsock-ctl status --json` showed "
             "in every shimmed run, sampled mid-run (or 20 ms in, when the mid-run sample saw "
             "none) (connection ends on the shared-memory ring / on kernel TCP; the run with the "
             "fewest ring ends is shown); the other systems are sampled at the same moments with "
             "`ss`, so the observer loads them alike. Everything on 127.0.0.1; each shimmed run "
             "has its own `ringsock-ctl` daemon.\n")
    head = header(systems)
    for suite in meta["suites"]:
        if suite == "ablation":
            continue
        rs = [r for r in results if r["case"].suite == suite]
        if not rs:
            continue
        m.append(f"## {suite}: {SUITE_TITLES.get(suite, suite)}\n")
        notes = []
        if bare_names(rs):
            m.append(bare_table(rs, systems))
            notes += bare_targets(rs, systems)
        else:
            rows = [row for r in rs for row in rows_for(r, systems)]
            m.append(table(head, rows))
        m.append("")
        for r in rs:
            if r.get("error"):
                notes.append(f"- FAILED `{r['case'].workload}`: {first_line(r['error'])}")
            if not r.get("error") and r.get("retries"):
                notes.append(f"- `{r['case'].workload}`: retried after a failed run "
                             f"({'; '.join(r['retries'])}; logs in failed/)")
            if not r.get("error") and r.get("reasons"):
                why = "; ".join(f"{k} ({n})" for k, n in sorted(r["reasons"].items()))
                notes.append(f"- `{r['case'].workload}` under ringsock: connection ends on kernel "
                             f"TCP, with the reason status gave: {why}")
        if notes:
            m += notes + [""]
    if ablation is not None:
        m.append("## ablation: RB2 optimizations on the ring itself (`ringbench --suites ablation`)\n")
        m.append("Two processes pinned to two cores, the ring library directly (no sockets, no "
                 "shim); kernel TCP loopback in the same run as reference.\n")
        m.append(ablation.strip() + "\n")
    if plots:
        m.append("## Plots\n")
        for p in plots:
            m.append(f"![{p}]({p})")
        m.append("")
    return "\n".join(m)


def first_line(text):
    text = str(text).strip()
    return text.splitlines()[0] if text else "?"


def write_csvs(out_dir, systems, results):
    base = systems[0].name
    with open(os.path.join(out_dir, "results.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["suite", "workload", "x", "metric", "unit", "better", "system", "median", "min",
                    "max", "n", f"ratio_vs_{base}", "via_ring", "ring_conns"])
        for r in results:
            c = r["case"]
            for key, unit, better in c.metrics:
                for s in systems:
                    if r.get("error"):
                        w.writerow([c.suite, c.workload, c.x, key, unit, better, s.name, "", "", "",
                                    0, "", "", "FAILED"])
                        continue
                    st = r["stats"][s.name][key]
                    rv = None if s.name == base else r["ratio"][(s.name, base)][key]
                    ratio = "" if rv is None else f"{rv:.4f}"
                    via, counts = r["via"].get(s.name, ("n/a", ""))
                    w.writerow([c.suite, c.workload, c.x, key, unit, better, s.name,
                                f"{st['median']:.4f}", f"{st['min']:.4f}", f"{st['max']:.4f}",
                                st["n"], ratio, via, counts])
                for name in BARE_LABELS:
                    st = r.get("stats", {}).get(name, {}).get(key)
                    if st:
                        w.writerow([c.suite, c.workload, c.x, key, unit, better, name,
                                    f"{st['median']:.4f}", f"{st['min']:.4f}", f"{st['max']:.4f}",
                                    st["n"], "", "n/a", ""])
    with open(os.path.join(out_dir, "raw.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["suite", "workload", "metric", "system", "rep", "value", "shm", "tcp"])
        for r in results:
            c = r["case"]
            for (sysname, rep), vals in sorted(r["raw"].items()):
                sample = r["samples"].get((sysname, rep)) or {}
                for key, v in vals.items():
                    w.writerow([c.suite, c.workload, key, sysname, rep, f"{v:.4f}",
                                sample.get("shm", ""), sample.get("tcp", "")])
