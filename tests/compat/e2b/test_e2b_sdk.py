"""The unmodified E2B SDKs (Python e2b 2.63.0, JS e2b 2.51.0) against a real sandfork
daemon, with only E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY set.

Each scenario of the recorded drivers (``scenarios_py.py``, ``scenarios.mjs``: the same
files that recorded the wire fixtures) runs in a loopback-only network namespace. A
scenario either passes whole, or stops where sandfork answers an error naming a feature
it lacks — then the test holds it to exactly that error, and ``sandfork_checks``
drivers cover what the scenario would have gone on to do. The fork pattern (memory
snapshot, 5 forks and 5 restores, warm state proven) runs with both SDKs.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Dict, Optional

import pytest

from conftest import E2bServer, parse_driver, wait_until_no_sandboxes

HERE = Path(__file__).resolve().parent

# scenario -> None (passes) or the text of the error that stops it (a missing feature)
PY_SCENARIOS: Dict[str, Optional[str]] = {
    "lifecycle": None,
    "create_options": "maskRequestHost",
    "list_pagination": None,
    "pause_resume": None,
    "snapshot_fork": None,
    "commands": None,
    "background": None,
    "files": "file metadata",
    "watch": None,
    "pty": None,
    "errors": None,
    "keepalive": None,
    "async_basics": None,
    "templates": None,
    "templates_async": None,
}
JS_SCENARIOS: Dict[str, Optional[str]] = {k: v for k, v in PY_SCENARIOS.items() if k not in ("async_basics", "templates_async")}


def run_driver(server: E2bServer, argv, env, names) -> Dict[str, dict]:
    out = server.run([*argv, *names], env)
    keep = os.environ.get("E2B_COMPAT_OUT")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        tag = Path(argv[-1]).stem + "-" + "-".join(names)
        (Path(keep) / f"{tag}.out").write_text(out.stdout + "\n--- stderr ---\n" + out.stderr)
    found = parse_driver(out.stdout)
    missing = [n for n in names if n not in found]
    assert not missing, f"the driver printed nothing for {missing}:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return found


def settle(server: E2bServer, expect: Optional[str]) -> None:
    """After a scenario: none of its sandboxes is left. One that stopped at a missing
    feature may leave what it made before (its clean-up comes after): those are ended."""
    live = wait_until_no_sandboxes(server, timeout=30 if expect is None else 0)
    if expect is None:
        assert live == [], "the scenario left sandboxes"
    for sid in live:
        server.terminate(sid)


def check(rec: dict, expect: Optional[str]) -> None:
    detail = json.dumps({k: rec.get(k) for k in ("error", "traceback", "stack")}, indent=1)[:4000]
    if expect is None:
        assert rec["ok"], f"{rec['scenario']} failed:\n{detail}"
    else:
        assert not rec["ok"], f"{rec['scenario']} passed, but sandfork lacks {expect!r}: update the expectation"
        assert expect in rec["error"]["message"], f"{rec['scenario']} failed otherwise:\n{detail}"


@pytest.mark.parametrize("scenario", list(PY_SCENARIOS))
def test_python_scenario(e2b_server: E2bServer, sdk_python: str, scenario: str) -> None:
    recs = run_driver(e2b_server, [sdk_python, str(HERE / "scenarios_py.py")], e2b_server.env(), [scenario])
    check(recs[scenario], PY_SCENARIOS[scenario])
    settle(e2b_server, PY_SCENARIOS[scenario])


@pytest.mark.parametrize("scenario", list(JS_SCENARIOS))
def test_js_scenario(e2b_server: E2bServer, sdk_js: str, scenario: str) -> None:
    env = dict(e2b_server.env(), E2B_JS_DIR=sdk_js)
    recs = run_driver(e2b_server, ["node", str(HERE / "scenarios.mjs")], env, [scenario])
    check(recs[scenario], JS_SCENARIOS[scenario])
    settle(e2b_server, JS_SCENARIOS[scenario])


CHECKS = ["create_options_rest", "files_rest", "fork_pattern"]
PY_ONLY_CHECKS = ["ports", "auto_resume", "overhead"]


@pytest.mark.parametrize("scenario", CHECKS + PY_ONLY_CHECKS)
def test_python_sandfork_checks(e2b_server: E2bServer, sdk_python: str, scenario: str) -> None:
    env = dict(e2b_server.env(), SANDFORK_SDK_PATH=str(HERE.parents[2] / "sdk" / "python" / "src"))
    recs = run_driver(e2b_server, [sdk_python, str(HERE / "sandfork_checks.py")], env, [scenario])
    check(recs[scenario], None)
    if scenario == "overhead":
        print("\nE2B layer overhead:", json.dumps(recs[scenario]["observations"]))
    settle(e2b_server, None)


@pytest.mark.parametrize("scenario", CHECKS)
def test_js_sandfork_checks(e2b_server: E2bServer, sdk_js: str, scenario: str) -> None:
    env = dict(e2b_server.env(), E2B_JS_DIR=sdk_js)
    recs = run_driver(e2b_server, ["node", str(HERE / "sandfork_checks.mjs")], env, [scenario])
    check(recs[scenario], None)
    settle(e2b_server, None)


def test_no_sandbox_is_left(e2b_server: E2bServer) -> None:
    assert wait_until_no_sandboxes(e2b_server) == []


def test_hostile_requests_get_answers_not_crashes(e2b_server: E2bServer) -> None:
    """Malformed E2B requests (bad envelopes, JSON, base64, sizes, deadlines, tokens) are
    answered with E2B-shaped errors, and the daemon goes on serving."""
    import http.client

    def call(method, path, body=b"", headers=None):
        conn = http.client.HTTPConnection("127.0.0.1", e2b_server.port, timeout=30)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            r = conn.getresponse()
            # a stream that works goes on: its first envelope is enough
            return r.status, (r.read1(64) if "WatchDir" in path else r.read())
        finally:
            conn.close()

    key = {"X-API-KEY": e2b_server.token, "Content-Type": "application/json"}
    status, body = call("POST", "/v2/sandboxes", json.dumps({"templateID": "base", "timeout": 60}).encode(), key)
    assert status == 201, body
    sb = json.loads(body)
    envd = {"E2b-Sandbox-Id": sb["sandboxID"], "X-Access-Token": sb["envdAccessToken"]}
    stream = dict(envd, **{"Content-Type": "application/connect+json"})
    unary = dict(envd, **{"Content-Type": "application/json"})
    try:
        cases = [
            ("POST", "/v2/sandboxes", b"{not json", key, {400}),
            ("POST", "/v2/sandboxes", json.dumps({"templateID": "base", "metadata": {"k": "\u0000"}}).encode(), key, {400}),
            ("GET", "/v2/sandboxes?limit=x", b"", key, {400}),
            ("GET", "/v2/sandboxes?startedAfter=99999999999-01-01T00:00:00Z", b"", key, {400}),
            ("GET", "/v2/sandboxes?nextToken=99999999999999999999999", b"", key, {400}),
            ("POST", "/sandboxes/x/timeout", b"{}", key, {400, 404}),
            ("DELETE", "/templates/%2e%2e%2f%2e%2e", b"", key, {404}),
            ("POST", "/v2/sandboxes", b"{}", {"X-API-KEY": "wrong"}, {401}),
            ("POST", "/process.Process/Start", b"\x00\xff\xff\xff\xff", stream, {200}),
            ("POST", "/process.Process/Start", b"\x01\x00\x00\x00\x01x", stream, {200}),
            ("POST", "/process.Process/Start", b"\x00\x00\x00\x00\x02{x", stream, {200}),
            ("POST", "/process.Process/Start", b"", stream, {200}),
            ("POST", "/process.Process/Start", b"\x00\x00\x00\x00\x02{}", dict(stream, **{"Connect-Timeout-Ms": "18446744073709551615"}), {200}),
            ("POST", "/process.Process/SendInput", json.dumps({"process": {"pid": 1}, "input": {"stdin": "!!"}}).encode(), unary, {400, 404}),
            ("POST", "/process.Process/SendSignal", json.dumps({"process": {"pid": 18446744073709551615}, "signal": 9}).encode(), unary, {404}),
            ("POST", "/process.Process/Update", json.dumps({"process": {"pid": 1}, "pty": {"size": {"cols": 0, "rows": 0}}}).encode(), unary, {400, 404}),
            ("POST", "/process.Process/Nope", b"{}", unary, {501}),
            ("POST", "/filesystem.Filesystem/ListDir", json.dumps({"path": "/\u0000", "depth": 4294967295}).encode(), unary, {400}),
            ("POST", "/filesystem.Filesystem/ListDir", b"[1,2]", unary, {400}),
            ("POST", "/filesystem.Filesystem/WatchDir", b"\x00\x00\x00\x00\x02{}", dict(stream, **{"Connect-Timeout-Ms": "18446744073709551615"}), {200}),
            ("POST", "/filesystem.Filesystem/WatchDir", b"\x00\x00\x00\x00\x0b{\"path\":7}", stream, {200}),
            ("POST", "/filesystem.Filesystem/GetWatcherEvents", b'{"watcherId": "nope"}', unary, {404}),
            ("POST", "/files?path=/tmp/x", b"--b\r\nContent-Disposition: form-data\r\n\r\nunfinished", dict(envd, **{"Content-Type": "multipart/form-data; boundary=b"}), {400}),
            ("POST", "/files?path=/tmp/x", b"\x1f\x8b not gzip", dict(envd, **{"Content-Type": "application/octet-stream", "Content-Encoding": "gzip"}), {400}),
            ("GET", "/files?path=/tmp&signature=v1_x", b"", {}, {400}),
            ("GET", "/files?path=/etc/hostname", b"", {"E2b-Sandbox-Id": sb["sandboxID"], "X-Access-Token": "ea_wrong"}, {401}),
            ("GET", "/health", b"", {"E2b-Sandbox-Id": "nonexistent"}, {502}),
        ]
        for method, path, body, headers, want in cases:
            status, answer = call(method, path, body, headers)
            assert status in want, (method, path, body[:40], status, answer[:300])
            if status == 200 and headers.get("Content-Type") == "application/connect+json" and path.endswith(("Start", "WatchDir")):
                # a stream that failed: 200 and one end-of-stream envelope with an error
                assert answer[:1] == b"\x02" or b'"error"' in answer or b'"start"' in answer, answer[:200]
        status, _ = call("GET", "/health", b"", envd)
        assert status == 204, "the sandbox still answers"
    finally:
        call("DELETE", f"/sandboxes/{sb['sandboxID']}", b"", key)
