"""A second daemon, on loopback TCP with a bearer token and an admission cap of one sandbox:
the token is sent and refused when wrong; a create over the cap is refused with 429."""

from __future__ import annotations

import shutil
import time
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


def test_ports_over_tcp_with_the_api_token_and_out_of_reach_of_sandboxes(tcp_daemon: Daemon) -> None:
    import urllib.error
    import urllib.request

    client = Client(url=tcp_daemon.url, token=TOKEN)
    with Sandbox.create(memory_mb=64, client=client, allow_internet_access=True) as sb:
        sb.start_process("httpd", ["-f", "-p", "127.0.0.1:8000", "-h", "/etc"])
        port = tcp_daemon.url.rsplit(":", 1)[1]
        base = f"{tcp_daemon.url}/v1/sandboxes/{sb.id}/ports/8000/hostname"

        def fetch(url: str, headers: dict) -> int:
            try:
                with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=20) as r:
                    return r.status
            except urllib.error.HTTPError as e:
                return e.code

        deadline = time.monotonic() + 10
        while fetch(base, {"Authorization": f"Bearer {TOKEN}"}) != 200:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        # Without the API token the gateway still answers (with its own 401), not the API's.
        assert fetch(base, {}) == 401
        assert fetch(base, {"Authorization": "Bearer wrong"}) == 401
        assert fetch(sb.get_url(8000, "/hostname"), {}) == 200
        # Host-based routing on the TCP listener.
        host = f"8000-{sb.id}.localhost:{port}"
        assert fetch(f"http://127.0.0.1:{port}/hostname", {"Host": host, "X-Sandfork-Access-Token": sb.port_token()}) == 200
        # From inside, the daemon's listener is out of reach: the sandbox's loopback is its
        # own, and the host's addresses are dropped.
        # The probe tells open from closed: the sandbox's own server answers it.
        control = sb.run("sh", ["-c", "nc -w 2 127.0.0.1 8000 </dev/null && echo open || echo closed"])
        assert control.stdout.strip() == "open"
        probe = sb.run("sh", ["-c", f"nc -w 2 127.0.0.1 {port} </dev/null && echo open || echo closed"])
        assert probe.stdout.strip() == "closed"
        address = (sb.info().raw.get("network") or {}).get("address")
        assert address, "a sandbox with internet access has an address"
        net, last = address.rsplit(".", 1)
        host_side = f"{net}.{int(last) - 1}"
        probe = sb.run("sh", ["-c", f"nc -w 2 {host_side} {port} </dev/null && echo open || echo closed"])
        assert probe.stdout.strip() == "closed"
