"""The task's image: ``environment/Dockerfile`` built by sandfork's builder (every step
cached by the daemon), or the task's ``docker_image``; base images renamed through a
mapping first, for hosts that reach no registry (``FROM python:3.12-slim`` → the built-in
``python``)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Union

from harbor.environments.base import SandboxBuildFailedError
from sandfork import Client, Image
from sandfork import errors as sf_errors

from ._errors import SandforkConfigError

BASE_IMAGES_ENV = "HARBOR_SANDFORK_BASE_IMAGES"
# `FROM [--flag=value ...] image [AS name]`, the instruction case-insensitive.
_FROM = re.compile(r"^(\s*FROM\s+(?:--\S+\s+)*)(\S+)(.*)$", re.IGNORECASE)


def load_base_images(value: Union[None, str, Mapping[str, str]]) -> Dict[str, str]:
    """The base-image mapping: the ``base_images`` kwarg (a mapping, a JSON object, or the
    path of a JSON file holding one), else ``$HARBOR_SANDFORK_BASE_IMAGES`` (the same)."""
    if value is None:
        value = os.environ.get(BASE_IMAGES_ENV) or None
    if value is None:
        return {}
    if isinstance(value, Mapping):
        doc: object = dict(value)
    else:
        text = str(value).strip()
        if not text.startswith("{"):
            try:
                text = Path(text).read_text()
            except OSError as e:
                raise SandforkConfigError(f"base_images: cannot read the mapping file {value!r}: {e}") from e
        try:
            doc = json.loads(text)
        except ValueError as e:
            raise SandforkConfigError(f"base_images is not a JSON object of image names: {e}") from e
    if not isinstance(doc, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in doc.items()):
        raise SandforkConfigError("base_images must map image references to sandfork image names (strings)")
    return {k: v for k, v in doc.items() if not k.startswith("_")}


def map_image(reference: str, mapping: Mapping[str, str]) -> str:
    """``reference`` renamed by ``mapping``: an exact match first, then its repository
    without the tag (``python`` maps every ``python:*``); else unchanged."""
    if reference in mapping:
        return mapping[reference]
    repository = reference.split("@", 1)[0]
    if ":" in repository.rsplit("/", 1)[-1]:
        repository = repository.rsplit(":", 1)[0]
    return mapping.get(repository, reference)


def rewrite_dockerfile(text: str, mapping: Mapping[str, str]) -> str:
    """The Dockerfile with each FROM's image renamed by ``mapping``."""
    out: List[str] = []
    for line in text.splitlines(keepends=True):
        m = _FROM.match(line.rstrip("\r\n"))
        if m:
            newline = line[len(line.rstrip("\r\n")) :]
            line = m.group(1) + map_image(m.group(2), mapping) + m.group(3) + newline
        out.append(line)
    return "".join(out)


def image_name(environment_name: str, environment_id: str, dockerfile: str) -> str:
    """The name of a task's built image: stable for the same environment directory and
    the same rewritten Dockerfile, so a later trial or run reuses it."""
    digest = hashlib.sha256((environment_id + "\0" + dockerfile).encode()).hexdigest()[:16]
    short = re.sub(r"[^a-z0-9._-]+", "-", environment_name.lower()).strip("-.")[:40] or "task"
    return f"harbor-{short}-{digest}"


def image_exists(client: Client, name: str) -> bool:
    try:
        Image.get(name, client=client)
    except sf_errors.NotFoundError:
        return False
    return True


def build(client: Client, environment_dir: Path, name: str, dockerfile_text: str) -> List[str]:
    """Builds ``name`` from a copy of ``environment_dir`` whose Dockerfile is
    ``dockerfile_text``; returns the build's progress lines. A failed build raises
    Harbor's ``SandboxBuildFailedError`` with the daemon's message and the last lines."""
    lines: List[str] = []
    with tempfile.TemporaryDirectory(prefix="harbor-sandfork-") as tmp:
        context = Path(tmp) / "context"
        shutil.copytree(environment_dir, context, symlinks=True)
        (context / "Dockerfile").write_text(dockerfile_text)
        try:
            Image.build(context, name, on_progress=lines.append, client=client)
        except sf_errors.SandboxError as e:
            tail = "\n".join(lines[-20:])
            raise SandboxBuildFailedError(
                f"sandfork could not build {environment_dir / 'Dockerfile'}: {e.message or e}" + (f"\n{tail}" if tail else "")
            ) from e
    return lines


def read_dockerfile(environment_dir: Path) -> Optional[str]:
    path = environment_dir / "Dockerfile"
    return path.read_text() if path.is_file() else None
