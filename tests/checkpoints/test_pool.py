"""The pool of ready forks: a fork handed over from the pool is a fresh fork.

A memory snapshot that has been restored from is hot: the daemon (``pool_size`` 2, its
default) restores forks of it ahead of demand and keeps them frozen. Children taken from
the pool must be what a restore would have made: their own id (in the environment, the
identity file and the hostname), their own env, the snapshot's after-restore hooks run in
each with its own identity, the parent's process alive where it was, and no write of one
child visible to another. A parked fork runs nothing until it is handed over; deleting the
snapshot removes its parked forks from the host.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Dict, Iterable, List, Set

import pytest

from sandfork import CheckpointType, Client, Sandbox

pytestmark = [pytest.mark.root, pytest.mark.checkpoint]

# The parent's process: counts seconds into a file while it runs.
TICKER = "i=0; while :; do i=$((i+1)); echo $i > /tmp/ticks; sleep 0.2; done"
HOOK = {"command": "sh", "args": ["-c", 'echo "$SANDFORK_SANDBOX_ID" >> /tmp/hooked']}


def metrics(daemon) -> Dict[str, float]:
    _, body = Client(url=daemon.url).request("GET", "/metrics")
    found = re.findall(r"^(sandfork_pool_\w+) (\S+)$", body.decode(), re.M)
    return {name: float(value) for name, value in found}


def eventually(what: str, ready, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, f"{what} within {timeout:.0f} s"
        time.sleep(0.2)


def sh(sb: Sandbox, script: str) -> str:
    r = sb.run("sh", ["-c", script])
    assert r.exit_code == 0, f"{sb.id}: {script}: {r.stderr}"
    return r.stdout.strip()


def sandbox_cgroups() -> Set[str]:
    found: Set[str] = set()
    for root in [Path("/sys/fs/cgroup/sandfork"), *Path("/sys/fs/cgroup").glob("*/sandfork")]:
        if root.is_dir():
            found |= {p.name for p in root.iterdir() if p.is_dir()}
    return found


def parked_cgroups(known: Iterable[str], before: Set[str]) -> List[str]:
    """Sandbox cgroups on the host that belong to no sandbox the test knows of (nor to
    anything that was there before it)."""
    return sorted(sandbox_cgroups() - set(known) - before)


def test_forks_from_the_pool_are_fresh_forks(daemon) -> None:
    before = sandbox_cgroups()
    source = Sandbox.create(image="busybox", memory_mb=256)
    snapshot = None
    children: List[Sandbox] = []
    try:
        source.start_process("sh", ["-c", TICKER])
        eventually("the ticker runs", lambda: source.run("test", ["-s", "/tmp/ticks"]).exit_code == 0)
        snapshot = source.checkpoint(checkpoint_type=CheckpointType.MEMORY, hooks=[HOOK])
        at_checkpoint = int(sh(source, "cat /tmp/ticks"))
        hits = metrics(daemon)["sandfork_pool_hits_total"]
        # The first child makes the snapshot hot; the pool then fills behind it.
        children.append(Sandbox.create(snapshot_id=snapshot.id))
        eventually("two forks are parked", lambda: metrics(daemon)["sandfork_pool_forks"] >= 2)
        known = [source.id, children[0].id]
        parked = parked_cgroups(known, before)
        assert len(parked) >= 2, parked
        # Parked for 5 s: a fork that ran meanwhile would have ticked 25 times more.
        time.sleep(5)

        result = snapshot.fork(2, env={"ROLE": "worker"}, per_child=[{"env": {"ROLE": "first"}}])
        assert result.ok, "; ".join(f"child {c.index}: {c.error}" for c in result.errors)
        pooled = list(result)
        children += pooled
        for child in pooled:
            handed_over = int(sh(child, "cat /tmp/ticks"))
            assert handed_over <= at_checkpoint + 12, f"{child.id} ran while parked ({handed_over} ticks)"
        after = metrics(daemon)
        assert after["sandfork_pool_hits_total"] - hits >= 2, after
        assert {c.id for c in pooled} <= set(parked), "both children came from the pool"

        for i, child in enumerate(pooled):
            assert sh(child, "echo $SANDFORK_SANDBOX_ID") == child.id
            assert sh(child, "echo $SANDFORK_FORK_INDEX") == str(i)
            assert sh(child, "echo $ROLE") == ("first" if i == 0 else "worker")
            assert sh(child, "hostname") == child.id
            assert f"SANDFORK_SANDBOX_ID={child.id}" in sh(child, "cat /etc/sandfork/fork")
            # The hook ran once, in this child, with this child's identity.
            assert sh(child, "cat /tmp/hooked") == child.id
            # The parent's ticker was restored and runs again, from where the snapshot had it.
            first = int(sh(child, "cat /tmp/ticks"))
            eventually(f"{child.id}'s ticker runs", lambda: int(sh(child, "cat /tmp/ticks")) > first, 10)

        sh(pooled[0], "echo mine > /tmp/only-first")
        assert pooled[1].run("test", ["-e", "/tmp/only-first"]).exit_code != 0
        assert source.run("test", ["-e", "/tmp/only-first"]).exit_code != 0

        eventually("the pool refills", lambda: metrics(daemon)["sandfork_pool_forks"] >= 2)
        refilled = parked_cgroups([source.id, *(c.id for c in children)], before)
        assert refilled, "refilled forks are on the host"
        snapshot.delete()
        snapshot = None
        eventually("deleting the snapshot empties its shelf", lambda: metrics(daemon)["sandfork_pool_forks"] == 0, 30)
        assert parked_cgroups([source.id, *(c.id for c in children)], before) == []
    finally:
        for sb in [*children, source]:
            sb.terminate()
        if snapshot is not None:
            snapshot.delete()


def test_the_pool_grows_to_the_largest_fork_asked_of_a_snapshot(daemon) -> None:
    # pool_size is 2, but a snapshot forked 5 at a time gets 5 ready: the next fork of 5
    # is served whole from the pool, with no configuration.
    source = Sandbox.create(image="busybox", memory_mb=128)
    snapshot = None
    children: List[Sandbox] = []
    try:
        snapshot = source.checkpoint(checkpoint_type=CheckpointType.MEMORY)
        first = snapshot.fork(5)
        children += list(first)
        assert first.ok, "; ".join(f"child {c.index}: {c.error}" for c in first.errors)
        eventually("five forks are parked", lambda: metrics(daemon)["sandfork_pool_forks"] >= 5, 120)
        hits = metrics(daemon)["sandfork_pool_hits_total"]
        second = snapshot.fork(5)
        children += list(second)
        assert second.ok, "; ".join(f"child {c.index}: {c.error}" for c in second.errors)
        assert metrics(daemon)["sandfork_pool_hits_total"] - hits == 5
        for child in second:
            assert sh(child, "echo $SANDFORK_SANDBOX_ID") == child.id
        snapshot.delete()
        snapshot = None
        eventually("deleting the snapshot empties its shelf", lambda: metrics(daemon)["sandfork_pool_forks"] == 0, 30)
    finally:
        for sb in [*children, source]:
            sb.terminate()
        if snapshot is not None:
            snapshot.delete()
