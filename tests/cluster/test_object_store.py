"""Snapshots through a real S3 server: published by one node, restored warm by another
that never saw them, its disk's blocks fetched as reads need them; and what a bucket that
lies, or goes away, does to it (nothing is corrupted, the errors say what happened)."""

from __future__ import annotations

import hashlib
import json
import time

import pytest

from _metrics import metric
from conftest import Cluster

pytestmark = pytest.mark.root

#: A process that keeps a random state in memory and answers with its hash.
HOLDER = (
    "import hashlib, os, socket, sys\n"
    "state = os.urandom(8 << 20)\n"
    "s = socket.socket(); s.bind(('127.0.0.1', 7001)); s.listen()\n"
    "open('/tmp/ready', 'w').write(hashlib.sha256(state).hexdigest())\n"
    "while True:\n"
    "    c, _ = s.accept(); c.sendall(hashlib.sha256(state).hexdigest().encode()); c.close()\n"
)
ASK = "import socket; s = socket.create_connection(('127.0.0.1', 7001)); print(s.recv(100).decode())"


def busybox_with_state(client):
    """A busybox sandbox with 24 MiB of random data on its disk and a shell loop in memory."""
    from sandfork import Sandbox

    sb = Sandbox.create(image="busybox", client=client, memory_mb=256)
    sb.run("sh", ["-c", "head -c 25165824 /dev/urandom > /data.bin && echo one > /note && sync"])
    sb.run("sh", ["-c", "(i=0; while true; do i=$((i+1)); echo $i > /tmp/c.new; mv /tmp/c.new /tmp/count; sleep 0.2; done) >/dev/null 2>&1 &"])
    return sb


def wait_published(client, snap_id: str, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        doc = client.request_json("GET", f"/v1/snapshots/{snap_id}")
        if doc.get("published"):
            return doc
        time.sleep(0.2)
    raise AssertionError(f"{snap_id} not published within {timeout}s")


def test_a_memory_snapshot_restores_warm_on_a_node_that_never_had_it(cluster: Cluster, client_of) -> None:
    from sandfork import CheckpointType, Sandbox, Snapshot

    a, b = cluster.node("a"), cluster.node("b")
    ca, cb = client_of(a), client_of(b)
    sb = busybox_with_state(ca)
    want = sb.run("sh", ["-c", "sha256sum /data.bin | cut -d' ' -f1"]).stdout.strip()
    # Tensorlake's "completed": in the object store, restorable anywhere.
    snap = sb.checkpoint(checkpoint_type=CheckpointType.MEMORY, wait_until="completed")
    assert snap.published
    assert Snapshot.get(snap.id, client=ca).published
    # B has never seen it: it pulls it when asked for a fork.
    assert snap.id not in [s.id for s in Snapshot.list(client=cb)]
    listed = Snapshot.list(published=True, client=cb)
    assert snap.id in [s.id for s in listed] and all(s.published for s in listed)
    before = metric(b, "sandfork_object_store_bytes_in_total")
    with Snapshot.fork(snap.id, 2, client=cb) as children:
        assert len(children) == 2
        x, y = children
        # Memory came back: the shell loop counts on from where it was.
        counts = [int(c.run("cat", ["/tmp/count"]).stdout) for c in (x, y)]
        assert all(n > 0 for n in counts)
        time.sleep(0.5)
        assert int(x.run("cat", ["/tmp/count"]).stdout) > counts[0]
        assert x.run("cat", ["/note"]).stdout.strip() == "one"
        # The 24 MiB file was not needed by the restore: not fetched yet.
        restored = metric(b, "sandfork_object_store_bytes_in_total") - before
        assert restored < 16 << 20, f"the restore fetched {restored} bytes"
        got = x.run("sh", ["-c", "sha256sum /data.bin | cut -d' ' -f1"]).stdout.strip()
        assert got == want
        # Forks on B are independent of each other and of the source on A.
        x.run("sh", ["-c", "echo x > /note && sync"])
        assert y.run("cat", ["/note"]).stdout.strip() == "one"
        assert sb.run("cat", ["/note"]).stdout.strip() == "one"
        # What B's first restore read is now the manifest's prefetch list, for the next
        # node that restores it.
        key = f"{cluster.prefix}/snapshots/{snap.id}.json"
        deadline = time.monotonic() + 20
        while not json.loads(json.loads(cluster.weed.object(key))["body"])["prefetch"]:
            assert time.monotonic() < deadline, "no prefetch list was recorded"
            time.sleep(0.2)
        # A second fork on B pulls nothing again.
        again = metric(b, "sandfork_object_store_bytes_in_total")
        with Snapshot.fork(snap.id, 1, client=cb) as third:
            assert third[0].run("cat", ["/note"]).stdout.strip() == "one"
        assert metric(b, "sandfork_object_store_bytes_in_total") - again < 1 << 20
    sb.terminate()
    Snapshot.delete(snap.id, client=cb)
    Snapshot.get(snap.id, client=ca).delete(everywhere=True)
    assert snap.id not in [s.id for s in Snapshot.list(published=True, client=cb)]


def test_pulled_pages_are_served_lazily_and_outlive_a_daemon_kill(cluster: Cluster, client_of) -> None:
    from sandfork import CheckpointType, Sandbox, Snapshot

    a, b = cluster.node("a"), cluster.node("b")
    ca, cb = client_of(a), client_of(b)
    sb = busybox_with_state(ca)
    # A shell holding 16 MB (its pages file is served lazily; small ones come whole).
    sb.run("sh", ["-c", "(x=$(head -c 12000000 /dev/urandom | base64); echo ${#x} > /tmp/len; while true; do sleep 1; done) >/dev/null 2>&1 &"])
    deadline = time.monotonic() + 60
    while sb.run("cat", ["/tmp/len"]).exit_code != 0:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    snap = sb.checkpoint(checkpoint_type=CheckpointType.MEMORY, wait_until="completed")
    with Snapshot.fork(snap.id, 1, client=cb) as (child,):
        images = b.data_dir / "snapshots" / snap.id / "memory"
        served = [p for p in images.glob("pages-*.img") if p.is_symlink()]
        assert len(served) == 1, [(p.name, p.is_symlink(), p.stat().st_size) for p in images.iterdir()]
        pages = served[0]
        assert int(child.run("cat", ["/tmp/len"]).stdout) > 16_000_000
        before = int(child.run("cat", ["/tmp/count"]).stdout)
        # The daemon dies; the pages server and the sandbox do not. A pull cut short left
        # a pages directory that no snapshot names: the restarted daemon removes it.
        b.process.kill()
        b.process.wait(30)
        orphan = b.data_dir / "pages" / "mem-00000000-snap-gone-0"
        orphan.mkdir(parents=True)
        b = cluster.kill9_and_restart("b")
        cb = client_of(b)
        child = Sandbox(child.id, client=cb)
        # Its counter goes on (on a loaded machine its pages may take a while to come).
        deadline = time.monotonic() + 20
        while int(child.run("cat", ["/tmp/count"]).stdout) <= before:
            assert time.monotonic() < deadline, "the sandbox's counter stopped"
            time.sleep(0.2)
        assert child.run("cat", ["/note"]).stdout.strip() == "one"
        # The restarted daemon serves the pulled snapshot's pages again.
        with Snapshot.fork(snap.id, 1, client=cb) as (again,):
            assert again.run("cat", ["/note"]).stdout.strip() == "one"
    assert not orphan.exists(), "what no snapshot names is swept at start"
    Snapshot.delete(snap.id, client=cb)
    assert not pages.exists()
    # Released once no lazy restore reads them any more (the last fork is gone by now).
    deadline = time.monotonic() + 30
    while any((b.data_dir / "pages").glob("*")):
        assert time.monotonic() < deadline, "the pages server went with the snapshot"
        time.sleep(0.1)
    sb.terminate()
    Snapshot.delete(snap.id, everywhere=True, client=ca)


def test_a_tampered_chunk_fails_the_read_and_nothing_else(cluster: Cluster, client_of) -> None:
    from sandfork import CheckpointType, Snapshot

    a, b = cluster.node("a"), cluster.node("b")
    ca, cb = client_of(a), client_of(b)
    sb = busybox_with_state(ca)
    snap = sb.checkpoint(checkpoint_type=CheckpointType.FILESYSTEM).publish()
    manifest = json.loads(json.loads(cluster.weed.object(f"{cluster.prefix}/snapshots/{snap.id}.json"))["body"])
    top = manifest["layers"][-1]["id"]
    key = f"{cluster.prefix}/layers/{top}/blocks"
    blocks = bytearray(cluster.weed.object(key))
    assert len(blocks) >= 24 << 20
    # Flip one byte in every MiB of the top layer's blocks.
    for off in range(4096, len(blocks), 1 << 20):
        blocks[off] ^= 0xFF
    cluster.weed.put_object(key, bytes(blocks))
    result = Snapshot.fork(snap.id, 1, client=cb)
    try:
        if result.errors:
            # The tampered blocks were needed to boot (ext4's own metadata): refused as an
            # integrity failure naming the snapshot and the object that failed its hash.
            error = result.errors[0].error
            assert error.code == "integrity", error
            assert snap.id in error.message and f"{cluster.prefix}/{key.split('/', 1)[1]}" in error.message and "hash" in error.message, error.message
        else:
            child = result[0]
            r = child.run("sh", ["-c", "cat /data.bin > /dev/null; echo $?"])
            assert r.stdout.strip() != "0", "a tampered block was read"
            # The sandbox itself still works.
            assert child.run("echo", ["alive"]).stdout.strip() == "alive"
    finally:
        result.terminate_all()
    # The source node never reads the bucket for its own snapshot.
    assert sb.run("sh", ["-c", "cat /data.bin > /dev/null && echo ok"]).stdout.strip() == "ok"
    sb.terminate()
    Snapshot.delete(snap.id, client=ca)
    Snapshot.delete(snap.id, client=cb)


def test_a_tampered_memory_part_is_an_integrity_error_naming_the_object(cluster: Cluster, client_of) -> None:
    from sandfork import CheckpointType, SandforkError, Snapshot

    a, b = cluster.node("a"), cluster.node("b")
    ca, cb = client_of(a), client_of(b)
    sb = busybox_with_state(ca)
    snap = sb.checkpoint(checkpoint_type=CheckpointType.MEMORY)
    wait_published(ca, snap.id)
    manifest = json.loads(json.loads(cluster.weed.object(f"{cluster.prefix}/snapshots/{snap.id}.json"))["body"])
    part = next(f for f in manifest["memory"] if f["size"] > 0)
    key = f"{cluster.prefix}/memory/{part['blake3']}"
    body = bytearray(cluster.weed.object(key))
    body[len(body) // 2] ^= 0xFF
    cluster.weed.put_object(key, bytes(body))
    try:
        # The pull checks each part before it keeps any: the fork is refused as a whole.
        with pytest.raises(SandforkError) as e:
            Snapshot.fork(snap.id, 1, client=cb).raise_for_errors()
        error = e.value
        assert error.code == "integrity", error
        assert key in str(error) and part["name"] in str(error) and "hash" in str(error), str(error)
        # Nothing of it was kept on B, and the source node still has its snapshot.
        assert snap.id not in [s.id for s in Snapshot.list(client=cb)]
    finally:
        sb.terminate()
        Snapshot.delete(snap.id, everywhere=True, client=ca)


def test_a_bucket_that_goes_away_is_retried_then_named_and_leaves_nothing(cluster: Cluster, client_of) -> None:
    from sandfork import CheckpointType, Snapshot, SandforkError

    a = cluster.node("a")
    b = cluster.node("b", config="[object_store]\nretry_secs = 4\n")
    ca, cb = client_of(a), client_of(b)
    sb = busybox_with_state(ca)
    try:
        snap = sb.checkpoint(checkpoint_type=CheckpointType.MEMORY)
        wait_published(ca, snap.id)
        cluster.weed.stop()
        try:
            started = time.monotonic()
            with pytest.raises(SandforkError) as e:
                Snapshot.fork(snap.id, 1, client=cb).raise_for_errors()
            took = time.monotonic() - started
            assert 3 <= took < 60, took
            assert "Object store" in str(e.value) and cluster.weed.endpoint.split("//")[1] in str(e.value), str(e.value)
            # Nothing of it was kept on B.
            assert snap.id not in [s.id for s in Snapshot.list(client=cb)]
            assert not (b.data_dir / "snapshots" / snap.id).exists()
        finally:
            cluster.weed.start()
        with Snapshot.fork(snap.id, 1, client=cb) as (child,):
            assert child.run("cat", ["/note"]).stdout.strip() == "one"
    finally:
        sb.terminate()
    for c in (ca, cb):
        Snapshot.delete(snap.id, client=c)


def test_wrong_credentials_and_bad_settings_are_refused_plainly(cluster: Cluster, weed) -> None:
    import subprocess

    bad = cluster.root / "bad"
    (bad / "data").mkdir(parents=True)
    out = subprocess.run(
        [str(cluster.binary), "serve", "--data-dir", str(bad / "data"), "--socket", str(bad / "s.sock"),
         "--object-store", "s3://Not_A_Bucket", "--object-store-endpoint", weed.endpoint, "--object-store-allow-http"],
        capture_output=True, text=True, timeout=60, env={"AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert out.returncode != 0 and "bucket name" in out.stderr, out.stderr
    out = subprocess.run(
        [str(cluster.binary), "serve", "--data-dir", str(bad / "data"), "--socket", str(bad / "s.sock"),
         "--object-store", "s3://sandfork", "--object-store-endpoint", weed.endpoint],
        capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert out.returncode != 0 and "no credentials" in out.stderr, out.stderr
    # A node with the wrong secret: its publish fails with the server's refusal, and its
    # snapshots stay usable where they are.
    from sandfork import CheckpointType, Client, Sandbox

    n = cluster.node("wrong", config='[object_store]\nsecret_access_key = "not-the-secret"\nretry_secs = 2\n')
    c = Client(url=n.url)
    sb = Sandbox.create(image="busybox", client=c, memory_mb=128)
    snap = sb.checkpoint(checkpoint_type=CheckpointType.FILESYSTEM)
    with pytest.raises(Exception) as e:
        c.request_json("POST", f"/v1/snapshots/{snap.id}/publish")
    assert "Object store" in str(e.value), str(e.value)
    with Sandbox.create(snapshot_id=snap.id, client=c) as again:
        assert again.run("echo", ["fine"]).stdout.strip() == "fine"
    sb.terminate()
    c.request("DELETE", f"/v1/snapshots/{snap.id}")
