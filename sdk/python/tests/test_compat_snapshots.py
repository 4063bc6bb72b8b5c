"""Tensorlake compatibility against the real daemon: checkpoints, snapshots, restores, copies.

Each test is written the way Tensorlake's documentation uses the call (the comment under
its name quotes it); only the import line differs.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from sandfork import (
    CheckpointType,
    CopiedSandboxResponse,
    CreateSnapshotResponse,
    RemoteAPIError,
    Sandbox,
    SandboxClient,
    SandboxError,
    SandboxNotFoundError,
    SandboxStatus,
    SnapshotInfo,
    SnapshotStatus,
    SnapshotType,
    SnapshotWaitCondition,
)

pytestmark = [pytest.mark.daemon, pytest.mark.checkpoint, pytest.mark.usefixtures("checkpoint_routes")]


@pytest.fixture(scope="module")
def base(daemon):
    with Sandbox.create(memory_mb=128) as sb:
        sb.write_file("/data/output.csv", b"a\n1\n2\n3\n")
        yield sb


def test_checkpoint_default(base: Sandbox) -> None:
    # snapshot = sandbox.checkpoint()   # server default (filesystem)   (docs: sandboxes/snapshots)
    snapshot = base.checkpoint()
    try:
        assert isinstance(snapshot, SnapshotInfo)
        assert snapshot.snapshot_type == SnapshotType.FILESYSTEM and snapshot.status == SnapshotStatus.COMPLETED
        assert (snapshot.sandbox_id, snapshot.base_image, snapshot.namespace, snapshot.error) == (base.sandbox_id, "busybox", "default", None)
        assert snapshot.size_bytes > 0 and snapshot.created_at is not None and snapshot.rootfs_disk_bytes is not None
    finally:
        Sandbox.delete_snapshot(snapshot.snapshot_id)


def test_checkpoint_types_and_restore(base: Sandbox) -> None:
    # snapshot = sandbox.checkpoint(checkpoint_type=CheckpointType.MEMORY); restored = Sandbox.create(snapshot_id=snapshot.snapshot_id)
    for kind in (CheckpointType.MEMORY, CheckpointType.FILESYSTEM):
        snapshot = base.checkpoint(checkpoint_type=kind)
        try:
            assert snapshot.snapshot_type == kind
            with Sandbox.create(snapshot_id=snapshot.snapshot_id) as restored:
                assert restored.sandbox_id != base.sandbox_id
                assert restored.read_file("/data/output.csv") == b"a\n1\n2\n3\n"
        finally:
            Sandbox.delete_snapshot(snapshot.snapshot_id)


def test_memory_restore_keeps_pinned_resources(base: Sandbox) -> None:
    # Memory snapshots pin their resources: Sandbox.create(snapshot_id=...) with the default cpus/memory_mb works
    snapshot = base.checkpoint(checkpoint_type=CheckpointType.MEMORY)
    try:
        with Sandbox.create(snapshot_id=snapshot.snapshot_id) as restored:
            assert restored.info().resources.memory_mb == 128
        with pytest.raises(RemoteAPIError) as info:
            Sandbox.create(snapshot_id=snapshot.snapshot_id, memory_mb=2048)
        assert info.value.status_code == 422 and "memory_mb" in info.value.message
    finally:
        Sandbox.delete_snapshot(snapshot.snapshot_id)


def test_fork_workers_from_a_snapshot(base: Sandbox) -> None:
    # snap = base.checkpoint(); def worker(i): sb = Sandbox.create(snapshot_id=snap.snapshot_id) ...
    # with ThreadPoolExecutor(max_workers=4) as pool: outs = list(pool.map(worker, range(4)))   (persistence docs, combined)
    snap = base.checkpoint()

    def worker(i: int) -> str:
        sb = Sandbox.create(snapshot_id=snap.snapshot_id)
        try:
            return sb.run("sh", ["-c", f"echo {i}; wc -l < /data/output.csv"]).stdout
        finally:
            sb.terminate()

    try:
        with ThreadPoolExecutor(max_workers=4) as pool:
            outs = list(pool.map(worker, range(4)))
        assert outs == [f"{i}\n4" for i in range(4)]
    finally:
        Sandbox.delete_snapshot(snap.snapshot_id)


def test_get_list_delete_snapshot(base: Sandbox) -> None:
    # info = Sandbox.get_snapshot(snapshot_id); Sandbox.delete_snapshot(snapshot_id); sandbox.list_snapshots()
    snapshot = base.checkpoint()
    info = Sandbox.get_snapshot(snapshot.snapshot_id)
    assert (info.snapshot_id, info.sandbox_id, info.status) == (snapshot.snapshot_id, base.sandbox_id, SnapshotStatus.COMPLETED)
    assert snapshot.snapshot_id in [s.snapshot_id for s in base.list_snapshots()]
    assert Sandbox.delete_snapshot(snapshot.snapshot_id) is None
    assert snapshot.snapshot_id not in [s.snapshot_id for s in base.list_snapshots()]


def test_unknown_snapshot(daemon) -> None:
    # get_snapshot does not map 404: it raises RemoteAPIError(404, ...)
    for call in (lambda: Sandbox.get_snapshot("snap-nope"), lambda: Sandbox.create(snapshot_id="snap-nope"), lambda: Sandbox.delete_snapshot("snap-nope")):
        with pytest.raises(RemoteAPIError) as info:
            call()
        assert info.value.status_code == 404 and "snap-nope" in info.value.message
        assert not isinstance(info.value, SandboxNotFoundError)


def test_checkpoint_without_waiting(base: Sandbox) -> None:
    # sandbox.checkpoint(wait=False) fires the snapshot request and returns None
    before = {s.snapshot_id for s in base.list_snapshots()}
    assert base.checkpoint(wait=False) is None
    deadline = time.monotonic() + 60
    while not ({s.snapshot_id for s in base.list_snapshots()} - before):
        assert time.monotonic() < deadline, "the background checkpoint did not appear"
        time.sleep(0.1)
    for s in base.list_snapshots():
        if s.snapshot_id not in before:
            Sandbox.delete_snapshot(s.snapshot_id)


def test_checkpoint_wait_until(base: Sandbox) -> None:
    # sandbox.checkpoint(wait_until=SnapshotWaitCondition.COMPLETED); wait_until="completed"; anything else is refused
    snap = base.checkpoint(wait_until="completed")
    assert snap.status == SnapshotStatus.COMPLETED
    Sandbox.delete_snapshot(snap.snapshot_id)
    snap = base.checkpoint(wait_until=SnapshotWaitCondition.LOCAL_READY, timeout=120, poll_interval=0.5)
    Sandbox.delete_snapshot(snap.snapshot_id)
    with pytest.raises(SandboxError, match="wait_until must be 'local_ready' or 'completed'"):
        base.checkpoint(wait_until="soon")
    with pytest.raises(TypeError, match="checkpoint_type="):
        base.checkpoint(CheckpointType.MEMORY)  # the first positional parameter is `wait`


def test_copy(base: Sandbox) -> None:
    # resp = sandbox.copy(times=2); connect each copy with Sandbox.connect(c.sandbox_id)   (CLI: tl sbx copy <id> -n 4)
    resp = base.copy(times=2)
    try:
        assert resp.source_sandbox_id == base.sandbox_id and len(resp.sandboxes) == 2
        for entry in resp.sandboxes:
            assert isinstance(entry, CopiedSandboxResponse) and entry.status == "running" and entry.reason is None
            copy = Sandbox.connect(entry.sandbox_id)
            assert copy.read_file("/data/output.csv") == b"a\n1\n2\n3\n"
        assert base.status == SandboxStatus.RUNNING
    finally:
        for entry in resp.sandboxes:
            Sandbox.connect(entry.sandbox_id).terminate()
    with pytest.raises(SandboxError, match="times must be a positive integer"):
        base.copy(times=0)


def test_client_snapshot_calls(base: Sandbox) -> None:
    # snapshot = client.snapshot_and_wait(sandbox_id); client.snapshot(id) -> CreateSnapshotResponse; client.list_snapshots()
    client = SandboxClient()
    snapshot = client.snapshot_and_wait(base.sandbox_id)
    started = client.snapshot(base.sandbox_id, snapshot_type=SnapshotType.MEMORY)
    try:
        assert isinstance(started, CreateSnapshotResponse) and started.status == SnapshotStatus.COMPLETED
        assert client.get_snapshot(started.snapshot_id).snapshot_type == SnapshotType.MEMORY
        assert {snapshot.snapshot_id, started.snapshot_id} <= {s.snapshot_id for s in client.list_snapshots()}
        with client.create_and_connect(snapshot_id=snapshot.snapshot_id) as sandbox:
            assert sandbox.run("ls", ["/data"]).stdout == "output.csv"
    finally:
        client.delete_snapshot(snapshot.snapshot_id)
        client.delete_snapshot(started.snapshot_id)
    with pytest.raises(SandboxNotFoundError):
        client.snapshot("sb-0000000000000000")


def test_published_fork_example_fits_in_memory(daemon) -> None:
    # base = Sandbox.create(memory_mb=4096); snapshot = base.checkpoint(checkpoint_type=CheckpointType.MEMORY)
    # with ThreadPoolExecutor(5) as pool: workers = list(pool.map(lambda _: Sandbox.create(snapshot_id=...), range(5)))
    # Memory limits are caps, not reservations: six 4 GiB sandboxes that each use a few MB
    # are admitted on a host with less than 24 GiB free.
    base = Sandbox.create(memory_mb=4096)
    try:
        base.run("sh", ["-c", "echo warm > /tmp/state"])
        base.start_process("sleep", ["600"])
        snapshot = base.checkpoint(checkpoint_type=CheckpointType.MEMORY)
    finally:
        base.terminate()
    workers = []
    try:
        with ThreadPoolExecutor(max_workers=5) as pool:
            workers = list(pool.map(lambda _: Sandbox.create(snapshot_id=snapshot.snapshot_id), range(5)))
        for w in workers:
            assert w.run("cat", ["/tmp/state"]).stdout == "warm"
            assert any(p.command == "sleep" for p in w.list_processes())
    finally:
        for w in workers:
            w.terminate()
        Sandbox.delete_snapshot(snapshot.snapshot_id)
