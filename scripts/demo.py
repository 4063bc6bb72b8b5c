#!/usr/bin/env python3
"""The main job, end to end: set up once, take a memory checkpoint, fork workers.

A base sandbox does a real project's setup: it installs Python packages (numpy, scipy,
pandas, scikit-learn) while it prepares a 1.5 M-row dataset, then trains a model in a
long-running worker that keeps data and model in memory. A MEMORY checkpoint captures the
warm worker; N forks each ask it a different question (a decision threshold to evaluate).
The same job is then done the naive way — N fresh sandboxes, each doing the whole setup —
and the two are compared, step by step. The first run's one-time work (building the python
image, caching the wheels on the host) is timed on its own.

    scripts/demo [--workers N] [--image python]

Exits non-zero on any failure. Sandboxes have no internet access: the wheels are
downloaded once, on the host, from the machine's configured package index, and uploaded.
"""
import argparse
import hashlib
import json
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sandfork import CheckpointType, Sandbox

JOB = Path(__file__).resolve().parent / "demo_job"
CACHE = Path("/var/cache/sandfork/demo-wheels")
# Room for the packages (~400 MB installed) and the dataset; disks are thin.
DISK_MB = 4096
THRESHOLDS = [round(0.15 + 0.05 * i, 2) for i in range(16)]


class Steps:
    """Times steps, shows the running one on a live line, and keeps the results."""

    def __init__(self):
        self.rows = []
        self.live = sys.stdout.isatty()

    def run(self, label, fn, group="compare", note=lambda result: ""):
        done = threading.Event()
        started = time.monotonic()
        ticker = threading.Thread(target=self._tick, args=(label, started, done), daemon=True)
        if self.live:
            ticker.start()
        else:
            print(f"→ {label} …", flush=True)
        try:
            result = fn()
        finally:
            done.set()
            if self.live:
                ticker.join()
        elapsed = time.monotonic() - started
        extra = note(result)
        self.rows.append((group, label, elapsed, extra))
        print(f"\r\033[K  ✓ {label}: {elapsed:.1f}s{'  ' + extra if extra else ''}" if self.live
              else f"  {label}: {elapsed:.1f}s{'  ' + extra if extra else ''}", flush=True)
        return result

    @staticmethod
    def _tick(label, started, done):
        spinner = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
        i = 0
        while not done.wait(0.1):
            print(f"\r\033[K  {spinner[i % len(spinner)]} {label} … {time.monotonic() - started:.0f}s",
                  end="", flush=True)
            i += 1

    def total(self, group):
        return sum(dt for g, _, dt, _ in self.rows if g == group)


def wheel_cache():
    """The demo's wheels, downloaded on the host once into a cache keyed by the
    requirements; returns the directory."""
    requirements = (JOB / "requirements.txt").read_bytes()
    cache = CACHE / hashlib.sha256(requirements).hexdigest()[:16]
    if (cache / ".complete").exists():
        return cache, False
    cache.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:",
         "--python-version", "3.11", "--platform", "manylinux2014_x86_64",
         "--dest", str(cache), "-r", str(JOB / "requirements.txt")],
        check=True,
    )
    (cache / ".complete").touch()
    return cache, True


def ensure_image(image):
    """The image, built on first use (progress shown); True when it had to be built."""
    built = []

    live = sys.stdout.isatty()

    def progress(line):
        built.append(line)
        print(f"\r\033[K    {line[:100]}" if live else f"    {line}", end="" if live else "\n", flush=True)

    with Sandbox.create(image=image, memory_mb=256, on_progress=progress):
        pass
    if built and live:
        print()
    return bool(built)


def upload_job(sb, wheels):
    """Puts the job's scripts and wheels into /job of a sandbox (as a download would)."""
    for f in sorted(JOB.iterdir()):
        if f.is_file():
            sb.upload_file(str(f), f"/job/{f.name}")
    for w in sorted(wheels.glob("*.whl")):
        sb.upload_file(str(w), f"/job/wheels/{w.name}")


def check(result, what):
    if result.exit_code != 0:
        raise RuntimeError(f"{what} failed ({result.exit_code}): {result.stderr[-2000:]}")
    return result


def fork_pattern(steps, image, wheels, n):
    base = steps.run("create the base sandbox", lambda: Sandbox.create(image=image, cpus=2, memory_mb=3072, disk_mb=DISK_MB, allow_internet_access=False))
    try:
        steps.run("upload the job and its wheels", lambda: upload_job(base, wheels))
        steps.run("setup once: install packages ∥ prepare data, train (live worker)",
                  lambda: start_worker(base))
        snap = steps.run("memory checkpoint of the warm worker",
                         lambda: base.checkpoint(checkpoint_type=CheckpointType.MEMORY),
                         note=lambda s: f"{s.size_bytes / 2**20:.0f} MiB")
    finally:
        base.terminate()
    try:
        forks = steps.run(f"fork {n} warm workers", lambda: snap.fork(n))
        with forks:
            forks.raise_for_errors()
            answers = steps.run(f"{n} workers answer one question each", lambda: ask_all(forks, n))
    finally:
        snap.delete()
    return answers


def start_worker(sb):
    """Starts the setup and its worker in the background; returns once it serves."""
    sb.start_process("sh", ["/job/setup.sh", "--serve"], name="worker")
    while sb.run("test", ["-e", "/job/ready"]).exit_code != 0:
        if sb.get_process("worker").status != "running":
            log = sb.get_output("worker").lines
            raise RuntimeError("the setup failed: " + " | ".join(log[-15:]))
        time.sleep(0.5)


def ask_all(forks, n):
    with ThreadPoolExecutor(n) as pool:
        results = list(pool.map(
            lambda i: check(forks[i].run("python3", ["/job/ask.py", str(THRESHOLDS[i % len(THRESHOLDS)])]),
                            "a question"),
            range(n)))
    return [json.loads(r.stdout) for r in results]


def naive_one(image, wheels, i, finished):
    with Sandbox.create(image=image, cpus=2, memory_mb=3072, disk_mb=DISK_MB, allow_internet_access=False) as sb:
        upload_job(sb, wheels)
        r = check(sb.run("sh", ["/job/setup.sh", "--ask", str(THRESHOLDS[i % len(THRESHOLDS)])], timeout=3600),
                  "a naive worker's setup")
        finished.append(i)
        return json.loads(r.stdout.splitlines()[-1])


def naive_pattern(steps, image, wheels, n):
    finished = []
    label = f"naive: {n} fresh sandboxes, each doing the whole setup"
    with ThreadPoolExecutor(n) as pool:
        return steps.run(label, lambda: list(pool.map(lambda i: naive_one(image, wheels, i, finished), range(n))),
                         group="naive")


def summary(steps, n):
    fork_total, naive_total = steps.total("compare"), steps.total("naive")
    print("\nsummary")
    width = max(len(label) for _, label, _, _ in steps.rows)
    for title, group in (("one-time work (first run only)", "once"), ("fork pattern", "compare"),
                         ("naive pattern", "naive")):
        rows = [r for r in steps.rows if r[0] == group]
        if not rows:
            continue
        print(f"  {title}")
        for _, label, dt, extra in rows:
            print(f"    {label:<{width}}  {dt:7.1f}s  {extra}")
    print(f"\n  {n} workers: fork pattern {fork_total:.1f}s vs naive {naive_total:.1f}s — "
          f"{naive_total / fork_total:.1f}× faster end to end, same answers")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", "--workers", type=int, default=8)
    ap.add_argument("--image", default="python")
    args = ap.parse_args()
    n, steps = args.workers, Steps()
    steps.run(f"the {args.image} image (built on first use)", lambda: ensure_image(args.image), group="once",
              note=lambda built: "built" if built else "already there")
    wheels, _ = steps.run("wheel cache on the host (downloaded on first use)", wheel_cache, group="once",
                          note=lambda r: "downloaded" if r[1] else "already there")
    forked = fork_pattern(steps, args.image, wheels, n)
    for a in forked:
        print(f"    threshold {a['threshold']:.2f}: precision {a['precision']:.3f}  recall {a['recall']:.3f}  f1 {a['f1']:.3f}")
    naive = naive_pattern(steps, args.image, wheels, n)
    if forked != naive:
        raise RuntimeError(f"fork and naive answers differ: {forked} vs {naive}")
    summary(steps, n)


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # noqa: BLE001 - the demo reports any failure and exits non-zero
        print(f"\ndemo failed: {e}", file=sys.stderr)
        sys.exit(1)
