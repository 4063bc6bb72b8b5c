"""A second daemon, on loopback TCP with a bearer token and an admission cap of one sandbox:
the token is sent and refused when wrong; a create over the cap is refused with 429."""

from __future__ import annotations

import shutil
import socket
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

import sandfork
from sandfork import Client, Sandbox

from _daemon import Daemon, clean_up_after, daemon_binary, implements_serve, leaks_of, start_daemon, wait_healthy

pytestmark = pytest.mark.daemon

TOKEN = "sdk-test-token-0123456789"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def tcp_daemon() -> Iterator[Daemon]:
    binary = daemon_binary()
    if binary is None or not implements_serve(binary, "--listen", "--token-file", "--max-sandboxes"):
        pytest.skip("no daemon binary with `serve --listen --token-file --max-sandboxes` is built")
    root = Path(tempfile.mkdtemp(prefix="sfsdk-tcp-"))
    token_file = root / "token"
    token_file.write_text(TOKEN + "\n")
    port = _free_port()
    args = ["--listen", f"127.0.0.1:{port}", "--token-file", str(token_file), "--max-sandboxes", "1"]
    d = start_daemon(binary, args, root=root)
    d.url, d.token = f"http://127.0.0.1:{port}", TOKEN
    try:
        wait_healthy(d)
        yield d
    finally:
        problems = clean_up_after(d)
        if not leaks_of(d):
            shutil.rmtree(root, ignore_errors=True)
        assert not problems, "the second daemon left behind:\n" + "\n".join(problems)


def test_token_is_required_and_accepted(tcp_daemon: Daemon) -> None:
    good = Client(url=tcp_daemon.url, token=TOKEN)
    assert good.request_json("GET", "/v1/health")["status"] == "ok"
    assert Sandbox.list(client=good) == []
    for bad in (Client(url=tcp_daemon.url, token="wrong"), Client(url=tcp_daemon.url, token="")):
        with pytest.raises(sandfork.AuthError) as info:
            Sandbox.list(client=bad)
        assert info.value.status == 401 and info.value.message


def test_token_from_environment(tcp_daemon: Daemon, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDFORK_URL", tcp_daemon.url)
    monkeypatch.setenv("SANDFORK_TOKEN", TOKEN)
    assert Sandbox.list() == []
    with pytest.raises(sandfork.SandboxNotFoundError):
        Sandbox.connect("nope")


def test_admission_refuses_over_the_cap(tcp_daemon: Daemon) -> None:
    client = Client(url=tcp_daemon.url, token=TOKEN)
    with Sandbox.create(memory_mb=64, client=client) as first:
        with pytest.raises(sandfork.CapacityError) as info:
            Sandbox.create(memory_mb=64, client=client)
        assert info.value.status == 429 and info.value.message
        assert [s.id for s in Sandbox.list(client=client)] == [first.id], "nothing half-created"
        assert first.run("echo", ["still fine"]).stdout == "still fine"
    with Sandbox.create(memory_mb=64, client=client) as again:
        assert again.run("true").exit_code == 0
