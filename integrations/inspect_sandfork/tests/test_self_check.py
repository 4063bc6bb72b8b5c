"""inspect-ai's own conformance suite for sandbox providers
(``inspect_ai.util._sandbox.self_check``), run against sandfork sandboxes: a fork of a
memory checkpoint of the ``python`` image (the default path), and a fresh ``busybox``
sandbox without forking."""

from __future__ import annotations

from typing import Iterator, Tuple

import anyio
import pytest
from inspect_ai.util._sandbox.self_check import *  # noqa: F403  (the checks themselves)

from inspect_sandfork import SandforkSandboxEnvironment, SandforkSandboxEnvironmentConfig

pytestmark = pytest.mark.anyio

# Known differences of a configuration, keyed by check name.
XFAIL = {
    "busybox": {
        "test_cwd_custom": "the busybox image has no /usr/bin (the check lists /usr/bin/env)",
        "test_exec_as_user": "the busybox image's busybox has no adduser applet (the check creates a user with it)",
    },
}

CONFIGS = {
    "python-fork": lambda: SandforkSandboxEnvironmentConfig(image="python", memory_mb=1024),
    "busybox": lambda: SandforkSandboxEnvironmentConfig(image="busybox", fork=False, memory_mb=512),
}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def shared_env(request: pytest.FixtureRequest, daemon: object) -> Iterator[Tuple[str, SandforkSandboxEnvironment]]:
    name = request.param
    if name.startswith("python"):
        request.getfixturevalue("python_image")
    config = CONFIGS[name]()
    env_cls = SandforkSandboxEnvironment
    anyio.run(env_cls.task_init, "self-check", config)
    try:
        envs = anyio.run(env_cls.sample_init, "self-check", config, {})
        try:
            env = envs["default"]
            assert isinstance(env, SandforkSandboxEnvironment)
            yield name, env
        finally:
            anyio.run(env_cls.sample_cleanup, "self-check", config, envs, False)
    finally:
        anyio.run(env_cls.task_cleanup, "self-check", config, True)


@pytest.fixture
def sandbox_env(request: pytest.FixtureRequest, shared_env: Tuple[str, SandforkSandboxEnvironment]) -> SandforkSandboxEnvironment:
    name, env = shared_env
    reason = XFAIL.get(name, {}).get(request.node.originalname)
    if reason:
        request.applymarker(pytest.mark.xfail(reason=reason, strict=True))
    return env
