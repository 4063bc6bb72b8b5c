"""Harbor's own oracle agent, end to end, on the committed test tasks (tests/tasks): each
task's Dockerfile built by sandfork's builder (base images mapped by base-images.json),
solution/solve.sh run by the oracle, tests/test.sh graded by Harbor's verifier. Fresh
sandboxes per trial, then forks of one memory checkpoint per task; a wrong solution
gets reward 0; what sandfork cannot serve fails the trial naming it."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import pytest
from conftest import FAILING_TASKS, TASKS, harbor_run, sandboxes_of

pytestmark = pytest.mark.usefixtures("daemon", "python_image", "root", "no_leaks")

TASK_NAMES = sorted(p.name for p in TASKS.iterdir() if (p / "task.toml").is_file())


def test_the_oracle_passes_every_task_in_fresh_sandboxes(tmp_path: Path) -> None:
    job = harbor_run(tmp_path, TASKS, "-n", "2")
    assert job.returncode == 0, job.output[-3000:]
    assert not job.exceptions(), job.exceptions()
    assert job.rewards() == {name: [1.0] for name in TASK_NAMES}, job.output[-3000:]
    made = Counter((labels["harbor-task"], labels["harbor-sandfork"]) for labels in sandboxes_of(job))
    assert made == Counter({(name, "trial"): 1 for name in TASK_NAMES}), made


def test_with_fork_every_further_trial_is_a_fork_of_the_first(tmp_path: Path) -> None:
    """-k 3 -n 3: three trials of each task at once; one builds, starts and checkpoints
    under the task's lock, the two others restore its checkpoint; all pass, and the
    snapshots are gone when Harbor exits (the no_leaks fixture checks)."""
    job = harbor_run(tmp_path, TASKS, "-n", "3", "-k", "3", "--ek", "fork=true")
    assert job.returncode == 0, job.output[-3000:]
    assert not job.exceptions(), job.exceptions()
    assert job.rewards() == {name: [1.0, 1.0, 1.0] for name in TASK_NAMES}, job.output[-3000:]
    made = Counter((labels["harbor-task"], labels["harbor-sandfork"]) for labels in sandboxes_of(job))
    expected = Counter({(name, "trial"): 1 for name in TASK_NAMES}) + Counter({(name, "fork"): 2 for name in TASK_NAMES})
    assert made == expected, made


@pytest.mark.parametrize("fork", ["false", "true"])
def test_a_wrong_solution_gets_reward_zero(tmp_path: Path, fork: str) -> None:
    job = harbor_run(tmp_path, FAILING_TASKS, "-k", "2", "--ek", f"fork={fork}")
    assert not job.exceptions(), job.exceptions()
    assert job.rewards() == {"wrong-answer": [0.0, 0.0]}, job.output[-3000:]


def test_a_compose_task_is_refused_naming_the_missing_feature(tmp_path: Path) -> None:
    """Harbor makes the environment before the trial starts: the refusal ends the job."""
    dataset = tmp_path / "tasks"
    shutil.copytree(TASKS / "hello-file", dataset / "compose-task")
    (dataset / "compose-task" / "environment" / "docker-compose.yaml").write_text("services:\n  main:\n    build: .\n")
    job = harbor_run(tmp_path / "jobs", dataset)
    assert job.returncode != 0 and not any(t.reward is not None for t in job.trials), job.output[-3000:]
    text = " ".join(job.output.replace("│", " ").split())
    assert "SandforkUnsupportedError: Docker Compose task environments" in text, job.output[-3000:]
    assert "are not supported by sandfork" in text, job.output[-3000:]


def test_a_failing_build_step_fails_the_trial_with_the_builders_message(tmp_path: Path) -> None:
    dataset = tmp_path / "tasks"
    shutil.copytree(TASKS / "hello-file", dataset / "broken-build")
    (dataset / "broken-build" / "environment" / "Dockerfile").write_text("FROM ubuntu:24.04\nRUN echo about to fail && exit 3\n")
    job = harbor_run(tmp_path / "jobs", dataset)
    assert len(job.trials) == 1, job.output[-3000:]
    [trial] = job.trials
    assert trial.exception is not None, job.output[-3000:]
    assert trial.exception["exception_type"] == "SandboxBuildFailedError"
    message = str(trial.exception["exception_message"])
    assert "exit 3" in message or "about to fail" in message, message
