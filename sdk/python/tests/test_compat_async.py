"""Tensorlake compatibility against the real daemon: the async API.

Each test is written the way Tensorlake's documentation (docs.tensorlake.ai/sandboxes/async)
uses the call (the comment under its name quotes it); only the import line differs.
"""

from __future__ import annotations

import asyncio

import pytest

from sandfork import AsyncSandbox, AsyncSandboxClient, ProcessStatus, RemoteAPIError, SandboxNotFoundError, SandboxStatus, SnapshotInfo

pytestmark = pytest.mark.daemon


def test_async_create_and_run(daemon) -> None:
    # sandbox = await AsyncSandbox.create(); result = await sandbox.run("python", ["-c", "print('hello')"]); await sandbox.terminate()
    async def main() -> None:
        sandbox = await AsyncSandbox.create(cpus=2.0, memory_mb=2048)
        try:
            result = await sandbox.run("sh", ["-c", "echo hello"])
            assert (result.exit_code, result.stdout) == (0, "hello")
            assert await sandbox.status() == SandboxStatus.RUNNING
            assert sandbox.sandbox_id.startswith("sb-")
        finally:
            await sandbox.terminate()
        assert (await sandbox.info()).status == SandboxStatus.TERMINATED

    asyncio.run(main())


def test_async_context_manager(daemon) -> None:
    # async with await AsyncSandbox.create(cpus=2.0, memory_mb=2048) as sandbox: ...   # terminates on exit
    async def main() -> str:
        async with await AsyncSandbox.create(cpus=2.0, memory_mb=2048) as sandbox:
            sandbox_id = sandbox.sandbox_id
        return sandbox_id

    sandbox_id = asyncio.run(main())
    assert asyncio.run(_status_of(sandbox_id)) == SandboxStatus.TERMINATED


async def _status_of(sandbox_id: str) -> SandboxStatus:
    return await (await AsyncSandbox.connect(sandbox_id)).status()


def test_async_files(daemon) -> None:
    # await sandbox.write_file("/workspace/data.csv", b"name,score\nAlice,95\n"); content = await sandbox.read_file(...); content.value.decode()
    async def main() -> None:
        async with await AsyncSandbox.create(memory_mb=128) as sandbox:
            await sandbox.write_file("/workspace/data.csv", b"name,score\nAlice,95\n")
            content = await sandbox.read_file("/workspace/data.csv")
            assert content.value.decode() == "name,score\nAlice,95\n"
            assert [e.name for e in (await sandbox.list_directory("/workspace")).entries] == ["data.csv"]

    asyncio.run(main())


def test_async_gather_fan_out(daemon) -> None:
    # async def evaluate(prompt): async with await AsyncSandbox.create(cpus=1.0, memory_mb=1024) as sandbox: return (await sandbox.run(...)).stdout
    # outputs = await asyncio.gather(*(evaluate(p) for p in prompts))
    async def evaluate(prompt: str) -> str:
        async with await AsyncSandbox.create(cpus=1.0, memory_mb=1024) as sandbox:
            return (await sandbox.run("sh", ["-c", prompt])).stdout

    async def main() -> list:
        prompts = [f"echo $(( {i} * {i} ))" for i in range(6)]
        return await asyncio.gather(*(evaluate(p) for p in prompts))

    assert asyncio.run(main()) == [str(i * i) for i in range(6)]


def test_async_process_follow_output(daemon) -> None:
    # proc = await sandbox.start_process("python", ["-c", "for i in range(5): print(i)"]); for event in await sandbox.follow_output(proc.pid): ...
    async def main() -> None:
        async with await AsyncSandbox.create(memory_mb=128) as sandbox:
            proc = await sandbox.start_process("sh", ["-c", "for i in 0 1 2 3 4; do echo $i; done"])
            assert proc.pid > 0 and proc.status in (ProcessStatus.RUNNING, ProcessStatus.EXITED)
            lines = [event.line for event in await sandbox.follow_output(proc.pid)]
            assert lines == ["0", "1", "2", "3", "4"]
            assert (await sandbox.get_process(proc.pid)).status == ProcessStatus.EXITED
            assert (await sandbox.get_stdout(proc.pid)).line_count == 5
            with pytest.raises(RemoteAPIError) as info:
                await sandbox.get_process(99999)
            assert info.value.status_code == 404

    asyncio.run(main())


def test_async_checkpoint_and_restore(daemon, checkpoint_routes) -> None:
    # snapshot = await sandbox.checkpoint(); restored = await AsyncSandbox.create(snapshot_id=snapshot.snapshot_id)
    async def main() -> None:
        async with await AsyncSandbox.create(memory_mb=128) as sandbox:
            await sandbox.write_file("/data/x", b"warm")
            snapshot = await sandbox.checkpoint()
        assert isinstance(snapshot, SnapshotInfo)
        try:
            restored = await AsyncSandbox.create(snapshot_id=snapshot.snapshot_id)
            try:
                assert (await restored.read_file("/data/x")).value == b"warm"
            finally:
                await restored.terminate()
        finally:
            await snapshot.delete()

    asyncio.run(main())


def test_async_client(daemon) -> None:
    # client = AsyncSandboxClient.for_cloud(); async with client: await client.create_and_connect(...); await client.list()
    async def main() -> None:
        async with AsyncSandboxClient.for_cloud() as client:
            sandbox = await client.create_and_connect(image="busybox", memory_mb=128)
            try:
                assert sandbox.sandbox_id in [s.sandbox_id for s in await client.list()]
                assert (await client.get(sandbox.sandbox_id)).status == SandboxStatus.RUNNING
            finally:
                await client.delete(sandbox.sandbox_id)
            with pytest.raises(SandboxNotFoundError):
                await client.get("no-such-sandbox")

    asyncio.run(main())
