"""HTTP/1.1 to the sandfork daemon over a Unix socket or TCP, standard library only.

Every request opens its own connection (a Unix-socket connect costs tens of
microseconds), so a :class:`Client` can be shared freely between threads: the
fan-out pattern ``ThreadPoolExecutor(32).map(...)`` needs no locking at all.
Streamed responses keep their connection until the stream is read or closed.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import dataclasses
import ssl
import threading
import time
from dataclasses import dataclass
from typing import IO, Any, Dict, Iterable, Iterator, Mapping, Optional, Set, Tuple, Union
from urllib.parse import quote, unquote, urlencode, urlsplit

from . import errors

DEFAULT_SOCKET = "/var/lib/sandfork/sandfork.sock"
"""Where the daemon listens when ``SANDFORK_URL`` is not set."""

_BLOCKSIZE = 256 * 1024
_USER_AGENT = "sandfork-python"

Body = Union[None, bytes, IO[bytes], Iterable[bytes]]
Query = Optional[Mapping[str, Any]]


@dataclass(frozen=True)
class Endpoint:
    """Where the daemon listens: a Unix socket path, or an HTTP(S) host and port."""

    scheme: str  # "unix", "http" or "https"
    socket_path: str = ""
    host: str = ""
    port: int = 0
    base_path: str = ""

    @property
    def url(self) -> str:
        """The endpoint written back as a ``SANDFORK_URL``-style string."""
        if self.scheme == "unix":
            return "unix://" + quote(self.socket_path)
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}{self.base_path}"


def parse_url(url: str) -> Endpoint:
    """Parses ``unix:///path/to.sock``, a bare socket path, or ``http(s)://host:port[/prefix]``.

    Raises:
        InvalidArgumentError: When the URL has another scheme or no host/path.
    """
    url = url.strip()
    if url.startswith("/"):
        return Endpoint("unix", socket_path=url)
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme == "unix":
        path = unquote(parts.netloc + parts.path)
        if not path.startswith("/"):
            raise errors.InvalidArgumentError(f"unix URL {url!r} needs an absolute socket path, e.g. unix:///run/sandfork.sock", code="invalid_url")
        return Endpoint("unix", socket_path=path)
    if scheme in ("http", "https"):
        if not parts.hostname:
            raise errors.InvalidArgumentError(f"URL {url!r} has no host", code="invalid_url")
        default_port = 443 if scheme == "https" else 80
        try:
            port = parts.port or default_port
        except ValueError:
            raise errors.InvalidArgumentError(f"URL {url!r} has an invalid port", code="invalid_url") from None
        return Endpoint(scheme, host=parts.hostname, port=port, base_path=parts.path.rstrip("/"))
    raise errors.InvalidArgumentError(f"unsupported daemon URL {url!r}: use unix:///path/to.sock or http://host:port", code="invalid_url")


def endpoint_from_env(url: Optional[str] = None) -> Endpoint:
    """The endpoint from an explicit URL, else ``SANDFORK_URL``, else the default socket."""
    chosen = url or os.environ.get("SANDFORK_URL") or DEFAULT_SOCKET
    return parse_url(chosen)


def _tls_context() -> ssl.SSLContext:
    """Verifies the daemon's certificate against the system roots, or against the
    CA bundle named by ``SANDFORK_CA`` (for a daemon with its own certificate)."""
    return ssl.create_default_context(cafile=os.environ.get("SANDFORK_CA") or None)


class UnixHTTPConnection(http.client.HTTPConnection):
    """An :class:`http.client.HTTPConnection` that talks over an ``AF_UNIX`` socket."""

    def __init__(self, socket_path: str, timeout: Optional[float] = None):
        super().__init__("localhost", timeout=timeout, blocksize=_BLOCKSIZE)
        self.socket_path = socket_path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(self.socket_path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


class StreamResponse:
    """A successful response whose body is read incrementally.

    Owns its connection; closes it when the body is exhausted or :meth:`close`
    is called (also usable as a context manager).
    """

    def __init__(self, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse, where: str):
        self._conn = conn
        self._resp = resp
        self._where = where
        self.status = resp.status
        self.headers = resp.headers

    def iter_json_lines(self) -> Iterator[Dict[str, Any]]:
        """Yields each NDJSON record of the body as a dict."""
        try:
            while True:
                line = self._readline()
                if not line:
                    return
                line = line.strip()
                if line:
                    yield _decode_json_line(line)
        finally:
            self.close()

    def iter_chunks(self, size: int = _BLOCKSIZE) -> Iterator[bytes]:
        """Yields the body in chunks of at most ``size`` bytes."""
        try:
            while True:
                chunk = self._read(size)
                if not chunk:
                    return
                yield chunk
        finally:
            self.close()

    def read_all(self) -> bytes:
        """Reads the whole remaining body."""
        try:
            return self._read(None)
        finally:
            self.close()

    def close(self) -> None:
        """Drops the connection; any unread body is discarded."""
        self._resp.close()
        self._conn.close()

    def interrupt(self) -> None:
        """Shuts the connection down, so a read blocked on it in another thread returns
        (the body then ends); :meth:`close` still releases it."""
        sock = self._conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def __enter__(self) -> "StreamResponse":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _readline(self) -> bytes:
        try:
            return self._resp.readline()
        except (OSError, http.client.HTTPException) as e:
            raise _broken(self._where, e) from e

    def _read(self, size: Optional[int]) -> bytes:
        try:
            data = self._resp.read(size) if size is not None else self._resp.read()
        except (OSError, http.client.HTTPException) as e:
            raise _broken(self._where, e) from e
        # http.client ends a body cut short of its Content-Length with b"" rather than an
        # error (for compatibility); a daemon that died mid-body must not look like an end.
        missing = self._resp.length
        if (not data or size is None) and missing:
            raise _broken(self._where, http.client.IncompleteRead(data, missing))
        return data


@dataclass(frozen=True)
class Features:
    """What the daemon serves beyond the first version of its API (from its
    ``/v1/openapi.json``); the SDK adapts its requests to it."""

    managed_processes: bool = False
    """Process names, stdin/stdout modes, restart policies, health checks, the restart route."""
    update_sandbox: bool = False
    """``PATCH /v1/sandboxes/{id}`` (rename, change egress rules)."""
    ensure_image: bool = False
    """``POST /v1/images/{name}/ensure`` (build a built-in image on demand)."""
    entrypoint: bool = False
    """``entrypoint`` in the create request."""
    delete_process: bool = False
    """``DELETE /v1/sandboxes/{id}/processes/{pid}``."""
    default_image: Optional[str] = None
    """The image of a sandbox created without one, when the daemon says (``default_image``
    in ``/v1/health``)."""

    @classmethod
    def from_openapi(cls, doc: Any) -> "Features":
        """Reads the features off an OpenAPI document."""
        paths = (doc or {}).get("paths") or {} if isinstance(doc, dict) else {}
        shapes = {_route_shape(p): set((v or {}).keys()) for p, v in paths.items()}

        def has(path: str, method: str = "") -> bool:
            methods = shapes.get(_route_shape(path))
            return methods is not None and (not method or method in methods)

        schemas = ((doc or {}).get("components") or {}).get("schemas") or {} if isinstance(doc, dict) else {}
        create_props = (schemas.get("CreateSandbox") or {}).get("properties") or {}
        return cls(
            managed_processes=has("/v1/sandboxes/{id}/processes/{pid}/restart", "post"),
            update_sandbox=has("/v1/sandboxes/{id}", "patch"),
            ensure_image=has("/v1/images/{name}/ensure", "post"),
            entrypoint="entrypoint" in create_props,
            delete_process=has("/v1/sandboxes/{id}/processes/{pid}", "delete"),
        )


def _route_shape(path: str) -> str:
    return "/".join("{}" if seg.startswith("{") else seg for seg in path.split("/"))


_FEATURES_TTL = 30.0
_features_cache: Dict[str, Tuple[float, Features]] = {}
_features_lock = threading.Lock()


class Client:
    """A connection to one sandfork daemon.

    Args:
        url: ``unix:///path/to.sock`` or ``http://host:port``; default
            ``SANDFORK_URL``, else ``unix:///var/lib/sandfork/sandfork.sock``.
        token: Bearer token for a TCP listener; default ``SANDFORK_TOKEN``.
        timeout: Socket timeout in seconds for ordinary requests
            (``None`` waits as long as the daemon takes).

    A client holds no open connection between requests and is safe to share
    between threads.
    """

    def __init__(self, url: Optional[str] = None, token: Optional[str] = None, timeout: Optional[float] = None):
        self.endpoint = endpoint_from_env(url)
        self.token = token if token is not None else (os.environ.get("SANDFORK_TOKEN") or None)
        self.timeout = timeout
        self._images: Set[str] = set()
        self._images_lock = threading.Lock()

    @classmethod
    def from_env(cls) -> "Client":
        """A client configured from ``SANDFORK_URL`` / ``SANDFORK_TOKEN``."""
        return cls()

    @property
    def url(self) -> str:
        """The daemon's URL."""
        return self.endpoint.url

    def __repr__(self) -> str:
        return f"Client(url={self.url!r})"

    def features(self) -> Features:
        """What the daemon serves (read from its OpenAPI document, cached for 30 s per URL)."""
        key = self.url
        now = time.monotonic()
        with _features_lock:
            hit = _features_cache.get(key)
        if hit is not None and now - hit[0] < _FEATURES_TTL:
            return hit[1]
        try:
            doc = self.request_json("GET", "/v1/openapi.json")
        except errors.NotFoundError:
            doc = None
        found = Features.from_openapi(doc)
        health = self.request_json("GET", "/v1/health") or {}
        if isinstance(health, dict) and isinstance(health.get("default_image"), str):
            found = dataclasses.replace(found, default_image=health["default_image"])
        with _features_lock:
            _features_cache[key] = (now, found)
        return found

    def has_image(self, name: str) -> bool:
        """True when the daemon has image ``name`` (the list is cached by this client;
        a miss refreshes it)."""
        with self._images_lock:
            if name in self._images:
                return True
        doc = self.request_json("GET", "/v1/images") or {}
        names = {str(i.get("name")) for i in doc.get("images", []) if isinstance(i, dict)}
        with self._images_lock:
            self._images = names
        return name in names

    def _image_ready(self, name: str) -> None:
        with self._images_lock:
            self._images.add(name)

    def request_json(self, method: str, path: str, *, query: Query = None, json_body: Any = None, timeout: Optional[float] = None, unbounded: bool = False) -> Any:
        """Sends a request and decodes its JSON answer (``None`` for an empty body)."""
        _, data = self.request(method, path, query=query, json_body=json_body, timeout=timeout, unbounded=unbounded)
        return _decode_json_doc(method, path, data)

    def request_json_body(self, method: str, path: str, *, body: Body, headers: Optional[Mapping[str, str]] = None) -> Any:
        """Sends a raw (possibly streamed) body without socket timeout and decodes the JSON answer."""
        status, data = self.request(method, path, body=body, headers=headers, unbounded=True)
        return _decode_json_doc(method, path, data)

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Query = None,
        json_body: Any = None,
        body: Body = None,
        headers: Optional[Mapping[str, str]] = None,
        timeout: Optional[float] = None,
        unbounded: bool = False,
    ) -> Tuple[int, bytes]:
        """Sends a request and reads the whole answer; raises a typed error on 4xx/5xx."""
        stream = self.open(method, path, query=query, json_body=json_body, body=body, headers=headers, timeout=timeout, unbounded=unbounded)
        return stream.status, stream.read_all()

    def open(
        self,
        method: str,
        path: str,
        *,
        query: Query = None,
        json_body: Any = None,
        body: Body = None,
        headers: Optional[Mapping[str, str]] = None,
        timeout: Optional[float] = None,
        unbounded: bool = False,
    ) -> StreamResponse:
        """Sends a request and returns the response with its body still unread.

        Raises a typed :class:`~sandfork.errors.SandforkError` for an error
        status. The socket timeout is ``timeout``, else the client's; with
        ``unbounded=True`` there is none (long-lived streams, waits).
        """
        target = self._target(path, query)
        where = f"{method} {path}"
        hdrs = self._headers(headers)
        if json_body is not None:
            body = json.dumps(json_body).encode()
            hdrs["Content-Type"] = "application/json"
        conn = self._connect(None if unbounded else (timeout if timeout is not None else self.timeout))
        resp = self._exchange(conn, method, target, body, hdrs, where)
        if resp.status >= 400:
            data = _read_error_body(resp)
            conn.close()
            raise errors.error_from_response(resp.status, data)
        return StreamResponse(conn, resp, where)

    def _target(self, path: str, query: Query) -> str:
        target = self.endpoint.base_path + path
        if query:
            pairs = [(k, _query_value(v)) for k, v in query.items() if v is not None]
            if pairs:
                target += "?" + urlencode(pairs)
        return target

    def _headers(self, extra: Optional[Mapping[str, str]]) -> Dict[str, str]:
        hdrs = {"User-Agent": _USER_AGENT, "Accept": "application/json"}
        if self.token:
            hdrs["Authorization"] = f"Bearer {self.token}"
        if extra:
            hdrs.update(extra)
        return hdrs

    def _connect(self, timeout: Optional[float]) -> http.client.HTTPConnection:
        ep = self.endpoint
        if ep.scheme == "unix":
            conn: http.client.HTTPConnection = UnixHTTPConnection(ep.socket_path, timeout=timeout)
        elif ep.scheme == "https":
            conn = http.client.HTTPSConnection(ep.host, ep.port, timeout=timeout, context=_tls_context(), blocksize=_BLOCKSIZE)
        else:
            conn = http.client.HTTPConnection(ep.host, ep.port, timeout=timeout, blocksize=_BLOCKSIZE)
        try:
            conn.connect()
        except OSError as e:
            conn.close()
            raise errors.ConnectionError(self._unreachable_message(e)) from e
        return conn

    def _exchange(self, conn: http.client.HTTPConnection, method: str, target: str, body: Body, hdrs: Dict[str, str], where: str) -> http.client.HTTPResponse:
        chunked = body is not None and not isinstance(body, (bytes, bytearray)) and "Content-Length" not in hdrs
        try:
            conn.request(method, target, body=body, headers=hdrs, encode_chunked=chunked)
        except (BrokenPipeError, ConnectionResetError) as e:
            # The daemon may have refused the body early and already answered.
            return self._response_after_send_error(conn, where, e)
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            raise _broken(where, e) from e
        try:
            return conn.getresponse()
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            raise _broken(where, e) from e

    def _response_after_send_error(self, conn: http.client.HTTPConnection, where: str, cause: OSError) -> http.client.HTTPResponse:
        try:
            resp = conn.getresponse()
        except (OSError, http.client.HTTPException):
            conn.close()
            raise _broken(where, cause) from cause
        if resp.status < 400:
            conn.close()
            raise _broken(where, cause) from cause
        return resp

    def _unreachable_message(self, e: OSError) -> str:
        reason = e.strerror or str(e) or type(e).__name__
        hint = "is `sandfork serve` running? Set SANDFORK_URL to point elsewhere"
        if isinstance(e, PermissionError):
            hint = "the socket's permissions refuse this user (run as root or as a member of its group)"
        return f"cannot reach the sandfork daemon at {self.url}: {reason}; {hint}"


def seg(value: object) -> str:
    """A value quoted for use as one URL path segment (ids, names)."""
    return quote(str(value), safe="")


def _decode_json_doc(method: str, path: str, data: bytes) -> Any:
    if not data.strip():
        return None
    try:
        return json.loads(data)
    except ValueError:
        raise errors.ProtocolError(f"the daemon's answer to {method} {path} is not JSON: {data[:200]!r}") from None


def _query_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _read_error_body(resp: http.client.HTTPResponse) -> bytes:
    try:
        return resp.read(64 * 1024)
    except (OSError, http.client.HTTPException):
        return b""


def _decode_json_line(line: bytes) -> Dict[str, Any]:
    try:
        record = json.loads(line)
    except ValueError:
        raise errors.ProtocolError(f"the daemon sent a stream line that is not JSON: {line[:200]!r}") from None
    if not isinstance(record, dict):
        raise errors.ProtocolError(f"the daemon sent a stream record that is not an object: {line[:200]!r}")
    return record


def _broken(where: str, e: BaseException) -> errors.SandforkError:
    if isinstance(e, socket.timeout):
        return errors.TransportTimeoutError(f"{where} timed out waiting for the daemon")
    detail = str(e) or type(e).__name__
    return errors.ConnectionError(f"the connection to the sandfork daemon broke during {where}: {detail}")
