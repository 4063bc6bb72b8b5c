"""A cluster of four real nodes behind the gateway (each host in a network namespace of
the test's own, a real Ray head and workers, a real S3 server): sandboxes placed by Ray,
a fork of 32 spread over the nodes, terminals, ports and files through the gateway, a
restore on a node whose cache is cold, and a node killed in the middle of a fan-out."""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from collections import Counter

import pytest

pytestmark = pytest.mark.root

COUNTER = "(i=0; while true; do i=$((i+1)); echo $i > /tmp/c.new; mv /tmp/c.new /tmp/count; sleep 0.2; done) >/dev/null 2>&1 &"


def base_snapshot(client):
    """A busybox sandbox counting in memory, with a file on disk; its memory snapshot."""
    from sandfork import CheckpointType, Sandbox

    sb = Sandbox.create(image="busybox", client=client, memory_mb=128)
    sb.run("sh", ["-c", "echo base > /note && sync"])
    sb.run("sh", ["-c", COUNTER])
    time.sleep(0.5)
    return sb, sb.checkpoint(checkpoint_type=CheckpointType.MEMORY)


def test_the_gateway_wants_its_token_and_says_what_it_cannot_do(ray_cluster) -> None:
    url = ray_cluster.gateway_url
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        req = urllib.request.Request(f"{url}/v1/sandboxes", headers=headers)
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=10)
        assert e.value.code == 401
    c = ray_cluster.client()
    assert c.request_json("GET", "/v1/health")["status"] == "ok"
    from sandfork import SandforkError

    with pytest.raises(SandforkError) as e:
        c.request_json("POST", "/v1/volumes", json_body={"name": "v", "size_mb": 16})
    assert "Volumes" in str(e.value)
    with pytest.raises(SandforkError) as e:
        c.request_json("GET", "/v1/sandboxes/sb-0000000000000000")
    assert "not found" in str(e.value)
    # A port request without the token learns nothing of what exists: a real sandbox's
    # port and one that never was get the same answers, by path and by host.
    from sandfork import Sandbox

    sb = Sandbox.create(image="busybox", client=c, memory_mb=64)
    try:
        def answer(target: str, host: str = "", token: str = "") -> tuple:
            headers = {"Host": host} if host else {}
            if token:
                headers["X-Sandfork-Access-Token"] = token
            try:
                urllib.request.urlopen(urllib.request.Request(f"{url}{target}", headers=headers), timeout=10)
                return (200, b"")
            except urllib.error.HTTPError as err:
                return (err.code, err.read())

        for token in ("", "wrong"):
            real = answer(f"/v1/sandboxes/{sb.id}/ports/8080/", token=token)
            ghost = answer("/v1/sandboxes/sb-0000000000000000/ports/8080/", token=token)
            assert real == ghost and real[0] == (403 if token else 401), (real, ghost)
            by_host = answer("/", host=f"8080-{sb.id}.cluster.test", token=token)
            ghost_host = answer("/", host="8080-sb-0000000000000000.cluster.test", token=token)
            assert by_host == ghost_host == real, (by_host, ghost_host, real)
    finally:
        sb.terminate()


def test_a_fork_of_32_spreads_over_the_nodes(ray_cluster) -> None:
    from sandfork import Snapshot

    c = ray_cluster.client()
    sb, snap = base_snapshot(c)
    try:
        started = time.monotonic()
        result = Snapshot.fork(snap.id, 32, client=c)
        took = time.monotonic() - started
        try:
            assert not result.errors, [e.error for e in result.errors]
            assert len(result) == 32
            indices = sorted(int(w.run("cat", ["/etc/sandfork/fork"]).stdout.split("SANDFORK_FORK_INDEX=")[1].split()[0]) for w in result)
            assert indices == list(range(32))
            # Ten slots a node: 33 sandboxes need all four.
            nodes = Counter(ray_cluster.node_of(w.id) for w in result)
            assert len(nodes) == 4 and None not in nodes and max(nodes.values()) <= 10, nodes
            # Warm: every child's counter goes on from the snapshot's.
            assert all(int(w.run("cat", ["/tmp/count"]).stdout) > 0 for w in result[:4])
            # Independent: a child's write is its own.
            result[0].run("sh", ["-c", "echo mine > /note && sync"])
            assert {w.run("cat", ["/note"]).stdout.strip() for w in result[1:]} == {"base"}
            listed = {s["id"] for s in c.request_json("GET", "/v1/sandboxes")["sandboxes"]}
            assert {w.id for w in result} | {sb.id} <= listed
            print(f"fork of 32 over 4 nodes: {took:.2f} s")
        finally:
            result.terminate_all()
    finally:
        sb.terminate()
        Snapshot.delete(snap.id, client=c)
    assert not any(ray_cluster.node_client(i).request_json("GET", "/v1/sandboxes")["sandboxes"] for i in ray_cluster.nodes)


def test_terminals_files_and_ports_go_to_the_sandboxs_node(ray_cluster) -> None:
    from sandfork import Sandbox

    c = ray_cluster.client()
    with Sandbox.create(image="busybox", client=c, memory_mb=128) as sb:
        sb.write_file("/www/index.html", b"served through the gateway\n")
        assert sb.read_file("/www/index.html") == b"served through the gateway\n"
        seen = []
        with sb.pty.create(on_data=lambda b: seen.append(b)) as term:
            term.send("echo hi-$((6*7))\n")
            deadline = time.monotonic() + 20
            while b"hi-42" not in b"".join(seen):
                assert time.monotonic() < deadline, b"".join(seen)
                time.sleep(0.1)
        sb.start_process("httpd", ["-f", "-p", "8080", "-h", "/www"])
        deadline = time.monotonic() + 20
        while sb.run("sh", ["-c", "wget -q -O /dev/null http://127.0.0.1:8080/index.html"]).exit_code != 0:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        url = sb.get_url(8080, "/index.html")
        with urllib.request.urlopen(url, timeout=10) as r:
            assert r.read() == b"served through the gateway\n"
        # No token: refused by the node, nothing forwarded.
        bare = sb.get_url(8080, "/index.html", signed=False)
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(bare, timeout=10)
        assert e.value.code == 401
        # By host, with the sandbox's own token.
        req = urllib.request.Request(
            f"{ray_cluster.gateway_url}/index.html",
            headers={"Host": f"8080-{sb.id}.cluster.test", "X-Sandfork-Access-Token": sb.port_token()},
        )
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.read() == b"served through the gateway\n"


def test_a_restore_on_a_node_with_a_cold_cache_fetches_what_it_touches(ray_cluster) -> None:
    from sandfork import CheckpointType, Sandbox, Snapshot

    c = ray_cluster.client()
    sb = Sandbox.create(image="busybox", client=c, memory_mb=128)
    sb.run("sh", ["-c", "head -c 33554432 /dev/urandom > /big && sync"])
    snap = sb.checkpoint(checkpoint_type=CheckpointType.MEMORY)
    home = ray_cluster.node_of(sb.id)
    cold = next(i for i in ray_cluster.nodes if i != home)
    node = ray_cluster.node_client(cold)
    deadline = time.monotonic() + 60
    while not c.request_json("GET", f"/v1/snapshots/{snap.id}").get("published"):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    from _metrics import metric

    before = metric(ray_cluster.nodes[cold], "sandfork_object_store_bytes_in_total")
    with Sandbox.create(snapshot_id=snap.id, client=node) as restored:
        assert restored.run("echo", ["up"]).stdout.strip() == "up"
        fetched = metric(ray_cluster.nodes[cold], "sandfork_object_store_bytes_in_total") - before
        assert fetched < 24 << 20, f"a restore moved {fetched} bytes of a snapshot holding 32 MiB it never read"
    sb.terminate()
    Snapshot.delete(snap.id, client=c)


def test_a_node_killed_mid_fan_out(ray_cluster) -> None:
    """Last in the module: it takes a node down for good."""
    from sandfork import Sandbox, Snapshot

    c = ray_cluster.client()
    sb, snap = base_snapshot(c)
    home = ray_cluster.node_of(sb.id)
    victim = next(i for i in sorted(ray_cluster.nodes) if i != home)
    results = {}

    def fan_out() -> None:
        results["fork"] = Snapshot.fork(snap.id, 16, client=c)

    t = threading.Thread(target=fan_out)
    t.start()
    time.sleep(0.4)
    ray_cluster.kill_node(victim)
    t.join(300)
    result = results["fork"]
    try:
        # Every child is accounted for: started (some moved off the dead node) or failed
        # saying why.
        assert len(result) + len(result.errors) == 16
        for e in result.errors:
            assert e.error.message, e
        assert len(result) >= 8, [e.error for e in result.errors]
        survivors = [w for w in result if ray_cluster.node_of(w.id) is not None]
        for w in survivors[:3]:
            assert w.run("cat", ["/note"]).stdout.strip() == "base"
        alive_ids = {w.id for w in survivors}
        lost = [w for w in result if w.id not in alive_ids]
        # Ray declares the node dead; its sandboxes are then reported lost.
        deadline = time.monotonic() + 60
        while ray_cluster.alive_nodes() != len(ray_cluster.nodes) - 1:
            assert time.monotonic() < deadline, "Ray did not declare the node dead"
            time.sleep(0.5)
        states = {s["id"]: s["state"] for s in c.request_json("GET", "/v1/sandboxes")["sandboxes"]}
        for w in lost:
            assert states.get(w.id) == "lost", (w.id, states.get(w.id))
            assert Sandbox(w.id, client=c).info().status == "lost"
        # The snapshot, in the object store, still restores on the nodes left.
        with Snapshot.fork(snap.id, 2, client=c) as again:
            assert {ray_cluster.node_of(w.id) for w in again} & {victim} == set()
            assert again[0].run("cat", ["/note"]).stdout.strip() == "base"
    finally:
        for w in result:
            try:
                w.terminate()
            except Exception:
                pass
        sb.terminate()
        Snapshot.delete(snap.id, client=c)
    problems = ray_cluster.clean_killed(victim)
    assert not problems, problems
