"""Restores are lazy: CRIU's lazy-pages daemon serves the restored memory over
userfaultfd, every page arrives, and the daemon goes when its work is done.

The holder (test_incremental.py's) keeps 4 MB of random data in a live shell variable and
hashes it again on SIGUSR1 inside the restored copy, so a page served wrong or not at all
shows as a different hash. A python process holding 300 MB (test_memory_sharing.py's
holder) is checkpointed again the moment it is restored.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from test_incremental import HOLDER, holds_the_data, wait_for
from test_memory_sharing import PROGRAM, ask

from sandfork import CheckpointType, Sandbox

pytestmark = [pytest.mark.root, pytest.mark.checkpoint]

# Large enough that the lazy-pages daemon is still copying when the restore returns
# (≈ 0.3 s for 300 MB here).
MB = 300


def lazy_daemons(snapshot_id: str) -> list:
    """`criu lazy-pages` processes serving the images of `snapshot_id`."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"lazy-pages" in argv and any(snapshot_id.encode() in a for a in argv):
            found.append(proc.name)
    return found


def test_a_restore_is_served_lazily_and_whole(daemon) -> None:
    source = Sandbox.create(image="busybox", memory_mb=256)
    snap = None
    try:
        source.start_process("sh", ["-c", HOLDER])
        wait_for("the holder is ready", lambda: source.run("test", ["-s", "/tmp/orig"]).exit_code == 0)
        snap = source.checkpoint(checkpoint_type=CheckpointType.MEMORY)
        child = Sandbox.create(snapshot_id=snap.id)
        try:
            logs = list((daemon.data_dir / "sandboxes" / child.id).rglob("restore.log"))
            assert logs, "the restore keeps CRIU's log"
            assert "lazy-pages: uffd" in logs[0].read_text(errors="replace"), "CRIU restored lazily"
        finally:
            child.terminate()
        holds_the_data(snap.id)
        deadline = time.monotonic() + 20
        while lazy_daemons(snap.id) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not lazy_daemons(snap.id), "every lazy-pages daemon exits with its work done"
    finally:
        if snap is not None:
            snap.delete()
        source.terminate()


def test_a_checkpoint_right_after_a_lazy_restore_keeps_every_page(daemon) -> None:
    """A page the lazy-pages daemon has not copied yet is absent from the restored
    process; a dump taken then would store it as empty. The checkpoint waits for the copy:
    a snapshot taken the moment the restore returns restores the same data. (Whether the
    copy is still running when the checkpoint starts depends on the machine's speed; the
    wait itself is tested in crates/runtime/src/host/real/lazy.rs.)"""
    source = Sandbox.create(image="python", memory_mb=1024)
    a = b = None
    try:
        source.write_file("/opt/memholder.py", PROGRAM.read_bytes())
        source.start_process("python3", ["/opt/memholder.py", str(MB)])
        wait_for("the holder is ready", lambda: source.run("test", ["-e", "/tmp/mem.ready"]).exit_code == 0, 120)
        original = ask(source, "sum")
        a = source.checkpoint(checkpoint_type=CheckpointType.MEMORY)
        child = Sandbox.create(snapshot_id=a.id)
        try:
            b = child.checkpoint(checkpoint_type=CheckpointType.MEMORY)
        finally:
            child.terminate()
        grandchild = Sandbox.create(snapshot_id=b.id)
        try:
            assert ask(grandchild, "sum") == original, "every page made it into the second snapshot"
        finally:
            grandchild.terminate()
    finally:
        for snap in (b, a):
            if snap is not None:
                snap.delete()
        source.terminate()
