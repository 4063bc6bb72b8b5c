#!/usr/bin/env python3
"""Memory shared across forks: a parent holding 200 MB of read-mostly data in a live Python
process, a memory checkpoint, 8 forks of it. Reported, for the daemon with page merging
(``memory_merge``, its default) and without, in the same run: the sum of the forks' PSS
against 8 × the parent's RSS, the memory their cgroups are charged, the host memory the
fan-out took, how long merging took to settle and the CPU the kernel's merging (ksmd)
spent on it; and what a memory checkpoint of one fork stores (the pages it changed), next
to its parent snapshot. Every fork is checked: its data still hashes to the parent's.

Run as root with no daemon up: ``make bench-memory``. The script starts its daemons itself
(the release build, on the default data directory, one after the other).
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "sdk" / "python" / "src"))

from sandfork import CheckpointType, Sandbox  # noqa: E402

# The parent: MB megabytes of random bytes (no two pages alike, so nothing merges within
# one process), answering "sum" with the data's hash: the memory-sharing test's holder.
HOLDER = ROOT / "tests" / "checkpoints" / "programs" / "memholder.py"
KSM = Path("/sys/kernel/mm/ksm")


def binary() -> Path:
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    return target / "release" / "sandfork"


class Daemon:
    """`sandfork serve` on the default data directory with the given flags."""

    def __init__(self, *flags: str):
        self.data = Path(os.environ.get("SANDFORK_DATA_DIR", "/var/lib/sandfork"))
        self.data.mkdir(parents=True, exist_ok=True)
        if subprocess.run([binary(), "ls"], capture_output=True).returncode == 0:
            raise SystemExit("a daemon is already running: stop it first (this benchmark starts its own)")
        log = open(self.data / "daemon.log", "ab")
        self.proc = subprocess.Popen([binary(), "serve", "--data-dir", str(self.data), *flags],
                                     stdout=subprocess.DEVNULL, stderr=log)
        for _ in range(300):
            if subprocess.run([binary(), "ls"], capture_output=True).returncode == 0:
                return
            time.sleep(0.2)
        raise SystemExit(f"the daemon did not start; see {self.data}/daemon.log")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=120)


def cgroup_file(sandbox_id: str, names: List[str]) -> Path:
    for name in names:
        for pattern in (f"/sys/fs/cgroup/*/sandfork/{sandbox_id}/{name}", f"/sys/fs/cgroup/sandfork/{sandbox_id}/{name}"):
            found = glob.glob(pattern)
            if found:
                return Path(found[0])
    raise RuntimeError(f"no cgroup file {names} for {sandbox_id}")


def pids_of(sandbox_id: str) -> List[int]:
    return [int(p) for p in cgroup_file(sandbox_id, ["cgroup.procs"]).read_text().split()]


def rollup(pid: int) -> Dict[str, int]:
    """Rss and Pss of a process, in bytes."""
    out = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("Rss", "Pss"):
            out[key] = int(rest.split()[0]) * 1024
    return out


def memory_of(sandbox_id: str) -> Dict[str, int]:
    """A sandbox's processes' summed Rss and Pss, and its cgroup's memory charge."""
    total = {"Rss": 0, "Pss": 0}
    for pid in pids_of(sandbox_id):
        try:
            for k, v in rollup(pid).items():
                total[k] += v
        except (FileNotFoundError, ProcessLookupError):
            pass
    total["charge"] = int(cgroup_file(sandbox_id, ["memory.current", "memory.usage_in_bytes"]).read_text())
    return total


def ksm(name: str) -> int:
    try:
        return int((KSM / name).read_text())
    except OSError:
        return 0


def ksmd_cpu_s() -> float:
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            fields = Path(stat).read_text().rsplit(")", 1)
            if fields[0].endswith("(ksmd"):
                rest = fields[1].split()
                return (int(rest[11]) + int(rest[12])) / os.sysconf("SC_CLK_TCK")
        except OSError:
            continue
    return 0.0


def available_mb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) // 1024
    return 0


def settle(timeout: float) -> float:
    """Waits for three complete passes of ksmd after the fork (a page is merged on the
    pass after the one that first saw it; the third finds what the second left); returns
    the seconds taken."""
    t = time.monotonic()
    start = ksm("full_scans")
    while time.monotonic() - t < timeout and ksm("full_scans") < start + 3:
        time.sleep(0.5)
    return round(time.monotonic() - t, 1)


def one(mb: int, forks: int, merge: bool, settle_s: float) -> dict:
    src = Sandbox.create(image="python", memory_mb=mb * 2 + 512, allow_internet_access=False)
    snap = None
    kids = []
    try:
        src.write_file("/opt/memholder.py", HOLDER.read_bytes())
        src.start_process("python3", ["/opt/memholder.py", str(mb)])
        deadline = time.monotonic() + 120
        while src.run("test", ["-e", "/tmp/mem.ready"]).exit_code != 0:
            if time.monotonic() > deadline:
                raise RuntimeError("the holder did not get ready")
            time.sleep(0.2)
        want = src.run("python3", ["/opt/memholder.py", "ask", "sum"]).stdout.strip()
        parent = memory_of(src.sandbox_id)
        snap = src.checkpoint(checkpoint_type=CheckpointType.MEMORY)
        before_mb, cpu0 = available_mb(), ksmd_cpu_s()
        t = time.monotonic()
        result = snap.fork(forks)
        result.raise_for_errors()
        kids = list(result)
        fork_s = round(time.monotonic() - t, 2)
        settled = settle(settle_s) if merge else 0.0
        cpu = round(ksmd_cpu_s() - cpu0, 2) if merge else 0.0
        took_mb = before_mb - available_mb()
        mem = [memory_of(k.sandbox_id) for k in kids]
        for i, k in enumerate(kids):
            got = k.run("python3", ["/opt/memholder.py", "ask", "sum"]).stdout.strip()
            if got != want:
                raise RuntimeError(f"fork {i}: the data changed ({got} != {want})")
        pss = sum(m["Pss"] for m in mem)
        # A checkpoint of a fork stores what the fork changed; its parent holds the rest.
        again = kids[0].checkpoint(checkpoint_type=CheckpointType.MEMORY)
        fork_snapshot_mb = round(again.size_bytes / 2**20, 1)
        again.delete()
        return {
            "parent_rss_mb": round(parent["Rss"] / 2**20, 1),
            "forks_pss_mb": round(pss / 2**20, 1),
            "pss_ratio": round(pss / (forks * parent["Rss"]), 3),
            "forks_charge_mb": round(sum(m["charge"] for m in mem) / 2**20, 1),
            "host_mb": took_mb,
            "fork_s": fork_s,
            "settle_s": settled,
            "ksmd_cpu_s": cpu,
            "snapshot_mb": round(snap.size_bytes / 2**20, 1),
            "fork_snapshot_mb": fork_snapshot_mb,
        }
    finally:
        for k in kids:
            k.terminate()
        if snap is not None:
            snap.delete()
        src.terminate()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=200)
    ap.add_argument("--forks", type=int, default=8)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--settle", type=float, default=120, help="longest wait for merging, seconds")
    a = ap.parse_args()
    results: Dict[bool, List[dict]] = {}
    for merge in (False, True):
        d = Daemon("--memory-merge", "true" if merge else "false")
        try:
            results[merge] = [one(a.mb, a.forks, merge, a.settle) for _ in range(a.runs)]
        finally:
            d.stop()
    med = {m: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for m, rs in results.items()}
    off, on = med[False], med[True]
    name = f"{a.forks} forks of a {a.mb} MB Python process"

    def line(what: str, key: str, unit: str, target: str = "") -> None:
        j = {"suite": "memory", "name": f"{what}, {name}", "value": on[key], "unit": unit,
             "baseline": off[key], "baseline_name": "same, page merging off",
             "ratio": round(on[key] / off[key], 3) if off[key] else None, "runs": a.runs}
        if target:
            j["target"] = target
        print(json.dumps(j), flush=True)

    line("sum of the forks' PSS / (forks × parent RSS)", "pss_ratio", "×", "≤ 0.3")
    line("sum of the forks' PSS", "forks_pss_mb", "MiB")
    line("forks' cgroup charge", "forks_charge_mb", "MiB")
    line("host memory the fan-out took", "host_mb", "MiB")
    line("fork fan-out", "fork_s", "s")
    print(json.dumps({"suite": "memory", "name": f"merging settled after, {name}", "value": on["settle_s"],
                      "unit": "s", "runs": a.runs}), flush=True)
    print(json.dumps({"suite": "memory", "name": f"ksmd CPU until settled, {name}", "value": on["ksmd_cpu_s"],
                      "unit": "s", "runs": a.runs}), flush=True)
    print(json.dumps({"suite": "memory", "name": f"memory snapshot size, {name}", "value": on["snapshot_mb"],
                      "unit": "MiB", "runs": a.runs}), flush=True)
    print(json.dumps({"suite": "memory", "name": f"memory snapshot of a fork (what it changed), {name}",
                      "value": on["fork_snapshot_mb"], "unit": "MiB", "baseline": on["snapshot_mb"],
                      "baseline_name": "its parent snapshot", "ratio": round(on["fork_snapshot_mb"] / on["snapshot_mb"], 3),
                      "runs": a.runs}), flush=True)


if __name__ == "__main__":
    main()
