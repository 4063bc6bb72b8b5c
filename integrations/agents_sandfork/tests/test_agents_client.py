"""The Agents SDK sandbox client on a real daemon: sessions created from an image or a
sandfork snapshot, exec and files through the SDK's session API, suspend/resume and
memory checkpoints behind serialized session state, forks per rollout, and clear errors."""

from __future__ import annotations

import io
import json
import threading
from pathlib import Path
from typing import List

import pytest
from agents.sandbox import Manifest
from agents.sandbox.entries import File
from agents.sandbox.errors import ExecTimeoutError, ExecTransportError, ExposedPortUnavailableError, WorkspaceReadNotFoundError
from agents.sandbox.session import SandboxSession
from agents.sandbox.snapshot import LocalSnapshotSpec
from sandfork import CheckpointType, Sandbox, Snapshot

from agents_sandfork import SandforkSandboxClient, SandforkSandboxClientOptions, SandforkSandboxSession, SandforkSandboxSessionState

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("daemon", "no_leaks")]

# A value only in a shell's memory, handed to every reader of a FIFO.
WARM = 'trap "" PIPE; v=$(od -An -N8 -tx1 /dev/urandom | tr -d " \\n"); mkfifo /tmp/warm; while :; do echo "$v" > /tmp/warm; done'


def inner(session: SandboxSession) -> SandforkSandboxSession:
    s = session._inner
    assert isinstance(s, SandforkSandboxSession)
    return s


async def warm_value(session: SandboxSession) -> str:
    r = await session.exec("head", "-n1", "/tmp/warm", shell=False, timeout=10)
    assert r.ok(), r.stderr
    return r.stdout.decode().strip()


async def start_warm(session: SandboxSession) -> str:
    sb = inner(session).sandbox
    sb.start_process("/bin/sh", ["-c", WARM])
    for _ in range(50):
        r = await session.exec("test", "-p", "/tmp/warm", shell=False)
        if r.ok():
            return await warm_value(session)
    raise AssertionError("the warm process did not start")


async def roundtrip(client: SandforkSandboxClient, state: SandforkSandboxSessionState) -> SandforkSandboxSessionState:
    payload = json.loads(json.dumps(client.serialize_session_state(state)))
    restored = client.deserialize_session_state(payload)
    assert isinstance(restored, SandforkSandboxSessionState)
    return restored


async def test_create_exec_files_and_delete() -> None:
    client = SandforkSandboxClient()
    manifest = Manifest(entries={"notes/hello.txt": File(content=b"hello from the manifest\n")})
    session = await client.create(manifest=manifest, options=SandforkSandboxClientOptions(image="busybox", env={"STAGE": "test"}))
    try:
        async with session:
            r = await session.exec("pwd; echo $STAGE; cat notes/hello.txt")
            assert r.ok(), r.stderr
            assert r.stdout.decode().split("\n")[:3] == ["/workspace", "test", "hello from the manifest"]
            await session.write(Path("out/data.bin"), io.BytesIO(b"\x00\xffbinary"))
            assert (await session.read(Path("out/data.bin"))).read() == b"\x00\xffbinary"
            with pytest.raises(WorkspaceReadNotFoundError):
                await session.read(Path("missing.txt"))
            entries = await session.ls("out")
            assert [e.path.split("/")[-1] for e in entries] == ["data.bin"]
            r = await session.exec("sh", "-c", "exit 7", shell=False)
            assert r.exit_code == 7
            r = await session.exec("no-such-program", shell=False)
            assert r.exit_code == 127 and b"no-such-program" in r.stderr
            with pytest.raises(ExecTimeoutError):
                await session.exec("sleep", "30", shell=False, timeout=1)
            with pytest.raises(ExposedPortUnavailableError):
                await inner(session)._resolve_exposed_port(8080)
            big = "x" * (64 * 1024)
            r = await session.exec("printf", "%s", *([big] * 12), shell=False)
            assert len(r.stdout) == 12 * len(big), "a command line over the daemon's request limit still runs"
    finally:
        await client.delete(session)
    assert inner(session).sandbox.info().state == "terminated"


async def test_suspend_on_exit_and_resume_keeps_memory_and_files() -> None:
    client = SandforkSandboxClient()
    session = await client.create(options=SandforkSandboxClientOptions(image="busybox", on_exit="suspend"))
    sandbox_id = inner(session).sandbox.id
    try:
        async with session:
            value = await start_warm(session)
            await session.write(Path("progress.txt"), io.BytesIO(b"step 3"))
        assert Sandbox.connect(sandbox_id).info().state == "suspended", "closing the session suspended its sandbox"
        state = await roundtrip(client, inner(session).state)

        resumed = await client.resume(state)
        async with resumed:
            assert inner(resumed).sandbox.id == sandbox_id, "the same sandbox, resumed"
            assert await warm_value(resumed) == value, "the process and its memory survived"
            assert (await resumed.read(Path("progress.txt"))).read() == b"step 3"
        await client.delete(resumed)
    finally:
        await client.delete(session)


async def test_checkpoint_persistence_restores_warm_when_the_sandbox_is_gone(tmp_path: Path) -> None:
    client = SandforkSandboxClient()
    options = SandforkSandboxClientOptions(image="busybox", workspace_persistence="checkpoint")
    session = await client.create(snapshot=LocalSnapshotSpec(base_path=tmp_path), options=options)
    resumed = None
    try:
        async with session:
            value = await start_warm(session)
            await session.write(Path("model.txt"), io.BytesIO(b"weights"))
        # closing persisted a memory checkpoint, then terminated the sandbox
        checkpoint = inner(session).state.checkpoint_id
        assert checkpoint and Snapshot.get(checkpoint).snapshot_type in ("memory", CheckpointType.MEMORY)
        assert inner(session).sandbox.info().state == "terminated"
        state = await roundtrip(client, inner(session).state)

        resumed = await client.resume(state)
        async with resumed:
            assert inner(resumed).sandbox.id != inner(session).sandbox.id
            assert await warm_value(resumed) == value, "restored warm from the memory checkpoint"
            assert (await resumed.read(Path("model.txt"))).read() == b"weights"
    finally:
        if resumed is not None:
            await client.delete(resumed)
        await client.delete(session)


async def test_tar_persistence_round_trips_the_workspace(tmp_path: Path) -> None:
    client = SandforkSandboxClient()
    session = await client.create(snapshot=LocalSnapshotSpec(base_path=tmp_path), options=SandforkSandboxClientOptions(image="busybox"))
    resumed = None
    try:
        async with session:
            await session.exec("mkdir -p src && echo 'print(1)' > src/main.py")
        state = await roundtrip(client, inner(session).state)
        resumed = await client.resume(state)
        async with resumed:
            assert (await resumed.read(Path("src/main.py"))).read() == b"print(1)\n"
    finally:
        if resumed is not None:
            await client.delete(resumed)
        await client.delete(session)


async def test_fork_per_rollout_is_warm_and_isolated() -> None:
    client = SandforkSandboxClient()
    session = await client.create(options=SandforkSandboxClientOptions(image="busybox"))
    forks: List[SandboxSession] = []
    try:
        async with session:
            value = await start_warm(session)
            await session.write(Path("task.txt"), io.BytesIO(b"shared setup"))
            forks = await client.fork(session, 2, env={"ROLLOUT": "yes"})
            a, b = forks
            async with a, b:
                assert len({inner(a).sandbox.id, inner(b).sandbox.id, inner(session).sandbox.id}) == 3
                for f in (a, b):
                    assert await warm_value(f) == value
                    assert (await f.read(Path("task.txt"))).read() == b"shared setup"
                    assert (await f.exec("echo $ROLLOUT")).stdout.strip() == b"yes"
                await a.write(Path("only-a.txt"), io.BytesIO(b"a"))
                await a.exec("sleep 300 >/dev/null 2>&1 &")
                with pytest.raises(WorkspaceReadNotFoundError):
                    await b.read(Path("only-a.txt"))
                assert b"sleep 300" in (await a.exec("ps")).stdout
                assert b"sleep 300" not in (await b.exec("ps")).stdout
                assert b"sleep 300" not in (await session.exec("ps")).stdout
    finally:
        for f in forks:
            await client.delete(f)
        await client.delete(session)


async def test_create_from_a_sandfork_snapshot() -> None:
    source = Sandbox.create(image="busybox")
    try:
        source.start_process("/bin/sh", ["-c", WARM])
        for _ in range(50):
            if source.run(["test", "-p", "/tmp/warm"]).exit_code == 0:
                break
        value = source.run(["head", "-n1", "/tmp/warm"]).stdout.strip()
        snap = source.checkpoint(checkpoint_type=CheckpointType.MEMORY)
    finally:
        source.terminate()
    client = SandforkSandboxClient()
    try:
        session = await client.create(options=SandforkSandboxClientOptions(snapshot_id=snap.snapshot_id))
        try:
            async with session:
                assert await warm_value(session) == value
        finally:
            await client.delete(session)
    finally:
        snap.delete()


async def test_a_sandbox_that_dies_is_a_transport_error_not_a_hang() -> None:
    client = SandforkSandboxClient()
    session = await client.create(options=SandforkSandboxClientOptions(image="busybox"))
    try:
        async with session:
            killer = threading.Timer(1.0, Sandbox.connect(inner(session).sandbox.id).terminate)
            killer.start()
            try:
                with pytest.raises(ExecTransportError):
                    await session.exec("sleep", "120", shell=False)
            finally:
                killer.join()
            assert not await session.running()
    finally:
        await client.delete(session)


async def test_interactive_processes_for_the_shell_tools() -> None:
    client = SandforkSandboxClient()
    session = await client.create(options=SandforkSandboxClientOptions(image="busybox"))
    try:
        async with session:
            assert session.supports_pty()
            # on a terminal: stdin is written to, output comes back, then it exits
            first = await session.pty_exec_start("cat", shell=False, tty=True, yield_time_s=0.5)
            assert first.process_id is not None and first.exit_code is None
            echoed = await session.pty_write_stdin(session_id=first.process_id, chars="hello pty\n", yield_time_s=5)
            assert b"hello pty" in echoed.output
            done = await session.pty_write_stdin(session_id=first.process_id, chars="\x04", yield_time_s=5)
            assert done.exit_code == 0 and done.process_id is None

            # without a terminal: output as it comes, then the exit code
            started = await session.pty_exec_start("echo one; sleep 2; echo two; exit 3", yield_time_s=0.5)
            assert started.process_id is not None and b"one" in started.output
            rest = await session.pty_write_stdin(session_id=started.process_id, chars="", yield_time_s=10)
            assert b"two" in rest.output and rest.exit_code == 3

            # a process left running is ended when the session closes
            await session.pty_exec_start("sleep", "600", shell=False, tty=True, yield_time_s=0.3)
        assert b"sleep 600" not in (await _ps(inner(session)))
    finally:
        await client.delete(session)


async def _ps(session: SandforkSandboxSession) -> bytes:
    try:
        return session.sandbox.run(["ps"]).stdout_bytes
    except Exception:
        return b""
