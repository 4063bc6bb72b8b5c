"""Fixtures of the fault-tolerance suite: real daemons on their own data dirs, a census of
everything a daemon can leak, and the bookkeeping of faults behind docs/RELIABILITY.md.

A test injects faults and records each with ``faults.injected(kind, survived, detail)``;
``faults.verified_snapshot()`` counts a snapshot restored and checked after a fault, and
``faults.leaks(found)`` records what a census found (any leak fails the test).

``--reliability-report=PATH`` writes the Markdown report (docs/RELIABILITY.md) at the end.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, List, Optional, Sequence

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "sdk" / "python" / "src"), str(REPO / "sdk" / "python" / "tests"), str(Path(__file__).parent)]

from _daemon import Daemon, clean_up_after, daemon_binary, implements_serve, leaks_of, start_daemon, url_in_env, wait_healthy  # noqa: E402

RESULTS: List[dict] = []


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--reliability-report", default=None, help="write the Markdown report of the suite here")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "fault(name): the kind of fault of docs/RELIABILITY.md a test injects")


@dataclass
class Faults:
    """The faults one test injected; each must be survived."""

    test: str
    kind: str
    items: List[dict] = field(default_factory=list)
    snapshots_verified: int = 0
    leaks_found: List[str] = field(default_factory=list)

    def injected(self, what: str, survived: bool, detail: str = "") -> None:
        self.items.append({"what": what, "survived": bool(survived), "detail": detail[-400:]})

    def verified_snapshot(self, n: int = 1) -> None:
        self.snapshots_verified += n

    def leaks(self, found: Sequence[str]) -> None:
        self.leaks_found += list(found)

    def failures(self) -> List[str]:
        bad = [f"NOT SURVIVED: {i['what']}: {i['detail']}" for i in self.items if not i["survived"]]
        return bad + [f"LEAKED: {x}" for x in self.leaks_found]


@pytest.fixture
def faults(request: pytest.FixtureRequest) -> Iterator[Faults]:
    marker = request.node.get_closest_marker("fault")
    rec = Faults(request.node.nodeid, marker.args[0] if marker else "other")
    yield rec
    doc = (request.node.function.__doc__ or "").strip()
    RESULTS.append({"test": rec.test, "kind": rec.kind, "items": rec.items, "doc": doc,
                    "snapshots": rec.snapshots_verified, "leaks": rec.leaks_found})  # fmt: skip


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """Fails the test when a recorded fault was not survived or a leak was found."""
    result = yield
    rec = getattr(item, "funcargs", {}).get("faults")
    if rec is not None and rec.failures():
        raise AssertionError("\n".join(rec.failures()))
    return result


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    out = session.config.getoption("--reliability-report")
    if not out:
        return
    from report import render

    Path(out).write_text(render(RESULTS, exitstatus))
    print(f"\nwrote {out}")


def new_daemon(extra_args: Sequence[str] = (), root: Optional[Path] = None, config: str = "", pool: bool = False) -> Daemon:
    """Starts a daemon on a fresh data dir (or on ``root``'s, to restart one) and waits for it.

    The pool of ready forks is off unless ``pool``: these checks count every sandbox on the
    host against those the API lists, and the pool's parked forks are not listed (a test of
    its own kills the daemon while the pool fills)."""
    binary = daemon_binary()
    if binary is None or not implements_serve(binary):
        pytest.skip("the sandfork daemon is not built (make build)")
    root = root or Path(tempfile.mkdtemp(prefix="sfrel-"))
    args = list(extra_args) + ([] if pool else ["--pool-size", "0"])
    if config:
        (root / "config.toml").write_text(config)
        args += ["--config", str(root / "config.toml")]
    d = start_daemon(binary, args, root=root)
    wait_healthy(d)
    return d


@pytest.fixture
def daemon() -> Iterator[Daemon]:
    """A daemon of its own for one test; stopped, checked for leaks and removed after it."""
    d = new_daemon()
    try:
        with url_in_env(d):
            yield d
    finally:
        finish(d)


def finish(d: Daemon) -> None:
    """Stops ``d``, fails on anything it left behind, and removes its directory."""
    problems = clean_up_after(d) if d.process.poll() is None else leaks_of(d)
    problems += census(d)
    if not problems and not os.environ.get("SANDFORK_TEST_KEEP"):
        shutil.rmtree(d.root, ignore_errors=True)
    assert not problems, f"the daemon left behind (kept {d.root}):\n" + "\n".join(problems)


def known_sandbox_ids(d: Daemon) -> List[str]:
    """Every sandbox id the daemon's database has ever recorded."""
    db = d.data_dir / "state.db"
    if not db.exists():
        return []
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        return [row[0] for row in con.execute("SELECT id FROM sandboxes")]
    finally:
        con.close()


def census(d: Daemon, live: Sequence[str] = ()) -> List[str]:
    """What the daemon's sandboxes (except ``live`` ones) still hold on the host: containers,
    mounts and loop devices under its directory, network namespaces, cgroups, disk servers."""
    found = leaks_of(d)
    for sid in set(known_sandbox_ids(d)) - set(live):
        if Path(f"/run/sandfork/netns/sf-{sid}").exists():
            found.append(f"network namespace sf-{sid}")
        hierarchies = [Path("/sys/fs/cgroup"), *Path("/sys/fs/cgroup").iterdir()]
        found += [f"cgroup {h / 'sandfork' / sid}" for h in hierarchies if (h / "sandfork" / sid).is_dir()]
    found += [f"process {pid}: {cmd}" for pid, cmd in processes_under(d.root) if not live]
    return found


def processes_under(root: Path) -> List[tuple]:
    """Processes (other than the daemon) whose command line names ``root``."""
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(root) in cmd and not _is_daemon(cmd):
            out.append((int(p.name), cmd.strip()))
    return out


def _is_daemon(cmd: str) -> bool:
    """``sandfork serve ...`` (a disk server, ``sandfork-disk serve ...``, is no daemon)."""
    words = cmd.split()
    return len(words) > 1 and Path(words[0]).name == "sandfork" and words[1] == "serve"


def leaks_except(d: Daemon, live: Sequence[str]) -> List[str]:
    """What the daemon's sandboxes other than ``live`` ones hold on the host. Unlike
    :func:`census`, it can run while ``live`` sandboxes still run (between faults): their
    containers, mounts, loop devices and processes are told apart by their id."""
    keep = set(live)

    def mine(text: str) -> bool:
        return any(sid in text for sid in keep)

    found = [x for x in leaks_of(d) if not mine(x)]
    for sid in set(known_sandbox_ids(d)) - keep:
        if Path(f"/run/sandfork/netns/sf-{sid}").exists():
            found.append(f"network namespace sf-{sid}")
        hierarchies = [Path("/sys/fs/cgroup"), *Path("/sys/fs/cgroup").iterdir()]
        found += [f"cgroup {h / 'sandfork' / sid}" for h in hierarchies if (h / "sandfork" / sid).is_dir()]
    found += [f"process {pid}: {cmd}" for pid, cmd in processes_under(d.root) if not mine(cmd)]
    found += [f"address lease {index} of {owner}" for index, owner in leases_of(d) if not mine(owner)]
    return found


def leases_of(d: Daemon) -> List[tuple]:
    """The network address leases (host-wide, one file per address) that sandboxes of
    ``d`` hold: (index, owner)."""
    found = []
    for lease in Path("/run/sandfork/leases").glob("*"):
        try:
            owner = lease.read_text().strip()
        except OSError:
            continue
        if owner.startswith(str(d.data_dir) + "/"):
            found.append((lease.name, owner))
    return found
