"""Fixtures of the Agents SDK provider's tests: a real sandfork daemon for the session,
run with the real openai-agents package (installed by integrations/run_tests.py, `make
test-integrations`); every test must leave no sandbox or snapshot behind. No model is
called: the tests drive the client and sessions directly, and run an agent on the SDK's
own scripted test model."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path[:0] = [str(REPO / "integrations" / "_testing"), str(REPO / "sdk" / "python" / "tests")]

import sandfork_testing  # noqa: E402

# No test talks to anything but this machine's loopback (and the daemon's Unix socket).
sandfork_testing.loopback_only()


@pytest.fixture(scope="session", autouse=True)
def no_tracing() -> None:
    from agents import set_tracing_disabled

    set_tracing_disabled(True)


@pytest.fixture(scope="session")
def daemon() -> Iterator[object]:
    yield from sandfork_testing.daemon_session()


@pytest.fixture
def no_leaks(daemon: object) -> Iterator[None]:
    yield from sandfork_testing.no_leaks()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
