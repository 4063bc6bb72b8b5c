"""Fixtures of the API fuzzing suite: one real daemon with its own data dir, reachable
over loopback TCP with a bearer token (so an HTTP fuzzer can talk to it), and a live
sandbox, a background process and a snapshot whose ids the fuzzer may use.

Admission limits are small so that generated create and fork requests cannot start more
than a handful of sandboxes. After the session every sandbox is terminated and the
fixture asserts that nothing leaked (containers, mounts, loop devices).
"""

from __future__ import annotations

import secrets
import socket
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "sdk" / "python" / "src"), str(REPO / "sdk" / "python" / "tests")]

from _daemon import Daemon, daemon_binary, implements_serve, start_daemon, tear_down, terminate_leftovers, wait_healthy  # noqa: E402

MAX_SANDBOXES = 4
MAX_MEMORY_MB = 1024
MAX_UPLOAD_BYTES = 4 << 20


@dataclass
class ApiDaemon:
    daemon: Daemon
    base_url: str
    token: str


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def api_daemon() -> Iterator[ApiDaemon]:
    binary = daemon_binary()
    if binary is None or not implements_serve(binary, "--listen", "--token-file"):
        pytest.skip("the sandfork daemon is not built (make build)")
    root = Path(tempfile.mkdtemp(prefix="sfapi-"))
    token = secrets.token_hex(16)
    (root / "token").write_text(token)
    (root / "token").chmod(0o600)
    port = free_port()
    # Generated egress rules name hosts: the sandboxes' resolvers ask a closed local port
    # (each lookup fails at once), so no DNS question leaves the machine either.
    closed_dns = f"127.0.0.1:{free_port()}"
    (root / "config.toml").write_text(f'max_upload_bytes = {MAX_UPLOAD_BYTES}\ndns_upstreams = ["{closed_dns}"]\n')
    args = [
        "--config", str(root / "config.toml"), "--listen", f"127.0.0.1:{port}",
        "--token-file", str(root / "token"), "--max-sandboxes", str(MAX_SANDBOXES),
        "--max-memory-mb", str(MAX_MEMORY_MB),
        # Over the caps, a create answers 429 at once instead of waiting for room: the
        # run makes many more creates than the caps admit.
        "--admission-wait-secs", "0",
    ]  # fmt: skip
    # Generated image references (a create's image, a pull, a push, a Dockerfile's FROM)
    # would make the daemon call registries on the internet: its registry client goes
    # through a proxy on a closed local port instead, so each such call fails at once and
    # no packet leaves the machine.
    closed = f"http://127.0.0.1:{free_port()}"
    no_egress = {"HTTPS_PROXY": closed, "HTTP_PROXY": closed, "https_proxy": closed, "http_proxy": closed, "NO_PROXY": "", "no_proxy": ""}
    d = start_daemon(binary, args, root=root, env=no_egress)
    try:
        wait_healthy(d)
        yield ApiDaemon(d, f"http://127.0.0.1:{port}", token)
    finally:
        # The fuzzer creates and forks sandboxes on purpose: end them, then look for leaks.
        terminate_leftovers(d)
        problems = tear_down(d)
        assert not problems, "after the API fuzzing, the daemon left behind:\n" + "\n".join(problems)
