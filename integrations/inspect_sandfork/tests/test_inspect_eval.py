"""A real inspect-ai eval on sandfork: a task whose scorer runs the model's program in the
sample's sandbox, with inspect's ``mockllm/model`` (no model API is called). The task's
setup starts a process holding a token only in memory; every sample's fork must have it,
and no sample may see another's files."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, List

import pytest
from inspect_ai import Task, eval as inspect_eval
from inspect_ai.dataset import Sample
from inspect_ai.model import ModelOutput, ModelUsage, get_model
from inspect_ai.scorer import CORRECT, INCORRECT, Score, Target, accuracy, scorer
from inspect_ai.solver import TaskState, generate
from inspect_ai.util import sandbox

from inspect_sandfork import SandforkSandboxEnvironmentConfig

pytestmark = pytest.mark.usefixtures("daemon", "no_leaks")

# Serves a token drawn at setup, kept only in this process's memory.
WARM_SERVER = (
    "python3 -c \"import secrets, socket\n"
    "token = secrets.token_hex(8).encode()\n"
    "s = socket.socket(socket.AF_UNIX); s.bind('/tmp/warm.sock'); s.listen(8)\n"
    "while True:\n"
    "    c, _ = s.accept(); c.sendall(token); c.close()\""
)
WARM_CLIENT = "import socket; s = socket.socket(socket.AF_UNIX); s.connect('/tmp/warm.sock'); print(s.recv(64).decode())"
READY = "test -S /tmp/warm.sock"


def sum_of_squares(n: int) -> int:
    return sum(i * i for i in range(1, n + 1))


def mock_model(messages: List[Any], *_: Any) -> ModelOutput:
    """Answers with a Python program; for n = 7 it is off by one (a wrong answer the scorer must catch)."""
    n = int(re.findall(r"\d+", messages[-1].text)[-1])
    upper = n if n != 7 else n - 1
    output = ModelOutput.from_content("mockllm/model", f"print(sum(i * i for i in range(1, {upper} + 1)))\n")
    # Usage given, so that mockllm does not count tokens (its tokenizer would be fetched
    # from the network).
    output.usage = ModelUsage(input_tokens=10, output_tokens=10, total_tokens=20)
    return output


@scorer(metrics=[accuracy()])
def runs_the_program():  # type: ignore[no-untyped-def]
    async def score(state: TaskState, target: Target) -> Score:
        sb = sandbox()
        await sb.write_file(f"/tmp/mark-{state.sample_id}", "mine")
        await sb.write_file("answer.py", state.output.completion)
        run = await sb.exec(["python3", "answer.py"], timeout=60)
        warm = await sb.exec(["python3", "-c", WARM_CLIENT], timeout=30)
        marks = await sb.exec(["sh", "-c", "ls /tmp/mark-*"])
        answer = run.stdout.strip()
        return Score(
            value=CORRECT if run.success and answer == target.text else INCORRECT,
            answer=answer,
            metadata={"warm": warm.stdout.strip(), "marks": marks.stdout.split()},
        )

    return score


def squares_task(config: SandforkSandboxEnvironmentConfig) -> Task:
    ns = [3, 5, 7, 10]
    return Task(
        dataset=[Sample(id=f"n{n}", input=f"Write a Python program that prints the sum of the squares of 1..{n}", target=str(sum_of_squares(n))) for n in ns],
        solver=generate(),
        scorer=runs_the_program(),
        sandbox=("sandfork", config),
    )


@pytest.mark.parametrize("fork", [True, False], ids=["forks", "fresh"])
def test_an_eval_scores_code_run_in_forked_sandboxes(fork: bool, python_image: str, tmp_path: Path) -> None:
    config = SandforkSandboxEnvironmentConfig(image=python_image, memory_mb=1024, background=[WARM_SERVER], ready=READY, fork=fork)
    model = get_model("mockllm/model", custom_outputs=mock_model)
    task = squares_task(config)
    logs = inspect_eval(task, model=model, log_dir=str(tmp_path), display="none", max_samples=4)
    assert len(logs) == 1
    log = logs[0]
    assert log.status == "success", log.error
    assert log.samples is not None and len(log.samples) == 4
    results = {}
    for s in log.samples:
        assert s.scores is not None, f"sample {s.id} has no score: {s.error}"
        results[s.id] = next(iter(s.scores.values()))
    assert {k: v.value for k, v in results.items()} == {"n3": CORRECT, "n5": CORRECT, "n7": INCORRECT, "n10": CORRECT}
    assert results["n7"].answer == str(sum_of_squares(6))
    for sid, score in results.items():
        assert score.metadata is not None
        assert score.metadata["marks"] == [f"/tmp/mark-{sid}"], f"{sid} sees other samples' files: {score.metadata['marks']}"
    warm = {score.metadata["warm"] for score in results.values() if score.metadata}
    if fork:
        assert len(warm) == 1 and len(next(iter(warm))) == 16, f"every fork has the one token drawn at setup: {warm}"
    else:
        assert len(warm) == 4, f"every fresh sandbox drew its own token: {warm}"
