"""The asyncio flavour of the SDK: :class:`AsyncSandbox`, :class:`AsyncSnapshot`, :class:`AsyncProcess`.

Every method mirrors its synchronous twin and runs it on a dedicated thread
pool, so awaiting never blocks the event loop and many sandboxes can be
driven at once::

    import asyncio
    from sandfork.aio import AsyncSandbox

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
import functools
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Awaitable, Callable, Generator, Iterable, List, Mapping, Optional, TypeVar, Union

from . import errors
from ._streams import OutputCallback, OutputStream
from ._files import PathLike
from ._transport import Client
from .models import CheckpointType, CommandResult, DirectoryEntry, DirectoryListing, OutputEvent, ProcessInfo, ProcessStatus, SandboxInfo, SandboxStatus
from .process import Process, SignalLike
from .sandbox import Command, Sandbox
from .snapshot import ForkChild, ForkResult, Snapshot

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


class AsyncProcess:
    """Async twin of :class:`~sandfork.Process`."""

    def __init__(self, process: Process):
        self.sync = process
        self.pid = process.pid

    def __repr__(self) -> str:
        return f"AsyncProcess(sandbox={self.sync.sandbox.id!r}, pid={self.pid})"

    async def info(self) -> ProcessInfo:
        """The process's current state."""
        return await _call(self.sync.info)

    async def status(self) -> Union[ProcessStatus, str]:
        """``ProcessStatus.RUNNING`` or ``ProcessStatus.EXITED``."""
        return await _call(self.sync.status)

    def output(self, offset: int = 0, follow: bool = True) -> AsyncOutputStream:
        """Async iterator over the process's output (see :meth:`Process.output`)."""
        return _LazyStream(functools.partial(self.sync.output, offset, follow))

    async def write_stdin(self, data: Union[bytes, str]) -> None:
        """Writes to the process's standard input."""
        await _call(self.sync.write_stdin, data)

    async def close_stdin(self) -> None:
        """Closes the process's standard input."""
        await _call(self.sync.close_stdin)

    async def signal(self, sig: SignalLike) -> None:
        """Sends a signal."""
        await _call(self.sync.signal, sig)

    async def kill(self) -> None:
        """Sends SIGKILL."""
        await _call(self.sync.kill)

    async def wait(self, timeout: Optional[float] = None) -> ProcessInfo:
        """Waits for the process to exit (raises :class:`SandforkTimeoutError` after ``timeout``)."""
        return await _call(self.sync.wait, timeout)


class AsyncSnapshot:
    """Async twin of :class:`~sandfork.Snapshot`; its fields are on ``.sync`` and mirrored here."""

    def __init__(self, snapshot: Snapshot):
        self.sync = snapshot

    def __getattr__(self, name: str) -> Any:
        # Plain fields (id, type, size_bytes, created_at ...) come from the sync snapshot.
        return getattr(self.sync, name)

    def __repr__(self) -> str:
        return "Async" + repr(self.sync)

    @classmethod
    async def get(cls, snapshot_id: str, *, client: Optional[Client] = None) -> "AsyncSnapshot":
        """Looks a snapshot up by id."""
        return cls(await _call(Snapshot.get, snapshot_id, client=client))

    @classmethod
    async def list(cls, source: Optional[str] = None, type: Union[None, str, CheckpointType] = None, *, client: Optional[Client] = None) -> List["AsyncSnapshot"]:  # noqa: A002
        """Lists snapshots (optionally of one source sandbox or one type)."""
        snaps = await _call(Snapshot.list, source, type, client=client)
        return [cls(s) for s in snaps]

    async def delete(self) -> None:
        """Deletes the snapshot."""
        await _call(self.sync.delete)

    async def fork(self, count: int = 1, **kwargs: Any) -> "AsyncForkResult":
        """Starts ``count`` sandboxes from the snapshot (see :meth:`Snapshot.fork`)."""
        return AsyncForkResult(await _call_owning(self.sync.fork, ForkResult.terminate_all, count, **kwargs))

    async def export(self, path: PathLike) -> int:
        """Streams the snapshot into a local file."""
        return await _call(self.sync.export, path)

    @classmethod
    async def import_(cls, path: PathLike, *, client: Optional[Client] = None) -> "AsyncSnapshot":
        """Imports a snapshot file made by :meth:`export`."""
        return cls(await _call(Snapshot.import_, path, client=client))


class AsyncForkResult(List["AsyncSandbox"]):
    """Async twin of :class:`~sandfork.ForkResult`: a list of the children that started."""

    def __init__(self, result: ForkResult):
        super().__init__(AsyncSandbox(s) for s in result)
        self.sync = result
        self.snapshot_id = result.snapshot_id
        self.source_sandbox_id = result.source_sandbox_id

    @property
    def children(self) -> List[ForkChild]:
        """Every child with its index and sandbox or error (sync handles)."""
        return self.sync.children

    @property
    def errors(self) -> List[ForkChild]:
        """The children that failed."""
        return self.sync.errors

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


class AsyncSandbox:
    """Async twin of :class:`~sandfork.Sandbox` (same methods, awaited)."""

    def __init__(self, sandbox: Sandbox):
        self.sync = sandbox

    def __repr__(self) -> str:
        return "Async" + repr(self.sync)

    @classmethod
    def create(cls, *args: Any, **kwargs: Any) -> "_Creating":
        """Creates a sandbox; takes the arguments of :meth:`Sandbox.create`.

        Await it (``sb = await AsyncSandbox.create()``) or use it directly as
        an async context manager (``async with AsyncSandbox.create() as sb:``),
        which terminates the sandbox on exit.
        """
        return _Creating(_call_owning(Sandbox.create, Sandbox.terminate, *args, **kwargs))

    @classmethod
    async def connect(cls, sandbox_id: str, *, client: Optional[Client] = None) -> "AsyncSandbox":
        """Attaches to an existing sandbox by id or name."""
        return cls(await _call(Sandbox.connect, sandbox_id, client=client))

    @classmethod
    async def list(cls, state: Optional[str] = None, name: Optional[str] = None, *, client: Optional[Client] = None) -> List[SandboxInfo]:
        """Lists sandboxes."""
        return await _call(Sandbox.list, state, name, client=client)

    @property
    def id(self) -> str:
        """The sandbox id."""
        return self.sync.id

    sandbox_id = id

    @property
    def name(self) -> Optional[str]:
        """The sandbox name (as of creation or connection)."""
        return self.sync._info.name if self.sync._info is not None else None

    async def status(self) -> Union[SandboxStatus, str]:
        """The current lifecycle state, fetched fresh."""
        return await _call(lambda: self.sync.status)

    async def info(self) -> SandboxInfo:
        """The sandbox's current description."""
        return await _call(self.sync.info)

    async def terminate(self) -> None:
        """Terminates the sandbox."""
        await _call(self.sync.terminate)

    async def __aenter__(self) -> "AsyncSandbox":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await _call(self.sync.__exit__, None, None, None)

    async def run(self, command: Command, args: Optional[Iterable[str]] = None, env: Optional[Mapping[str, str]] = None, working_dir: Optional[str] = None, timeout: Optional[float] = None, stdin: Union[None, str, bytes] = None, on_stdout: Optional[OutputCallback] = None, on_stderr: Optional[OutputCallback] = None, user: Optional[str] = None) -> CommandResult:
        """Runs a command to completion (see :meth:`Sandbox.run`)."""
        return await _call(self.sync.run, command, args, env, working_dir, timeout, stdin, _on_loop(on_stdout), _on_loop(on_stderr), user)

    def stream(self, command: Command, args: Optional[Iterable[str]] = None, env: Optional[Mapping[str, str]] = None, working_dir: Optional[str] = None, timeout: Optional[float] = None, stdin: Union[None, str, bytes] = None, *, user: Optional[str] = None) -> AsyncOutputStream:
        """Runs a command; ``async for`` over its output, then read ``.result``."""
        return _LazyStream(functools.partial(self.sync.stream, command, args, env, working_dir, timeout, stdin, user=user))

    async def start_process(self, command: Command, args: Optional[Iterable[str]] = None, env: Optional[Mapping[str, str]] = None, working_dir: Optional[str] = None, stdin: Union[None, str, bytes] = None, user: Optional[str] = None) -> AsyncProcess:
        """Starts a background process."""
        return AsyncProcess(await _call(self.sync.start_process, command, args, env, working_dir, stdin, user))

    async def list_processes(self) -> List[AsyncProcess]:
        """Handles on every background process."""
        return [AsyncProcess(p) for p in await _call(self.sync.list_processes)]

    async def get_process(self, pid: int) -> AsyncProcess:
        """A handle on background process ``pid``."""
        return AsyncProcess(await _call(self.sync.get_process, pid))

    async def write_file(self, path: str, data: Union[bytes, str], mode: Optional[int] = None) -> None:
        """Writes a file inside the sandbox."""
        await _call(self.sync.write_file, path, data, mode)

    async def read_file(self, path: str) -> bytes:
        """Reads a whole file from the sandbox."""
        return await _call(self.sync.read_file, path)

    async def list_dir(self, path: str = "/") -> DirectoryListing:
        """Lists a directory."""
        return await _call(self.sync.list_dir, path)

    list_directory = list_dir

    async def stat(self, path: str) -> DirectoryEntry:
        """Describes one path."""
        return await _call(self.sync.stat, path)

    async def exists(self, path: str) -> bool:
        """True when the path exists."""
        return await _call(self.sync.exists, path)

    async def remove(self, path: str, recursive: bool = False) -> None:
        """Deletes a file or (``recursive=True``) a tree."""
        await _call(self.sync.remove, path, recursive)

    async def delete_file(self, path: str) -> None:
        """Deletes a file."""
        await _call(self.sync.delete_file, path)

    async def mkdir(self, path: str, parents: bool = True) -> None:
        """Creates a directory."""
        await _call(self.sync.mkdir, path, parents)

    async def upload_file(self, local_path: PathLike, remote_path: str, mode: Optional[int] = None) -> None:
        """Streams a local file into the sandbox."""
        await _call(self.sync.upload_file, local_path, remote_path, mode)

    async def download_file(self, remote_path: str, local_path: PathLike) -> int:
        """Streams a file out of the sandbox."""
        return await _call(self.sync.download_file, remote_path, local_path)

    async def checkpoint(self, checkpoint_type: Union[CheckpointType, str] = CheckpointType.FILESYSTEM, **kwargs: Any) -> AsyncSnapshot:
        """Checkpoints the sandbox (see :meth:`Sandbox.checkpoint`)."""
        return AsyncSnapshot(await _call(self.sync.checkpoint, checkpoint_type, **kwargs))

    async def fork(self, count: int = 1, **kwargs: Any) -> AsyncForkResult:
        """Forks ``count`` live copies (see :meth:`Sandbox.fork`)."""
        return AsyncForkResult(await _call_owning(self.sync.fork, ForkResult.terminate_all, count, **kwargs))

    async def copy(self, *, times: int = 1) -> AsyncForkResult:
        """Alias of :meth:`fork`."""
        return await self.fork(times)

    async def suspend(self, wait: bool = True, timeout: float = 600.0) -> None:
        """Suspends a named sandbox."""
        await _call(self.sync.suspend, wait, timeout)

    async def resume(self, wait: bool = True, timeout: float = 600.0) -> None:
        """Resumes a suspended sandbox."""
        await _call(self.sync.resume, wait, timeout)

    async def list_snapshots(self) -> List[AsyncSnapshot]:
        """Snapshots taken from this sandbox."""
        return [AsyncSnapshot(s) for s in await _call(self.sync.list_snapshots)]

    @classmethod
    async def get_snapshot(cls, snapshot_id: str, *, client: Optional[Client] = None) -> AsyncSnapshot:
        """Looks a snapshot up by id."""
        return await AsyncSnapshot.get(snapshot_id, client=client)

    @classmethod
    async def delete_snapshot(cls, snapshot_id: str, *, client: Optional[Client] = None) -> None:
        """Deletes a snapshot by id."""
        await _call(Snapshot.delete_by_id, snapshot_id, client=client)


__all__ = ["AsyncForkResult", "AsyncOutputStream", "AsyncProcess", "AsyncSandbox", "AsyncSnapshot"]
