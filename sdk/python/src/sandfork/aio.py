"""The asyncio flavour of the SDK: :class:`AsyncSandbox`, :class:`AsyncSnapshot`, :class:`AsyncProcess`.

Every method mirrors its synchronous twin and runs it on a dedicated thread
pool, so awaiting never blocks the event loop and many sandboxes can be
driven at once::

    import asyncio
    from sandfork import AsyncSandbox

    async def main():
        async with await AsyncSandbox.create() as sb:
            result = await sb.run("echo", ["hi"])
            async for event in sb.stream("sh", ["-c", "echo a; echo b"]):
                print(event.data, end="")

    asyncio.run(main())

Output callbacks (``on_stdout`` / ``on_stderr``) are called on the event
loop's thread.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, AsyncIterator, Awaitable, Callable, Dict, Generator, Iterable, List, Mapping, Optional, TypeVar, Union

from . import errors
from ._files import CHUNK_SIZE, PathLike
from ._hybrid import hybridmethod
from ._streams import OutputCallback, OutputStream
from ._trace import TracedList
from ._transport import Client
from .events import events as sync_events
from .models import (
    CheckpointType,
    CommandResult,
    OutputEvent,
    ProcessInfo,
    ProcessUser,
    SandboxInfo,
    SandboxStatus,
    SnapshotInfo,
)
from .process import Process, SignalLike
from .pty import PtyCommands, PtySession
from .sandbox import Command, Sandbox
from .images import Image
from .snapshot import CopiedSandbox, ForkChild, ForkResult, Snapshot

T = TypeVar("T")

MAX_THREADS = 64
"""Threads in the pool that carries blocking calls (one per call in flight)."""

_executor: Optional[ThreadPoolExecutor] = None
_executor_lock = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(max_workers=MAX_THREADS, thread_name_prefix="sandfork-aio")
        return _executor


async def _call(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_pool(), functools.partial(fn, *args, **kwargs))


async def _call_owning(fn: Callable[..., T], cleanup: Callable[[T], Any], *args: Any, **kwargs: Any) -> T:
    """Like :func:`_call`, for calls that create sandboxes: if the awaiting task is
    cancelled while the call is in flight, ``cleanup`` runs on its result once it arrives
    (the thread cannot be stopped, and nobody would own what it created)."""
    future = _pool().submit(functools.partial(fn, *args, **kwargs))
    try:
        return await asyncio.wrap_future(future)
    except asyncio.CancelledError:
        future.add_done_callback(lambda f: _cleanup_result(f, cleanup))
        raise


def _cleanup_result(future: "Future[T]", cleanup: Callable[[T], Any]) -> None:
    if future.cancelled() or future.exception() is not None:
        return
    try:
        cleanup(future.result())
    except Exception:  # noqa: BLE001 - best effort; nothing is left to report to
        pass


def _on_loop(callback: Optional[OutputCallback]) -> Optional[OutputCallback]:
    """Wraps a callback so that, called from a worker thread, it runs on the current loop."""
    if callback is None:
        return None
    loop = asyncio.get_running_loop()
    return lambda text: loop.call_soon_threadsafe(callback, text)


_END = object()


def _next_or_end(iterator: Any) -> Any:
    return next(iterator, _END)


class AsyncEventStream:
    """Async iterator of :class:`~sandfork.events.SandboxEvent` (see :func:`events`), or
    of :class:`~sandfork.events.FileEvent` from ``AsyncSandbox.watch_dir``."""

    def __init__(self, opener: Callable[[], Any]):
        self._opener = opener
        self._stream: Any = None

    def __aiter__(self) -> "AsyncEventStream":
        return self

    async def open(self) -> "AsyncEventStream":
        """Sends the request now (a watch is live once this returns)."""
        if self._stream is None:
            self._stream = await _call(self._opener)
        return self

    async def __anext__(self) -> Any:
        await self.open()
        event = await _call(_next_or_end, self._stream)
        if event is _END:
            raise StopAsyncIteration
        return event

    async def aclose(self) -> None:
        """Drops the connection."""
        if self._stream is not None:
            await _call(self._stream.close)

    async def __aenter__(self) -> "AsyncEventStream":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class AsyncPtySession:
    """The async twin of :class:`~sandfork.pty.PtySession`: ``async for chunk in session``,
    ``await session.send(...)``, ``await session.wait()``."""

    def __init__(self, sync: PtySession) -> None:
        self.sync = sync
        self._iter: Any = None

    @property
    def pid(self) -> int:
        return self.sync.pid

    @property
    def exit_code(self) -> Optional[int]:
        return self.sync.exit_code

    def __aiter__(self) -> "AsyncPtySession":
        return self

    async def __anext__(self) -> bytes:
        if self._iter is None:
            self._iter = iter(self.sync)
        chunk = await _call(next, self._iter, _END)
        if chunk is _END:
            raise StopAsyncIteration
        return chunk  # type: ignore[return-value]

    async def send(self, data: Union[bytes, str]) -> None:
        await _call(self.sync.send, data)

    async def resize(self, cols: int, rows: int) -> None:
        await _call(self.sync.resize, cols, rows)

    async def wait(self, timeout: Optional[float] = None) -> Optional[int]:
        return await _call(self.sync.wait, timeout)

    async def kill(self) -> None:
        await _call(self.sync.kill)

    async def close(self) -> None:
        await _call(self.sync.close)

    async def __aenter__(self) -> "AsyncPtySession":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class AsyncPtyCommands:
    """The async twin of :class:`~sandfork.pty.PtyCommands` (``AsyncSandbox.pty``);
    ``on_data`` callbacks run on the event loop."""

    def __init__(self, sync: PtyCommands) -> None:
        self.sync = sync

    async def create(self, command: Optional[str] = None, args: Optional[List[str]] = None, *, on_data: Optional[Callable[[bytes], Any]] = None, **kwargs: Any) -> AsyncPtySession:
        return AsyncPtySession(await _call(self.sync.create, command, args, on_data=_on_loop(on_data), **kwargs))  # type: ignore[arg-type]

    async def connect(self, pid: int, *, offset: int = 0, on_data: Optional[Callable[[bytes], Any]] = None) -> AsyncPtySession:
        return AsyncPtySession(await _call(self.sync.connect, pid, offset=offset, on_data=_on_loop(on_data)))  # type: ignore[arg-type]

    async def send_input(self, pid: int, data: Union[bytes, str]) -> None:
        await _call(self.sync.send_input, pid, data)

    async def resize(self, pid: int, cols: int, rows: int) -> None:
        await _call(self.sync.resize, pid, cols, rows)

    async def kill(self, pid: int) -> None:
        await _call(self.sync.kill, pid)


def events(client: Optional[Client] = None, *, sandbox_id: Optional[str] = None, since: Optional[int] = None, follow: bool = True) -> AsyncEventStream:
    """The async twin of :func:`sandfork.events.events`."""
    return AsyncEventStream(lambda: sync_events(client, sandbox_id=sandbox_id, since=since, follow=follow))


class AsyncOutputStream:
    """Async iterator of :class:`OutputEvent`; ``.result`` is set once it is exhausted."""

    def __init__(self, stream: OutputStream):
        self._stream = stream

    @property
    def result(self) -> Optional[CommandResult]:
        """The command's result, once the stream has ended."""
        return self._stream.result

    def __aiter__(self) -> "AsyncOutputStream":
        return self

    async def __anext__(self) -> OutputEvent:
        event = await _call(_next_or_end, self._stream)
        if event is _END:
            raise StopAsyncIteration
        assert isinstance(event, OutputEvent)
        return event

    async def wait(self) -> CommandResult:
        """Reads the stream to its end and returns the result."""
        return await _call(self._stream.wait)

    async def aclose(self) -> None:
        """Drops the connection."""
        await _call(self._stream.close)

    async def __aenter__(self) -> "AsyncOutputStream":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class _LazyStream(AsyncOutputStream):
    """An :class:`AsyncOutputStream` whose request is sent on first use, off the loop."""

    def __init__(self, opener: Callable[[], OutputStream]):
        self._opener = opener
        self._opened: Optional[OutputStream] = None
        self._lock = asyncio.Lock()

    @property
    def _stream(self) -> OutputStream:  # type: ignore[override]
        if self._opened is None:
            raise errors.SandforkError("the stream has not been started yet; iterate it or await .wait()")
        return self._opened

    @property
    def result(self) -> Optional[CommandResult]:
        return self._opened.result if self._opened is not None else None

    async def _ensure(self) -> None:
        async with self._lock:
            if self._opened is None:
                self._opened = await _call(self._opener)

    async def __anext__(self) -> OutputEvent:
        await self._ensure()
        return await super().__anext__()

    async def wait(self) -> CommandResult:
        await self._ensure()
        return await super().wait()

    async def aclose(self) -> None:
        if self._opened is not None:
            await super().aclose()


_PROCESS_FIELDS = [f.name for f in dataclasses.fields(ProcessInfo)]
_SNAPSHOT_FIELDS = [f.name for f in dataclasses.fields(SnapshotInfo)]


class AsyncProcess(ProcessInfo):
    """Async twin of :class:`~sandfork.Process`: the ``ProcessInfo`` fields
    (``pid``, ``status`` ... as of the last answer) plus awaitable methods."""

    def __init__(self, process: Process):
        ProcessInfo.__init__(self, **{name: getattr(process, name) for name in _PROCESS_FIELDS})
        self.sync = process

    def __repr__(self) -> str:
        return "Async" + repr(self.sync)

    def _pull(self) -> None:
        for name in _PROCESS_FIELDS:
            setattr(self, name, getattr(self.sync, name))

    async def info(self) -> ProcessInfo:
        """The process's current state (this handle's fields are updated too)."""
        info = await _call(self.sync.info)
        self._pull()
        return info

    async def refresh(self) -> "AsyncProcess":
        """Updates this handle's fields and returns it."""
        await self.info()
        return self

    async def is_running(self) -> bool:
        """True while the process has not ended."""
        return (await self.info()).running

    def output(self, offset: int = 0, follow: bool = True, stderr_offset: int = 0) -> "AsyncOutputStream":
        """Async iterator over the process's output chunks (see :meth:`Process.output`)."""
        return _LazyStream(functools.partial(self.sync.output, offset, follow, stderr_offset))

    async def write_stdin(self, data: Union[bytes, str]) -> None:
        """Writes to the process's standard input."""
        await _call(self.sync.write_stdin, data)

    async def close_stdin(self) -> None:
        """Closes the process's standard input."""
        await _call(self.sync.close_stdin)

    async def send_signal(self, sig: SignalLike) -> None:
        """Sends a signal."""
        await _call(self.sync.send_signal, sig)

    async def terminate(self) -> None:
        """Sends SIGTERM."""
        await _call(self.sync.terminate)

    async def kill(self) -> None:
        """Sends SIGKILL."""
        await _call(self.sync.kill)

    async def wait(self, timeout: Optional[float] = None) -> ProcessInfo:
        """Waits for the process to end (raises :class:`SandforkTimeoutError` after ``timeout``)."""
        try:
            return await _call(self.sync.wait, timeout)
        finally:
            self._pull()


class AsyncSnapshot(SnapshotInfo):
    """Async twin of :class:`~sandfork.Snapshot`: the ``SnapshotInfo`` fields plus
    awaitable methods; sandfork's extra fields (``id``, ``type``, ``labels`` ...)
    come from the sync snapshot, ``.sync``."""

    def __init__(self, snapshot: Snapshot):
        SnapshotInfo.__init__(self, **{name: getattr(snapshot, name) for name in _SNAPSHOT_FIELDS})
        self.sync = snapshot

    def __getattr__(self, name: str) -> Any:
        if name == "sync":
            raise AttributeError(name)
        return getattr(self.sync, name)

    def __repr__(self) -> str:
        return "Async" + repr(self.sync)

    def __eq__(self, other: object) -> bool:
        other_id = getattr(other, "snapshot_id", None)
        return isinstance(other, (AsyncSnapshot, Snapshot)) and other_id == self.snapshot_id

    def __hash__(self) -> int:
        return hash(self.snapshot_id)

    @classmethod
    async def get(cls, snapshot_id: str, *, client: Optional[Client] = None) -> "AsyncSnapshot":
        """Looks a snapshot up by id."""
        return cls(await _call(Snapshot.get, snapshot_id, client=client))

    @classmethod
    async def list(cls, source: Optional[str] = None, type: Union[None, str, CheckpointType] = None, *, published: bool = False, client: Optional[Client] = None) -> TracedList["AsyncSnapshot"]:  # noqa: A002
        """Lists snapshots (optionally of one source sandbox or one type; with
        ``published``, also those only the object store holds)."""
        snaps = await _call(Snapshot.list, source, type, published=published, client=client)
        return TracedList(cls(s) for s in snaps)

    async def publish(self) -> "AsyncSnapshot":
        """Puts the snapshot in the object store (see :meth:`Snapshot.publish`)."""
        await _call(self.sync.publish)
        SnapshotInfo.__init__(self, **{name: getattr(self.sync, name) for name in _SNAPSHOT_FIELDS})
        return self

    async def refresh(self) -> "AsyncSnapshot":
        """Reloads the description."""
        await _call(self.sync.refresh)
        SnapshotInfo.__init__(self, **{name: getattr(self.sync, name) for name in _SNAPSHOT_FIELDS})
        return self

    @hybridmethod
    async def delete(target: Any, snapshot_id: Optional[str] = None, *, everywhere: bool = False, client: Optional[Client] = None) -> None:  # noqa: N805
        """Deletes the snapshot: ``await snap.delete()`` or ``await AsyncSnapshot.delete(snapshot_id)``
        (``everywhere``: out of the object store too)."""
        if isinstance(target, AsyncSnapshot):
            await _call(target.sync.delete, everywhere=everywhere)
        else:
            await _call(Snapshot.delete, snapshot_id, everywhere=everywhere, client=client)

    async def fork(self, count: int = 1, **kwargs: Any) -> "AsyncForkResult":
        """Starts ``count`` sandboxes from the snapshot (see :meth:`Snapshot.fork`)."""
        return AsyncForkResult(await _call_owning(self.sync.fork, ForkResult.terminate_all, count, **kwargs))

    async def export(self, path: PathLike, *, base: Union["AsyncSnapshot", Snapshot, str, None] = None) -> int:
        """Streams the snapshot into a local file (see :meth:`Snapshot.export`)."""
        plain = base.sync if isinstance(base, AsyncSnapshot) else base
        return await _call(self.sync.export, path, base=plain)

    @classmethod
    async def import_(cls, path: PathLike, *, client: Optional[Client] = None) -> "AsyncSnapshot":
        """Imports a snapshot file made by :meth:`export`."""
        return cls(await _call(Snapshot.import_, path, client=client))


class AsyncForkResult(TracedList["AsyncSandbox"]):
    """Async twin of :class:`~sandfork.ForkResult`: a list of the children that
    started, with Tensorlake's ``CopySandboxResponse`` shape too."""

    def __init__(self, result: ForkResult):
        super().__init__(AsyncSandbox(s) for s in result)
        self.sync = result
        self.snapshot_id = result.snapshot_id
        self.source_sandbox_id = result.source_sandbox_id

    @property
    def sandboxes(self) -> List[CopiedSandbox]:
        """Every child in Tensorlake's ``CopiedSandboxResponse`` shape."""
        return self.sync.sandboxes

    @property
    def children(self) -> List[ForkChild]:
        """Every child with its index and sandbox or error (sync handles)."""
        return self.sync.children

    @property
    def errors(self) -> List[ForkChild]:
        """The children that failed."""
        return self.sync.errors

    @property
    def ok(self) -> bool:
        """True when every child started."""
        return self.sync.ok

    def raise_for_errors(self) -> "AsyncForkResult":
        """Raises :class:`ForkError` if any child failed."""
        self.sync.raise_for_errors()
        return self

    async def terminate_all(self) -> None:
        """Terminates every child that started, concurrently."""
        await asyncio.gather(*(sb.terminate() for sb in self), return_exceptions=True)

    async def __aenter__(self) -> "AsyncForkResult":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.terminate_all()


class _Creating:
    """What :meth:`AsyncSandbox.create` returns: awaitable, and an async context manager."""

    def __init__(self, pending: Awaitable[Sandbox]):
        self._pending = pending
        self._sandbox: Optional[AsyncSandbox] = None

    def __await__(self) -> Generator[Any, None, "AsyncSandbox"]:
        return self._finish().__await__()

    async def _finish(self) -> "AsyncSandbox":
        if self._sandbox is None:
            self._sandbox = AsyncSandbox(await self._pending)
        return self._sandbox

    async def __aenter__(self) -> "AsyncSandbox":
        return await self._finish()

    async def __aexit__(self, *exc: object) -> None:
        if self._sandbox is not None:
            await self._sandbox.__aexit__(*exc)


def _mirror(name: str, wrap: Optional[Callable[[Any], Any]] = None) -> Any:
    """An async method running ``Sandbox.<name>`` on the thread pool (same signature)."""
    sync_fn = getattr(Sandbox, name)

    @functools.wraps(sync_fn)
    async def method(self: "AsyncSandbox", *args: Any, **kwargs: Any) -> Any:
        result = await _call(getattr(self.sync, name), *args, **kwargs)
        return wrap(result) if wrap is not None else result

    return method


def _processes(items: Any) -> TracedList[AsyncProcess]:
    return TracedList((AsyncProcess(p) for p in items), getattr(items, "trace_id", None))


def _snapshots(items: Any) -> TracedList[AsyncSnapshot]:
    return TracedList((AsyncSnapshot(s) for s in items), getattr(items, "trace_id", None))


def _snapshot_or_none(snap: Optional[Snapshot]) -> Optional[AsyncSnapshot]:
    return AsyncSnapshot(snap) if snap is not None else None


class AsyncSandbox:
    """Async twin of :class:`~sandfork.Sandbox`: the same calls, awaited.

    As in Tensorlake: ``create``/``connect`` are awaited
    (``sb = await AsyncSandbox.create()``; ``async with await
    AsyncSandbox.create() as sb`` terminates it on exit), ``status()`` is a
    coroutine, ``sandbox_id`` is a plain property, ``close()`` and
    ``pty_ws_url()`` are not coroutines. Iterators (``stream``,
    ``iter_output``, ``iter_file``) are async iterators.
    """

    def __init__(self, sandbox: Sandbox):
        self.sync = sandbox

    def __repr__(self) -> str:
        return "Async" + repr(self.sync)

    # --- lifecycle ---------------------------------------------------------------

    @classmethod
    def create(cls, *args: Any, **kwargs: Any) -> "_Creating":
        """Creates a sandbox; takes the arguments of :meth:`Sandbox.create`.

        Await it (``sb = await AsyncSandbox.create()``) or use it directly as
        an async context manager (``async with AsyncSandbox.create() as sb:``),
        which terminates the sandbox on exit.
        """
        return _Creating(_call_owning(Sandbox.create, Sandbox.terminate, *args, **kwargs))

    @classmethod
    async def connect(
        cls,
        sandbox_id: Optional[str] = None,
        *,
        proxy_url: Optional[str] = None,
        routing_hint: Optional[str] = None,
        api_key: Optional[str] = None,
        api_url: Optional[str] = None,
        organization_id: Optional[str] = None,
        project_id: Optional[str] = None,
        namespace: Optional[str] = None,
        request_timeout: Optional[float] = None,
        identifier: Optional[str] = None,
        client: Optional[Client] = None,
    ) -> "AsyncSandbox":
        """Attaches to an existing sandbox by id or name (see :meth:`Sandbox.connect`)."""
        sb = await _call(
            Sandbox.connect, sandbox_id, proxy_url=proxy_url, routing_hint=routing_hint, api_key=api_key, api_url=api_url,
            organization_id=organization_id, project_id=project_id, namespace=namespace, request_timeout=request_timeout,
            identifier=identifier, client=client,
        )  # fmt: skip
        return cls(sb)

    @classmethod
    async def list(cls, *args: Any, **kwargs: Any) -> TracedList[SandboxInfo]:
        """Lists sandboxes (see :meth:`Sandbox.list`)."""
        return await _call(Sandbox.list, *args, **kwargs)

    @classmethod
    async def get_snapshot(cls, snapshot_id: str, *args: Any, **kwargs: Any) -> AsyncSnapshot:
        """Looks a snapshot up by id (see :meth:`Sandbox.get_snapshot`)."""
        return AsyncSnapshot(await _call(Sandbox.get_snapshot, snapshot_id, *args, **kwargs))

    @classmethod
    async def delete_snapshot(cls, snapshot_id: str, *args: Any, **kwargs: Any) -> None:
        """Deletes a snapshot by id (see :meth:`Sandbox.delete_snapshot`)."""
        await _call(Sandbox.delete_snapshot, snapshot_id, *args, **kwargs)

    @property
    def id(self) -> str:
        """The sandbox id."""
        return self.sync.id

    @property
    def sandbox_id(self) -> str:
        """The sandbox id (never does I/O)."""
        return self.sync.id

    @property
    def trace_id(self) -> Optional[str]:
        """A trace id for the create or connect call of this handle."""
        return self.sync.trace_id

    @property
    def client(self) -> Client:
        """The :class:`~sandfork.Client` this handle talks through."""
        return self.sync.client

    @property
    def name(self) -> Optional[str]:
        """The sandbox name as of the last answer from the daemon (no I/O)."""
        return self.sync._info.name if self.sync._info is not None else None

    async def status(self) -> Union[SandboxStatus, str]:
        """The current lifecycle state, fetched fresh."""
        return (await self.info()).status

    info = _mirror("info")
    update = _mirror("update")
    update_labels = _mirror("update_labels")
    update_network = _mirror("update_network")
    set_timeout = _mirror("set_timeout")

    def events(self, *, since: Optional[int] = 0, follow: bool = True) -> AsyncEventStream:
        """This sandbox's events (see :meth:`Sandbox.events`), as an async iterator."""
        return AsyncEventStream(lambda: self.sync.events(since=since, follow=follow))

    async def watch_dir(self, path: str, *, recursive: bool = False) -> AsyncEventStream:
        """Watches a directory (see :meth:`Sandbox.watch_dir`); live once awaited."""
        return await AsyncEventStream(lambda: self.sync.watch_dir(path, recursive=recursive)).open()
    async def logs(self, **kwargs: Any) -> AsyncEventStream:
        """The sandbox log (see :meth:`Sandbox.logs`) as an async iterator of
        :class:`~sandfork.events.LogEntry`."""
        return await AsyncEventStream(lambda: self.sync.logs(**kwargs)).open()

    stats = _mirror("stats")
    get_url = _mirror("get_url")
    get_host = _mirror("get_host")
    port_token = _mirror("port_token")
    rotate_port_token = _mirror("rotate_port_token")
    terminate = _mirror("terminate")

    @property
    def pty(self) -> AsyncPtyCommands:
        """Terminal sessions (see :attr:`Sandbox.pty`)."""
        return AsyncPtyCommands(self.sync.pty)

    def close(self) -> None:
        """Releases the handle; the sandbox keeps running."""
        self.sync.close()

    async def __aenter__(self) -> "AsyncSandbox":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await _call(self.sync.__exit__, None, None, None)

    # --- commands and processes ------------------------------------------------------

    async def run(
        self,
        command: Command,
        args: Optional[List[str]] = None,
        env: Optional[Dict[str, str]] = None,
        working_dir: Optional[str] = None,
        timeout: Optional[float] = None,
        user: Optional[ProcessUser] = None,
        *,
        stdin: Union[None, str, bytes] = None,
        on_stdout: Optional[OutputCallback] = None,
        on_stderr: Optional[OutputCallback] = None,
    ) -> CommandResult:
        """Runs a command to completion (see :meth:`Sandbox.run`); callbacks run on the event loop."""
        return await _call(self.sync.run, command, args, env, working_dir, timeout, user, stdin=stdin, on_stdout=_on_loop(on_stdout), on_stderr=_on_loop(on_stderr))

    def stream(
        self,
        command: Command,
        args: Optional[Iterable[str]] = None,
        env: Optional[Mapping[str, str]] = None,
        working_dir: Optional[str] = None,
        timeout: Optional[float] = None,
        stdin: Union[None, str, bytes] = None,
        *,
        user: Optional[ProcessUser] = None,
    ) -> AsyncOutputStream:
        """Runs a command; ``async for`` over its output, then read ``.result``."""
        return _LazyStream(functools.partial(self.sync.stream, command, args, env, working_dir, timeout, stdin, user=user))

    start_process = _mirror("start_process", AsyncProcess)
    list_processes = _mirror("list_processes", _processes)
    get_process = _mirror("get_process", AsyncProcess)
    restart_process = _mirror("restart_process", AsyncProcess)
    kill_process = _mirror("kill_process")
    send_signal = _mirror("send_signal")
    write_stdin = _mirror("write_stdin")
    close_stdin = _mirror("close_stdin")
    get_stdout = _mirror("get_stdout")
    get_stderr = _mirror("get_stderr")
    get_output = _mirror("get_output")
    follow_stdout = _mirror("follow_stdout")
    follow_stderr = _mirror("follow_stderr")
    follow_output = _mirror("follow_output")

    def iter_output(self, process: Union[int, str], offset: int = 0, stderr_offset: int = 0, follow: bool = True) -> AsyncOutputStream:
        """Async iterator over a process's output chunks while it runs."""
        return _LazyStream(functools.partial(self.sync.iter_output, process, offset, stderr_offset, follow))

    # --- files -----------------------------------------------------------------------

    read_file = _mirror("read_file")
    write_file = _mirror("write_file")
    upload_file = _mirror("upload_file")
    download_file = _mirror("download_file")
    delete_file = _mirror("delete_file")
    list_directory = _mirror("list_directory")
    list_dir = _mirror("list_dir")
    stat = _mirror("stat")
    exists = _mirror("exists")
    remove = _mirror("remove")
    mkdir = _mirror("mkdir")

    async def iter_file(self, path: str, chunk_size: int = CHUNK_SIZE) -> AsyncIterator[bytes]:
        """Yields the content of ``path`` in chunks (an async generator)."""
        chunks = await _call(self.sync.iter_file, path, chunk_size)
        while True:
            chunk = await _call(_next_or_end, chunks)
            if chunk is _END:
                return
            yield chunk

    # --- checkpoints, forks, suspend -----------------------------------------------------

    checkpoint = _mirror("checkpoint", _snapshot_or_none)
    snapshot = _mirror("snapshot", _snapshot_or_none)
    list_snapshots = _mirror("list_snapshots", _snapshots)
    suspend = _mirror("suspend")
    resume = _mirror("resume")

    async def fork(self, count: int = 1, **kwargs: Any) -> AsyncForkResult:
        """Forks ``count`` live copies (see :meth:`Sandbox.fork`)."""
        return AsyncForkResult(await _call_owning(self.sync.fork, ForkResult.terminate_all, count, **kwargs))

    async def copy(self, *, times: int = 1, request_timeout: Optional[float] = None) -> AsyncForkResult:
        """``times`` live copies (see :meth:`Sandbox.copy`)."""
        return AsyncForkResult(await _call_owning(self.sync.copy, ForkResult.terminate_all, times=times, request_timeout=request_timeout))

    # --- daemon, and Tensorlake features sandfork does not have ----------------------------

    health = _mirror("health")
    daemon_info = _mirror("daemon_info")
    create_pty_session = _mirror("create_pty_session")

    async def connect_pty(self, session_id: str, token: str, *, on_data: Optional[Callable[[bytes], Any]] = None, on_exit: Optional[Callable[[Optional[int]], Any]] = None, connect_timeout: float = 10.0) -> AsyncPtySession:
        """Attaches to a terminal session (see :meth:`Sandbox.connect_pty`); callbacks run on the loop."""
        return AsyncPtySession(await _call(self.sync.connect_pty, session_id, token, on_data=_on_loop(on_data), on_exit=_on_loop(on_exit)))  # type: ignore[arg-type]

    async def create_pty(self, command: str, args: Optional[List[str]] = None, env: Optional[Dict[str, str]] = None, working_dir: Optional[str] = None, rows: int = 24, cols: int = 80, *, on_data: Optional[Callable[[bytes], Any]] = None, on_exit: Optional[Callable[[Optional[int]], Any]] = None, connect_timeout: float = 10.0) -> AsyncPtySession:
        """Starts a command on a new terminal and attaches (see :meth:`Sandbox.create_pty`)."""
        return AsyncPtySession(await _call(self.sync.create_pty, command, args, env, working_dir, rows, cols, on_data=_on_loop(on_data), on_exit=_on_loop(on_exit)))  # type: ignore[arg-type]
    connect_desktop = _mirror("connect_desktop")
    get_logs = _mirror("get_logs")
    list_log_processes = _mirror("list_log_processes")
    attach_file_system = _mirror("attach_file_system")
    detach_file_system = _mirror("detach_file_system")
    list_file_systems = _mirror("list_file_systems")

    def pty_ws_url(self, session_id: str, token: str) -> str:
        """Interactive terminals are not supported: raises ``NotImplementedError``."""
        return self.sync.pty_ws_url(session_id, token)


__all__ = ["AsyncEventStream", "events", "AsyncForkResult", "AsyncImage", "AsyncOutputStream", "AsyncProcess", "AsyncSandbox", "AsyncSnapshot"]


class AsyncImage:
    """The async twin of :class:`~sandfork.images.Image`: the same properties, awaitable calls."""

    def __init__(self, sync: Image):
        self.sync = sync

    def __getattr__(self, name: str) -> Any:
        if name == "sync":
            raise AttributeError(name)
        return getattr(self.sync, name)

    def __repr__(self) -> str:
        return "Async" + repr(self.sync)

    @classmethod
    async def pull(cls, reference: str, **kwargs: Any) -> "AsyncImage":
        """Pulls ``reference`` from its registry (see :meth:`Image.pull`)."""
        image = await _call(Image.pull, reference, **kwargs)
        await _call(lambda: image.working_dir)  # fetch the details off the event loop
        return cls(image)

    @classmethod
    async def get(cls, name: str, *, client: Optional[Client] = None) -> "AsyncImage":
        return cls(await _call(Image.get, name, client=client))

    @classmethod
    async def list(cls, *, client: Optional[Client] = None) -> List["AsyncImage"]:
        return [cls(i) for i in await _call(Image.list, client=client)]

    @hybridmethod
    async def delete(target: Any, name: Optional[str] = None, *, client: Optional[Client] = None) -> None:  # noqa: N805
        """Removes the image name: ``await image.delete()`` or ``await AsyncImage.delete("app")``."""
        if isinstance(target, AsyncImage):
            await _call(target.sync.delete)
        else:
            await _call(Image.delete, name, client=client)

    @classmethod
    async def build(cls, context: PathLike, name: str, **kwargs: Any) -> "AsyncImage":
        """Builds an image from a Dockerfile (see :meth:`Image.build`); ``on_progress`` is
        called from a worker thread."""
        return cls(await _call(Image.build, context, name, **kwargs))

    @classmethod
    async def import_(cls, path: PathLike, name: Optional[str] = None, *, client: Optional[Client] = None) -> "AsyncImage":
        return cls(await _call(Image.import_, path, name, client=client))

    @classmethod
    async def from_snapshot(cls, snapshot_id: str, name: str, *, client: Optional[Client] = None) -> "AsyncImage":
        return cls(await _call(Image.from_snapshot, snapshot_id, name, client=client))

    async def export(self, path: PathLike, *, format: str = "oci-archive") -> int:
        return await _call(self.sync.export, path, format=format)

    async def push(self, reference: str, **kwargs: Any) -> str:
        return await _call(self.sync.push, reference, **kwargs)
