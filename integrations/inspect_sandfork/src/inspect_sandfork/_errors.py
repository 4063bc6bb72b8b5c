"""The errors of the inspect-ai provider that are its own (everything else raises the
exceptions inspect's ``SandboxEnvironment`` contract names: ``FileNotFoundError``,
``PermissionError``, ``IsADirectoryError``, ``TimeoutError``, ``OutputLimitExceededError``,
``SandboxUnavailableError``)."""

from __future__ import annotations


class SandforkProviderError(RuntimeError):
    """Base class of the errors this provider raises itself."""


class SandforkConfigError(SandforkProviderError, ValueError):
    """The task's sandbox configuration cannot be used (names the field and why)."""


class SandforkImageBuildError(SandforkProviderError):
    """Building the task's Dockerfile failed; the message names the failing step."""


class SandforkSetupError(SandforkProviderError):
    """A ``setup`` command of the configuration exited non-zero (names it, with its output)."""
