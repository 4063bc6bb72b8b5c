"""Checkpoints, snapshots, forks and suspend/resume against the real daemon.

Skipped, with the reason, while the daemon's OpenAPI document lacks these routes.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import sandfork
from sandfork import CheckpointType, Sandbox, Snapshot, SandboxStatus

pytestmark = [pytest.mark.daemon, pytest.mark.checkpoint, pytest.mark.usefixtures("checkpoint_routes")]

# Holds a value only in memory and answers with it whenever /tmp/ask appears.
MEMORY_HOLDER = "secret=$(cat /tmp/secret); rm /tmp/secret; while :; do if [ -e /tmp/ask ]; then rm /tmp/ask; echo $secret > /tmp/answer; fi; sleep 0.05; done"


def _ask(sb: Sandbox, timeout: float = 10.0) -> str:
    sb.write_file("/tmp/ask", "")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sb.exists("/tmp/answer"):
            return sb.read_file("/tmp/answer").decode().strip()
        time.sleep(0.05)
    raise AssertionError(f"sandbox {sb.id} did not answer from memory within {timeout:g}s")


def test_filesystem_checkpoint_restores_files_not_processes(daemon) -> None:
    with Sandbox.create(memory_mb=128) as base:
        base.write_file("/data/state.txt", "v1")
        base.start_process("sleep", ["600"])
        snap = base.checkpoint()
        assert snap.type == CheckpointType.FILESYSTEM and snap.snapshot_id == snap.id
        assert snap.source_sandbox_id == base.id and snap.created_at is not None
        assert base.run("cat", ["/data/state.txt"]).stdout == "v1", "the source keeps running"
        assert snap in base.list_snapshots() and snap in Snapshot.list(source=base.id)
        assert Snapshot.get(snap.id).id == Sandbox.get_snapshot(snap.id).id == snap.id
    with Sandbox.create(snapshot_id=snap.id) as restored:
        assert restored.read_file("/data/state.txt") == b"v1"
        assert restored.list_processes() == [], "a filesystem restore boots cold"
    snap.delete()
    with pytest.raises(sandfork.NotFoundError):
        Snapshot.get(snap.id)


def test_memory_checkpoint_restores_warm(daemon) -> None:
    with Sandbox.create(memory_mb=128) as base:
        base.write_file("/tmp/secret", "only-in-memory-42")
        base.start_process("sh", ["-c", MEMORY_HOLDER])
        time.sleep(0.5)
        assert not base.exists("/tmp/secret")
        snap = base.checkpoint(checkpoint_type=CheckpointType.MEMORY)
        assert snap.type == CheckpointType.MEMORY and snap.size_bytes > 0
    try:
        with Sandbox.create(snapshot_id=snap.snapshot_id) as warm:
            assert _ask(warm) == "only-in-memory-42"
            # A restored copy is a sandbox of its own, hostname included.
            assert warm.run("hostname").stdout.strip() == warm.id != base.id
    finally:
        Sandbox.delete_snapshot(snap.id)


def test_memory_checkpoint_keeps_loopback_tcp_connections(daemon) -> None:
    """An open TCP connection does not block a memory checkpoint; one over loopback with
    both ends in the sandbox carries on in a restored copy (connections leaving the
    sandbox close: tests/checkpoints/test_loopback_tcp.py)."""
    with Sandbox.create(memory_mb=128) as base:
        # stdin stays open (a pipe): busybox nc ends the connection when its stdin ends.
        base.start_process("sh", ["-c", "nc -l -p 7000 > /tmp/got; echo closed > /tmp/server-done"], stdin_mode="pipe")
        time.sleep(0.3)
        base.start_process("sh", ["-c", "(echo hello; sleep 100000) | nc 127.0.0.1 7000"])
        deadline = time.monotonic() + 10
        while base.read_file("/tmp/got").decode().strip() != "hello" if base.exists("/tmp/got") else True:
            assert time.monotonic() < deadline, "the connection inside the sandbox did not come up"
            time.sleep(0.05)
        snap = base.checkpoint(checkpoint_type=CheckpointType.MEMORY)
        assert base.run("cat", ["/tmp/got"]).stdout.strip() == "hello"  # the source keeps it
        assert not base.exists("/tmp/server-done")
    try:
        with Sandbox.create(snapshot_id=snap.snapshot_id) as copy:
            # Both ends of the connection to port 7000 (0x1B58) are established in the copy.
            # (the accepting end may be a dual-stack socket: /proc/net/tcp6)
            count = "cat /proc/net/tcp /proc/net/tcp6 | awk '$4 == \"01\" && ($2 ~ /:1B58$/ || $3 ~ /:1B58$/)' | wc -l"
            assert copy.run("sh", ["-c", count]).stdout.strip() == "2", copy.run("sh", ["-c", "cat /proc/net/tcp /proc/net/tcp6"]).stdout
            time.sleep(0.5)
            assert not copy.exists("/tmp/server-done"), "the restored loopback connection was closed"
            assert copy.run("echo", ["usable"]).stdout.strip() == "usable"
    finally:
        Sandbox.delete_snapshot(snap.id)


def test_fork_children_diverge(daemon) -> None:
    with Sandbox.create(memory_mb=64) as base:
        base.write_file("/shared.txt", "parent")
        snap = base.checkpoint(checkpoint_type=CheckpointType.MEMORY)
    try:
        with snap.fork(3, per_child=[{"env": {"CHILD": str(i)}} for i in range(3)]) as children:
            children.raise_for_errors()
            assert len(children) == 3 and children.ok
            ids = {c.id for c in children}
            assert len(ids) == 3
            for i, child in enumerate(children):
                child.write_file(f"/mine-{i}.txt", str(i))
            for i, child in enumerate(children):
                names = {e.name for e in child.list_dir("/")}
                assert f"mine-{i}.txt" in names and not (names & {f"mine-{j}.txt" for j in range(3) if j != i})
                assert child.read_file("/shared.txt") == b"parent"
                assert child.run("sh", ["-c", "echo $CHILD"]).stdout == f"{i}"
                info = child.info()
                assert info.fork is not None and info.fork["index"] == i and info.fork["parent_snapshot_id"] == snap.id
            identities = [c.run("sh", ["-c", "echo $SANDFORK_FORK_INDEX $SANDFORK_FORK_SEED"]).stdout.split() for c in children]
            assert [ident[0] for ident in identities] == ["0", "1", "2"]
            assert len({ident[1] for ident in identities}) == 3, "every child gets its own seed"
        assert all(c.status == SandboxStatus.TERMINATED for c in children)
    finally:
        snap.delete()


def test_sandbox_fork_keeps_the_source(daemon) -> None:
    with Sandbox.create(memory_mb=64) as base:
        base.write_file("/tmp/secret", "forked-value")
        base.start_process("sh", ["-c", MEMORY_HOLDER])
        time.sleep(0.5)
        with base.fork(2) as children:
            children.raise_for_errors()
            assert children.snapshot_id
            for child in children:
                assert _ask(child) == "forked-value"
        assert base.status == SandboxStatus.RUNNING
        assert _ask(base) == "forked-value"
        with base.copy(times=1) as copies:
            assert len(copies.sandboxes) == 1
        Snapshot.delete(children.snapshot_id)


def test_deleting_a_snapshot_keeps_restored_sandboxes(daemon) -> None:
    with Sandbox.create(memory_mb=64) as base:
        base.write_file("/keep.txt", "kept")
        snap = base.checkpoint()
    with Sandbox.create(snapshot_id=snap.id) as restored:
        snap.delete()
        assert restored.read_file("/keep.txt") == b"kept"
        restored.write_file("/more.txt", "x")
        assert restored.run("cat", ["/keep.txt", "/more.txt"]).stdout == "keptx"


def test_bad_snapshot_ids(daemon) -> None:
    for call in (lambda: Snapshot.get("snap-does-not-exist"), lambda: Sandbox.create(snapshot_id="snap-does-not-exist"), lambda: Snapshot.fork("snap-does-not-exist", 2)):
        with pytest.raises(sandfork.NotFoundError) as info:
            call()
        assert info.value.status_code == 404 and "snap-does-not-exist" in info.value.message


def test_export_import_round_trip(daemon, tmp_path: Path) -> None:
    with Sandbox.create(memory_mb=64) as base:
        base.write_file("/exported.txt", "travels")
        snap = base.checkpoint()
    try:
        path = tmp_path / "snap.sfs"
        assert snap.export(path) == path.stat().st_size > 0
        imported = Snapshot.import_(path)
        assert imported.type == CheckpointType.FILESYSTEM
        with Sandbox.create(snapshot_id=imported.id) as sb:
            assert sb.read_file("/exported.txt") == b"travels"
        if imported.id != snap.id:
            imported.delete()
        corrupt = tmp_path / "corrupt.sfs"
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        corrupt.write_bytes(bytes(data))
        with pytest.raises(sandfork.SandforkError):
            Snapshot.import_(corrupt)
    finally:
        try:
            snap.delete()
        except sandfork.NotFoundError:
            pass


def test_suspend_resume_named(daemon) -> None:
    name = f"sdk-suspend-{time.monotonic_ns()}"
    with Sandbox.create(name=name, memory_mb=64) as sb:
        sb.write_file("/tmp/secret", "survives-suspend")
        sb.start_process("sh", ["-c", MEMORY_HOLDER])
        time.sleep(0.5)
        sb.suspend()
        assert sb.status == SandboxStatus.SUSPENDED
        Sandbox.connect(name).resume()
        assert sb.status == SandboxStatus.RUNNING and sb.name == name
        assert _ask(sb) == "survives-suspend"


def test_an_idle_timeout_suspends_and_the_next_request_resumes(daemon) -> None:
    tag = f"t{time.monotonic_ns()}"
    with Sandbox.create(memory_mb=64, labels={"suite": tag}) as sb:
        sb.write_file("/tmp/secret", "resumed-on-access")
        sb.start_process("sh", ["-c", MEMORY_HOLDER])
        time.sleep(0.5)
        info = sb.set_timeout(1, on_timeout="suspend")
        assert (info.timeout_secs, info.on_timeout) == (1, "suspend") and info.expires_at is not None
        deadline = time.monotonic() + 30
        while sb.status != SandboxStatus.SUSPENDED:
            assert time.monotonic() < deadline, "the idle timeout did not suspend the sandbox"
            time.sleep(0.2)
        listed = Sandbox.list(labels={"suite": tag})
        assert [(i.id, i.status) for i in listed] == [(sb.id, SandboxStatus.SUSPENDED)]
        assert Sandbox.list(labels={"suite": tag, "other": "x"}) == []
        # Any exec, file or process request resumes it, processes and memory intact.
        assert _ask(sb) == "resumed-on-access"
        assert sb.status == SandboxStatus.RUNNING
        sb.set_timeout(0)
        assert sb.info().expires_at is None
        with pytest.raises(sandfork.SandboxError):
            sb.set_timeout(5, on_timeout="explode")


def test_events_tell_what_happened_live_and_replayed(daemon) -> None:
    import asyncio
    import threading

    import sandfork.aio

    seen: list = []
    follower = sandfork.events()
    reader = threading.Thread(target=lambda: [seen.append(e) for e in follower], daemon=True)
    reader.start()
    sb = Sandbox.create(image="busybox", memory_mb=32)
    try:
        r = sb.run("sh", ["-c", 'x=$(head -c 200000000 /dev/zero | tr "\\0" a); echo survived'])
        assert r.signal == 9 or r.exit_code != 0, r
        deadline = time.monotonic() + 20
        while not any(e.type == "oom" for e in sb.events(follow=False)):
            assert time.monotonic() < deadline, "no oom event"
            time.sleep(0.2)
        snap = sb.checkpoint()
        with snap.fork(1) as kids:
            kid = list(kids)[0]
            assert kid.run("true").ok
    finally:
        sb.terminate()
    kinds = [e.type for e in sb.events(follow=False)]
    assert kinds == ["created", "started", "oom", "checkpointed", "terminated"], kinds
    oom = next(e for e in sb.events(follow=False) if e.type == "oom")
    assert "killed for want of memory" in (oom.message or "")
    kid_events = list(sandfork.events(sandbox_id=kid.id, since=0, follow=False))
    assert [e.type for e in kid_events] == ["forked", "started", "terminated"], kid_events
    assert kid_events[0].snapshot_id == snap.snapshot_id

    deadline = time.monotonic() + 10
    while not any(e.sandbox_id == sb.id and e.type == "terminated" for e in list(seen)):
        assert time.monotonic() < deadline, f"the live stream missed events: {seen}"
        time.sleep(0.1)
    follower.close()
    live = [e.type for e in list(seen) if e.sandbox_id == sb.id]
    assert live == kinds, live
    seqs = [e.seq for e in list(seen)]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)

    async def replay() -> list:
        return [e.type async for e in sandfork.aio.events(sandbox_id=sb.id, since=0, follow=False)]

    assert asyncio.run(replay()) == kinds


def test_without_an_object_store_completed_is_local_and_publish_says_why(daemon) -> None:
    with Sandbox.create(memory_mb=128) as base:
        snap = base.checkpoint(wait_until="completed")
        assert not snap.published, "a daemon without an object store publishes nothing"
        with pytest.raises(sandfork.errors.UnsupportedError) as e:
            snap.publish()
        assert "object store" in str(e.value) and "object_store" in str(e.value)
        assert snap.id in [s.id for s in Snapshot.list(published=True)]
        with pytest.raises(sandfork.errors.UnsupportedError):
            Snapshot.delete(snap.id, everywhere=True)
        snap.delete()
