"""Tensorlake's ``tensorlake.sandbox.exceptions`` module path; the classes live in :mod:`sandfork.errors`."""

from .errors import (  # noqa: F401
    PoolInUseError,
    PoolNotFoundError,
    RemoteAPIError,
    SandboxConnectionError,
    SandboxError,
    SandboxException,
    SandboxNotFoundError,
)
