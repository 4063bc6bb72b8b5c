"""Handles on background processes running inside a sandbox."""

from __future__ import annotations

import dataclasses
import signal as _signal
from typing import Optional, Protocol, Union

from . import errors
from ._streams import OutputStream
from ._trace import Traced
from ._transport import Client, seg
from .models import ProcessInfo



class ProcessOwner(Protocol):
    """What a process handle needs of its sandbox (a :class:`~sandfork.Sandbox`)."""

    id: str

    @property
    def client(self) -> Client: ...

SignalLike = Union[int, str, _signal.Signals]
"""A signal as a number (``15``), a name (``"TERM"`` / ``"SIGTERM"``) or :class:`signal.Signals`."""

_INFO_FIELDS = [f.name for f in dataclasses.fields(ProcessInfo)]


def signal_value(sig: SignalLike) -> Union[int, str]:
    """The signal as the API expects it: a number, or a name without the ``SIG`` prefix."""
    if isinstance(sig, _signal.Signals):
        return int(sig)
    if isinstance(sig, str):
        name = sig.strip().upper()
        return name[3:] if name.startswith("SIG") else name
    if isinstance(sig, bool) or not isinstance(sig, int):
        raise errors.ArgumentTypeError(f"signal must be a number, a name or a signal.Signals, got {type(sig).__name__} {sig!r}")
    return int(sig)


class Process(ProcessInfo):
    """A background process: its :class:`~sandfork.ProcessInfo` fields (``pid``,
    ``status``, ``exit_code``, ``signal``, ``started_at`` ... as of the last answer
    from the daemon) plus methods that act on it.

    The handle is just the sandbox plus the process id, so it survives
    reconnects: ``Sandbox.connect(id).get_process(pid)`` from another program
    attaches to the same process and can read all of its buffered output. A
    managed process (one with a ``name``) is addressed by its name, so the
    handle follows it across restarts.
    """

    def __init__(self, sandbox: ProcessOwner, pid: Union[int, ProcessInfo], info: Optional[ProcessInfo] = None):
        if isinstance(pid, ProcessInfo):
            info = pid
        if info is not None:
            ProcessInfo.__init__(self, **{name: getattr(info, name) for name in _INFO_FIELDS})
        elif isinstance(pid, int):
            ProcessInfo.__init__(self, pid=pid)
        self.sandbox = sandbox

    def __repr__(self) -> str:
        status = getattr(self.status, "value", self.status)
        return f"Process(sandbox={self.sandbox.id!r}, pid={self.pid}, status={status!r}, command={self.command!r})"

    @property
    def _client(self) -> Client:
        return self.sandbox.client

    @property
    def _path(self) -> str:
        return f"/v1/sandboxes/{seg(self.sandbox.id)}/processes/{seg(self.name or self.pid)}"

    def _update(self, info: ProcessInfo) -> ProcessInfo:
        for name in _INFO_FIELDS:
            setattr(self, name, getattr(info, name))
        return info

    def info(self) -> ProcessInfo:
        """Fetches the process's current state (and updates this handle's fields)."""
        return self._update(ProcessInfo.from_json(self._client.request_json("GET", self._path)))

    def refresh(self) -> "Process":
        """Updates this handle's fields from the daemon and returns it."""
        self.info()
        return self

    def is_running(self) -> bool:
        """True while the process has not ended (asks the daemon)."""
        return self.info().running

    def output(self, offset: int = 0, follow: bool = True, stderr_offset: int = 0) -> OutputStream:
        """Iterates over the process's output as chunks, stdout from byte ``offset``
        and stderr from byte ``stderr_offset`` on (each event carries its ``offset``).

        With ``follow=True`` the iterator waits for new output until the
        process exits (then ``.result`` carries its exit code); with
        ``follow=False`` it ends after the output buffered so far. Output is
        not accumulated in ``.result`` (a long-lived process could produce
        any amount); read the events instead.
        """
        query = {"offset": offset, "stderr_offset": stderr_offset or None, "follow": follow}
        response = self._client.open("GET", self._path + "/output", query=query, unbounded=True)
        return OutputStream(response, collect=False, require_exit=follow)

    def write_stdin(self, data: Union[bytes, str]) -> Traced[None]:
        """Writes bytes (or UTF-8 text) to the process's standard input (``stdin_mode=PIPE``)."""
        body = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        headers = {"Content-Type": "application/octet-stream"}
        self._client.request("POST", self._path + "/stdin", body=body, headers=headers)
        return Traced(None, None)

    def close_stdin(self) -> Traced[None]:
        """Closes the process's standard input (it then reads end-of-file)."""
        self._client.request("POST", self._path + "/stdin/close")
        return Traced(None, None)

    def send_signal(self, sig: SignalLike) -> None:
        """Sends a signal to the process (its process group)."""
        self._client.request("POST", self._path + "/signal", json_body={"signal": signal_value(sig)})

    def terminate(self) -> None:
        """Sends SIGTERM."""
        self.send_signal(_signal.SIGTERM)

    def kill(self) -> None:
        """Sends SIGKILL."""
        self.send_signal(_signal.SIGKILL)

    def wait(self, timeout: Optional[float] = None) -> ProcessInfo:
        """Waits until the process ends and returns its final state (this handle's
        fields are updated too).

        Raises:
            SandforkTimeoutError: When ``timeout`` seconds pass first (the
                process keeps running).
        """
        query = {"timeout_secs": timeout} if timeout is not None else None
        socket_timeout = None if timeout is None else timeout + 30.0
        doc = self._client.request_json("POST", self._path + "/wait", query=query, timeout=socket_timeout, unbounded=timeout is None)
        info = self._update(ProcessInfo.from_json(doc))
        if info.running:
            raise errors.SandforkTimeoutError(f"process {self.pid} still running after {timeout:g}s")
        return info
