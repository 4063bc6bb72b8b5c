"""The sandbox configuration of a task: ``sandbox=("sandfork", ...)``."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

from ._errors import SandforkConfigError

CONFIG_FILE_SUFFIXES = (".yaml", ".yml", ".json")


class SandforkSandboxEnvironmentConfig(BaseModel):
    """How the sandboxes of a task are made.

    Without ``dockerfile``, sandboxes start from ``image`` (a built-in image such as
    ``busybox`` or ``python``, an image built or imported on the daemon, or a registry
    reference). With ``dockerfile``, the image is built once by sandfork's builder (every
    step cached) and named ``image`` (default: ``inspect-<hash of the Dockerfile path>``).

    ``setup`` commands run once, then ``background`` commands are started and left
    running, then ``ready`` (a shell command) is retried until it succeeds (at most
    ``ready_timeout`` seconds); with ``fork`` (the default) that state — files, processes, memory — is
    checkpointed once and every sample gets its own fork of it. Without ``fork`` every
    sample gets a fresh sandbox that runs ``setup`` and ``background`` itself.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    image: Optional[str] = None
    dockerfile: Optional[str] = None
    build_args: Dict[str, str] = Field(default_factory=dict)
    cpus: Optional[float] = None
    memory_mb: Optional[int] = None
    disk_mb: Optional[int] = None
    allow_internet_access: bool = False
    env: Dict[str, str] = Field(default_factory=dict)
    working_dir: Optional[str] = None
    setup: List[str] = Field(default_factory=list)
    background: List[str] = Field(default_factory=list)
    ready: Optional[str] = None
    ready_timeout: float = 60.0
    fork: bool = True
    url: Optional[str] = None
    labels: Dict[str, str] = Field(default_factory=dict)

    def __hash__(self) -> int:
        # inspect keeps sandbox specs in sets; the dict and list fields are not hashable
        return hash(self.model_dump_json())


def resolve_config(config: Union[BaseModel, str, None]) -> SandforkSandboxEnvironmentConfig:
    """The task's configuration as a :class:`SandforkSandboxEnvironmentConfig`.

    ``None``: the defaults (the daemon's default image). A string is a path to a
    Dockerfile (a file named ``Dockerfile`` or ``*.Dockerfile``/``Dockerfile.*``), a
    YAML/JSON file holding the configuration, or else an image name. Relative paths are
    taken from the task's directory (inspect runs ``task_init`` there)."""
    if config is None:
        return SandforkSandboxEnvironmentConfig()
    if isinstance(config, SandforkSandboxEnvironmentConfig):
        return _absolute(config)
    if isinstance(config, BaseModel):
        try:
            return _absolute(SandforkSandboxEnvironmentConfig.model_validate(config.model_dump()))
        except Exception as e:
            raise SandforkConfigError(f"the sandfork sandbox cannot use a {type(config).__name__} configuration: {e}") from e
    if isinstance(config, dict):
        return _absolute(_validate(config, "the configuration"))
    if not isinstance(config, str) or not config:
        raise SandforkConfigError(f"the sandfork sandbox's configuration must be an image name, a Dockerfile or a config file, not {config!r}")
    name = os.path.basename(config)
    if name == "Dockerfile" or name.endswith(".Dockerfile") or name.startswith("Dockerfile."):
        path = Path(config).resolve()
        if not path.is_file():
            raise SandforkConfigError(f"the Dockerfile {config!r} does not exist (looked at {path})")
        return SandforkSandboxEnvironmentConfig(dockerfile=str(path))
    if name.endswith(CONFIG_FILE_SUFFIXES):
        return _absolute(_load_file(Path(config)), base=Path(config).resolve().parent)
    return SandforkSandboxEnvironmentConfig(image=config)


def _load_file(path: Path) -> SandforkSandboxEnvironmentConfig:
    try:
        text = path.read_text()
    except OSError as e:
        raise SandforkConfigError(f"cannot read the sandfork config file {str(path)!r}: {e}") from e
    try:
        if path.suffix == ".json":
            doc: Any = json.loads(text)
        else:
            import yaml

            doc = yaml.safe_load(text)
    except Exception as e:
        raise SandforkConfigError(f"the sandfork config file {str(path)!r} is not valid {path.suffix[1:].upper()}: {e}") from e
    if not isinstance(doc, dict):
        raise SandforkConfigError(f"the sandfork config file {str(path)!r} must hold a mapping of settings")
    return _validate(doc, f"the config file {str(path)!r}")


def _validate(doc: Dict[str, Any], where: str) -> SandforkSandboxEnvironmentConfig:
    try:
        return SandforkSandboxEnvironmentConfig.model_validate(doc)
    except Exception as e:
        raise SandforkConfigError(f"{where} is not a valid sandfork sandbox configuration: {e}") from e


def _absolute(config: SandforkSandboxEnvironmentConfig, base: Optional[Path] = None) -> SandforkSandboxEnvironmentConfig:
    if config.dockerfile is None:
        return config
    path = Path(config.dockerfile)
    if not path.is_absolute():
        path = (base or Path.cwd()) / path
    path = path.resolve()
    if not path.is_file():
        raise SandforkConfigError(f"the Dockerfile {config.dockerfile!r} does not exist (looked at {path})")
    return config.model_copy(update={"dockerfile": str(path)})
