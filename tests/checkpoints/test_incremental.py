"""Memory snapshots store only what changed since their parent.

A source holds 4 MB of random data in a live shell variable and writes its hash. A memory
checkpoint A; a fork of A; a memory checkpoint B of the fork. B's images read every page
the fork did not change from A's, so B takes a fraction of A's size. Every restore is
checked by the process itself: on SIGUSR1 it hashes the variable again. B restores right
before and after A is deleted (A's files stay while B reads them, and go with B); an
export of B carries every page and imports into a snapshot that restores the same.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from sandfork import CheckpointType, InvalidArgumentError, NotFoundError, Sandbox, Snapshot

pytestmark = [pytest.mark.root, pytest.mark.checkpoint]

HOLDER = (
    'x=$(head -c 3000000 /dev/urandom | od -x | head -c 4000000); echo "$x" | md5sum > /tmp/orig; '
    "trap 'echo \"$x\" | md5sum > /tmp/now' USR1; while :; do sleep 0.2; done"
)


def wait_for(what: str, ready, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, f"{what} within {timeout:.0f} s"
        time.sleep(0.2)


def holds_the_data(snapshot_id: str) -> None:
    """Restores `snapshot_id` and has the restored holder hash its variable again."""
    child = Sandbox.create(snapshot_id=snapshot_id)
    try:
        pid = child.run("sh", ["-c", "ps | grep 'x=\\$' | grep -v grep | awk '{print $1}' | head -1"]).stdout.strip()
        assert pid, child.run("ps").stdout
        assert child.run("kill", ["-USR1", pid]).exit_code == 0
        wait_for("the holder answers", lambda: child.run("test", ["-s", "/tmp/now"]).exit_code == 0)
        orig, now = (child.read_file(p).decode() for p in ("/tmp/orig", "/tmp/now"))
        assert orig and orig == now, f"{snapshot_id}: the restored data differs"
    finally:
        child.terminate()


def snapshot_dirs(daemon) -> set:
    return {p.name for p in (daemon.data_dir / "snapshots").iterdir()}


def test_a_forks_checkpoint_stores_what_changed_and_restores_whole(daemon, tmp_path: Path) -> None:
    source = Sandbox.create(image="busybox", memory_mb=256)
    fork = None
    a = b = imported = None
    try:
        source.start_process("sh", ["-c", HOLDER])
        wait_for("the holder is ready", lambda: source.run("test", ["-s", "/tmp/orig"]).exit_code == 0)
        a = source.checkpoint(checkpoint_type=CheckpointType.MEMORY)
        fork = Sandbox.create(snapshot_id=a.id)
        b = fork.checkpoint(checkpoint_type=CheckpointType.MEMORY)
        assert b.size_bytes * 5 < a.size_bytes, (a.size_bytes, b.size_bytes)
        assert (daemon.data_dir / "snapshots" / b.id / "memory" / "parent").is_symlink()
        holds_the_data(b.id)

        a_id = a.id
        a.delete()
        a = None
        assert a_id in snapshot_dirs(daemon), "A's files stay while B reads them"
        holds_the_data(b.id)

        exported = b.export(tmp_path / "b.sfs")
        assert exported > 4_000_000, "the export carries the pages read from the parent"
        before = snapshot_dirs(daemon)
        b.delete()
        b = None
        gone = before - snapshot_dirs(daemon)
        assert len(gone) == 2, f"the fork's snapshot and the parent it read from go together: {gone}"
        imported = Snapshot.import_(tmp_path / "b.sfs")
        holds_the_data(imported.id)
    finally:
        for sb in (fork, source):
            if sb is not None:
                sb.terminate()
        for snap in (imported, b, a):
            if snap is not None:
                snap.delete()


def test_a_failed_import_never_removes_files_another_snapshot_reads(daemon, tmp_path: Path) -> None:
    """A deleted snapshot whose files a later checkpoint still reads keeps its directory; an
    import of that snapshot's own file must not take (or, failing, remove) that directory."""
    source = Sandbox.create(image="busybox", memory_mb=256, name=f"keeps-{os.getpid()}")
    a = b = imported = None
    forks = []
    try:
        source.start_process("sh", ["-c", HOLDER])
        wait_for("the holder is ready", lambda: source.run("test", ["-s", "/tmp/orig"]).exit_code == 0)
        a = source.checkpoint(checkpoint_type=CheckpointType.MEMORY)
        # The fork's checkpoint of the source stores what changed and names A as parent.
        result = source.fork(1)
        forks, b = list(result), Snapshot.get(result.snapshot_id)
        a.export(tmp_path / "a.sfs")
        a_id = a.id
        a.delete()
        a = None
        assert a_id in snapshot_dirs(daemon), "A's files stay while a later checkpoint reads them"
        kept = sorted(p.name for p in (daemon.data_dir / "snapshots" / a_id / "memory").iterdir())

        imported = Snapshot.import_(tmp_path / "a.sfs")
        assert imported.id != a_id, "the kept directory is not the import's to take"
        after = sorted(p.name for p in (daemon.data_dir / "snapshots" / a_id / "memory").iterdir())
        assert after == kept, "the import changed the files another snapshot reads"
        holds_the_data(imported.id)

        source.suspend()
        source.resume()
        assert source.run("test", ["-s", "/tmp/orig"]).exit_code == 0
    finally:
        for sb in forks + [source]:
            sb.terminate()
        for snap in (imported, b, a):
            if snap is not None:
                snap.delete()


def test_an_export_relative_to_a_base_carries_only_what_differs(daemon, tmp_path: Path) -> None:
    """A fork's checkpoint exported relative to the snapshot it came from carries its own
    disk layers and changed pages only; it imports wherever that base is (found by content,
    here after the base itself went and came back through its own file) and restores
    whole; without the base it is refused, naming it, and nothing is left behind."""
    source = Sandbox.create(image="busybox", memory_mb=256)
    fork = None
    a = b = a2 = b2 = None
    try:
        source.start_process("sh", ["-c", HOLDER])
        wait_for("the holder is ready", lambda: source.run("test", ["-s", "/tmp/orig"]).exit_code == 0)
        a = source.checkpoint(checkpoint_type=CheckpointType.MEMORY)
        a.export(tmp_path / "a.sfs")
        fork = Sandbox.create(snapshot_id=a.id)
        fork.write_file("/root/fork-note", b"written by the fork")
        b = fork.checkpoint(checkpoint_type=CheckpointType.MEMORY)
        full = b.export(tmp_path / "b-full.sfs")
        relative = b.export(tmp_path / "b-rel.sfs", base=a)
        assert relative * 5 < full, (relative, full)

        with pytest.raises(InvalidArgumentError, match="cannot be exported relative to"):
            a.export(tmp_path / "wrong.sfs", base=b)
        assert not (tmp_path / "wrong.sfs").exists()

        a_id = a.id
        for snap in (b, a):
            snap.delete()
        a = b = None
        before = snapshot_dirs(daemon)
        with pytest.raises(NotFoundError, match=f"relative to snapshot {a_id}"):
            Snapshot.import_(tmp_path / "b-rel.sfs")
        assert snapshot_dirs(daemon) == before, "a refused import leaves nothing"

        a2 = Snapshot.import_(tmp_path / "a.sfs")
        b2 = Snapshot.import_(tmp_path / "b-rel.sfs")
        assert (daemon.data_dir / "snapshots" / b2.id / "memory" / "parent").is_symlink()
        holds_the_data(b2.id)
        child = Sandbox.create(snapshot_id=b2.id)
        try:
            assert child.read_file("/root/fork-note") == b"written by the fork"
        finally:
            child.terminate()
        # The base goes only once nothing reads it: deleting it first keeps its files.
        a2_id = a2.id
        a2.delete()
        a2 = None
        assert a2_id in snapshot_dirs(daemon)
        holds_the_data(b2.id)
    finally:
        for sb in (fork, source):
            if sb is not None:
                sb.terminate()
        for snap in (b2, a2, b, a):
            if snap is not None:
                snap.delete()
