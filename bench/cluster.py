#!/usr/bin/env python3
"""Scale-out, measured on one machine: four sandfork nodes behind the gateway (each host in
a network namespace of the bench's own, a real Ray head and workers, a real SeaweedFS S3
server; the harness is tests/cluster/_ray_cluster.py), and, in the same run, a standalone
daemon as the one-node baseline.

- restore → first exec of a memory snapshot (a shell holding 50 MB, 64 MiB of data on
  its disk) on a node whose cache is cold (it pulls the snapshot from the object store;
  its base image's layer it has after the first run), against a warm restore on the node
  that took it;
- bytes a cold restore fetched, against what a whole copy of the snapshot holds;
- a fork of 32 spread over the four nodes by the gateway, against the same fork on the
  one standalone node.

The nodes share this machine's cores: the fan-out figure is the cost of placement, pulls
and routing, not the speed-up of four real machines (docs/scale-out.md).

Run as root: ``make bench-cluster`` (the release build).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "sdk" / "python" / "src"), str(REPO / "sdk" / "python" / "tests"), str(REPO / "tests" / "cluster")]

from _daemon import start_daemon, tear_down, wait_healthy  # noqa: E402
from _ray_cluster import RayCluster  # noqa: E402
from _metrics import metric  # noqa: E402

from sandfork import CheckpointType, Client, Sandbox, Snapshot  # noqa: E402

#: A shell keeping ~50 MB of random data in memory, counting.
STATE = "x=$(head -c 37500000 /dev/urandom | base64); while true; do echo ${#x} > /tmp/len; sleep 1; done >/dev/null 2>&1 &"
#: 64 MiB on the disk that no restore reads (a dataset, a cache): lazy fetch leaves it.
DATA = "head -c 67108864 /dev/urandom > /data.bin && sync"


def emit(name: str, value: float, unit: str, baseline: float = None, baseline_name: str = "", target: str = "") -> None:
    row = {"suite": "cluster", "name": name, "value": round(value, 2), "unit": unit}
    if baseline is not None:
        row.update(baseline=round(baseline, 2), baseline_name=baseline_name, ratio=round(value / baseline, 2) if baseline else None)
    if target:
        row["target"] = target
    print(json.dumps(row), flush=True)


def warm_snapshot(client: Client) -> tuple:
    sb = Sandbox.create(image="busybox", client=client, memory_mb=256, disk_mb=512)
    sb.run("sh", ["-c", DATA])
    sb.run("sh", ["-c", STATE])
    deadline = time.monotonic() + 60
    while sb.run("cat", ["/tmp/len"]).exit_code != 0:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    return sb, sb.checkpoint(checkpoint_type=CheckpointType.MEMORY, wait_until="completed")


def restore_ms(client: Client, snap_id: str) -> float:
    t = time.monotonic()
    with Sandbox.create(snapshot_id=snap_id, client=client) as sb:
        assert int(sb.run("cat", ["/tmp/len"]).stdout) > 49_000_000, "the state came back"
        return (time.monotonic() - t) * 1000


def fork_s(client: Client, snap_id: str, n: int) -> float:
    t = time.monotonic()
    result = Snapshot.fork(snap_id, n, client=client)
    took = time.monotonic() - t
    try:
        assert not result.errors and len(result) == n, [e.error for e in result.errors]
    finally:
        result.terminate_all()
    return took


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--fanout", type=int, default=32)
    args = ap.parse_args()
    target = Path(os.environ.get("CARGO_TARGET_DIR") or REPO / "target")
    binary = Path(os.environ.get("SANDFORK_BIN") or target / "release" / "sandfork")
    os.environ["SANDFORK_BIN"] = str(binary)
    root = Path(tempfile.mkdtemp(prefix="sfbench-cluster-"))
    cluster = RayCluster(root / "cluster", binary, nodes=4, slots=9)
    problems = []
    try:
        gw = cluster.client()
        warm, cold, listed, fetched, sizes = [], [], [], [], []
        for _ in range(args.runs):
            sb, snap = warm_snapshot(gw)
            home = cluster.node_of(sb.id)
            others = [i for i in cluster.nodes if i != home]
            # A node that never had this snapshot, and the snapshot's first restore
            # anywhere but home: it fetches as it reads, and records what it read first.
            node = others[len(cold) % len(others)]
            before = metric(cluster.nodes[node], "sandfork_object_store_bytes_in_total")
            cold.append(restore_ms(cluster.node_client(node), snap.id))
            fetched.append(metric(cluster.nodes[node], "sandfork_object_store_bytes_in_total") - before)
            manifest = json.loads(json.loads(cluster.weed.object(f"cluster/snapshots/{snap.id}.json"))["body"])
            sizes.append(sum(l["packed_bytes"] for l in manifest["layers"]) + sum(f["size"] for f in manifest["memory"])
                         + sum(m["layer"]["packed_bytes"] for m in manifest.get("memory_layers", [])))
            # Another node with a cold cache, once that list is in the manifest: it fetches
            # those chunks ahead, in parallel.
            third = others[(len(cold)) % len(others)]
            deadline = time.monotonic() + 10
            while not json.loads(json.loads(cluster.weed.object(f"cluster/snapshots/{snap.id}.json"))["body"]).get("prefetch"):
                assert time.monotonic() < deadline, "the first restore recorded what it read"
                time.sleep(0.1)
            listed.append(restore_ms(cluster.node_client(third), snap.id))
            # Then a warm restore on the node that took it.
            warm.append(restore_ms(cluster.node_client(home), snap.id))
            sb.terminate()
            Snapshot.delete(snap.id, everywhere=True, client=gw)
        emit("restore → first exec on a node with a cold cache, the snapshot's first restore elsewhere, shell holding 50 MB, 64 MiB on disk",
             statistics.median(cold), "ms", statistics.median(warm), "warm restore on the node that took it", "≤ 2×")
        emit("restore → first exec on a node with a cold cache, the snapshot restored elsewhere before (prefetch list known)",
             statistics.median(listed), "ms", statistics.median(warm), "warm restore on the node that took it", "≤ 2×")
        emit("bytes the first cold restore had fetched by its first exec", statistics.median(fetched) / 2**20, "MiB",
             statistics.median(sizes) / 2**20, "the whole snapshot (layers + memory images)")
        sb, snap = warm_snapshot(gw)
        spread = [fork_s(gw, snap.id, args.fanout) for _ in range(max(1, args.runs // 2))]
        sb.terminate()
        Snapshot.delete(snap.id, everywhere=True, client=gw)
    finally:
        problems += cluster.close()
    # The one-node baseline: a standalone daemon, the same state, the same fork.
    (root / "single").mkdir()
    single = start_daemon(binary, ["--pool-size", "0", "--max-sandboxes", "64"], root=root / "single")
    try:
        wait_healthy(single)
        c = Client(url=single.url)
        sb, snap = warm_snapshot(c)
        one = [fork_s(c, snap.id, args.fanout) for _ in range(max(1, args.runs // 2))]
        sb.terminate()
        snap.delete()
    finally:
        problems += tear_down(single)
    emit(f"fork ×{args.fanout} over 4 nodes through the gateway, total", statistics.median(spread), "s",
         statistics.median(one), "the same fork on one standalone node")
    shutil.rmtree(root, ignore_errors=True)
    if problems:
        sys.exit("left behind: " + "; ".join(problems))


if __name__ == "__main__":
    main()
