"""Forks share the memory none of them has written, and never see each other's writes.

With page merging on (the daemon's default, ``memory_merge``), every sandbox's processes
are mergeable: the kernel maps pages with equal content once, copy-on-write. A source holds
32 MiB of random bytes; a memory checkpoint is forked twice. The test waits until the
kernel has merged most of the data in both forks, then one fork rewrites every page of
it: that fork's data changes, its sibling's and the source's do not, and the sibling can
write its own afterwards.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import List

import pytest

from sandfork import CheckpointType, Sandbox

pytestmark = [pytest.mark.root, pytest.mark.checkpoint]

PROGRAM = Path(__file__).parent / "programs" / "memholder.py"
MB = 32
PAGES = (MB << 20) // 4096


def ask(sb: Sandbox, cmd: str) -> str:
    r = sb.run("python3", ["/opt/memholder.py", "ask", cmd], timeout=60)
    assert r.exit_code == 0, f"{sb.id}: {r.stdout}{r.stderr}"
    return r.stdout.strip()


def wait_for(what: str, ready, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, f"{what} within {timeout:.0f} s"
        time.sleep(0.5)


def test_forks_share_unwritten_pages_and_never_see_a_siblings_writes(daemon) -> None:
    source = Sandbox.create(image="python", memory_mb=512)
    snapshot = None
    forks: List[Sandbox] = []
    try:
        source.write_file("/opt/memholder.py", PROGRAM.read_bytes())
        source.start_process("python3", ["/opt/memholder.py", str(MB)])
        wait_for("the holder is ready", lambda: source.run("test", ["-e", "/tmp/mem.ready"]).exit_code == 0, 60)
        original = ask(source, "sum")
        snapshot = source.checkpoint(checkpoint_type=CheckpointType.MEMORY)
        result = snapshot.fork(2)
        forks = list(result)
        assert result.ok, "; ".join(f"child {c.index}: {c.error}" for c in result.errors)
        assert [ask(f, "sum") for f in forks] == [original, original]

        wait_for("the kernel merges most of both forks' data",
                 lambda: all(int(ask(f, "merged")) >= PAGES // 2 for f in forks), 120)

        written = ask(forks[0], "write")
        assert written != original
        assert ask(forks[0], "sum") == written
        assert ask(forks[1], "sum") == original, "a fork saw its sibling's writes"
        assert ask(source, "sum") == original, "the source saw a fork's writes"
        assert ask(forks[1], "write") == written  # the same change, made on its own copy
        assert ask(source, "sum") == original
    finally:
        for sb in [*forks, source]:
            sb.terminate()
        if snapshot is not None:
            snapshot.delete()
