"""Starting and stopping a real sandfork daemon for the tests, and checking what it left behind.

The daemon binary is ``$SANDFORK_BIN``, else ``$CARGO_TARGET_DIR/debug/sandfork``,
else ``<repo>/target/debug/sandfork``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, List, Mapping, Optional, Sequence

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
    token: Optional[str] = None

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


def implements_serve(binary: Path, *options: str) -> bool:
    """True when ``binary serve --help`` documents the options the fixture uses."""
    try:
        out = subprocess.run([str(binary), "serve", "--help"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    text = out.stdout + out.stderr
    return all(opt in text for opt in ("--data-dir", "--socket", *options))


def _agent_env(extra: Optional[Mapping[str, str]] = None) -> dict:
    """The daemon's environment (the binary carries its own agent and disk server)."""
    env = dict(os.environ)
    env.setdefault("RUST_LOG", "info")
    env.update(extra or {})
    return env


def wait_healthy(daemon: Daemon) -> None:
    from sandfork import Client, SandforkError

    client = Client(url=daemon.url, token=daemon.token or "", timeout=5)
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


def start_daemon(
    binary: Path,
    extra_args: Sequence[str] = (),
    root: Optional[Path] = None,
    default_image: Optional[str] = "busybox",
    env: Optional[Mapping[str, str]] = None,
) -> Daemon:
    """Starts ``binary serve`` on a fresh data dir (under ``root``, else a new temp dir).

    Sandboxes created without an image get ``default_image``: busybox, which builds in
    seconds, unless a suite asks for the daemon's own default (``None``: python)."""
    if default_image:
        extra_args = [*extra_args, "--default-image", default_image]
    # A short path: Unix socket paths are limited to 107 bytes.
    root = root or Path(tempfile.mkdtemp(prefix="sfsdk-"))
    data_dir, sock, log = root / "data", root / "s.sock", root / "daemon.log"
    data_dir.mkdir(exist_ok=True)
    with open(log, "ab") as out:
        process = subprocess.Popen(
            [str(binary), "serve", "--data-dir", str(data_dir), "--socket", str(sock), *extra_args],
            stdout=out, stderr=subprocess.STDOUT, env=_agent_env(env), start_new_session=True,
        )  # fmt: skip
    return Daemon(f"unix://{sock}", root, data_dir, sock, log, process)


def terminate_leftovers(daemon: Daemon) -> List[str]:
    """Terminates every sandbox still live (running sandboxes outlive a daemon stop by
    design, to be re-adopted); returns their ids."""
    from sandfork import Client, Sandbox, SandforkError

    client = Client(url=daemon.url, token=daemon.token or "")
    try:
        live = [s for s in Sandbox.list(client=client) if s.status not in ("terminated", "failed")]
    except SandforkError:
        return []
    for info in live:
        try:
            Sandbox(info.id, client=client).terminate()
        except SandforkError:
            pass
    return [s.id for s in live]


def stop_daemon(daemon: Daemon) -> None:
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


def check_nothing_leaked(daemon: Daemon) -> None:
    leaks = leaks_of(daemon)
    assert not leaks, "the daemon left these behind after SIGTERM:\n" + "\n".join(leaks)


def leaks_of(daemon: Daemon) -> List[str]:
    """Containers, mounts and loop devices the daemon's data dir still has."""
    return leftover_containers(daemon.data_dir) + leftover_mounts(daemon.root) + leftover_loop_devices(daemon.root)


@contextmanager
def url_in_env(daemon: Daemon) -> Iterator[Daemon]:
    """Points ``SANDFORK_URL`` (what the SDK connects to) at ``daemon`` while in the block."""
    old = os.environ.get("SANDFORK_URL")
    os.environ["SANDFORK_URL"] = daemon.url
    try:
        yield daemon
    finally:
        if old is None:
            os.environ.pop("SANDFORK_URL", None)
        else:
            os.environ["SANDFORK_URL"] = old


def tear_down(daemon: Daemon) -> List[str]:
    """Stops ``daemon`` and returns what it left behind; its directory is removed unless
    something was left or ``SANDFORK_TEST_KEEP`` is set."""
    problems = clean_up_after(daemon)
    if leaks_of(daemon) or os.environ.get("SANDFORK_TEST_KEEP"):
        print(f"\nkept the daemon's directory {daemon.root} (log: {daemon.log})")
    else:
        shutil.rmtree(daemon.root, ignore_errors=True)
    return problems


def clean_up_after(daemon: Daemon) -> List[str]:
    """Stops the daemon and returns what it leaked; if anything, restarts it on the same
    data dir so that it re-adopts and terminates what is left, then stops it again."""
    left = terminate_leftovers(daemon) if daemon.process.poll() is None else []
    stop_daemon(daemon)
    leaks = leaks_of(daemon)
    if leaks:
        binary = daemon_binary()
        if binary is not None:
            again = start_daemon(binary, root=daemon.root)
            try:
                wait_healthy(again)
                terminate_leftovers(again)
            finally:
                stop_daemon(again)
    return [f"sandbox left running by the tests: {i}" for i in left] + leaks
