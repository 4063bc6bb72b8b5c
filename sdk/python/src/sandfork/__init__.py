"""sandfork — isolated Linux sandboxes you snapshot once and fork many times.

A drop-in for Tensorlake's sandbox SDK: code written for
``from tensorlake.sandbox import ...`` runs with ``from sandfork import ...``.

Quick start::

    from sandfork import Sandbox, CheckpointType

    with Sandbox.create(image="busybox") as sb:
        print(sb.run("echo", ["hello"]).stdout)
        snap = sb.checkpoint(checkpoint_type=CheckpointType.MEMORY)
    for child in snap.fork(4):
        ...

The daemon is found from ``SANDFORK_URL`` (``unix:///path/to.sock`` or
``http://host:port``, with ``SANDFORK_TOKEN`` for TCP), else the default
socket ``/var/lib/sandfork/sandfork.sock``; or pass ``client=Client(url=...)``
(or Tensorlake's ``api_url=``/``api_key=``). Only the Python standard library is used.
"""

from ._streams import ExecStream, OutputStream
from ._trace import Traced, TracedBytes, TracedList
from ._transport import DEFAULT_SOCKET, Client, Features, parse_url
from ._unsupported import Desktop, create_file_system, delete_file_system, list_file_systems
from .errors import (
    ArgumentTypeError,
    ArgumentValueError,
    AuthError,
    BadRequestError,
    CapacityError,
    ConflictError,
    ConnectionError,
    FeatureNotSupportedError,
    InvalidArgumentError,
    NotFoundError,
    PoolInUseError,
    PoolNotFoundError,
    ProtocolError,
    RemoteAPIError,
    RequestTimeoutError,
    SandboxConnectionError,
    SandboxError,
    SandboxException,
    SandboxNotFoundAPIError,
    SandboxNotFoundError,
    SandforkError,
    SandforkTimeoutError,
    ServerError,
    TooLargeError,
    TransportTimeoutError,
    UnavailableError,
    UnsupportedError,
)
from .models import (
    CLEAR_NETWORK_POLICY,
    ArchivedSandboxInfo,
    CheckpointType,
    ClearNetworkPolicy,
    CommandResult,
    ContainerResourcesInfo,
    CopiedSandboxResponse,
    CopySandboxResponse,
    CreateSandboxPoolResponse,
    CreateSandboxResponse,
    CreateSnapshotResponse,
    DaemonInfo,
    DirectoryEntry,
    DirectoryListing,
    FileSystem,
    FileSystemMount,
    GpuModel,
    GpuRequest,
    GPUResources,
    HealthResponse,
    ListArchivedSandboxesResponse,
    ListDirectoryResponse,
    ManagedProcessExit,
    ManagedProcessHealthStatus,
    ManagedProcessInfo,
    ManagedProcessStatus,
    NetworkConfig,
    OutputEvent,
    OutputMode,
    OutputResponse,
    PoolContainerInfo,
    ProcessHealthCheck,
    ProcessHealthCheckType,
    ProcessInfo,
    ProcessStatus,
    ProcessUser,
    ProcessUserSpec,
    RestartPolicy,
    RestartPolicyConfig,
    SandboxInfo,
    SandboxLogLevel,
    SandboxLogSignal,
    SandboxLogsResponse,
    SandboxPoolInfo,
    SandboxPortAccess,
    SandboxStats,
    SandboxProcessLogFilter,
    SandboxProcessLogFiltersResponse,
    SandboxStatus,
    SendSignalResponse,
    SnapshotInfo,
    SnapshotStatus,
    SnapshotType,
    SnapshotWaitCondition,
    StdinMode,
    sandbox_url_from_ingress_endpoint,
)
from .process import Process
from .sandbox import Sandbox
from .snapshot import CopiedSandbox, ForkChild, ForkError, ForkResult, Snapshot
from .images import Image
from .volumes import Volume
from .events import EventStream, FileEvent, FileWatch, SandboxEvent, events
from .pty import PtyCommands, PtySession
from .pty import PtySession as Pty  # Tensorlake's name for a terminal session
from .aio import AsyncForkResult, AsyncProcess, AsyncSandbox, AsyncSnapshot  # noqa: E402 - needs Sandbox
from .aio import AsyncPtySession as AsyncPty  # noqa: E402 - Tensorlake's name
from .client import AsyncSandboxClient, SandboxClient  # noqa: E402 - needs AsyncSandbox

__version__ = "0.2.0"

TENSORLAKE_NAMES = [
    # clients / handles
    "SandboxClient", "AsyncSandboxClient", "Sandbox", "AsyncSandbox", "Pty", "AsyncPty", "Desktop",
    # lifecycle models
    "SandboxStatus", "SandboxInfo", "SandboxPortAccess", "CreateSandboxResponse", "CopiedSandboxResponse",
    "CopySandboxResponse", "SandboxPoolInfo", "PoolContainerInfo", "CreateSandboxPoolResponse", "ContainerResourcesInfo",
    "GPUResources", "GpuModel", "GpuRequest", "CLEAR_NETWORK_POLICY", "ClearNetworkPolicy", "NetworkConfig",
    "ArchivedSandboxInfo", "ListArchivedSandboxesResponse", "sandbox_url_from_ingress_endpoint",
    # file systems
    "FileSystem", "FileSystemMount", "create_file_system", "list_file_systems", "delete_file_system",
    # snapshots
    "SnapshotStatus", "SnapshotType", "SnapshotWaitCondition", "SnapshotInfo", "CheckpointType", "CreateSnapshotResponse",
    # commands
    "CommandResult",
    # processes
    "ProcessStatus", "RestartPolicy", "RestartPolicyConfig", "ProcessHealthCheckType", "ProcessHealthCheck",
    "ManagedProcessStatus", "ManagedProcessHealthStatus", "ManagedProcessExit", "ManagedProcessInfo", "ProcessInfo",
    "SandboxLogLevel", "SandboxLogSignal", "SandboxLogsResponse", "SandboxProcessLogFilter",
    "SandboxProcessLogFiltersResponse", "StdinMode", "OutputMode", "ProcessUser", "ProcessUserSpec",
    "SendSignalResponse", "OutputResponse", "OutputEvent",
    # files
    "DirectoryEntry", "ListDirectoryResponse",
    # daemon
    "DaemonInfo", "HealthResponse",
    # exceptions
    "SandboxException", "SandboxError", "SandboxConnectionError", "SandboxNotFoundError", "PoolNotFoundError",
    "PoolInUseError", "RemoteAPIError",
]  # fmt: skip
"""Every name of ``tensorlake.sandbox.__all__``; all are importable from ``sandfork``."""

__all__ = sorted(
    set(TENSORLAKE_NAMES)
    | {
        "DEFAULT_SOCKET", "ArgumentTypeError", "ArgumentValueError", "AsyncForkResult", "AsyncProcess", "AsyncSnapshot",
        "AuthError", "BadRequestError", "CapacityError", "Client", "ConflictError", "ConnectionError", "CopiedSandbox",
        "DirectoryListing", "ExecStream", "FeatureNotSupportedError", "Features", "ForkChild", "ForkError", "ForkResult",
        "InvalidArgumentError", "NotFoundError", "OutputStream", "Process", "ProtocolError", "RequestTimeoutError",
        "SandboxNotFoundAPIError", "SandforkError", "SandforkTimeoutError", "ServerError", "Snapshot", "TooLargeError", "Image", "Volume", "SandboxStats", "SandboxEvent", "EventStream", "events", "FileEvent", "FileWatch", "PtyCommands", "PtySession",
        "Traced", "TracedBytes", "TracedList", "TransportTimeoutError", "UnavailableError", "UnsupportedError",
        "__version__", "parse_url",
    }
)  # fmt: skip
