"""Typed exceptions raised by the sandfork SDK.

The hierarchy is Tensorlake's, so code written against ``tensorlake.sandbox``
catches the same classes::

    SandboxException
    └── SandboxError                      (= SandforkError: .code, .status, .message)
        ├── SandboxConnectionError        transport failures (our ConnectionError is one)
        ├── SandboxNotFoundError          (.sandbox_id)
        ├── PoolNotFoundError / PoolInUseError
        ├── RemoteAPIError                (.status_code, .message): any HTTP error answer
        │   ├── BadRequestError (400, also InvalidArgumentError), AuthError (401),
        │   ├── NotFoundError (404), ConflictError (409), TooLargeError (413),
        │   ├── UnsupportedError (422), CapacityError (429), ServerError (5xx), ...
        │   └── SandboxNotFoundAPIError   a 404 naming a sandbox: also a SandboxNotFoundError
        ├── InvalidArgumentError          bad input found by the SDK itself
        │   ├── ArgumentTypeError         (also a built-in TypeError)
        │   └── ArgumentValueError        (also a built-in ValueError)
        ├── SandforkTimeoutError          (also a built-in TimeoutError)
        └── FeatureNotSupportedError      a Tensorlake feature sandfork lacks (also NotImplementedError)

Every error the daemon reports arrives as HTTP status plus a JSON body
``{"code": ..., "message": ...}``; :func:`error_from_response` turns it into the
matching class, keeping the server's code and message.
"""

from __future__ import annotations

import builtins
import json
import re
from typing import Any, Dict, Optional, Type

from ._codes import ERROR_STATUS


class SandboxException(Exception):
    """Root of every exception the SDK raises (Tensorlake's base class)."""


class SandboxError(SandboxException):
    """A failed SDK call.

    Attributes:
        code: The server's snake_case error kind (``"not_found"``,
            ``"conflict"`` ...), or a client-side kind such as ``"connection"``.
        status: The HTTP status, or ``None`` when no response was received.
        message: The human-readable message, as the server wrote it.
    """

    def __init__(self, message: str = "", *, code: str = "error", status: Optional[int] = None):
        Exception.__init__(self, message)
        self.code = code
        self.status = status
        self.message = message

    def __str__(self) -> str:
        if self.status is None:
            return self.message
        return f"{self.message} (HTTP {self.status}, {self.code})"

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, status={self.status!r}, message={self.message!r})"


SandforkError = SandboxError
"""sandfork's original name for :class:`SandboxError`."""


class SandboxConnectionError(SandboxError):
    """The daemon could not be reached, or the connection broke mid-request."""

    def __init__(self, message: str = "", *, code: str = "connection", status: Optional[int] = None):
        SandboxError.__init__(self, message, code=code, status=status)


class ConnectionError(SandboxConnectionError, builtins.ConnectionError):  # noqa: A001 - public name
    """A :class:`SandboxConnectionError` that is also a built-in :class:`ConnectionError`.

    The message says where the SDK looked and what to check.
    """


class SandboxNotFoundError(SandboxError):
    """No sandbox has this id or name.

    ``SandboxNotFoundError(sandbox_id)`` as in Tensorlake; ``.sandbox_id`` names it.
    """

    def __init__(self, sandbox_id: str = "", message: Optional[str] = None, *, code: str = "not_found", status: Optional[int] = None):
        SandboxError.__init__(self, message or f"Sandbox not found: {sandbox_id}", code=code, status=status)
        self._sandbox_id = sandbox_id

    @property
    def sandbox_id(self) -> str:
        """The id or name that was looked up."""
        return self._sandbox_id


class PoolNotFoundError(SandboxError):
    """No sandbox pool has this id (sandfork has no pools; kept for Tensorlake code that catches it)."""

    def __init__(self, pool_id: str = "", message: Optional[str] = None):
        SandboxError.__init__(self, message or f"Sandbox pool not found: {pool_id}", code="not_found")
        self.pool_id = pool_id


class PoolInUseError(SandboxError):
    """A sandbox pool cannot be deleted while in use (sandfork has no pools)."""

    def __init__(self, pool_id: str = "", message: str = ""):
        text = f"Cannot delete pool {pool_id}: pool is in use" + (f" - {message}" if message else "")
        SandboxError.__init__(self, text, code="conflict")
        self.pool_id = pool_id


class RemoteAPIError(SandboxError):
    """The daemon answered with an HTTP error status.

    Constructed either Tensorlake's way, ``RemoteAPIError(status_code, message)``,
    or sandfork's, ``RemoteAPIError(message, code=..., status=...)``.
    """

    def __init__(self, status_code: Any = None, message: Optional[str] = None, *, code: str = "error", status: Optional[int] = None):
        if isinstance(status_code, int) and not isinstance(status_code, bool):
            status, text = status_code, message or ""
        else:
            text = str(status_code if status_code is not None else (message or ""))
        SandboxError.__init__(self, text, code=code, status=status)

    @property
    def status_code(self) -> Optional[int]:
        """The HTTP status (Tensorlake's name for :attr:`status`)."""
        return self.status


class InvalidArgumentError(SandboxError):
    """Bad input: found by the SDK before sending, or refused by the daemon (then also a
    :class:`RemoteAPIError` with status 400, see :class:`BadRequestError`)."""

    def __init__(self, message: str = "", *, code: str = "invalid_argument", status: Optional[int] = None):
        SandboxError.__init__(self, message, code=code, status=status)


class ArgumentTypeError(InvalidArgumentError, builtins.TypeError):
    """An argument of the wrong type (also a built-in :class:`TypeError`)."""


class ArgumentValueError(InvalidArgumentError, builtins.ValueError):
    """An argument with a value the SDK refuses (also a built-in :class:`ValueError`)."""


class BadRequestError(InvalidArgumentError, RemoteAPIError):
    """HTTP 400: the daemon refused the request (``code`` ``invalid_argument`` or
    ``exec_failed`` when a command cannot start)."""

    def __init__(self, message: str = "", *, code: str = "invalid_argument", status: Optional[int] = 400):
        SandboxError.__init__(self, message, code=code, status=status)


class AuthError(RemoteAPIError):
    """HTTP 401: the token is missing or wrong."""


class NotFoundError(RemoteAPIError):
    """HTTP 404: no snapshot, process, file, image or route by that name."""


class SandboxNotFoundAPIError(NotFoundError, SandboxNotFoundError):
    """HTTP 404 naming a sandbox: both a :class:`SandboxNotFoundError` and a
    :class:`RemoteAPIError` with status 404."""

    def __init__(self, message: str = "", *, code: str = "not_found", status: Optional[int] = 404, sandbox_id: str = ""):
        SandboxError.__init__(self, message, code=code, status=status)
        self._sandbox_id = sandbox_id


class ConflictError(RemoteAPIError):
    """HTTP 409: the object is in the wrong state for the request, or a name is taken.

    The message names the current state, e.g. ``Sandbox sb-1 is suspended``.
    """


class TooLargeError(RemoteAPIError):
    """HTTP 413: the request body or the result is larger than the daemon accepts."""


class UnsupportedError(RemoteAPIError):
    """HTTP 422: a combination of options the daemon does not support."""


class CapacityError(RemoteAPIError):
    """HTTP 429: admission refused the request (too many sandboxes or too much memory)."""


class UnavailableError(RemoteAPIError):
    """HTTP 503: the daemon is shutting down or cannot serve the request now."""


class ServerError(RemoteAPIError):
    """HTTP 5xx: the host failed (disk full: 507) or the daemon hit a bug (500)."""


class SandforkTimeoutError(SandboxError, builtins.TimeoutError):
    """A wait ran out: the daemon did not answer within the socket timeout, or a
    process was still running when :meth:`Process.wait` gave up.

    Also an instance of the built-in :class:`TimeoutError`.
    """

    def __init__(self, message: str = "", *, code: str = "timed_out", status: Optional[int] = None):
        SandboxError.__init__(self, message, code=code, status=status)


class RequestTimeoutError(SandforkTimeoutError, RemoteAPIError):
    """HTTP 408: the daemon's own timeout ran out."""


class TransportTimeoutError(SandforkTimeoutError, ConnectionError):
    """The socket timed out waiting for the daemon: a transport failure
    (:class:`SandboxConnectionError`) and a :class:`TimeoutError`."""

    def __init__(self, message: str = "", *, code: str = "timed_out", status: Optional[int] = None):
        SandboxError.__init__(self, message, code=code, status=status)


class ProtocolError(SandboxError):
    """The daemon sent something the SDK could not understand."""

    def __init__(self, message: str = ""):
        SandboxError.__init__(self, message, code="protocol", status=None)


class FeatureNotSupportedError(SandboxError, builtins.NotImplementedError):
    """A Tensorlake feature sandfork does not have (yet); ``.feature`` names it.

    Also a built-in :class:`NotImplementedError`.
    """

    def __init__(self, feature: str, hint: str = "", *, plural: Optional[bool] = None, message: Optional[str] = None):
        if message is None:
            if plural is None:
                head = re.sub(r"\s*\(.*\)$", "", feature)
                plural = head.endswith("s") or " and " in head
            message = f"{feature} {'are' if plural else 'is'} not supported by sandfork yet"
            if hint:
                message += f"; {hint}"
        SandboxError.__init__(self, message, code="not_implemented", status=None)
        self.feature = feature


def not_supported(feature: str, hint: str = "", *, plural: Optional[bool] = None) -> FeatureNotSupportedError:
    """The error for a Tensorlake feature sandfork lacks, e.g. ``not_supported("sandbox pools")``."""
    return FeatureNotSupportedError(feature, hint, plural=plural)


def needs_newer_daemon(feature: str, route: str) -> FeatureNotSupportedError:
    """The error for a feature the connected daemon does not serve yet (``route`` missing
    from its OpenAPI document)."""
    return FeatureNotSupportedError(feature, message=f"{feature}: this sandfork daemon does not serve {route} yet; upgrade the daemon")


_BY_STATUS: Dict[int, Type[SandboxError]] = {
    400: BadRequestError,
    401: AuthError,
    404: NotFoundError,
    408: RequestTimeoutError,
    409: ConflictError,
    413: TooLargeError,
    422: UnsupportedError,
    429: CapacityError,
    500: ServerError,
    503: UnavailableError,
}

_SANDBOX_MISSING = re.compile(r"^Sandbox (\S+) (?:not found|does not exist)", re.IGNORECASE)


def error_class_for(status: int) -> Type[SandboxError]:
    """Returns the exception class the SDK raises for an HTTP status."""
    if status in _BY_STATUS:
        return _BY_STATUS[status]
    if 400 <= status < 500:
        return BadRequestError
    return ServerError


def _build(cls: Type[SandboxError], message: str, code: str, status: Optional[int]) -> SandboxError:
    if cls is NotFoundError:
        m = _SANDBOX_MISSING.match(message)
        if m:
            return SandboxNotFoundAPIError(message, code=code, status=status, sandbox_id=m.group(1))
    return cls(message, code=code, status=status)


def error_from_response(status: int, body: bytes) -> SandboxError:
    """Builds the typed exception for an error response ``{code, message}``."""
    code, message = _parse_error_body(status, body)
    return _build(error_class_for(status), message, code, status)


def error_from_event(event: Dict[str, Any]) -> SandboxError:
    """Builds the typed exception for an in-stream ``{"type": "error"}`` record."""
    code = str(event.get("code") or "error")
    message = str(event.get("message") or "the daemon reported an error")
    status = ERROR_STATUS.get(code)
    return _build(error_class_for(status) if status else SandboxError, message, code, None)




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
