#!/usr/bin/env python3
"""Forks from the pool of ready forks, end to end through the API: a python3 process
holding 50 MB in a sandbox, a memory checkpoint, then, in the same run,

- restore → first exec from the pool (the daemon with ``--pool-size``), against a cold
  create → first exec of the same image and a warm restore → first exec without a pool
  (the daemon with ``--pool-size 0``);
- a fork of 32 children with the pool filled to 32, against the same fork without a pool
  and 32 cold creates (4 at a time, as the daemon's fork does).

Every child is checked: it answers with the parent's data, under its own id.

Run as root with no daemon up: ``make bench-pool``. The script starts its daemons itself
(the release build, on the default data directory, one after the other).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from contextlib import contextmanager
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))
from memory import HOLDER, Daemon  # noqa: E402

from sandfork import CheckpointType, Client, Sandbox, Snapshot  # noqa: E402

MEMORY_MB = 512


def ms_since(t: float) -> float:
    return (time.monotonic() - t) * 1000


def pool_forks() -> float:
    _, body = Client().request("GET", "/metrics")
    for line in body.decode().splitlines():
        if line.startswith("sandfork_pool_forks "):
            return float(line.split()[1])
    return 0.0


def wait(what: str, ready: Callable[[], bool], timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not within {timeout:.0f} s")
        time.sleep(0.2)


def source(mb: int) -> Sandbox:
    memory = max(MEMORY_MB, 2 * mb + 512)  # os.urandom and its copy, briefly
    src = Sandbox.create(image="python", memory_mb=memory, allow_internet_access=False)
    src.write_file("/opt/memholder.py", HOLDER.read_bytes())
    src.start_process("python3", ["/opt/memholder.py", str(mb)])
    wait("the holder gets ready", lambda: src.run("test", ["-e", "/tmp/mem.ready"]).exit_code == 0)
    return src


def check(child: Sandbox, want: str) -> None:
    got = child.run("python3", ["/opt/memholder.py", "ask", "sum"]).stdout.strip()
    if got != want:
        raise RuntimeError(f"{child.id}: the data changed ({got} != {want})")
    if child.run("sh", ["-c", "echo $SANDFORK_SANDBOX_ID"]).stdout.strip() != child.id:
        raise RuntimeError(f"{child.id}: not its own identity")


def first_exec(start: Callable[[], Sandbox]) -> float:
    """Milliseconds from the request to the end of the child's first command."""
    t = time.monotonic()
    child = start()
    child.run("true")
    took = ms_since(t)
    child.terminate()
    return took


def fan_out(snap: Snapshot, n: int, want: str) -> float:
    t = time.monotonic()
    result = snap.fork(n)
    took = ms_since(t)
    result.raise_for_errors()
    kids = list(result)
    check(kids[0], want)
    check(kids[-1], want)
    for k in kids:
        k.terminate()
    return took


def cold_fan_out(n: int) -> float:
    def one(_: int) -> Sandbox:
        return Sandbox.create(image="python", memory_mb=MEMORY_MB, allow_internet_access=False)

    t = time.monotonic()
    with ThreadPoolExecutor(4) as ex:
        kids = list(ex.map(one, range(n)))
    took = ms_since(t)
    for k in kids:
        k.terminate()
    return took


@contextmanager
def hot_snapshot(mb: int) -> Iterator[Tuple[Snapshot, str]]:
    """A memory snapshot of a holder of ``mb`` MB, restored once (which makes it hot, and
    is a miss), with the data's hash; deleted with its source afterwards."""
    src = source(mb)
    snap = None
    try:
        want = src.run("python3", ["/opt/memholder.py", "ask", "sum"]).stdout.strip()
        snap = src.checkpoint(checkpoint_type=CheckpointType.MEMORY)
        child = Sandbox.create(snapshot_id=snap.id)
        check(child, want)
        child.terminate()
        yield snap, want
    finally:
        if snap is not None:
            snap.delete()
        src.terminate()


def restores(snap: Snapshot, runs: int, pool: bool) -> List[float]:
    """Restore → first exec, ``runs`` times (each from a refilled pool if ``pool``)."""
    times = []
    for _ in range(runs):
        if pool:
            wait("the pool refills", lambda: pool_forks() >= 1)
            time.sleep(0.5)
        times.append(first_exec(lambda: Sandbox.create(snapshot_id=snap.id)))
    return times


def suite(pool: int, mb: int, runs: int, fan: int) -> Dict[str, List[float]]:
    out: Dict[str, List[float]] = {}
    with hot_snapshot(mb) as (snap, want):
        out["restore"] = restores(snap, runs, pool > 0)
        if not pool:
            cold = lambda: Sandbox.create(image="python", memory_mb=MEMORY_MB, allow_internet_access=False)  # noqa: E731
            out["cold"] = [first_exec(cold) for _ in range(runs)]
            out["cold_fan"] = [cold_fan_out(fan)]
        else:
            wait(f"the pool fills to {fan}", lambda: pool_forks() >= fan, 600)
        out["fan"] = [fan_out(snap, fan, want)]
    return out


def large(mb: int, runs: int, pool: bool) -> List[float]:
    """Restore → first exec of a snapshot holding ``mb`` MB (from the pool if ``pool``)."""
    with hot_snapshot(mb) as (snap, _):
        return restores(snap, runs, pool)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=50)
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--fanout", type=int, default=32)
    ap.add_argument("--large-mb", type=int, default=500, help="the state of the large-state figure")
    a = ap.parse_args()
    d = Daemon("--pool-size", "0")
    try:
        plain = suite(0, a.mb, a.runs, a.fanout)
        plain_large = large(a.large_mb, a.runs, False)
    finally:
        d.stop()
    budget = str(a.fanout * max(a.mb * 2, 64) + 1024)
    d = Daemon("--pool-size", str(a.fanout), "--pool-memory-mb", budget)
    try:
        pooled = suite(a.fanout, a.mb, a.runs, a.fanout)
        pooled_large = large(a.large_mb, a.runs, True)
    finally:
        d.stop()
    med = statistics.median
    state = f"python holding {a.mb} MB"

    def line(name: str, value: float, base: float, base_name: str, target: str = "") -> None:
        j = {"suite": "pool", "name": f"{name}, {state}", "value": round(value, 1), "unit": "ms",
             "baseline": round(base, 1), "baseline_name": base_name, "ratio": round(value / base, 3), "runs": a.runs}
        if target:
            j["target"] = target
        print(json.dumps(j), flush=True)

    line("restore → first exec from the pool", med(pooled["restore"]), med(plain["cold"]),
         "cold create → first exec, same image", "≤ 20 ms")
    line("restore → first exec without a pool", med(plain["restore"]), med(plain["cold"]),
         "cold create → first exec, same image", "≤ 1.2 × cold")
    for how, big, small in (("from the pool", pooled_large, pooled["restore"]),
                            ("without a pool", plain_large, plain["restore"])):
        j = {"suite": "pool", "name": f"restore → first exec {how}, python holding {a.large_mb} MB",
             "value": round(med(big), 1), "unit": "ms", "baseline": round(med(small), 1),
             "baseline_name": f"the same, {a.mb} MB", "ratio": round(med(big) / med(small), 3),
             "target": "≤ 1.5 ×", "runs": a.runs}
        print(json.dumps(j), flush=True)
    line(f"fork ×{a.fanout} from a full pool, total", pooled["fan"][0], plain["fan"][0],
         f"fork ×{a.fanout} without a pool", "≤ 1,200 ms")
    line(f"fork ×{a.fanout} without a pool, total", plain["fan"][0], plain["cold_fan"][0],
         f"{a.fanout} cold creates, 4 at a time")


if __name__ == "__main__":
    main()
