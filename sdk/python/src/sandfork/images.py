"""Images: pulled from OCI registries, built, listed, inspected and removed.

``Sandbox.create(image="registry/repo:tag")`` pulls an image it does not have by itself;
:meth:`Image.pull` does it ahead of time, with credentials and progress.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Dict, List, Optional

from . import errors
from ._transport import Client, seg

log = logging.getLogger("sandfork")

ProgressCallback = Callable[[str], None]


class Image:
    """An image the daemon holds: its record, config and origin."""

    def __init__(self, doc: Dict[str, Any], client: Optional[Client] = None):
        self._client = client or Client()
        self._doc = doc

    def __repr__(self) -> str:
        return f"Image({self.name!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Image) and other.name == self.name

    def __hash__(self) -> int:
        return hash(self.name)

    @property
    def name(self) -> str:
        """The name; a pulled image's is its canonical reference."""
        return str(self._doc["name"])

    @property
    def size_bytes(self) -> int:
        return int(self._doc.get("size_bytes", 0))

    @property
    def builder(self) -> str:
        """``pull`` for a pulled image, else the builder that made it."""
        return str(self._doc.get("builder", ""))

    @property
    def source(self) -> Optional[str]:
        return self._detail("source")

    @property
    def digest(self) -> Optional[str]:
        return self._detail("digest")

    @property
    def env(self) -> Dict[str, str]:
        return dict(self._detail("env") or {})

    @property
    def working_dir(self) -> str:
        return str(self._detail("working_dir") or "/")

    @property
    def user(self) -> Optional[str]:
        return self._detail("user")

    @property
    def entrypoint(self) -> List[str]:
        return list(self._detail("entrypoint") or [])

    @property
    def cmd(self) -> List[str]:
        return list(self._detail("cmd") or [])

    @property
    def exposed_ports(self) -> List[str]:
        return list(self._detail("exposed_ports") or [])

    @property
    def labels(self) -> Dict[str, str]:
        return dict(self._detail("labels") or {})

    def _detail(self, key: str) -> Any:
        if "working_dir" not in self._doc:  # a list entry: fetch the details once
            self._doc = self._client.request_json("GET", f"/v1/images/{seg(self.name)}")
        return self._doc.get(key)

    @classmethod
    def pull(
        cls,
        reference: str,
        *,
        username: Optional[str] = None,
        password: Optional[str] = None,
        on_progress: Optional[ProgressCallback] = None,
        client: Optional[Client] = None,
    ) -> "Image":
        """Pulls ``reference`` (``python:3.12-slim``, ``host:5000/team/app:v1``,
        ``…@sha256:…``) from its registry; progress lines go to ``on_progress`` (else the
        ``sandfork`` logger at INFO). Raises :class:`~sandfork.errors.NotFoundError` for
        an unknown image and a ``registry_error`` for an unreachable registry, refused
        credentials or a blob that fails verification."""
        client = client or Client()
        if (username is None) != (password is None):
            raise ValueError("username and password go together")
        body: Dict[str, Any] = {"reference": reference}
        if username is not None:
            body.update(username=username, password=password)
        report = on_progress or (lambda line: log.info("pull %s: %s", reference, line))
        with client.open("POST", "/v1/images/pull", json_body=body, unbounded=True) as stream:
            for event in stream.iter_json_lines():
                kind = event.get("type")
                if kind == "progress":
                    report(str(event.get("message", "")))
                elif kind == "done":
                    client._image_ready(str(event["image"]["name"]))
                    return cls.get(str(event["image"]["name"]), client=client)
                elif kind == "error":
                    raise errors.error_from_event(event)
        raise errors.ConnectionError(f"the daemon ended the pull stream of {reference} without a result")

    @classmethod
    def from_snapshot(cls, snapshot_id: str, name: str, *, client: Optional[Client] = None) -> "Image":
        """Makes snapshot ``snapshot_id``'s disk image ``name``: a template for new
        sandboxes (its source image's config, the snapshot's env) that outlives the snapshot."""
        client = client or Client()
        doc = client.request_json("POST", "/v1/images/from-snapshot", json_body={"name": name, "snapshot_id": snapshot_id})
        client._image_ready(name)
        return cls(doc, client)

    @classmethod
    def get(cls, name: str, *, client: Optional[Client] = None) -> "Image":
        """Image ``name`` (a reference may be given in short form)."""
        client = client or Client()
        return cls(client.request_json("GET", f"/v1/images/{seg(name)}"), client)

    @classmethod
    def list(cls, *, client: Optional[Client] = None) -> List["Image"]:
        client = client or Client()
        doc = client.request_json("GET", "/v1/images") or {}
        return [cls(i, client) for i in doc.get("images", [])]

    def delete(self) -> None:
        """Removes the image name (sandboxes using it keep running)."""
        self._client.request_json("DELETE", f"/v1/images/{seg(self.name)}")
