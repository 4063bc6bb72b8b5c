"""A small WebSocket client (RFC 6455) over the SDK's own connections, standard library only.

The SDK has no dependencies, so terminal sessions cannot lean on a WebSocket package;
this is the client side only: masked frames out, unfragmented or fragmented frames in,
pings answered, and the close handshake. It rides the same Unix-socket, TCP or TLS
connection every other request uses.
"""

from __future__ import annotations

import base64
import hashlib
import os
import struct
import threading
from typing import Any, Dict, Optional, Tuple

from . import errors

_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
_MAX_MESSAGE = 16 << 20

TEXT, BINARY, CLOSE, PING, PONG = 0x1, 0x2, 0x8, 0x9, 0xA


class WebSocket:
    """One WebSocket connection; :meth:`send` is safe from several threads, :meth:`recv`
    is for one reader."""

    def __init__(self, sock: Any, rfile: Any) -> None:
        self._sock = sock
        self._rfile = rfile
        self._send_lock = threading.Lock()
        self.closed = False

    @classmethod
    def connect(cls, client: Any, target: str) -> "WebSocket":
        """Opens ``target`` (path and query) on ``client``'s daemon as a WebSocket.

        Raises the typed error of the daemon's answer when it refuses the upgrade.
        """
        conn = client._connect(None)
        sock = conn.sock
        key = base64.b64encode(os.urandom(16)).decode()
        hdrs = client._headers({"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Key": key, "Sec-WebSocket-Version": "13"})
        hdrs["Host"] = conn.host if client.endpoint.scheme != "unix" else "localhost"
        lines = [f"GET {target} HTTP/1.1"] + [f"{k}: {v}" for k, v in hdrs.items()]
        try:
            sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
            rfile = sock.makefile("rb")
            status, headers = _read_head(rfile)
        except OSError as e:
            sock.close()
            raise errors.ConnectionError(f"WebSocket handshake with the daemon failed: {e}") from e
        if status != 101:
            length = int(headers.get("content-length", "0") or 0)
            body = rfile.read(min(length, 1 << 20)) if length else b""
            sock.close()
            raise errors.error_from_response(status, body)
        expected = base64.b64encode(hashlib.sha1((key + _GUID).encode()).digest()).decode()
        if headers.get("sec-websocket-accept") != expected:
            sock.close()
            raise errors.ConnectionError("the daemon answered the WebSocket handshake with a wrong key")
        return cls(sock, rfile)

    def send(self, opcode: int, payload: bytes) -> None:
        """Sends one frame (masked, as a client must)."""
        mask = os.urandom(4)
        n = len(payload)
        if n < 126:
            head = struct.pack("!BB", 0x80 | opcode, 0x80 | n)
        elif n < 1 << 16:
            head = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, n)
        else:
            head = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, n)
        with self._send_lock:
            self._sock.sendall(head + mask + _xor(payload, mask))

    def recv(self) -> Tuple[int, bytes]:
        """The next data message ``(TEXT or BINARY, payload)``, or ``(CLOSE, code + reason)``
        once the daemon closes (``(CLOSE, b"")`` when the connection just ended)."""
        parts = []
        first = 0
        while True:
            try:
                fin, opcode, payload = self._frame()
            except (OSError, ValueError, struct.error):
                self.closed = True
                return CLOSE, b""
            if opcode == PING:
                self._safe_send(PONG, payload)
                continue
            if opcode == PONG:
                continue
            if opcode == CLOSE:
                self._safe_send(CLOSE, payload[:2])
                self.closed = True
                return CLOSE, payload
            if opcode != 0:
                first = opcode
            parts.append(payload)
            if sum(map(len, parts)) > _MAX_MESSAGE:
                self.close()
                return CLOSE, b""
            if fin:
                return first, b"".join(parts)

    def close(self, code: int = 1000) -> None:
        """Closes the connection (politely when it is still open)."""
        if not self.closed:
            self._safe_send(CLOSE, struct.pack("!H", code))
            self.closed = True
        try:
            self._sock.close()
        except OSError:
            pass

    def interrupt(self) -> None:
        """Unblocks a :meth:`recv` in another thread (it returns ``CLOSE``)."""
        try:
            import socket

            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _safe_send(self, opcode: int, payload: bytes) -> None:
        try:
            self.send(opcode, payload)
        except OSError:
            pass

    def _frame(self) -> Tuple[bool, int, bytes]:
        head = _exact(self._rfile, 2)
        fin, opcode = bool(head[0] & 0x80), head[0] & 0x0F
        n = head[1] & 0x7F
        if n == 126:
            n = struct.unpack("!H", _exact(self._rfile, 2))[0]
        elif n == 127:
            n = struct.unpack("!Q", _exact(self._rfile, 8))[0]
        if n > _MAX_MESSAGE:
            raise ValueError("WebSocket frame too large")
        mask = _exact(self._rfile, 4) if head[1] & 0x80 else b""
        payload = _exact(self._rfile, n)
        return fin, opcode, _xor(payload, mask) if mask else payload


def close_code(payload: bytes) -> Tuple[Optional[int], str]:
    """The code and reason of a close frame's payload."""
    if len(payload) < 2:
        return None, ""
    return struct.unpack("!H", payload[:2])[0], payload[2:].decode("utf-8", "replace")


def _xor(data: bytes, mask: bytes) -> bytes:
    n = len(data)
    if not n:
        return data
    key = (mask * (n // 4 + 1))[:n]
    return (int.from_bytes(data, "big") ^ int.from_bytes(key, "big")).to_bytes(n, "big")


def _exact(rfile: Any, n: int) -> bytes:
    data = rfile.read(n)
    if len(data) != n:
        raise OSError("connection closed")
    return data


def _read_head(rfile: Any) -> Tuple[int, Dict[str, str]]:
    status_line = rfile.readline(65537).decode("latin-1")
    parts = status_line.split(" ", 2)
    if len(parts) < 2 or not parts[1].isdigit():
        raise OSError(f"not an HTTP answer: {status_line.strip()!r}")
    headers: Dict[str, str] = {}
    while True:
        line = rfile.readline(65537).decode("latin-1")
        if line in ("\r\n", "\n", ""):
            break
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    return int(parts[1]), headers
