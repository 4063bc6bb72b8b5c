"""Fork admission: a fork of N with room for fewer answers at once, and children of a
memory snapshot are charged what they may hold privately, not their whole limit.

Each test starts a daemon of its own with small caps in its config file (no pool, so
parked forks hold no room): the children that fit start, each child that does not gets
its own ``over_capacity`` error naming what is full and how many of the fork fit, and
nothing waits ``admission_wait_secs`` (set long here, so a wait would show).
See docs/operations.md, admission.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Iterator

import pytest

from _daemon import Daemon, daemon_binary, implements_serve, start_daemon, tear_down, url_in_env, wait_healthy
from sandfork import CapacityError, CheckpointType, Client, Sandbox, Snapshot

pytestmark = [pytest.mark.root, pytest.mark.checkpoint]

LIMIT_MB = 512
WAIT_SECS = 120
# An answer this fast did not wait for room.
AT_ONCE_SECS = 30


@pytest.fixture
def own_daemon(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[Daemon]:
    """A daemon whose config file starts with the test's parameter."""
    if os.geteuid() != 0:
        pytest.skip("needs root (runc, loop devices, CRIU)")
    if shutil.which("criu") is None:
        pytest.skip("needs CRIU >= 4.2 (scripts/setup installs it)")
    binary = daemon_binary()
    if binary is None or not implements_serve(binary, "--config"):
        pytest.skip("the sandfork daemon is not built (cargo build -p sandfork, or set SANDFORK_BIN)")
    config = Path(tmp_path_factory.mktemp("admission")) / "sandfork.toml"
    config.write_text(request.param + f"pool_size = 0\nadmission_wait_secs = {WAIT_SECS}\n")
    d = start_daemon(binary, ["--config", str(config)])
    try:
        wait_healthy(d)
        with url_in_env(d):
            yield d
    finally:
        problems = tear_down(d)
        assert not problems, "after the test, the daemon left behind:\n" + "\n".join(problems)


def fork(client: Client, snapshot: Snapshot, count: int):
    started = time.monotonic()
    result = Snapshot.fork(snapshot.id, count, client=client)
    return result, time.monotonic() - started


def check_refused(result, fit: int, count: int, what: str) -> None:
    assert [c.index for c in result.children] == list(range(count))
    assert len(result) == fit, [(c.index, c.error) for c in result.errors]
    assert [c.index for c in result.errors] == list(range(fit, count))
    for c in result.errors:
        assert isinstance(c.error, CapacityError) and c.error.code == "over_capacity", c.error
        assert what in c.error.message and f"{fit} of the {count} children of this fork fit" in c.error.message, c.error.message
    for sb in result:
        assert sb.run("echo", ["up"]).stdout.strip() == "up"


@pytest.mark.parametrize("own_daemon", ["max_memory_mb = 1024\nfork_memory_charge = 0.25\n"], indirect=True, ids=["memory-cap"])
def test_forks_are_charged_their_private_share_and_refused_at_once(own_daemon: Daemon) -> None:
    client = Client(url=own_daemon.url)
    with Sandbox.create(image="busybox", memory_mb=LIMIT_MB, client=client) as source:
        snapshot = source.checkpoint(checkpoint_type=CheckpointType.MEMORY)
        try:
            # The source holds 512 of the 1024 MiB cap; each child is charged a quarter of
            # its 512 MiB limit: four fit where summed limits would take one.
            with fork(client, snapshot, 6)[0] as result:
                check_refused(result, 4, 6, "Cap on summed memory limits reached")
                assert LIMIT_MB * (1 + len(result)) > 1024, "more than summed limits allow"
                # Room for none: every child refused at once.
                none, took = fork(client, snapshot, 3)
                assert took < AT_ONCE_SECS, f"answered after {took:.1f} s"
                check_refused(none, 0, 3, "Cap on summed memory limits reached")
            # Their room is free again once they are gone.
            with fork(client, snapshot, 2)[0] as again:
                assert len(again) == 2 and not again.errors, again.errors
        finally:
            snapshot.delete()


@pytest.mark.parametrize("own_daemon", ["max_sandboxes = 5\n"], indirect=True, ids=["count-cap"])
def test_a_fork_with_room_for_some_starts_those_and_says_why_not_the_rest(own_daemon: Daemon) -> None:
    client = Client(url=own_daemon.url)
    with Sandbox.create(image="busybox", memory_mb=64, client=client) as source:
        snapshot = source.checkpoint(checkpoint_type=CheckpointType.MEMORY)
        try:
            result, took = fork(client, snapshot, 6)
            with result:
                assert took < AT_ONCE_SECS, f"answered after {took:.1f} s"
                check_refused(result, 4, 6, "Sandbox limit reached: 5 of 5 in use")
        finally:
            snapshot.delete()
