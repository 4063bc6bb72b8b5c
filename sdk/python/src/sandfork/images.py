"""Images: pulled from OCI registries, built, listed, inspected and removed.

``Sandbox.create(image="registry/repo:tag")`` pulls an image it does not have by itself;
:meth:`Image.pull` does it ahead of time, with credentials and progress.
"""

from __future__ import annotations

import fnmatch
import io
import json
import logging
import os
import re
import tarfile
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Union  # noqa: F401
from urllib.parse import quote

from . import errors
from ._hybrid import hybridmethod
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

    @classmethod
    def build(
        cls,
        context: Union[str, "os.PathLike[str]"],
        name: str,
        *,
        dockerfile: str = "Dockerfile",
        build_args: Optional[Mapping[str, str]] = None,
        on_progress: Optional[ProgressCallback] = None,
        client: Optional[Client] = None,
    ) -> "Image":
        """Builds image ``name`` from the Dockerfile ``dockerfile`` (a path in the build
        context directory ``context``); what ``.dockerignore`` names stays behind. Every
        RUN, COPY and ADD step is cached, so a rebuild reuses every step before the first
        that changed. Step lines and their output go to ``on_progress``."""
        client = client or Client()
        body = _context_tar(Path(context))
        query = {"name": name, "dockerfile": dockerfile, "build_args": json.dumps(dict(build_args or {}))}
        report = on_progress or (lambda line: log.info("build %s: %s", name, line))
        with client.open("POST", "/v1/images/build", query=query, body=body, headers={"Content-Type": "application/x-tar"}, unbounded=True) as stream:
            for event in stream.iter_json_lines():
                kind = event.get("type")
                if kind == "progress":
                    report(str(event.get("message", "")))
                elif kind == "done":
                    client._image_ready(name)
                    return cls.get(name, client=client)
                elif kind == "error":
                    raise errors.error_from_event(event)
        raise errors.ConnectionError(f"the daemon ended the build stream of {name} without a result")

    @classmethod
    def import_(cls, path: Union[str, "os.PathLike[str]"], name: Optional[str] = None, *, client: Optional[Client] = None) -> "Image":
        """Imports an image archive (``docker save`` output, an oci-archive) or an OCI
        layout directory, as ``name`` or under the name the archive gives it."""
        client = client or Client()
        p = Path(path)
        if p.is_dir():
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w") as t:
                t.add(p, arcname=".")
            data = buf.getvalue()
        else:
            data = p.read_bytes()
        path_q = "/v1/images/import" + (f"?name={quote(name, safe='')}" if name else "")
        doc = client.request_json_body("POST", path_q, body=data, headers={"Content-Type": "application/x-tar"})
        client._image_ready(str(doc["name"]))
        return cls(doc, client)

    def export(self, path: Union[str, "os.PathLike[str]"], *, format: str = "oci-archive") -> int:
        """Writes the image at ``path`` as an ``oci-archive`` (``podman load``, skopeo) or a
        ``docker-archive`` (``docker load``); returns its size in bytes."""
        if format not in ("oci-archive", "docker-archive"):
            raise ValueError(f"unknown export format {format!r} (oci-archive or docker-archive)")
        tmp = Path(str(path) + ".partial")
        size = 0
        url = f"/v1/images/{seg(self.name)}/export?format={format}"
        try:
            with self._client.open("GET", url, unbounded=True) as stream, open(tmp, "wb") as out:
                for chunk in stream.iter_chunks():
                    out.write(chunk)
                    size += len(chunk)
            os.replace(tmp, path)
        finally:
            if tmp.exists():
                tmp.unlink()
        return size

    def push(self, reference: str, *, username: Optional[str] = None, password: Optional[str] = None) -> str:
        """Pushes the image to registry ``reference``; returns the canonical reference."""
        if (username is None) != (password is None):
            raise ValueError("username and password go together")
        body: Dict[str, Any] = {"name": self.name, "reference": reference}
        if username is not None:
            body.update(username=username, password=password)
        return str(self._client.request_json("POST", "/v1/images/push", json_body=body)["reference"])

    @hybridmethod
    def delete(target: Any, name: Optional[str] = None, *, client: Optional[Client] = None) -> None:  # noqa: N805
        """Removes the image name (sandboxes using it keep running): ``image.delete()`` or
        ``Image.delete("app")``."""
        if isinstance(target, Image):
            target._client.request_json("DELETE", f"/v1/images/{seg(target.name)}")
            return
        if name is None:
            raise TypeError("Image.delete() needs an image name when called on the class")
        (client or Client()).request_json("DELETE", f"/v1/images/{seg(name)}")


def _glob_regex(pattern: str) -> "re.Pattern[str]":
    """A .dockerignore glob as a regex: ``**`` any path, ``*`` and ``?`` within one part."""
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out + r"\Z")


def _ignored(rules: List[tuple], rel: str) -> bool:
    """Docker's rules: a pattern matching the path or a directory above it leaves it out,
    ``!`` takes it back, the last matching rule wins."""
    parts = rel.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    out = False
    for regex, keep in rules:
        if any(regex.match(p) for p in prefixes):
            out = not keep
    return out


def _context_tar(root: Path) -> bytes:
    """The build context at ``root`` as a tar, without what its .dockerignore names."""
    rules: List[tuple] = []
    ignore = root / ".dockerignore"
    if ignore.exists():
        for line in ignore.read_text().splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            keep = line.startswith("!")
            pattern = line[1:].strip() if keep else line
            pattern = pattern[2:] if pattern.startswith("./") else pattern
            rules.append((_glob_regex(pattern.strip("/")), keep))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        for dirpath, dirnames, filenames in os.walk(root):
            rel_dir = os.path.relpath(dirpath, root)
            for name in sorted(dirnames + filenames):
                rel = name if rel_dir == "." else f"{rel_dir}/{name}"
                if _ignored(rules, rel):
                    if name in dirnames:
                        dirnames.remove(name)
                    continue
                full = os.path.join(dirpath, name)
                t.add(full, arcname=rel, recursive=False)
    return buf.getvalue()
