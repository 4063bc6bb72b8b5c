"""The events feed: what happens to sandboxes (sandfork's own, ``GET /v1/events``)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Dict, Iterator, Optional

from . import errors
from ._args import check_int, check_str
from ._transport import Client
from .models import parse_time

KINDS = ("created", "forked", "started", "checkpointed", "suspended", "resumed", "terminated", "failed", "oom", "lagged")
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


class EventStream:
    """An iterator of :class:`SandboxEvent` over one open request; ``close()`` (or leaving
    its ``with`` block) drops the connection."""

    def __init__(self, client: Client, sandbox_id: Optional[str], since: Optional[int], follow: bool):
        query = {"sandbox": check_str("sandbox_id", sandbox_id), "since": check_int("since", since, minimum=0)}
        if not follow:
            query["no_follow"] = "true"
        self._response = client.open("GET", "/v1/events", query=query, unbounded=True)
        self._lines = self._response.iter_json_lines()
        self._closed = False

    def __iter__(self) -> Iterator[SandboxEvent]:
        return self

    def __next__(self) -> SandboxEvent:
        try:
            return SandboxEvent.from_json(next(self._lines))
        except (errors.SandforkError, ValueError, AttributeError):
            # A read cut short by close() from another thread ends the stream.
            if self._closed:
                raise StopIteration from None
            raise

    def close(self) -> None:
        """Ends the stream; safe to call from another thread than the one iterating."""
        self._closed = True
        self._response.interrupt()
        self._response.close()

    def __enter__(self) -> "EventStream":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def events(client: Optional[Client] = None, *, sandbox_id: Optional[str] = None, since: Optional[int] = None, follow: bool = True) -> EventStream:
    """Streams sandbox events: with ``since`` the kept ones after that ``seq`` first (``0``:
    all kept), then new ones as they happen unless ``follow=False``."""
    return EventStream(client or Client(), sandbox_id, since, follow)
