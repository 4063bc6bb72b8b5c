"""Iterators over the daemon's NDJSON output streams (exec and process output)."""

from __future__ import annotations

import codecs
from datetime import datetime, timezone
from typing import Any, Callable, Dict, Iterator, List, Optional

from . import errors
from ._transport import StreamResponse
from .models import CommandResult, OutputEvent, decode_data

OutputCallback = Callable[[str], Any]
"""Called with each line of output as text, without its newline (``on_stdout=print``
prints the output as it was); a last line with no newline comes when the command ends."""


class OutputStream(Iterator[OutputEvent]):
    """Iterates over a command's output as :class:`OutputEvent` chunks.

    When the iterator is exhausted, :attr:`result` holds the
    :class:`CommandResult` (exit code, signal, timing, and — unless the stream
    was opened without collecting — all of stdout and stderr). A stream the
    daemon ends with an error record raises the matching typed exception.

    Use it as a context manager, or call :meth:`close`, to drop the connection
    early (the command keeps running in the sandbox only for background
    processes; an exec is stopped when its stream is dropped, as the daemon
    decides).
    """

    def __init__(
        self,
        response: StreamResponse,
        *,
        collect: bool = True,
        on_stdout: Optional[OutputCallback] = None,
        on_stderr: Optional[OutputCallback] = None,
        require_exit: bool = True,
    ):
        self._response = response
        self._require_exit = require_exit
        self._ended = False
        self._records = response.iter_json_lines()
        self._collect = collect
        self._buffers = {"stdout": bytearray(), "stderr": bytearray()}
        self._decoders = {name: codecs.getincrementaldecoder("utf-8")(errors="replace") for name in ("stdout", "stderr")}
        self._callbacks = {"stdout": on_stdout, "stderr": on_stderr}
        self._partial = {"stdout": "", "stderr": ""}
        self.result: Optional[CommandResult] = None
        self.exit_record: Optional[Dict[str, Any]] = None
        self.dropped: List[Dict[str, Any]] = []
        """``{"stream", "from", "to"}`` ranges the sandbox's bounded buffer dropped."""

    def __iter__(self) -> "OutputStream":
        return self

    def __next__(self) -> OutputEvent:
        if self.result is not None or self._ended:
            raise StopIteration
        for record in self._records:
            kind = record.get("type")
            if kind in ("stdout", "stderr"):
                return self._output(kind, record)
            if kind == "exit":
                self._finish(record)
                raise StopIteration
            if kind == "error":
                self.close()
                raise errors.error_from_event(record)
            if kind == "dropped":
                self.dropped.append(record)
            # Other record types are skipped: newer daemons may add some.
        self._ended = True
        if self._require_exit:
            raise errors.ConnectionError("the daemon ended the output stream without an exit record")
        raise StopIteration

    def wait(self) -> CommandResult:
        """Reads the stream to its end and returns the result.

        Raises:
            SandforkError: The stream ended before the command did (only
                possible for ``Process.output(follow=False)``).
        """
        for _ in self:
            pass
        if self.result is None:
            raise errors.SandforkError("the output stream ended before the process exited", code="still_running")
        return self.result

    def close(self) -> None:
        """Drops the connection without reading the rest of the stream."""
        self._response.close()

    def __enter__(self) -> "OutputStream":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _output(self, stream: str, record: Dict[str, Any]) -> OutputEvent:
        raw = decode_data(record)
        if self._collect:
            self._buffers[stream] += raw
        text = self._decoders[stream].decode(raw)
        self._notify(stream, text)
        offset = record.get("offset")
        return OutputEvent(line=text, timestamp=datetime.now(timezone.utc), stream=stream, raw=raw, offset=int(offset) if offset is not None else None)

    def _notify(self, stream: str, text: str, final: bool = False) -> None:
        """Hands the callback each complete line (and, when ``final``, what is left)."""
        callback = self._callbacks[stream]
        if callback is None:
            return
        *lines, rest = (self._partial[stream] + text).split("\n")
        for line in lines:
            callback(line)
        if final and rest:
            callback(rest)
            rest = ""
        self._partial[stream] = rest

    def _finish(self, record: Dict[str, Any]) -> None:
        for stream, decoder in self._decoders.items():
            self._notify(stream, decoder.decode(b"", final=True), final=True)
        self.exit_record = record
        self.result = CommandResult.from_parts(bytes(self._buffers["stdout"]), bytes(self._buffers["stderr"]), record)
        self.close()


ExecStream = OutputStream
