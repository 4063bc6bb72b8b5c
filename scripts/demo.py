#!/usr/bin/env python3
"""The main job, end to end: set up once, take a memory checkpoint, fork workers.

A base sandbox loads a ~100 MB dataset into a long-running Python worker (numpy), a MEMORY
checkpoint captures it, and N forks each run a different candidate script against the
warm in-memory data. The same job is then done the naive way (N fresh sandboxes, each
doing the setup itself) and the two are compared. Exits non-zero on any failure.
"""
import argparse
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from sandfork import CheckpointType, Sandbox

SETUP = r"""
import json, os, socket, sys, time
import numpy as np
rng = np.random.default_rng(0)
data = np.sort(rng.standard_normal(13_000_000))   # ~100 MB of float64, preprocessed
for _ in range(int(os.environ.get("EXTRA_ROUNDS", "0"))):   # heavier setups, for benchmarks
    np.sort(rng.standard_normal(13_000_000))
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", 7000))
srv.listen(64)
print("ready", flush=True)
while True:
    conn, _ = srv.accept()
    expr = conn.recv(65536).decode()
    conn.sendall(json.dumps(float(eval(expr, {"np": np, "data": data}))).encode())
    conn.close()
"""

ASK = r"""
import socket, sys
s = socket.create_connection(("127.0.0.1", 7000))
s.sendall(sys.argv[1].encode())
print(s.recv(65536).decode())
"""

NAIVE = r"""
import os, sys
import numpy as np
rng = np.random.default_rng(0)
data = np.sort(rng.standard_normal(13_000_000))
for _ in range(int(os.environ.get("EXTRA_ROUNDS", "0"))):
    np.sort(rng.standard_normal(13_000_000))
print(float(eval(sys.argv[1], {"np": np, "data": data})))
"""

CANDIDATES = [
    "np.mean(data)", "np.std(data)", "np.percentile(data, 99)", "np.median(data)",
    "(data > 2).mean()", "np.abs(data).max()", "data[::1000].sum()", "np.mean(data ** 2)",
    "np.percentile(data, 1)", "(np.abs(data) < 1).mean()", "data[-10:].mean()", "data.min()",
]

steps = []


def step(label):
    """Times a block and records it for the summary."""
    class Timer:
        def __enter__(self):
            self.t = time.monotonic()
            print(f"→ {label} …", flush=True)
            return self

        def __exit__(self, *exc):
            dt = time.monotonic() - self.t
            if exc[0] is None:
                steps.append((label, dt))
                print(f"  {label}: {dt:.2f}s", flush=True)
    return Timer()


def wait_ready(proc, timeout=120):
    deadline = time.monotonic() + timeout
    seen = ""
    stream = proc.output(follow=True)
    try:
        for event in stream:
            seen += event.data
            if "ready" in seen:
                return
            if time.monotonic() > deadline:
                break
    finally:
        stream.close()
    raise RuntimeError(f"the worker did not get ready: {proc.status()!r}: {seen[-2000:]}")


def candidates(n):
    """The first n candidate expressions, cycling when n exceeds the list."""
    return [CANDIDATES[i % len(CANDIDATES)] for i in range(n)]


def fork_pattern(image, n, extra_rounds=0):
    with step("create base sandbox"):
        base = Sandbox.create(image=image, cpus=2, memory_mb=1024)
    try:
        with step("shared setup once (numpy + 100 MB dataset in a live worker)"):
            worker = base.start_process(
                "python3", ["-c", SETUP], env={"EXTRA_ROUNDS": str(extra_rounds)})
            wait_ready(worker)
        with step("memory checkpoint"):
            snap = base.checkpoint(checkpoint_type=CheckpointType.MEMORY)
        print(f"  snapshot {snap.snapshot_id}: {snap.size_bytes / 2**20:.0f} MiB")
    finally:
        base.terminate()
    try:
        with step(f"fork {n} warm workers"):
            forks = snap.fork(n)
        # Every child that started is terminated, also when some of its siblings failed.
        with forks:
            forks.raise_for_errors()
            with step(f"run {n} candidates against the warm data"):
                with ThreadPoolExecutor(n) as pool:
                    results = list(pool.map(
                        lambda wc: wc[0].run("python3", ["-c", ASK, wc[1]]), zip(forks, candidates(n))))
    finally:
        snap.delete()
    for expr, r in zip(candidates(n), results):
        if r.exit_code != 0:
            raise RuntimeError(f"candidate {expr} failed: {r.stderr}")
        print(f"  {expr:28} = {r.stdout.strip()}")
    return [r.stdout.strip() for r in results]


def naive_one(image, expr, extra_rounds=0):
    with Sandbox.create(image=image, cpus=2, memory_mb=1024) as sb:
        r = sb.run("python3", ["-c", NAIVE, expr], env={"EXTRA_ROUNDS": str(extra_rounds)})
        if r.exit_code != 0:
            raise RuntimeError(f"naive candidate {expr} failed: {r.stderr}")
        return r.stdout.strip()


def naive_pattern(image, n, extra_rounds=0):
    with step(f"naive: {n} fresh sandboxes, each doing the setup"):
        with ThreadPoolExecutor(n) as pool:
            return list(pool.map(lambda e: naive_one(image, e, extra_rounds), candidates(n)))


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--image", default="python")
    ap.add_argument("-n", "--workers", type=int, default=8)
    args = ap.parse_args()
    n = args.workers
    t0 = time.monotonic()
    forked = fork_pattern(args.image, n)
    fork_total = time.monotonic() - t0
    t1 = time.monotonic()
    naive = naive_pattern(args.image, n)
    naive_total = time.monotonic() - t1
    if [round(float(a), 6) for a in forked] != [round(float(b), 6) for b in naive]:
        raise RuntimeError(f"fork and naive results differ: {forked} vs {naive}")
    print("\nsummary")
    for label, dt in steps:
        print(f"  {dt:7.2f}s  {label}")
    print(f"  fork pattern {fork_total:.1f}s vs naive {naive_total:.1f}s: "
          f"{naive_total / fork_total:.1f}× faster end to end (same results)")


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # noqa: BLE001 - the demo reports any failure and exits non-zero
        print(f"demo failed: {e}", file=sys.stderr)
        sys.exit(1)
