"""Fixtures: a real sandfork daemon on a temporary data dir, started once per session.

Tests that need the daemon skip, with the reason, when it has not been built. On
teardown the daemon gets SIGTERM and the fixture checks that it left no container,
mount or loop device behind.
"""

from __future__ import annotations

from typing import Iterator

import pytest

from _daemon import Daemon, daemon_binary, implements_serve, start_daemon, tear_down, url_in_env, wait_healthy


@pytest.fixture(scope="session")
def daemon() -> Iterator[Daemon]:
    """The daemon, with ``SANDFORK_URL`` pointing at it for the whole session."""
    binary = daemon_binary()
    if binary is None:
        pytest.skip("the sandfork daemon is not built (cargo build -p sandfork, or set SANDFORK_BIN)")
    if not implements_serve(binary):
        pytest.skip(f"{binary} does not implement `serve --data-dir --socket` yet")
    d = start_daemon(binary)
    try:
        wait_healthy(d)
        with url_in_env(d):
            yield d
    finally:
        problems = tear_down(d)
        assert not problems, "after the tests, the daemon left behind:\n" + "\n".join(problems)


@pytest.fixture(scope="session")
def openapi(daemon: Daemon) -> dict:
    """The daemon's OpenAPI document."""
    from sandfork import Client

    return Client(url=daemon.url).request_json("GET", "/v1/openapi.json") or {}


@pytest.fixture(scope="session")
def checkpoint_routes(openapi: dict) -> None:
    """Skips unless the daemon serves the checkpoint, snapshot and fork routes."""
    paths = set((openapi.get("paths") or {}).keys())
    needed = ["/v1/sandboxes/{id}/checkpoint", "/v1/snapshots", "/v1/snapshots/{id}/fork"]
    missing = [p for p in needed if not _has_route(paths, p)]
    if missing:
        pytest.skip(f"the daemon does not serve the checkpoint routes yet (missing from /v1/openapi.json: {', '.join(missing)})")


def _has_route(paths: set, wanted: str) -> bool:
    """True when ``wanted`` is in ``paths``, whatever the path parameters are called."""
    shape = [seg if not seg.startswith("{") else "{}" for seg in wanted.split("/")]
    for path in paths:
        segs = [seg if not seg.startswith("{") else "{}" for seg in path.split("/")]
        if segs == shape:
            return True
    return False


@pytest.fixture(scope="module")
def sandbox(daemon: Daemon) -> Iterator["object"]:
    """One sandbox shared by the tests of a module."""
    from sandfork import Sandbox

    with Sandbox.create(memory_mb=256) as sb:
        yield sb
