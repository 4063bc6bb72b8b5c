"""Plain data types returned by the SDK, decoded from the daemon's JSON.

The names, fields and enum values are those of Tensorlake's
``tensorlake.sandbox.models`` (as dataclasses, not pydantic models), plus
sandfork's own fields. Models of Tensorlake features sandfork lacks (pools,
logs, file systems, GPUs, archived sandboxes, ports) exist as types so that
imports and annotations keep working.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from enum import Enum
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union
from urllib.parse import urlsplit

from . import errors
from ._trace import TracedList, TracedMixin


class _StrEnum(str, Enum):
    """A string enum that prints as its value (``f"{SandboxStatus.RUNNING}"`` is ``running``)."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


# --- enums --------------------------------------------------------------------------


class SandboxStatus(_StrEnum):
    """Lifecycle state of a sandbox.

    Tensorlake's members and values, plus sandfork's ``RESUMING``,
    ``TERMINATING`` and ``FAILED``. The daemon's ``creating`` is ``PENDING``
    and its ``checkpointing`` is ``SNAPSHOTTING`` (``SandboxStatus("creating")``
    works too, and ``CREATING``/``CHECKPOINTING`` are aliases). sandfork never
    reports ``TIMEOUT``: an idle timeout terminates (or, for a named sandbox,
    suspends) the sandbox.
    """

    PENDING = "pending"
    RUNNING = "running"
    SNAPSHOTTING = "snapshotting"
    SUSPENDING = "suspending"
    SUSPENDED = "suspended"
    TERMINATED = "terminated"
    TIMEOUT = "timeout"
    RESUMING = "resuming"
    TERMINATING = "terminating"
    FAILED = "failed"
    LOST = "lost"  # its node is gone (a cluster's gateway reports it)
    CREATING = "pending"  # alias: the daemon's name
    CHECKPOINTING = "snapshotting"  # alias: the daemon's name

    @classmethod
    def _missing_(cls, value: object) -> Optional["SandboxStatus"]:
        return _FROM_DAEMON_STATE.get(str(value).lower()) if isinstance(value, str) else None

    @property
    def daemon_state(self) -> str:
        """The state as the daemon's API names it (``creating`` for ``PENDING`` ...)."""
        return {"pending": "creating", "snapshotting": "checkpointing"}.get(self.value, self.value)


_FROM_DAEMON_STATE = {"creating": SandboxStatus.PENDING, "checkpointing": SandboxStatus.SNAPSHOTTING}


class SnapshotStatus(_StrEnum):
    """State of a snapshot. sandfork snapshots are complete when the daemon answers,
    so the SDK reports ``COMPLETED``."""

    IN_PROGRESS = "in_progress"
    LOCAL_READY = "local_ready"
    COMPLETED = "completed"
    FAILED = "failed"


class SnapshotWaitCondition(_StrEnum):
    """What ``checkpoint(wait_until=...)`` waits for."""

    LOCAL_READY = "local_ready"
    COMPLETED = "completed"


def snapshot_satisfies_wait_condition(status: Union[SnapshotStatus, str], wait_until: Union[SnapshotWaitCondition, str]) -> bool:
    """True when a snapshot in ``status`` satisfies ``wait_until``."""
    status = str(getattr(status, "value", status))
    wanted = str(getattr(wait_until, "value", wait_until))
    if wanted == "local_ready":
        return status in ("local_ready", "completed")
    return status == "completed"


class CheckpointType(_StrEnum):
    """What a checkpoint captures.

    - ``FILESYSTEM``: the disk only; a sandbox restored from it boots cold.
    - ``MEMORY``: disk plus memory plus running processes; restores resume warm.
    """

    MEMORY = "memory"
    FILESYSTEM = "filesystem"


SnapshotType = CheckpointType
"""Tensorlake's name for the type of a stored snapshot (same members)."""


class GpuModel(_StrEnum):
    """GPU models Tensorlake offers (sandfork has no GPUs)."""

    A100_40GB = "A100-40GB"
    A100_80GB = "A100-80GB"
    H100 = "H100"
    T4 = "T4"
    A6000 = "A6000"
    A10 = "A10"


class ClearNetworkPolicy(Enum):
    """Pass ``CLEAR_NETWORK_POLICY`` as ``network=`` to remove every egress rule."""

    TOKEN = "clear"


CLEAR_NETWORK_POLICY = ClearNetworkPolicy.TOKEN


class ContainerState(_StrEnum):
    """State of a pool container (pools are not supported by sandfork)."""

    IDLE = "Idle"
    RUNNING = "Running"


class SandboxLogLevel(_StrEnum):
    """Levels of sandbox log lines: sandfork's are ``INFO`` (stdout) and ``ERROR`` (stderr)."""

    TRACE = "trace"
    DEBUG = "debug"
    INFO = "info"
    WARN = "warn"
    ERROR = "error"
    FATAL = "fatal"


class ProcessStatus(_StrEnum):
    """State of a background process: ``RUNNING``, or how it ended."""

    RUNNING = "running"
    EXITED = "exited"
    SIGNALED = "signaled"
    OOM_KILLED = "oom_killed"


class StdinMode(_StrEnum):
    """Standard input of a background process: ``CLOSED`` (end-of-file at once) or
    ``PIPE`` (fed by ``write_stdin`` until ``close_stdin``)."""

    CLOSED = "closed"
    PIPE = "pipe"


class OutputMode(_StrEnum):
    """What happens to a background process's stdout or stderr."""

    CAPTURE = "capture"
    DISCARD = "discard"


class RestartPolicy(_StrEnum):
    """When a managed process is restarted."""

    NEVER = "never"
    ON_FAILURE = "on_failure"
    ALWAYS = "always"


class ProcessHealthCheckType(_StrEnum):
    """How a managed process's health is probed."""

    HTTP = "http"
    TCP = "tcp"


class ManagedProcessStatus(_StrEnum):
    """The supervisor's state of a managed process."""

    STARTING = "starting"
    RUNNING = "running"
    BACKING_OFF = "backing_off"
    STOPPED = "stopped"


class ManagedProcessHealthStatus(_StrEnum):
    """The health of a managed process."""

    DISABLED = "disabled"
    STARTING = "starting"
    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"


def _enum_or_str(enum: Any, value: Any) -> Any:
    """The enum member for ``value``, or the raw string for a value this SDK does not know."""
    if value is None:
        return None
    try:
        return enum(value)
    except ValueError:
        return value


# --- decoding helpers ---------------------------------------------------------------

_FRACTION = re.compile(r"\.(\d+)")


def parse_time(value: Any) -> Optional[datetime]:
    """Parses an RFC 3339 timestamp (``Z`` suffix and nanoseconds allowed), or a number
    of seconds / milliseconds / microseconds since the epoch, into a ``datetime``."""
    if isinstance(value, datetime):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
        if seconds > 1e15:
            seconds /= 1e6
        elif seconds > 1e12:
            seconds /= 1e3
        return datetime.fromtimestamp(seconds, tz=timezone.utc)
    if not isinstance(value, str) or not value:
        return None
    text = value.strip().replace("z", "Z")
    if text.endswith("Z"):
        text = text[:-1] + "+00:00"
    text = _FRACTION.sub(lambda m: "." + m.group(1)[:6].ljust(6, "0"), text, count=1)
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return None


def decode_data(record: Dict[str, Any], key: str = "data") -> bytes:
    """The bytes a record carries as ``<key>`` (UTF-8 text) or ``<key>_b64``."""
    b64 = record.get(f"{key}_b64")
    if isinstance(b64, str):
        return base64.b64decode(b64)
    text = record.get(key)
    return text.encode("utf-8") if isinstance(text, str) else b""


def strip_one_newline(text: str) -> str:
    """The output's lines joined with ``"\\n"``: exactly one trailing newline removed."""
    return text[:-1] if text.endswith("\n") else text


def split_lines(text: str) -> List[str]:
    """The lines of some output, without their ``"\\n"`` terminators."""
    if not text:
        return []
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return lines


# --- commands -----------------------------------------------------------------------


@dataclass
class CommandResult(TracedMixin):
    """What a finished command produced.

    ``stdout`` and ``stderr`` are the output's lines joined with ``"\\n"`` (as in
    Tensorlake: exactly one trailing newline is removed, nothing else);
    ``stdout_bytes`` / ``stderr_bytes`` are the exact bytes. ``exit_code``
    follows :mod:`subprocess`: when the command was killed by a signal it is
    ``-signal`` (and :attr:`signal` holds the signal number).
    """

    exit_code: int
    stdout: str
    stderr: str
    signal: Optional[int] = None
    timed_out: bool = False
    duration_ms: int = 0
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    stdout_bytes: bytes = field(default=b"", repr=False)
    stderr_bytes: bytes = field(default=b"", repr=False)

    @property
    def ok(self) -> bool:
        """True when the command exited with status 0."""
        return self.exit_code == 0

    @property
    def returncode(self) -> int:
        """Alias of :attr:`exit_code`, as in :class:`subprocess.CompletedProcess`."""
        return self.exit_code

    @classmethod
    def from_json(cls, doc: Dict[str, Any]) -> "CommandResult":
        """Decodes the daemon's non-streaming exec answer."""
        out, err = decode_data(doc, "stdout"), decode_data(doc, "stderr")
        return cls.from_parts(out, err, doc)

    @classmethod
    def from_parts(cls, out: bytes, err: bytes, exit_record: Dict[str, Any]) -> "CommandResult":
        """Builds a result from collected output and an exit record."""
        signal = exit_record.get("signal")
        return cls(
            exit_code=exit_code_of(exit_record.get("exit_code"), signal),
            stdout=strip_one_newline(out.decode("utf-8", errors="replace")),
            stderr=strip_one_newline(err.decode("utf-8", errors="replace")),
            signal=signal,
            timed_out=bool(exit_record.get("timed_out", False)),
            duration_ms=int(exit_record.get("duration_ms") or 0),
            stdout_truncated=bool(exit_record.get("stdout_truncated", False)),
            stderr_truncated=bool(exit_record.get("stderr_truncated", False)),
            stdout_bytes=out,
            stderr_bytes=err,
        )


def exit_code_of(code: Optional[int], signal: Optional[int]) -> int:
    """The exit status, or ``-signal`` for a process killed by a signal (-1 if neither is known)."""
    if code is not None:
        return int(code)
    if signal:
        return -int(signal)
    return -1


@dataclass
class OutputEvent:
    """One piece of output.

    From ``follow_stdout``/``follow_stderr``/``follow_output`` (Tensorlake's
    calls) each event is one line: ``line`` without its newline, ``timestamp``
    (when the SDK received it; the daemon does not timestamp output) and
    ``stream`` (``"stdout"`` or ``"stderr"``).

    From sandfork's streaming iterators (``Sandbox.stream``, ``Process.output``,
    ``Sandbox.iter_output``) each event is a chunk as it arrived: ``data`` (=
    ``line``) is its text, ``raw`` its exact bytes, ``offset`` its byte offset
    in its stream (process output only).
    """

    line: str
    timestamp: Optional[datetime] = None
    stream: Optional[str] = None
    raw: bytes = field(default=b"", repr=False)
    offset: Optional[int] = None

    @property
    def data(self) -> str:
        """The text of the event (alias of :attr:`line`)."""
        return self.line


@dataclass
class OutputResponse(TracedMixin):
    """The output a process has buffered, as lines (without their newlines)."""

    pid: int
    lines: List[str] = field(default_factory=list)
    line_count: int = 0


@dataclass
class SendSignalResponse(TracedMixin):
    """The answer to ``send_signal``."""

    success: bool = True


# --- processes ----------------------------------------------------------------------


@dataclass
class RestartPolicyConfig:
    """When and how fast a managed process is restarted."""

    policy: Union[RestartPolicy, str] = RestartPolicy.ON_FAILURE
    max_restarts: Optional[int] = None
    initial_backoff_ms: int = 500
    max_backoff_ms: int = 30_000

    def to_json(self) -> Dict[str, Any]:
        """The API document (``max_restarts`` only when set)."""
        doc: Dict[str, Any] = {"policy": str(RestartPolicy(self.policy).value), "initial_backoff_ms": int(self.initial_backoff_ms), "max_backoff_ms": int(self.max_backoff_ms)}
        if self.max_restarts is not None:
            doc["max_restarts"] = int(self.max_restarts)
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> "RestartPolicyConfig":
        return cls(
            policy=_enum_or_str(RestartPolicy, doc.get("policy", "on_failure")),
            max_restarts=doc.get("max_restarts"),
            initial_backoff_ms=int(doc.get("initial_backoff_ms", 500)),
            max_backoff_ms=int(doc.get("max_backoff_ms", 30_000)),
        )


@dataclass
class ProcessHealthCheck:
    """How a managed process's health is probed (HTTP GET or TCP connect)."""

    type: Union[ProcessHealthCheckType, str]
    port: int
    path: Optional[str] = None
    initial_delay_ms: int = 5_000
    interval_ms: int = 1_000
    timeout_ms: int = 500
    failure_threshold: int = 3

    def to_json(self) -> Dict[str, Any]:
        """The API document (``path`` only when set)."""
        doc: Dict[str, Any] = {
            "type": str(ProcessHealthCheckType(self.type).value),
            "port": int(self.port),
            "initial_delay_ms": int(self.initial_delay_ms),
            "interval_ms": int(self.interval_ms),
            "timeout_ms": int(self.timeout_ms),
            "failure_threshold": int(self.failure_threshold),
        }
        if self.path is not None:
            doc["path"] = self.path
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> "ProcessHealthCheck":
        return cls(
            type=_enum_or_str(ProcessHealthCheckType, doc.get("type")),
            port=int(doc.get("port") or 0),
            path=doc.get("path"),
            initial_delay_ms=int(doc.get("initial_delay_ms", 5_000)),
            interval_ms=int(doc.get("interval_ms", 1_000)),
            timeout_ms=int(doc.get("timeout_ms", 500)),
            failure_threshold=int(doc.get("failure_threshold", 3)),
        )


@dataclass
class ProcessUserSpec:
    """A user to run a process as: a ``name``, or a ``uid`` (with an optional ``gid``)."""

    name: Optional[str] = None
    uid: Optional[int] = None
    gid: Optional[int] = None


ProcessUser = Union[str, ProcessUserSpec, Dict[str, Union[str, int, None]]]
"""A user as a name, ``"uid"``, ``"uid:gid"``, a :class:`ProcessUserSpec` or a dict of its fields."""


@dataclass
class ManagedProcessExit:
    """How a managed process's previous run ended."""

    exit_code: Optional[int] = None
    signal: Optional[int] = None
    oom_killed: bool = False
    ended_at: Optional[datetime] = None

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> "ManagedProcessExit":
        return cls(doc.get("exit_code"), doc.get("signal"), bool(doc.get("oom_killed", False)), parse_time(doc.get("ended_at")))


@dataclass
class ManagedProcessInfo:
    """The supervisor's view of a managed process (one started with a ``name``,
    ``restart`` or ``health_check``)."""

    id: str
    name: Optional[str] = None
    status: Union[ManagedProcessStatus, str] = ManagedProcessStatus.RUNNING
    restart_count: int = 0
    restart: RestartPolicyConfig = field(default_factory=RestartPolicyConfig)
    health_check: Optional[ProcessHealthCheck] = None
    health_status: Union[ManagedProcessHealthStatus, str] = ManagedProcessHealthStatus.DISABLED
    consecutive_health_failures: int = 0
    last_exit: Optional[ManagedProcessExit] = None
    last_error: Optional[str] = None
    next_restart_at: Optional[datetime] = None

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> "ManagedProcessInfo":
        return cls(
            id=str(doc.get("id") or doc.get("name") or ""),
            name=doc.get("name"),
            status=_enum_or_str(ManagedProcessStatus, doc.get("status", "running")),
            restart_count=int(doc.get("restart_count") or 0),
            restart=RestartPolicyConfig.from_json(doc.get("restart") or {}),
            health_check=ProcessHealthCheck.from_json(doc["health_check"]) if doc.get("health_check") else None,
            health_status=_enum_or_str(ManagedProcessHealthStatus, doc.get("health_status", "disabled")),
            consecutive_health_failures=int(doc.get("consecutive_health_failures") or 0),
            last_exit=ManagedProcessExit.from_json(doc["last_exit"]) if doc.get("last_exit") else None,
            last_error=doc.get("last_error"),
            next_restart_at=parse_time(doc.get("next_restart_at")),
        )


@dataclass
class ProcessInfo(TracedMixin):
    """A background process as the daemon reports it.

    Tensorlake's fields (``status`` is a field, as of the last answer from the
    daemon), plus sandfork's ``name``, ``os_pid`` and ``raw``.
    """

    handle: Optional[int] = None
    pid: int = 0
    status: Union[ProcessStatus, str] = ProcessStatus.RUNNING
    exit_code: Optional[int] = None
    signal: Optional[int] = None
    stdin_writable: bool = False
    command: str = ""
    args: List[str] = field(default_factory=list)
    started_at: Optional[datetime] = None
    ended_at: Optional[datetime] = None
    managed: Optional[ManagedProcessInfo] = None
    name: Optional[str] = None
    os_pid: Optional[int] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def state(self) -> Union[ProcessStatus, str]:
        """Alias of :attr:`status`."""
        return self.status

    @property
    def running(self) -> bool:
        """True while the process has not ended."""
        return self.status == ProcessStatus.RUNNING

    @staticmethod
    def fields_from_json(doc: Dict[str, Any]) -> Dict[str, Any]:
        """The constructor arguments for a ``Process`` document."""
        state = doc.get("status") or doc.get("state")
        signal = doc.get("signal")
        if state == "exited" and signal and "status" not in doc:
            state = "signaled"  # older daemons report only running/exited
        return dict(
            handle=doc.get("handle"),
            pid=int(doc["pid"]),
            status=_enum_or_str(ProcessStatus, state),
            exit_code=doc.get("exit_code"),
            signal=signal,
            stdin_writable=bool(doc.get("stdin_writable", False)),
            command=str(doc.get("command", "")),
            args=list(doc.get("args") or []),
            started_at=parse_time(doc.get("started_at")),
            ended_at=parse_time(doc.get("ended_at")),
            managed=ManagedProcessInfo.from_json(doc["managed"]) if doc.get("managed") else None,
            name=doc.get("name"),
            os_pid=doc.get("os_pid"),
            raw=doc,
        )

    @classmethod
    def from_json(cls, doc: Dict[str, Any]) -> "ProcessInfo":
        """Decodes a ``Process`` document."""
        return cls(**cls.fields_from_json(doc))


# --- files ----------------------------------------------------------------------------


@dataclass
class DirectoryEntry:
    """One file, directory or link inside a sandbox.

    Tensorlake's ``name``, ``is_dir``, ``size``, ``modified_at``, plus sandfork's
    ``path``, ``type`` (``file``, ``dir``, ``symlink`` or ``other``) and ``mode``.
    """

    name: str
    is_dir: bool = False
    size: Optional[int] = None
    modified_at: Optional[datetime] = None
    path: str = ""
    type: str = "other"
    mode: int = 0

    @property
    def is_file(self) -> bool:
        """True for a regular file."""
        return self.type == "file"

    @property
    def is_symlink(self) -> bool:
        """True for a symbolic link."""
        return self.type == "symlink"

    @classmethod
    def from_json(cls, doc: Dict[str, Any]) -> "DirectoryEntry":
        """Decodes a directory entry document."""
        kind = str(doc.get("type", "other"))
        return cls(
            name=str(doc.get("name", "")),
            is_dir=kind == "dir",
            size=int(doc.get("size") or 0),
            modified_at=parse_time(doc.get("modified_at")),
            path=str(doc.get("path", "")),
            type=kind,
            mode=_mode(doc.get("mode")),
        )


def _mode(value: Any) -> int:
    if isinstance(value, str):
        try:
            return int(value, 8)
        except ValueError:
            return 0
    return int(value or 0)


class ListDirectoryResponse(TracedList[DirectoryEntry]):
    """The entries of a directory: ``.path`` and ``.entries`` as in Tensorlake; also a
    list of the entries itself (iterable, indexable)."""

    def __init__(self, path: str, entries: List[DirectoryEntry], trace_id: Optional[str] = None):
        super().__init__(entries, trace_id)
        self.path = path

    @property
    def entries(self) -> List[DirectoryEntry]:
        """The entries as a plain list."""
        return list(self)

    @property
    def value(self) -> "ListDirectoryResponse":  # type: ignore[override]
        return self


DirectoryListing = ListDirectoryResponse
"""sandfork's original name for :class:`ListDirectoryResponse`."""


# --- sandboxes ------------------------------------------------------------------------


@dataclass
class ContainerResourcesInfo:
    """A sandbox's resources. ``ephemeral_disk_mb`` is the root disk size in MiB
    (0: the image's own size)."""

    cpus: float
    memory_mb: int
    ephemeral_disk_mb: int = 0


@dataclass
class GpuRequest:
    """GPUs for a sandbox (sandfork has no GPUs)."""

    count: int
    model: Union[GpuModel, str]


GPUResources = GpuRequest


@dataclass
class NetworkConfig:
    """A sandbox's egress policy.

    ``allow_out``/``deny_out`` hold IPv4 addresses, CIDRs, hostnames and wildcards
    (``*.example.com``). A non-empty ``allow_out`` allows only those destinations;
    ``deny_out`` wins over ``allow_out``.
    """

    allow_internet_access: bool = True
    allow_out: List[str] = field(default_factory=list)
    deny_out: List[str] = field(default_factory=list)

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> "NetworkConfig":
        """Decodes the daemon's ``{mode, allow_out, deny_out}`` view."""
        return cls(doc.get("mode") == "internet", list(doc.get("allow_out") or []), list(doc.get("deny_out") or []))


@dataclass
class FileSystemMount:
    """A file system mounted into a sandbox: in sandfork, named volume ``file_system_id``
    (``prefetch`` is accepted and ignored; ``snapshot_id`` is not supported)."""

    file_system_id: str
    mount_path: str
    read_only: bool = False
    prefetch: bool = False
    snapshot_id: Optional[str] = None


@dataclass
class FileSystem:
    """A registered file system (not supported by sandfork)."""

    id: Optional[str] = None
    name: Optional[str] = None
    description: Optional[str] = None
    region: Optional[str] = None
    status: Optional[str] = None
    created_at: Optional[str] = None
    updated_at: Optional[str] = None


@dataclass
class CreateSandboxResponse(TracedMixin):
    """The answer to ``SandboxClient.create``: the sandbox has been accepted (it may
    still be ``PENDING``)."""

    sandbox_id: str
    status: Union[SandboxStatus, str]
    reason: Optional[str] = None
    routing_hint: Optional[str] = None
    ingress_endpoint: Optional[str] = None
    sandbox_url: Optional[str] = None
    name: Optional[str] = None
    termination_reason: Optional[str] = None
    error_details: Any = None


@dataclass
class CopiedSandboxResponse:
    """One copy made by ``copy()``: ``status`` is a plain string (``"running"``, or
    ``"failed"`` with ``reason``)."""

    sandbox_id: str
    status: str
    reason: Optional[str] = None
    routing_hint: Optional[str] = None
    ingress_endpoint: Optional[str] = None
    sandbox_url: Optional[str] = None
    name: Optional[str] = None
    termination_reason: Optional[str] = None
    error_details: Any = None


@dataclass
class CopySandboxResponse(TracedMixin):
    """The answer to ``copy()``: the source and one entry per copy."""

    source_sandbox_id: str
    sandboxes: List[CopiedSandboxResponse] = field(default_factory=list)


@dataclass
class SandboxPortAccess:
    """How a sandbox's ports are reached through the daemon's gateway:
    ``allow_unauthenticated_access`` (public ports), ``exposed_ports`` (``None``: any port),
    ``sandbox_url`` (the path-based route's base URL) and ``ingress_endpoint`` (the
    host-based route's domain part)."""

    allow_unauthenticated_access: bool = False
    exposed_ports: List[int] = field(default_factory=list)
    ingress_endpoint: Optional[str] = None
    sandbox_url: Optional[str] = None


@dataclass
class SandboxInfo(TracedMixin):
    """A sandbox as the daemon reports it.

    Tensorlake's fields, plus sandfork's (``id``, ``state``, ``cpus``,
    ``memory_mb``, ``disk_mb``, ``snapshot_id``, ``labels``,
    ``last_active_at``, ``fork``, ``error``, ``disk_full``, ``raw``);
    ``allow_unauthenticated_access`` is the daemon's ``public_ports`` and
    ``exposed_ports`` its list (``None``: any port). Fields of features sandfork
    lacks keep their empty defaults (``sandbox_url``, ``file_systems``, ``pool_id`` ...).
    """

    sandbox_id: str
    namespace: str = "default"
    status: Union[SandboxStatus, str] = SandboxStatus.PENDING
    image: Optional[str] = None
    resources: ContainerResourcesInfo = field(default_factory=lambda: ContainerResourcesInfo(1.0, 512, 0))
    timeout_secs: Optional[int] = None
    entrypoint: Optional[List[str]] = None
    network: Optional[NetworkConfig] = None
    pool_id: Optional[str] = None
    outcome: Optional[str] = None
    termination_reason: Optional[str] = None
    error_details: Any = None
    created_at: Optional[datetime] = None
    terminated_at: Optional[datetime] = None
    name: Optional[str] = None
    allow_unauthenticated_access: bool = False
    exposed_ports: Optional[List[int]] = None
    ingress_endpoint: Optional[str] = None
    sandbox_url: Optional[str] = None
    routing_hint: Optional[str] = None
    file_systems: List[FileSystemMount] = field(default_factory=list)
    # sandfork's own
    snapshot_id: Optional[str] = None
    labels: Dict[str, str] = field(default_factory=dict)
    last_active_at: Optional[datetime] = None
    on_timeout: Optional[str] = None
    expires_at: Optional[datetime] = None
    fork: Optional[Dict[str, Any]] = None
    error: Optional[str] = None
    disk_full: bool = False
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def id(self) -> str:
        """Alias of :attr:`sandbox_id`."""
        return self.sandbox_id

    @property
    def state(self) -> Union[SandboxStatus, str]:
        """Alias of :attr:`status`."""
        return self.status

    @property
    def cpus(self) -> float:
        """CPU cores (``resources.cpus``)."""
        return self.resources.cpus

    @property
    def memory_mb(self) -> int:
        """Memory limit in MiB (``resources.memory_mb``)."""
        return self.resources.memory_mb

    @property
    def disk_mb(self) -> int:
        """Root disk size in MiB, 0 for the image's (``resources.ephemeral_disk_mb``)."""
        return self.resources.ephemeral_disk_mb

    def url_for_port(self, port: int = 9501) -> Optional[str]:
        """Tensorlake's public URL of a port. Raises: a ``SandboxInfo`` does not know the
        daemon's address; ``Sandbox.get_url(port)`` does."""
        raise errors.not_supported("port URLs from a SandboxInfo", "use Sandbox.get_url(port), which knows the daemon's address", plural=True)

    @classmethod
    def from_json(cls, doc: Dict[str, Any]) -> "SandboxInfo":
        """Decodes a ``Sandbox`` document."""
        net = doc.get("network")
        state = doc.get("state", doc.get("status"))
        status = _enum_or_str(SandboxStatus, state)
        return cls(
            sandbox_id=str(doc["id"]),
            status=status,
            image=doc.get("image"),
            resources=ContainerResourcesInfo(float(doc.get("cpus") or 0), int(doc.get("memory_mb") or 0), int(doc.get("disk_mb") or 0)),
            timeout_secs=int(doc.get("timeout_secs") or 0),
            entrypoint=list(doc["entrypoint"]) if doc.get("entrypoint") else None,
            network=NetworkConfig.from_json(net) if isinstance(net, dict) else None,
            termination_reason=doc.get("error") if status == SandboxStatus.FAILED else None,
            created_at=parse_time(doc.get("created_at")),
            terminated_at=parse_time(doc.get("terminated_at")),
            name=doc.get("name"),
            snapshot_id=doc.get("snapshot_id"),
            labels=dict(doc.get("labels") or {}),
            last_active_at=parse_time(doc.get("last_active_at")),
            on_timeout=doc.get("on_timeout"),
            expires_at=parse_time(doc.get("expires_at")),
            allow_unauthenticated_access=bool(doc.get("public_ports")),
            exposed_ports=list(doc["exposed_ports"]) if doc.get("exposed_ports") is not None else None,
            fork=doc.get("fork"),
            error=doc.get("error"),
            disk_full=bool(doc.get("disk_full")),
            raw=doc,
        )


@dataclass
class SandboxStats:
    """What a running sandbox uses, read when asked (sandfork's own). Counters (CPU time,
    network) run from its boot or restore: take two readings for a rate."""

    sandbox_id: str
    sampled_at: Optional[datetime]
    cpu_seconds: float
    cpus: float
    memory_bytes: int
    memory_limit_bytes: int
    pids: int
    oom_kills: int
    disk_used_bytes: int
    disk_total_bytes: int
    net_rx_bytes: int
    net_tx_bytes: int
    net_rx_packets: int
    net_tx_packets: int

    @classmethod
    def from_json(cls, doc: Dict[str, Any]) -> "SandboxStats":
        """Decodes a ``SandboxStats`` document."""
        ints = ("memory_bytes", "memory_limit_bytes", "pids", "oom_kills", "disk_used_bytes", "disk_total_bytes",
                "net_rx_bytes", "net_tx_bytes", "net_rx_packets", "net_tx_packets")  # fmt: skip
        return cls(
            sandbox_id=str(doc["id"]),
            sampled_at=parse_time(doc.get("sampled_at")),
            cpu_seconds=float(doc.get("cpu_seconds") or 0.0),
            cpus=float(doc.get("cpus") or 0.0),
            **{k: int(doc.get(k) or 0) for k in ints},
        )


@dataclass
class ArchivedSandboxInfo(SandboxInfo):
    """An archived sandbox (not supported by sandfork)."""

    archived_at: Optional[datetime] = None


@dataclass
class ListArchivedSandboxesResponse:
    """A page of archived sandboxes (not supported by sandfork)."""

    sandboxes: List[ArchivedSandboxInfo] = field(default_factory=list)
    prev_cursor: Optional[str] = None
    next_cursor: Optional[str] = None


@dataclass
class ListSandboxesResponse:
    """A list of sandboxes."""

    sandboxes: List[SandboxInfo] = field(default_factory=list)


# --- pools (not supported) ------------------------------------------------------------


@dataclass
class CreateSandboxPoolResponse:
    """A created sandbox pool (pools are not supported by sandfork)."""

    pool_id: str
    namespace: str = "default"


@dataclass
class PoolContainerInfo:
    """A container of a sandbox pool (pools are not supported by sandfork)."""

    id: str
    state: str
    sandbox_id: Optional[str] = None
    executor_id: str = ""


@dataclass
class SandboxPoolInfo:
    """A sandbox pool (pools are not supported by sandfork)."""

    pool_id: str
    namespace: str = "default"
    image: str = ""
    resources: Optional[ContainerResourcesInfo] = None
    timeout_secs: int = 0
    entrypoint: Optional[List[str]] = None
    max_containers: Optional[int] = None
    warm_containers: Optional[int] = None
    network_policy: Optional[NetworkConfig] = None
    containers: Optional[List[PoolContainerInfo]] = None
    created_at: Optional[datetime] = None
    updated_at: Optional[datetime] = None


@dataclass
class ListSandboxPoolsResponse:
    """A list of sandbox pools (pools are not supported by sandfork)."""

    pools: List[SandboxPoolInfo] = field(default_factory=list)


# --- snapshots ------------------------------------------------------------------------


@dataclass
class CreateSnapshotResponse(TracedMixin):
    """The answer to ``SandboxClient.snapshot``."""

    snapshot_id: str
    status: Union[SnapshotStatus, str] = SnapshotStatus.COMPLETED


@dataclass
class SnapshotInfo(TracedMixin):
    """A snapshot's description: Tensorlake's fields plus sandfork's.

    ``status`` is ``COMPLETED`` (a sandfork snapshot is complete when the daemon
    answers). ``base_image`` is the image the source sandbox booted from;
    ``rootfs_disk_bytes`` the size of its root disk (``disk_mb`` MiB, 0 for
    the image's own size); ``size_bytes`` what the snapshot's disk layer and
    memory images occupy. ``snapshot_uri`` and ``snapshot_format_version``
    stay ``None``.
    """

    snapshot_id: str
    namespace: str = "default"
    sandbox_id: Optional[str] = None
    base_image: Optional[str] = None
    status: Union[SnapshotStatus, str] = SnapshotStatus.COMPLETED
    snapshot_type: Optional[Union[SnapshotType, str]] = None
    error: Optional[str] = None
    snapshot_uri: Optional[str] = None
    snapshot_format_version: Optional[str] = None
    size_bytes: Optional[int] = None
    rootfs_disk_bytes: Optional[int] = None
    created_at: Optional[datetime] = None

    @staticmethod
    def fields_from_json(doc: Dict[str, Any]) -> Dict[str, Any]:
        """The constructor arguments for a ``Snapshot`` document."""
        disk_mb = doc.get("disk_mb")
        return dict(
            snapshot_id=str(doc.get("id") or doc.get("snapshot_id")),
            sandbox_id=doc.get("source_sandbox_id", doc.get("sandbox_id")),
            base_image=doc.get("image"),
            status=_enum_or_str(SnapshotStatus, doc.get("status") or "completed"),
            snapshot_type=_enum_or_str(SnapshotType, doc.get("type") or doc.get("snapshot_type")),
            error=doc.get("error"),
            size_bytes=int(doc.get("size_bytes") or 0),
            rootfs_disk_bytes=int(disk_mb) * 1024 * 1024 if disk_mb is not None else None,
            created_at=parse_time(doc.get("created_at")),
        )


@dataclass
class ListSnapshotsResponse:
    """A list of snapshots."""

    snapshots: List[SnapshotInfo] = field(default_factory=list)


@dataclass
class ListProcessesResponse:
    """A list of processes."""

    processes: List[ProcessInfo] = field(default_factory=list)


# --- daemon -----------------------------------------------------------------------------


@dataclass
class HealthResponse(TracedMixin):
    """Whether the daemon answers and the sandbox is running."""

    healthy: bool


@dataclass
class DaemonInfo(TracedMixin):
    """About the daemon serving a sandbox: its ``version``, the sandbox's age in
    ``uptime_secs``, and the sandbox's process counts."""

    version: str
    uptime_secs: int
    running_processes: int
    total_processes: int


# --- logs (not supported) ---------------------------------------------------------------


@dataclass
class SandboxLogSignal:
    """A line of the sandbox log in Tensorlake's record shape (``timestamp`` in ns)."""

    timestamp: int
    uuid: str
    namespace: str
    body: str
    log_attributes: str = ""
    application: str = ""
    sandbox_id: Optional[str] = None
    resource_attributes: List[Tuple[str, str]] = field(default_factory=list)
    allocations: List[str] = field(default_factory=list)
    function_runs: List[str] = field(default_factory=list)
    level: Optional[int] = None
    retention: Optional[int] = None


@dataclass
class SandboxLogsResponse:
    """A page of the sandbox log; ``next_token`` reads on."""

    logs: List[SandboxLogSignal] = field(default_factory=list)
    next_token: Optional[str] = None


@dataclass
class SandboxProcessLogFilter:
    """A process that has lines in the sandbox log."""

    process_id: str
    process_pid: str
    process_command: str
    process_managed_id: str
    process_managed_name: str
    first_seen: int
    last_seen: int
    log_count: int


@dataclass
class SandboxProcessLogFiltersResponse:
    """Processes that have lines in the sandbox log."""

    processes: List[SandboxProcessLogFilter] = field(default_factory=list)


# --- request models (for annotations; the SDK builds its requests itself) ---------------


@dataclass
class CreateSandboxResources:
    """Resources of a create request."""

    cpus: float = 1.0
    memory_mb: int = 512
    disk_mb: Optional[int] = None
    gpus: Optional[List[GpuRequest]] = None


@dataclass
class CreateSandboxRequest:
    """A create request."""

    image: Optional[str] = None
    resources: CreateSandboxResources = field(default_factory=CreateSandboxResources)
    timeout_secs: Optional[int] = None
    entrypoint: Optional[List[str]] = None
    network: Optional[NetworkConfig] = None
    snapshot_id: Optional[str] = None
    name: Optional[str] = None
    file_systems: Optional[List[FileSystemMount]] = None


@dataclass
class ClaimSandboxRequest:
    """A pool claim request (pools are not supported by sandfork)."""

    file_systems: Optional[List[FileSystemMount]] = None


@dataclass
class UpdateSandboxRequest:
    """An update request."""

    name: Optional[str] = None
    allow_unauthenticated_access: Optional[bool] = None
    exposed_ports: Optional[List[int]] = None
    network: Optional[NetworkConfig] = None


@dataclass
class SandboxPoolRequest:
    """A pool request (pools are not supported by sandfork)."""

    image: str
    resources: ContainerResourcesInfo
    timeout_secs: int = 0
    entrypoint: Optional[List[str]] = None
    max_containers: Optional[int] = None
    warm_containers: Optional[int] = None
    network: Optional[NetworkConfig] = None


def sandbox_url_from_ingress_endpoint(ingress_endpoint: str, sandbox_id: str, port: Optional[int] = None) -> str:
    """Tensorlake's URL of a sandbox (``port`` None or 9501) or of one of its ports,
    derived from an ingress endpoint. A pure function; sandfork itself has no ingress."""
    parts = urlsplit(ingress_endpoint)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("ingress_endpoint must be an absolute http(s) URL")
    host = parts.hostname
    if ":" in host:
        host = f"[{host}]"
    label = sandbox_id if port is None or port == 9501 else f"{port}-{sandbox_id}"
    netloc = f"{label}.{host}" + (f":{parts.port}" if parts.port else "")
    return f"{parts.scheme}://{netloc}"
