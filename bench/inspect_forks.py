#!/usr/bin/env python3
"""inspect-ai on sandfork: time per sample with forks of the task's memory checkpoint
against a fresh sandbox per sample, in the same run.

The task: N samples, ``mockllm/model`` answering each with a Python program (no model API
is called), and a scorer that runs the program in the sample's sandbox and asks the warm
process for its token. The sandbox's setup starts that warm process: python3 importing
numpy and holding 40 MB of computed data (``background``, waited for by ``ready``).

- forks: task_init sets up once and checkpoints memory; every sample is a restore of it;
- fresh: every sample creates a sandbox from the image and runs the setup itself.

Samples run one at a time (``max_samples=1``) so that each sample's time is its own.
Printed: JSON lines for bench/report.py (medians; p99 where it says).

    python3 bench/inspect_forks.py --samples 20 | python3 bench/report.py "inspect-ai: forks vs fresh" "python3 bench/inspect_forks.py --samples 20"

Runs as root with the daemon built; starts its own daemon (the release build when there
is one) on a data directory of its own, and installs inspect-ai into the integrations venv
(integrations/run_tests.py) when it is missing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

REPO = Path(__file__).resolve().parents[1]


def in_venv() -> None:
    """Re-runs this script with the integrations venv's python when inspect-ai is missing."""
    try:
        import inspect_ai  # noqa: F401
        import inspect_sandfork  # noqa: F401
    except ImportError:
        sys.path.insert(0, str(REPO / "integrations"))
        from run_tests import ensure_venv

        py = str(ensure_venv())
        os.execv(py, [py, __file__, *sys.argv[1:]])


in_venv()
sys.path[:0] = [str(REPO / "sdk" / "python" / "tests"), str(REPO / "integrations" / "_testing")]

import sandfork_testing  # noqa: E402
from _daemon import start_daemon, tear_down, url_in_env, wait_healthy  # noqa: E402
from inspect_ai import Task, eval as inspect_eval  # noqa: E402
from inspect_ai.dataset import Sample  # noqa: E402
from inspect_ai.model import ModelOutput, ModelUsage, get_model  # noqa: E402
from inspect_ai.scorer import CORRECT, INCORRECT, Score, Target, accuracy, scorer  # noqa: E402
from inspect_ai.solver import TaskState, generate  # noqa: E402
from inspect_ai.util import sandbox  # noqa: E402

from inspect_sandfork import SandforkSandboxEnvironment, SandforkSandboxEnvironmentConfig  # noqa: E402

WARM = (
    "python3 -c \"import numpy as np, secrets, socket\n"
    "data = np.cumsum(np.random.default_rng(0).random(5_000_000))\n"
    "token = (secrets.token_hex(8) + ' ' + repr(float(data[-1]))).encode()\n"
    "s = socket.socket(socket.AF_UNIX); s.bind('/tmp/warm.sock'); s.listen(8)\n"
    "while True:\n"
    "    c, _ = s.accept(); c.sendall(token); c.close()\""
)
READY = "test -S /tmp/warm.sock"
ASK = "import socket; s = socket.socket(socket.AF_UNIX); s.connect('/tmp/warm.sock'); print(s.recv(128).decode())"


def binary() -> Path:
    for candidate in (
        os.environ.get("SANDFORK_BIN"),
        os.path.join(os.environ.get("CARGO_TARGET_DIR", str(REPO / "target")), "release", "sandfork"),
        "/var/cache/sandfork/ci-target/release/sandfork",
        os.path.join(os.environ.get("CARGO_TARGET_DIR", str(REPO / "target")), "debug", "sandfork"),
    ):
        if candidate and os.access(candidate, os.X_OK):
            return Path(candidate)
    sys.exit("no sandfork binary: build it (make build-release) or set SANDFORK_BIN")


def mock_model(messages: List[Any], *_: Any) -> ModelOutput:
    n = int(messages[-1].text.split()[-1])
    out = ModelOutput.from_content("mockllm/model", f"print(sum(i * i for i in range(1, {n} + 1)))\n")
    out.usage = ModelUsage(input_tokens=10, output_tokens=10, total_tokens=20)  # no tokenizer download
    return out


@scorer(metrics=[accuracy()])
def runs_the_program():  # type: ignore[no-untyped-def]
    async def score(state: TaskState, target: Target) -> Score:
        sb = sandbox()
        await sb.write_file("answer.py", state.output.completion)
        run = await sb.exec(["python3", "answer.py"], timeout=60)
        warm = await sb.exec(["python3", "-c", ASK], timeout=60)
        ok = run.success and run.stdout.strip() == target.text and warm.success
        return Score(value=CORRECT if ok else INCORRECT, answer=run.stdout.strip(), metadata={"warm": warm.stdout.strip()})

    return score


SAMPLE_INIT: List[float] = []


def time_sample_init() -> None:
    """Records how long each sample_init takes (the sandbox a sample starts in)."""
    original = SandforkSandboxEnvironment.sample_init.__func__  # type: ignore[attr-defined]

    async def timed(cls, task_name, config, metadata):  # type: ignore[no-untyped-def]
        t = time.perf_counter()
        try:
            return await original(cls, task_name, config, metadata)
        finally:
            SAMPLE_INIT.append((time.perf_counter() - t) * 1000)

    SandforkSandboxEnvironment.sample_init = classmethod(timed)  # type: ignore[method-assign]


def run_eval(samples: int, fork: bool, log_dir: str) -> Dict[str, Any]:
    SAMPLE_INIT.clear()
    config = SandforkSandboxEnvironmentConfig(image="python", memory_mb=1024, background=[WARM], ready=READY, fork=fork)
    task = Task(
        dataset=[Sample(id=f"s{i}", input=f"sum of squares up to {i + 3}", target=str(sum(k * k for k in range(1, i + 4)))) for i in range(samples)],
        solver=generate(),
        scorer=runs_the_program(),
        sandbox=("sandfork", config),
    )
    started = time.perf_counter()
    log = inspect_eval(task, model=get_model("mockllm/model", custom_outputs=mock_model), log_dir=log_dir, display="none", max_samples=1)[0]
    wall = (time.perf_counter() - started) * 1000
    assert log.status == "success", log.error
    assert log.samples is not None
    scores = [next(iter(s.scores.values())) for s in log.samples if s.scores]
    assert len(scores) == samples and all(s.value == CORRECT for s in scores), [s.value for s in scores]
    tokens = {(s.metadata or {}).get("warm", "").split()[0] for s in scores}
    assert len(tokens) == (1 if fork else samples), f"warm tokens: {tokens}"
    return {
        "sample_init": list(SAMPLE_INIT),
        "sample_total": [s.total_time * 1000 for s in log.samples if s.total_time is not None],
        "wall": wall,
    }


def p99(values: List[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(0.99 * (len(ordered) - 1))))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=20)
    args = parser.parse_args()
    sandfork_testing.loopback_only()
    time_sample_init()
    root = Path(tempfile.mkdtemp(prefix="sfbench-"))
    daemon = start_daemon(binary(), root=root)
    try:
        wait_healthy(daemon)
        with url_in_env(daemon):
            sandfork_testing.ensure_image("python")
            with tempfile.TemporaryDirectory() as logs:
                run_eval(2, True, logs)  # warm-up: caches, the image's first use
                forks = run_eval(args.samples, True, logs)
                fresh = run_eval(args.samples, False, logs)
    finally:
        problems = tear_down(daemon)
        if problems:
            print("\n".join(problems), file=sys.stderr)
    n = args.samples
    what = f"{n} samples, python holding 40 MB + numpy"
    rows = [
        ("sandbox ready for a sample (sample_init): a fork of the task's memory checkpoint", forks["sample_init"], fresh["sample_init"], "a fresh sandbox that runs the setup"),
        ("the sample once its sandbox is ready (inspect's total_time: generate, then the scorer's 3 calls into the sandbox), in a fork", forks["sample_total"], fresh["sample_total"], "in a fresh sandbox"),
    ]
    for name, values, base, base_name in rows:
        value, baseline = statistics.median(values), statistics.median(base)
        print(json.dumps({"suite": "inspect", "name": f"{name}, {what}", "value": round(value, 1), "unit": "ms",
                          "p99": round(p99(values), 1), "baseline": round(baseline, 1), "baseline_name": base_name,
                          "ratio": round(value / baseline, 3)}))  # fmt: skip
    per_sample_fork, per_sample_fresh = forks["wall"] / n, fresh["wall"] / n
    print(json.dumps({"suite": "inspect", "name": f"eval wall time per sample (task_init and cleanup included), forks, {what}", "value": round(per_sample_fork, 1),
                      "unit": "ms", "baseline": round(per_sample_fresh, 1), "baseline_name": "fresh sandboxes",
                      "ratio": round(per_sample_fork / per_sample_fresh, 3)}))  # fmt: skip


if __name__ == "__main__":
    main()
