"""The errors of the Harbor environment that are its own. Build failures are Harbor's
``SandboxBuildFailedError`` (a trial does not retry them)."""

from __future__ import annotations


class SandforkEnvironmentError(RuntimeError):
    """Base class of the errors this environment raises itself."""


class SandforkUnsupportedError(SandforkEnvironmentError, NotImplementedError):
    """The task or the job asks for something sandfork cannot serve; the message names it."""


class SandforkExecTimeoutError(SandforkEnvironmentError):
    """A command ran past its ``timeout_sec`` and was killed (Harbor's Docker environment
    raises a ``RuntimeError`` with the same message)."""


class SandforkConfigError(SandforkEnvironmentError, ValueError):
    """An environment kwarg (``--ek``) cannot be used; the message names it."""
