"""Fixtures of the MCP suite: a real daemon on its own temp data dir (its Unix socket, and a
loopback TCP listener with a token so that the HTTP transport has a token to ask for),
`sandfork mcp` over stdio and over streamable HTTP, and the reference MCP client library
(the Python `mcp` package, 2.x), installed into a venv outside the repository when missing.

After the session every sandbox is terminated and the fixture asserts that nothing leaked
(containers, mounts, loop devices).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import AsyncIterator, Iterator

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "sdk" / "python" / "src"), str(REPO / "sdk" / "python" / "tests")]

from _daemon import Daemon, daemon_binary, implements_serve, start_daemon, tear_down, wait_healthy  # noqa: E402

# The reference client library lives in a venv of its own (it sees the system's packages,
# so only what they lack is installed there); the suite installs it on a machine without it.
VENV = Path(os.environ.get("SANDFORK_MCP_VENV", "/var/cache/sandfork/mcp/venv"))
MCP_REQUIREMENT = "mcp>=2,<3"


def _site_packages(venv: Path) -> Path:
    return venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"


def _has_client(venv: Path) -> bool:
    python = venv / "bin" / "python"
    if not python.exists() or not _site_packages(venv).is_dir():
        return False
    probe = "import importlib.metadata as m, sys; sys.exit(0 if int(m.version('mcp').split('.')[0]) == 2 else 1)"
    return subprocess.run([str(python), "-c", probe], capture_output=True).returncode == 0


def ensure_client_library() -> None:
    """Makes `import mcp` give the reference client library, installing it if needed."""
    if not _has_client(VENV):
        if VENV.exists() and not _site_packages(VENV).is_dir():
            # A venv of another Python version: made anew for this one.
            subprocess.run(["rm", "-rf", str(VENV)], check=True)
        VENV.parent.mkdir(parents=True, exist_ok=True)
        if not (VENV / "bin" / "python").exists():
            subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(VENV)], check=True)
        subprocess.run(
            [str(VENV / "bin" / "python"), "-m", "pip", "install", "-q", MCP_REQUIREMENT],
            check=True, timeout=900,
        )  # fmt: skip
    site = str(_site_packages(VENV))
    if site not in sys.path:
        sys.path.insert(0, site)


ensure_client_library()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class McpEnv:
    daemon: Daemon
    binary: Path
    daemon_http: str  # http://127.0.0.1:PORT of the daemon's TCP listener
    token: str  # the daemon's token
    mcp_url: str  # the streamable HTTP endpoint of `sandfork mcp --http`
    mcp_log: Path


def wait_listening(port: int, process: subprocess.Popen, log: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"sandfork mcp --http exited with {process.returncode}:\n{log.read_text(errors='replace')}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        time.sleep(0.1)
    raise RuntimeError(f"sandfork mcp --http did not listen within {timeout:g}s:\n{log.read_text(errors='replace')}")


@pytest.fixture(scope="session")
def env() -> Iterator[McpEnv]:
    binary = daemon_binary()
    if binary is None or not implements_serve(binary, "--listen", "--token-file"):
        pytest.skip("the sandfork daemon is not built (make build)")
    help_text = subprocess.run([str(binary), "mcp", "--help"], capture_output=True, text=True).stdout
    if "--http" not in help_text:
        pytest.skip("this sandfork binary has no `mcp` verb (make build)")
    root = Path(tempfile.mkdtemp(prefix="sfmcp-"))
    token = secrets.token_hex(16)
    (root / "token").write_text(token)
    (root / "token").chmod(0o600)
    port = free_port()
    args = ["--listen", f"127.0.0.1:{port}", "--token-file", str(root / "token")]
    d = start_daemon(binary, args, root=root)
    mcp_process = None
    mcp_log = root / "mcp-http.log"
    try:
        wait_healthy(d)
        # The HTTP server reaches the daemon over TCP with its token (from the
        # environment, not the command line), and asks its own clients for that token.
        mcp_port = free_port()
        with open(mcp_log, "ab") as out:
            mcp_process = subprocess.Popen(
                [str(binary), "mcp", "--http", f"127.0.0.1:{mcp_port}", "--url", f"http://127.0.0.1:{port}"],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**os.environ, "SANDFORK_TOKEN": token}, start_new_session=True,
            )  # fmt: skip
        wait_listening(mcp_port, mcp_process, mcp_log)
        yield McpEnv(d, binary, f"http://127.0.0.1:{port}", token, f"http://127.0.0.1:{mcp_port}/mcp", mcp_log)
    finally:
        if mcp_process is not None and mcp_process.poll() is None:
            mcp_process.send_signal(signal.SIGTERM)
            try:
                mcp_process.wait(30)
            except subprocess.TimeoutExpired:
                mcp_process.kill()
                mcp_process.wait()
        problems = tear_down(d)
        assert not problems, "after the MCP suite, the daemon left behind:\n" + "\n".join(problems)


@contextlib.asynccontextmanager
async def connect(env: McpEnv, transport: str, token: str | None = "") -> AsyncIterator["object"]:
    """An MCP client session with `sandfork mcp` over `transport` ("stdio" or "http");
    over HTTP it presents `token` (default: the daemon's; None: no Authorization)."""
    import httpx2
    from mcp import Client, StdioServerParameters
    from mcp.client.streamable_http import streamable_http_client

    if transport == "stdio":
        server = StdioServerParameters(command=str(env.binary), args=["mcp", "--url", f"unix://{env.daemon.socket}"])
        async with Client(server, cache=None, read_timeout_seconds=600) as client:
            yield client
        return
    headers = {}
    if token is not None:
        headers["Authorization"] = f"Bearer {token or env.token}"
    timeout = httpx2.Timeout(30.0, read=600.0)
    async with httpx2.AsyncClient(headers=headers, timeout=timeout) as http:
        async with Client(streamable_http_client(env.mcp_url, http_client=http), cache=None, read_timeout_seconds=600) as client:
            yield client


def raw_post(url: str, headers: dict) -> int:
    """The status of a bare JSON-RPC initialize POST (no MCP client)."""
    body = b'{"jsonrpc":"2.0","id":1,"method":"ping"}'
    req = urllib.request.Request(url, data=body, method="POST", headers={
        "Content-Type": "application/json", "Accept": "application/json, text/event-stream", **headers})  # fmt: skip
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as e:
        return e.code
