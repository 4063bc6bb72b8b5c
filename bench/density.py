#!/usr/bin/env python3
"""Density: forks of one memory snapshot kept alive in steps, up to ``--max`` (1,000) or
until the host refuses, with what each fork costs at every step.

The snapshot: a python3 process holding ``--mb`` MB (tests/checkpoints/programs/memholder.py)
in a `python` sandbox. Each step forks ``--step`` more children in one call (no ready forks:
``--pool-size 0``) and keeps every child alive, then prints:

- the fork rate of that call (children per second);
- host memory per fork right after it (MemTotal − MemAvailable, before and after the step,
  ÷ the children it made: no waiting for page merging), and with ``--settle-each`` again
  once ``ksmd`` has made three passes;
- an exec (``true``) in every live child, 8 at a time: p50 and p99;
- what one child's parts cost, the median over up to 8 children of the step: its disk
  server's PSS (a process of its own per sandbox), the agent's PSS, its other processes'
  PSS (the restored state), its cgroup's memory charge; and per child of the step, the
  kernel's slab growth, loop devices and mounts.

The run stops at ``--max`` children, or at the first step the daemon refuses a child of
(admission, a failed restore): that step's refusal is printed. At the end merging is
waited for once more (``--settle`` seconds at most) and the settled memory per fork is
printed over all children; every child is then terminated.

    python3 bench/density.py --step 50 --max 1000 | python3 bench/report.py "density" "make bench-density"

Run as root with no daemon up (`make bench-density`); it starts its own (the release
build, on the default data directory, page merging on), with admission opened to
``--max`` children so that the host, not the configuration, is what refuses.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fanout import holder, used_mb  # noqa: E402
from memory import Daemon, pids_of, rollup, settle  # noqa: E402

from sandfork import CheckpointType, Sandbox, Snapshot  # noqa: E402

PARALLEL = 8
SAMPLE = 8
MIB = 2**20


def meminfo_kib(key: str) -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def loop_devices() -> int:
    return sum(1 for p in Path("/sys/block").iterdir() if p.name.startswith("loop") and (p / "loop").is_dir())


def mounts() -> int:
    return len(Path("/proc/self/mountinfo").read_text().splitlines())


def pss(pid: int) -> int:
    try:
        return rollup(pid).get("Pss", 0)
    except OSError:
        return 0


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def parts_of(data: Path, sandbox_id: str) -> Dict[str, float]:
    """One child's parts, in MiB: disk server, agent, its other processes, its cgroup."""
    from memory import cgroup_file

    out = {"disk_server_mib": 0.0, "agent_mib": 0.0, "state_mib": 0.0}
    pid_file = data / "sandboxes" / sandbox_id / "disk" / "server.pid"
    try:
        out["disk_server_mib"] = pss(int(pid_file.read_text().strip())) / MIB
    except (OSError, ValueError):
        pass
    for pid in pids_of(sandbox_id):
        key = "agent_mib" if comm(pid) == "agent" else "state_mib"
        out[key] += pss(pid) / MIB
    out["charge_mib"] = int(cgroup_file(sandbox_id, ["memory.current", "memory.usage_in_bytes"]).read_text()) / MIB
    return out


def exec_times(children: List[Sandbox]) -> List[float]:
    def one(c: Sandbox) -> float:
        t = time.monotonic()
        r = c.run("true")
        if r.exit_code != 0:
            raise RuntimeError(f"an exec failed in {c.id}: {r}")
        return (time.monotonic() - t) * 1000

    with ThreadPoolExecutor(PARALLEL) as pool:
        return list(pool.map(one, children))


def pct(values: List[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def step(snap: Snapshot, n: int, live: List[Sandbox], data: Path) -> dict:
    before, slab0, loops0, mounts0 = used_mb(), meminfo_kib("Slab"), loop_devices(), mounts()
    t = time.monotonic()
    result = Snapshot.fork(snap.id, n)
    took = time.monotonic() - t
    made = list(result)
    live += made
    refused = [f"child {e.index}: {e.error}" for e in result.errors]
    row: dict = {"alive": len(live), "made": len(made), "refused": refused[:3], "refused_count": len(refused)}
    if not made:
        return row
    row["forks_per_s"] = len(made) / took
    row["mib_per_fork"] = (used_mb() - before) / len(made)
    row["slab_kib_per_fork"] = (meminfo_kib("Slab") - slab0) / len(made)
    row["loops_per_fork"] = (loop_devices() - loops0) / len(made)
    row["mounts_per_fork"] = (mounts() - mounts0) / len(made)
    execs = exec_times(live)
    row["exec_p50_ms"], row["exec_p99_ms"] = pct(execs, 0.5), pct(execs, 0.99)
    sampled = [parts_of(data, c.id) for c in random.sample(made, min(SAMPLE, len(made)))]
    for key in sampled[0]:
        row[key] = statistics.median(s[key] for s in sampled)
    return row


def terminate_all(children: List[Sandbox]) -> None:
    with ThreadPoolExecutor(PARALLEL) as pool:
        list(pool.map(lambda c: c.terminate(), children))


def show(row: dict) -> None:
    cols = ("alive", "forks_per_s", "mib_per_fork", "settled_mib_per_fork", "exec_p50_ms", "exec_p99_ms",
            "disk_server_mib", "agent_mib", "state_mib", "charge_mib", "slab_kib_per_fork", "loops_per_fork",
            "mounts_per_fork")
    parts = [f"{c}={row[c]:.1f}" if isinstance(row.get(c), float) else f"{c}={row.get(c)}" for c in cols if c in row]
    print("density.py: " + " ".join(parts), file=sys.stderr, flush=True)
    if row.get("refused"):
        print(f"density.py: {row['refused_count']} refused, e.g. {row['refused'][0]}", file=sys.stderr, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--step", type=int, default=50)
    ap.add_argument("--max", type=int, default=1000)
    ap.add_argument("--settle", type=float, default=120, help="longest wait for merging at the end, seconds")
    ap.add_argument("--settle-each", action="store_true", help="also wait for merging after every step")
    a = ap.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="sfbench-density-"))
    config = scratch / "density.toml"
    config.write_text(f"max_sandboxes = {a.max + 16}\nmax_memory_mb = {(a.max + 16) * 1024}\n")
    d = Daemon("--pool-size", "0", "--memory-merge", "true", "--config", str(config))
    live: List[Sandbox] = []
    rows: List[dict] = []
    try:
        Sandbox.create(image="python", memory_mb=128).terminate()  # builds the image once
        src = holder()
        snap = src.checkpoint(checkpoint_type=CheckpointType.MEMORY, wait_until="completed")
        src.terminate()
        base = used_mb()
        while len(live) < a.max:
            n = min(a.step, a.max - len(live))
            row = step(snap, n, live, d.data)
            if a.settle_each and row["made"]:
                settle(a.settle)
                row["settled_mib_per_fork"] = (used_mb() - base) / len(live)
            rows.append(row)
            show(row)
            if row["refused_count"]:
                break
        settle(a.settle)
        settled = (used_mb() - base) / max(1, len(live))
        print(f"density.py: {len(live)} forks alive; settled {settled:.1f} MiB per fork", file=sys.stderr)
        terminate_all(live)
        live = []
        snap.delete()
    finally:
        terminate_all(live)
        d.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    report(rows, settled, a)


def report(rows: List[dict], settled: float, a: argparse.Namespace) -> None:
    made = [r for r in rows if r["made"]]
    last = made[-1]
    n = last["alive"]
    stopped = f"the host refused at {n + rows[-1]['refused_count']}" if rows[-1]["refused_count"] else f"--max {a.max}"
    lines = [
        (f"forks alive at the end ({stopped}; steps of {a.step})", n, "forks", ""),
        ("fork rate, median over the steps", statistics.median(r["forks_per_s"] for r in made), "forks/s", ""),
        ("host memory per fork right after each step, median over the steps", statistics.median(r["mib_per_fork"] for r in made), "MiB", "≤ 16 MiB"),
        (f"host memory per fork with {n} alive, merging settled", settled, "MiB", ""),
        (f"exec p50 across all {n} live forks (8 at a time)", last["exec_p50_ms"], "ms", ""),
        (f"exec p99 across all {n} live forks", last["exec_p99_ms"], "ms", ""),
        ("one fork's disk server (PSS)", statistics.median(r["disk_server_mib"] for r in made), "MiB", ""),
        ("one fork's agent (PSS)", statistics.median(r["agent_mib"] for r in made), "MiB", ""),
        ("one fork's restored processes (PSS)", statistics.median(r["state_mib"] for r in made), "MiB", ""),
        ("one fork's cgroup memory charge", statistics.median(r["charge_mib"] for r in made), "MiB", ""),
        ("kernel slab per fork", statistics.median(r["slab_kib_per_fork"] for r in made) / 1024, "MiB", ""),
        ("mounts per fork", statistics.median(r["mounts_per_fork"] for r in made), "mounts", ""),
    ]
    for name, value, unit, target in lines:
        print(json.dumps({"suite": "density", "name": name, "value": round(value, 3), "unit": unit, "target": target}))


if __name__ == "__main__":
    main()
