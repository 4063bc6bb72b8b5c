"""sandfork as a sandbox client of the OpenAI Agents SDK.

``SandboxRunConfig(client=SandforkSandboxClient(), options=SandforkSandboxClientOptions(image="python"))``;
sessions start from an image or a sandfork snapshot, suspend and resume with their
memory, persist as memory checkpoints, and fork one per rollout
(``await client.fork(session, 8)``).
"""

from __future__ import annotations

from ._errors import SandforkForkError, SandforkProviderError
from ._sandbox import (
    BACKEND_ID,
    SandforkSandboxClient,
    SandforkSandboxClientOptions,
    SandforkSandboxSession,
    SandforkSandboxSessionState,
)

__version__ = "0.1.0"

__all__ = [
    "BACKEND_ID",
    "SandforkForkError",
    "SandforkProviderError",
    "SandforkSandboxClient",
    "SandforkSandboxClientOptions",
    "SandforkSandboxSession",
    "SandforkSandboxSessionState",
]
