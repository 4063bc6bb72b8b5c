"""Fixtures of the E2B compatibility suite: a real daemon on loopback TCP with its own
data dir and API token, a ``base`` template (an image with E2B's ``user`` account), the
real E2B SDKs (installed here when missing), and a network namespace holding only
loopback in which the SDKs run (see ``_netns``).

The daemon reaches nothing beyond this machine either: its registry client goes through
a proxy on a closed local port and its sandboxes' DNS questions go to a closed local
port. At the end every sandbox is terminated, the daemon gets SIGTERM, and the session
fails if it left a container, mount or loop device behind.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Optional

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path[:0] = [str(REPO / "sdk" / "python" / "src"), str(REPO / "sdk" / "python" / "tests"), str(HERE)]

from _daemon import Daemon, daemon_binary, implements_serve, start_daemon, tear_down, wait_healthy  # noqa: E402
from _netns import LoopbackNetns, free_port  # noqa: E402

CACHE = Path(os.environ.get("SANDFORK_CACHE") or "/var/cache/sandfork")
E2B_PY_VERSION = "2.63.0"
E2B_JS_VERSION = "2.51.0"
PY_VENV = Path(os.environ.get("E2B_PY_VENV") or CACHE / "compat" / "e2b-py")
JS_DIR = Path(os.environ.get("E2B_JS_DIR") or CACHE / "compat" / "e2b-js")
PYTHON_OCI = CACHE / "images" / "python-oci"
TEMPLATE = "base"
# Runs of one driver (all its scenarios) may take this long.
DRIVER_TIMEOUT = 1200


def closed_proxy_env() -> Dict[str, str]:
    closed = f"http://127.0.0.1:{free_port()}"
    env = {k: closed for k in ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy", "ALL_PROXY", "all_proxy")}
    env.update(NO_PROXY="", no_proxy="")
    return env


# SDK installs ---------------------------------------------------------------------------


def ensure_python_sdk() -> Optional[str]:
    """The venv's python with e2b installed (made when missing); None when it cannot be."""
    python = PY_VENV / "bin" / "python"
    probe = [str(python), "-c", "import importlib.metadata as m; print(m.version('e2b'))"]
    if python.exists() and subprocess.run(probe, capture_output=True, text=True).stdout.strip() == E2B_PY_VERSION:
        return str(python)
    try:
        PY_VENV.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "venv", str(PY_VENV)], check=True, timeout=300)
        subprocess.run([str(python), "-m", "pip", "install", "-q", f"e2b=={E2B_PY_VERSION}", "httpx"], check=True, timeout=900)
    except (OSError, subprocess.SubprocessError):
        return None
    return str(python)


def ensure_js_sdk() -> Optional[str]:
    """The directory whose node_modules holds e2b (installed when missing)."""
    pkg = JS_DIR / "node_modules" / "e2b" / "package.json"
    if pkg.exists() and json.loads(pkg.read_text()).get("version") == E2B_JS_VERSION:
        return str(JS_DIR)
    try:
        JS_DIR.mkdir(parents=True, exist_ok=True)
        if not (JS_DIR / "package.json").exists():
            subprocess.run(["npm", "init", "-y"], cwd=JS_DIR, check=True, capture_output=True, timeout=300)
        subprocess.run(["npm", "install", "--no-audit", "--no-fund", f"e2b@{E2B_JS_VERSION}"], cwd=JS_DIR, check=True, capture_output=True, timeout=900)
    except (OSError, subprocess.SubprocessError):
        return None
    return str(JS_DIR) if pkg.exists() else None


# The daemon -----------------------------------------------------------------------------


@dataclass
class E2bServer:
    daemon: Daemon
    port: int
    token: str
    netns: LoopbackNetns

    def env(self, key: Optional[str] = None) -> Dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("E2B_", "SANDFORK_"))}
        env.update(
            E2B_API_URL=f"http://127.0.0.1:{self.port}",
            E2B_SANDBOX_URL=f"http://127.0.0.1:{self.port}",
            E2B_API_KEY=key or self.token,
            E2B_TEMPLATE=TEMPLATE,
        )
        return env

    def run(self, argv: List[str], env: Dict[str, str], timeout: float = DRIVER_TIMEOUT) -> subprocess.CompletedProcess:
        """Runs ``argv`` inside the loopback-only namespace."""
        return subprocess.run(self.netns.command(argv), env=env, capture_output=True, text=True, timeout=timeout)

    def terminate(self, sandbox_id: str) -> None:
        from sandfork import Client

        Client(url=self.daemon.url).request_json("DELETE", f"/v1/sandboxes/{sandbox_id}")

    def live_sandboxes(self) -> List[str]:
        from sandfork import Client

        listed = Client(url=self.daemon.url).request_json("GET", "/v1/sandboxes")
        return [s["id"] for s in listed["sandboxes"] if s["state"] not in ("terminated", "failed")]


def make_template(d: Daemon) -> None:
    """The ``base`` template: the python image (imported from the cache, else built: it
    needs Debian's package mirror then) with
    E2B's ``user`` account (uid 1000, home /home/user), as an image made from a snapshot."""
    from sandfork import Client, Image

    client = Client(url=d.url)
    if (PYTHON_OCI / "index.json").is_file():
        Image.import_(PYTHON_OCI, "python", client=client)
        image = "python"
    else:
        # Built from Debian's packages (the daemon's own python builder), as the cache was.
        _, data = client.request("POST", "/v1/images", json_body={"name": "python", "builder": "python"}, timeout=3600)
        last = json.loads(data.decode().strip().splitlines()[-1])
        assert last.get("type") == "done", f"building the python image failed: {last}"
        image = "python"
    sb = client.request_json("POST", "/v1/sandboxes", json_body={"image": image, "allow_internet_access": False})
    try:
        setup = "id -u user >/dev/null 2>&1 || useradd -m -u 1000 -s /bin/bash user; mkdir -p /home/user && chown user: /home/user"
        r = client.request_json("POST", f"/v1/sandboxes/{sb['id']}/exec", json_body={"command": "sh", "args": ["-c", setup]})
        assert r["exit_code"] == 0, r
        snap = client.request_json("POST", f"/v1/sandboxes/{sb['id']}/checkpoint", json_body={"type": "filesystem"})
    finally:
        client.request_json("DELETE", f"/v1/sandboxes/{sb['id']}")
    client.request_json("POST", "/v1/images/from-snapshot", json_body={"name": TEMPLATE, "snapshot_id": snap["id"]})
    client.request_json("DELETE", f"/v1/snapshots/{snap['id']}")


@pytest.fixture(scope="session")
def sdk_python() -> str:
    python = ensure_python_sdk()
    if python is None:
        pytest.skip(f"the E2B Python SDK {E2B_PY_VERSION} could not be installed into {PY_VENV}")
    return python


@pytest.fixture(scope="session")
def sdk_js() -> str:
    if subprocess.run(["node", "--version"], capture_output=True).returncode != 0:
        pytest.skip("node is not installed")
    d = ensure_js_sdk()
    if d is None:
        pytest.skip(f"the E2B JS SDK {E2B_JS_VERSION} could not be installed into {JS_DIR}")
    return d


@pytest.fixture(scope="session")
def e2b_server() -> Iterator[E2bServer]:
    if os.geteuid() != 0:
        pytest.skip("the suite runs the SDKs in a network namespace: run it as root")
    binary = daemon_binary()
    if binary is None or not implements_serve(binary, "--listen", "--token-file"):
        pytest.skip("the sandfork daemon is not built (make build, or set SANDFORK_BIN)")
    root = Path(tempfile.mkdtemp(prefix="sfe2b-"))
    token = secrets.token_hex(16)
    (root / "token").write_text(token)
    (root / "token").chmod(0o600)
    port = free_port()
    (root / "config.toml").write_text(f'dns_upstreams = ["127.0.0.1:{free_port()}"]\nreaper_interval_ms = 250\n')
    args = ["--config", str(root / "config.toml"), "--listen", f"127.0.0.1:{port}", "--token-file", str(root / "token")]
    d = start_daemon(binary, args, root=root, default_image=None, env=closed_proxy_env())
    netns = None
    try:
        wait_healthy(d)
        make_template(d)
        netns = LoopbackNetns(port, [port])
        yield E2bServer(d, port, token, netns)
    finally:
        if netns is not None:
            netns.close()
        problems = tear_down(d)
        assert not problems, "after the E2B suite, the daemon left behind:\n" + "\n".join(problems)


# Drivers ----------------------------------------------------------------------------------


def parse_driver(out: str) -> Dict[str, dict]:
    """The per-scenario JSON lines a driver prints, by scenario."""
    found = {}
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("{") and '"scenario"' in line:
            rec = json.loads(line)
            found[rec["scenario"]] = rec
    return found


def wait_until_no_sandboxes(server: E2bServer, timeout: float = 30) -> List[str]:
    deadline = time.monotonic() + timeout
    live = server.live_sandboxes()
    if timeout <= 0:
        return live
    while live and time.monotonic() < deadline:
        time.sleep(0.5)
        live = server.live_sandboxes()
    return live
