"""Fixtures of the checkpoint state suite: one real daemon on a temporary data dir for the
session, with ``SANDFORK_URL`` pointing at it.

Needs root (runc, loop devices, CRIU), a built daemon (``$SANDFORK_BIN``, else
``$CARGO_TARGET_DIR/debug/sandfork``, else ``target/debug/sandfork``) and CRIU; the tests
skip with the reason otherwise. On teardown every sandbox still live is terminated, the
daemon gets SIGTERM, and the session fails if a test left a sandbox or a snapshot behind,
or if the daemon left a container, mount, loop device, network namespace or cgroup (it is
then restarted on the same data dir so that it removes them). ``SANDFORK_TEST_KEEP=1``
keeps the daemon's directory and log.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import sys
from pathlib import Path
from typing import Iterator, List

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "sdk" / "python" / "src"), str(REPO / "sdk" / "python" / "tests")]

from _daemon import Daemon, daemon_binary, implements_serve, start_daemon, tear_down, url_in_env, wait_healthy  # noqa: E402


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "root: needs root, runc and CRIU (real sandboxes and memory checkpoints)")
    config.addinivalue_line("markers", "checkpoint: needs the daemon's checkpoint, snapshot and fork routes")


@pytest.fixture(scope="session")
def daemon() -> Iterator[Daemon]:
    if os.geteuid() != 0:
        pytest.skip("needs root (runc, loop devices, CRIU)")
    if shutil.which("criu") is None:
        pytest.skip("needs CRIU >= 4.2 (scripts/setup installs it)")
    binary = daemon_binary()
    if binary is None or not implements_serve(binary):
        pytest.skip("the sandfork daemon is not built (cargo build -p sandfork, or set SANDFORK_BIN)")
    d = start_daemon(binary)
    problems: List[str] = []
    try:
        wait_healthy(d)
        with url_in_env(d):
            yield d
            problems += leftovers_of_tests(d)
    finally:
        ids = sandbox_ids(d)
        problems += tear_down(d)
        problems += host_leftovers(ids)
        assert not problems, "after the checkpoint suite:\n" + "\n".join(problems)


def leftovers_of_tests(d: Daemon) -> List[str]:
    """Sandboxes and snapshots the tests did not remove themselves."""
    from sandfork import Client, Sandbox, Snapshot

    client = Client(url=d.url)
    live = [s.id for s in Sandbox.list(client=client) if s.status not in ("terminated", "failed")]
    snaps = [s.id for s in Snapshot.list(client=client)]
    return [f"sandbox left running by a test: {i}" for i in live] + [f"snapshot left by a test: {i}" for i in snaps]


def sandbox_ids(d: Daemon) -> List[str]:
    """Every sandbox id the daemon's database recorded (read before its directory goes)."""
    db = d.data_dir / "state.db"
    if not db.exists():
        return []
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        return [row[0] for row in con.execute("SELECT id FROM sandboxes")]
    finally:
        con.close()


def host_leftovers(ids: List[str]) -> List[str]:
    """Network namespaces and cgroups of those sandboxes still on the host."""
    found = []
    cgroup_roots = [Path("/sys/fs/cgroup"), *(p for p in Path("/sys/fs/cgroup").iterdir() if p.is_dir())]
    for sid in ids:
        if Path(f"/run/sandfork/netns/sf-{sid}").exists():
            found.append(f"network namespace sf-{sid}")
        found += [f"cgroup {root / 'sandfork' / sid}" for root in cgroup_roots if (root / "sandfork" / sid).is_dir()]
    return found
