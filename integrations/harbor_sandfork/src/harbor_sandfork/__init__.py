"""sandfork as a Harbor environment: ``harbor run --env harbor_sandfork:SandforkEnvironment``.

Each trial runs in a sandfork sandbox built from the task's ``environment/Dockerfile`` by
sandfork's builder; with ``--ek fork=true`` the first trial of a task checkpoints its
started sandbox with its memory and every further trial restores that checkpoint.
"""

from ._environment import ENVIRONMENT_TYPE, LABEL, SandforkEnvironment
from ._errors import SandforkConfigError, SandforkEnvironmentError, SandforkExecTimeoutError, SandforkUnsupportedError
from ._images import load_base_images, map_image, rewrite_dockerfile
from ._templates import delete_snapshots

__all__ = [
    "ENVIRONMENT_TYPE",
    "LABEL",
    "SandforkConfigError",
    "SandforkEnvironment",
    "SandforkEnvironmentError",
    "SandforkExecTimeoutError",
    "SandforkUnsupportedError",
    "delete_snapshots",
    "load_base_images",
    "map_image",
    "rewrite_dockerfile",
]
