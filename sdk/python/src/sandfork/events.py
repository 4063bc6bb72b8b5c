"""The events feed: what happens to sandboxes (sandfork's own, ``GET /v1/events``)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Dict, Iterator, Optional

from . import errors
from ._args import check_int, check_str
from ._transport import Client
from .models import parse_time

KINDS = ("created", "forked", "started", "checkpointed", "suspended", "resumed", "terminated", "failed", "oom", "disk_full", "disk_recovered", "lagged")
"""Event types: ``lagged`` is not about a sandbox; it says the stream fell behind."""


@dataclass(frozen=True)
class SandboxEvent:
    """One event: ``type`` is one of :data:`KINDS`; ``seq`` increases within one daemon run."""

    seq: int
    at: Optional[datetime]
    type: str
    sandbox_id: str
    name: Optional[str] = None
    snapshot_id: Optional[str] = None
    message: Optional[str] = None

    @classmethod
    def from_json(cls, doc: Dict[str, Any]) -> "SandboxEvent":
        return cls(
            seq=int(doc.get("seq") or 0),
            at=parse_time(doc.get("at")),
            type=str(doc.get("type", "")),
            sandbox_id=str(doc.get("sandbox_id", "")),
            name=doc.get("name"),
            snapshot_id=doc.get("snapshot_id"),
            message=doc.get("message"),
        )


class _LineStream:
    """An iterator over one open NDJSON response; ``close()`` (or leaving its ``with``
    block) drops the connection, also from another thread than the one iterating."""

    def __init__(self, client: Client, path: str, query: Dict[str, Any]):
        self._response = client.open("GET", path, query=query, unbounded=True)
        self._lines = self._response.iter_json_lines()
        self._closed = False

    def _next_doc(self) -> Dict[str, Any]:
        try:
            return next(self._lines)
        except (errors.SandforkError, ValueError, AttributeError):
            # A read cut short by close() from another thread ends the stream.
            if self._closed:
                raise StopIteration from None
            raise

    def close(self) -> None:
        """Ends the stream."""
        self._closed = True
        self._response.interrupt()
        self._response.close()


class EventStream(_LineStream):
    """An iterator of :class:`SandboxEvent`."""

    def __init__(self, client: Client, sandbox_id: Optional[str], since: Optional[int], follow: bool):
        query: Dict[str, Any] = {"sandbox": check_str("sandbox_id", sandbox_id), "since": check_int("since", since, minimum=0)}
        if not follow:
            query["no_follow"] = "true"
        super().__init__(client, "/v1/events", query)

    def __iter__(self) -> Iterator[SandboxEvent]:
        return self

    def __next__(self) -> SandboxEvent:
        return SandboxEvent.from_json(self._next_doc())

    def __enter__(self) -> "EventStream":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class FileEvent:
    """A change under a watched directory: ``type`` is ``create`` (also moved in),
    ``modify``, ``delete`` (also moved out), ``rename`` (``old_path`` is where it was),
    ``chmod`` or ``overflow`` (changes were lost)."""

    type: str
    path: str
    old_path: Optional[str] = None
    is_dir: bool = False


class FileWatch(_LineStream):
    """An iterator of :class:`FileEvent` from a directory watch (``Sandbox.watch_dir``);
    the watch is in place once this object exists."""

    def __init__(self, client: Client, route: str, path: str, recursive: bool):
        query = {"path": check_str("path", path), "recursive": "true" if recursive else None}
        super().__init__(client, f"{route}/files/watch", query)

    def __iter__(self) -> Iterator[FileEvent]:
        return self

    def __next__(self) -> FileEvent:
        d = self._next_doc()
        return FileEvent(type=str(d.get("type", "")), path=str(d.get("path", "")), old_path=d.get("old_path"), is_dir=bool(d.get("is_dir")))

    def __enter__(self) -> "FileWatch":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class LogEntry:
    """One line of the sandbox log: ``seq`` (its place, from 1), when the agent read it,
    the process (``pid``, and its name or command line), ``stream`` (``stdout`` or
    ``stderr``), ``level`` (``info`` or ``error``) and the line itself."""

    seq: int
    timestamp: Optional[datetime]
    pid: int
    process: str
    stream: str
    level: str
    message: str

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "LogEntry":
        return cls(
            seq=int(d.get("seq", 0)), timestamp=parse_time(d.get("timestamp")), pid=int(d.get("pid", 0)),
            process=str(d.get("process", "")), stream=str(d.get("stream", "")), level=str(d.get("level", "")),
            message=str(d.get("message", "")),
        )  # fmt: skip


class LogStream(_LineStream):
    """An iterator of :class:`LogEntry` (``Sandbox.logs``)."""

    def __init__(self, client: Client, route: str, query: Dict[str, Any]):
        super().__init__(client, f"{route}/logs", query)

    def __iter__(self) -> Iterator[LogEntry]:
        return self

    def __next__(self) -> LogEntry:
        return LogEntry.from_json(self._next_doc())

    def __enter__(self) -> "LogStream":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def events(client: Optional[Client] = None, *, sandbox_id: Optional[str] = None, since: Optional[int] = None, follow: bool = True) -> EventStream:
    """Streams sandbox events: with ``since`` the kept ones after that ``seq`` first (``0``:
    all kept), then new ones as they happen unless ``follow=False``."""
    return EventStream(client or Client(), sandbox_id, since, follow)
