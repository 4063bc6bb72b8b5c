"""The examples under ``examples/``, run as users run them, against the test daemon.

Each example runs as a subprocess (``SANDFORK_URL`` pointing at the test daemon,
``PYTHONPATH`` at this SDK) with small sizes; the test checks its exit code, the key lines
of its output, and that it left no sandbox or snapshot behind. The examples that need numpy
use the ``python`` image, built once per session through the image route (the Debian base
is cached under ``${SANDFORK_CACHE:-/var/cache/sandfork}``: about 100 s on a cold cache).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Sequence, Set, Tuple

import pytest

from _daemon import REPO, Daemon

EXAMPLES = REPO / "examples"
SDK_SRC = REPO / "sdk" / "python" / "src"
RUN_TIMEOUT = 300.0
BUILD_TIMEOUT = 900.0


def live_objects() -> Tuple[Set[str], Set[str]]:
    """Ids of the sandboxes still live and of the snapshots that exist."""
    from sandfork import Sandbox, Snapshot

    live = {s.id for s in Sandbox.list() if s.status not in ("terminated", "failed")}
    return live, {s.id for s in Snapshot.list()}


def run_example(daemon: Daemon, name: str, args: Sequence[str]) -> subprocess.CompletedProcess:
    """Runs ``examples/<name>.py`` like a user would and checks it cleaned up after itself."""
    env = dict(os.environ, SANDFORK_URL=daemon.url, PYTHONPATH=os.pathsep.join([str(SDK_SRC), os.environ.get("PYTHONPATH", "")]))
    before = live_objects()
    started = time.monotonic()
    out = subprocess.run([sys.executable, str(EXAMPLES / f"{name}.py"), *args], capture_output=True, text=True, env=env, timeout=RUN_TIMEOUT)
    print(f"\n{name} {' '.join(args)}: exit {out.returncode} in {time.monotonic() - started:.1f}s\n{out.stdout}{out.stderr}")
    after = live_objects()
    assert after[0] <= before[0], f"{name} left sandboxes running: {sorted(after[0] - before[0])}"
    assert after[1] <= before[1], f"{name} left snapshots behind: {sorted(after[1] - before[1])}"
    return out


def assert_ok(out: subprocess.CompletedProcess, name: str, lines: List[str]) -> None:
    assert out.returncode == 0, f"{name} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}\n"
    assert f"{name} ok" in out.stdout
    for line in lines:
        assert line in out.stdout, f"{name}: {line!r} not in its output:\n{out.stdout}"


@pytest.fixture(scope="session")
def python_image(daemon: Daemon, checkpoint_routes: None) -> str:
    """The ``python`` image (Debian + python3 + numpy), built in the test daemon once."""
    from sandfork import Client

    client = Client(url=daemon.url)
    images = (client.request_json("GET", "/v1/images") or {}).get("images", [])
    if any(i.get("name") == "python" for i in images):
        return "python"
    started = time.monotonic()
    last = {}
    with client.open("POST", "/v1/images", json_body={"name": "python", "builder": "python"}, unbounded=True) as stream:
        for event in stream.iter_json_lines():
            last = event
            assert time.monotonic() - started < BUILD_TIMEOUT, f"the python image build took over {BUILD_TIMEOUT:g}s"
    assert last.get("type") == "done", f"the python image build failed: {last}"
    print(f"\nbuilt the python image in {time.monotonic() - started:.1f}s")
    return "python"


def test_fork_pattern(daemon: Daemon, python_image: str) -> None:
    out = run_example(daemon, "fork_pattern", ["--image", python_image, "--workers", "3", "--size", "100000"])
    assert_ok(out, "fork_pattern", ["result sum(data) = ", "result max(data) = 10006", "timings: setup "])


def test_rl_rollouts(daemon: Daemon, python_image: str) -> None:
    out = run_example(daemon, "rl_rollouts", ["--image", python_image, "--seeds", "3", "--max-steps", "200"])
    assert_ok(out, "rl_rollouts", ["seed 1: return ", "seed 3: return ", "identical trajectories in both runs, all distinct"])


def test_race(daemon: Daemon, python_image: str) -> None:
    out = run_example(daemon, "race", ["--image", python_image, "--workers", "3", "--iterations", "2"])
    assert_ok(out, "race", ["iteration 1: lr=", "iteration 2: lr=", "lineage:", "deleted 3 snapshots"])


def test_browser_pool(daemon: Daemon, checkpoint_routes: None) -> None:
    """The built-in ``browser`` image (Chromium + Playwright) is built on first use by the
    example's create, like any built-in image."""
    out = run_example(daemon, "browser_pool", ["--workers", "3"])
    assert_ok(out, "browser_pool", ["ready: logged in as alice", "fork 2: logged in as alice", "/orders/2",
                                    "logged out in fork 0; fork 1 is still logged in", "file locks: "])


def test_ml_worker(daemon: Daemon, checkpoint_routes: None) -> None:
    """Builds its image (python + numba + pandas) through the image route on first use."""
    out = run_example(daemon, "ml_worker", ["--workers", "3", "--rows", "1000000"])
    assert_ok(out, "ml_worker", ["scoring function compiled in", "fork 2: threshold 0.9: ", "no recompiling"])


def test_suspend_resume(daemon: Daemon, checkpoint_routes: None) -> None:
    out = run_example(daemon, "suspend_resume", ["--image", "busybox", "--cycles", "2", "--pause", "0.2"])
    assert_ok(out, "suspend_resume", ["cycle 1: resumed", "cycle 2: resumed", "same process", "terminated example-suspend-"])


@pytest.mark.parametrize("name", ["fork_pattern", "rl_rollouts", "race"])
def test_examples_fail_cleanly(daemon: Daemon, checkpoint_routes: None, name: str) -> None:
    """On busybox (no python3) the setup fails midway: non-zero exit, the reason on stderr, nothing left behind."""
    out = run_example(daemon, name, ["--image", "busybox"])
    assert out.returncode != 0
    assert f"{name} failed: " in out.stderr


def test_race_cleans_up_when_it_fails_midway(daemon: Daemon, python_image: str) -> None:
    """With no training steps the second iteration cannot improve: the race fails after it
    created snapshots and forks, and must still delete and terminate all of them."""
    out = run_example(daemon, "race", ["--image", python_image, "--workers", "2", "--iterations", "2", "--steps", "0"])
    assert out.returncode != 0
    assert "race failed: iteration 2 did not improve on its baseline" in out.stderr


def test_examples_are_listed_in_the_readme() -> None:
    readme = (REPO / "README.md").read_text()
    for path in sorted(EXAMPLES.glob("*.py")):
        assert f"examples/{path.name}" in readme, f"README.md does not list examples/{path.name}"


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.py")), ids=lambda p: p.stem)
def test_examples_document_their_flags(path: Path) -> None:
    out = subprocess.run([sys.executable, str(path), "--help"], capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(SDK_SRC)), timeout=60)
    assert out.returncode == 0 and "--image" in out.stdout, out.stderr
