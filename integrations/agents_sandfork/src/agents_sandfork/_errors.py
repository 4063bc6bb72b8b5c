"""The errors of the Agents SDK provider that are its own (everything else is the SDK's
own sandbox errors: ExecTimeoutError, ExecTransportError, WorkspaceReadNotFoundError, ...)."""

from __future__ import annotations


class SandforkProviderError(RuntimeError):
    """Base class of the errors this provider raises itself."""


class SandforkForkError(SandforkProviderError):
    """Forking a session failed (names the sandbox and why; no fork is left running)."""
