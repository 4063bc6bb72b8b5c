"""Terminal sessions: a process on a pseudo-terminal in the sandbox, driven over a WebSocket.

``sandbox.pty.create()`` (or Tensorlake's ``sandbox.create_pty()``) starts one (a login
shell unless told otherwise) and returns a :class:`PtySession` (Tensorlake's ``Pty``): iterate it for output, or pass ``on_data`` to have a thread deliver
it; type with :meth:`PtySession.send`, resize with :meth:`PtySession.resize`. A session
outlives its connection: :meth:`PtyCommands.connect` attaches again by pid (several clients may
attach at once), and a memory checkpoint or a suspend that interrupts the connection is
bridged transparently (the session reconnects from the last byte it saw).
"""

from __future__ import annotations

import json
import threading
import time
from typing import Callable, Dict, Iterator, List, Optional, Union

from . import errors
from ._args import check_int, check_str, drop_none
from ._transport import Client, seg
from ._ws import BINARY, CLOSE, TEXT, WebSocket, close_code

DataCallback = Callable[[bytes], None]

_RECONNECTS = 50
"""Reconnects tried after an interruption (a checkpoint holds the session for well under
a second; a suspend until the next request resumes the sandbox)."""


class PtySession:
    """One attached terminal session. Output arrives by iteration or, with ``on_data``,
    on a thread of its own; the session ends when its process exits."""

    def __init__(self, client: Client, route: str, pid: int, *, offset: int = 0, on_data: Optional[DataCallback] = None, on_exit: Optional[Callable[[Optional[int]], None]] = None) -> None:
        self.pid = pid
        self.exit_code: Optional[int] = None
        self.signal: Optional[int] = None
        self._client = client
        self._route = route
        self._offset = offset
        self._closed = False
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._ws = self._open()
        self._on_exit = on_exit
        self._thread: Optional[threading.Thread] = None
        if on_data is not None or on_exit is not None:
            self._thread = threading.Thread(target=self._deliver, args=(on_data,), daemon=True, name=f"sandfork-pty-{pid}")
            self._thread.start()

    @property
    def session_id(self) -> str:
        """The session's id (its pid, as a string; Tensorlake's name)."""
        return str(self.pid)

    @property
    def offset(self) -> int:
        """Bytes of output seen so far (where a reconnect resumes)."""
        return self._offset

    def send(self, data: Union[bytes, str]) -> None:
        """Types ``data`` into the terminal (``"\\x03"`` is Ctrl-C, ``"\\x04"`` Ctrl-D)."""
        if isinstance(data, str):
            data = data.encode()
        self._send(BINARY, bytes(data))

    send_input = send

    def resize(self, cols: int, rows: int) -> None:
        """Resizes the terminal; the program in it gets SIGWINCH."""
        msg = {"type": "resize", "cols": check_int("cols", cols, minimum=1), "rows": check_int("rows", rows, minimum=1)}
        self._send(TEXT, json.dumps(msg).encode())

    def _send(self, opcode: int, payload: bytes) -> None:
        """Sends on the current connection, reconnecting once when a checkpoint has just
        closed it."""
        ws = self._ws
        try:
            ws.send(opcode, payload)
        except OSError:
            self._reconnect_from(ws)
            self._ws.send(opcode, payload)

    def __iter__(self) -> Iterator[bytes]:
        """Output chunks as they come, until the process exits."""
        if self._thread is not None:
            raise errors.SandboxError("this session delivers its output to on_data; iterate a session opened without it")
        while not self._done.is_set():
            chunk = self._next()
            if chunk:
                yield chunk

    def wait(self, timeout: Optional[float] = None) -> Optional[int]:
        """Waits for the process to exit (reading and dropping output when nothing else
        does) and returns its exit code (``None`` when a signal ended it)."""
        if self._thread is None:
            deadline = None if timeout is None else time.monotonic() + timeout
            for _ in self:
                if deadline is not None and time.monotonic() > deadline:
                    raise errors.TimeoutError(f"terminal session {self.pid} still running after {timeout} s")
        elif not self._done.wait(timeout):
            raise errors.TimeoutError(f"terminal session {self.pid} still running after {timeout} s")
        return self.exit_code

    def kill(self) -> None:
        """Kills the session's process."""
        self._client.request("POST", f"{self._route}/processes/{self.pid}/signal", json_body={"signal": "KILL"})

    def close(self) -> None:
        """Detaches; the process keeps running (attach again with ``sandbox.pty.connect``)."""
        self._closed = True
        self._ws.close()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def __enter__(self) -> "PtySession":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _open(self) -> WebSocket:
        target = self._client._target(f"{self._route}/pty/{self.pid}/connect", {"offset": self._offset})
        return WebSocket.connect(self._client, target)

    def _deliver(self, on_data: Optional[DataCallback]) -> None:
        while not self._done.is_set():
            chunk = self._next()
            if chunk and on_data is not None:
                on_data(chunk)
        if self._on_exit is not None and not self._closed:
            self._on_exit(self.exit_code)

    def _next(self) -> bytes:
        """The next output chunk (empty for a control message), handling exit and
        reconnects."""
        ws = self._ws
        kind, payload = ws.recv()
        if ws is not self._ws:
            # A sender reconnected meanwhile, from the offset of then: the new connection
            # sends this again.
            return b""
        if kind == BINARY:
            self._offset += len(payload)
            return payload
        if kind == TEXT:
            self._control(json.loads(payload))
            return b""
        code, reason = close_code(payload)
        if self._closed or code == 1000 or self.exit_code is not None or self.signal is not None:
            self._done.set()
            return b""
        if code not in (1012, None):
            self._done.set()
            raise errors.SandboxError(f"terminal session {self.pid} ended: {reason or code}")
        self._reconnect_from(ws)
        return b""

    def _control(self, msg: Dict[str, object]) -> None:
        if msg.get("type") == "offset":
            self._offset = int(msg["offset"])  # type: ignore[arg-type]
        elif msg.get("type") == "exit":
            self.exit_code = msg.get("exit_code")  # type: ignore[assignment]
            self.signal = msg.get("signal")  # type: ignore[assignment]

    def _reconnect_from(self, ws: WebSocket) -> None:
        """Replaces connection ``ws`` (unless someone already did) by a new one from the
        current offset."""
        with self._lock:
            if self._ws is not ws:
                return
            last: Optional[Exception] = None
            for _ in range(_RECONNECTS):
                time.sleep(0.1)
                if self._closed:
                    break
                try:
                    self._ws = self._open()
                    return
                except (errors.ConnectionError, errors.SandboxError) as e:
                    last = e
            self._done.set()
            raise errors.SandboxError(f"terminal session {self.pid}: cannot reconnect: {last}")


class PtyCommands:
    """Terminal sessions of one sandbox (``sandbox.pty``)."""

    def __init__(self, client: Client, route: str) -> None:
        self._client = client
        self._route = route

    def create(
        self,
        command: Optional[str] = None,
        args: Optional[List[str]] = None,
        *,
        cols: int = 80,
        rows: int = 24,
        env: Optional[Dict[str, str]] = None,
        working_dir: Optional[str] = None,
        cwd: Optional[str] = None,
        user: Optional[str] = None,
        on_data: Optional[DataCallback] = None,
        on_exit: Optional[Callable[[Optional[int]], None]] = None,
    ) -> PtySession:
        """Starts ``command`` (default: a login shell) on a new ``cols`` x ``rows`` terminal
        and attaches to it; ``on_data`` gets the output and ``on_exit`` the exit code, on a
        thread of the session's own."""
        body = drop_none(
            command=check_str("command", command),
            args=list(args) if args else None,
            cols=check_int("cols", cols, minimum=1),
            rows=check_int("rows", rows, minimum=1),
            env=dict(env) if env else None,
            working_dir=working_dir or cwd,
            user=user,
        )
        return self.connect(self.start(body), on_data=on_data, on_exit=on_exit)

    def start(self, body: Dict[str, object]) -> int:
        """Starts a session from a ``POST .../pty`` body without attaching; its pid."""
        info = self._client.request_json("POST", f"{self._route}/pty", json_body=body)
        return int(info["pid"])

    def connect(self, pid: int, *, offset: int = 0, on_data: Optional[DataCallback] = None, on_exit: Optional[Callable[[Optional[int]], None]] = None) -> PtySession:
        """Attaches to running session ``pid``, replaying output from ``offset`` (0: all
        still buffered, up to 1 MiB)."""
        return PtySession(self._client, self._route, check_int("pid", pid, minimum=1), offset=check_int("offset", offset, minimum=0), on_data=on_data, on_exit=on_exit)

    def ws_url(self, pid: int) -> str:
        """The session's WebSocket URL (``ws+unix://SOCKET:PATH`` for a daemon on a Unix
        socket); send the client's bearer token with it when the daemon has one."""
        path = self._client.endpoint.base_path + f"{self._route}/pty/{seg(pid)}/connect"
        ep = self._client.endpoint
        if ep.scheme == "unix":
            return f"ws+unix://{ep.socket_path}:{path}"
        scheme = "wss" if ep.scheme == "https" else "ws"
        host = f"[{ep.host}]" if ":" in ep.host else ep.host
        return f"{scheme}://{host}:{ep.port}{path}"

    def send_input(self, pid: int, data: Union[bytes, str]) -> None:
        """Types ``data`` into session ``pid`` without attaching."""
        payload = data.encode() if isinstance(data, str) else bytes(data)
        self._client.request("POST", f"{self._route}/processes/{seg(pid)}/stdin", body=payload, headers={"Content-Type": "application/octet-stream"})

    def resize(self, pid: int, cols: int, rows: int) -> None:
        """Resizes session ``pid``'s terminal without attaching."""
        body = {"cols": check_int("cols", cols, minimum=1), "rows": check_int("rows", rows, minimum=1)}
        self._client.request("POST", f"{self._route}/pty/{seg(pid)}/resize", json_body=body)

    def kill(self, pid: int) -> None:
        """Kills session ``pid``'s process."""
        self._client.request("POST", f"{self._route}/processes/{seg(pid)}/signal", json_body={"signal": "KILL"})
