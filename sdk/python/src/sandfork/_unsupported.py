"""Tensorlake features sandfork does not have: the names exist and raise
``NotImplementedError`` (:class:`~sandfork.errors.FeatureNotSupportedError`) naming the feature."""

from __future__ import annotations

from typing import Any, List, Optional

from . import errors
from .models import FileSystem


class Desktop:
    """Tensorlake's remote desktop (VNC) client. Not supported: constructing one raises."""

    def __init__(self, *args: Any, **kwargs: Any):
        raise errors.not_supported("remote desktop (VNC)", plural=False)


def create_file_system(name: str, description: Optional[str] = None) -> FileSystem:
    """Creates a file system: in sandfork, named volume ``name`` (1 GiB; see
    :class:`~sandfork.volumes.Volume` for other sizes). ``description`` is not kept."""
    from .volumes import Volume

    v = Volume.create(name)
    return FileSystem(id=v.name, name=v.name, status="ready", created_at=v._doc.get("created_at"))


def list_file_systems() -> List[FileSystem]:
    """The named volumes, as file systems."""
    from .volumes import Volume

    return [FileSystem(id=v.name, name=v.name, status="ready", created_at=v._doc.get("created_at")) for v in Volume.list()]


def delete_file_system(file_system_id: str) -> None:
    """Deletes named volume ``file_system_id`` and its data (409 while a sandbox mounts it)."""
    from .volumes import Volume

    Volume.get(file_system_id).delete()
