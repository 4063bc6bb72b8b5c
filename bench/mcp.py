#!/usr/bin/env python3
"""MCP against the Python SDK: the round trip of one tool call and of the same call
through sandfork's own Python SDK, in the same run, against one daemon.

The calls: a command (`true`, the `run_command` tool against `sandbox.run`), and a 64 KiB
file read (`read_file` against `sandbox.read_file`), each on a running busybox sandbox.
The MCP client is the reference client library (`mcp`), over stdio (`sandfork mcp`
started by the client, talking to the daemon's Unix socket) and over streamable HTTP
(`sandfork mcp --http`, talking to the daemon over loopback TCP with its token); the SDK
talks to the daemon's Unix socket. Rounds alternate the three so that load on the machine
falls on all of them alike.

    python3 bench/mcp.py --runs 30 | python3 bench/report.py "MCP" "python3 bench/mcp.py --runs 30"

Runs as root; starts its own daemon (the release build when there is one) on a data
directory of its own, and installs the `mcp` package into its venv when it is missing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "sdk" / "python" / "src"), str(REPO / "sdk" / "python" / "tests")]


def _mcp_suite():
    """The MCP suite's fixtures module (its client connection and its venv of `mcp`)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("mcp_suite", REPO / "tests" / "mcp" / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["mcp_suite"] = module
    spec.loader.exec_module(module)  # installs the client library when it is missing
    return module


suite = _mcp_suite()
connect, free_port, wait_listening, McpEnv = suite.connect, suite.free_port, suite.wait_listening, suite.McpEnv

from _daemon import daemon_binary, start_daemon, tear_down, url_in_env, wait_healthy  # noqa: E402

FILE = "/tmp/bench-64k.bin"


def release_binary() -> Path:
    target = Path(os.environ.get("CARGO_TARGET_DIR", "/var/cache/sandfork/ci-target"))
    release = target / "release" / "sandfork"
    if release.exists():
        os.environ.setdefault("SANDFORK_BIN", str(release))
    binary = daemon_binary()
    if binary is None:
        sys.exit("the sandfork daemon is not built (make build-release)")
    return binary


async def mcp_round(client, sid: str, what: str) -> float:
    started = time.perf_counter()
    if what == "run":
        r = await client.call_tool("run_command", {"sandbox": sid, "command": ["true"]})
        assert not r.is_error and r.structured_content["exit_code"] == 0, r
    else:
        r = await client.call_tool("read_file", {"sandbox": sid, "path": FILE})
        assert not r.is_error, r
    return (time.perf_counter() - started) * 1000


def sdk_round(sb, what: str) -> float:
    started = time.perf_counter()
    if what == "run":
        assert sb.run("true").exit_code == 0
    else:
        assert len(sb.read_file(FILE)) == 64 << 10
    return (time.perf_counter() - started) * 1000


async def measure(env: McpEnv, sb, runs: int) -> Dict[str, Dict[str, List[float]]]:
    out: Dict[str, Dict[str, List[float]]] = {w: {"sdk": [], "stdio": [], "http": []} for w in ("run", "read")}
    async with connect(env, "stdio") as stdio, connect(env, "http") as http:
        for i in range(runs + 1):  # the first round warms every path up and is dropped
            for what in ("run", "read"):
                a = sdk_round(sb, what)
                b = await mcp_round(stdio, sb.id, what)
                c = await mcp_round(http, sb.id, what)
                if i:
                    out[what]["sdk"].append(a)
                    out[what]["stdio"].append(b)
                    out[what]["http"].append(c)
    return out


def p99(xs: List[float]) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(0.99 * (len(xs) - 1))))]


def report(results: Dict[str, Dict[str, List[float]]], version: str) -> None:
    names = {"run": "a command (`true`)", "read": "a 64 KiB file read"}
    for what, by in results.items():
        base = statistics.median(by["sdk"])
        line: Callable[..., None] = lambda **kw: print(json.dumps({"suite": "mcp", "unit": "ms", **kw}))
        line(name=f"{names[what]}, sandfork Python SDK", value=round(base, 2), p99=round(p99(by["sdk"]), 2))
        for transport, label in (("stdio", "stdio"), ("http", "streamable HTTP")):
            m = statistics.median(by[transport])
            line(name=f"{names[what]}, MCP tool call over {label} (mcp {version})", value=round(m, 2),
                 p99=round(p99(by[transport]), 2), baseline=round(base, 2), baseline_name="sandfork Python SDK, same run",
                 ratio=round(m / base, 2))  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=30)
    args = ap.parse_args()
    binary = release_binary()
    root = Path(tempfile.mkdtemp(prefix="sfbench-mcp-"))
    token = secrets.token_hex(16)
    (root / "token").write_text(token)
    (root / "token").chmod(0o600)
    port = free_port()
    d = start_daemon(binary, ["--listen", f"127.0.0.1:{port}", "--token-file", str(root / "token")], root=root)
    mcp_process = None
    try:
        wait_healthy(d)
        mcp_port, log = free_port(), root / "mcp-http.log"
        with open(log, "ab") as out:
            mcp_process = subprocess.Popen(
                [str(binary), "mcp", "--http", f"127.0.0.1:{mcp_port}", "--url", f"http://127.0.0.1:{port}"],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**os.environ, "SANDFORK_TOKEN": token}, start_new_session=True,
            )  # fmt: skip
        wait_listening(mcp_port, mcp_process, log)
        env = McpEnv(d, binary, f"http://127.0.0.1:{port}", token, f"http://127.0.0.1:{mcp_port}/mcp", log)
        with url_in_env(d):
            from sandfork import Sandbox

            with Sandbox.create(image="busybox", memory_mb=128) as sb:
                sb.run("sh", ["-c", f"head -c 65536 /dev/urandom > {FILE}"])
                results = asyncio.run(measure(env, sb, args.runs))
        import importlib.metadata

        report(results, importlib.metadata.version("mcp"))
    finally:
        if mcp_process is not None and mcp_process.poll() is None:
            mcp_process.send_signal(signal.SIGTERM)
            mcp_process.wait(30)
        problems = tear_down(d)
        if problems:
            sys.exit("the daemon left behind:\n" + "\n".join(problems))


if __name__ == "__main__":
    main()
