"""Tensorlake compatibility against the real daemon: file operations.

Each test is written the way Tensorlake's documentation uses the call (the comment under
its name quotes it); only the import line differs.
"""

from __future__ import annotations

import pytest

from sandfork import DirectoryEntry, ListDirectoryResponse, RemoteAPIError, Sandbox, SandboxError

pytestmark = pytest.mark.daemon


@pytest.fixture(scope="module")
def sandbox(daemon):
    with Sandbox.create(memory_mb=256) as sb:
        yield sb


def test_write_and_read_file(sandbox: Sandbox) -> None:
    # sandbox.write_file("/tmp/data.txt", b"some data"); content = sandbox.read_file("/tmp/data.txt")   (README)
    assert sandbox.write_file("/tmp/data.txt", b"some data") is not None
    content = sandbox.read_file("/tmp/data.txt")
    assert content.value == b"some data"


def test_read_file_result_shapes(sandbox: Sandbox) -> None:
    # content.value.decode()  (docs: sandboxes/async)  and  bytes(content).decode()  (docs: file-operations)
    sandbox.write_file("/workspace/data.csv", b"name,score\nAlice,95\n")
    content = sandbox.read_file("/workspace/data.csv")
    assert content.value.decode() == bytes(content).decode() == content.decode() == "name,score\nAlice,95\n"
    assert content == b"name,score\nAlice,95\n" and isinstance(content.value, bytes) and len(content.trace_id) == 32


def test_write_file_keywords(sandbox: Sandbox) -> None:
    # sandbox.write_file(path="/workspace/a.txt", content=b"...")
    sandbox.write_file(path="/workspace/a.txt", content=b"keyword")
    assert sandbox.read_file(path="/workspace/a.txt") == b"keyword"
    sandbox.write_file("/workspace/text.txt", "text is encoded as UTF-8: é")  # lenient: str accepted
    assert sandbox.read_file("/workspace/text.txt").decode() == "text is encoded as UTF-8: é"


def test_list_directory(sandbox: Sandbox) -> None:
    # sandbox.list_directory("/workspace").entries   (each entry has .name, .is_dir, .size)
    sandbox.write_file("/workspace/list/f.txt", b"12345")
    sandbox.run("mkdir", ["-p", "/workspace/list/sub"])
    listing = sandbox.list_directory("/workspace/list")
    assert isinstance(listing, ListDirectoryResponse) and listing.path == "/workspace/list"
    by_name = {e.name: e for e in listing.entries}
    assert set(by_name) == {"f.txt", "sub"} and all(isinstance(e, DirectoryEntry) for e in listing.entries)
    assert (by_name["f.txt"].is_dir, by_name["f.txt"].size, by_name["sub"].is_dir) == (False, 5, True)
    assert by_name["f.txt"].modified_at is not None
    assert listing.value.entries == listing.entries


def test_delete_file(sandbox: Sandbox) -> None:
    # sandbox.delete_file("/workspace/data.csv")
    sandbox.write_file("/workspace/gone.csv", b"x")
    sandbox.delete_file("/workspace/gone.csv")
    assert "gone.csv" not in [e.name for e in sandbox.list_directory("/workspace").entries]


def test_upload_file(sandbox: Sandbox, tmp_path) -> None:
    # sandbox.upload_file(local_path, path)   (local first, remote second)
    local = tmp_path / "local.bin"
    local.write_bytes(b"\x00\x01binary")
    sandbox.upload_file(local, "/workspace/remote.bin")
    sandbox.upload_file(local_path=str(local), path="/workspace/remote2.bin")
    assert sandbox.read_file("/workspace/remote.bin") == sandbox.read_file("/workspace/remote2.bin") == b"\x00\x01binary"


def test_missing_file(sandbox: Sandbox) -> None:
    # File operations raise RemoteAPIError(404, ...) for a missing file
    with pytest.raises(RemoteAPIError) as info:
        sandbox.read_file("/no/such/file")
    assert info.value.status_code == 404 and "/no/such/file" in info.value.message


def test_file_bad_input(sandbox: Sandbox) -> None:
    # write_file(path, content: bytes): a wrong type is refused before anything is sent
    with pytest.raises(SandboxError, match="content must be bytes"):
        sandbox.write_file("/tmp/x", {"not": "bytes"})
    with pytest.raises(SandboxError, match="path must be a string"):
        sandbox.read_file(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        sandbox.write_file("/tmp/x", data=b"old keyword")  # type: ignore[call-arg]
