"""Fixtures: a real sandfork daemon on a temporary data dir, started once per session.

The daemon binary is ``$SANDFORK_BIN``, else ``$CARGO_TARGET_DIR/debug/sandfork``,
else ``<repo>/target/debug/sandfork``. Tests that need it skip, with the reason,
when it has not been built. On teardown the daemon gets SIGTERM and the
fixture checks that it left no container, mount or loop device behind.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, List, Optional

import pytest

REPO = Path(__file__).resolve().parents[3]
HEALTH_TIMEOUT = 60.0
STOP_TIMEOUT = 60.0


@dataclass
class Daemon:
    """A daemon started for the tests."""

    url: str
    root: Path
    data_dir: Path
    socket: Path
    log: Path
    process: subprocess.Popen

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def daemon_binary() -> Optional[Path]:
    """Where the daemon binary is expected, or ``None`` when it is not built."""
    if os.environ.get("SANDFORK_BIN"):
        candidates = [Path(os.environ["SANDFORK_BIN"])]
    else:
        target = Path(os.environ.get("CARGO_TARGET_DIR") or REPO / "target")
        candidates = [target / "debug" / "sandfork", REPO / "target" / "debug" / "sandfork"]
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return path
    return None


def _implements_serve(binary: Path) -> bool:
    """True when ``binary serve --help`` documents the options the fixture uses."""
    try:
        out = subprocess.run([str(binary), "serve", "--help"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    text = out.stdout + out.stderr
    return "--data-dir" in text and "--socket" in text


def _agent_env() -> dict:
    """The daemon's environment, pointing it at the static agent when make built one."""
    env = dict(os.environ)
    if "SANDFORK_AGENT_BIN" not in env:
        target = Path(env.get("CARGO_TARGET_DIR") or REPO / "target")
        agent = target / "x86_64-unknown-linux-gnu" / "debug" / "sandfork-agent"
        if agent.is_file():
            env["SANDFORK_AGENT_BIN"] = str(agent)
    env.setdefault("RUST_LOG", "info")
    return env


def _wait_healthy(daemon: Daemon) -> None:
    from sandfork import Client, SandforkError

    client = Client(url=daemon.url, timeout=5)
    deadline = time.monotonic() + HEALTH_TIMEOUT
    while time.monotonic() < deadline:
        if daemon.process.poll() is not None:
            raise RuntimeError(f"the daemon exited with {daemon.process.returncode} before it was healthy:\n{daemon.log_tail()}")
        try:
            if client.request_json("GET", "/v1/health").get("status") == "ok":
                return
        except SandforkError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"the daemon was not healthy within {HEALTH_TIMEOUT:g}s:\n{daemon.log_tail()}")


def _start(binary: Path) -> Daemon:
    # A short path: Unix socket paths are limited to 107 bytes.
    root = Path(tempfile.mkdtemp(prefix="sfsdk-"))
    data_dir, sock, log = root / "data", root / "s.sock", root / "daemon.log"
    data_dir.mkdir()
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [str(binary), "serve", "--data-dir", str(data_dir), "--socket", str(sock)],
            stdout=out, stderr=subprocess.STDOUT, env=_agent_env(), start_new_session=True,
        )  # fmt: skip
    return Daemon(f"unix://{sock}", root, data_dir, sock, log, process)


def _stop(daemon: Daemon) -> None:
    if daemon.process.poll() is None:
        daemon.process.send_signal(signal.SIGTERM)
        try:
            daemon.process.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            daemon.process.kill()
            daemon.process.wait()
            raise AssertionError(f"the daemon did not stop within {STOP_TIMEOUT:g}s of SIGTERM:\n{daemon.log_tail()}")


def leftover_mounts(root: Path) -> List[str]:
    """Mount points under ``root`` still present in this mount namespace."""
    prefix = str(root) + "/"
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mount_point = line.split()[4].replace("\\040", " ")
            if mount_point.startswith(prefix) or mount_point == str(root):
                found.append(mount_point)
    return found


def leftover_loop_devices(root: Path) -> List[str]:
    """Loop devices whose backing file lies under ``root``."""
    found = []
    for backing in Path("/sys/block").glob("loop*/loop/backing_file"):
        try:
            target = backing.read_text().strip()
        except OSError:
            continue
        if target.startswith(str(root) + "/"):
            found.append(f"{backing.parts[3]} -> {target}")
    return found


def runc_roots(data_dir: Path) -> List[Path]:
    """Directories under the data dir that look like a runc state root."""
    roots = [p for p in data_dir.rglob("runc") if p.is_dir()]
    return [r for r in roots if any((c / "state.json").exists() for c in r.iterdir() if c.is_dir())] or roots


def leftover_containers(data_dir: Path) -> List[str]:
    """Containers runc still lists in any runc root under the data dir."""
    if shutil.which("runc") is None:
        return []
    found = []
    for root in runc_roots(data_dir):
        out = subprocess.run(["runc", "--root", str(root), "list", "--format", "json"], capture_output=True, text=True)
        if out.returncode == 0 and out.stdout.strip() not in ("", "null"):
            found += [f"{c['id']} ({c['status']}) in {root}" for c in json.loads(out.stdout) or []]
    return found


def _check_nothing_leaked(daemon: Daemon) -> None:
    leaks = leftover_containers(daemon.data_dir) + leftover_mounts(daemon.root) + leftover_loop_devices(daemon.root)
    assert not leaks, "the daemon left these behind after SIGTERM:\n" + "\n".join(leaks)


@pytest.fixture(scope="session")
def daemon() -> Iterator[Daemon]:
    """The daemon, with ``SANDFORK_URL`` pointing at it for the whole session."""
    binary = daemon_binary()
    if binary is None:
        pytest.skip("the sandfork daemon is not built (cargo build -p sandfork-cli, or set SANDFORK_BIN)")
    if not _implements_serve(binary):
        pytest.skip(f"{binary} does not implement `serve --data-dir --socket` yet")
    d = _start(binary)
    old_url = os.environ.get("SANDFORK_URL")
    try:
        _wait_healthy(d)
        os.environ["SANDFORK_URL"] = d.url
        yield d
    finally:
        if old_url is None:
            os.environ.pop("SANDFORK_URL", None)
        else:
            os.environ["SANDFORK_URL"] = old_url
        try:
            _stop(d)
            _check_nothing_leaked(d)
        finally:
            shutil.rmtree(d.root, ignore_errors=True)


@pytest.fixture(scope="session")
def openapi(daemon: Daemon) -> dict:
    """The daemon's OpenAPI document."""
    from sandfork import Client

    return Client(url=daemon.url).request_json("GET", "/v1/openapi.json") or {}


@pytest.fixture(scope="session")
def checkpoint_routes(openapi: dict) -> None:
    """Skips unless the daemon serves the checkpoint, snapshot and fork routes."""
    paths = set((openapi.get("paths") or {}).keys())
    needed = ["/v1/sandboxes/{id}/checkpoint", "/v1/snapshots", "/v1/snapshots/{id}/fork"]
    missing = [p for p in needed if not _has_route(paths, p)]
    if missing:
        pytest.skip(f"the daemon does not serve the checkpoint routes yet (missing from /v1/openapi.json: {', '.join(missing)})")


def _has_route(paths: set, wanted: str) -> bool:
    """True when ``wanted`` is in ``paths``, whatever the path parameters are called."""
    shape = [seg if not seg.startswith("{") else "{}" for seg in wanted.split("/")]
    for path in paths:
        segs = [seg if not seg.startswith("{") else "{}" for seg in path.split("/")]
        if segs == shape:
            return True
    return False


@pytest.fixture(scope="module")
def sandbox(daemon: Daemon) -> Iterator["object"]:
    """One sandbox shared by the tests of a module."""
    from sandfork import Sandbox

    with Sandbox.create(memory_mb=256) as sb:
        yield sb
