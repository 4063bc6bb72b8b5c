"""The provider's lifecycle against a real daemon: task_init sets up and checkpoints once,
every sample is a fork that has the warm state and sees no other sample's writes or
processes; Dockerfiles build with sandfork's builder; bad input and a dying sandbox get
clear errors in inspect's terms."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Dict, List

import pytest
from inspect_ai.util import SandboxEnvironment, SandboxUnavailableError
from inspect_ai.util._sandbox.registry import registry_find_sandboxenv
from sandfork import Sandbox, Snapshot

from inspect_sandfork import (
    SandforkConfigError,
    SandforkImageBuildError,
    SandforkSandboxEnvironment,
    SandforkSandboxEnvironmentConfig,
    SandforkSetupError,
)

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("daemon", "no_leaks")]

# A value that lives only in a shell's memory: the shell draws it, then hands it to every
# reader of a FIFO (a FIFO holds no data on disk).
WARM = 'trap "" PIPE; v=$(od -An -N8 -tx1 /dev/urandom | tr -d " \\n"); mkfifo /tmp/warm; while :; do echo "$v" > /tmp/warm; done'
READ_WARM = ["head", "-n1", "/tmp/warm"]

ENV = SandforkSandboxEnvironment


async def _samples(config: object, count: int) -> List[Dict[str, SandboxEnvironment]]:
    return [await ENV.sample_init("t", config, {}) for _ in range(count)]  # type: ignore[arg-type]


async def _cleanup(config: object, samples: List[Dict[str, SandboxEnvironment]]) -> None:
    for envs in samples:
        await ENV.sample_cleanup("t", config, envs, False)  # type: ignore[arg-type]
    await ENV.task_cleanup("t", config, True)  # type: ignore[arg-type]


async def test_the_entry_point_registers_the_sandbox_type() -> None:
    assert registry_find_sandboxenv("sandfork") is SandforkSandboxEnvironment


async def test_forks_share_the_warm_state_and_nothing_else() -> None:
    config = SandforkSandboxEnvironmentConfig(image="busybox", setup=["echo ready > /tmp/setup-ran"], background=[WARM])
    await ENV.task_init("t", config)
    samples: List[Dict[str, SandboxEnvironment]] = []
    try:
        samples = await _samples(config, 2)
        a, b = samples[0]["default"], samples[1]["default"]
        ids = {e.sandbox.id for e in (a, b) if isinstance(e, SandforkSandboxEnvironment)}
        assert len(ids) == 2, "each sample gets a sandbox of its own"

        # warm: the in-memory value and the setup's file are in both forks, the same
        values = [(await e.exec(READ_WARM, timeout=10)).stdout.strip() for e in (a, b)]
        assert values[0] and values[0] == values[1], values
        assert (await a.read_file("/tmp/setup-ran")).strip() == "ready"
        on_disk = await a.exec(["find", "/tmp", "/root", "/etc", "-type", "f", "-exec", "grep", "-l", values[0], "{}", "+"])
        assert on_disk.stdout.strip() == "", f"the warm value is only in memory, yet found in {on_disk.stdout}"

        # isolated: a write and a process in one fork are not in the other
        await a.write_file("only-in-a.txt", "a")
        started = await a.exec(["sh", "-c", "sleep 300 >/dev/null 2>&1 & echo started"])
        assert started.stdout.strip() == "started"
        assert (await a.exec(["ls", "only-in-a.txt"])).success
        with pytest.raises(FileNotFoundError):
            await b.read_file("only-in-a.txt")
        assert "sleep 300" in (await a.exec(["ps"])).stdout
        assert "sleep 300" not in (await b.exec(["ps"])).stdout
    finally:
        await _cleanup(config, samples)


async def test_the_snapshot_is_made_once_and_deleted_at_task_cleanup() -> None:
    config = SandforkSandboxEnvironmentConfig(image="busybox", labels={"case": "once"})
    before = {s.snapshot_id for s in Snapshot.list()}
    await ENV.task_init("t", config)
    samples: List[Dict[str, SandboxEnvironment]] = []
    try:
        made = {s.snapshot_id for s in Snapshot.list()} - before
        assert len(made) == 1
        samples = await _samples(config, 3)
        assert {s.snapshot_id for s in Snapshot.list()} - before == made, "samples fork; they make no snapshot"
        for envs in samples:
            env = envs["default"]
            assert isinstance(env, SandforkSandboxEnvironment)
            assert env.sandbox.info().snapshot_id in made
    finally:
        await _cleanup(config, samples)
    assert not ({s.snapshot_id for s in Snapshot.list()} - before), "task_cleanup deletes the snapshot"


async def test_without_fork_every_sample_is_fresh_and_runs_setup(tmp_path: Path) -> None:
    config = SandforkSandboxEnvironmentConfig(image="busybox", fork=False, setup=["od -An -N8 -tx1 /dev/urandom > /tmp/born"])
    await ENV.task_init("t", config)
    samples: List[Dict[str, SandboxEnvironment]] = []
    try:
        samples = await _samples(config, 2)
        born = [await envs["default"].read_file("/tmp/born") for envs in samples]
        assert born[0] != born[1], "each fresh sandbox ran setup itself"
    finally:
        await _cleanup(config, samples)


async def test_a_dockerfile_is_built_with_sandforks_builder(tmp_path: Path) -> None:
    (tmp_path / "data.txt").write_text("from the context\n")
    (tmp_path / "Dockerfile").write_text("FROM busybox\nWORKDIR /srv/task\nCOPY data.txt /srv/task/data.txt\nENV TASK_MODE=graded\n")
    config = str(tmp_path / "Dockerfile")
    await ENV.task_init("t", config)
    samples: List[Dict[str, SandboxEnvironment]] = []
    try:
        samples = await _samples(config, 1)
        env = samples[0]["default"]
        assert (await env.read_file("data.txt")) == "from the context\n", "relative paths are from the image's WORKDIR"
        r = await env.exec(["sh", "-c", "pwd; echo $TASK_MODE"])
        assert r.stdout.split() == ["/srv/task", "graded"]
    finally:
        await _cleanup(config, samples)


async def test_a_failing_dockerfile_step_is_named(tmp_path: Path) -> None:
    (tmp_path / "Dockerfile").write_text("FROM busybox\nRUN echo fine\nRUN echo broken-step && exit 3\n")
    with pytest.raises(SandforkImageBuildError) as e:
        await ENV.task_init("t", str(tmp_path / "Dockerfile"))
    assert "line 3" in str(e.value) and "exit 3" in str(e.value), str(e.value)


async def test_a_failing_setup_command_is_named() -> None:
    config = SandforkSandboxEnvironmentConfig(image="busybox", setup=["echo about to fail; exit 4"])
    with pytest.raises(SandforkSetupError) as e:
        await ENV.task_init("t", config)
    assert "exit 4" in str(e.value) and "exited with 4" in str(e.value) and "about to fail" in str(e.value)


async def test_bad_configurations_are_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(SandforkConfigError, match="does not exist"):
        await ENV.task_init("t", str(tmp_path / "Dockerfile"))
    (tmp_path / "sandfork.yaml").write_text("image: busybox\nforks: 3\n")
    with pytest.raises(SandforkConfigError, match="forks"):
        await ENV.task_init("t", str(tmp_path / "sandfork.yaml"))
    with pytest.raises(SandforkConfigError, match="no-such-image"):
        await ENV.task_init("t", SandforkSandboxEnvironmentConfig(image="no-such-image"))


async def test_a_config_file_is_read(tmp_path: Path) -> None:
    (tmp_path / "sandfork.yaml").write_text("image: busybox\nworking_dir: /work\nenv:\n  STAGE: yaml\n")
    config = str(tmp_path / "sandfork.yaml")
    await ENV.task_init("t", config)
    samples: List[Dict[str, SandboxEnvironment]] = []
    try:
        samples = await _samples(config, 1)
        r = await samples[0]["default"].exec(["sh", "-c", "pwd; echo $STAGE"])
        assert r.stdout.split() == ["/work", "yaml"]
    finally:
        await _cleanup(config, samples)


async def test_a_sandbox_that_dies_mid_sample_is_unavailable_not_a_hang() -> None:
    config = SandforkSandboxEnvironmentConfig(image="busybox", fork=False)
    await ENV.task_init("t", config)
    samples: List[Dict[str, SandboxEnvironment]] = []
    try:
        samples = await _samples(config, 1)
        env = samples[0]["default"]
        assert isinstance(env, SandforkSandboxEnvironment)
        started = time.monotonic()

        killer = threading.Timer(1.0, Sandbox.connect(env.sandbox.id).terminate)
        killer.start()
        try:
            with pytest.raises(SandboxUnavailableError):
                await env.exec(["sleep", "120"])
        finally:
            killer.join()
        assert time.monotonic() - started < 60
        with pytest.raises(SandboxUnavailableError):
            await env.exec(["true"])
        with pytest.raises(SandboxUnavailableError):
            await env.read_file("/etc/hostname")
    finally:
        await _cleanup(config, samples)


async def test_connection_names_the_sandbox() -> None:
    config = SandforkSandboxEnvironmentConfig(image="busybox")
    await ENV.task_init("t", config)
    samples: List[Dict[str, SandboxEnvironment]] = []
    try:
        samples = await _samples(config, 1)
        env = samples[0]["default"]
        assert isinstance(env, SandforkSandboxEnvironment)
        conn = await env.connection()
        assert conn.type == "sandfork" and conn.command == f"sandfork shell {env.sandbox.id}"
    finally:
        await _cleanup(config, samples)


async def test_cli_cleanup_removes_what_the_provider_left() -> None:
    config = SandforkSandboxEnvironmentConfig(image="busybox", labels={"case": "cli"})
    await ENV.task_init("t", config)
    await _samples(config, 2)
    # as after a crash: no sample_cleanup, no task_cleanup
    await ENV.cli_cleanup(None)
    assert not [s for s in Sandbox.list() if "inspect-sandfork" in (s.labels or {})]
    assert not [s for s in Snapshot.list() if "inspect-sandfork" in (getattr(s, "labels", None) or {})]
    await ENV.task_cleanup("t", config, True)  # the provider's own state goes too
