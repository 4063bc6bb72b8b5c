#!/usr/bin/env python3
"""ML worker: a Python process holding a large pandas DataFrame and numba-compiled code,
memory-checkpointed once and forked N times. Each fork's first call runs at once: no data
loading, no compiling.

The worker builds its DataFrame (two float columns, `--rows` of them: 500 MB by default),
compiles a scoring function with numba, and answers thresholds on a loopback port. The
first call in each fork is timed next to what loading and compiling took in the source.

Run with the daemon up: python3 examples/ml_worker.py [--workers N] [--rows R]
(the image, python + numba + pandas, is built through the daemon's image route on first
use: a few minutes, once).
"""
import argparse
import contextlib
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from sandfork import CheckpointType, Client, Sandbox

WORKER = r"""
import json, socket, sys, time
import numpy as np, pandas as pd
from numba import njit
started = time.time()
rows = int(sys.argv[1])
df = pd.DataFrame({"x": np.random.default_rng(0).random(rows), "y": np.random.default_rng(1).random(rows)})
loaded = time.time() - started

@njit
def score(x, y, threshold):
    n = 0
    for i in range(x.shape[0]):
        if x[i] * y[i] > threshold:
            n += 1
    return n

started = time.time()
score(df.x.values[:10], df.y.values[:10], 0.5)
compiled = time.time() - started
server = socket.create_server(("127.0.0.1", 7002))
print(json.dumps({"ready": True, "load_s": loaded, "compile_s": compiled,
                  "mib": float(df.memory_usage().sum()) / 2**20}), flush=True)
while True:
    conn, _ = server.accept()
    with conn:
        threshold = float(conn.recv(64).decode())
        started = time.time()
        n = score(df.x.values, df.y.values, threshold)
        conn.sendall(json.dumps({"n": int(n), "call_s": time.time() - started,
                                 "signatures": len(score.signatures)}).encode())
"""
ASK = ("import socket,sys; s=socket.create_connection(('127.0.0.1',7002)); "
       "s.sendall(sys.argv[1].encode()); print(s.recv(4096).decode())")


def ensure_image(name):
    """Builds the image (python + numba + pandas) through the daemon when it is missing."""
    client = Client()
    if any(i.get("name") == name for i in (client.request_json("GET", "/v1/images") or {}).get("images", [])):
        return
    print(f"building the {name} image (first use; once) …", flush=True)
    last = {}
    body = {"name": name, "builder": "python", "pip": ["numba", "pandas"]}
    with client.open("POST", "/v1/images", json_body=body, unbounded=True) as stream:
        for last in stream.iter_json_lines():
            pass
    if last.get("type") != "done":
        raise RuntimeError(f"the {name} image build failed: {last.get('message', last)}")


def wait_ready(proc, timeout=600.0):
    """The worker's ready line (JSON), once it printed it."""
    deadline, seen, stream = time.monotonic() + timeout, "", proc.output(follow=True)
    with contextlib.closing(stream):
        for event in stream:
            seen += event.data
            if '"ready"' in seen or time.monotonic() > deadline:
                break
    line = next((ln for ln in seen.splitlines() if '"ready"' in ln), None)
    if line is None:
        raise RuntimeError(f"the worker did not get ready: {seen[-800:]!r}")
    return json.loads(line)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--image", default="ml-worker", help="an image with python3, numba and pandas (built when missing)")
    ap.add_argument("-n", "--workers", type=int, default=8)
    ap.add_argument("--rows", type=int, default=32_000_000, help="DataFrame rows (16 bytes each)")
    args = ap.parse_args()
    ensure_image(args.image)
    t, snap, forks = time.monotonic(), None, []
    memory_mb = max(1024, args.rows * 16 * 3 // 2**20 + 512)
    base = Sandbox.create(image=args.image, memory_mb=memory_mb, allow_internet_access=False)
    try:
        ready = wait_ready(base.start_process("python3", ["-c", WORKER, str(args.rows)]))
        print(f"source: {ready['mib']:.0f} MiB DataFrame loaded in {ready['load_s']:.2f}s, "
              f"scoring function compiled in {ready['compile_s']:.2f}s")
        t_setup = time.monotonic()
        snap = base.checkpoint(checkpoint_type=CheckpointType.MEMORY)
        base.terminate()
        t_snap = time.monotonic()
        forks = snap.fork(args.workers)
        forks.raise_for_errors()
        t_fork = time.monotonic()
        thresholds = [round(0.1 + 0.8 * i / max(1, args.workers - 1), 3) for i in range(len(forks))]
        with ThreadPoolExecutor(len(forks)) as pool:
            answers = list(pool.map(lambda p: p[0].run("python3", ["-c", ASK, str(p[1])], timeout=120), zip(forks, thresholds)))
        for i, (th, r) in enumerate(zip(thresholds, answers)):
            if r.exit_code != 0:
                raise RuntimeError(f"fork {i} failed: {r.stderr[-500:]}")
            a = json.loads(r.stdout)
            if a["signatures"] != 1:
                raise RuntimeError(f"fork {i} compiled again: {a}")
            print(f"fork {i}: threshold {th}: {a['n']} rows over it; first call {a['call_s'] * 1000:.0f} ms, no recompiling")
        print(f"timings: setup {t_setup - t:.2f}s, checkpoint {t_snap - t_setup:.2f}s "
              f"({snap.size_bytes / 2**20:.0f} MiB), fork {len(forks)} {t_fork - t_snap:.2f}s")
    finally:
        for sb in [base, *forks]:
            with contextlib.suppress(Exception):
                sb.terminate()
        if snap is not None:
            snap.delete()
    print("ml_worker ok")


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # noqa: BLE001 - report any failure and exit non-zero
        print(f"ml_worker failed: {e}", file=sys.stderr)
        sys.exit(1)
