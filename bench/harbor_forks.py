#!/usr/bin/env python3
"""Harbor on sandfork: the wall time of a task set with ``--ek fork=true`` against a fresh
sandbox per trial, in the same run.

The task set is the Harbor suite's (integrations/harbor_sandfork/tests/tasks: four tasks,
Dockerfiles built by sandfork's builder, base images mapped to the built-in ``python``),
run with Harbor's oracle agent, ``-k TRIALS`` trials per task and ``-n CONCURRENT`` at
once, in the Debian 13 tool root Harbor needs (integrations/harbor_sandfork/harbor_root.py),
in a network namespace with loopback alone. A warm-up run of each mode first (it builds
the images), then ROUNDS rounds, each running both modes (the order alternating).

- fork: the first trial of each task starts a sandbox and checkpoints it with its memory;
  the other trials restore that checkpoint;
- fresh: every trial creates a sandbox from the task's image.

Printed: JSON lines for bench/report.py (medians over the rounds).

    python3 bench/harbor_forks.py --trials 5 --rounds 5 | python3 bench/report.py "Harbor: forks vs fresh" "python3 bench/harbor_forks.py --trials 5 --rounds 5"

Runs as root with the daemon built; starts its own daemon (the release build when there is
one) on a data directory of its own; makes the tool root when it is missing (network).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Dict, List

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "integrations" / "harbor_sandfork"
sys.path[:0] = [str(REPO / "sdk" / "python" / "src"), str(REPO / "sdk" / "python" / "tests"), str(PACKAGE)]

import harbor_root  # noqa: E402
from _daemon import start_daemon, tear_down, url_in_env, wait_healthy  # noqa: E402

TASKS = PACKAGE / "tests" / "tasks"
BASE_IMAGES = PACKAGE / "tests" / "base-images.json"
PYTHON_OCI = Path(os.environ.get("SANDFORK_CACHE") or "/var/cache/sandfork") / "images" / "python-oci"


def binary() -> Path:
    os.environ.setdefault("CARGO_TARGET_DIR", "/var/cache/sandfork/ci-target")
    for candidate in (
        os.environ.get("SANDFORK_BIN"),
        os.path.join(os.environ.get("CARGO_TARGET_DIR", str(REPO / "target")), "release", "sandfork"),
        os.path.join(os.environ.get("CARGO_TARGET_DIR", str(REPO / "target")), "debug", "sandfork"),
    ):
        if candidate and os.access(candidate, os.X_OK):
            return Path(candidate)
    sys.exit("the sandfork daemon is not built (cargo build -p sandfork with CARGO_TARGET_DIR, or set SANDFORK_BIN)")


def python_image() -> None:
    from sandfork import Client, Image

    if (PYTHON_OCI / "index.json").is_file():
        Image.import_(PYTHON_OCI, "python")
        return
    with Client().open("POST", "/v1/images/python/ensure", unbounded=True) as stream:
        for _ in stream.iter_json_lines():
            pass


def seconds(start: str, end: str) -> float:
    return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()


def run_job(jobs: Path, name: str, fork: bool, trials: int, concurrent: int) -> Dict[str, Any]:
    """One ``harbor run``; its wall time, Harbor's own job time and each trial's setup."""
    argv = [
        "harbor", "run", "-p", str(TASKS), "-a", "oracle", "--env", "harbor_sandfork:SandforkEnvironment",
        "--ek", f"base_images={BASE_IMAGES}", "--ek", f"fork={'true' if fork else 'false'}",
        "-k", str(trials), "-n", str(concurrent), "-o", str(jobs), "--job-name", name, "-y", "-q",
    ]  # fmt: skip
    started = time.monotonic()
    done = harbor_root.run(argv, binds=[jobs], offline=True, capture_output=True, text=True, timeout=3600)
    wall = time.monotonic() - started
    if done.returncode != 0:
        sys.exit(f"harbor run failed ({done.returncode}):\n{(done.stdout + done.stderr)[-4000:]}")
    job = json.loads((jobs / name / "result.json").read_text())
    setups, rewards = [], []
    for path in (jobs / name).glob("*/result.json"):
        trial = json.loads(path.read_text())
        if trial.get("exception_info"):
            sys.exit(f"trial {trial['trial_name']} failed: {trial['exception_info']}")
        rewards.append((trial.get("verifier_result") or {}).get("rewards", {}).get("reward"))
        setup = trial["environment_setup"]
        setups.append(seconds(setup["started_at"], setup["finished_at"]))
    if rewards != [1.0] * len(rewards) or len(rewards) != trials * len(list(TASKS.glob("*/task.toml"))):
        sys.exit(f"{name}: not every trial passed: {rewards}")
    return {"wall": wall, "job": seconds(job["started_at"], job["finished_at"]), "setups": setups}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=5, help="trials per task (-k)")
    parser.add_argument("--concurrent", type=int, default=2, help="trials at once (-n)")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    took = harbor_root.ensure()
    if took:
        print(f"made the tool root: {took}", file=sys.stderr)
    root = Path(tempfile.mkdtemp(prefix="sfharbor-"))
    daemon = start_daemon(binary(), root=root)
    results: Dict[bool, List[Dict[str, Any]]] = {True: [], False: []}
    try:
        wait_healthy(daemon)
        with url_in_env(daemon):
            python_image()
            jobs = root / "jobs"
            jobs.mkdir()
            for fork in (False, True):
                run_job(jobs, f"warmup-{fork}", fork, 1, args.concurrent)
            for r in range(args.rounds):
                for fork in ((True, False) if r % 2 else (False, True)):
                    res = run_job(jobs, f"r{r}-{'fork' if fork else 'fresh'}", fork, args.trials, args.concurrent)
                    results[fork].append(res)
                    print(f"round {r}: {'fork ' if fork else 'fresh'} {res['wall']:.2f}s (Harbor's job {res['job']:.2f}s)", file=sys.stderr)
    finally:
        problems = tear_down(daemon)
        if problems:
            print("the daemon left behind:\n" + "\n".join(problems), file=sys.stderr)

    n_tasks = len(list(TASKS.glob("*/task.toml")))
    what = f"{n_tasks} tasks × {args.trials} trials, {args.concurrent} at once, oracle agent, {args.rounds} rounds"
    rows = [
        ("`harbor run` wall time of the task set", "wall", 1.0, "s"),
        ("Harbor's job time (started → finished in result.json)", "job", 1.0, "s"),
    ]
    for label, key, scale, unit in rows:
        fork = statistics.median(r[key] for r in results[True]) * scale
        fresh = statistics.median(r[key] for r in results[False]) * scale
        print(json.dumps({"suite": "harbor", "name": f"{label}, forks, {what}", "value": round(fork, 2), "unit": unit,
                          "baseline": round(fresh, 2), "baseline_name": "fresh sandboxes", "ratio": round(fork / fresh, 3)}))  # fmt: skip
    fork_setups = [s * 1000 for r in results[True] for s in r["setups"]]
    fresh_setups = [s * 1000 for r in results[False] for s in r["setups"]]
    fork_ms, fresh_ms = statistics.median(fork_setups), statistics.median(fresh_setups)
    print(json.dumps({"suite": "harbor", "name": f"a trial's environment setup (start(): the first of a task starts and checkpoints, the rest restore), {what}",
                      "value": round(fork_ms, 1), "unit": "ms", "baseline": round(fresh_ms, 1), "baseline_name": "a fresh sandbox from the task's image",
                      "ratio": round(fork_ms / fresh_ms, 3)}))  # fmt: skip


if __name__ == "__main__":
    main()
