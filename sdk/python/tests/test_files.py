"""File helpers against the real daemon."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import pytest

import sandfork
from sandfork import Sandbox

pytestmark = pytest.mark.daemon


def test_write_read_round_trip(sandbox: Sandbox) -> None:
    sandbox.write_file("/tmp/sdk/hello.txt", "héllo\n")
    assert sandbox.read_file("/tmp/sdk/hello.txt") == "héllo\n".encode()
    data = os.urandom(100_000)
    sandbox.write_file("/tmp/sdk/blob.bin", data)
    assert sandbox.read_file("/tmp/sdk/blob.bin") == data
    assert sandbox.run("cat", ["/tmp/sdk/hello.txt"]).stdout == "héllo"


def test_write_file_mode(sandbox: Sandbox) -> None:
    sandbox.write_file("/tmp/sdk/run.sh", "#!/bin/sh\necho ran\n", mode=0o755)
    assert sandbox.stat("/tmp/sdk/run.sh").mode & 0o777 == 0o755
    assert sandbox.run("/tmp/sdk/run.sh").stdout == "ran"


def test_list_stat_mkdir_remove(sandbox: Sandbox) -> None:
    sandbox.mkdir("/tmp/sdk-tree/a/b")
    sandbox.write_file("/tmp/sdk-tree/a/f.txt", b"12345")
    listing = sandbox.list_dir("/tmp/sdk-tree/a")
    by_name = {e.name: e for e in listing}
    assert set(by_name) == {"b", "f.txt"}
    assert by_name["b"].is_dir and by_name["f.txt"].is_file and by_name["f.txt"].size == 5
    assert listing.path == "/tmp/sdk-tree/a" and listing.entries == list(listing)
    assert [e.name for e in sandbox.list_directory("/tmp/sdk-tree")] == ["a"]
    st = sandbox.stat("/tmp/sdk-tree/a/f.txt")
    assert (st.type, st.size) == ("file", 5) and st.modified_at is not None
    assert sandbox.exists("/tmp/sdk-tree/a/f.txt")
    sandbox.delete_file("/tmp/sdk-tree/a/f.txt")
    assert not sandbox.exists("/tmp/sdk-tree/a/f.txt")
    with pytest.raises(sandfork.SandforkError):
        sandbox.remove("/tmp/sdk-tree")  # not empty
    sandbox.remove("/tmp/sdk-tree", recursive=True)
    assert not sandbox.exists("/tmp/sdk-tree")


def test_missing_file_is_not_found(sandbox: Sandbox) -> None:
    with pytest.raises(sandfork.NotFoundError):
        sandbox.read_file("/nonexistent/file")
    with pytest.raises(sandfork.NotFoundError):
        sandbox.stat("/nonexistent/file")


def test_relative_path_is_refused(sandbox: Sandbox) -> None:
    with pytest.raises(sandfork.InvalidArgumentError):
        sandbox.read_file("relative/path")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def test_upload_download_20_mb(sandbox: Sandbox, tmp_path: Path) -> None:
    src = tmp_path / "big.bin"
    with open(src, "wb") as f:
        for _ in range(20):
            f.write(os.urandom(1 << 20))
    os.chmod(src, 0o640)
    sandbox.upload_file(src, "/tmp/sdk/big.bin")
    inside = sandbox.run("sh", ["-c", "sha256sum /tmp/sdk/big.bin; stat -c %s /tmp/sdk/big.bin"]).stdout.split()
    assert inside[0] == _sha256(src) and inside[-1] == str(20 << 20)
    assert sandbox.stat("/tmp/sdk/big.bin").mode & 0o777 == 0o640
    dst = tmp_path / "back.bin"
    assert sandbox.download_file("/tmp/sdk/big.bin", dst) == 20 << 20
    assert _sha256(dst) == _sha256(src)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == [], "no temporary file left behind"


def test_failed_download_leaves_no_file(sandbox: Sandbox, tmp_path: Path) -> None:
    with pytest.raises(sandfork.NotFoundError):
        sandbox.download_file("/nonexistent", tmp_path / "out")
    assert list(tmp_path.iterdir()) == []


def test_watch_dir_sees_creates_writes_renames_and_deletes(daemon) -> None:
    import asyncio
    import threading

    from sandfork.aio import AsyncSandbox

    with Sandbox.create(image="busybox", memory_mb=64) as sb:
        sb.run("mkdir", ["-p", "/w/sub"])
        seen: list = []
        watch = sb.watch_dir("/w", recursive=True)
        reader = threading.Thread(target=lambda: [seen.append(e) for e in watch], daemon=True)
        reader.start()
        sb.run("sh", ["-c", "echo a > /w/f; mv /w/f /w/g; mkdir /w/sub/new; echo b > /w/sub/new/deep; chmod 600 /w/g; rm /w/g"])

        def has(kind: str, path: str) -> bool:
            return any(e.type == kind and e.path == path for e in list(seen))

        deadline = time.monotonic() + 10
        while not has("delete", "/w/g"):
            assert time.monotonic() < deadline, seen
            time.sleep(0.05)
        watch.close()
        reader.join(5)
        assert has("create", "/w/f") and has("modify", "/w/f") and has("chmod", "/w/g"), seen
        renamed = [e for e in seen if e.type == "rename"]
        assert [(e.old_path, e.path) for e in renamed] == [("/w/f", "/w/g")], seen
        assert any(e.type == "create" and e.path == "/w/sub/new" and e.is_dir for e in seen), seen
        assert has("create", "/w/sub/new/deep"), "a directory made under a recursive watch is watched"

        with pytest.raises(sandfork.SandboxError):
            sb.watch_dir("/etc/hostname")
        with pytest.raises(sandfork.NotFoundError):
            sb.watch_dir("/nope")

        async def async_watch() -> list:
            handle = await AsyncSandbox.connect(sb.id)
            stream = await handle.watch_dir("/w")
            await handle.run("touch", ["/w/async"])
            first = await stream.__anext__()
            await stream.aclose()
            return [first.type, first.path]

        assert asyncio.run(async_watch()) == ["create", "/w/async"]
        # The watch ended with the client: the sandbox checkpoints again (the daemon notices
        # a client has left at the stream's next heartbeat, within a second or two).
        deadline = time.monotonic() + 10
        while True:
            try:
                sb.checkpoint(checkpoint_type=sandfork.CheckpointType.MEMORY)
                break
            except sandfork.ConflictError:
                assert time.monotonic() < deadline, "a watch whose client left still holds the sandbox"
                time.sleep(0.2)
