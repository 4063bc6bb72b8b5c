"""The :class:`Sandbox` handle: lifecycle, commands, processes, files, checkpoints."""

from __future__ import annotations

import base64
import time
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Union

from . import errors
from ._files import FilesMixin
from ._streams import OutputCallback, OutputStream
from ._transport import Client, seg
from .models import CheckpointType, CommandResult, ProcessInfo, SandboxInfo, SandboxStatus
from .process import Process, SignalLike
from .snapshot import ForkResult, Snapshot, fork_body

Command = Union[str, Sequence[str]]

_TRANSITIONAL = {SandboxStatus.CREATING, SandboxStatus.RESUMING, SandboxStatus.SUSPENDING}


def _drop_none(**fields: Any) -> Dict[str, Any]:
    return {k: v for k, v in fields.items() if v is not None}


def exec_body(
    command: Command,
    args: Optional[Iterable[str]] = None,
    env: Optional[Mapping[str, str]] = None,
    working_dir: Optional[str] = None,
    timeout: Optional[float] = None,
    stdin: Union[None, str, bytes] = None,
    user: Optional[str] = None,
) -> Dict[str, Any]:
    """The API's ``Exec`` document for a command.

    ``command`` may also be a list (``["ls", "-l"]``), split into command and arguments.
    """
    if not isinstance(command, str):
        parts = list(command)
        if not parts:
            raise errors.InvalidArgumentError("the command is empty", code="invalid_argument")
        command, args = parts[0], parts[1:] + list(args or [])
    body = _drop_none(command=command, args=list(args) if args is not None else None, env=dict(env) if env else None, working_dir=working_dir, user=user)
    if timeout is not None:
        body["timeout_secs"] = float(timeout)
    if isinstance(stdin, str):
        body["stdin"] = stdin
    elif stdin is not None:
        body["stdin_b64"] = base64.b64encode(bytes(stdin)).decode("ascii")
    return body


class Sandbox(FilesMixin):
    """An isolated Linux sandbox managed by the sandfork daemon.

    Get one with :meth:`create` (a new sandbox, or a restore of a snapshot)
    or :meth:`connect` (an existing one). A handle is just the sandbox id and
    a :class:`~sandfork.Client`; it can be used from many threads at once.

    Used as a context manager, a sandbox this code created is terminated on
    exit; one reached with :meth:`connect` is left running.
    """

    def __init__(self, sandbox_id: str, *, client: Optional[Client] = None, info: Optional[SandboxInfo] = None, owned: bool = False):
        self.id = sandbox_id
        self._client = client or Client()
        self._info = info
        self._owned = owned

    def __repr__(self) -> str:
        return f"Sandbox(id={self.id!r}, name={self._info.name if self._info else None!r})"

    @property
    def client(self) -> Client:
        """The :class:`~sandfork.Client` this handle talks through."""
        return self._client

    @property
    def _route(self) -> str:
        return f"/v1/sandboxes/{seg(self.id)}"

    # --- lifecycle -------------------------------------------------------

    @classmethod
    def create(
        cls,
        image: Optional[str] = None,
        cpus: Optional[float] = None,
        memory_mb: Optional[int] = None,
        name: Optional[str] = None,
        timeout_secs: Optional[int] = None,
        env: Optional[Mapping[str, str]] = None,
        secrets: Optional[Mapping[str, str]] = None,
        disk_mb: Optional[int] = None,
        allow_internet_access: Optional[bool] = None,
        allow_out: Optional[List[str]] = None,
        deny_out: Optional[List[str]] = None,
        snapshot_id: Optional[str] = None,
        labels: Optional[Mapping[str, str]] = None,
        *,
        client: Optional[Client] = None,
        wait_timeout: float = 600.0,
    ) -> "Sandbox":
        """Creates a sandbox and returns it once it is running.

        Args:
            image: Image name; ``"busybox"`` when neither it nor ``snapshot_id`` is given.
            cpus: CPU limit (daemon default 1).
            memory_mb: Memory limit in MiB (daemon default 512).
            name: Optional unique name; named sandboxes can be suspended.
            timeout_secs: Idle seconds before the sandbox is terminated
                (suspended when named); 0 or omitted means never.
            env: Environment for every command run in the sandbox.
            secrets: Like ``env``, but never echoed back by the API.
            disk_mb: Root disk size in MiB.
            allow_internet_access: Egress to the internet through the host
                (default: no network besides loopback).
            allow_out: CIDRs allowed out (implies internet access rules).
            deny_out: CIDRs denied out.
            snapshot_id: Start from this snapshot instead of an image (warm
                for a memory snapshot, cold boot for a filesystem one).
            labels: Free-form key/value labels.
            client: The daemon to use (default: from ``SANDFORK_URL``).
            wait_timeout: Seconds to wait for the sandbox to leave ``creating``.

        Raises:
            CapacityError: Admission refused the sandbox.
            InvalidArgumentError, UnsupportedError: Bad or unsupported options.
        """
        client = client or Client()
        if image is None and snapshot_id is None:
            image = "busybox"
        body = _drop_none(
            image=image, snapshot_id=snapshot_id, name=name, cpus=cpus, memory_mb=memory_mb, disk_mb=disk_mb,
            timeout_secs=timeout_secs, env=dict(env) if env else None, secrets=dict(secrets) if secrets else None,
            allow_internet_access=allow_internet_access, allow_out=allow_out, deny_out=deny_out,
            labels=dict(labels) if labels else None,
        )  # fmt: skip
        info = SandboxInfo.from_json(client.request_json("POST", "/v1/sandboxes", json_body=body, unbounded=True))
        sandbox = cls(info.id, client=client, info=info, owned=True)
        sandbox._settle(info, wait_timeout)
        return sandbox

    @classmethod
    def connect(cls, sandbox_id: str, *, client: Optional[Client] = None) -> "Sandbox":
        """Attaches to an existing sandbox by id or name.

        Raises:
            SandboxNotFoundError: No sandbox has that id or name.
        """
        client = client or Client()
        info = SandboxInfo.from_json(client.request_json("GET", f"/v1/sandboxes/{seg(sandbox_id)}"))
        return cls(info.id, client=client, info=info, owned=False)

    @classmethod
    def list(cls, state: Optional[str] = None, name: Optional[str] = None, *, client: Optional[Client] = None) -> List[SandboxInfo]:
        """Lists sandboxes, optionally only those in ``state`` or with ``name``."""
        client = client or Client()
        doc = client.request_json("GET", "/v1/sandboxes", query={"state": _state_value(state), "name": name})
        return [SandboxInfo.from_json(d) for d in (doc or {}).get("sandboxes", [])]

    @property
    def sandbox_id(self) -> str:
        """Alias of :attr:`id`."""
        return self.id

    @property
    def name(self) -> Optional[str]:
        """The sandbox's name, or ``None`` when unnamed."""
        return self._cached_info().name

    @property
    def status(self) -> Union[SandboxStatus, str]:
        """The current lifecycle state, fetched fresh from the daemon."""
        return self.info().status

    def info(self) -> SandboxInfo:
        """Fetches the sandbox's current description from the daemon."""
        self._info = SandboxInfo.from_json(self._client.request_json("GET", self._route))
        return self._info

    def terminate(self) -> None:
        """Stops the sandbox and frees everything it used. Safe to call twice."""
        self._owned = False
        self._info = SandboxInfo.from_json(self._client.request_json("DELETE", self._route, unbounded=True) or {"id": self.id, "state": "terminated"})

    def close(self) -> None:
        """Releases the handle; the sandbox keeps running (the handle holds no connection)."""

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: object) -> None:
        if self._owned:
            try:
                self.terminate()
            except errors.SandboxNotFoundError:
                pass

    # --- commands --------------------------------------------------------

    def run(
        self,
        command: Command,
        args: Optional[Iterable[str]] = None,
        env: Optional[Mapping[str, str]] = None,
        working_dir: Optional[str] = None,
        timeout: Optional[float] = None,
        stdin: Union[None, str, bytes] = None,
        on_stdout: Optional[OutputCallback] = None,
        on_stderr: Optional[OutputCallback] = None,
        user: Optional[str] = None,
    ) -> CommandResult:
        """Runs a command to completion and returns its output and exit code.

        Args:
            command: The program (looked up in ``PATH``), or a list of program and arguments.
            args: Its arguments.
            env: Extra environment variables.
            working_dir: Directory to run in.
            timeout: Seconds after which the command is killed (then
                ``result.timed_out`` is true).
            stdin: Text or bytes fed to its standard input.
            on_stdout, on_stderr: Called with each chunk of output as it
                arrives (the output is then streamed).
            user: User to run as inside the sandbox.

        A non-zero exit is not an error: check ``result.exit_code``.

        Raises:
            InvalidArgumentError: The command could not be started (code ``exec_failed``).
        """
        if on_stdout is not None or on_stderr is not None:
            return self.stream(command, args, env, working_dir, timeout, stdin, on_stdout=on_stdout, on_stderr=on_stderr, user=user).wait()
        body = exec_body(command, args, env, working_dir, timeout, stdin, user)
        body["stream"] = False
        return CommandResult.from_json(self._client.request_json("POST", self._route + "/exec", json_body=body, unbounded=True))

    def stream(
        self,
        command: Command,
        args: Optional[Iterable[str]] = None,
        env: Optional[Mapping[str, str]] = None,
        working_dir: Optional[str] = None,
        timeout: Optional[float] = None,
        stdin: Union[None, str, bytes] = None,
        *,
        on_stdout: Optional[OutputCallback] = None,
        on_stderr: Optional[OutputCallback] = None,
        user: Optional[str] = None,
    ) -> OutputStream:
        """Runs a command and iterates over its output as it is produced.

        Returns an iterator of :class:`~sandfork.OutputEvent`; once exhausted,
        its ``.result`` is the :class:`~sandfork.CommandResult`::

            it = sb.stream("sh", ["-c", "echo a; sleep 1; echo b"])
            for event in it:
                print(event.stream, event.data, end="")
            print(it.result.exit_code)
        """
        body = exec_body(command, args, env, working_dir, timeout, stdin, user)
        body["stream"] = True
        response = self._client.open("POST", self._route + "/exec", json_body=body, unbounded=True)
        return OutputStream(response, on_stdout=on_stdout, on_stderr=on_stderr)

    # --- background processes --------------------------------------------

    def start_process(
        self,
        command: Command,
        args: Optional[Iterable[str]] = None,
        env: Optional[Mapping[str, str]] = None,
        working_dir: Optional[str] = None,
        stdin: Union[None, str, bytes] = None,
        user: Optional[str] = None,
    ) -> Process:
        """Starts a command in the background and returns a :class:`~sandfork.Process` handle.

        Its output is buffered by the sandbox, so it can be read later, from
        any handle on this sandbox (``Sandbox.connect(id).get_process(pid)``).
        Without ``stdin`` its standard input is a pipe fed by
        :meth:`Process.write_stdin` until :meth:`Process.close_stdin`.
        """
        body = exec_body(command, args, env, working_dir, None, stdin, user)
        info = ProcessInfo.from_json(self._client.request_json("POST", self._route + "/processes", json_body=body))
        return Process(self, info.pid, info)

    def list_processes(self) -> List[Process]:
        """Handles on every background process of this sandbox (running or exited)."""
        doc = self._client.request_json("GET", self._route + "/processes")
        infos = [ProcessInfo.from_json(d) for d in (doc or {}).get("processes", [])]
        return [Process(self, info.pid, info) for info in infos]

    def get_process(self, pid: int) -> Process:
        """A handle on background process ``pid``.

        Raises:
            SandboxNotFoundError: No such process in this sandbox.
        """
        process = Process(self, int(pid))
        process.info()
        return process

    def kill_process(self, pid: int) -> None:
        """Sends SIGKILL to background process ``pid``."""
        Process(self, int(pid)).kill()

    def send_signal(self, pid: int, signal: SignalLike) -> None:
        """Sends ``signal`` to background process ``pid``."""
        Process(self, int(pid)).signal(signal)

    def write_stdin(self, pid: int, data: Union[bytes, str]) -> None:
        """Writes to the standard input of background process ``pid``."""
        Process(self, int(pid)).write_stdin(data)

    def close_stdin(self, pid: int) -> None:
        """Closes the standard input of background process ``pid``."""
        Process(self, int(pid)).close_stdin()

    def follow_output(self, pid: int, offset: int = 0, stderr_offset: int = 0) -> OutputStream:
        """Iterates over the output of background process ``pid`` until it exits."""
        return Process(self, int(pid)).output(offset=offset, follow=True, stderr_offset=stderr_offset)

    # --- checkpoints, forks, suspend ---------------------------------------

    def checkpoint(
        self,
        checkpoint_type: Union[CheckpointType, str] = CheckpointType.FILESYSTEM,
        *,
        name: Optional[str] = None,
        hooks: Optional[List[Mapping[str, Any]]] = None,
        labels: Optional[Mapping[str, str]] = None,
        wait: bool = True,
        timeout: Optional[float] = None,
    ) -> Snapshot:
        """Captures the sandbox as a :class:`~sandfork.Snapshot`; the sandbox keeps running.

        Args:
            checkpoint_type: ``FILESYSTEM`` (disk only, the default) or
                ``MEMORY`` (disk, memory and processes, for warm restores).
            name: Optional snapshot name.
            hooks: Commands (``Exec`` documents, e.g. ``{"command": "sh",
                "args": ["-c", "..."]}``) run in every sandbox restored from it,
                before it is handed out.
            labels: Free-form key/value labels of the snapshot.
            wait: Accepted for Tensorlake compatibility; checkpoints always
                complete before this returns.
            timeout: Socket timeout in seconds (default: wait as long as it takes).
        """
        body = _drop_none(type=CheckpointType(checkpoint_type).value, name=name, hooks=[dict(h) for h in hooks] if hooks else None, labels=dict(labels) if labels else None)
        doc = self._client.request_json("POST", self._route + "/checkpoint", json_body=body, timeout=timeout, unbounded=timeout is None)
        return Snapshot(doc, self._client)

    snapshot = checkpoint

    def fork(
        self,
        count: int = 1,
        *,
        env: Optional[Mapping[str, str]] = None,
        secrets: Optional[Mapping[str, str]] = None,
        labels: Optional[Mapping[str, str]] = None,
        per_child: Optional[List[Mapping[str, Any]]] = None,
        name_prefix: Optional[str] = None,
        timeout_secs: Optional[int] = None,
    ) -> ForkResult:
        """Checkpoints memory in place once and starts ``count`` independent copies.

        The source keeps its id and keeps running. ``per_child`` is a list of
        ``{"env": ..., "labels": ...}`` (by index, added to ``env``/``labels``);
        children are named ``<name_prefix>-<index>`` when a prefix is given and
        get ``timeout_secs`` as their idle timeout. Children succeed or fail
        independently: the :class:`~sandfork.ForkResult` is a list of the
        sandboxes that started, with ``.errors`` for those that did not
        (call ``.raise_for_errors()`` to turn any failure into an exception).
        """
        body = fork_body(count, env, secrets, labels, per_child, name_prefix, timeout_secs)
        doc = self._client.request_json("POST", self._route + "/fork", json_body=body, unbounded=True)
        return ForkResult.from_json(doc, self._client, source_sandbox_id=self.id)

    def copy(self, *, times: int = 1) -> ForkResult:
        """Tensorlake's name for :meth:`fork`: ``times`` live copies of this sandbox."""
        return self.fork(times)

    def suspend(self, wait: bool = True, timeout: float = 600.0) -> None:
        """Checkpoints memory and stops the sandbox, keeping its id and name (named sandboxes only)."""
        self._info = SandboxInfo.from_json(self._client.request_json("POST", self._route + "/suspend", unbounded=True))
        if wait:
            self._settle(self._info, timeout)

    def resume(self, wait: bool = True, timeout: float = 600.0) -> None:
        """Brings a suspended sandbox back with the same id, files and processes."""
        self._info = SandboxInfo.from_json(self._client.request_json("POST", self._route + "/resume", unbounded=True))
        if wait:
            self._settle(self._info, timeout)

    def list_snapshots(self) -> List[Snapshot]:
        """Snapshots taken from this sandbox."""
        return Snapshot.list(source=self.id, client=self._client)

    @classmethod
    def get_snapshot(cls, snapshot_id: str, *, client: Optional[Client] = None) -> Snapshot:
        """Looks a snapshot up by id (same as :meth:`Snapshot.get`)."""
        return Snapshot.get(snapshot_id, client=client)

    @classmethod
    def delete_snapshot(cls, snapshot_id: str, *, client: Optional[Client] = None) -> None:
        """Deletes a snapshot by id; sandboxes restored from it keep working."""
        Snapshot.delete_by_id(snapshot_id, client=client)

    # --- internals ---------------------------------------------------------

    def _cached_info(self) -> SandboxInfo:
        return self._info if self._info is not None else self.info()

    def _settle(self, info: SandboxInfo, timeout: float) -> None:
        """Polls while the sandbox is in a transitional state; raises if it ends up failed."""
        deadline = time.monotonic() + timeout
        delay = 0.02
        while info.status in _TRANSITIONAL:
            if time.monotonic() > deadline:
                raise errors.SandforkTimeoutError(f"sandbox {self.id} still {info.status} after {timeout:g}s")
            time.sleep(delay)
            delay = min(delay * 2, 0.5)
            info = self.info()
        if info.status == SandboxStatus.FAILED:
            raise errors.SandforkError(f"sandbox {self.id} failed: {info.error or 'no reason given'}", code="failed")


def _state_value(state: Union[None, str, SandboxStatus]) -> Optional[str]:
    if isinstance(state, SandboxStatus):
        return state.value
    return state
