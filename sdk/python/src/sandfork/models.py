"""Plain data types returned by the SDK, decoded from the daemon's JSON."""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from typing import Any, Dict, List, Optional, Union


class _StrEnum(str, Enum):
    """A string enum that prints as its value (``f"{SandboxStatus.RUNNING}"`` is ``running``)."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class CheckpointType(_StrEnum):
    """What a checkpoint captures.

    - ``FILESYSTEM``: the disk only; a sandbox restored from it boots cold.
    - ``MEMORY``: disk plus memory plus running processes; restores resume warm.
    """

    FILESYSTEM = "filesystem"
    MEMORY = "memory"


SnapshotType = CheckpointType
"""Tensorlake's name for the same enum."""


class SandboxStatus(_StrEnum):
    """Lifecycle state of a sandbox, as the daemon reports it."""

    CREATING = "creating"
    RUNNING = "running"
    CHECKPOINTING = "checkpointing"
    SUSPENDING = "suspending"
    SUSPENDED = "suspended"
    RESUMING = "resuming"
    TERMINATING = "terminating"
    TERMINATED = "terminated"
    FAILED = "failed"


class ProcessStatus(_StrEnum):
    """State of a background process."""

    RUNNING = "running"
    EXITED = "exited"


def _enum_or_str(enum: Any, value: Any) -> Any:
    """The enum member for ``value``, or the raw string for a state this SDK does not know."""
    try:
        return enum(value)
    except ValueError:
        return value


_FRACTION = re.compile(r"\.(\d+)")


def parse_time(value: Any) -> Optional[datetime]:
    """Parses an RFC 3339 timestamp (``Z`` suffix and nanoseconds allowed)."""
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


@dataclass
class CommandResult:
    """What a finished command produced.

    ``exit_code`` follows :mod:`subprocess`: when the command was killed by a
    signal it is ``-signal`` (and :attr:`signal` holds the signal number).
    """

    stdout: str
    stderr: str
    exit_code: int
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
            stdout=out.decode("utf-8", errors="replace"),
            stderr=err.decode("utf-8", errors="replace"),
            exit_code=exit_code_of(exit_record.get("exit_code"), signal),
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
    """One chunk of output from a running command.

    Attributes:
        stream: ``"stdout"`` or ``"stderr"``.
        data: The chunk as text (UTF-8 decoded across chunk boundaries).
        raw: The exact bytes of the chunk.
        offset: Byte offset of the chunk in its stream (process output only).
    """

    stream: str
    data: str
    raw: bytes = field(default=b"", repr=False)
    offset: Optional[int] = None

    @property
    def line(self) -> str:
        """Alias of :attr:`data`."""
        return self.data


@dataclass
class ProcessInfo:
    """A background process as the daemon reports it."""

    pid: int
    command: str
    args: List[str]
    status: Union[ProcessStatus, str]
    exit_code: Optional[int] = None
    signal: Optional[int] = None
    os_pid: Optional[int] = None
    started_at: Optional[datetime] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def state(self) -> Union[ProcessStatus, str]:
        """Alias of :attr:`status` (the API's field name)."""
        return self.status

    @property
    def running(self) -> bool:
        """True while the process has not exited."""
        return self.status == ProcessStatus.RUNNING

    @classmethod
    def from_json(cls, doc: Dict[str, Any]) -> "ProcessInfo":
        """Decodes a ``Process`` document."""
        return cls(
            pid=int(doc["pid"]),
            command=str(doc.get("command", "")),
            args=list(doc.get("args") or []),
            status=_enum_or_str(ProcessStatus, doc.get("state", doc.get("status"))),
            exit_code=doc.get("exit_code"),
            signal=doc.get("signal"),
            os_pid=doc.get("os_pid"),
            started_at=parse_time(doc.get("started_at")),
            raw=doc,
        )


@dataclass
class DirectoryEntry:
    """One file, directory or link inside a sandbox."""

    name: str
    path: str
    type: str
    size: int = 0
    mode: int = 0
    modified_at: Optional[datetime] = None

    @property
    def is_dir(self) -> bool:
        """True for a directory."""
        return self.type == "dir"

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
        return cls(
            name=str(doc.get("name", "")),
            path=str(doc.get("path", "")),
            type=str(doc.get("type", "other")),
            size=int(doc.get("size") or 0),
            mode=_mode(doc.get("mode")),
            modified_at=parse_time(doc.get("modified_at")),
        )


def _mode(value: Any) -> int:
    if isinstance(value, str):
        try:
            return int(value, 8)
        except ValueError:
            return 0
    return int(value or 0)


class DirectoryListing(List[DirectoryEntry]):
    """The entries of a directory: a list, also exposing ``.path`` and ``.entries``."""

    def __init__(self, path: str, entries: List[DirectoryEntry]):
        super().__init__(entries)
        self.path = path

    @property
    def entries(self) -> List[DirectoryEntry]:
        """The entries as a plain list."""
        return list(self)


ListDirectoryResponse = DirectoryListing


@dataclass
class SandboxInfo:
    """A sandbox as the daemon reports it."""

    id: str
    status: Union[SandboxStatus, str]
    name: Optional[str] = None
    image: Optional[str] = None
    snapshot_id: Optional[str] = None
    cpus: float = 0.0
    memory_mb: int = 0
    disk_mb: Optional[int] = None
    timeout_secs: int = 0
    network: Dict[str, Any] = field(default_factory=dict)
    labels: Dict[str, str] = field(default_factory=dict)
    created_at: Optional[datetime] = None
    last_active_at: Optional[datetime] = None
    fork: Optional[Dict[str, Any]] = None
    error: Optional[str] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def sandbox_id(self) -> str:
        """Alias of :attr:`id`."""
        return self.id

    @property
    def state(self) -> Union[SandboxStatus, str]:
        """Alias of :attr:`status` (the API's field name)."""
        return self.status

    @classmethod
    def from_json(cls, doc: Dict[str, Any]) -> "SandboxInfo":
        """Decodes a ``Sandbox`` document."""
        return cls(
            id=str(doc["id"]),
            status=_enum_or_str(SandboxStatus, doc.get("state", doc.get("status"))),
            name=doc.get("name"),
            image=doc.get("image"),
            snapshot_id=doc.get("snapshot_id"),
            cpus=float(doc.get("cpus") or 0),
            memory_mb=int(doc.get("memory_mb") or 0),
            disk_mb=doc.get("disk_mb"),
            timeout_secs=int(doc.get("timeout_secs") or 0),
            network=dict(doc.get("network") or {}),
            labels=dict(doc.get("labels") or {}),
            created_at=parse_time(doc.get("created_at")),
            last_active_at=parse_time(doc.get("last_active_at")),
            fork=doc.get("fork"),
            error=doc.get("error"),
            raw=doc,
        )
