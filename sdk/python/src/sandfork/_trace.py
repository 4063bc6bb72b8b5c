"""Tensorlake's ``Traced`` conventions on real objects.

Tensorlake wraps results in ``Traced[...]`` (attributes forwarded, ``.value``,
``.trace_id``). sandfork returns the real objects instead, and gives them
``.value`` (the plain value) and ``.trace_id`` (a fresh random W3C-style trace
id per call; the daemon does not trace requests), so code written either way works.
"""

from __future__ import annotations

import secrets
from typing import Any, Generic, Iterable, List, Optional, TypeVar

T = TypeVar("T")


def new_trace_id() -> str:
    """A random 32-hex-digit trace id."""
    return secrets.token_hex(16)


class Traced(Generic[T]):
    """A result with a trace id, for calls whose Tensorlake result is ``Traced[None]``
    or another value that cannot carry attributes itself.

    ``.value`` is the result; other attributes are forwarded to it.
    """

    def __init__(self, trace_id: Optional[str] = None, result: Any = None):
        self.trace_id = trace_id or new_trace_id()
        self._result = result

    @property
    def value(self) -> T:
        """The wrapped result."""
        return self._result

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "_result":
            raise AttributeError(name)
        return getattr(self._result, name)

    def __repr__(self) -> str:
        return f"Traced(trace_id={self.trace_id!r}, result={self._result!r})"


class TracedMixin:
    """``.value`` (the object itself) and a lazily drawn ``.trace_id`` for result objects."""

    @property
    def value(self) -> Any:
        """The result itself (Tensorlake's ``Traced.value``)."""
        return self

    @property
    def trace_id(self) -> str:
        """A trace id for the call that produced this object."""
        tid = self.__dict__.get("_trace_id")
        if tid is None:
            tid = new_trace_id()
            self.__dict__["_trace_id"] = tid
        return tid


class TracedBytes(bytes):
    """``bytes`` with ``.value`` (plain bytes) and ``.trace_id``.

    ``content.decode()``, ``bytes(content)``, ``content == b"x"`` and
    ``content.value.decode()`` all work.
    """

    trace_id: str

    def __new__(cls, data: bytes = b"", trace_id: Optional[str] = None) -> "TracedBytes":
        obj = super().__new__(cls, data)
        obj.trace_id = trace_id or new_trace_id()
        return obj

    @property
    def value(self) -> bytes:
        """The content as plain ``bytes``."""
        return bytes(self)


class TracedList(List[T]):
    """A ``list`` with ``.trace_id`` and ``.value`` (a plain list).

    Tensorlake's ``TracedIterator`` is iterable but not indexable; this one is both.
    """

    def __init__(self, items: Iterable[T] = (), trace_id: Optional[str] = None):
        super().__init__(items)
        self.trace_id = trace_id or new_trace_id()

    @property
    def value(self) -> List[T]:
        """The items as a plain list."""
        return list(self)
