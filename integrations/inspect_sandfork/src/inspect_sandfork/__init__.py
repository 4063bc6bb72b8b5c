"""sandfork as an inspect-ai sandbox provider: ``sandbox=("sandfork", config)``.

A task's sandbox is set up once (image or Dockerfile, ``setup`` commands, ``background``
processes), checkpointed with its memory, and every sample runs in its own fork of it.
"""

from __future__ import annotations

from ._config import SandforkSandboxEnvironmentConfig, resolve_config
from ._environment import SANDBOX_TYPE, SandforkSandboxEnvironment
from ._errors import SandforkConfigError, SandforkImageBuildError, SandforkProviderError, SandforkSetupError
from . import _registry  # noqa: F401  (registers the sandbox type)

__version__ = "0.1.0"

__all__ = [
    "SANDBOX_TYPE",
    "SandforkConfigError",
    "SandforkImageBuildError",
    "SandforkProviderError",
    "SandforkSandboxEnvironment",
    "SandforkSandboxEnvironmentConfig",
    "SandforkSetupError",
    "resolve_config",
]
