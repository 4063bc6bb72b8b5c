"""inspect-ai's ``SandboxEnvironment`` on sandfork: set up once, checkpoint, fork per sample."""

from __future__ import annotations

import errno
import functools
import hashlib
import json
import logging
import posixpath
import shlex
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Literal, Optional, TypeVar, Union, overload

import anyio
from inspect_ai.util import (
    OutputLimitExceededError,
    SandboxConnection,
    SandboxEnvironment,
    SandboxEnvironmentConfigType,
    SandboxEnvironmentLimits,
    SandboxUnavailableError,
)
from inspect_ai.util._subprocess import ExecResult
from pydantic import BaseModel
from sandfork import CheckpointType, Client, Image, Sandbox, Snapshot
from sandfork import errors as sf_errors
from typing_extensions import override

from ._config import SandforkSandboxEnvironmentConfig, resolve_config
from ._errors import SandforkConfigError, SandforkImageBuildError, SandforkSetupError

log = logging.getLogger(__name__)

T = TypeVar("T")

SANDBOX_TYPE = "sandfork"
LABEL = "inspect-sandfork"
# The daemon refuses request bodies over 1 MiB: a command line or standard input that
# would not fit goes through a script file in the sandbox instead.
INLINE_LIMIT = 512 * 1024
SCRATCH_DIR = "/tmp/.inspect-sandfork"
SETUP_TIMEOUT = 3600
# What the daemon answers when the sandbox is gone, stopped or unreachable.
_UNAVAILABLE = (
    sf_errors.SandboxNotFoundError,
    sf_errors.SandboxConnectionError,
    sf_errors.ConflictError,
    sf_errors.UnavailableError,
    sf_errors.ServerError,
)


async def _io(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Runs a blocking SDK call on a worker thread (the SDK is synchronous)."""
    return await anyio.to_thread.run_sync(functools.partial(fn, *args, **kwargs))


def _raw_key(config: Union[SandboxEnvironmentConfigType, None]) -> str:
    """The identity of a task's configuration as inspect hands it over (before paths are
    resolved: inspect runs task_init in the task's directory, sample_init elsewhere)."""
    if config is None:
        return "null"
    if isinstance(config, BaseModel):
        return type(config).__name__ + ":" + config.model_dump_json()
    return "str:" + str(config)


def _client(config: SandforkSandboxEnvironmentConfig) -> Client:
    """A client for the configured daemon (``url``), else ``SANDFORK_URL``/``SANDFORK_TOKEN``
    or the default socket; the token is never part of the configuration (it would be
    written to the eval log)."""
    return Client(url=config.url) if config.url else Client()


@dataclass
class _TaskState:
    """What task_init made for one configuration: the image, and with ``fork`` the memory
    snapshot every sample forks from."""

    config: SandforkSandboxEnvironmentConfig
    client: Client
    image: Optional[str]
    working_dir: str
    snapshot_id: Optional[str] = None
    refs: int = 0
    built_image: bool = False
    timings: Dict[str, float] = field(default_factory=dict)


class SandforkSandboxEnvironment(SandboxEnvironment):
    """One sandfork sandbox, the ``default`` environment of a sample.

    The underlying :class:`sandfork.Sandbox` is ``self.sandbox`` (ports:
    ``self.sandbox.get_url(port)``)."""

    _tasks: Dict[str, _TaskState] = {}
    _lock = threading.Lock()

    def __init__(self, sandbox: Sandbox, working_dir: str) -> None:
        super().__init__()
        self.sandbox = sandbox
        self.working_dir = working_dir

    # --- lifecycle -----------------------------------------------------------------------

    @classmethod
    def config_files(cls) -> List[str]:
        return ["sandfork.yaml", "sandfork.yml", "sandfork.json"]

    @classmethod
    def is_docker_compatible(cls) -> bool:
        return False

    @classmethod
    def config_deserialize(cls, config: Dict[str, Any]) -> BaseModel:
        return SandforkSandboxEnvironmentConfig(**config)

    @classmethod
    def default_concurrency(cls) -> Optional[int]:
        return None

    @override
    @classmethod
    async def task_init(cls, task_name: str, config: Union[SandboxEnvironmentConfigType, None]) -> None:
        state = await cls._task_state(config)
        with cls._lock:
            state.refs += 1

    @override
    @classmethod
    async def sample_init(
        cls,
        task_name: str,
        config: Union[SandboxEnvironmentConfigType, None],
        metadata: Dict[str, str],
    ) -> Dict[str, SandboxEnvironment]:
        state = await cls._task_state(config)
        labels = {**state.config.labels, LABEL: "sample"}
        if state.snapshot_id is not None:
            sb = await _io(Sandbox.create, snapshot_id=state.snapshot_id, labels=labels, client=state.client)
        else:
            sb = await _io(_fresh_sandbox, state, labels)
        return {"default": cls(sb, state.working_dir)}

    @override
    @classmethod
    async def sample_cleanup(
        cls,
        task_name: str,
        config: Union[SandboxEnvironmentConfigType, None],
        environments: Dict[str, SandboxEnvironment],
        interrupted: bool,
    ) -> None:
        for env in environments.values():
            if isinstance(env, SandforkSandboxEnvironment):
                try:
                    await _io(env.sandbox.terminate)
                except sf_errors.SandboxError as e:
                    log.warning("could not terminate sandbox %s: %s", env.sandbox.id, e)

    @override
    @classmethod
    async def task_cleanup(cls, task_name: str, config: Union[SandboxEnvironmentConfigType, None], cleanup: bool) -> None:
        state = await _io(cls._release, _raw_key(config))
        if state is None or state.snapshot_id is None:
            return
        if not cleanup:
            log.warning("sandfork snapshot %s kept (no sandbox cleanup): `sandfork snapshot rm %s` deletes it", state.snapshot_id, state.snapshot_id)
            return
        try:
            await _io(_delete_snapshot, state.client, state.snapshot_id)
        except sf_errors.SandboxError as e:
            log.warning("could not delete sandfork snapshot %s: %s", state.snapshot_id, e)

    @override
    @classmethod
    async def cli_cleanup(cls, id: Optional[str]) -> None:
        """``inspect sandbox cleanup sandfork [ID]``: terminates the sandbox (or deletes the
        snapshot) ``ID``, else every sandbox and snapshot this provider made."""
        await _io(_cli_cleanup, Client(), id)

    @classmethod
    async def _task_state(cls, config: Union[SandboxEnvironmentConfigType, None]) -> _TaskState:
        """The state of ``config``, made on first use (task_init, or the first sample of a
        sandbox inspect's startup pass did not see). Runs on a worker thread under a
        thread lock, so it holds no event loop's lock (inspect may run on asyncio or trio)."""
        return await _io(cls._task_state_sync, _raw_key(config), config)

    @classmethod
    def _task_state_sync(cls, key: str, config: Union[SandboxEnvironmentConfigType, None]) -> _TaskState:
        with cls._lock:
            state = cls._tasks.get(key)
            if state is None:
                state = _prepare(resolve_config(config))
                cls._tasks[key] = state
            return state

    @classmethod
    def _release(cls, key: str) -> Optional[_TaskState]:
        """Drops one task_init's hold on ``key``; returns the state once the last is gone."""
        with cls._lock:
            state = cls._tasks.get(key)
            if state is None:
                return None
            state.refs -= 1
            if state.refs > 0:
                return None
            del cls._tasks[key]
            return state

    # --- commands -----------------------------------------------------------------------

    @override
    async def exec(
        self,
        cmd: List[str],
        input: Union[str, bytes, None] = None,
        cwd: Optional[str] = None,
        env: Optional[Dict[str, str]] = None,
        user: Optional[str] = None,
        timeout: Optional[int] = None,
        timeout_retry: bool = True,
        concurrency: bool = True,
    ) -> ExecResult[str]:
        if not cmd:
            raise ValueError("exec needs a command")
        workdir = self._resolve(cwd) if cwd is not None else self.working_dir
        stdin = input.encode("utf-8") if isinstance(input, str) else input
        try:
            result = await _io(_run, self.sandbox, [str(c) for c in cmd], stdin, workdir, dict(env or {}), user, timeout)
        except sf_errors.BadRequestError as e:
            if e.code != "exec_failed":
                raise
            return _exec_failure(e, cmd)
        except sf_errors.SandforkTimeoutError as e:
            raise TimeoutError(f"the sandfork daemon did not answer in time: {e}") from e
        except _UNAVAILABLE as e:
            raise SandboxUnavailableError(f"the sandfork sandbox {self.sandbox.id} cannot run the command: {e}") from e
        limit = SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE
        if result.timed_out:
            error = TimeoutError(f"Command timed out after {timeout} seconds")
            partial = result.stdout_bytes.decode("utf-8", "replace") + result.stderr_bytes.decode("utf-8", "replace")
            if partial:
                setattr(error, "truncated_output", partial[:limit])
            raise error
        for data, truncated in ((result.stdout_bytes, result.stdout_truncated), (result.stderr_bytes, result.stderr_truncated)):
            if len(data) > limit or truncated:
                raise OutputLimitExceededError(SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE_STR, data[:limit].decode("utf-8", "replace"))
        code = 128 + result.signal if result.signal else result.exit_code
        return ExecResult(
            success=code == 0,
            returncode=code,
            stdout=result.stdout_bytes.decode("utf-8", "replace"),
            stderr=result.stderr_bytes.decode("utf-8", "replace"),
        )

    # --- files ---------------------------------------------------------------------------

    @override
    async def write_file(self, file: str, contents: Union[str, bytes]) -> None:
        path = self._resolve(file)
        data = contents.encode("utf-8") if isinstance(contents, str) else bytes(contents)
        try:
            await _io(_write, self.sandbox, path, data, file)
        except sf_errors.SandboxError as e:
            raise _file_error(e, file, self.sandbox.id) from e

    @overload
    async def read_file(self, file: str, text: Literal[True] = True) -> str: ...

    @overload
    async def read_file(self, file: str, text: Literal[False]) -> bytes: ...

    @override
    async def read_file(self, file: str, text: bool = True) -> Union[str, bytes]:
        path = self._resolve(file)
        limit = SandboxEnvironmentLimits.MAX_READ_FILE_SIZE
        try:
            data = await _io(_read, self.sandbox, path, file, limit)
        except sf_errors.SandboxError as e:
            raise _file_error(e, file, self.sandbox.id) from e
        if data is None:
            raise OutputLimitExceededError(SandboxEnvironmentLimits.MAX_READ_FILE_SIZE_STR, None)
        return data.decode("utf-8") if text else data

    # --- connection ------------------------------------------------------------------------

    @override
    async def connection(self, *, user: Optional[str] = None) -> SandboxConnection:
        try:
            info = await _io(self.sandbox.info)
        except sf_errors.SandboxError as e:
            raise ConnectionError(f"the sandfork sandbox {self.sandbox.id} cannot be reached: {e}") from e
        if info.state not in ("running", "suspended"):
            raise ConnectionError(f"the sandfork sandbox {self.sandbox.id} is not running ({info.state})")
        command = ["sandfork", "shell", self.sandbox.id]
        if user:
            command += ["--", "su", "-l", user]
        return SandboxConnection(type=SANDBOX_TYPE, command=shlex.join(command), container=self.sandbox.id)

    def default_polling_interval(self) -> float:
        return 0.2

    def _resolve(self, path: str) -> str:
        return path if posixpath.isabs(path) else posixpath.normpath(posixpath.join(self.working_dir, path))


# --- helpers run on worker threads -----------------------------------------------------------


def _prepare(config: SandforkSandboxEnvironmentConfig) -> _TaskState:
    client = _client(config)
    image = config.image
    built = False
    if config.dockerfile is not None:
        image = _build(client, config)
        built = True
    if config.dockerfile is None and config.image is None and not config.fork:
        image = None
    state = _TaskState(config=config, client=client, image=image, working_dir=config.working_dir or "/", built_image=built)
    if not config.fork:
        # The working directory of a fresh sandbox: asked once from a throwaway sandbox
        # only when the configuration does not say it.
        if config.working_dir is None:
            probe = _create(state, {**config.labels, LABEL: "probe"})
            try:
                state.working_dir = _working_dir(probe, None)
            finally:
                probe.terminate()
        return state
    template = _create(state, {**config.labels, LABEL: "template"})
    try:
        _set_up(template, state)
        snap = template.checkpoint(checkpoint_type=CheckpointType.MEMORY, labels={LABEL: "task"})
        state.snapshot_id = snap.snapshot_id
    finally:
        template.terminate()
    return state


def _build(client: Client, config: SandforkSandboxEnvironmentConfig) -> str:
    assert config.dockerfile is not None
    path = Path(config.dockerfile)
    name = config.image or "inspect-" + hashlib.sha256(str(path).encode()).hexdigest()[:12]
    lines: List[str] = []
    try:
        Image.build(path.parent, name, dockerfile=path.name, build_args=config.build_args, on_progress=lines.append, client=client)
    except sf_errors.SandboxError as e:
        tail = "\n".join(lines[-20:])
        raise SandforkImageBuildError(f"building {path} failed: {e.message or e}" + (f"\n{tail}" if tail else "")) from e
    return name


def _create(state: _TaskState, labels: Dict[str, str]) -> Sandbox:
    config = state.config
    kwargs: Dict[str, Any] = {"image": state.image, "env": dict(config.env) or None, "labels": labels, "client": state.client}
    if config.cpus is not None:
        kwargs["cpus"] = config.cpus
    if config.memory_mb is not None:
        kwargs["memory_mb"] = config.memory_mb
    if config.disk_mb is not None:
        kwargs["disk_mb"] = config.disk_mb
    kwargs["allow_internet_access"] = config.allow_internet_access
    try:
        return Sandbox.create(**kwargs)
    except sf_errors.NotFoundError as e:
        raise SandforkConfigError(f"the sandfork daemon has no image {state.image!r}: {e}") from e


def _fresh_sandbox(state: _TaskState, labels: Dict[str, str]) -> Sandbox:
    sb = _create(state, labels)
    try:
        _set_up(sb, state)
    except BaseException:
        sb.terminate()
        raise
    return sb


def _set_up(sb: Sandbox, state: _TaskState) -> None:
    """Runs ``setup``, starts ``background`` and makes the working directory."""
    config = state.config
    state.working_dir = _working_dir(sb, config.working_dir)
    for command in config.setup:
        r = sb.run(["/bin/sh", "-c", command], working_dir=state.working_dir, timeout=SETUP_TIMEOUT)
        if r.exit_code != 0:
            raise SandforkSetupError(f"the setup command {command!r} exited with {r.exit_code}:\n{r.stdout}\n{r.stderr}".rstrip())
    for command in config.background:
        sb.start_process("/bin/sh", ["-c", command], working_dir=state.working_dir)
    if config.ready is not None:
        _wait_ready(sb, config.ready, config.ready_timeout, state.working_dir)


def _wait_ready(sb: Sandbox, command: str, timeout: float, cwd: str) -> None:
    deadline = time.monotonic() + timeout
    while True:
        r = sb.run(["/bin/sh", "-c", command], working_dir=cwd, timeout=max(1, int(timeout)))
        if r.exit_code == 0:
            return
        if time.monotonic() >= deadline:
            raise SandforkSetupError(f"the ready check {command!r} did not succeed within {timeout:g}s (last exit {r.exit_code}):\n{r.stdout}\n{r.stderr}".rstrip())
        time.sleep(0.1)


def _working_dir(sb: Sandbox, wanted: Optional[str]) -> str:
    if wanted is None:
        r = sb.run(["/bin/sh", "-c", "pwd"])
        return r.stdout.strip() or "/"
    if not posixpath.isabs(wanted):
        raise SandforkConfigError(f"working_dir must be an absolute path, not {wanted!r}")
    if not sb.exists(wanted):
        sb.mkdir(wanted)
    return wanted


def _run(sb: Sandbox, cmd: List[str], stdin: Optional[bytes], cwd: str, env: Dict[str, str], user: Optional[str], timeout: Optional[int]) -> Any:
    size = len(json.dumps(cmd)) + (len(stdin) if stdin is not None else 0) * 4 // 3
    if size <= INLINE_LIMIT:
        return sb.run(cmd, env=env or None, working_dir=cwd, timeout=timeout, user=user, stdin=stdin)
    # Too big for one request: the command line and input go to files in the sandbox,
    # and /bin/sh (by absolute path) runs them.
    token = uuid.uuid4().hex
    script_path = f"{SCRATCH_DIR}/{token}.sh"
    input_path = f"{SCRATCH_DIR}/{token}.in"
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


def _exec_failure(e: sf_errors.SandboxError, cmd: List[str]) -> ExecResult[str]:
    """An exec the sandbox's agent could not start: a permission error is raised (as
    inspect's contract says), anything else is the command's failed result."""
    message = e.message or str(e)
    lowered = message.lower()
    if "permission denied" in lowered:
        raise PermissionError(errno.EACCES, f"Permission denied executing {cmd[0]}: {message}", cmd[0])
    code = 127 if "not found in path" in lowered or "no such file" in lowered else 126
    return ExecResult(success=False, returncode=code, stdout="", stderr=message + "\n")


def _write(sb: Sandbox, path: str, data: bytes, shown: str) -> None:
    info = _stat(sb, path)
    mode = None
    if info is not None:
        if info.type == "dir":
            raise IsADirectoryError(errno.EISDIR, "Is a directory", shown)
        if info.type == "file":
            # The daemon writes as root; a file its owner may not write is refused, as
            # inspect's own providers refuse it.
            if not info.mode & 0o200:
                raise PermissionError(errno.EACCES, "Permission denied", shown)
            mode = info.mode & 0o7777
    sb.write_file(path, data, mode=mode)


def _read(sb: Sandbox, path: str, shown: str, limit: int) -> Optional[bytes]:
    info = _stat(sb, path)
    if info is None:
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", shown)
    if info.type == "dir":
        raise IsADirectoryError(errno.EISDIR, "Is a directory", shown)
    if info.type == "file":
        if not info.mode & 0o400:
            raise PermissionError(errno.EACCES, "Permission denied", shown)
        if (info.size or 0) > limit:
            return None
    chunks: List[bytes] = []
    total = 0
    for chunk in sb.iter_file(path):
        total += len(chunk)
        if total > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def _stat(sb: Sandbox, path: str) -> Any:
    try:
        return sb.stat(path)
    except sf_errors.NotFoundError as e:
        if isinstance(e, sf_errors.SandboxNotFoundError):
            raise
        return None
    except sf_errors.BadRequestError as e:
        # a path through a file ("not a directory")
        if "not a directory" in (e.message or "").lower():
            return None
        raise


def _file_error(e: sf_errors.SandboxError, shown: str, sandbox_id: str) -> BaseException:
    message = (e.message or str(e)).lower()
    if isinstance(e, sf_errors.SandforkTimeoutError):
        return TimeoutError(f"the file operation on {shown} timed out: {e}")
    if isinstance(e, (sf_errors.SandboxNotFoundError, sf_errors.SandboxConnectionError, sf_errors.UnavailableError, sf_errors.ServerError)):
        return SandboxUnavailableError(f"the sandfork sandbox {sandbox_id} is not available: {e}")
    if "is a directory" in message:
        return IsADirectoryError(errno.EISDIR, "Is a directory", shown)
    if "permission denied" in message or e.status == 403:
        return PermissionError(errno.EACCES, "Permission denied", shown)
    if isinstance(e, sf_errors.NotFoundError) or "no such file" in message:
        return FileNotFoundError(errno.ENOENT, "No such file or directory", shown)
    if "not a directory" in message:
        return NotADirectoryError(errno.ENOTDIR, "Not a directory", shown)
    if isinstance(e, sf_errors.ConflictError):
        return SandboxUnavailableError(f"the sandfork sandbox {sandbox_id} cannot serve files now: {e}")
    return e


def _delete_snapshot(client: Client, snapshot_id: str) -> None:
    try:
        Snapshot.get(snapshot_id, client=client).delete()
    except sf_errors.NotFoundError:
        pass


def _cli_cleanup(client: Client, id: Optional[str]) -> None:
    if id:
        if id.startswith("snap"):
            _delete_snapshot(client, id)
        else:
            Sandbox.connect(id, client=client).terminate()
        return
    for info in Sandbox.list(client=client):
        if LABEL in (info.labels or {}):
            try:
                Sandbox.connect(info.id, client=client).terminate()
            except sf_errors.SandboxError as e:
                log.warning("could not terminate %s: %s", info.id, e)
    for snap in Snapshot.list(client=client):
        if LABEL in (getattr(snap, "labels", None) or {}):
            try:
                snap.delete()
            except sf_errors.SandboxError as e:
                log.warning("could not delete %s: %s", snap.snapshot_id, e)


__all__ = ["SANDBOX_TYPE", "SandforkSandboxEnvironment"]
