#!/usr/bin/env python3
"""Experiment racing: candidates raced in forks of one warm snapshot; the winner is the next baseline.

A trainer process holds a dataset and a small linear model in memory. Each iteration forks
the current baseline snapshot once per candidate (a learning rate, given through the fork's
environment), trains every fork a few steps from the same warm state, checkpoints the fork
with the best validation loss (memory included: the trained weights live on) and makes that
snapshot the next baseline. Prints the lineage of snapshots and scores, then deletes them.

Run with the daemon up: python3 examples/race.py [--workers N] [--iterations K] [--image python]
"""
import argparse
import contextlib
import json
import math
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from sandfork import CheckpointType, Sandbox

TRAINER = r"""
import json, socket
import numpy as np
rng = np.random.default_rng(0)
X = rng.standard_normal((20_000, 16))
y = X @ rng.standard_normal(16) + 0.1 * rng.standard_normal(20_000)
Xt, yt, Xv, yv = X[:16_000], y[:16_000], X[16_000:], y[16_000:]
w = np.zeros(16)                                   # the model: trained in place, kept in memory

def train(lr, steps):
    global w
    for _ in range(steps):
        w = w - lr * 2 * Xt.T @ (Xt @ w - yt) / len(yt)
    loss = float(np.mean((Xv @ w - yv) ** 2))
    return loss if np.isfinite(loss) else float("inf")

srv = socket.create_server(("127.0.0.1", 7000))
print("ready", flush=True)
while True:
    conn, _ = srv.accept()
    req = json.loads(conn.recv(4096).decode())
    conn.sendall(json.dumps({"loss": train(req["lr"], req["steps"])}).encode())
    conn.close()
"""

# One candidate "training script": trains the warm model with this fork's $LR.
CANDIDATE = r"""
import json, os, socket
s = socket.create_connection(("127.0.0.1", 7000))
s.sendall(json.dumps({"lr": float(os.environ["LR"]), "steps": int(os.environ["STEPS"])}).encode())
print(s.recv(4096).decode())
"""

LEARNING_RATES = [0.1, 0.01, 1.5, 0.05, 0.02, 0.003]


def wait_ready(proc, timeout=120.0):
    """Blocks until the process printed "ready"."""
    deadline, seen, stream = time.monotonic() + timeout, "", proc.output(follow=True)
    with contextlib.closing(stream):
        for event in stream:
            seen += event.data
            if "ready" in seen or time.monotonic() > deadline:
                break
    if "ready" not in seen:
        raise RuntimeError(f"the trainer did not get ready: {seen[-1000:]!r}")


def race(baseline, rates, steps):
    """Forks the baseline once per rate, trains each, checkpoints the best; returns (snapshot, lr, loss, all losses)."""
    forks = baseline.fork(len(rates), env={"STEPS": str(steps)}, per_child=[{"env": {"LR": str(lr)}} for lr in rates])
    with forks:
        forks.raise_for_errors()
        with ThreadPoolExecutor(len(rates)) as pool:
            results = list(pool.map(lambda sb: sb.run("python3", ["-c", CANDIDATE]), forks))
        losses = []
        for lr, r in zip(rates, results):
            if r.exit_code != 0:
                raise RuntimeError(f"candidate lr={lr} failed: {r.stderr}")
            losses.append(json.loads(r.stdout)["loss"])
        best = min(range(len(rates)), key=lambda i: losses[i])
        winner = forks[best].checkpoint(checkpoint_type=CheckpointType.MEMORY)
    return winner, rates[best], losses[best], losses


def fmt(loss):
    return "diverged" if math.isinf(loss) else f"{loss:.5f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--image", default="python", help="an image with python3 and numpy")
    ap.add_argument("-n", "--workers", type=int, default=4, help="candidates raced per iteration")
    ap.add_argument("-k", "--iterations", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5, help="training steps per candidate")
    args = ap.parse_args()
    rates = (LEARNING_RATES * args.workers)[: args.workers]
    snapshots = []
    try:
        with Sandbox.create(image=args.image, memory_mb=512) as base:
            wait_ready(base.start_process("python3", ["-c", TRAINER]))
            snapshots.append(base.checkpoint(checkpoint_type=CheckpointType.MEMORY))
        lineage = [(snapshots[0].id, None, math.inf)]
        for i in range(1, args.iterations + 1):
            t = time.monotonic()
            winner, lr, loss, losses = race(snapshots[-1], rates, args.steps)
            snapshots.append(winner)
            lineage.append((winner.id, lr, loss))
            print(f"iteration {i}: " + ", ".join(f"lr={r} {fmt(x)}" for r, x in zip(rates, losses))
                  + f" -> winner lr={lr} ({time.monotonic() - t:.2f}s)")
            if not loss < lineage[-2][2]:
                raise AssertionError(f"iteration {i} did not improve on its baseline ({fmt(loss)})")
        print("lineage:")
        for depth, (snap_id, lr, loss) in enumerate(lineage):
            what = "baseline (untrained)" if lr is None else f"winner lr={lr}, validation loss {fmt(loss)}"
            print(f"  {'  ' * depth}{snap_id}: {what}")
    finally:
        for snap in reversed(snapshots):
            snap.delete()
    print(f"deleted {len(snapshots)} snapshots")
    print("race ok")


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # noqa: BLE001 - report any failure and exit non-zero
        print(f"race failed: {e}", file=sys.stderr)
        sys.exit(1)
