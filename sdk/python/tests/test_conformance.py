"""The behaviour both SDKs share (``sdk/conformance.json``; the TypeScript SDK checks the
same file in ``sdk/typescript/test/conformance.test.ts``)."""

from __future__ import annotations

import json
from typing import Any, Dict, List

import pytest

from _daemon import REPO, Daemon

SPEC: Dict[str, Any] = json.loads((REPO / "sdk" / "conformance.json").read_text())


@pytest.mark.parametrize("case", SPEC["runs"], ids=lambda c: c["name"])
def test_run_output(sandbox: Any, case: Dict[str, Any]) -> None:
    r = sandbox.run(case["command"], case["args"])
    assert (r.stdout, r.stderr, r.exit_code) == (case["stdout"], case["stderr"], case["exit_code"])
    assert r.stdout_bytes == case["stdout_bytes"].encode()


@pytest.mark.parametrize("case", SPEC["callbacks"], ids=lambda c: c["name"])
def test_output_callbacks(sandbox: Any, case: Dict[str, Any]) -> None:
    seen: List[str] = []
    sandbox.run(case["command"], case["args"], on_stdout=seen.append)
    assert seen == case["stdout_lines"]


def test_create_defaults(daemon: Daemon) -> None:
    from sandfork import Client, Sandbox

    want = SPEC["create_defaults"]
    with Sandbox.create(image="busybox") as sb:
        raw = Client(url=daemon.url).request_json("GET", f"/v1/sandboxes/{sb.id}")
    assert (raw["cpus"], raw["memory_mb"], raw["network"]["mode"]) == (want["cpus"], want["memory_mb"], want["network_mode"])


def test_fork_result_is_a_list(daemon: Daemon, checkpoint_routes: None) -> None:
    from sandfork import Sandbox

    with Sandbox.create(image="busybox", memory_mb=128) as sb:
        snap = sb.checkpoint(checkpoint_type="memory")
        with snap.fork(SPEC["fork"]["count"]) as result:
            assert isinstance(result, list) is SPEC["fork"]["is_a_list"]
            assert len(result) == SPEC["fork"]["count"] and result.snapshot_id == snap.id
        snap.delete()
