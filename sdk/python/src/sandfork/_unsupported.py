"""Tensorlake features sandfork does not have: the names exist and raise
``NotImplementedError`` (:class:`~sandfork.errors.FeatureNotSupportedError`) naming the feature."""

from __future__ import annotations

from typing import Any, List, Optional

from . import errors
from .models import FileSystem


def _pty() -> errors.FeatureNotSupportedError:
    return errors.not_supported("interactive terminals (PTY)", "run commands with run() or start_process(stdin_mode='pipe')")


class Pty:
    """Tensorlake's interactive terminal. Not supported: constructing one raises."""

    def __init__(self, *args: Any, **kwargs: Any):
        raise _pty()


class AsyncPty:
    """Tensorlake's async interactive terminal. Not supported: constructing one raises."""

    def __init__(self, *args: Any, **kwargs: Any):
        raise _pty()


class Desktop:
    """Tensorlake's remote desktop (VNC) client. Not supported: constructing one raises."""

    def __init__(self, *args: Any, **kwargs: Any):
        raise errors.not_supported("remote desktop (VNC)", plural=False)


def _fs() -> errors.FeatureNotSupportedError:
    return errors.not_supported("file systems", "copy files in with write_file() or upload_file()")


def create_file_system(name: str, description: Optional[str] = None) -> FileSystem:
    """Registers a file system. Not supported: raises ``NotImplementedError``."""
    raise _fs()


def list_file_systems() -> List[FileSystem]:
    """Lists registered file systems. Not supported: raises ``NotImplementedError``."""
    raise _fs()


def delete_file_system(file_system_id: str) -> None:
    """Deletes a registered file system. Not supported: raises ``NotImplementedError``."""
    raise _fs()
