"""The HTTP API under generated and mutated requests (schemathesis, driven by
docs/openapi.json) on a live daemon: no 5xx, every response matches its documented
schema and status code, the daemon survives with bounded memory and leaks nothing.

Path ids are drawn partly from a live sandbox, a background process of it and a
snapshot of it, so that requests reach the handlers behind the 404s. Output streams are
not followed and waits, where the fuzzer sets the parameter, time out after 1 s: a
process fed by a never-closed pipe would otherwise hold the run. Bounded:
``SANDFORK_API_FUZZ_EXAMPLES`` cases per operation (default 50), fixed seed
``SANDFORK_API_FUZZ_SEED`` (default 7).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# The fixture's `ApiDaemon` (tests/api/conftest.py): daemon, base_url, token.
ApiDaemon = Any
REPO = Path(__file__).resolve().parents[2]

CHECKS = "not_a_server_error,status_code_conformance,response_schema_conformance,content_type_conformance"
EXAMPLES = int(os.environ.get("SANDFORK_API_FUZZ_EXAMPLES", "50"))
SEED = int(os.environ.get("SANDFORK_API_FUZZ_SEED", "7"))
RUN_TIMEOUT = 900
# The daemon's resident memory after the run (it idles at a few tens of MiB).
MAX_RSS_MB = 512


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def live_ids(api: ApiDaemon) -> dict:
    """A named sandbox with a background process (already exited, so that waiting for it
    or following its output ends at once), and a snapshot of it. The fuzzer reuses what
    responses show, so the process is one that ends by itself even with an open stdin."""
    from sandfork import Client

    client = Client(url=api.daemon.url)
    sb = client.request_json("POST", "/v1/sandboxes", json_body={"name": "fuzz-target", "memory_mb": 128})
    proc = client.request_json("POST", f"/v1/sandboxes/{sb['id']}/processes", json_body={"command": "echo", "args": ["out"]})
    snap = client.request_json("POST", f"/v1/sandboxes/{sb['id']}/checkpoint", json_body={"name": "fuzz-snap"})
    return {"sandbox": sb["id"], "pid": proc["pid"], "snapshot": snap["id"]}


def write_config(path: Path, ids: dict) -> None:
    """Binds path ids, commands and file paths partly to values the daemon knows."""
    dictionaries = {
        "ids": [ids["sandbox"], "fuzz-target", ids["snapshot"], "sb-0000000000000000"],
        "pids": [ids["pid"], 1],
        "commands": ["echo", "ls", "true", "env", "id", "uname"],
        "paths": ["/", "/tmp", "/tmp/fuzz", "/etc/passwd", "/home", "/proc/self/status", "/dev/null"],
    }
    bindings = {
        "path.id": "ids", "path.pid": "pids", "body.command": "commands",
        "query.path": "paths", "body.path": "paths",
    }  # fmt: skip
    lines = []
    for name, values in dictionaries.items():
        lines += [f"[dictionaries.{name}]", f"values = {json.dumps(values)}"]
    lines.append("[parameters]")
    lines += [f'"{key}" = {{ dictionary = "{name}", probability = 0.6 }}' for key, name in bindings.items()]
    # The long polls get bounded values: a followed output stream, the followed events
    # feed or a wait without timeout on a process that never ends would hold the run until
    # its time limit.
    lines += ['"query.follow" = false', '"query.no_follow" = true', '"query.timeout_secs" = 1']
    path.write_text("\n".join(lines) + "\n")


# Run last, on their own: they end the live sandbox and snapshot the others need.
DESTRUCTIVE = ["DELETE /v1/sandboxes/{id}", "POST /v1/sandboxes/{id}/suspend", "DELETE /v1/snapshots/{id}"]
# Streams that run until the client leaves (their own tests cover them): a directory
# watch, the followed events feed and a followed sandbox log. Each sends a heartbeat line
# every second, so the fuzzer's read timeout never ends them and a request for one would
# never complete.
ENDLESS = ["GET /v1/sandboxes/{id}/files/watch", "GET /v1/events", "GET /v1/sandboxes/{id}/logs"]


def run_schemathesis(api: ApiDaemon, config: Path, report: Path, selection: list) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable, "-m", "schemathesis.cli", "--config-file", str(config), "run",
        str(REPO / "docs" / "openapi.json"), "--url", api.base_url,
        "-H", f"Authorization: Bearer {api.token}", "--checks", CHECKS,
        "--max-examples", str(EXAMPLES), "--seed", str(SEED), "--workers", "1",
        "--request-timeout", "60", "--no-shrink", "--suppress-health-check", "all",
        "--report", "junit,har", "--report-junit-path", str(report),
        "--report-har-path", str(report.with_suffix(".har")), "--output-truncate", "true",
        *selection,
    ]  # fmt: skip
    hooks_path = os.pathsep.join(filter(None, [str(Path(__file__).parent), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, NO_COLOR="1", SCHEMATHESIS_TELEMETRY="false", SCHEMATHESIS_HOOKS="fuzz_hooks", PYTHONPATH=hooks_path)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT, env=env, cwd=config.parent)


def slow_requests(har: Path, over_ms: float = 10_000) -> str:
    """The requests of a pass that took longer than ``over_ms`` or got no answer (a read
    timeout), from its HAR log: what to look at when the fuzzer reports a network error."""
    try:
        entries = json.loads(har.read_text())["log"]["entries"]
    except (OSError, ValueError, KeyError) as e:
        return f"(no request log: {e})"
    slow = [
        f"  {e['time']:.0f} ms {e['response'].get('status', 0)} {e['request']['method']} {e['request']['url']}"
        for e in entries
        if e.get("time", 0) > over_ms or not e.get("response", {}).get("status")
    ]
    return "requests slower than 10 s or unanswered:\n" + ("\n".join(slow) or "  none")


def test_api_survives_generated_requests(api_daemon: ApiDaemon, tmp_path: Path) -> None:
    ids = live_ids(api_daemon)
    config = tmp_path / "schemathesis.toml"
    write_config(config, ids)
    passes = {
        "main": [arg for name in DESTRUCTIVE + ENDLESS for arg in ("--exclude-name", name)],
        "destructive": [arg for name in DESTRUCTIVE for arg in ("--include-name", name)],
    }
    failed = []
    for label, selection in passes.items():
        started = time.monotonic()
        out = run_schemathesis(api_daemon, config, tmp_path / f"junit-{label}.xml", selection)
        took = time.monotonic() - started
        text = out.stdout + out.stderr
        (tmp_path / f"schemathesis-{label}.log").write_text(text)
        print(f"\nschemathesis ({label} pass) ran for {took:.0f}s, exit {out.returncode}:\n{text}")
        assert api_daemon.daemon.process.poll() is None, f"the daemon died:\n{api_daemon.daemon.log_tail()}"
        if out.returncode != 0:
            failed.append(label)
            print(slow_requests(tmp_path / f"junit-{label}.har"))
    assert not failed, f"schemathesis found failures in the {failed} pass(es); see the output above"
    assert_alive(api_daemon)
    rss = rss_mb(api_daemon.daemon.process.pid)
    print(f"daemon RSS after the run: {rss:.0f} MiB")
    assert rss < MAX_RSS_MB, f"the daemon's RSS is {rss:.0f} MiB after the run"


def assert_alive(api: ApiDaemon) -> None:
    from sandfork import Client

    health = Client(url=api.daemon.url, timeout=10).request_json("GET", "/v1/health")
    assert health.get("status") == "ok", f"the daemon is unhealthy after the run: {health}"
