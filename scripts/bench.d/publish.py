"""scripts/bench --publish: make a run's output the repository's current
same-host benchmark page.

The page is docs/bench/same-host/: the run's results.md (one table per
suite, as report.py wrote it), its CSVs and plots, replacing the previous
run's files (older runs live in git and docs/bench/history/). BENCHMARKS.md
holds a summary between two marker lines, rebuilt here from that
results.md, so the figures there are the page's own cells, never retyped.
"""

import os
import re
import shutil

from common import ROOT

PAGE_DIR = os.path.join(ROOT, "docs", "bench", "same-host")
BENCHMARKS = os.path.join(ROOT, "BENCHMARKS.md")
BEGIN = ("<!-- scripts/bench summary: generated from docs/bench/same-host/results.md "
         "by scripts/bench --publish; edit the generator, not this block -->")
END = "<!-- scripts/bench summary end -->"
# What a run writes that belongs on the page (plan.txt and failed/ do not).
PAGE_FILES = ("results.md", "results.csv", "raw.csv", "ablation.csv")
RATIO = "ringsock/kernel"


class PublishError(Exception):
    pass


def cells(line):
    return [c.strip() for c in line.strip().strip("|").split("|")]


def parse(md):
    """results.md -> (conditions {key: value}, [(suite, title, [row dicts])]),
    in the page's order. Rows are {column header: cell}."""
    conditions, suites = {}, []
    section, head = None, None
    for line in md.splitlines():
        if line.startswith("## "):
            m = re.match(r"## (\w+): (.*)$", line)
            section = ("suite", m.group(1), m.group(2)) if m else (line[3:].strip(),)
            head = None
            if section[0] == "suite" and section[1] != "ablation":
                suites.append((section[1], section[2], []))
            continue
        if not line.startswith("|") or section is None:
            continue
        row = cells(line)
        if set(line.replace("|", "").strip()) <= {"-"}:
            continue  # the table's separator line
        if section == ("Conditions",):
            if len(row) == 2 and row[0]:
                conditions[row[0]] = row[1]
        elif section[0] == "suite" and section[1] != "ablation":
            if head is None:
                head = row
            else:
                suites[-1][2].append(dict(zip(head, row)))
    return conditions, suites


def ratio(row):
    try:
        return float(row[RATIO])
    except (KeyError, ValueError):
        return None


def summary(md):
    """The Markdown block BENCHMARKS.md shows for the run in `md`."""
    cond, suites = parse(md)
    if not suites or not any(RATIO in r for _, _, rows in suites for r in rows):
        raise PublishError(f"results.md has no suite table with a {RATIO} column")
    out = [
        f"Latest run: {cond.get('date (UTC)', '?')} UTC, git {cond.get('git (at start)', '?')}, "
        f"{cond.get('cores (nproc)', '?')} cores ({cond.get('CPU', '?')}), kernel "
        f"{cond.get('kernel', '?')}; {cond.get('runs', '?')}; command {cond.get('command', '?')}. "
        "Every table (with medians, min–max and the ablation) and the plots: "
        "[docs/bench/same-host/results.md](docs/bench/same-host/results.md).",
        "",
        "| suite | what | rows on the ring | ringsock / kernel TCP, lowest | highest |",
        "|---|---|---|---|---|",
    ]
    for suite, title, rows in suites:
        measured = [(ratio(r), r) for r in rows if ratio(r) is not None]
        on_ring = sum(r.get("via ring", "").startswith("yes") for r in rows)
        if measured:
            lo = min(measured, key=lambda x: x[0])[1]
            hi = max(measured, key=lambda x: x[0])[1]
            low, high = (f"{r[RATIO]} ({r['workload']}, {r['metric']})" for r in (lo, hi))
        else:
            low = high = "-"
        failed = len(rows) - len(measured)
        title += f"; {failed} FAILED" if failed else ""
        out.append(f"| {suite} | {title} | {on_ring} of {len(rows)} | {low} | {high} |")
    return "\n".join(out)


def splice(text, block):
    """`text` with the lines between BEGIN and END replaced by `block`."""
    try:
        a = text.index(BEGIN) + len(BEGIN)
        b = text.index(END, a)
    except ValueError:
        raise PublishError(f"BENCHMARKS.md lacks the marker lines:\n{BEGIN}\n{END}") from None
    return text[:a] + "\n" + block + "\n" + text[b:]


def publish(out_dir):
    """Copies the run in `out_dir` to the page and rebuilds BENCHMARKS.md's
    summary. Refuses a run with a failed workload."""
    md_path = os.path.join(out_dir, "results.md")
    try:
        with open(md_path) as f:
            md = f.read()
    except OSError as e:
        raise PublishError(f"cannot read {md_path}: {e}") from None
    if re.search(r"^(\| .*\| FAILED|- FAILED|FAILED)", md, re.M):
        raise PublishError(f"{md_path} has failed workloads; the page keeps the previous run")
    block = summary(md)
    with open(BENCHMARKS) as f:
        text = splice(f.read(), block)
    plots = re.findall(r"!\[[^\]]*\]\(([^)/]+\.png)\)", md)
    files = [n for n in PAGE_FILES + tuple(plots) if os.path.isfile(os.path.join(out_dir, n))]
    if os.path.abspath(out_dir) != PAGE_DIR:
        os.makedirs(PAGE_DIR, exist_ok=True)
        for name in os.listdir(PAGE_DIR):
            path = os.path.join(PAGE_DIR, name)
            if os.path.isfile(path):
                os.unlink(path)
        for name in files:
            shutil.copy2(os.path.join(out_dir, name), os.path.join(PAGE_DIR, name))
    with open(BENCHMARKS, "w") as f:
        f.write(text)
    return [os.path.relpath(os.path.join(PAGE_DIR, n), ROOT) for n in files]
