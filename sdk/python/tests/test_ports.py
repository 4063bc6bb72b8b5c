"""The port gateway against the real daemon: a real web app in a sandbox (JSON echo,
server-sent events, WebSocket echo) reached by path and by host, over HTTP/1.1 and
HTTP/2, through real clients (curl, the ``websockets`` package); private by default with
tokens and signed URLs; bad ports and floods; a suspended sandbox resumed by a request."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

from sandfork import Sandbox, SandboxClient
from sandfork.errors import InvalidArgumentError

websockets_sync = pytest.importorskip("websockets.sync.client")
pytestmark = pytest.mark.filterwarnings("ignore:connect\\(\\) must be used as a context manager:DeprecationWarning")

APP = Path(__file__).parent / "apps" / "portapp.py"
PORT = 8080


def start_app(sb: Sandbox, port: int = PORT) -> None:
    sb.write_file("/srv/portapp.py", APP.read_bytes())
    sb.start_process("python3", ["/srv/portapp.py", str(port)])
    deadline = time.monotonic() + 30
    probe = f"import socket; socket.create_connection(('127.0.0.1', {port}), 1)"
    while sb.run("python3", ["-c", probe]).exit_code != 0:
        assert time.monotonic() < deadline, "the app did not start"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def web(daemon) -> Any:
    with Sandbox.create(image="python", memory_mb=256, name="ports-web") as sb:
        start_app(sb)
        yield sb


def curl(daemon: Any, path: str, *args: str, host: str = "localhost") -> Tuple[int, bytes, Dict[str, str]]:
    """``curl`` over the daemon's socket: status, body, and curl's own facts."""
    out = subprocess.run(
        ["curl", "-sS", "--unix-socket", str(daemon.socket), "-H", f"Host: {host}", "-o", "-",
         "-w", "\n%{json}", *args, f"http://localhost{path}"],
        capture_output=True, timeout=60,
    )  # fmt: skip
    body, _, facts = out.stdout.rpartition(b"\n")
    info = json.loads(facts)
    return int(info["http_code"]), body, info


def reached(sb: Sandbox) -> List[str]:
    return sb.read_file("/tmp/requests.log").decode().splitlines() if sb.run("test", ["-f", "/tmp/requests.log"]).exit_code == 0 else []


def test_rotating_the_token_revokes_every_earlier_token_and_signed_url(daemon) -> None:
    """Access tokens and signed URLs (valid up to 30 days) can be revoked: a rotation makes
    every earlier one open nothing, for this sandbox only, and survives a restart of the
    sandbox's record (the epoch is persisted with it)."""
    with Sandbox.create(image="python", memory_mb=256) as sb, Sandbox.create(image="python", memory_mb=256) as other:
        start_app(sb)
        start_app(other)
        base = f"/v1/sandboxes/{sb.id}/ports/{PORT}"
        old_token, other_token = sb.port_token(), other.port_token()
        old_signed = sb.get_url(PORT, expires_in=3600).split(":", 2)[2]
        assert curl(daemon, f"{base}/before", "-H", f"X-Sandfork-Access-Token: {old_token}")[0] == 200
        assert curl(daemon, old_signed)[0] == 200
        new_token = sb.rotate_port_token()
        assert new_token != old_token and sb.port_token() == new_token
        assert curl(daemon, f"{base}/after-1", "-H", f"X-Sandfork-Access-Token: {old_token}")[0] == 403
        assert curl(daemon, old_signed)[0] == 403
        assert not any(p.startswith("/after") for p in reached(sb))
        assert curl(daemon, f"{base}/after-2", "-H", f"X-Sandfork-Access-Token: {new_token}")[0] == 200
        assert curl(daemon, sb.get_url(PORT, expires_in=60).split(":", 2)[2])[0] == 200
        # Another sandbox's token is untouched.
        assert other.port_token() == other_token
        assert curl(daemon, f"/v1/sandboxes/{other.id}/ports/{PORT}/x", "-H", f"X-Sandfork-Access-Token: {other_token}")[0] == 200
        sb.suspend()
        sb.resume()
        assert sb.port_token() == new_token, "the rotation survives a suspend and resume"


def test_private_by_default_tokens_and_signed_urls(daemon, web: Sandbox) -> None:
    base = f"/v1/sandboxes/{web.id}/ports/{PORT}"
    token = web.port_token()
    # No token: 401; a wrong one: 403; nothing reaches the app.
    assert curl(daemon, f"{base}/secret-1")[0] == 401
    assert curl(daemon, f"{base}/secret-2", "-H", "X-Sandfork-Access-Token: nope")[0] == 403
    assert curl(daemon, f"{base}/secret-3?sandfork_token=nope")[0] == 403
    assert not any(p.startswith("/secret") for p in reached(web))
    # The token in a header or the query; what the app sees carries neither.
    status, body, _ = curl(daemon, f"{base}/hello?x=1", "-H", f"X-Sandfork-Access-Token: {token}")
    seen = json.loads(body)
    assert status == 200 and seen["path"] == "/hello?x=1"
    assert not any(k.lower() == "x-sandfork-access-token" for k in seen["headers"])
    assert {k.lower(): v for k, v in seen["headers"].items()}.get("x-forwarded-prefix") == base
    status, body, _ = curl(daemon, f"{base}/q?a=1&sandfork_token={token}&b=2")
    assert status == 200 and json.loads(body)["path"] == "/q?a=1&b=2"
    # A signed URL opens its port until it expires; a forged or stale one does not.
    url = web.get_url(PORT, expires_in=60)
    path = url.split(":", 2)[2]
    assert curl(daemon, path)[0] == 200
    assert curl(daemon, path.replace("sandfork_signature=", "sandfork_signature=0"))[0] == 403
    other_port = path.replace(f"/ports/{PORT}/", "/ports/8081/")
    assert curl(daemon, other_port)[0] == 403
    stale = path.split("sandfork_expires=")[0] + "sandfork_expires=1&sandfork_signature=00"
    assert curl(daemon, stale)[0] == 403


def test_host_routing_and_http2(daemon, web: Sandbox, tmp_path: Path) -> None:
    token = web.port_token()
    host = web.get_host(PORT)
    assert host == f"{PORT}-{web.id}.localhost"
    status, body, _ = curl(daemon, "/by-host?y=2", "-H", f"X-Sandfork-Access-Token: {token}", host=host)
    assert status == 200 and json.loads(body)["path"] == "/by-host?y=2"
    assert curl(daemon, "/by-host", host=host)[0] == 401
    # HTTP/2 from the client (prior knowledge, as over plain TCP); the app speaks 1.1.
    base = f"/v1/sandboxes/{web.id}/ports/{PORT}"
    status, body, facts = curl(daemon, f"{base}/h2", "--http2-prior-knowledge", "-H", f"X-Sandfork-Access-Token: {token}")
    assert status == 200 and facts["http_version"] == "2" and json.loads(body)["path"] == "/h2"
    big = tmp_path / "big"
    big.write_bytes(b"x" * 300_000)
    status, body, _ = curl(daemon, f"{base}/post", "--http2-prior-knowledge", "-H", f"X-Sandfork-Access-Token: {token}", "--data-binary", f"@{big}")
    assert status == 200 and body == b"x" * 300_000


def test_websocket_and_server_sent_events(daemon, web: Sandbox) -> None:
    token = web.port_token()
    uri = f"ws://localhost/v1/sandboxes/{web.id}/ports/{PORT}/ws"
    ws = websockets_sync.unix_connect(str(daemon.socket), uri, additional_headers={"X-Sandfork-Access-Token": token})
    try:
        for msg in ["hello", b"\x00\x01binary", "x" * 5000]:
            ws.send(msg)
            assert ws.recv(timeout=20) == msg
    finally:
        ws.close()
    # Events arrive as the app writes them, not once the response is complete.
    s = socket.socket(socket.AF_UNIX)
    s.connect(str(daemon.socket))
    s.sendall(f"GET /v1/sandboxes/{web.id}/ports/{PORT}/events HTTP/1.1\r\nHost: localhost\r\nX-Sandfork-Access-Token: {token}\r\n\r\n".encode())
    got, first_at, started = b"", None, time.monotonic()
    s.settimeout(20)
    while b"tick 2" not in got:
        chunk = s.recv(65536)
        assert chunk, got
        got += chunk
        if first_at is None and b"tick 0" in got:
            first_at = time.monotonic()
    s.close()
    assert b"text/event-stream" in got and first_at is not None
    assert time.monotonic() - first_at > 0.5, "the events came all at once"


def test_bad_ports_and_exposure(daemon) -> None:
    with Sandbox.create(memory_mb=64, public_ports=True) as sb:
        base = f"/v1/sandboxes/{sb.id}/ports"
        status, body, _ = curl(daemon, f"{base}/0/")
        assert status == 400 and b"1-65535" in body
        assert curl(daemon, f"{base}/70000/")[0] == 400
        status, body, _ = curl(daemon, f"{base}/9/")
        assert status == 502 and b"Nothing listens on port 9" in body
        # Without credentials, a sandbox that does not exist is answered as one that does.
        assert curl(daemon, f"/v1/sandboxes/sb-nope/ports/80/")[0] == 401
        # Public: no token needed; limited to the exposed ports.
        sb.start_process("httpd", ["-f", "-p", "127.0.0.1:8000", "-h", "/etc"])
        time.sleep(0.5)
        assert curl(daemon, f"{base}/8000/hostname")[0] == 200
        info = SandboxClient(client=sb.client).expose_ports(sb.id, [8000])
        assert info.exposed_ports == [8000] and info.allow_unauthenticated_access
        status, body, _ = curl(daemon, f"{base}/9/")
        assert status == 403 and b"not exposed" in body
        access = SandboxClient(client=sb.client).get_port_access(sb.id)
        assert access.exposed_ports == [8000] and access.ingress_endpoint == "localhost"
        sb.update(allow_unauthenticated_access=False)
        assert curl(daemon, f"{base}/8000/hostname")[0] == 401
        with pytest.raises(InvalidArgumentError):
            sb.update(exposed_ports=[0])


def test_a_port_request_resumes_a_suspended_sandbox(daemon) -> None:
    with Sandbox.create(image="python", memory_mb=256, name="ports-sleepy") as sb:
        start_app(sb, 8090)
        token = sb.port_token()
        sb.suspend()
        assert sb.status == "suspended"
        status, body, _ = curl(daemon, f"/v1/sandboxes/{sb.id}/ports/8090/woke", "-H", f"X-Sandfork-Access-Token: {token}")
        assert status == 200 and json.loads(body)["path"] == "/woke"
        assert sb.status == "running"


def test_one_sandboxs_flood_does_not_stall_another(daemon, web: Sandbox) -> None:
    with Sandbox.create(image="python", memory_mb=256, public_ports=True) as flooded:
        start_app(flooded, 8070)
        # Slow-loris clients and a pile of open WebSockets on one sandbox...
        held: List[Any] = []
        for _ in range(40):
            s = socket.socket(socket.AF_UNIX)
            s.connect(str(daemon.socket))
            s.sendall(b"GET /v1/sandboxes/" + flooded.id.encode() + b"/ports/8070/ HTTP/1.1\r\nHost: x\r\n")
            held.append(s)
        uri = f"ws://localhost/v1/sandboxes/{flooded.id}/ports/8070/ws"
        for _ in range(40):
            held.append(websockets_sync.unix_connect(str(daemon.socket), uri))
        try:
            # ...and another sandbox's traffic goes on at once.
            token = web.port_token()
            started = time.monotonic()
            for i in range(20):
                assert curl(daemon, f"/v1/sandboxes/{web.id}/ports/{PORT}/ok-{i}", "-H", f"X-Sandfork-Access-Token: {token}")[0] == 200
            assert time.monotonic() - started < 20
            # One sandbox's access token opens none of another's ports.
            cross = f"/v1/sandboxes/{web.id}/ports/{PORT}/cross"
            assert curl(daemon, cross, "-H", f"X-Sandfork-Access-Token: {flooded.port_token()}")[0] == 403
            assert "/cross" not in reached(web)
        finally:
            for h in held:
                h.close()
