"""Named volumes in real sandboxes: data outlives sandboxes, read-only sharing, size
limits, and what checkpoints and forks do with them (the volume is not captured; a
restore mounts it again by name)."""

from __future__ import annotations

import shutil

import pytest

from sandfork import Client, FileSystemMount, Sandbox, SandforkError, Snapshot, Volume

pytestmark = pytest.mark.root


def mount(name: str, path: str, read_only: bool = False) -> FileSystemMount:
    return FileSystemMount(file_system_id=name, mount_path=path, read_only=read_only)


def test_data_outlives_sandboxes_and_is_shared_read_only(daemon) -> None:
    vol = Volume.create("shared", size_mb=64)
    try:
        with Sandbox.create(image="busybox", file_systems=[mount("shared", "/data")]) as sb:
            r = sb.run("sh", ["-c", "echo kept > /data/file && sync && cat /data/file"])
            assert r.exit_code == 0 and r.stdout.strip() == "kept", r.stderr
        assert vol.refresh().mounted_by == []
        readers = [Sandbox.create(image="busybox", file_systems=[mount("shared", "/in", read_only=True)]) for _ in range(2)]
        try:
            assert sorted(vol.refresh().mounted_by) == sorted(s.sandbox_id for s in readers)
            for sb in readers:
                assert sb.run("cat", ["/in/file"]).stdout.strip() == "kept"
                w = sb.run("sh", ["-c", "echo x > /in/other"])
                assert w.exit_code != 0 and "Read-only" in w.stderr, w.stderr
            with pytest.raises(SandforkError) as e:
                vol.delete()
            assert "mounted by" in str(e.value)
        finally:
            for sb in readers:
                sb.terminate()
    finally:
        vol.delete()
    assert "shared" not in [v.name for v in Volume.list()]


def test_a_full_volume_is_enospc_inside_and_nothing_else(daemon) -> None:
    vol = Volume.create("small", size_mb=16)
    try:
        with Sandbox.create(image="busybox", file_systems=[mount("small", "/v")]) as sb:
            r = sb.run("sh", ["-c", "dd if=/dev/zero of=/v/big bs=1M count=64 2>&1; echo rc=$?"])
            assert "No space left" in r.stdout, r.stdout
            assert sb.run("sh", ["-c", "echo fine > /root-ok && cat /root-ok"]).stdout.strip() == "fine"
        assert vol.refresh().used_bytes > 8 << 20
    finally:
        vol.delete()


def test_checkpoints_keep_the_mount_not_the_data(daemon) -> None:
    vol = Volume.create("ckpt", size_mb=32)
    snap = None
    try:
        with Sandbox.create(image="busybox", name="vol-source", file_systems=[mount("ckpt", "/w")]) as sb:
            sb.run("sh", ["-c", "echo before > /w/state && sync"])
            snap = sb.checkpoint(checkpoint_type="memory")
            sb.run("sh", ["-c", "echo after > /w/state && sync"])
        # The fork mounts the same volume: it sees what was written after the checkpoint.
        with Sandbox.create(snapshot_id=snap.snapshot_id) as fork:
            assert fork.run("cat", ["/w/state"]).stdout.strip() == "after"
            fork.run("sh", ["-c", "echo from-fork > /w/fork && sync"])
        with Sandbox.create(image="busybox", file_systems=[mount("ckpt", "/r", read_only=True)]) as reader:
            assert reader.run("cat", ["/r/fork"]).stdout.strip() == "from-fork"
    finally:
        if snap is not None:
            Snapshot.get(snap.snapshot_id).delete()
        vol.delete()


def test_bad_volume_requests_are_refused(daemon) -> None:
    client = Client()
    for body, code in [
        ({"name": "Bad Name"}, 400),
        ({"name": "x", "size_mb": 1}, 400),
        ({"name": "x", "size_mb": 1 << 30}, 400),
        # More than the host disk can give (its free space less the reserve).
        ({"name": "x", "size_mb": (shutil.disk_usage(daemon.data_dir).free >> 20) + 1024}, 400),
    ]:
        with pytest.raises(SandforkError) as e:
            client.request_json("POST", "/v1/volumes", json_body=body)
        assert e.value.status == code, (body, e.value)
    Volume.create("dup", size_mb=16)
    try:
        with pytest.raises(SandforkError) as e:
            Volume.create("dup", size_mb=16)
        assert e.value.status == 409
        for path in ["/proc/x", "relative", "/", "/a/../b", "/dev"]:
            with pytest.raises(SandforkError) as e:
                Sandbox.create(image="busybox", file_systems=[mount("dup", path)])
            assert e.value.status == 400, (path, e.value)
        with pytest.raises(SandforkError) as e:
            Sandbox.create(image="busybox", file_systems=[mount("missing", "/m")])
        assert e.value.status == 404, e.value
    finally:
        Volume.get("dup").delete()
    assert [s for s in Sandbox.list() if s.status == "failed"] == [], "a refused create left a failed sandbox"
