"""The fan-out pattern: many sandboxes driven from a thread pool at once."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from sandfork import Sandbox

pytestmark = pytest.mark.daemon

WORKERS = 16


def run_in_fresh_sandbox(script: str) -> str:
    with Sandbox.create(memory_mb=64, labels={"suite": "fanout"}) as sb:
        sb.write_file("/tmp/task.sh", script)
        r = sb.run("sh", ["/tmp/task.sh"])
        assert r.exit_code == 0, r.stderr
        return r.stdout


def test_thread_pool_fan_out(daemon) -> None:
    scripts = [f"echo task {i}; echo $(( {i} * {i} ))" for i in range(WORKERS)]
    with ThreadPoolExecutor(WORKERS) as pool:
        results = list(pool.map(run_in_fresh_sandbox, scripts))
    assert results == [f"task {i}\n{i * i}" for i in range(WORKERS)]
    mine = [s for s in Sandbox.list() if s.labels.get("suite") == "fanout" and s.status != "terminated"]
    assert mine == [], "every fan-out sandbox was terminated"


def test_one_sandbox_shared_by_threads(sandbox: Sandbox) -> None:
    with ThreadPoolExecutor(8) as pool:
        outs = list(pool.map(lambda i: sandbox.run("echo", [str(i)]).stdout, range(32)))
    assert outs == [f"{i}" for i in range(32)]
