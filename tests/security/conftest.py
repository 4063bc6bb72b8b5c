"""Fixtures of the escape-and-abuse suite: one real daemon per session, a host marker
file, a neighbour sandbox, and the bookkeeping of attempts behind docs/SECURITY.md.

Every test runs attacks from inside a busybox sandbox (root inside it) and records each
attempt with ``attempts.refused(what, refused, detail)``. After every test the suite
checks that the host marker file is unchanged, that the neighbour sandbox still answers
exec and keeps its file, and that the daemon is alive.

``--security-report=PATH`` writes the Markdown report (docs/SECURITY.md) at the end.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, List

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "sdk" / "python" / "src"), str(REPO / "sdk" / "python" / "tests"), str(Path(__file__).parent)]

from _daemon import Daemon, daemon_binary, implements_serve, start_daemon, tear_down, url_in_env, wait_healthy  # noqa: E402

# Small enough to test the 413 quickly.
MAX_UPLOAD_BYTES = 8 << 20
RESULTS: List[dict] = []


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--security-report", default=None, help="write the Markdown report of the suite here")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "promise(name): the promise of docs/SECURITY.md a test enforces")


@dataclass
class Attempts:
    """The attempts of one test; each must be refused."""

    test: str
    promise: str
    items: List[dict] = field(default_factory=list)

    def refused(self, what: str, refused: bool, detail: str = "") -> None:
        self.items.append({"what": what, "refused": bool(refused), "detail": detail[-400:]})

    def failures(self) -> List[str]:
        return [f"NOT REFUSED: {i['what']}: {i['detail']}" for i in self.items if not i["refused"]]


@dataclass
class Host:
    """What the tests own on the host: a temp dir with a marker file."""

    root: Path
    marker: Path
    marker_text: bytes

    def marker_digest(self) -> str:
        return hashlib.sha256(self.marker.read_bytes()).hexdigest()


@pytest.fixture(scope="session")
def daemon() -> Iterator[Daemon]:
    binary = daemon_binary()
    if binary is None or not implements_serve(binary):
        pytest.skip("the sandfork daemon is not built (make build)")
    root = Path(tempfile.mkdtemp(prefix="sfsec-"))
    # The operator opens the guarded addresses the egress probes' fake hosts hold, and only
    # those (test_review_findings.py, FAKE_TARGETS): an allow_out reaches no other.
    guarded = ["169.254.169.254/32", "10.213.77.0/24", "100.127.77.0/24", "172.29.77.0/24", "192.0.0.0/24", "192.168.213.0/24", "198.19.213.0/24"]
    (root / "config.toml").write_text(f"max_upload_bytes = {MAX_UPLOAD_BYTES}\nallow_out_guarded = {json.dumps(guarded)}\n")
    d = start_daemon(binary, ["--config", str(root / "config.toml")], root=root)
    try:
        wait_healthy(d)
        with url_in_env(d):
            yield d
    finally:
        problems = tear_down(d)
        assert not problems, "after the suite, the daemon left behind:\n" + "\n".join(problems)


@pytest.fixture(scope="session")
def host() -> Iterator[Host]:
    root = Path(tempfile.mkdtemp(prefix="sfsec-host-"))
    marker = root / "secret" / "marker.txt"
    marker.parent.mkdir()
    text = f"host-secret-{secrets.token_hex(16)}\n".encode()
    marker.write_bytes(text)
    marker.chmod(0o644)
    yield Host(root, marker, text)
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def neighbour(daemon: Daemon) -> Iterator["object"]:
    """A sandbox that must stay unharmed by every attack; keeps a file and a process."""
    from sandfork import Sandbox

    with Sandbox.create(memory_mb=128, allow_internet_access=True) as sb:
        token = secrets.token_hex(8)
        sb.write_file("/home/keep.txt", token)
        proc = sb.start_process(["sleep", "100000"])
        sb.keep_token = token  # type: ignore[attr-defined]
        sb.keep_pid = proc.pid  # type: ignore[attr-defined]
        yield sb


def neighbour_problems(sb: "object") -> List[str]:
    from sandfork import SandforkError

    try:
        r = sb.run(["cat", "/home/keep.txt"], timeout=60)  # type: ignore[attr-defined]
    except SandforkError as e:
        return [f"the neighbour no longer answers exec: {e!r}"]
    problems = []
    if r.stdout.strip() != sb.keep_token:  # type: ignore[attr-defined]
        problems.append(f"the neighbour's file changed: {r.stdout!r} {r.stderr!r}")
    if not sb.get_process(sb.keep_pid).is_running():  # type: ignore[attr-defined]
        problems.append("the neighbour's background process died")
    return problems


@pytest.fixture
def attempts(request: pytest.FixtureRequest, daemon: Daemon, host: Host, neighbour: "object") -> Iterator[Attempts]:
    marker = request.node.get_closest_marker("promise")
    rec = Attempts(request.node.nodeid, marker.args[0] if marker else "other")
    digest = host.marker_digest()
    yield rec
    harm = []
    if daemon.process.poll() is not None:
        harm.append(f"the daemon died:\n{daemon.log_tail()}")
    if not host.marker.exists() or host.marker_digest() != digest:
        harm.append("the host marker file changed")
    if not harm:
        harm += neighbour_problems(neighbour)
    rec.refused("afterwards: host marker unchanged, neighbour and daemon unharmed", not harm, "; ".join(harm))
    xfail = request.node.get_closest_marker("xfail")
    doc = (request.node.function.__doc__ or "").strip()
    RESULTS.append({"test": rec.test, "promise": rec.promise, "items": rec.items, "doc": doc, "xfail": xfail.kwargs.get("reason") if xfail else None})
    assert not harm, "\n".join(harm)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """Fails the test (in its call phase, so that xfail applies) when an attempt was not refused."""
    result = yield
    rec = getattr(item, "funcargs", {}).get("attempts")
    if rec is not None and rec.failures():
        raise AssertionError("\n".join(rec.failures()))
    return result


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    out = session.config.getoption("--security-report")
    if not out:
        return
    from report import render

    Path(out).write_text(render(RESULTS, exitstatus))
    print(f"\nwrote {out}")


@pytest.fixture
def sandbox(daemon: Daemon) -> Iterator["object"]:
    """A fresh attacker sandbox (busybox, root inside), terminated after the test."""
    from sandfork import Sandbox

    with Sandbox.create(memory_mb=128, allow_internet_access=False) as sb:
        yield sb


def sh(sb: "object", script: str, timeout: float = 60, **kw: object) -> "object":
    """Runs a shell script inside the sandbox; returns the CommandResult."""
    return sb.run(["sh", "-c", script], timeout=timeout, **kw)  # type: ignore[attr-defined]


def out_of(r: "object") -> str:
    return f"exit={r.exit_code} out={r.stdout[-300:]!r} err={r.stderr[-300:]!r}"  # type: ignore[attr-defined]
