#!/usr/bin/env python3
"""Reproducible RL rollouts: one warm snapshot with the environment loaded, one fork per seed.

A base sandbox starts a long-running environment server (a CartPole written in numpy and a
fixed stochastic policy, kept in memory) and is checkpointed with its memory. Each rollout
runs in its own fork of that snapshot, its seed given through the fork's environment. The
whole batch runs twice: the same seed must give the same trajectory in both runs, and
different seeds must give different ones.

Run with the daemon up: python3 examples/rl_rollouts.py [--seeds N] [--image python]
"""
import argparse
import contextlib
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from sandfork import CheckpointType, Sandbox

ENV_SERVER = r"""
import json, socket
import numpy as np

class CartPole:
    # The classic cart-pole (Barto, Sutton & Anderson 1983), Euler-integrated like gymnasium's.
    gravity, m_cart, m_pole, half_len, force, dt = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02
    x_limit, theta_limit = 2.4, 12 * 2 * np.pi / 360

    def reset(self, rng):
        self.state = rng.uniform(-0.05, 0.05, size=4)
        return self.state.copy()

    def step(self, action):
        x, x_dot, theta, theta_dot = self.state
        f = self.force if action == 1 else -self.force
        cos, sin, total = np.cos(theta), np.sin(theta), self.m_cart + self.m_pole
        tmp = (f + self.m_pole * self.half_len * theta_dot**2 * sin) / total
        theta_acc = (self.gravity * sin - cos * tmp) / (self.half_len * (4 / 3 - self.m_pole * cos**2 / total))
        x_acc = tmp - self.m_pole * self.half_len * theta_acc * cos / total
        self.state = np.array([x + self.dt * x_dot, x_dot + self.dt * x_acc,
                               theta + self.dt * theta_dot, theta_dot + self.dt * theta_acc])
        done = abs(self.state[0]) > self.x_limit or abs(self.state[2]) > self.theta_limit
        return self.state.copy(), 1.0, bool(done)

env = CartPole()
weights = np.array([[0.0, 0.0], [-0.5, 0.5], [-2.0, 2.0], [-1.0, 1.0]])   # a fixed softmax policy

def rollout(seed, max_steps):
    rng = np.random.default_rng(seed)
    obs, total, actions = env.reset(rng), 0.0, []
    for _ in range(max_steps):
        logits = obs @ weights
        p = np.exp(logits - logits.max())
        action = int(rng.choice(2, p=p / p.sum()))
        obs, reward, done = env.step(action)
        total += reward
        actions.append(action)
        if done:
            break
    return {"seed": seed, "return": total, "actions": "".join(map(str, actions)), "final": obs.tolist()}

srv = socket.create_server(("127.0.0.1", 7000))
print("ready", flush=True)
while True:
    conn, _ = srv.accept()
    req = json.loads(conn.recv(4096).decode())
    conn.sendall(json.dumps(rollout(req["seed"], req["max_steps"])).encode())
    conn.close()
"""

# Runs in a fork: asks the warm environment server for the rollout of this fork's $SEED.
ROLLOUT = r"""
import json, os, socket
s = socket.create_connection(("127.0.0.1", 7000))
s.sendall(json.dumps({"seed": int(os.environ["SEED"]), "max_steps": int(os.environ["MAX_STEPS"])}).encode())
chunks = []
while True:
    b = s.recv(65536)
    if not b:
        break
    chunks.append(b)
print(b"".join(chunks).decode())
"""


def wait_ready(proc, timeout=120.0):
    """Blocks until the process printed "ready"."""
    deadline, seen, stream = time.monotonic() + timeout, "", proc.output(follow=True)
    with contextlib.closing(stream):
        for event in stream:
            seen += event.data
            if "ready" in seen or time.monotonic() > deadline:
                break
    if "ready" not in seen:
        raise RuntimeError(f"the environment server did not get ready: {seen[-1000:]!r}")


def warm_snapshot(image):
    """A memory snapshot of a sandbox whose environment server is loaded and listening."""
    with Sandbox.create(image=image, memory_mb=512) as base:
        wait_ready(base.start_process("python3", ["-c", ENV_SERVER]))
        return base.checkpoint(checkpoint_type=CheckpointType.MEMORY)


def run_batch(snap, seeds, max_steps):
    """One fork per seed (the seed is in the fork's environment); returns {seed: trajectory}."""
    forks = snap.fork(len(seeds), env={"MAX_STEPS": str(max_steps)},
                      per_child=[{"env": {"SEED": str(s)}} for s in seeds])
    with forks:
        forks.raise_for_errors()
        with ThreadPoolExecutor(len(seeds)) as pool:
            results = list(pool.map(lambda sb: sb.run("python3", ["-c", ROLLOUT]), forks))
    trajectories = {}
    for seed, r in zip(seeds, results):
        if r.exit_code != 0:
            raise RuntimeError(f"rollout of seed {seed} failed: {r.stderr}")
        trajectories[seed] = json.loads(r.stdout)
    return trajectories


def check(first, second):
    """Same seed, same trajectory; different seeds, different trajectories."""
    for seed, traj in first.items():
        if second[seed] != traj:
            raise AssertionError(f"seed {seed} gave different trajectories in the two runs")
        if traj["seed"] != seed:
            raise AssertionError(f"the fork for seed {seed} ran seed {traj['seed']}")
    distinct = {json.dumps(t, sort_keys=True) for t in first.values()}
    if len(distinct) != len(first):
        raise AssertionError("different seeds gave the same trajectory")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--image", default="python", help="an image with python3 and numpy")
    ap.add_argument("-n", "--seeds", type=int, default=6, help="rollouts (forks) per run")
    ap.add_argument("--max-steps", type=int, default=500)
    args = ap.parse_args()
    seeds = list(range(1, args.seeds + 1))
    t0 = time.monotonic()
    snap = warm_snapshot(args.image)
    print(f"warm snapshot {snap.id} ({snap.size_bytes / 2**20:.0f} MiB) in {time.monotonic() - t0:.2f}s")
    try:
        runs = []
        for label in ("first", "second"):
            t = time.monotonic()
            runs.append(run_batch(snap, seeds, args.max_steps))
            print(f"{label} run: {len(seeds)} rollouts in {time.monotonic() - t:.2f}s")
    finally:
        snap.delete()
    check(*runs)
    for seed, traj in runs[0].items():
        print(f"seed {seed}: return {traj['return']:.0f} (actions {traj['actions'][:24]}…)")
    print(f"reproducible: {len(seeds)} seeds gave identical trajectories in both runs, all distinct")
    print("rl_rollouts ok")


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # noqa: BLE001 - report any failure and exit non-zero
        print(f"rl_rollouts failed: {e}", file=sys.stderr)
        sys.exit(1)
