"""Sandbox lifecycle, commands, streaming and typed errors against the real daemon."""

from __future__ import annotations

import time
from typing import List

import pytest

import sandfork
from sandfork import Client, Sandbox, SandboxStatus

pytestmark = pytest.mark.daemon


def test_create_run_terminate(daemon) -> None:
    sb = Sandbox.create(image="busybox", cpus=1, memory_mb=128, labels={"suite": "sdk"})
    try:
        assert sb.id and sb.sandbox_id == sb.id
        assert sb.status == SandboxStatus.RUNNING == "running"
        info = sb.info()
        assert (info.image, info.memory_mb, info.labels) == ("busybox", 128, {"suite": "sdk"})
        r = sb.run("sh", ["-c", "echo hello; echo oops >&2; exit 3"])
        assert (r.stdout, r.stderr, r.exit_code, r.signal, r.timed_out) == ("hello", "oops", 3, None, False)
        assert not r.ok and r.duration_ms >= 0
    finally:
        sb.terminate()
    assert sb.status == SandboxStatus.TERMINATED
    sb.terminate()  # idempotent


def test_labels_are_set_and_removed_in_one_step(daemon) -> None:
    with Sandbox.create(image="busybox", memory_mb=64, labels={"team": "rl", "run": "1"}) as sb:
        assert sb.update_labels(set={"run": "2", "stage": "eval"}, remove=["team"]) == {"run": "2", "stage": "eval"}
        assert sb.info().labels == {"run": "2", "stage": "eval"}
        with pytest.raises(sandfork.RemoteAPIError) as bad:
            sb.update_labels(set={"bad key": "x"})
        assert bad.value.status_code == 400 and "Label key" in bad.value.message
        with pytest.raises(sandfork.InvalidArgumentError):
            sb.update_labels()
        with pytest.raises(TypeError):
            sb.update_labels(remove="team")
        assert sb.info().labels == {"run": "2", "stage": "eval"}, "a refused update changed nothing"


def test_run_accepts_a_list_command(sandbox: Sandbox) -> None:
    assert sandbox.run(["echo", "a", "b"]).stdout == "a b"


def test_env_working_dir_and_stdin(sandbox: Sandbox) -> None:
    r = sandbox.run("sh", ["-c", 'echo "$GREETING"; pwd; cat'], env={"GREETING": "hi there"}, working_dir="/tmp", stdin="from stdin\n")
    assert r.stdout == "hi there\n/tmp\nfrom stdin"
    binary = bytes(range(256))
    r = sandbox.run("cat", stdin=binary)
    assert r.stdout_bytes == binary and r.exit_code == 0


def test_sandbox_env_applies_to_every_command(daemon) -> None:
    with Sandbox.create(memory_mb=64, env={"FROM_CREATE": "yes"}, secrets={"TOKEN": "t0k"}) as sb:
        assert sb.run("sh", ["-c", "echo $FROM_CREATE $TOKEN"]).stdout == "yes t0k"
        assert "t0k" not in repr(sb.info().raw)


def test_timeout_kills_the_command(sandbox: Sandbox) -> None:
    start = time.monotonic()
    r = sandbox.run("sleep", ["30"], timeout=1)
    assert r.timed_out and r.exit_code != 0
    assert time.monotonic() - start < 15


def test_exit_by_signal_is_negative(sandbox: Sandbox) -> None:
    r = sandbox.run("sh", ["-c", "kill -KILL $$"])
    assert (r.signal, r.exit_code) == (9, -9)


def test_streaming_callbacks(sandbox: Sandbox) -> None:
    out: List[str] = []
    err: List[str] = []
    r = sandbox.run("sh", ["-c", "for i in 1 2 3; do echo out$i; echo err$i >&2; sleep 0.1; done; exit 4"], on_stdout=out.append, on_stderr=err.append)
    # Whole lines without their newline, as on_stdout=print wants them.
    assert out == ["out1", "out2", "out3"] and r.stdout == "out1\nout2\nout3"
    assert err == ["err1", "err2", "err3"] and r.stderr == "err1\nerr2\nerr3"
    assert r.stdout_bytes == b"out1\nout2\nout3\n"
    assert r.exit_code == 4


def test_streaming_iterator_delivers_output_before_exit(sandbox: Sandbox) -> None:
    stream = sandbox.stream("sh", ["-c", "echo first; sleep 2; echo second"])
    start = time.monotonic()
    first = next(stream)
    assert first.stream == "stdout" and first.data == "first\n"
    assert time.monotonic() - start < 1.8, "the first chunk should arrive before the command ends"
    rest = list(stream)
    assert "".join(e.data for e in rest) == "second\n"
    assert stream.result is not None and stream.result.exit_code == 0
    assert stream.result.stdout == "first\nsecond" and stream.result.stdout_bytes == b"first\nsecond\n"


def test_large_output(sandbox: Sandbox) -> None:
    r = sandbox.run("sh", ["-c", "yes 0123456789abcdef | head -c 5000000"])
    assert len(r.stdout) == 5_000_000 and r.exit_code == 0


def test_connect_by_id_and_name_and_list(daemon) -> None:
    name = f"sdk-named-{time.monotonic_ns()}"
    with Sandbox.create(name=name, memory_mb=64) as sb:
        assert sb.name == name
        by_name = Sandbox.connect(name)
        assert by_name.id == sb.id
        by_id = Sandbox.connect(sb.id)
        assert by_id.name == name
        listed = Sandbox.list()
        assert sb.id in [i.id for i in listed]
        assert [i.id for i in Sandbox.list(name=name)] == [sb.id]
        with Sandbox.connect(name) as attached:
            pass
        assert attached.status == "running", "a connected handle must not terminate on exit"


def test_context_manager_terminates(daemon) -> None:
    with Sandbox.create(memory_mb=64) as sb:
        sb.run("true")
    assert sb.status == SandboxStatus.TERMINATED


def test_not_found_is_typed(daemon) -> None:
    with pytest.raises(sandfork.SandboxNotFoundError) as info:
        Sandbox.connect("sb-does-not-exist")
    assert info.value.status == 404 and info.value.code == "not_found" and info.value.message


def test_exec_on_terminated_sandbox_is_a_conflict(daemon) -> None:
    sb = Sandbox.create(memory_mb=64)
    sb.terminate()
    with pytest.raises(sandfork.ConflictError) as info:
        sb.run("true")
    assert info.value.status == 409 and "terminated" in info.value.message


def test_bad_arguments_are_typed(daemon) -> None:
    with pytest.raises(sandfork.InvalidArgumentError) as info:
        Sandbox.create(image="busybox", snapshot_id="snap-x")
    assert info.value.status == 400
    with pytest.raises(sandfork.InvalidArgumentError):
        Sandbox.create(cpus=-1)


def test_unknown_command_is_exec_failed(sandbox: Sandbox) -> None:
    with pytest.raises(sandfork.InvalidArgumentError) as info:
        sandbox.run("/bin/definitely-not-here")
    assert info.value.code == "exec_failed" and "definitely-not-here" in info.value.message


def test_explicit_client(daemon) -> None:
    client = Client(url=daemon.url)
    with Sandbox.create(memory_mb=64, client=client) as sb:
        assert sb.client is client
        assert sb.run("echo", ["x"]).stdout == "x"


def test_stats_sync_and_async(daemon) -> None:
    import asyncio

    from sandfork.aio import AsyncSandbox

    with Sandbox.create(image="busybox", memory_mb=96) as sb:
        before = sb.stats()
        assert before.sandbox_id == sb.id and before.memory_limit_bytes == 96 << 20 and before.pids >= 1
        sb.run("sh", ["-c", "dd if=/dev/zero of=/blob bs=1M count=8 2>/dev/null; sync; i=0; while [ $i -lt 50000 ]; do i=$((i+1)); done"])
        after = sb.stats()
        assert after.disk_used_bytes >= before.disk_used_bytes + 7 * 2**20
        assert after.cpu_seconds > before.cpu_seconds and after.sampled_at >= before.sampled_at

        async def read() -> int:
            handle = await AsyncSandbox.connect(sb.id)
            return (await handle.stats()).memory_bytes

        assert asyncio.run(read()) > 0
    with pytest.raises(sandfork.ConflictError):
        sb.stats()
