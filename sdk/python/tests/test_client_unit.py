"""Client behaviour that needs no daemon: URL parsing, configuration, the wire format.

Wire-level checks use a small HTTP server in this process that records what the
client sent and answers with canned status codes — it tests how the SDK speaks
HTTP, not what the daemon does.
"""

from __future__ import annotations

import base64
import builtins
import http.server
import json
import os
import socketserver
import threading
from pathlib import Path
from typing import Iterator, List, Tuple

import pytest

import sandfork
from sandfork import Client, errors, parse_url
from sandfork._streams import OutputStream
from sandfork.models import CommandResult, parse_time


# --- URL parsing and configuration ------------------------------------------------


@pytest.mark.parametrize(
    "url, scheme, where",
    [
        ("unix:///run/sandfork/s.sock", "unix", "/run/sandfork/s.sock"),
        ("unix:///tmp/with%20space.sock", "unix", "/tmp/with space.sock"),
        ("/var/lib/sandfork/sandfork.sock", "unix", "/var/lib/sandfork/sandfork.sock"),
        ("http://127.0.0.1:7070", "http", ("127.0.0.1", 7070, "")),
        ("http://localhost", "http", ("localhost", 80, "")),
        ("https://sandfork.example:8443/api/", "https", ("sandfork.example", 8443, "/api")),
        ("http://[::1]:9000", "http", ("::1", 9000, "")),
    ],
)
def test_parse_url(url: str, scheme: str, where: object) -> None:
    ep = parse_url(url)
    assert ep.scheme == scheme
    if scheme == "unix":
        assert ep.socket_path == where
    else:
        assert (ep.host, ep.port, ep.base_path) == where


@pytest.mark.parametrize("url", ["ftp://host", "unix://relative.sock", "http://", "http://host:notaport", "tcp://1.2.3.4:5"])
def test_parse_url_rejects(url: str) -> None:
    with pytest.raises(errors.InvalidArgumentError) as info:
        parse_url(url)
    assert info.value.code == "invalid_url"


def test_url_round_trips() -> None:
    for url in ["unix:///tmp/a.sock", "http://127.0.0.1:7070", "http://[::1]:9000/x"]:
        assert parse_url(parse_url(url).url) == parse_url(url)


def test_default_socket_when_nothing_is_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SANDFORK_URL", raising=False)
    monkeypatch.delenv("SANDFORK_TOKEN", raising=False)
    client = Client()
    assert client.endpoint.socket_path == "/var/lib/sandfork/sandfork.sock" == sandfork.DEFAULT_SOCKET
    assert client.token is None


def test_environment_configures_the_client(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDFORK_URL", "http://10.1.2.3:7070")
    monkeypatch.setenv("SANDFORK_TOKEN", "s3cret")
    client = Client()
    assert (client.endpoint.host, client.endpoint.port, client.token) == ("10.1.2.3", 7070, "s3cret")


def test_explicit_arguments_beat_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDFORK_URL", "http://10.1.2.3:7070")
    monkeypatch.setenv("SANDFORK_TOKEN", "from-env")
    client = Client(url="unix:///tmp/x.sock", token="explicit")
    assert (client.endpoint.scheme, client.token) == ("unix", "explicit")


def test_unreachable_daemon_raises_a_helpful_connection_error(tmp_path: Path) -> None:
    client = Client(url=f"unix://{tmp_path}/missing.sock")
    with pytest.raises(sandfork.ConnectionError) as info:
        client.request_json("GET", "/v1/health")
    err = info.value
    assert isinstance(err, builtins.ConnectionError) and isinstance(err, sandfork.SandforkError)
    assert str(tmp_path) in err.message and "sandfork serve" in err.message
    assert (err.code, err.status) == ("connection", None)


def test_refused_tcp_port_raises_connection_error() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(sandfork.ConnectionError):
        Client(url=f"http://127.0.0.1:{port}").request("GET", "/v1/health")


# --- a recording HTTP server ---------------------------------------------------------


class Recorder:
    """What the test server received, and what it should answer next."""

    def __init__(self) -> None:
        self.requests: List[Tuple[str, str, dict, bytes]] = []
        self.reply: Tuple[int, str, bytes] = (200, "application/json", b"{}")
        self.chunks: List[bytes] = []
        # Bytes the Content-Length promises beyond the body; the connection then closes.
        self.short_by = 0


def _handler(recorder: Recorder) -> type:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def _body(self) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                data = b""
                while True:
                    size = int(self.rfile.readline().strip(), 16)
                    data += self.rfile.read(size)
                    self.rfile.readline()
                    if size == 0:
                        return data
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def _serve(self) -> None:
            recorder.requests.append((self.command, self.path, dict(self.headers), self._body()))
            status, ctype, body = recorder.reply
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            if recorder.chunks:
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for chunk in recorder.chunks + [b""]:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                return
            self.send_header("Content-Length", str(len(body) + recorder.short_by))
            self.end_headers()
            self.wfile.write(body)
            self.close_connection = recorder.short_by > 0

        do_GET = do_POST = do_PUT = do_DELETE = _serve

    return Handler


class _UnixServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def get_request(self):  # type: ignore[no-untyped-def]
        conn, _ = super().get_request()
        return conn, ("unix", 0)  # BaseHTTPRequestHandler expects a (host, port) address


class _TcpServer(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True


@pytest.fixture(params=["unix", "tcp"])
def served(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Tuple[Client, Recorder]]:
    recorder = Recorder()
    if request.param == "unix":
        path = str(tmp_path / "t.sock")
        server: socketserver.BaseServer = _UnixServer(path, _handler(recorder))
        url = f"unix://{path}"
    else:
        server = _TcpServer(("127.0.0.1", 0), _handler(recorder))
        url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
    thread.start()
    try:
        yield Client(url=url, token="tok-123"), recorder
    finally:
        server.shutdown()
        server.server_close()


def test_bearer_token_and_json_body_are_sent(served: Tuple[Client, Recorder]) -> None:
    client, rec = served
    rec.reply = (201, "application/json", b'{"id": "sb-1", "state": "running"}')
    doc = client.request_json("POST", "/v1/sandboxes", json_body={"image": "busybox"})
    assert doc == {"id": "sb-1", "state": "running"}
    method, path, headers, body = rec.requests[-1]
    assert (method, path) == ("POST", "/v1/sandboxes")
    assert headers["Authorization"] == "Bearer tok-123"
    assert headers["Content-Type"] == "application/json"
    assert json.loads(body) == {"image": "busybox"}


def test_no_authorization_header_without_token(served: Tuple[Client, Recorder], monkeypatch: pytest.MonkeyPatch) -> None:
    client, rec = served
    monkeypatch.delenv("SANDFORK_TOKEN", raising=False)
    Client(url=client.url).request("GET", "/v1/health")
    assert "Authorization" not in rec.requests[-1][2]


def test_query_parameters_are_encoded(served: Tuple[Client, Recorder]) -> None:
    client, rec = served
    client.request("GET", "/v1/sandboxes/x/files", query={"path": "/a b/ü&c", "recursive": True, "mode": None})
    assert rec.requests[-1][1] == "/v1/sandboxes/x/files?path=%2Fa+b%2F%C3%BC%26c&recursive=true"


@pytest.mark.parametrize(
    "status, cls",
    [
        (400, errors.InvalidArgumentError),
        (401, errors.AuthError),
        (404, errors.NotFoundError),
        (408, errors.SandforkTimeoutError),
        (409, errors.ConflictError),
        (413, errors.TooLargeError),
        (422, errors.UnsupportedError),
        (429, errors.CapacityError),
        (500, errors.ServerError),
        (503, errors.UnavailableError),
    ],
)
def test_error_statuses_become_typed_exceptions(served: Tuple[Client, Recorder], status: int, cls: type) -> None:
    client, rec = served
    rec.reply = (status, "application/json", json.dumps({"code": "some_code", "message": "Sandbox sb-9 is suspended"}).encode())
    with pytest.raises(cls) as info:
        client.request_json("GET", "/v1/sandboxes/sb-9")
    err = info.value
    assert (err.code, err.status, err.message) == ("some_code", status, "Sandbox sb-9 is suspended")
    assert "Sandbox sb-9 is suspended" in str(err)


def test_error_without_json_body_keeps_the_text(served: Tuple[Client, Recorder]) -> None:
    client, rec = served
    rec.reply = (502, "text/plain", b"bad gateway")
    with pytest.raises(errors.ServerError) as info:
        client.request("GET", "/v1/health")
    assert info.value.message == "bad gateway"


def test_streamed_upload_is_sent_whole(served: Tuple[Client, Recorder], tmp_path: Path) -> None:
    client, rec = served
    rec.reply = (204, "application/json", b"")
    data = os.urandom(3 * 1024 * 1024 + 17)
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    with open(src, "rb") as f:
        client.request("PUT", "/upload", body=f, headers={"Content-Length": str(len(data))})
    assert rec.requests[-1][3] == data
    client.request("PUT", "/upload", body=iter([b"ab", b"cd", b"e"]))  # chunked
    assert rec.requests[-1][3] == b"abcde"


def _ndjson(*records: dict) -> List[bytes]:
    return [json.dumps(r).encode() + b"\n" for r in records]


def test_exec_stream_reassembles_output_split_inside_a_character(served: Tuple[Client, Recorder]) -> None:
    client, rec = served
    euro = "€".encode()  # three bytes, split across two chunks
    rec.chunks = _ndjson(
        {"type": "stdout", "data": "price: ", "offset": 0},
        {"type": "stdout", "data_b64": base64.b64encode(euro[:1]).decode(), "offset": 7},
        {"type": "stderr", "data": "warn\n", "offset": 0},
        {"type": "stdout", "data_b64": base64.b64encode(euro[1:] + b"\n").decode(), "offset": 8},
        {"type": "future_kind", "anything": 1},
        {"type": "exit", "exit_code": None, "signal": 9, "timed_out": True, "duration_ms": 12},
    )
    seen: List[str] = []
    stream = OutputStream(client.open("POST", "/x", unbounded=True), on_stdout=seen.append)
    events = list(stream)
    assert [e.stream for e in events] == ["stdout", "stdout", "stderr", "stdout"]
    assert seen == ["price: €"], "whole lines, without the newline"
    assert b"".join(e.raw for e in events if e.stream == "stdout") == "price: €\n".encode()
    result = stream.result
    assert result is not None
    assert (result.stdout, result.stderr, result.exit_code, result.signal, result.timed_out) == ("price: €", "warn", -9, 9, True)


def test_stream_error_record_raises_typed_error(served: Tuple[Client, Recorder]) -> None:
    client, rec = served
    rec.chunks = _ndjson({"type": "stdout", "data": "x"}, {"type": "error", "code": "not_found", "message": "Sandbox sb-1 is gone"})
    stream = OutputStream(client.open("GET", "/x", unbounded=True))
    assert next(stream).data == "x"
    with pytest.raises(errors.NotFoundError, match="sb-1 is gone"):
        next(stream)


def test_stream_cut_short_raises_connection_error(served: Tuple[Client, Recorder]) -> None:
    client, rec = served
    rec.chunks = _ndjson({"type": "stdout", "data": "x"})
    with pytest.raises(sandfork.ConnectionError, match="without an exit record"):
        OutputStream(client.open("GET", "/x", unbounded=True)).wait()


def test_body_cut_short_of_its_length_raises_connection_error(served: Tuple[Client, Recorder]) -> None:
    client, rec = served
    rec.reply = (200, "application/octet-stream", b"x" * 1000)
    rec.short_by = 500
    with pytest.raises(sandfork.ConnectionError, match="broke"):
        b"".join(client.open("POST", "/x", unbounded=True).iter_chunks(300))


# --- decoding ----------------------------------------------------------------------


def test_command_result_decodes_binary_output() -> None:
    doc = {"stdout": "\ufffd", "stdout_b64": base64.b64encode(b"\xff\x00").decode(), "stderr": "", "exit_code": 0, "signal": None, "timed_out": False, "duration_ms": 3}
    result = CommandResult.from_json(doc)
    assert result.stdout_bytes == b"\xff\x00" and result.exit_code == 0 and result.ok


def test_parse_time_handles_nanoseconds_and_z() -> None:
    t = parse_time("2026-11-29T21:00:01.123456789Z")
    assert t is not None and (t.year, t.microsecond, t.utcoffset().total_seconds()) == (2026, 123456, 0)
    assert parse_time("not a time") is None


def test_public_names_exist() -> None:
    from sandfork import CheckpointType, Sandbox, Snapshot  # noqa: F401
    from sandfork.aio import AsyncSandbox, AsyncSnapshot  # noqa: F401

    assert CheckpointType.FILESYSTEM == "filesystem" and CheckpointType.MEMORY.value == "memory"
    assert sandfork.__version__
    assert all(hasattr(sandfork, name) for name in sandfork.__all__)
    assert Path(sandfork.__file__).with_name("py.typed").exists()


# --- snapshot and fork requests (their daemon routes may not exist yet) -------------


def test_checkpoint_and_snapshot_requests(served: Tuple[Client, Recorder]) -> None:
    client, rec = served
    snap_doc = {"id": "snap-1", "type": "memory", "source_sandbox_id": "sb-1", "size_bytes": 42, "created_at": "2026-11-29T21:00:00Z"}
    rec.reply = (201, "application/json", json.dumps(snap_doc).encode())
    sb = sandfork.Sandbox("sb 1", client=client)
    snap = sb.checkpoint(checkpoint_type=sandfork.CheckpointType.MEMORY, name="warm")
    method, path, _, body = rec.requests[-1]
    assert (method, path, json.loads(body)) == ("POST", "/v1/sandboxes/sb%201/checkpoint", {"type": "memory", "name": "warm"})
    assert (snap.snapshot_id, snap.type, snap.sandbox_id, snap.size_bytes) == ("snap-1", "memory", "sb-1", 42)
    assert snap.created_at is not None

    rec.reply = (204, "application/json", b"")
    snap.delete()
    assert rec.requests[-1][:2] == ("DELETE", "/v1/snapshots/snap-1")
    sandfork.Snapshot.delete("snap-2", client=client)
    assert rec.requests[-1][:2] == ("DELETE", "/v1/snapshots/snap-2")
    sandfork.Sandbox.delete_snapshot("snap-3", client=client)
    assert rec.requests[-1][:2] == ("DELETE", "/v1/snapshots/snap-3")

    rec.reply = (200, "application/json", json.dumps({"snapshots": [snap_doc]}).encode())
    assert sandfork.Snapshot.list(source="sb-1", type="memory", client=client) == [snap]
    assert rec.requests[-1][1] == "/v1/snapshots?source=sb-1&type=memory"


def test_fork_result_decodes_children_and_errors(served: Tuple[Client, Recorder]) -> None:
    client, rec = served
    child = {"id": "sb-c0", "state": "running", "fork": {"index": 0, "parent_snapshot_id": "snap-1"}}
    doc = {
        "snapshot_id": "snap-1",
        "children": [
            {"index": 1, "error": {"code": "over_capacity", "message": "Too many sandboxes"}},
            {"index": 0, "sandbox": child},
        ],
    }
    rec.reply = (200, "application/json", json.dumps(doc).encode())
    result = sandfork.Snapshot.fork("snap-1", 2, env={"A": "1"}, per_child=[{"env": {"I": "0"}}, {"env": {"I": "1"}}], client=client)
    method, path, _, body = rec.requests[-1]
    assert (method, path) == ("POST", "/v1/snapshots/snap-1/fork")
    assert json.loads(body) == {"count": 2, "env": {"A": "1"}, "per_child": [{"env": {"I": "0"}}, {"env": {"I": "1"}}]}
    assert [sb.id for sb in result] == ["sb-c0"] == [c.sandbox_id for c in result.sandboxes if c.status == "running"]
    assert [(c.index, c.status, c.reason) for c in result.sandboxes] == [(0, "running", None), (1, "failed", "Too many sandboxes")]
    assert [c.index for c in result.children] == [0, 1] and not result.ok
    failed = result.errors[0]
    assert failed.index == 1 and isinstance(failed.error, sandfork.CapacityError) and failed.error.message == "Too many sandboxes"
    with pytest.raises(sandfork.ForkError) as info:
        result.raise_for_errors()
    assert info.value.result is result and info.value.code == "over_capacity"

    sb = sandfork.Sandbox("sb-src", client=client)
    copies = sb.copy(times=3)
    assert rec.requests[-2][1] == "/v1/sandboxes/sb-src/fork" and json.loads(rec.requests[-2][3]) == {"count": 3}
    assert rec.requests[-1][:2] == ("DELETE", "/v1/snapshots/snap-1"), "copy() leaves no snapshot behind"
    assert copies.snapshot_id == "snap-1" and copies.source_sandbox_id == "sb-src"
    with pytest.raises(sandfork.InvalidArgumentError):
        sb.fork(0)
