"""The environment's calls one by one, with the real Harbor classes, against the suite's
daemon (run inside the tool root by ../test_in_root.py: Harbor needs Python >= 3.12).
Every sandbox and snapshot made is removed by the host side's leak check."""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path
from typing import Any, Awaitable, Iterator, TypeVar

import pytest
from harbor.environments.base import ServiceOperationsUnsupportedError
from harbor.models.task.config import EnvironmentConfig, NetworkMode, NetworkPolicy
from harbor.models.trial.config import ResourceMode
from harbor.models.trial.paths import TrialPaths
from sandfork import Sandbox

from harbor_sandfork import SandforkEnvironment, SandforkExecTimeoutError, SandforkUnsupportedError, delete_snapshots
from harbor_sandfork._environment import INLINE_LIMIT

T = TypeVar("T")


def run(coro: Awaitable[T]) -> T:
    return asyncio.run(coro)  # type: ignore[arg-type]


@pytest.fixture
def env_dir(tmp_path: Path) -> Path:
    d = tmp_path / "environment"
    d.mkdir()
    (d / "Dockerfile").write_text("FROM python\nENV FROM_IMAGE=yes\nWORKDIR /work\n")
    return d


def make(env_dir: Path, tmp_path: Path, **kwargs: Any) -> SandforkEnvironment:
    config = kwargs.pop("config", None) or EnvironmentConfig()
    trial = tmp_path / "trial"
    trial.mkdir(exist_ok=True)
    # what Harbor's Trial passes: the log directories, made in the sandbox at start
    kwargs.setdefault("auto_mounts", [{"type": "bind", "source": str(trial / d), "target": f"/logs/{d}"} for d in ("agent", "verifier", "artifacts")])
    return SandforkEnvironment(env_dir, "api-test", f"api-test__{os.urandom(3).hex()}__env", TrialPaths(trial), config, **kwargs)


@pytest.fixture
def env(env_dir: Path, tmp_path: Path) -> Iterator[SandforkEnvironment]:
    e = make(env_dir, tmp_path, persistent_env={"PERSISTENT": "p"})
    run(e.start(force_build=False))
    try:
        yield e
    finally:
        run(e.stop(delete=True))


def test_exec_runs_bash_with_the_images_defaults_and_the_callers_options(env: SandforkEnvironment) -> None:
    r = run(env.exec('echo "$BASH_VERSION" | cut -c1; pwd; echo "$FROM_IMAGE $PERSISTENT $X"; echo err >&2; exit 7', env={"X": "x"}))
    assert r.return_code == 7
    assert (r.stdout or "").split("\n")[:3] == ["5", "/work", "yes p x"], r.stdout
    assert r.stderr == "err\n"
    r = run(env.exec("id -un; pwd", cwd="/tmp", user="nobody"))
    assert r.stdout == "nobody\n/tmp\n"
    with env.with_default_user(0):
        assert run(env.exec("id -u")).stdout == "0\n"
    assert run(env.exec("kill -9 $$")).return_code == 128 + 9


def test_exec_timeout_is_an_error_and_unknown_users_fail_the_command(env: SandforkEnvironment) -> None:
    with pytest.raises(SandforkExecTimeoutError, match="timed out after 1 seconds"):
        run(env.exec("sleep 30", timeout_sec=1))
    r = run(env.exec("true", user="no-such-user"))
    assert r.return_code != 0 and "no-such-user" in (r.stderr or ""), r


def test_a_command_over_the_request_limit_goes_through_a_file(env: SandforkEnvironment) -> None:
    long = "x" * (INLINE_LIMIT + 10)
    r = run(env.exec(f"v={long}; echo ${{#v}}"))
    assert r.return_code == 0 and r.stdout == f"{len(long)}\n", r.stderr


def test_streamed_output_reaches_harbors_callback(env: SandforkEnvironment) -> None:
    seen: list[tuple[str, str]] = []

    async def callback(text: str, stream: str) -> None:
        seen.append((stream, text))

    async def go() -> Any:
        with env.scoped_output_callback(callback):
            r = await env.exec("echo one; echo two >&2; echo three")
        await asyncio.sleep(0.1)
        return r

    r = run(go())
    assert r.stdout == "one\nthree\n"
    assert ("stdout", "one\n") in seen and ("stderr", "two\n") in seen and ("stdout", "three\n") in seen, seen


def test_files_and_directories_round_trip(env: SandforkEnvironment, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "nested" / "deeper").mkdir(parents=True)
    (src / "empty").mkdir()
    (src / "run.sh").write_text("#!/bin/sh\necho ran\n")
    (src / "run.sh").chmod(0o755)
    (src / "nested" / "data.bin").write_bytes(bytes(range(256)) * 300)
    (src / "nested" / "deeper" / "note.txt").write_text("deep\n")
    (src / "link").symlink_to("nested/deeper/note.txt")
    run(env.upload_dir(src, "/data/up"))
    assert run(env.exec("/data/up/run.sh; cat /data/up/link; test -d /data/up/empty && echo empty-dir")).stdout == "ran\ndeep\nempty-dir\n"
    assert run(env.is_dir("/data/up/nested")) and not run(env.is_file("/data/up/nested"))
    assert run(env.is_file("/data/up/run.sh")) and not run(env.is_dir("/nope"))

    out = tmp_path / "out"
    run(env.download_dir("/data/up", out))
    assert (out / "nested" / "data.bin").read_bytes() == (src / "nested" / "data.bin").read_bytes()
    assert (out / "nested" / "deeper" / "note.txt").read_text() == "deep\n"
    assert stat.S_IMODE((out / "run.sh").stat().st_mode) == 0o755
    assert os.readlink(out / "link") == "nested/deeper/note.txt"
    assert (out / "empty").is_dir()

    one = tmp_path / "one.txt"
    one.write_text("single\n")
    run(env.upload_file(one, "/data/single/one.txt"))
    run(env.download_file("/data/single/one.txt", tmp_path / "back" / "one.txt"))
    assert (tmp_path / "back" / "one.txt").read_text() == "single\n"
    with pytest.raises(FileNotFoundError):
        run(env.download_file("/data/missing.txt", tmp_path / "missing.txt"))
    with pytest.raises(FileNotFoundError):
        run(env.download_dir("/data/missing", tmp_path / "missing"))


def test_harbors_own_transfer_helpers_work_on_it(env: SandforkEnvironment, tmp_path: Path) -> None:
    run(env.exec("mkdir -p /data/logs/skip && echo keep > /data/logs/a.txt && echo no > /data/logs/skip/b.txt"))
    run(env.download_dir_with_exclusions(source_dir="/data/logs", target_dir=tmp_path / "x", exclude=["./skip"]))
    assert (tmp_path / "x" / "a.txt").read_text() == "keep\n" and not (tmp_path / "x" / "skip").exists()
    run(env.download_dir_filtered(source_dir="/data/logs", target_dir=tmp_path / "f", include=["skip/*"]))
    assert (tmp_path / "f" / "skip" / "b.txt").read_text() == "no\n" and not (tmp_path / "f" / "a.txt").exists()
    # the directories Harbor's trial expects exist from the start, writable by anyone
    assert run(env.exec("stat -c %a /logs/agent /logs/verifier")).stdout == "777\n777\n"


def test_resources_are_the_sandbox_limits(env_dir: Path, tmp_path: Path) -> None:
    e = make(env_dir, tmp_path, config=EnvironmentConfig(cpus=0.5, memory_mb=300, storage_mb=1024))
    run(e.start(force_build=False))
    try:
        info = e.sandbox.info()
        assert (info.cpus, info.memory_mb, info.disk_mb) == (0.5, 300, 1024)
    finally:
        run(e.stop(delete=True))
    # overrides win, and --override-cpus on a job is honoured the same way
    e = make(env_dir, tmp_path, config=EnvironmentConfig(cpus=2, memory_mb=300), override_cpus=1, override_memory_mb=400)
    run(e.start(force_build=False))
    try:
        info = e.sandbox.info()
        assert (info.cpus, info.memory_mb) == (1.0, 400)
    finally:
        run(e.stop(delete=True))


def test_network_policies(env_dir: Path, tmp_path: Path) -> None:
    e = make(env_dir, tmp_path, network_policy=NetworkPolicy(network_mode=NetworkMode.NO_NETWORK))
    run(e.start(force_build=False))
    try:
        assert run(e.exec("ls /sys/class/net")).stdout == "lo\n"
    finally:
        run(e.stop(delete=True))
    policy = NetworkPolicy(network_mode=NetworkMode.ALLOWLIST, allowed_hosts=["example.com", "*.example.org", "203.0.113.0/24"])
    e = make(env_dir, tmp_path, network_policy=policy)
    run(e.start(force_build=False))
    try:
        network = e.sandbox.info().network
        assert sorted(network.allow_out or []) == ["*.example.org", "203.0.113.0/24", "example.com"], network
    finally:
        run(e.stop(delete=True))
    with pytest.raises(ValueError, match="IPv6"):
        make(env_dir, tmp_path, network_policy=NetworkPolicy(network_mode=NetworkMode.ALLOWLIST, allowed_hosts=["2001:db8::1"]))


def test_what_sandfork_cannot_serve_is_refused_by_name(env_dir: Path, tmp_path: Path, env: SandforkEnvironment) -> None:
    with pytest.raises(SandforkUnsupportedError, match="host directory mounts"):
        make(env_dir, tmp_path, mounts=[{"type": "bind", "source": str(tmp_path), "target": "/host"}])
    with pytest.raises(ValueError, match="automatic host mounts"):
        make(env_dir, tmp_path, auto_mounting=True)
    with pytest.raises(RuntimeError, match="GPU"):
        make(env_dir, tmp_path, config=EnvironmentConfig(gpus=1))
    with pytest.raises(ValueError, match="resource requests"):
        make(env_dir, tmp_path, config=EnvironmentConfig(memory_mb=256), memory_enforcement_policy=ResourceMode.REQUEST)
    with pytest.raises(ValueError, match="cannot change network policy"):
        run(env.set_network_policy(NetworkPolicy(network_mode=NetworkMode.NO_NETWORK)))
    with pytest.raises(ServiceOperationsUnsupportedError):
        run(env.service_exec("true", service="sidecar"))


def test_stop_without_delete_keeps_the_sandbox_suspended(env_dir: Path, tmp_path: Path) -> None:
    e = make(env_dir, tmp_path)
    run(e.start(force_build=False))
    sb = e.sandbox
    run(e.exec("echo kept > /work/kept.txt"))
    run(e.stop(delete=False))
    try:
        assert sb.info().state == "suspended"
        assert sb.run(["cat", "/work/kept.txt"]).stdout == "kept"
    finally:
        sb.terminate()


def test_concurrent_forked_trials_share_one_checkpoint_and_nothing_else(env_dir: Path, tmp_path: Path) -> None:
    async def trial(n: int) -> tuple[str, str, str]:
        e = make(env_dir, tmp_path, fork=True)
        await e.start(force_build=False)
        try:
            await e.exec(f"echo {n} > /work/mine.txt")
            await asyncio.sleep(0.5)  # the others write theirs meanwhile
            mine = (await e.exec("cat /work/mine.txt")).stdout or ""
            return e.sandbox.info().labels["harbor-sandfork"], mine.strip(), e.sandbox.id
        finally:
            await e.stop(delete=True)

    async def all_trials() -> list[tuple[str, str, str]]:
        return list(await asyncio.gather(*(trial(n) for n in range(4))))

    try:
        results = run(all_trials())
    finally:
        deleted = delete_snapshots()
    assert sorted(role for role, _, _ in results) == ["fork", "fork", "fork", "trial"], results
    assert [mine for _, mine, _ in results] == ["0", "1", "2", "3"], results
    assert len({sid for _, _, sid in results}) == 4
    assert len(deleted) == 1
    # a fork restores from the snapshot: its info names it
    assert not [s for s in Sandbox.list() if (s.labels or {}).get("harbor-sandfork")]
