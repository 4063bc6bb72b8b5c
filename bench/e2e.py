#!/usr/bin/env python3
"""End-to-end benchmarks, printed as JSON lines (suite "end-to-end").

- the main job (scripts/demo.py): the fork pattern (setup once, memory checkpoint, N forks)
  vs the naive pattern (N fresh sandboxes, each doing the whole setup), for N = 8 (and 32
  without --quick);
- a SQLite workload (100k inserts in batches, then queries) inside a sandbox vs on the host.

Needs the daemon up and the python image built (bench/run does both).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "scripts"))
import demo  # noqa: E402  (the main job's fork and naive patterns)
from sandfork import Sandbox  # noqa: E402

# Run inside sandboxes with `python3 -c`, so read as text.
SQLITE = open(os.path.join(os.path.dirname(__file__), "sqlite_workload.py")).read()


def emit(name, value, unit, baseline=None, baseline_name=None, target=None, p99=None,
         speedup=True):
    """One JSON row. The ratio of seconds is a speed-up (baseline ÷ ours) unless `speedup`
    is false (ours ÷ baseline: how many times the baseline's time we take)."""
    row = {"suite": "end-to-end", "name": name, "value": round(value, 4), "unit": unit}
    if baseline is not None:
        ratio = baseline / value if unit == "s" and speedup else value / baseline
        row.update(baseline=round(baseline, 4), baseline_name=baseline_name,
                   ratio=round(ratio, 3))
    if target:
        row["target"] = target
    if p99 is not None:
        row["p99"] = round(p99, 4)
    print(json.dumps(row), flush=True)


def sqlite(image, runs):
    """The SQLite row's emit() arguments. Runs inside a sandbox and on the host alternate,
    so a change of load hits both."""
    inside, host = [], []
    # The image's interpreter is Debian's python3; the host's, when present, is the fair match.
    python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
    with Sandbox.create(image=image, cpus=2, memory_mb=1024) as sb, \
            tempfile.TemporaryDirectory(dir="/var/tmp") as d:
        for _ in range(runs):
            r = sb.run("python3", ["-c", SQLITE, "/root"])
            if r.exit_code != 0:
                raise RuntimeError(f"sqlite inside failed: {r.stderr}")
            inside.append(float(r.stdout))
            out = subprocess.run([python, "-c", SQLITE, d], check=True,
                                 capture_output=True, text=True).stdout
            host.append(float(out))
    return ("SQLite 100k inserts + 2k queries, in a sandbox vs on the host",
            statistics.median(inside), "s", statistics.median(host), "same script on the host",
            "within 1.1×")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--image", default="python")
    ap.add_argument("--quick", action="store_true", help="8 workers only, fewer runs")
    ap.add_argument("--sqlite-only", action="store_true", help="only the SQLite figure")
    args = ap.parse_args()
    # Progress of the patterns goes to stderr; stdout carries only the JSON lines.
    real_stdout, sys.stdout = sys.stdout, sys.stderr
    try:
        # SQLite first: after the patterns the host is still writing back and collecting
        # the naive pattern's 32 sandboxes, which slows the sandbox side more than the host.
        sqlite_row = sqlite(args.image, 3 if args.quick else 5)
        rows = []
        wheels = None if args.sqlite_only else demo.wheel_cache()[0]
        for n in ([] if args.sqlite_only else [8] if args.quick else [8, 32]):
            steps = demo.Steps()
            forked = demo.fork_pattern(steps, args.image, wheels, n)
            naive = demo.naive_pattern(steps, args.image, wheels, n)
            if forked != naive:
                raise RuntimeError(f"fork and naive answers differ at {n} workers")
            rows.append((n, steps.total("compare"), steps.total("naive")))
        sys.stdout = real_stdout
        for n, fork, naive in rows:
            emit(f"fork pattern, {n} workers (speed-up vs naive)", fork, "s", naive,
                 f"naive: {n} fresh sandboxes", "≥ 5× at 32 workers" if n == 32 else "")
        emit(*sqlite_row, speedup=False)
    finally:
        sys.stdout = real_stdout


if __name__ == "__main__":
    main()
