"""Handles on background processes running inside a sandbox."""

from __future__ import annotations

import signal as _signal
from typing import TYPE_CHECKING, List, Optional, Union

from . import errors
from ._streams import OutputStream
from ._transport import Client, seg
from .models import ProcessInfo, ProcessStatus

if TYPE_CHECKING:
    from .sandbox import Sandbox

SignalLike = Union[int, str, _signal.Signals]
"""A signal as a number (``15``), a name (``"TERM"`` / ``"SIGTERM"``) or :class:`signal.Signals`."""


def signal_value(sig: SignalLike) -> Union[int, str]:
    """The signal as the API expects it: a number, or a name without the ``SIG`` prefix."""
    if isinstance(sig, _signal.Signals):
        return int(sig)
    if isinstance(sig, str):
        name = sig.strip().upper()
        return name[3:] if name.startswith("SIG") else name
    return int(sig)


class Process:
    """A background process started with :meth:`Sandbox.start_process`.

    The handle is just the sandbox id plus the process id, so it survives
    reconnects: ``Sandbox.connect(id).get_process(pid)`` from another program
    attaches to the same process and can read all of its buffered output.
    """

    def __init__(self, sandbox: "Sandbox", pid: int, info: Optional[ProcessInfo] = None):
        self.sandbox = sandbox
        self.pid = pid
        self._info = info

    def __repr__(self) -> str:
        return f"Process(sandbox={self.sandbox.id!r}, pid={self.pid})"

    @property
    def _client(self) -> Client:
        return self.sandbox.client

    @property
    def _path(self) -> str:
        return f"/v1/sandboxes/{seg(self.sandbox.id)}/processes/{seg(self.pid)}"

    @property
    def command(self) -> str:
        """The command the process was started with."""
        return self._cached().command

    @property
    def args(self) -> List[str]:
        """The arguments the process was started with."""
        return self._cached().args

    @property
    def exit_code(self) -> Optional[int]:
        """The exit code as of the last status, ``None`` while running."""
        return self.info().exit_code

    def info(self) -> ProcessInfo:
        """Fetches the process's current state from the daemon."""
        self._info = ProcessInfo.from_json(self._client.request_json("GET", self._path))
        return self._info

    def status(self) -> Union[ProcessStatus, str]:
        """The current state: ``ProcessStatus.RUNNING`` or ``ProcessStatus.EXITED``."""
        return self.info().status

    def is_running(self) -> bool:
        """True while the process has not exited."""
        return self.info().running

    def output(self, offset: int = 0, follow: bool = True, stderr_offset: int = 0) -> OutputStream:
        """Iterates over the process's output, stdout from byte ``offset`` and
        stderr from byte ``stderr_offset`` on (each event carries its ``offset``).

        With ``follow=True`` the iterator waits for new output until the
        process exits (then ``.result`` carries its exit code); with
        ``follow=False`` it ends after the output buffered so far. Output is
        not accumulated in ``.result`` (a long-lived process could produce
        any amount); read the events instead.
        """
        query = {"offset": offset, "stderr_offset": stderr_offset or None, "follow": follow}
        response = self._client.open("GET", self._path + "/output", query=query, unbounded=True)
        return OutputStream(response, collect=False, require_exit=follow)

    def write_stdin(self, data: Union[bytes, str]) -> None:
        """Writes bytes (or UTF-8 text) to the process's standard input."""
        body = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        headers = {"Content-Type": "application/octet-stream"}
        self._client.request("POST", self._path + "/stdin", body=body, headers=headers)

    def close_stdin(self) -> None:
        """Closes the process's standard input (it then reads end-of-file)."""
        self._client.request("POST", self._path + "/stdin/close")

    def signal(self, sig: SignalLike) -> None:
        """Sends a signal to the process."""
        self._client.request("POST", self._path + "/signal", json_body={"signal": signal_value(sig)})

    def terminate(self) -> None:
        """Sends SIGTERM."""
        self.signal(_signal.SIGTERM)

    def kill(self) -> None:
        """Sends SIGKILL."""
        self.signal(_signal.SIGKILL)

    def wait(self, timeout: Optional[float] = None) -> ProcessInfo:
        """Waits until the process exits and returns its final state.

        Raises:
            SandforkTimeoutError: When ``timeout`` seconds pass first (the
                process keeps running).
        """
        query = {"timeout_secs": timeout} if timeout is not None else None
        socket_timeout = None if timeout is None else timeout + 30.0
        doc = self._client.request_json("POST", self._path + "/wait", query=query, timeout=socket_timeout, unbounded=timeout is None)
        self._info = ProcessInfo.from_json(doc)
        if self._info.running:
            raise errors.SandforkTimeoutError(f"process {self.pid} still running after {timeout:g}s")
        return self._info

    def _cached(self) -> ProcessInfo:
        return self._info if self._info is not None else self.info()
