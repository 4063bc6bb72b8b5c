"""sandfork — isolated Linux sandboxes you snapshot once and fork many times.

Quick start::

    from sandfork import Sandbox, CheckpointType

    with Sandbox.create(image="busybox") as sb:
        print(sb.run("echo", ["hello"]).stdout)
        snap = sb.checkpoint(checkpoint_type=CheckpointType.MEMORY)
    for child in snap.fork(4):
        ...

The daemon is found from ``SANDFORK_URL`` (``unix:///path/to.sock`` or
``http://host:port``, with ``SANDFORK_TOKEN`` for TCP), else the default
socket ``/var/lib/sandfork/sandfork.sock``; or pass ``client=Client(url=...)``.
Only the Python standard library is used.
"""

from ._streams import ExecStream, OutputStream
from ._transport import DEFAULT_SOCKET, Client, parse_url
from .errors import (
    AuthError,
    CapacityError,
    ConflictError,
    ConnectionError,
    InvalidArgumentError,
    ProtocolError,
    RemoteAPIError,
    RequestTimeoutError,
    SandboxConnectionError,
    SandboxError,
    SandboxException,
    SandboxNotFoundError,
    SandforkError,
    SandforkTimeoutError,
    ServerError,
    TooLargeError,
    UnavailableError,
    UnsupportedError,
)
from .models import (
    CheckpointType,
    CommandResult,
    DirectoryEntry,
    DirectoryListing,
    ListDirectoryResponse,
    OutputEvent,
    ProcessInfo,
    ProcessStatus,
    SandboxInfo,
    SandboxStatus,
    SnapshotType,
)
from .process import Process
from .sandbox import Sandbox
from .snapshot import ForkChild, ForkError, ForkResult, Snapshot

__version__ = "0.1.0"

SnapshotInfo = Snapshot
"""Tensorlake's name for a snapshot's description."""

__all__ = [
    "DEFAULT_SOCKET",
    "AuthError",
    "CapacityError",
    "CheckpointType",
    "Client",
    "CommandResult",
    "ConflictError",
    "ConnectionError",
    "DirectoryEntry",
    "DirectoryListing",
    "ExecStream",
    "ForkChild",
    "ForkError",
    "ForkResult",
    "InvalidArgumentError",
    "ListDirectoryResponse",
    "OutputEvent",
    "OutputStream",
    "Process",
    "ProcessInfo",
    "ProcessStatus",
    "ProtocolError",
    "RemoteAPIError",
    "RequestTimeoutError",
    "Sandbox",
    "SandboxConnectionError",
    "SandboxError",
    "SandboxException",
    "SandboxInfo",
    "SandboxNotFoundError",
    "SandboxStatus",
    "SandforkError",
    "SandforkTimeoutError",
    "ServerError",
    "Snapshot",
    "SnapshotInfo",
    "SnapshotType",
    "TooLargeError",
    "UnavailableError",
    "UnsupportedError",
    "__version__",
    "parse_url",
]
