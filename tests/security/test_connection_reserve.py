"""Clients without the token cannot lock the API out (issue finding 4, rest).

The TCP listener keeps `reserved_connections` of its `max_connections` slots for clients
that present the token: clients without it, however busy they keep their connections,
hold at most the rest, and a connection they open while those are all held is answered
503 and closed. Until a connection authenticates, it is closed after `header_timeout_secs`
with nothing in flight, so an HTTP/2 client that only acknowledges pings (or never
finishes a stream's headers) does not keep its slot for `idle_timeout_secs`.
"""

from __future__ import annotations

import shutil
import socket
import tempfile
import threading
import time
from pathlib import Path
from typing import Dict, Iterator, List

import pytest
from test_review_findings import Listening, free_port, own_daemon

TOKEN = "sfsec-reserve-token-0123456789abcdef"
MAX, RESERVE, HEADER_TIMEOUT = 8, 4, 2


@pytest.fixture(scope="module")
def gated() -> Iterator[Listening]:
    root = Path(tempfile.mkdtemp(prefix="sfsec-reserve-"))
    try:
        (root / "token").write_text(TOKEN + "\n")
        (root / "token").chmod(0o600)
        port = free_port()
        config = (f'listen = "127.0.0.1:{port}"\ntoken_file = "{root}/token"\nmax_connections = {MAX}\n'
                  f"reserved_connections = {RESERVE}\nheader_timeout_secs = {HEADER_TIMEOUT}\nidle_timeout_secs = 300\n")  # fmt: skip
        with own_daemon(config=config) as d:
            yield Listening(d, port)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def busy_client(port: int, stop: threading.Event, seen: Dict[str, int]) -> None:
    """Keeps one keep-alive connection busy without the token: a request every half second."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            while not stop.is_set():
                s.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n")
                data = s.recv(4096)
                if not data:
                    seen["closed"] = seen.get("closed", 0) + 1
                    return
                status = data.split(b" ", 2)[1].decode(errors="replace") if b" " in data else "?"
                seen[status] = seen.get(status, 0) + 1
                time.sleep(0.5)
    except OSError:
        seen["error"] = seen.get("error", 0) + 1


@pytest.mark.promise("API listener")
def test_busy_clients_without_the_token_leave_the_reserve_to_those_with_it(attempts, gated) -> None:
    """Twice `max_connections` clients without the token keep their connections busy: they
    hold at most `max_connections - reserved_connections` slots, the rest are answered 503
    and closed, and a client with the token is served at once, again and again."""
    stop, seen = threading.Event(), {}  # type: ignore[var-annotated]
    threads = [threading.Thread(target=busy_client, args=(gated.port, stop, seen), daemon=True) for _ in range(2 * MAX)]
    try:
        for t in threads:
            t.start()
        time.sleep(1.5)
        for i in range(3):
            line, took = gated.get(token=TOKEN, timeout=30)
            attempts.refused(f"busy clients without the token keep one with it out (try {i + 1})", " 200 " in line and took < 1.5, f"{line} after {took:.1f}s; clients saw {seen}")
            time.sleep(0.5)
        attempts.refused("clients past the unauthenticated slots are told so (503) and closed", seen.get("503", 0) > 0, repr(seen))
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=15)


def h2_idle(port: int) -> float:
    """An HTTP/2 connection (prior knowledge) without the token that acknowledges every
    SETTINGS and PING and asks nothing; returns how long the daemon kept it open."""
    t0 = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        buf = b""
        while time.monotonic() - t0 < 60:
            try:
                data = s.recv(4096)
            except OSError:
                break
            if not data:
                break
            buf += data
            while len(buf) >= 9:
                n = int.from_bytes(buf[:3], "big")
                if len(buf) < 9 + n:
                    break
                kind, flags, payload = buf[3], buf[4], buf[9:9 + n]
                buf = buf[9 + n:]
                if kind == 4 and not flags & 1:
                    s.sendall(b"\x00\x00\x00\x04\x01\x00\x00\x00\x00")
                elif kind == 6 and not flags & 1:
                    s.sendall(b"\x00\x00\x08\x06\x01\x00\x00\x00\x00" + payload)
    return time.monotonic() - t0


@pytest.mark.promise("API listener")
def test_idle_http2_clients_without_the_token_are_cut_off_at_the_header_timeout(attempts, gated) -> None:
    """`max_connections` HTTP/2 clients without the token that only answer pings and
    settings: each is closed within the header timeout (and a little), not the 300 s idle
    timeout, and a client with the token is served meanwhile."""
    held: List[float] = []
    threads = [threading.Thread(target=lambda: held.append(h2_idle(gated.port)), daemon=True) for _ in range(MAX)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    line, took = gated.get(token=TOKEN, timeout=30)
    attempts.refused("idle HTTP/2 clients keep a client with the token out", " 200 " in line and took < HEADER_TIMEOUT + 2, f"{line} after {took:.1f}s")
    for t in threads:
        t.join(timeout=70)
    attempts.refused("an idle HTTP/2 client without the token holds its slot past the header timeout", len(held) == MAX and max(held) < HEADER_TIMEOUT + 5, repr(held))
