"""Test helpers shared by the integration suites: a real sandfork daemon for the session
(the SDK suite's own fixture code, sdk/python/tests/_daemon.py), the built-in ``python``
image built once in it, and a per-test check that every sandbox and snapshot a test made
is gone when it ends (cleaned up here when the test did not, and then the test fails).

Each suite's conftest.py puts this directory and the SDK's test directory on sys.path.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Iterator, List, Set, Tuple

REPO = Path(__file__).resolve().parents[2]
BUILD_TIMEOUT = 900.0


def daemon_session() -> Iterator[object]:
    """Starts the daemon with ``SANDFORK_URL`` pointing at it; yields the ``Daemon``.
    Skips (with the reason) when the daemon binary is not built."""
    import pytest
    from _daemon import daemon_binary, implements_serve, start_daemon, tear_down, url_in_env, wait_healthy

    os.environ.setdefault("CARGO_TARGET_DIR", "/var/cache/sandfork/ci-target")
    binary = daemon_binary()
    if binary is None:
        pytest.skip("the sandfork daemon is not built (cargo build -p sandfork with CARGO_TARGET_DIR, or set SANDFORK_BIN)")
    if not implements_serve(binary):
        pytest.skip(f"{binary} does not implement `serve --data-dir --socket`")
    daemon = start_daemon(binary)
    try:
        wait_healthy(daemon)
        with url_in_env(daemon):
            yield daemon
    finally:
        problems = tear_down(daemon)
        assert not problems, "after the tests, the daemon left behind:\n" + "\n".join(problems)


def ensure_image(name: str) -> str:
    """Builds the built-in image ``name`` in the session's daemon if it is missing."""
    from sandfork import Client

    client = Client()
    started = time.monotonic()
    last: dict = {}
    with client.open("POST", f"/v1/images/{name}/ensure", unbounded=True) as stream:
        for event in stream.iter_json_lines():
            last = event
    assert last.get("type") == "done", f"the {name} image could not be built: {last}"
    took = time.monotonic() - started
    if took > 1:
        print(f"\nbuilt the {name} image in {took:.1f}s")
    assert took < BUILD_TIMEOUT
    return name


def live_objects() -> Tuple[Set[str], Set[str]]:
    """Ids of the live sandboxes and of the snapshots the daemon has."""
    from sandfork import Sandbox, Snapshot

    sandboxes = {s.id for s in Sandbox.list() if str(getattr(s.status, "value", s.status)) not in ("terminated", "failed")}
    snapshots = {s.snapshot_id for s in Snapshot.list()}
    return sandboxes, snapshots


def clean_up_since(before: Tuple[Set[str], Set[str]]) -> List[str]:
    """Terminates the sandboxes and deletes the snapshots made since ``before``; returns
    what it had to clean."""
    from sandfork import Sandbox, Snapshot, errors

    sandboxes, snapshots = live_objects()
    left = [f"sandbox {i}" for i in sorted(sandboxes - before[0])] + [f"snapshot {i}" for i in sorted(snapshots - before[1])]
    for sid in sandboxes - before[0]:
        try:
            Sandbox.connect(sid).terminate()
        except errors.SandboxError:
            pass
    for snap_id in snapshots - before[1]:
        try:
            Snapshot.get(snap_id).delete()
        except errors.SandboxError:
            pass
    return left


def no_leaks() -> Iterator[None]:
    """Per-test fixture body: whatever the test leaves running is cleaned up, and a test
    that passed but left something fails."""
    import pytest

    before = live_objects()
    yield
    left = clean_up_since(before)
    if left:
        pytest.fail("the test left these behind (now cleaned up): " + ", ".join(left), pytrace=False)


class OffLoopbackError(OSError):
    """A test tried to reach an address off this machine's loopback."""


def loopback_only() -> None:
    """Refuses, in this process, every name lookup and connection that is not to the
    loopback range (Unix sockets are untouched): no test reaches a model API or any host
    off the machine, and one that tries fails naming the address."""
    import ipaddress
    import socket

    def loopback(host: object) -> bool:
        if host in (None, "", "localhost"):
            return True
        try:
            return ipaddress.ip_address(str(host).split("%")[0]).is_loopback
        except ValueError:
            return False

    real_getaddrinfo = socket.getaddrinfo
    real_connect = socket.socket.connect
    real_connect_ex = socket.socket.connect_ex

    def getaddrinfo(host, *args, **kwargs):  # type: ignore[no-untyped-def]
        if not loopback(host.decode() if isinstance(host, bytes) else host):
            raise OffLoopbackError(f"the tests reach only loopback; refused a lookup of {host!r}")
        return real_getaddrinfo(host, *args, **kwargs)

    def check(sock: socket.socket, address: object) -> None:
        if sock.family in (socket.AF_INET, socket.AF_INET6) and isinstance(address, tuple) and not loopback(address[0]):
            raise OffLoopbackError(f"the tests reach only loopback; refused a connection to {address!r}")

    def connect(self, address):  # type: ignore[no-untyped-def]
        check(self, address)
        return real_connect(self, address)

    def connect_ex(self, address):  # type: ignore[no-untyped-def]
        check(self, address)
        return real_connect_ex(self, address)

    socket.getaddrinfo = getaddrinfo  # type: ignore[assignment]
    socket.socket.connect = connect  # type: ignore[method-assign]
    socket.socket.connect_ex = connect_ex  # type: ignore[method-assign]
