"""File operations on a sandbox, all carried out by the agent inside it."""

from __future__ import annotations

import os
import secrets
import stat as _stat
from typing import IO, Iterator, Optional, Union

from . import errors
from ._args import check_bytes, check_str
from ._trace import Traced, TracedBytes
from ._transport import Client, seg
from .models import DirectoryEntry, ListDirectoryResponse

PathLike = Union[str, "os.PathLike[str]"]

CHUNK_SIZE = 1024 * 1024
"""Bytes per chunk when files are streamed to or from a sandbox."""


class FilesMixin:
    """The file helpers of :class:`~sandfork.Sandbox`.

    Paths inside the sandbox are absolute. Large files move in chunks, never
    whole in memory (:meth:`upload_file`, :meth:`download_file`,
    :meth:`iter_file`).
    """

    id: str

    @property
    def client(self) -> Client:  # pragma: no cover - provided by Sandbox
        raise NotImplementedError

    def _files_route(self, suffix: str = "") -> str:
        return f"/v1/sandboxes/{seg(self.id)}/files{suffix}"

    def write_file(self, path: str, content: Union[bytes, str], *, mode: Optional[int] = None) -> Traced[None]:
        """Writes ``content`` (bytes, or text as UTF-8) to ``path``, creating parent directories.

        Args:
            path: Absolute path inside the sandbox.
            content: The new content; the file is replaced.
            mode: Permission bits (e.g. ``0o755``); the daemon's default when omitted.
        """
        check_str("path", path, none_ok=False)
        body = check_bytes("content", content)
        self._put(path, body, mode, len(body))
        return Traced(None, None)

    def read_file(self, path: str) -> TracedBytes:
        """Returns the whole content of ``path`` as ``bytes`` (with ``.value`` and
        ``.trace_id``). Use :meth:`download_file` for big files."""
        check_str("path", path, none_ok=False)
        return TracedBytes(self.client.open("GET", self._files_route(), query={"path": path}, unbounded=True).read_all())

    def iter_file(self, path: str, chunk_size: int = CHUNK_SIZE) -> Iterator[bytes]:
        """Yields the content of ``path`` in chunks of at most ``chunk_size`` bytes."""
        check_str("path", path, none_ok=False)
        response = self.client.open("GET", self._files_route(), query={"path": path}, unbounded=True)
        return response.iter_chunks(chunk_size)

    def list_directory(self, path: str = "/") -> ListDirectoryResponse:
        """Lists a directory: ``.path`` and ``.entries`` (each a :class:`DirectoryEntry`
        with ``name``, ``is_dir``, ``size``, ``modified_at`` ...); the response is also
        a list of the entries."""
        check_str("path", path, none_ok=False)
        doc = self.client.request_json("GET", self._files_route("/list"), query={"path": path})
        entries = [DirectoryEntry.from_json(e) for e in (doc or {}).get("entries", [])]
        return ListDirectoryResponse(path, entries)

    def list_dir(self, path: str = "/") -> ListDirectoryResponse:
        """Alias of :meth:`list_directory`."""
        return self.list_directory(path)

    def stat(self, path: str) -> DirectoryEntry:
        """Returns the type, size, mode and modification time of ``path``."""
        check_str("path", path, none_ok=False)
        return DirectoryEntry.from_json(self.client.request_json("GET", self._files_route("/stat"), query={"path": path}))

    def exists(self, path: str) -> bool:
        """True when ``path`` exists inside the sandbox."""
        try:
            self.stat(path)
        except errors.NotFoundError as e:
            if isinstance(e, errors.SandboxNotFoundError):
                raise
            return False
        return True

    def remove(self, path: str, recursive: bool = False) -> None:
        """Deletes a file, an empty directory, or (``recursive=True``) a whole tree."""
        self.client.request("DELETE", self._files_route(), query={"path": path, "recursive": recursive})

    def delete_file(self, path: str) -> Traced[None]:
        """Deletes a file (or an empty directory)."""
        check_str("path", path, none_ok=False)
        self.remove(path)
        return Traced(None, None)

    def mkdir(self, path: str, parents: bool = True) -> None:
        """Creates a directory (and, by default, its missing parents)."""
        self.client.request("POST", self._files_route("/mkdir"), json_body={"path": path, "parents": parents})

    def upload_file(self, local_path: PathLike, path: str, *, mode: Optional[int] = None) -> Traced[None]:
        """Streams the local file ``local_path`` into the sandbox at ``path``.

        The file's permission bits are kept unless ``mode`` is given.
        """
        check_str("path", path, none_ok=False)
        with open(local_path, "rb") as f:
            st = os.fstat(f.fileno())
            if not _stat.S_ISREG(st.st_mode):
                raise errors.ArgumentValueError(f"{os.fspath(local_path)!r} is not a regular file")
            self._put(path, f, mode if mode is not None else _stat.S_IMODE(st.st_mode), st.st_size)
        return Traced(None, None)

    def download_file(self, remote_path: str, local_path: PathLike) -> int:
        """Streams ``remote_path`` from the sandbox into a local file; returns the byte count.

        The local file appears complete or not at all (written next to its
        final name, then renamed).
        """
        target = os.fspath(local_path)
        directory = os.path.dirname(os.path.abspath(target))
        tmp = os.path.join(directory, f".{os.path.basename(target)}.sandfork-{secrets.token_hex(6)}")
        # 0o666 filtered by the umask, like any newly created file.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        try:
            with os.fdopen(fd, "wb") as out:
                written = _copy_chunks(self.iter_file(remote_path), out)
            os.replace(tmp, target)
        except BaseException:
            _unlink_quietly(tmp)
            raise
        return written

    def _put(self, path: str, body: Union[bytes, IO[bytes]], mode: Optional[int], length: int) -> None:
        query = {"path": path, "mode": f"{mode:04o}" if mode is not None else None}
        headers = {"Content-Type": "application/octet-stream", "Content-Length": str(length)}
        self.client.request("PUT", self._files_route(), query=query, body=body, headers=headers, unbounded=True)


def _copy_chunks(chunks: Iterator[bytes], out: IO[bytes]) -> int:
    written = 0
    for chunk in chunks:
        out.write(chunk)
        written += len(chunk)
    return written


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
