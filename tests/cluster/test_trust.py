"""Cluster trust (docs/scale-out.md, "Who the cluster trusts"): Ray answers only processes
holding its token; a node whose certificate the cluster's authority did not issue for its
name gets no sandbox, no call and no token, though it joined Ray and labels itself a
sandfork node; a directory entry pointed at another address is not followed; snapshots
are signed by the node that published them, and a revoked node's are refused."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.root

RAY_CLIENT = """
import sys, ray
ray.init(address=sys.argv[1], log_to_driver=False)
print("connected", len(ray.nodes()))
"""


def ray_driver(cluster, token: bool) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    if token:
        env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(cluster.trust / "ray.token"))
    try:
        return subprocess.run(
            cluster.net.enter(cluster.count + 1, [sys.executable, "-c", RAY_CLIENT, cluster.ray_address]),
            env=env, capture_output=True, text=True, timeout=90,
        )  # fmt: skip
    except subprocess.TimeoutExpired as e:
        return subprocess.CompletedProcess(e.cmd, -9, e.stdout or "", f"timed out: {e.stderr or ''}")


def test_ray_answers_only_processes_holding_its_token(ray_cluster) -> None:
    without = ray_driver(ray_cluster, token=False)
    assert without.returncode != 0 and "connected" not in without.stdout, without
    with_token = ray_driver(ray_cluster, token=True)
    assert with_token.returncode == 0 and "connected" in with_token.stdout, with_token.stderr[-2000:]


class Listener:
    """A TCP listener of the test's own that records whether anything connected."""

    def __init__(self, ip: str) -> None:
        self.hits = 0
        self.sock = socket.socket()
        self.sock.bind((ip, 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.hits += 1
            conn.close()

    def close(self) -> None:
        self.sock.close()


def test_a_node_the_authority_did_not_certify_gets_nothing(ray_cluster, tmp_path: Path) -> None:
    """A node with Ray's token (an insider) but its own authority's certificate, named like
    a real node, joins Ray: the gateway neither places on it nor sends it a call."""
    from sandfork import Sandbox

    rogue_trust = tmp_path / "rogue"
    subprocess.run([str(ray_cluster.binary), "cluster", "init", str(rogue_trust)], check=True, capture_output=True)
    # Its own copy of the cluster's tokens: what an insider on Ray would hold.
    for name in ("ray.token", "node.token"):
        (rogue_trust / name).unlink()
        (rogue_trust / name).write_text((ray_cluster.trust / name).read_text())
    spare = ray_cluster.count + 1
    rogue = ray_cluster.start_node(spare, name="node1", trust=rogue_trust)
    try:
        deadline = time.monotonic() + 60
        log = ray_cluster.root / "gateway.log"
        while "is not used" not in log.read_text(errors="replace"):
            assert time.monotonic() < deadline, ray_cluster.log_tail(log)
            time.sleep(0.5)
        c = ray_cluster.client()
        made = [Sandbox.create(image="busybox", client=c, memory_mb=64) for _ in range(12)]
        try:
            from sandfork import Client

            on_rogue = Client(url=rogue.url).request_json("GET", "/v1/sandboxes")["sandboxes"]
            assert on_rogue == [], "a sandbox was placed on the node the cluster does not trust"
            assert all(ray_cluster.node_of(sb.id) in range(1, ray_cluster.count + 1) for sb in made)
        finally:
            for sb in made:
                sb.terminate()
    finally:
        ray_cluster.stop_node(spare)


def test_a_directory_entry_pointed_elsewhere_is_not_followed(ray_cluster) -> None:
    """Whoever can write Ray's store rewrites a sandbox's entry to an address of their own:
    the gateway still calls the node the entry names, at that node's own address."""
    import json

    from sandfork import Sandbox

    c = ray_cluster.client()
    sb = Sandbox.create(image="busybox", client=c, memory_mb=64)
    trap = Listener(ray_cluster.net.host_ip)
    try:
        script = (
            "import sys, json, ray\n"
            "from ray.experimental import internal_kv as kv\n"
            "ray.init(address=sys.argv[1], log_to_driver=False)\n"
            "key = ('sb/' + sys.argv[2]).encode()\n"
            "ns = 'sandfork'\n"
            "entry = json.loads(kv._internal_kv_get(key, namespace=ns))\n"
            "entry['api'] = sys.argv[3]\n"
            "kv._internal_kv_put(key, json.dumps(entry).encode(), overwrite=True, namespace=ns)\n"
            "print(json.dumps(json.loads(kv._internal_kv_get(key, namespace=ns))))\n"
        )
        env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token",
               "RAY_AUTH_TOKEN_PATH": str(ray_cluster.trust / "ray.token")}  # fmt: skip
        out = subprocess.run(
            ray_cluster.net.enter(
                ray_cluster.count + 1,
                [sys.executable, "-c", script, ray_cluster.ray_address, sb.id, f"http://{ray_cluster.net.host_ip}:{trap.port}"],
            ),
            env=env, capture_output=True, text=True, timeout=90,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr[-2000:]
        assert json.loads(out.stdout.strip().splitlines()[-1])["api"].endswith(f":{trap.port}")
        assert sb.run("echo", ["still here"]).stdout.strip() == "still here"
        assert trap.hits == 0, "the gateway followed the rewritten entry"
    finally:
        trap.close()
        sb.terminate()


def test_a_revoked_nodes_snapshots_are_refused(ray_cluster) -> None:
    """Node i publishes a memory snapshot signed with its own key; node j restores it, until
    node i's name is in j's revocation list: then j refuses it, naming the node, and takes
    it again once the name is gone (the list is read at every check)."""
    from sandfork import CheckpointType, Sandbox, SandforkError

    c = ray_cluster.client()
    sb = Sandbox.create(image="busybox", client=c, memory_mb=64)
    snap = None
    try:
        sb.run("sh", ["-c", "echo signed > /note && sync"])
        snap = sb.checkpoint(checkpoint_type=CheckpointType.MEMORY)
        snap.publish()
        i = ray_cluster.node_of(sb.id)
        j = next(n for n in ray_cluster.nodes if n != i)
        node_j = ray_cluster.node_client(j)
        revoked = ray_cluster.root / f"node{j}" / "revoked"
        revoked.write_text(f"node{i}\n")
        try:
            with pytest.raises(SandforkError) as e:
                node_j.request_json("POST", "/v1/sandboxes", json_body={"snapshot_id": snap.id, "memory_mb": 64})
            assert f"node{i} is revoked" in str(e.value), e.value
        finally:
            revoked.unlink()
        made = node_j.request_json("POST", "/v1/sandboxes", json_body={"snapshot_id": snap.id, "memory_mb": 64})
        try:
            out = node_j.request_json("POST", f"/v1/sandboxes/{made['id']}/exec", json_body={"command": "cat", "args": ["/note"]})
            assert out["stdout"].strip() == "signed", out
        finally:
            node_j.request_json("DELETE", f"/v1/sandboxes/{made['id']}")
    finally:
        sb.terminate()
        if snap is not None:
            snap.delete()
