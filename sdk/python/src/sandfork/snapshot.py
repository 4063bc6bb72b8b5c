"""Snapshots (checkpoints as persistent objects) and fork fan-out results."""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Generic, List, Mapping, Optional, Protocol, TypeVar, Union

from . import errors
from ._hybrid import hybridmethod
from ._trace import TracedList
from ._transport import Client, seg
from .models import CheckpointType, CopiedSandboxResponse, SandboxInfo, SnapshotInfo



class SandboxHandle(Protocol):
    """What this module needs of a started child: a :class:`~sandfork.Sandbox` (the
    sandbox module sits above this one, so it is named by what it does here)."""

    @property
    def id(self) -> str: ...

    _info: Optional[SandboxInfo]

    def terminate(self) -> None: ...


S = TypeVar("S", bound=SandboxHandle)

PathLike = Union[str, "os.PathLike[str]"]


def fork_body(
    count: int,
    env: Optional[Mapping[str, str]] = None,
    secrets_: Optional[Mapping[str, str]] = None,
    labels: Optional[Mapping[str, str]] = None,
    per_child: Optional[List[Mapping[str, Any]]] = None,
    name_prefix: Optional[str] = None,
    timeout_secs: Optional[int] = None,
) -> Dict[str, Any]:
    """The API's fork request document."""
    if int(count) < 1:
        raise errors.InvalidArgumentError(f"fork count must be at least 1, got {count}", code="invalid_argument")
    body: Dict[str, Any] = {"count": int(count)}
    for key, value in (("env", env), ("secrets", secrets_), ("labels", labels)):
        if value:
            body[key] = dict(value)
    if per_child is not None:
        body["per_child"] = [dict(c) for c in per_child]
    if name_prefix is not None:
        body["name_prefix"] = name_prefix
    if timeout_secs is not None:
        body["timeout_secs"] = int(timeout_secs)
    return body


class Snapshot(SnapshotInfo):
    """A checkpoint of a sandbox, stored by the daemon under a persistent id.

    A :class:`~sandfork.SnapshotInfo` (Tensorlake's fields: ``snapshot_id``,
    ``sandbox_id``, ``base_image``, ``status``, ``snapshot_type``,
    ``size_bytes``, ``rootfs_disk_bytes``, ``created_at`` ...) plus sandfork's
    (``id``, ``type``, ``source_sandbox_id``, ``name``, ``image``, ``cpus``,
    ``memory_mb``, ``disk_mb``, ``labels``) and methods. Start sandboxes from
    it with ``Sandbox.create(snapshot_id=snap.snapshot_id)`` or many at once
    with :meth:`fork`.
    """

    def __init__(self, doc: Dict[str, Any], client: Optional[Client] = None):
        self._client = client or Client()
        self._load(doc)

    def _load(self, doc: Dict[str, Any]) -> None:
        SnapshotInfo.__init__(self, **SnapshotInfo.fields_from_json(doc))
        self.raw = doc
        self.name: Optional[str] = doc.get("name")
        self.cpus: Optional[float] = doc.get("cpus")
        self.memory_mb: Optional[int] = doc.get("memory_mb")
        self.disk_mb: Optional[int] = doc.get("disk_mb")
        self.labels: Dict[str, str] = dict(doc.get("labels") or {})
        #: In the cluster's object store, so that any node restores it (docs/scale-out.md).
        self.published: bool = bool(doc.get("published"))

    def __repr__(self) -> str:
        kind = getattr(self.snapshot_type, "value", self.snapshot_type)
        return f"Snapshot(id={self.id!r}, type={kind!r}, source={self.sandbox_id!r}, size_bytes={self.size_bytes})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Snapshot) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    @property
    def id(self) -> str:
        """Alias of :attr:`snapshot_id`."""
        return self.snapshot_id

    @property
    def type(self) -> Any:
        """Alias of :attr:`snapshot_type`: ``CheckpointType.FILESYSTEM`` or ``MEMORY``."""
        return self.snapshot_type

    @property
    def source_sandbox_id(self) -> Optional[str]:
        """Alias of :attr:`sandbox_id`: the sandbox the snapshot was taken from."""
        return self.sandbox_id

    @property
    def image(self) -> Optional[str]:
        """Alias of :attr:`base_image`."""
        return self.base_image

    @classmethod
    def get(cls, snapshot_id: str, *, client: Optional[Client] = None) -> "Snapshot":
        """Looks a snapshot up by id.

        Raises:
            NotFoundError: No snapshot has that id (a ``RemoteAPIError`` with status 404).
        """
        client = client or Client()
        return cls(client.request_json("GET", f"/v1/snapshots/{seg(snapshot_id)}"), client)

    @classmethod
    def list(cls, source: Optional[str] = None, type: Union[None, str, CheckpointType] = None, *, published: bool = False, client: Optional[Client] = None) -> List["Snapshot"]:  # noqa: A002
        """Lists snapshots, optionally only those of sandbox ``source`` or of one ``type``;
        with ``published``, also those only the object store holds (other nodes')."""
        client = client or Client()
        kind = CheckpointType(type).value if type is not None else None
        query = {"source": source, "type": kind, "published": "true" if published else None}
        doc = client.request_json("GET", "/v1/snapshots", query=query)
        return TracedList(cls(d, client) for d in (doc or {}).get("snapshots", []))

    def publish(self) -> "Snapshot":
        """Puts the snapshot in the daemon's object store (its changed layers, its memory
        images, then its manifest), so that any node of the cluster restores it; returns
        once it is there. Daemons publish every snapshot by themselves
        (``publish_snapshots``); this waits for it.

        Raises:
            UnsupportedError: The daemon has no object store (``object_store``).
        """
        self._load(self._client.request_json("POST", f"/v1/snapshots/{seg(self.id)}/publish", unbounded=True))
        return self

    def refresh(self) -> "Snapshot":
        """Reloads this snapshot's description from the daemon."""
        self._load(self._client.request_json("GET", f"/v1/snapshots/{seg(self.id)}"))
        return self

    @classmethod
    def delete_by_id(cls, snapshot_id: str, *, everywhere: bool = False, client: Optional[Client] = None) -> None:
        """Deletes the snapshot with this id (``everywhere``: out of the object store too)."""
        query = {"everywhere": "true"} if everywhere else None
        (client or Client()).request("DELETE", f"/v1/snapshots/{seg(snapshot_id)}", query=query)

    @hybridmethod
    def delete(target: Any, snapshot_id: Optional[str] = None, *, everywhere: bool = False, client: Optional[Client] = None) -> None:  # noqa: N805
        """Deletes the snapshot: ``snap.delete()`` or ``Snapshot.delete(snapshot_id)``.

        Sandboxes already restored from it keep working; its storage is freed
        when the last of them goes. ``everywhere=True`` also removes it from the
        cluster's object store, so no node restores it again.
        """
        if isinstance(target, Snapshot):
            target.delete_by_id(target.id, everywhere=everywhere, client=target._client)
        else:
            if snapshot_id is None:
                raise TypeError("Snapshot.delete() needs a snapshot id when called on the class")
            target.delete_by_id(snapshot_id, everywhere=everywhere, client=client)

    @hybridmethod
    def fork(target: Any, *args: Any, **kwargs: Any) -> "ForkResult[Any]":  # noqa: N805
        """Starts ``count`` independent sandboxes from this snapshot in one call.

        ``snap.fork(count, env=None, secrets=None, labels=None, per_child=None,
        name_prefix=None, timeout_secs=None)``, or on the class ``Snapshot.fork(snapshot_id, count, ...)``.
        ``per_child`` is a list of ``{"env": ..., "labels": ...}``, one per child.

        Returns a :class:`ForkResult`: the list of sandboxes that started,
        with ``.errors`` for the children that failed.
        """
        if isinstance(target, Snapshot):
            return target._fork(*args, **kwargs)
        snapshot_id, *rest = args
        client = kwargs.pop("client", None) or Client()
        return Snapshot({"id": snapshot_id}, client)._fork(*rest, **kwargs)

    def _fork(
        self,
        count: int = 1,
        env: Optional[Mapping[str, str]] = None,
        secrets: Optional[Mapping[str, str]] = None,
        labels: Optional[Mapping[str, str]] = None,
        per_child: Optional[List[Mapping[str, Any]]] = None,
        name_prefix: Optional[str] = None,
        timeout_secs: Optional[int] = None,
    ) -> "ForkResult[Any]":
        body = fork_body(count, env, secrets, labels, per_child, name_prefix, timeout_secs)
        doc = self._client.request_json("POST", f"/v1/snapshots/{seg(self.id)}/fork", json_body=body, unbounded=True)
        result = ForkResult.from_json(doc, self._client, source_sandbox_id=self.source_sandbox_id)
        result.snapshot_id = result.snapshot_id or self.id
        return result

    def export(self, path: PathLike, *, base: Union["Snapshot", str, None] = None) -> int:
        """Streams the snapshot into one local file (for :meth:`import_` on another host).

        With ``base``, a snapshot this one descends from that the receiver already has
        (imported there before), the file carries only what differs from it: the disk
        layers above it and the memory pages not equal to its. Importing it then needs
        that snapshot, found by content.

        Returns the number of bytes written. The file appears complete or not at all.
        """
        target = os.fspath(path)
        tmp = os.path.join(os.path.dirname(os.path.abspath(target)), f".{os.path.basename(target)}.sandfork-{secrets.token_hex(6)}")
        url = f"/v1/snapshots/{seg(self.id)}/export"
        if base is not None:
            url += f"?base={seg(base if isinstance(base, str) else base.id)}"
        response = self._client.open("POST", url, unbounded=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        written = 0
        try:
            with os.fdopen(fd, "wb") as out:
                for chunk in response.iter_chunks():
                    out.write(chunk)
                    written += len(chunk)
            os.replace(tmp, target)
        except BaseException:
            response.close()
            _unlink_quietly(tmp)
            raise
        return written

    @classmethod
    def import_(cls, path: PathLike, *, client: Optional[Client] = None) -> "Snapshot":
        """Streams a file made by :meth:`export` to the daemon, which verifies and stores it.

        Raises:
            InvalidArgumentError: The file is corrupt or not a snapshot export.
        """
        client = client or Client()
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            headers = {"Content-Type": "application/octet-stream", "Content-Length": str(size)}
            doc = client.request_json_body("POST", "/v1/snapshots/import", body=f, headers=headers)
        return cls(doc, client)


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


@dataclass
class ForkChild(Generic[S]):
    """One child of a fork: its index and either its sandbox or why it failed."""

    index: int
    sandbox: Optional[S] = None
    error: Optional[errors.SandforkError] = None

    @property
    def ok(self) -> bool:
        """True when this child started."""
        return self.sandbox is not None


class ForkError(errors.SandforkError):
    """Raised by :meth:`ForkResult.raise_for_errors` when any child failed.

    ``.result`` is the :class:`ForkResult` (the children that did start are
    still running: terminate them or use them).
    """

    def __init__(self, result: "ForkResult[Any]"):
        failed = result.errors
        first = failed[0].error
        summary = f"{len(failed)} of {len(result.children)} forked children failed; first (index {failed[0].index}): {first.message if first else '?'}"
        super().__init__(summary, code=first.code if first else "fork_failed")
        self.result = result


@dataclass
class CopiedSandbox(CopiedSandboxResponse):
    """One child of a fork or copy, in Tensorlake's ``CopiedSandboxResponse`` shape
    (``sandbox_id``, ``status`` ``"running"`` or ``"failed"``, ``reason``, ``name``),
    plus its ``index`` and, when it started, its connected ``sandbox`` handle."""

    index: int = 0
    sandbox: Optional[SandboxHandle] = field(default=None, repr=False, compare=False)

    @property
    def id(self) -> str:
        """Alias of :attr:`sandbox_id`."""
        return self.sandbox_id


class ForkResult(TracedList[S]):
    """The outcome of a fork or copy: a list of the sandboxes that started.

    Also has Tensorlake's ``CopySandboxResponse`` shape: :attr:`source_sandbox_id`
    and :attr:`sandboxes` (one :class:`CopiedSandbox` per child, failed ones
    included). sandfork's view: :attr:`children` (every child with its index,
    sandbox or error), :attr:`errors`, :attr:`snapshot_id` (the snapshot the
    children came from). As a context manager it terminates every child on exit.
    """

    def __init__(self, children: List[ForkChild[S]], snapshot_id: Optional[str] = None, source_sandbox_id: Optional[str] = None):
        super().__init__(c.sandbox for c in children if c.sandbox is not None)
        self.children = children
        self.snapshot_id = snapshot_id
        self.source_sandbox_id = source_sandbox_id

    @classmethod
    def from_json(cls, doc: Dict[str, Any], client: Client, source_sandbox_id: Optional[str] = None) -> "ForkResult[Any]":
        """Decodes the daemon's ``{children: [...], snapshot_id?}`` fork answer."""
        children = [_child_from_json(c, client) for c in (doc or {}).get("children", [])]
        children.sort(key=lambda c: c.index)
        return cls(children, (doc or {}).get("snapshot_id"), source_sandbox_id)

    @property
    def sandboxes(self) -> List[CopiedSandbox]:
        """Every child in Tensorlake's ``CopiedSandboxResponse`` shape (failed ones
        have ``status == "failed"`` and the reason in ``reason``)."""
        out = []
        for c in self.children:
            if c.sandbox is not None:
                info = c.sandbox._info
                out.append(CopiedSandbox(sandbox_id=c.sandbox.id, status="running", name=info.name if info else None, index=c.index, sandbox=c.sandbox))
            else:
                reason = c.error.message if c.error is not None else "unknown error"
                out.append(CopiedSandbox(sandbox_id="", status="failed", reason=reason, index=c.index))
        return out

    @property
    def errors(self) -> List[ForkChild[S]]:
        """The children that failed, each with ``.index`` and ``.error``."""
        return [c for c in self.children if c.error is not None]

    @property
    def ok(self) -> bool:
        """True when every child started."""
        return not self.errors

    def raise_for_errors(self) -> "ForkResult[S]":
        """Raises :class:`ForkError` if any child failed; returns ``self`` otherwise."""
        if self.errors:
            raise ForkError(self)
        return self

    def terminate_all(self) -> None:
        """Terminates every child that started (ignoring ones already gone)."""
        for sandbox in self:
            try:
                sandbox.terminate()
            except errors.SandboxNotFoundError:
                pass

    def __enter__(self) -> "ForkResult[S]":
        return self

    def __exit__(self, *exc: object) -> None:
        self.terminate_all()


# Makes the handle of a started child: ``(info, client) -> Sandbox``. The sandbox module
# binds it (it sits above this one and imports it), so no import runs back up.
SandboxFactory = Callable[[SandboxInfo, Client], SandboxHandle]
_sandbox_factory: Optional[SandboxFactory] = None


def bind_sandbox_factory(factory: SandboxFactory) -> None:
    global _sandbox_factory
    _sandbox_factory = factory


def _child_from_json(doc: Dict[str, Any], client: Client) -> ForkChild[Any]:
    index = int(doc.get("index", 0))
    if doc.get("sandbox"):
        info = SandboxInfo.from_json(doc["sandbox"])
        assert _sandbox_factory is not None, "sandfork.sandbox binds the factory on import"
        return ForkChild(index, sandbox=_sandbox_factory(info, client))
    err = doc.get("error") or {}
    return ForkChild(index, error=errors.error_from_event(err if isinstance(err, dict) else {"message": str(err)}))
