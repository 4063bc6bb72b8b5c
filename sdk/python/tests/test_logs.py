"""The sandbox log against the real daemon: what background processes write, line by
line with when, filtered, tailed and followed; the same in Tensorlake's shape; kept
through a memory checkpoint into a fork."""

from __future__ import annotations

import threading
import time
from typing import List

from sandfork import Sandbox, SandboxClient
from sandfork.events import LogEntry
from sandfork.models import CheckpointType


def wait_for(cond, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_lines_of_every_background_process_in_order(daemon) -> None:
    with Sandbox.create(memory_mb=64) as sb:
        # stdout and stderr are separate pipes, read apart: only lines written apart in
        # time have an order, so the workload leaves a moment between streams.
        a = sb.start_process(
            "sh", ["-c", "echo one; sleep 0.1; echo oops >&2; sleep 0.1; printf 'no newline'"]
        )
        b = sb.start_process("sh", ["-c", "sleep 0.6; echo two"], name="second")
        sb.run("echo", ["an exec is not in the log"])
        a.wait(timeout=20)
        b.wait(timeout=20)
        lines = list(sb.logs())
        assert [(e.process.split()[0], e.stream, e.level, e.message) for e in lines] == [
            ("sh", "stdout", "info", "one"),
            ("sh", "stderr", "error", "oops"),
            ("sh", "stdout", "info", "no newline"),
            ("second", "stdout", "info", "two"),
        ]
        assert [e.seq for e in lines] == [1, 2, 3, 4] and all(e.timestamp for e in lines)
        assert [e.message for e in sb.logs(tail=2)] == ["no newline", "two"]
        assert [e.message for e in sb.logs(since=3)] == ["no newline", "two"]
        assert [e.message for e in sb.logs(stream="stderr")] == ["oops"]
        assert [e.message for e in sb.logs(process="second")] == ["two"]
        assert [e.message for e in sb.logs(process=a.pid)] == ["one", "oops", "no newline"]


def test_follow_and_tensorlake_shape(daemon) -> None:
    with Sandbox.create(memory_mb=64) as sb:
        got: List[LogEntry] = []
        stream = sb.logs(follow=True)
        reader = threading.Thread(target=lambda: [got.append(e) for e in stream], daemon=True)
        reader.start()
        sb.start_process("sh", ["-c", "for i in 1 2 3; do echo line-$i; sleep 0.2; done; echo bad >&2"])
        wait_for(lambda: len(got) >= 4)
        stream.close()
        assert [e.message for e in got] == ["line-1", "line-2", "line-3", "bad"]
        # logs = sandbox.get_logs(tail=100, levels=["info", "warn"]).value; sandbox.list_log_processes().value.processes
        page = sb.get_logs(tail=100, levels=["info", "warn"]).value
        assert [r.body for r in page.logs] == ["line-1", "line-2", "line-3"]
        assert page.logs[0].timestamp > 0 and page.logs[0].level == 9 and page.logs[0].sandbox_id == sb.id
        first = sb.get_logs(head=2).value
        rest = sb.get_logs(next_token=first.next_token).value
        assert [r.body for r in first.logs + rest.logs] == ["line-1", "line-2", "line-3", "bad"]
        assert [r.body for r in sb.get_logs(levels=["error"]).value.logs] == ["bad"]
        assert [r.body for r in SandboxClient(client=sb.client).get_logs(sb.id, body="-2").value.logs] == ["line-2"]
        procs = sb.list_log_processes().value.processes
        assert len(procs) == 1 and procs[0].process_command.startswith("sh")


def test_the_log_is_in_a_memory_checkpoint_and_its_forks(daemon) -> None:
    with Sandbox.create(memory_mb=128) as sb:
        sb.start_process("sh", ["-c", "echo before; sleep 600"])
        wait_for(lambda: [e.message for e in sb.logs()] == ["before"])
        snap = sb.checkpoint(checkpoint_type=CheckpointType.MEMORY)
        try:
            with Sandbox.create(snapshot_id=snap.id) as child:
                assert [e.message for e in child.logs()] == ["before"]
                child.start_process("echo", ["after"])
                wait_for(lambda: [e.message for e in child.logs()] == ["before", "after"])
            assert [e.message for e in sb.logs()] == ["before"]
        finally:
            snap.delete()


def test_async_logs(daemon) -> None:
    import asyncio

    from sandfork.aio import AsyncSandbox

    async def main() -> None:
        async with await AsyncSandbox.create(memory_mb=64) as sb:
            p = await sb.start_process("sh", ["-c", "echo async-line"])
            await p.wait(timeout=20)
            stream = await sb.logs(tail=5)
            assert [e.message async for e in stream] == ["async-line"]

    asyncio.run(main())
