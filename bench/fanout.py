#!/usr/bin/env python3
"""Fan-out: N forks of one memory snapshot in one call, with no ready forks, until every
child has answered an exec — next to N cold creates of the same image in the same run.

The snapshot: a python3 process holding 50 MB (tests/checkpoints/programs/memholder.py)
in a `python` sandbox. Per round:

- `fork(N)`: one `POST /v1/snapshots/{id}/fork` of N children (the daemon restores them
  its own number at a time), then an exec in every child (8 at a time), timed from the
  request to the last answer; the host memory the children took right after (MemTotal −
  MemAvailable before and after, ÷ N: no waiting for page merging);
- cold: N creates of the `python` image (8 at a time) and an exec in each.

The daemon runs with `--pool-size 0` and admission opened wide enough for N (a
config of its own: `max_sandboxes`, `max_memory_mb`), so that the figure is the fork's,
not admission's.

    python3 bench/fanout.py --count 100 --rounds 3 | python3 bench/report.py "fan-out" "make bench-fanout"

Run as root with no daemon up (`make bench-fanout`); it starts its own (the release build,
on the default data directory).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parent))
from memory import HOLDER, Daemon  # noqa: E402

from sandfork import CheckpointType, Sandbox, Snapshot  # noqa: E402

PARALLEL = 8


def used_mb() -> float:
    info: Dict[str, int] = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        key, _, rest = line.partition(":")
        info[key] = int(rest.split()[0])
    return (info["MemTotal"] - info["MemAvailable"]) / 1024


def busy_cpu_s() -> float:
    """CPU time the host has spent busy (all CPUs, all processes), in seconds."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def holder() -> Sandbox:
    src = Sandbox.create(image="python", memory_mb=512, allow_internet_access=False)
    src.write_file("/opt/memholder.py", HOLDER.read_bytes())
    src.start_process("python3", ["/opt/memholder.py", "50"])
    deadline = time.monotonic() + 120
    while src.run("test", ["-e", "/tmp/mem.ready"]).exit_code != 0:
        if time.monotonic() > deadline:
            raise RuntimeError("the holder did not get ready")
        time.sleep(0.2)
    return src


def exec_all(children: List[Sandbox]) -> None:
    with ThreadPoolExecutor(PARALLEL) as pool:
        for r in pool.map(lambda c: c.run("true"), children):
            if r.exit_code != 0:
                raise RuntimeError(f"an exec failed: {r}")


def terminate_all(children: List[Sandbox]) -> None:
    with ThreadPoolExecutor(PARALLEL) as pool:
        list(pool.map(lambda c: c.terminate(), children))


def fork_round(snap: Snapshot, n: int) -> Dict[str, float]:
    before = used_mb()
    cpu, t = busy_cpu_s(), time.monotonic()
    result = Snapshot.fork(snap.id, n)
    try:
        result.raise_for_errors()
        forked = time.monotonic() - t
        cpu_per_fork = (busy_cpu_s() - cpu) / n
        exec_all(list(result))
        took = time.monotonic() - t
        per_fork = (used_mb() - before) / n
    finally:
        terminate_all(list(result))
    return {"fork_s": forked, "all_exec_s": took, "mib_per_fork": per_fork, "cpu_ms_per_fork": cpu_per_fork * 1000}


def cold_round(n: int) -> float:
    t = time.monotonic()
    with ThreadPoolExecutor(PARALLEL) as pool:
        made = list(pool.map(lambda _: Sandbox.create(image="python", memory_mb=512, allow_internet_access=False), range(n)))
    try:
        exec_all(made)
        return time.monotonic() - t
    finally:
        terminate_all(made)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="sfbench-fanout-"))
    config = scratch / "fanout.toml"
    config.write_text(f"max_sandboxes = {args.count + 16}\nmax_memory_mb = {(args.count + 16) * 1024}\n")
    d = Daemon("--pool-size", "0", "--config", str(config))
    try:
        Sandbox.create(image="python", memory_mb=128).terminate()  # builds the image once
        src = holder()
        snap = src.checkpoint(checkpoint_type=CheckpointType.MEMORY, wait_until="completed")
        forks, colds = [], []
        for _ in range(args.rounds):
            forks.append(fork_round(snap, args.count))
            colds.append(cold_round(args.count))
        src.terminate()
        snap.delete()
    finally:
        d.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    n = args.count
    cold = statistics.median(colds)
    rows = [
        (f"{n} forks of a memory snapshot (python holding 50 MB), all answering an exec, no ready forks", statistics.median(f["all_exec_s"] for f in forks), "s", cold, f"{n} cold creates of the image, each answering an exec", f"≤ {n / 100:g} s"),
        (f"{n} forks: the fork call alone (every child restored)", statistics.median(f["fork_s"] for f in forks), "s", None, None, ""),
        (f"host CPU per fork during the fork call (all processes: runc, CRIU, lazy pages, disk servers, daemon)", statistics.median(f["cpu_ms_per_fork"] for f in forks), "ms", None, None, ""),
        (f"host memory per fork right after {n} forks (no merging waited for)", statistics.median(f["mib_per_fork"] for f in forks), "MiB", None, None, "≤ 16 MiB"),
        (f"{n} cold creates of the image, each answering an exec (8 at a time)", cold, "s", None, None, ""),
    ]
    for name, value, unit, base, base_name, target in rows:
        line = {"suite": "fanout", "name": name, "value": round(value, 3), "unit": unit, "target": target}
        if base:
            line.update(baseline=round(base, 3), baseline_name=base_name, ratio=round(value / base, 3))
        print(json.dumps(line))


if __name__ == "__main__":
    main()
