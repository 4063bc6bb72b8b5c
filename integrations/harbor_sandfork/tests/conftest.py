"""Fixtures of the Harbor environment's tests: a real sandfork daemon for the session and
the real Harbor (0.25.0, Python >= 3.12) run in the Debian 13 tool root that
``harbor_root.py`` makes (cached under /var/cache/sandfork/harbor). The tests themselves
run on the host's Python; Harbor runs in the root, in a network namespace with loopback
alone, and reaches the daemon through its Unix socket. Every test must leave no sandbox
or snapshot behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Optional

import pytest

HERE = Path(__file__).resolve().parent
PACKAGE = HERE.parent
REPO = HERE.parents[2]
sys.path[:0] = [str(REPO / "integrations" / "_testing"), str(REPO / "sdk" / "python" / "tests"), str(PACKAGE)]

import harbor_root  # noqa: E402
import sandfork_testing  # noqa: E402

# No test talks to anything but this machine's loopback (and the daemon's Unix socket).
sandfork_testing.loopback_only()

# in_root/ holds the tests that run inside the root, with Harbor importable (test_in_root.py);
# tasks/ and tasks-failing/ are Harbor tasks, whose tests run in sandboxes.
collect_ignore = ["in_root", "tasks", "tasks-failing"]

TASKS = HERE / "tasks"
FAILING_TASKS = HERE / "tasks-failing"
BASE_IMAGES = HERE / "base-images.json"
ENVIRONMENT = "harbor_sandfork:SandforkEnvironment"
PYTHON_OCI = Path(os.environ.get("SANDFORK_CACHE") or "/var/cache/sandfork") / "images" / "python-oci"
HARBOR_TIMEOUT = 900


@pytest.fixture(scope="session")
def daemon() -> Iterator[object]:
    yield from sandfork_testing.daemon_session()


@pytest.fixture(scope="session")
def python_image(daemon: object) -> str:
    """The built-in python image the test tasks' base images map to: imported from the
    cached OCI layout when there is one (as tests/docs does), else built."""
    from sandfork import Image

    if (PYTHON_OCI / "index.json").is_file():
        Image.import_(PYTHON_OCI, "python")
        return "python"
    return sandfork_testing.ensure_image("python")


@pytest.fixture(scope="session")
def root() -> Path:
    """The tool root with Harbor installed (made on first use: debootstrap and pip)."""
    started = time.monotonic()
    took = harbor_root.ensure()
    if took:
        print(f"\nmade the Harbor tool root in {time.monotonic() - started:.0f}s ({', '.join(f'{k} {v:.0f}s' for k, v in took.items())})")
    return harbor_root.ROOT


@pytest.fixture
def no_leaks(daemon: object) -> Iterator[None]:
    yield from sandfork_testing.no_leaks()


@dataclass
class Trial:
    task: str
    name: str
    reward: Optional[float]
    exception: Optional[Dict[str, object]]


@dataclass
class Job:
    returncode: int
    output: str
    trials: List[Trial]

    def rewards(self) -> Dict[str, List[Optional[float]]]:
        out: Dict[str, List[Optional[float]]] = {}
        for t in self.trials:
            out.setdefault(t.task, []).append(t.reward)
        return {k: sorted(v, key=str) for k, v in sorted(out.items())}

    def exceptions(self) -> List[str]:
        return [f"{t.name}: {t.exception.get('exception_type')}: {t.exception.get('exception_message')}" for t in self.trials if t.exception]


def mounts_under(path: Path) -> List[str]:
    """Mount points of this mount namespace at or under ``path``."""
    prefix = str(path)
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4]
        if point == prefix or point.startswith(prefix + "/"):
            found.append(point)
    return found


def harbor_run(jobs_dir: Path, dataset: Path, *args: str, job_name: str = "job") -> Job:
    """``harbor run`` with the oracle agent on ``dataset`` and this environment, in the
    root; returns the trials' results."""
    argv = [
        "harbor", "run", "-p", str(dataset), "-a", "oracle", "--env", ENVIRONMENT,
        "--ek", f"base_images={BASE_IMAGES}", "-o", str(jobs_dir), "--job-name", job_name, "-y", *args,
    ]  # fmt: skip
    jobs_dir.mkdir(parents=True, exist_ok=True)
    done = harbor_root.run(argv, binds=[jobs_dir, dataset], offline=True, capture_output=True, text=True, timeout=HARBOR_TIMEOUT)
    output = done.stdout + done.stderr
    assert not mounts_under(harbor_root.ROOT), f"mounts left under the root: {mounts_under(harbor_root.ROOT)}"
    trials = []
    for path in sorted((jobs_dir / job_name).glob("*/result.json")):
        doc = json.loads(path.read_text())
        rewards = (doc.get("verifier_result") or {}).get("rewards") or {}
        trials.append(Trial(doc["task_name"], doc["trial_name"], rewards.get("reward"), doc.get("exception_info")))
    return Job(done.returncode, output, trials)


def sandboxes_of(job: Job) -> List[Dict[str, str]]:
    """The labels of the sandboxes (live or terminated) this environment made for the
    trials of ``job`` (Harbor names a trial's environment session ``<trial>__env``)."""
    from sandfork import Sandbox

    sessions = {t.name + "__env" for t in job.trials}
    out = []
    for info in [*Sandbox.list(), *Sandbox.list(state="terminated")]:
        labels = info.labels or {}
        if "harbor-sandfork" in labels and labels.get("harbor-session") in sessions:
            out.append(dict(labels))
    return out


def in_root(argv: List[str], **kwargs: object) -> "subprocess.CompletedProcess[str]":
    return harbor_root.run(argv, offline=True, capture_output=True, text=True, timeout=HARBOR_TIMEOUT, **kwargs)
