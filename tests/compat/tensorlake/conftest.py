"""Fixtures of the Tensorlake compatibility suite: the real, unmodified Tensorlake SDKs
(Python and JS, see WIRE.md) run their scenarios against a real daemon.

Isolation. The SDKs call Tensorlake's cloud for any API host but ``localhost`` and
``127.0.0.1`` (WIRE.md §2), so no SDK process ever runs in the machine's own network
namespace: a holder process (``unshare -n``) owns a fresh namespace whose only interface is
loopback, the daemon is started inside it (``nsenter --net``) listening on 127.0.0.1 there,
and every SDK process joins the same namespace. Nothing in it has a route off the machine
(the daemon's sandboxes have no internet either, which these scenarios do not need); a
mistaken cloud call fails at once instead of leaving the machine. The test process itself
stays outside and reaches the daemon over its Unix socket (setup, cleanup, and the overhead
measurement).

Installs. The SDKs live outside the repository (``$SANDFORK_COMPAT_DIR``, default
/var/cache/sandfork/compat): a Python venv with ``tensorlake`` and an npm directory with the
JS package, plus Node 22 from the npm package that ships it (the JS SDK needs Node >= 22).
Missing ones are installed at the first run (the only step that needs the network); a
failed install fails the suite, naming what failed.

After the session every sandbox is terminated and the fixture asserts that nothing leaked
(containers, mounts, loop devices).
"""

from __future__ import annotations

import json
import os
import platform
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, List, Optional

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path[:0] = [str(REPO / "sdk" / "python" / "src"), str(REPO / "sdk" / "python" / "tests")]

from _daemon import Daemon, daemon_binary, implements_serve, tear_down, wait_healthy  # noqa: E402

PY_VERSION = "0.5.161"
JS_VERSION = "0.5.89"
NODE_MAJOR = 22
COMPAT_DIR = Path(os.environ.get("SANDFORK_COMPAT_DIR", "/var/cache/sandfork/compat"))
INSTALL_TIMEOUT = 900
PORT = 7070  # in the suite's own network namespace, so never taken


@dataclass
class Sdks:
    python: Path
    node: Path
    js_dir: Path


def _run(cmd: List[str], what: str, cwd: Optional[Path] = None) -> None:
    try:
        out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=INSTALL_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as e:
        pytest.fail(f"installing {what} failed: {' '.join(cmd)}: {e}", pytrace=False)
    if out.returncode != 0:
        pytest.fail(f"installing {what} failed ({' '.join(cmd)}):\n{out.stdout[-2000:]}{out.stderr[-2000:]}", pytrace=False)


def _output(cmd: List[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""


def ensure_python_sdk() -> Path:
    """A venv holding tensorlake==PY_VERSION; made when missing."""
    venv = COMPAT_DIR / "tensorlake-py"
    py = venv / "bin" / "python"
    probe = [str(py), "-c", "import importlib.metadata as m; print(m.version('tensorlake'))"]
    if py.exists() and _output(probe) == PY_VERSION:
        return py
    COMPAT_DIR.mkdir(parents=True, exist_ok=True)
    if not py.exists():
        made = subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True, text=True)
        if made.returncode != 0:
            # A distribution python without its venv module's pip: a bare venv, filled by
            # the outer pip.
            shutil.rmtree(venv, ignore_errors=True)
            _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], "a Python venv")
    if (venv / "bin" / "pip").exists():
        _run([str(venv / "bin" / "pip"), "install", "-q", f"tensorlake=={PY_VERSION}"], "the Tensorlake Python SDK")
    else:
        _run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", f"tensorlake=={PY_VERSION}"], "the Tensorlake Python SDK")
    if _output(probe) != PY_VERSION:
        pytest.fail(f"the Tensorlake Python SDK {PY_VERSION} is not importable from {py} after installing it", pytrace=False)
    return py


def _npm_version(package_json: Path) -> str:
    try:
        return json.loads(package_json.read_text()).get("version", "")
    except (OSError, ValueError):
        return ""


def _npm_install(directory: Path, spec: str, what: str) -> None:
    npm = shutil.which("npm")
    if npm is None:
        pytest.fail(f"installing {what} needs npm, which is not on PATH", pytrace=False)
    directory.mkdir(parents=True, exist_ok=True)
    if not (directory / "package.json").exists():
        _run([npm, "init", "-y"], what, cwd=directory)
    _run([npm, "install", "--no-audit", "--no-fund", "--loglevel=error", spec], what, cwd=directory)


def ensure_node() -> Path:
    """Node NODE_MAJOR (the JS SDK's undici needs it), from the npm package that ships it."""
    arch = {"x86_64": "x64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
    package = f"node-linux-{arch}"
    directory = COMPAT_DIR / "node22"
    node = directory / "node_modules" / package / "bin" / "node"
    if not _output([str(node), "--version"]).startswith(f"v{NODE_MAJOR}."):
        _npm_install(directory, f"{package}@{NODE_MAJOR}", f"Node {NODE_MAJOR}")
    if not _output([str(node), "--version"]).startswith(f"v{NODE_MAJOR}."):
        pytest.fail(f"Node {NODE_MAJOR} does not run from {node} after installing it", pytrace=False)
    return node


def ensure_js_sdk() -> Path:
    directory = COMPAT_DIR / "tensorlake-js"
    manifest = directory / "node_modules" / "tensorlake" / "package.json"
    if _npm_version(manifest) != JS_VERSION:
        _npm_install(directory, f"tensorlake@{JS_VERSION}", "the Tensorlake JS SDK")
    if _npm_version(manifest) != JS_VERSION:
        pytest.fail(f"the Tensorlake JS SDK {JS_VERSION} is not in {directory} after installing it", pytrace=False)
    return directory


@pytest.fixture(scope="session")
def sdks() -> Sdks:
    return Sdks(python=ensure_python_sdk(), node=ensure_node(), js_dir=ensure_js_sdk())


@dataclass
class LoopbackNamespace:
    """A network namespace with loopback alone, held open by a sleeping process."""

    holder: subprocess.Popen

    @property
    def path(self) -> str:
        return f"/proc/{self.holder.pid}/ns/net"

    def enter(self) -> List[str]:
        """The command prefix that runs a program inside it."""
        return ["nsenter", f"--net={self.path}", "--"]

    def interfaces(self) -> List[str]:
        out = _output([*self.enter(), "ip", "-o", "link", "show"])
        return [line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if ":" in line]


def start_namespace() -> LoopbackNamespace:
    for tool in ("unshare", "nsenter", "ip"):
        if shutil.which(tool) is None:
            pytest.fail(f"the suite needs {tool} (util-linux, iproute2)", pytrace=False)
    holder = subprocess.Popen(
        ["unshare", "-n", "--", "sh", "-c", "ip link set lo up && echo up && exec sleep 86400"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    line = holder.stdout.readline().strip() if holder.stdout else ""
    if line != "up":
        holder.kill()
        holder.wait()
        pytest.fail(f"could not make a loopback-only network namespace: {line}", pytrace=False)
    ns = LoopbackNamespace(holder)
    assert ns.interfaces() == ["lo"], f"the namespace has more than loopback: {ns.interfaces()}"
    return ns


def stop_namespace(ns: LoopbackNamespace) -> None:
    if ns.holder.poll() is None:
        ns.holder.send_signal(signal.SIGKILL)
    ns.holder.wait()


@dataclass
class TlDaemon:
    daemon: Daemon
    ns: LoopbackNamespace
    token: str
    api_url: str
    hosts_file: Path


def start_daemon_in(ns: LoopbackNamespace, binary: Path, root: Path, token: str) -> Daemon:
    """``sandfork serve`` inside ``ns`` (nsenter execs it: the Popen is the daemon)."""
    data_dir, sock, log = root / "data", root / "s.sock", root / "daemon.log"
    data_dir.mkdir(exist_ok=True)
    (root / "token").write_text(token)
    (root / "token").chmod(0o600)
    args = [
        "serve", "--data-dir", str(data_dir), "--socket", str(sock),
        "--listen", f"127.0.0.1:{PORT}", "--token-file", str(root / "token"),
        "--default-image", "busybox", "--max-sandboxes", "16",
    ]  # fmt: skip
    env = dict(os.environ)
    env.setdefault("RUST_LOG", "info")
    # Nothing can leave the namespace anyway; a closed local proxy makes any registry call
    # fail at once instead of waiting for a timeout.
    closed = "http://127.0.0.1:9"
    env.update({"HTTPS_PROXY": closed, "HTTP_PROXY": closed, "https_proxy": closed, "http_proxy": closed, "NO_PROXY": "", "no_proxy": ""})
    with open(log, "ab") as out:
        process = subprocess.Popen(
            [*ns.enter(), str(binary), *args], stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )  # fmt: skip
    return Daemon(f"unix://{sock}", root, data_dir, sock, log, process, token=None)


@pytest.fixture(scope="session")
def tl_daemon(sdks: Sdks) -> Iterator[TlDaemon]:
    binary = daemon_binary()
    if binary is None or not implements_serve(binary, "--listen", "--token-file"):
        pytest.skip("the sandfork daemon is not built (make build)")
    root = Path(tempfile.mkdtemp(prefix="sftl-"))
    hosts = root / "hosts"
    # The api.X/sandbox.X shape: names only the SDK processes of that scenario resolve.
    hosts.write_text("127.0.0.1 localhost\n127.0.0.1 api.sandfork.test sandbox.sandfork.test\n")
    token = secrets.token_hex(16)
    ns = start_namespace()
    d = None
    try:
        d = start_daemon_in(ns, binary, root, token)
        wait_healthy(d)
        yield TlDaemon(d, ns, token, f"http://localhost:{PORT}", hosts)
    finally:
        problems = tear_down(d) if d is not None else []
        stop_namespace(ns)
        if d is None:
            shutil.rmtree(root, ignore_errors=True)
        assert not problems, "after the Tensorlake scenarios, the daemon left behind:\n" + "\n".join(problems)


@dataclass
class SdkRun:
    steps: List[dict]
    seconds: float
    exit_code: int
    stderr: str


def _snake(key: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in key)


def _snake_keys(value):
    """The JS driver prints camelCase keys; the checks read both SDKs' steps alike."""
    if isinstance(value, dict):
        return {_snake(k): _snake_keys(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_snake_keys(v) for v in value]
    return value


@pytest.fixture(scope="session")
def run_sdk(tl_daemon: TlDaemon, sdks: Sdks):
    """Runs one scenario of one SDK's driver inside the namespace; returns its steps."""
    counter = iter(range(1_000_000))

    def run(lang: str, scenario: str, timeout: float = 300) -> SdkRun:
        run_id = f"-{lang}{next(counter)}-{secrets.token_hex(2)}"
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": os.environ.get("HOME", "/root"),
            "LANG": "C.UTF-8",
            "TENSORLAKE_API_URL": tl_daemon.api_url,
            "TENSORLAKE_API_KEY": tl_daemon.token,
            "SCENARIO_IMAGE": "busybox",
            "SCENARIO_RUN_ID": run_id,
            "TENSORLAKE_JS_DIR": str(sdks.js_dir),
        }
        if lang == "py":
            cmd, cwd = [str(sdks.python), str(HERE / "scenarios_py.py"), scenario], HERE
        else:
            cmd, cwd = [str(sdks.node), str(HERE / "scenarios.mjs"), scenario], sdks.js_dir
        if scenario.startswith("hosts_"):
            env["TENSORLAKE_API_URL"] = f"http://api.sandfork.test:{PORT}"
            # Its own mount namespace, where /etc/hosts names api.X and sandbox.X.
            cmd = ["unshare", "-m", "--", "sh", "-c", 'mount --bind "$0" /etc/hosts && exec "$@"', str(tl_daemon.hosts_file), *cmd]
        started = time.monotonic()
        try:
            out = subprocess.run([*tl_daemon.ns.enter(), *cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            pytest.fail(f"{lang} {scenario} did not finish within {timeout:g}s:\n{e.stdout}\n{e.stderr}\n{tl_daemon.daemon.log_tail()}")
        seconds = time.monotonic() - started
        steps = []
        for line in out.stdout.splitlines():
            try:
                steps.append(_snake_keys(json.loads(line)))
            except ValueError:
                continue
        return SdkRun(steps, seconds, out.returncode, out.stderr)

    return run
