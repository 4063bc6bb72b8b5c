#!/usr/bin/env python3
"""Puts bench/fork's rows next to bench/fork-podman's, measured in the same run.

Usage: fork_vs_podman.py SANDFORK.jsonl PODMAN.jsonl > merged.jsonl
A sandfork row with a podman counterpart gains a "(vs podman)" row (podman's median as
the baseline, ratio = sandfork ÷ podman, lower is better); a row already compared with
something else (cold creates) keeps that as "(vs cold create)". Other rows pass through.
"""
import json
import re
import subprocess
import sys


def version(cmd):
    try:
        out = subprocess.run(cmd, capture_output=True, text=True).stdout
    except OSError:
        return "?"
    m = re.search(r"\d+\.\d+(\.\d+)?", out)
    return m.group(0) if m else "?"


BASELINE = (f"podman {version(['podman', '--version'])} + CRIU {version(['criu', '--version'])},"
            " --compress none, 4 at a time")
# sandfork row name → podman row name; the target of the comparison, if it has one.
PAIRS = [
    (r"memory checkpoint, python holding (?P<mb>\d+) MB", "memory checkpoint, python {mb} MB"),
    (r"warm restore → first exec, python (?P<mb>\d+) MB", "restore → first exec, python {mb} MB"),
    (r"fork fan-out ×(?P<n>\d+) (?P<kind>total|per child), python (?P<mb>\d+) MB",
     "fan-out ×{n} {kind}, python {mb} MB"),
]
TARGETS = {
    "warm restore → first exec": "≤ 0.5× podman",
    "fork fan-out ×32 total": "≥ 2× podman throughput (ratio ≤ 0.5)",
}


def counterpart(name):
    """The podman row name and target for a sandfork row name, or None."""
    for pattern, podman in PAIRS:
        m = re.fullmatch(pattern, name)
        if m:
            target = next((t for prefix, t in TARGETS.items() if name.startswith(prefix)), None)
            return podman.format(**m.groupdict()), target
    return None


def merged(ours, podman):
    for row in ours:
        match = counterpart(row["name"])
        base = podman.get(match[0]) if match else None
        if base is None:
            yield row
            continue
        vs = dict(row, name=row["name"] + " (vs podman)", baseline=base["value"],
                  baseline_name=BASELINE, ratio=round(row["value"] / base["value"], 3))
        if match[1]:
            vs["target"] = match[1]
        yield vs
        if "baseline" in row:
            yield dict(row, name=row["name"] + " (vs cold create)", target="")


def main():
    ours = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
    podman = {}
    for line in open(sys.argv[2]):
        if line.strip():
            row = json.loads(line)
            podman[row["name"].removeprefix("podman+CRIU: ")] = row
    for row in merged(ours, podman):
        print(json.dumps(row, ensure_ascii=False))


if __name__ == "__main__":
    main()
