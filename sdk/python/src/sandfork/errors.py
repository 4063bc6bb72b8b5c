"""Typed exceptions raised by the sandfork SDK.

Every error the daemon reports arrives as HTTP status plus a JSON body
``{"code": ..., "message": ...}``; :func:`error_from_response` turns it into the
matching subclass of :class:`SandforkError`, keeping the server's message.
"""

from __future__ import annotations

import builtins
import json
from typing import Any, Dict, Optional, Type


class SandforkError(Exception):
    """Base class of every error raised by the SDK.

    Attributes:
        code: The server's snake_case error kind (``"not_found"``,
            ``"conflict"`` ...), or a client-side kind such as ``"connection"``.
        status: The HTTP status, or ``None`` when no response was received.
        message: The human-readable message, as the server wrote it.
    """

    def __init__(self, message: str, *, code: str = "error", status: Optional[int] = None):
        super().__init__(message)
        self.code = code
        self.status = status
        self.message = message

    def __str__(self) -> str:
        if self.status is None:
            return self.message
        return f"{self.message} (HTTP {self.status}, {self.code})"

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, status={self.status!r}, message={self.message!r})"


class InvalidArgumentError(SandforkError):
    """The request was malformed or named something that cannot work (HTTP 400)."""


class AuthError(SandforkError):
    """The token is missing or wrong (HTTP 401)."""


class SandboxNotFoundError(SandforkError):
    """No sandbox, snapshot, process or file has that id or path (HTTP 404)."""


class ConflictError(SandforkError):
    """The object is in the wrong state for the request (HTTP 409).

    The message names the current state, e.g. ``sandbox is suspended``.
    """


class TooLargeError(SandforkError):
    """The request body or the result is larger than the daemon accepts (HTTP 413)."""


class UnsupportedError(SandforkError):
    """A combination of options the daemon does not support (HTTP 422)."""


class CapacityError(SandforkError):
    """Admission refused the request: too many sandboxes or too much memory (HTTP 429)."""


class UnavailableError(SandforkError):
    """The daemon is shutting down or cannot serve the request now (HTTP 503)."""


class ServerError(SandforkError):
    """The daemon hit an internal error (HTTP 500); this is a daemon bug."""


class ConnectionError(SandforkError, builtins.ConnectionError):  # noqa: A001 - public name
    """The daemon could not be reached, or the connection broke mid-request.

    Also an instance of the built-in :class:`ConnectionError`.
    """

    def __init__(self, message: str, *, code: str = "connection", status: Optional[int] = None):
        super().__init__(message, code=code, status=status)


class SandforkTimeoutError(SandforkError, builtins.TimeoutError):
    """A wait ran out: the daemon did not answer within the socket timeout, or a
    process was still running when :meth:`Process.wait` gave up.

    Also an instance of the built-in :class:`TimeoutError`. The daemon's own
    timeouts (HTTP 408, code ``timed_out``) raise it too.
    """

    def __init__(self, message: str, *, code: str = "timed_out", status: Optional[int] = None):
        super().__init__(message, code=code, status=status)


class ProtocolError(SandforkError):
    """The daemon sent something the SDK could not understand."""

    def __init__(self, message: str):
        super().__init__(message, code="protocol", status=None)


RequestTimeoutError = SandforkTimeoutError

# Names used by Tensorlake's sandbox SDK, so code catching them keeps working.
SandboxError = SandforkError
SandboxException = SandforkError
SandboxConnectionError = ConnectionError
RemoteAPIError = SandforkError

_BY_STATUS: Dict[int, Type[SandforkError]] = {
    400: InvalidArgumentError,
    401: AuthError,
    404: SandboxNotFoundError,
    408: SandforkTimeoutError,
    409: ConflictError,
    413: TooLargeError,
    422: UnsupportedError,
    429: CapacityError,
    500: ServerError,
    503: UnavailableError,
}


def error_class_for(status: int) -> Type[SandforkError]:
    """Returns the exception class the SDK raises for an HTTP status."""
    if status in _BY_STATUS:
        return _BY_STATUS[status]
    if 400 <= status < 500:
        return InvalidArgumentError
    return ServerError


def error_from_response(status: int, body: bytes) -> SandforkError:
    """Builds the typed exception for an error response ``{code, message}``."""
    code, message = _parse_error_body(status, body)
    return error_class_for(status)(message, code=code, status=status)


def error_from_event(event: Dict[str, Any]) -> SandforkError:
    """Builds the typed exception for an in-stream ``{"type": "error"}`` record."""
    code = str(event.get("code") or "error")
    message = str(event.get("message") or "the daemon reported an error")
    return _BY_CODE.get(code, SandforkError)(message, code=code, status=None)


_BY_CODE: Dict[str, Type[SandforkError]] = {
    "bad_request": InvalidArgumentError,
    "invalid_argument": InvalidArgumentError,
    "exec_failed": InvalidArgumentError,
    "unauthorized": AuthError,
    "not_found": SandboxNotFoundError,
    "conflict": ConflictError,
    "timed_out": SandforkTimeoutError,
    "too_large": TooLargeError,
    "unsupported": UnsupportedError,
    "over_capacity": CapacityError,
    "unavailable": UnavailableError,
    "internal": ServerError,
}


def _parse_error_body(status: int, body: bytes) -> "tuple[str, str]":
    text = body.decode("utf-8", errors="replace").strip()
    try:
        doc = json.loads(text) if text else None
    except ValueError:
        doc = None
    if isinstance(doc, dict) and "message" in doc:
        return str(doc.get("code") or "error"), str(doc["message"])
    fallback = text[:500] or f"the daemon answered HTTP {status} without a message"
    return "error", fallback
