"""The OpenAI Agents SDK's sandbox client and session, on sandfork."""

from __future__ import annotations

import asyncio
import functools
import io
import json
import logging
import shlex
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Literal, Optional, Tuple, TypeVar, Union

from agents.sandbox.errors import (
    ExecTimeoutError,
    ExecTransportError,
    ExposedPortUnavailableError,
    WorkspaceArchiveReadError,
    WorkspaceArchiveWriteError,
    WorkspaceReadNotFoundError,
    WorkspaceStartError,
    WorkspaceWriteTypeError,
)
from agents.sandbox.manifest import Manifest
from agents.sandbox.session import SandboxSession, SandboxSessionState
from agents.sandbox.session.base_sandbox_session import BaseSandboxSession
from agents.sandbox.session.dependencies import Dependencies
from agents.sandbox.session.manager import Instrumentation
from agents.sandbox.session.pty_output import collect_pty_output
from agents.sandbox.session.pty_types import (
    PTY_PROCESSES_MAX,
    PtyExecUpdate,
    allocate_pty_process_id,
    clamp_pty_yield_time_ms,
    process_id_to_prune_from_meta,
    resolve_pty_write_yield_time_ms,
)
from agents.sandbox.session.runtime_helpers import RESOLVE_WORKSPACE_PATH_HELPER, RuntimeHelperScript
from agents.sandbox.session.sandbox_client import BaseSandboxClient, BaseSandboxClientOptions
from agents.sandbox.session.tar_workspace import shell_tar_exclude_args
from agents.sandbox.snapshot import NoopSnapshot, SnapshotBase, SnapshotSpec, resolve_snapshot
from agents.sandbox.types import ExecResult, ExposedPortEndpoint, User
from agents.sandbox.util.tar_utils import UnsafeTarMemberError, validate_tar_bytes
from agents.sandbox.workspace_paths import sandbox_path_str
from pydantic import Field
from sandfork import CheckpointType, Client, Sandbox, Snapshot
from sandfork import errors as sf_errors

from ._errors import SandforkForkError

log = logging.getLogger(__name__)

T = TypeVar("T")

BACKEND_ID = "sandfork"
LABEL = "agents-sandfork"
# The daemon refuses request bodies over 1 MiB: bigger command lines and inputs go
# through a script file in the sandbox.
INLINE_LIMIT = 512 * 1024
SCRATCH_DIR = "/tmp/.agents-sandfork"
# What persist_workspace returns in "checkpoint" mode: a reference to a memory snapshot,
# not a tar archive.
CHECKPOINT_MAGIC = b"SANDFORK_MEMORY_CHECKPOINT_V1\n"

OnExit = Literal["terminate", "suspend"]
WorkspacePersistence = Literal["tar", "checkpoint"]

_UNAVAILABLE = (
    sf_errors.SandboxNotFoundError,
    sf_errors.SandboxConnectionError,
    sf_errors.ConflictError,
    sf_errors.UnavailableError,
    sf_errors.ServerError,
)


async def _io(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Runs a blocking SDK call on a worker thread (the sandfork SDK is synchronous)."""
    return await asyncio.to_thread(functools.partial(fn, *args, **kwargs))


class SandforkSandboxClientOptions(BaseSandboxClientOptions):
    """How a new session's sandbox is made.

    ``snapshot_id`` starts it from a sandfork snapshot (a memory snapshot: warm, with its
    processes) instead of ``image``. ``on_exit`` is what closing the session does to the
    sandbox: ``terminate`` it, or ``suspend`` it (memory checkpoint, then stop, same id),
    so that ``SandforkSandboxClient.resume(state)`` picks it up where it was.
    ``workspace_persistence="checkpoint"`` makes the session's persisted snapshot a sandfork
    memory checkpoint (a reference, restored warm) instead of a tar of the workspace.
    """

    type: Literal["sandfork"] = "sandfork"
    image: Optional[str] = None
    snapshot_id: Optional[str] = None
    cpus: Optional[float] = None
    memory_mb: Optional[int] = None
    disk_mb: Optional[int] = None
    env: Optional[Dict[str, str]] = None
    allow_internet_access: bool = False
    timeout_secs: Optional[int] = None
    on_exit: OnExit = "terminate"
    workspace_persistence: WorkspacePersistence = "tar"
    exposed_ports: Tuple[int, ...] = ()
    labels: Optional[Dict[str, str]] = None


class SandforkSandboxSessionState(SandboxSessionState):
    """The serializable state of a session: the sandbox it runs in and how to remake it."""

    type: Literal["sandfork"] = "sandfork"
    sandbox_id: str
    image: Optional[str] = None
    source_snapshot_id: Optional[str] = None
    cpus: Optional[float] = None
    memory_mb: Optional[int] = None
    disk_mb: Optional[int] = None
    base_env: Dict[str, str] = Field(default_factory=dict)
    allow_internet_access: bool = False
    timeout_secs: Optional[int] = None
    on_exit: OnExit = "terminate"
    workspace_persistence: WorkspacePersistence = "tar"
    labels: Dict[str, str] = Field(default_factory=dict)
    checkpoint_id: Optional[str] = None
    """The memory checkpoint last persisted in "checkpoint" mode (owned by this session)."""


def _make_sandbox(client: Client, state: SandforkSandboxSessionState, snapshot_id: Optional[str] = None) -> Sandbox:
    labels = {**state.labels, LABEL: "session"}
    source = snapshot_id or state.source_snapshot_id
    if source is not None:
        # a memory snapshot pins image and resources; the environment and labels are the session's
        return Sandbox.create(snapshot_id=source, env=state.base_env or None, labels=labels, timeout_secs=state.timeout_secs, client=client)
    kwargs: Dict[str, Any] = dict(
        image=state.image, env=state.base_env or None, labels=labels, timeout_secs=state.timeout_secs,
        allow_internet_access=state.allow_internet_access, client=client,
    )  # fmt: skip
    for key in ("cpus", "memory_mb", "disk_mb"):
        value = getattr(state, key)
        if value is not None:
            kwargs[key] = value
    return Sandbox.create(**kwargs)


def _delete_snapshot(client: Client, snapshot_id: str) -> None:
    try:
        Snapshot.get(snapshot_id, client=client).delete()
    except sf_errors.NotFoundError:
        pass


@dataclass
class _PtyEntry:
    """A process started by ``pty_exec_start``: on a terminal of its own (``tty``), or a
    background process whose stdout and stderr are followed (no stdin)."""

    tty: bool
    pid: int = 0
    term: Any = None
    chunks: "deque[bytes]" = field(default_factory=deque)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    notify: asyncio.Event = field(default_factory=asyncio.Event)
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    exit_code: Optional[int] = None
    last_used: float = field(default_factory=time.monotonic)
    deadline: Optional[asyncio.TimerHandle] = None


class SandforkSandboxSession(BaseSandboxSession):
    """A session in one sandfork sandbox (``self.sandbox``)."""

    state: SandforkSandboxSessionState

    def __init__(self, *, state: SandforkSandboxSessionState, sandbox: Sandbox, client: Client) -> None:
        self.state = state
        self.sandbox = sandbox
        self._client = client
        self._workspace_root_ready = state.workspace_root_ready
        self._pty_lock = asyncio.Lock()
        self._pty_processes: Dict[int, _PtyEntry] = {}
        self._pty_ids: set = set()

    @property
    def sandbox_id(self) -> str:
        return self.state.sandbox_id

    # --- backend lifecycle ------------------------------------------------------------------

    async def _validate_path_access(self, path: Union[Path, str], *, for_write: bool = False) -> Path:
        return await self._validate_remote_path_access(path, for_write=for_write)

    def _runtime_helpers(self) -> Tuple[RuntimeHelperScript, ...]:
        return (RESOLVE_WORKSPACE_PATH_HELPER,)

    def _current_runtime_helper_cache_key(self) -> object:
        return self.state.sandbox_id

    async def _prepare_backend_workspace(self) -> None:
        root = self._workspace_root_path().as_posix()
        try:
            result = await _io(self.sandbox.run, ["mkdir", "-p", "--", root])
        except sf_errors.SandboxError as e:
            raise WorkspaceStartError(path=self._workspace_root_path(), cause=e) from e
        if result.exit_code != 0:
            raise WorkspaceStartError(
                path=self._workspace_root_path(),
                context={"reason": "workspace_root_nonzero_exit", "exit_code": result.exit_code, "stderr": result.stderr},
            )
        self._workspace_root_ready = True

    def _mark_workspace_root_ready_from_probe(self) -> None:
        super()._mark_workspace_root_ready_from_probe()
        self._workspace_root_ready = True

    async def _after_start(self) -> None:
        # a hydration from a memory checkpoint replaces the sandbox: its helpers come with it
        # only if they were in the checkpoint
        if self._runtime_helper_cache_key != self._current_runtime_helper_cache_key():
            await self._ensure_runtime_helpers()

    async def _shutdown_backend(self) -> None:
        try:
            if self.state.on_exit == "suspend":
                await _io(self.sandbox.suspend)
            else:
                await _io(self.sandbox.terminate)
        except sf_errors.SandboxNotFoundError:
            pass
        except sf_errors.SandboxError as e:
            log.warning("could not %s sandfork sandbox %s: %s", self.state.on_exit, self.sandbox.id, e)

    async def running(self) -> bool:
        try:
            info = await _io(self.sandbox.info)
        except sf_errors.SandboxError:
            return False
        return info.state == "running"

    # --- commands -------------------------------------------------------------------------

    async def _resolved_env(self) -> Dict[str, str]:
        manifest_env = await self.state.manifest.environment.resolve()
        return {**self.state.base_env, **manifest_env}

    async def _exec_internal(self, *command: Union[str, Path], timeout: Optional[float] = None) -> ExecResult:
        argv = [str(c) for c in command]
        user: Optional[str] = None
        # SandboxSession.exec runs other users' commands as `sudo -u USER -- ...`: sandfork
        # runs them as that user itself (images need no sudo).
        if len(argv) >= 4 and argv[0] == "sudo" and argv[1] == "-u" and argv[3] == "--":
            user, argv = argv[2], argv[4:]
        cwd = self.state.manifest.root if self._workspace_root_ready else None
        env = await self._resolved_env()
        try:
            result = await _io(_run, self.sandbox, argv, None, cwd, env, user, timeout)
        except sf_errors.BadRequestError as e:
            if e.code != "exec_failed":
                raise ExecTransportError(command=command, cause=e, message=f"the daemon refused the command: {e}") from e
            message = (e.message or str(e)).lower()
            code = 126 if "permission denied" in message else 127 if ("not found" in message or "no such file" in message) else 126
            return ExecResult(stdout=b"", stderr=((e.message or str(e)) + "\n").encode(), exit_code=code)
        except sf_errors.SandforkTimeoutError as e:
            raise ExecTimeoutError(command=command, timeout_s=timeout, cause=e) from e
        except _UNAVAILABLE as e:
            raise ExecTransportError(command=command, cause=e, message=f"the sandfork sandbox {self.sandbox.id} cannot run commands: {e}") from e
        if result.timed_out:
            raise ExecTimeoutError(command=command, timeout_s=timeout)
        exit_code = 128 + result.signal if result.signal else result.exit_code
        return ExecResult(stdout=result.stdout_bytes, stderr=result.stderr_bytes, exit_code=exit_code)

    # --- interactive processes (the SDK's exec_command / write_stdin tools) -------------------

    def supports_pty(self) -> bool:
        return True

    async def pty_exec_start(
        self,
        *command: Union[str, Path],
        timeout: Optional[float] = None,
        shell: Union[bool, List[str]] = True,
        user: Union[str, User, None] = None,
        tty: bool = False,
        yield_time_s: Optional[float] = None,
        max_output_tokens: Optional[int] = None,
    ) -> PtyExecUpdate:
        argv = self._prepare_exec_command(*command, shell=shell, user=None)
        user_name = user.name if isinstance(user, User) else user
        cwd = self.state.manifest.root if self._workspace_root_ready else None
        env = await self._resolved_env()
        loop = asyncio.get_running_loop()
        entry = _PtyEntry(tty=tty)

        def deliver(chunk: bytes) -> None:
            loop.call_soon_threadsafe(_append, entry, bytes(chunk))

        def finish(code: Optional[int]) -> None:
            loop.call_soon_threadsafe(_close, entry, code)

        try:
            if tty:
                entry.term = await _io(
                    self.sandbox.pty.create, argv[0], argv[1:], env=env or None, working_dir=cwd, user=user_name,
                    on_data=deliver, on_exit=finish,
                )  # fmt: skip
                entry.pid = entry.term.pid
            else:
                process = await _io(self.sandbox.start_process, argv[0], argv[1:], env or None, cwd, user=user_name)
                entry.pid = process.pid
                threading.Thread(target=_follow, args=(self.sandbox, entry.pid, deliver, finish), daemon=True).start()
        except sf_errors.BadRequestError as e:
            raise ExecTransportError(command=command, cause=e, message=f"the command could not start: {e}") from e
        except _UNAVAILABLE as e:
            raise ExecTransportError(command=command, cause=e, message=f"the sandfork sandbox {self.sandbox.id} cannot run commands: {e}") from e
        if timeout is not None:
            entry.deadline = loop.call_later(max(timeout, 0.0), lambda: loop.create_task(self._kill(entry)))
        async with self._pty_lock:
            process_id = allocate_pty_process_id(self._pty_ids)
            self._pty_ids.add(process_id)
            pruned = self._prune_pty()
            self._pty_processes[process_id] = entry
        if pruned is not None:
            await self._kill(pruned)
        yield_ms = 10_000 if yield_time_s is None else int(yield_time_s * 1000)
        return await self._pty_update(process_id, entry, clamp_pty_yield_time_ms(yield_ms), max_output_tokens)

    async def pty_write_stdin(
        self,
        *,
        session_id: int,
        chars: str,
        yield_time_s: Optional[float] = None,
        max_output_tokens: Optional[int] = None,
    ) -> PtyExecUpdate:
        async with self._pty_lock:
            entry = self._resolve_pty_session_entry(pty_processes=self._pty_processes, session_id=session_id)
        if chars:
            if not entry.tty:
                raise RuntimeError("stdin is not available for this process (start it with tty=True)")
            await _io(entry.term.send, chars.encode("utf-8"))
            await asyncio.sleep(0.1)
        entry.last_used = time.monotonic()
        yield_ms = 250 if yield_time_s is None else int(yield_time_s * 1000)
        wait_ms = resolve_pty_write_yield_time_ms(yield_time_ms=yield_ms, input_empty=chars == "")
        return await self._pty_update(session_id, entry, wait_ms, max_output_tokens)

    async def pty_terminate_all(self) -> None:
        async with self._pty_lock:
            entries = list(self._pty_processes.values())
            self._pty_processes.clear()
            self._pty_ids.clear()
        for entry in entries:
            await self._kill(entry)

    async def _pty_update(self, process_id: int, entry: _PtyEntry, yield_time_ms: int, max_output_tokens: Optional[int]) -> PtyExecUpdate:
        output, original_token_count, output_closed = await collect_pty_output(
            output_chunks=entry.chunks,
            output_lock=entry.lock,
            output_notify=entry.notify,
            is_done=entry.closed.is_set,
            yield_time_ms=yield_time_ms,
            max_output_tokens=max_output_tokens,
        )
        exit_code = entry.exit_code if output_closed else None
        live: Optional[int] = process_id
        if output_closed:
            async with self._pty_lock:
                self._pty_processes.pop(process_id, None)
                self._pty_ids.discard(process_id)
            await self._kill(entry)
            live = None
        return PtyExecUpdate(process_id=live, output=output, exit_code=exit_code, original_token_count=original_token_count)

    def _prune_pty(self) -> Optional[_PtyEntry]:
        if len(self._pty_processes) < PTY_PROCESSES_MAX:
            return None
        meta = [(pid, e.last_used, e.closed.is_set()) for pid, e in self._pty_processes.items()]
        victim = process_id_to_prune_from_meta(meta)
        if victim is None:
            return None
        self._pty_ids.discard(victim)
        return self._pty_processes.pop(victim, None)

    async def _kill(self, entry: _PtyEntry) -> None:
        """Ends the process (if it still runs) and detaches from its terminal."""
        if entry.deadline is not None:
            entry.deadline.cancel()
            entry.deadline = None
        if not entry.closed.is_set() and entry.pid:
            try:
                await _io(self.sandbox.kill_process, entry.pid)
            except sf_errors.SandboxError:
                pass
        if entry.term is not None:
            term, entry.term = entry.term, None
            await _io(term.close)

    async def _resolve_exposed_port(self, port: int) -> ExposedPortEndpoint:
        raise ExposedPortUnavailableError(
            port=port,
            exposed_ports=self.state.exposed_ports,
            reason="backend_unavailable",
            context={
                "backend": BACKEND_ID,
                "detail": "sandfork serves ports through its daemon's gateway under a path "
                "(/v1/sandboxes/ID/ports/PORT/), which a host:port endpoint cannot name; "
                "use session.sandbox.get_url(port) for a signed URL",
            },
        )

    # --- files ----------------------------------------------------------------------------

    async def read(self, path: Path, *, user: Union[str, User, None] = None) -> io.IOBase:
        if user is not None:
            await self._check_read_with_exec(path, user=user)
        workspace_path = await self._validate_path_access(path)
        try:
            data = await _io(self.sandbox.read_file, sandbox_path_str(workspace_path))
        except sf_errors.NotFoundError as e:
            if isinstance(e, sf_errors.SandboxNotFoundError):
                raise WorkspaceArchiveReadError(path=path, cause=e) from e
            raise WorkspaceReadNotFoundError(path=path, cause=e) from e
        except sf_errors.SandboxError as e:
            raise WorkspaceArchiveReadError(path=path, cause=e) from e
        return io.BytesIO(bytes(data))

    async def write(self, path: Path, data: io.IOBase, *, user: Union[str, User, None] = None) -> None:
        if user is not None:
            await self._check_write_with_exec(path, user=user)
        payload = data.read()
        if isinstance(payload, str):
            payload = payload.encode("utf-8")
        if not isinstance(payload, (bytes, bytearray)):
            raise WorkspaceWriteTypeError(path=path, actual_type=type(payload).__name__)
        workspace_path = await self._validate_path_access(path, for_write=True)
        try:
            await _io(self.sandbox.write_file, sandbox_path_str(workspace_path), bytes(payload))
        except sf_errors.SandboxError as e:
            raise WorkspaceArchiveWriteError(path=workspace_path, cause=e) from e

    # --- persistence ------------------------------------------------------------------------

    async def persist_workspace(self) -> io.IOBase:
        if self.state.workspace_persistence == "checkpoint":
            return await self._persist_checkpoint()
        return await self._persist_tar()

    async def _persist_checkpoint(self) -> io.IOBase:
        """A memory checkpoint of the whole sandbox (files, processes, memory); the
        previous one this session made is deleted."""
        root = self._workspace_root_path()
        try:
            snap = await _io(self.sandbox.checkpoint, checkpoint_type=CheckpointType.MEMORY, labels={LABEL: "checkpoint"})
        except sf_errors.SandboxError as e:
            raise WorkspaceArchiveReadError(path=root, context={"reason": "memory_checkpoint_failed"}, cause=e) from e
        previous, self.state.checkpoint_id = self.state.checkpoint_id, snap.snapshot_id
        if previous and previous != snap.snapshot_id:
            try:
                await _io(_delete_snapshot, self._client, previous)
            except sf_errors.SandboxError as e:
                log.warning("could not delete the earlier checkpoint %s: %s", previous, e)
        return io.BytesIO(CHECKPOINT_MAGIC + snap.snapshot_id.encode())

    async def _persist_tar(self) -> io.IOBase:
        root = self._workspace_root_path()
        tar_path = f"{SCRATCH_DIR}/persist-{uuid.uuid4().hex}.tar"
        excludes = " ".join(shell_tar_exclude_args(self._persist_workspace_skip_relpaths()))
        script = f"mkdir -p {SCRATCH_DIR} && tar {excludes} -C {shlex.quote(root.as_posix())} -cf {shlex.quote(tar_path)} ."
        try:
            result = await _io(self.sandbox.run, ["/bin/sh", "-c", script])
            if result.exit_code != 0:
                raise WorkspaceArchiveReadError(
                    path=root, context={"reason": "snapshot_nonzero_exit", "exit_code": result.exit_code, "stderr": result.stderr}
                )
            data = await _io(self.sandbox.read_file, tar_path)
        except sf_errors.SandboxError as e:
            raise WorkspaceArchiveReadError(path=root, cause=e) from e
        finally:
            try:
                await _io(self.sandbox.remove, tar_path)
            except sf_errors.SandboxError:
                pass
        return io.BytesIO(bytes(data))

    async def hydrate_workspace(self, data: io.IOBase) -> None:
        root = self._workspace_root_path()
        raw = data.read()
        if isinstance(raw, str):
            raw = raw.encode("utf-8")
        if not isinstance(raw, (bytes, bytearray)):
            raise WorkspaceWriteTypeError(path=root, actual_type=type(raw).__name__)
        raw = bytes(raw)
        if raw.startswith(CHECKPOINT_MAGIC):
            await self._hydrate_from_checkpoint(raw[len(CHECKPOINT_MAGIC):].decode().strip())
            return
        try:
            validate_tar_bytes(raw, allow_external_symlink_targets=False)
        except UnsafeTarMemberError as e:
            raise WorkspaceArchiveWriteError(path=root, context={"reason": "unsafe_or_invalid_tar", "member": e.member, "detail": str(e)}, cause=e) from e
        tar_path = f"{SCRATCH_DIR}/hydrate-{uuid.uuid4().hex}.tar"
        try:
            await _io(self.sandbox.write_file, tar_path, raw)
            result = await _io(self.sandbox.run, ["/bin/sh", "-c", f"mkdir -p {shlex.quote(root.as_posix())} && tar -C {shlex.quote(root.as_posix())} -xf {shlex.quote(tar_path)}"])
            if result.exit_code != 0:
                raise WorkspaceArchiveWriteError(path=root, context={"reason": "hydrate_nonzero_exit", "exit_code": result.exit_code, "stderr": result.stderr})
        except sf_errors.SandboxError as e:
            raise WorkspaceArchiveWriteError(path=root, cause=e) from e
        finally:
            try:
                await _io(self.sandbox.remove, tar_path)
            except sf_errors.SandboxError:
                pass
        self._workspace_root_ready = True

    async def _hydrate_from_checkpoint(self, snapshot_id: str) -> None:
        """Replaces this session's sandbox with a restore of the memory checkpoint: the
        workspace, and the processes and memory that were running, come back."""
        root = self._workspace_root_path()
        try:
            replacement = await _io(_make_sandbox, self._client, self.state, snapshot_id)
        except sf_errors.SandboxError as e:
            raise WorkspaceArchiveWriteError(path=root, context={"reason": "memory_checkpoint_restore_failed", "snapshot_id": snapshot_id}, cause=e) from e
        old, self.sandbox = self.sandbox, replacement
        self.state.sandbox_id = replacement.id
        try:
            await _io(old.terminate)
        except sf_errors.SandboxError:
            pass
        self._workspace_root_ready = True


class SandforkSandboxClient(BaseSandboxClient[SandforkSandboxClientOptions]):
    """Creates, resumes, forks and deletes sessions on a sandfork daemon.

    The daemon is ``url``/``token`` when given, else ``SANDFORK_URL``/``SANDFORK_TOKEN``,
    else the default socket (the token is never part of a session's serialized state)."""

    backend_id = BACKEND_ID

    def __init__(
        self,
        *,
        url: Optional[str] = None,
        token: Optional[str] = None,
        client: Optional[Client] = None,
        instrumentation: Optional[Instrumentation] = None,
        dependencies: Optional[Dependencies] = None,
    ) -> None:
        self.client = client or (Client(url=url, token=token) if url or token else Client())
        self._instrumentation = instrumentation if instrumentation is not None else Instrumentation()
        self._dependencies = dependencies

    async def create(
        self,
        *,
        snapshot: Union[SnapshotSpec, SnapshotBase, None] = None,
        manifest: Optional[Manifest] = None,
        options: SandforkSandboxClientOptions,
    ) -> SandboxSession:
        if options is None:
            raise ValueError("SandforkSandboxClient.create requires options (SandforkSandboxClientOptions)")
        if not isinstance(options, SandforkSandboxClientOptions):
            options = SandforkSandboxClientOptions.model_validate(options if isinstance(options, dict) else options.model_dump())
        manifest = manifest if manifest is not None else Manifest()
        self._validate_manifest_for_create(manifest)
        session_id = uuid.uuid4()
        state = SandforkSandboxSessionState(
            session_id=session_id,
            manifest=manifest,
            snapshot=resolve_snapshot(snapshot, str(session_id)),
            sandbox_id="",
            image=options.image,
            source_snapshot_id=options.snapshot_id,
            cpus=options.cpus,
            memory_mb=options.memory_mb,
            disk_mb=options.disk_mb,
            base_env=dict(options.env or {}),
            allow_internet_access=options.allow_internet_access,
            timeout_secs=options.timeout_secs,
            on_exit=options.on_exit,
            workspace_persistence=options.workspace_persistence,
            labels=dict(options.labels or {}),
            exposed_ports=options.exposed_ports,
        )
        sandbox = await _io(_make_sandbox, self.client, state)
        state.sandbox_id = sandbox.id
        inner = SandforkSandboxSession(state=state, sandbox=sandbox, client=self.client)
        return self._wrap_session(inner, instrumentation=self._instrumentation)

    async def delete(self, session: SandboxSession) -> SandboxSession:
        """Terminates the session's sandbox and deletes the memory checkpoint it persisted
        (a session that is to be resumed later is closed, not deleted)."""
        inner = _inner(session)
        try:
            await _io(inner.sandbox.terminate)
        except sf_errors.SandboxNotFoundError:
            pass
        if inner.state.checkpoint_id:
            await _io(_delete_snapshot, self.client, inner.state.checkpoint_id)
            inner.state.checkpoint_id = None
        return session

    async def resume(self, state: SandboxSessionState) -> SandboxSession:
        """Reattaches to the state's sandbox — resuming it if it was suspended (memory,
        processes and files as they were) — or, when it is gone, makes a new one from the
        state's source; ``start()`` then restores the persisted workspace (a tar, or a
        memory checkpoint restored warm)."""
        if not isinstance(state, SandforkSandboxSessionState):
            raise TypeError("SandforkSandboxClient.resume expects a SandforkSandboxSessionState")
        state.assert_path_grants_rebound()
        sandbox = await _io(_reattach, self.client, state.sandbox_id) if state.sandbox_id else None
        reattached = sandbox is not None
        if sandbox is None:
            sandbox = await _io(_make_sandbox, self.client, state)
            state.sandbox_id = sandbox.id
            state.workspace_root_ready = False
        inner = SandforkSandboxSession(state=state, sandbox=sandbox, client=self.client)
        inner._set_start_state_preserved(reattached, system=reattached)
        return self._wrap_session(inner, instrumentation=self._instrumentation)

    async def fork(self, session: SandboxSession, count: int, *, env: Optional[Dict[str, str]] = None) -> List[SandboxSession]:
        """``count`` new sessions, each in its own fork of a memory checkpoint of
        ``session``'s sandbox taken now: the workspace, processes and memory as they are
        (one per rollout). The checkpoint is deleted once the forks run; the forks need
        no ``start()`` beyond the usual ``async with``."""
        if count < 1:
            raise ValueError("fork needs a count of at least 1")
        inner = _inner(session)
        try:
            snap = await _io(inner.sandbox.checkpoint, checkpoint_type=CheckpointType.MEMORY, labels={LABEL: "fork"})
        except sf_errors.SandboxError as e:
            raise SandforkForkError(f"could not checkpoint sandbox {inner.sandbox.id} to fork it: {e}") from e
        try:
            result = await _io(snap.fork, count, env=env, labels={**inner.state.labels, LABEL: "session"})
            children = list(result)
            failed = [str(err) for err in (getattr(result, "errors", None) or [])]
            if failed or len(children) != count:
                for child in children:
                    try:
                        await _io(child.terminate)
                    except sf_errors.SandboxError:
                        pass
                raise SandforkForkError(f"forking sandbox {inner.sandbox.id} failed: {'; '.join(failed) or f'{len(children)} of {count} forks started'}")
        finally:
            await _io(_delete_snapshot, self.client, snap.snapshot_id)
        sessions = []
        for child in children:
            payload = json.loads(inner.state.model_dump_json())
            payload.update(session_id=str(uuid.uuid4()), sandbox_id=child.id, checkpoint_id=None, snapshot=NoopSnapshot(id=str(uuid.uuid4())).model_dump())
            child_state = SandforkSandboxSessionState.model_validate(payload)
            if env:
                child_state.base_env = {**child_state.base_env, **env}
            child_inner = SandforkSandboxSession(state=child_state, sandbox=child, client=self.client)
            child_inner._set_start_state_preserved(True, system=True)
            sessions.append(self._wrap_session(child_inner, instrumentation=self._instrumentation))
        return sessions

    def deserialize_session_state(self, payload: Dict[str, object]) -> SandboxSessionState:
        return self._deserialize_session_state_payload(payload, SandforkSandboxSessionState)


def _append(entry: _PtyEntry, chunk: bytes) -> None:
    if chunk:
        entry.chunks.append(chunk)
        entry.notify.set()


def _close(entry: _PtyEntry, code: Optional[int]) -> None:
    if entry.closed.is_set():
        return
    entry.exit_code = code
    entry.closed.set()
    entry.notify.set()


def _follow(sb: Sandbox, pid: int, deliver: Callable[[bytes], None], finish: Callable[[Optional[int]], None]) -> None:
    """Streams a background process's stdout and stderr until it exits (on its own thread)."""
    code: Optional[int] = None
    try:
        stream = sb.iter_output(pid)
        for event in stream:
            deliver(event.raw or event.data.encode("utf-8"))
        result = stream.result
        code = 128 + result.signal if result.signal else result.exit_code
    except sf_errors.SandboxError as e:
        deliver(f"\n[the sandfork sandbox stopped following the process: {e}]\n".encode())
    finally:
        finish(code)


def _inner(session: Union[SandboxSession, BaseSandboxSession]) -> SandforkSandboxSession:
    inner = getattr(session, "_inner", session)
    if not isinstance(inner, SandforkSandboxSession):
        raise TypeError(f"expected a sandfork session, got {type(inner).__name__}")
    return inner


def _reattach(client: Client, sandbox_id: str) -> Optional[Sandbox]:
    """The live sandbox ``sandbox_id``, resumed if suspended; ``None`` when it is gone."""
    try:
        sb = Sandbox.connect(sandbox_id, client=client)
        info = sb.info()
    except sf_errors.SandboxNotFoundError:
        return None
    if info.state == "suspended":
        sb.resume()
    elif info.state != "running":
        return None
    return sb


def _run(sb: Sandbox, cmd: List[str], stdin: Optional[bytes], cwd: Optional[str], env: Dict[str, str], user: Optional[str], timeout: Optional[float]) -> Any:
    size = len(json.dumps(cmd)) + len(json.dumps(env)) + (len(stdin) * 4 // 3 if stdin is not None else 0)
    if size <= INLINE_LIMIT:
        return sb.run(cmd, env=env or None, working_dir=cwd, timeout=timeout, user=user, stdin=stdin)
    # Too big for one request: the command line (and input) go to files in the sandbox,
    # run by /bin/sh named by absolute path.
    token = uuid.uuid4().hex
    script_path, input_path = f"{SCRATCH_DIR}/{token}.sh", f"{SCRATCH_DIR}/{token}.in"
    script = "exec " + " ".join(shlex.quote(c) for c in cmd)
    if stdin is not None:
        sb.write_file(input_path, stdin, mode=0o644)
        script += " < " + shlex.quote(input_path)
    sb.write_file(script_path, script + "\n", mode=0o644)
    try:
        return sb.run(["/bin/sh", script_path], env=env or None, working_dir=cwd, timeout=timeout, user=user)
    finally:
        for path in (script_path, input_path):
            try:
                sb.remove(path)
            except sf_errors.SandboxError:
                pass


__all__ = [
    "BACKEND_ID",
    "SandforkSandboxClient",
    "SandforkSandboxClientOptions",
    "SandforkSandboxSession",
    "SandforkSandboxSessionState",
]
