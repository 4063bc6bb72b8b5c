"""The asyncio flavour against the real daemon."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import List

import pytest

from sandfork import ProcessStatus, Sandbox, SandboxStatus
from sandfork.aio import AsyncSandbox

pytestmark = pytest.mark.daemon


def test_async_create_run_stream_files(daemon) -> None:
    async def main() -> None:
        async with AsyncSandbox.create(memory_mb=64) as sb:
            assert await sb.status() == SandboxStatus.RUNNING
            r = await sb.run("sh", ["-c", "echo out; exit 2"])
            assert (r.stdout, r.exit_code) == ("out", 2)

            chunks: List[str] = []
            stream = sb.stream("sh", ["-c", "echo a; sleep 0.2; echo b"])
            async for event in stream:
                chunks.append(event.data)
            assert "".join(chunks) == "a\nb\n" and stream.result is not None and stream.result.exit_code == 0

            loop_thread = threading.get_ident()
            threads: List[int] = []
            seen: List[str] = []

            def on_out(text: str) -> None:
                threads.append(threading.get_ident())
                seen.append(text)

            r = await sb.run("echo", ["cb"], on_stdout=on_out)
            assert seen == ["cb"] and r.stdout == "cb" and set(threads) == {loop_thread}

            await sb.write_file("/tmp/a.txt", "async")
            assert await sb.read_file("/tmp/a.txt") == b"async"
            assert "a.txt" in [e.name for e in await sb.list_dir("/tmp")]
            sandbox_id = sb.id
        assert await (await AsyncSandbox.connect(sandbox_id)).status() == SandboxStatus.TERMINATED

    asyncio.run(main())


def test_async_processes(daemon) -> None:
    async def main() -> None:
        sb = await AsyncSandbox.create(memory_mb=64)
        try:
            proc = await sb.start_process("sh", ["-c", "echo bg; sleep 600"])
            assert proc.status == ProcessStatus.RUNNING
            again = await (await AsyncSandbox.connect(sb.id)).get_process(proc.pid)
            async with again.output() as live:
                first = await live.__anext__()
            assert first.data == "bg\n"
            await proc.kill()
            info = await again.wait(timeout=10)
            assert info.signal == 9
            text = "".join([e.data async for e in again.output()])
            assert text == "bg\n"
        finally:
            await sb.terminate()
        assert (await sb.info()).status == SandboxStatus.TERMINATED

    asyncio.run(main())


def test_async_fan_out(daemon) -> None:
    async def one(i: int) -> str:
        async with AsyncSandbox.create(memory_mb=64) as sb:
            return (await sb.run("echo", [str(i)])).stdout

    async def main() -> List[str]:
        return await asyncio.gather(*(one(i) for i in range(8)))

    assert asyncio.run(main()) == [f"{i}" for i in range(8)]


def test_cancelled_create_leaves_no_sandbox(daemon) -> None:
    label = {"suite": "aio-cancel"}

    def live() -> List[str]:
        return [s.id for s in Sandbox.list() if s.labels == label and s.status not in ("terminated", "failed")]

    def ended() -> List[str]:
        return [s.id for s in Sandbox.list(state="terminated") if s.labels == label]

    async def main() -> None:
        task = asyncio.ensure_future(AsyncSandbox.create(memory_mb=64, labels=label))
        await asyncio.sleep(0.01)  # the create is in flight in a worker thread
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    deadline = time.monotonic() + 30
    while not (live() or ended()) and time.monotonic() < deadline:
        time.sleep(0.05)  # the create goes on in its thread
    assert live() or ended(), "the create reached the daemon"
    while live() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert live() == [] and len(ended()) == 1, "the sandbox created for a cancelled task is terminated"
