"""TCP connections over loopback carry on in every fork; connections leaving the sandbox close.

A source sandbox (image `python`) runs a server on 127.0.0.1 (and ::1 where the sandbox
has it) and a client holding an established connection to each (``programs/looptcp.py``),
with one line queued each way in each connection. The client also holds a connection to
a listener outside the sandbox, in a network namespace of the test's own reached through
the sandbox's interface (198.19.254.0/24: the test starts a daemon of its own that lets
``allow_out`` open that part of the guarded test networks); and a host process
connects to the server from inside the sandbox's network namespace, over loopback, as the
daemon's port gateway does. A memory checkpoint is forked twice.

In every fork and in the source, each loopback connection first delivers its queued
lines, then carries a new line each way. The connection to the outside listener and the
host's connection come back closed in the forks (end-of-file, then EPIPE) and carry on in
the source only: the outside ends receive the source's lines and no fork's.
"""

from __future__ import annotations

import ctypes
import json
import os
import socket
import subprocess
import shutil
import threading
from pathlib import Path
from typing import Callable, Dict, Iterator, List, TypeVar

import pytest

from _daemon import Daemon, daemon_binary, implements_serve, start_daemon, tear_down, url_in_env, wait_healthy
from sandfork import CheckpointType, Client, Sandbox

pytestmark = [pytest.mark.root, pytest.mark.checkpoint]

PROGRAMS = Path(__file__).parent / "programs"
SERVER_PORT = 7201  # looptcp.PORT
OUTSIDE_PORT = 7301
OUTSIDE_NET = "198.19.254.0/24"
CLONE_NEWNET = 0x40000000
T = TypeVar("T")


def in_netns(path: str, fn: Callable[[], T]) -> T:
    """Runs ``fn`` on a thread of its own that first enters the network namespace at
    ``path``; sockets it makes stay in that namespace."""
    out: Dict[str, object] = {}

    def run() -> None:
        try:
            fd = os.open(path, os.O_RDONLY)
            try:
                if ctypes.CDLL(None, use_errno=True).setns(fd, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), f"setns {path}")
            finally:
                os.close(fd)
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - raised again by the caller
            out["error"] = e

    t = threading.Thread(target=run)
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]  # type: ignore[misc]
    return out["value"]  # type: ignore[return-value]


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@pytest.fixture
def own_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """A daemon whose sandboxes may be given ``OUTSIDE_NET`` in ``allow_out``."""
    if os.geteuid() != 0:
        pytest.skip("needs root (runc, loop devices, CRIU)")
    if shutil.which("criu") is None:
        pytest.skip("needs CRIU >= 4.2 (scripts/setup installs it)")
    binary = daemon_binary()
    if binary is None or not implements_serve(binary, "--config"):
        pytest.skip("the sandfork daemon is not built (cargo build -p sandfork, or set SANDFORK_BIN)")
    config = Path(tmp_path_factory.mktemp("looptcp")) / "sandfork.toml"
    config.write_text(f'pool_size = 0\nallow_out_guarded = ["{OUTSIDE_NET}"]\n')
    d = start_daemon(binary, ["--config", str(config)])
    try:
        wait_healthy(d)
        with url_in_env(d):
            yield d
    finally:
        problems = tear_down(d)
        assert not problems, "after the test, the daemon left behind:\n" + "\n".join(problems)


@pytest.fixture
def outside() -> Iterator[tuple]:
    """A listener in a network namespace of its own, behind a veth pair from the host:
    (its address, the listening socket)."""
    n = os.getpid() % 64
    ns, host_if, ns_if = f"sflt{os.getpid()}", f"sflt{os.getpid()}h", f"sflt{os.getpid()}n"
    host_addr, ns_addr = f"198.19.254.{4 * n + 1}", f"198.19.254.{4 * n + 2}"
    ip("netns", "add", ns)
    try:
        ip("link", "add", host_if, "type", "veth", "peer", "name", ns_if, "netns", ns)
        ip("addr", "add", f"{host_addr}/30", "dev", host_if)
        ip("link", "set", host_if, "up")
        ip("-n", ns, "addr", "add", f"{ns_addr}/30", "dev", ns_if)
        ip("-n", ns, "link", "set", ns_if, "up")
        ip("-n", ns, "link", "set", "lo", "up")
        ip("-n", ns, "route", "add", "default", "via", host_addr)

        def listen() -> socket.socket:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((ns_addr, OUTSIDE_PORT))
            s.listen(4)
            return s

        lst = in_netns(f"/run/netns/{ns}", listen)
        with lst:
            yield ns_addr, lst
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def run_json(sb: Sandbox, *args: str) -> dict:
    r = sb.run("python3", ["/opt/st/looptcp.py", *args], working_dir="/opt/st", timeout=60)
    assert r.exit_code == 0, f"looptcp {args[0]} in {sb.id}: {r.stdout}\n{r.stderr}"
    return json.loads(r.stdout)


def read_line(conn: socket.socket) -> str:
    conn.settimeout(5)
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(4096)
        if not chunk:
            return data.decode() + "<EOF>"
        data += chunk
    return data.decode()


def test_loopback_connections_carry_on_in_every_fork_and_outside_ones_close(own_daemon: Daemon, outside) -> None:
    ns_addr, listener = outside
    client = Client(url=own_daemon.url)
    source = Sandbox.create(image="python", memory_mb=512, allow_out=[f"{ns_addr}/32"], client=client)
    snapshot = None
    forks: List[Sandbox] = []
    conns: List[socket.socket] = []
    try:
        for prog in ("stlib.py", "looptcp.py"):
            source.write_file(f"/opt/st/{prog}", (PROGRAMS / prog).read_bytes())
        pids = {
            "loopsrv": source.start_process("python3", ["/opt/st/looptcp.py", "serve"], working_dir="/opt/st").pid,
        }
        r = source.run("python3", ["/opt/st/stlib.py", "wait", "loopsrv"], working_dir="/opt/st", timeout=60)
        assert r.exit_code == 0, f"the server did not get ready: {r.stdout}{r.stderr}"
        pids["loopcli"] = source.start_process(
            "python3", ["/opt/st/looptcp.py", "client", ns_addr, str(OUTSIDE_PORT)], working_dir="/opt/st"
        ).pid
        listener.settimeout(30)
        out_conn, _ = listener.accept()
        conns.append(out_conn)
        assert read_line(out_conn) == "out\n"
        r = source.run("python3", ["/opt/st/stlib.py", "wait", "loopcli"], working_dir="/opt/st", timeout=60)
        assert r.exit_code == 0, f"the client did not get ready: {r.stdout}{r.stderr}"
        loopback = json.loads(r.stdout)["loopcli"]["loopback"]
        # ::1 is there wherever the host has IPv6.
        assert loopback == (["v4", "v6"] if Path("/proc/net/if_inet6").exists() else ["v4"]), loopback

        host_conn = in_netns(f"/run/sandfork/netns/sf-{source.id}",
                             lambda: socket.create_connection(("127.0.0.1", SERVER_PORT), timeout=5))
        conns.append(host_conn)
        host_conn.sendall(b"host\n")
        # Lines the sandbox has not read at the checkpoint.
        assert sorted(run_json(source, "prime")) == sorted([*loopback, "host"])
        out_conn.sendall(b"queued-out\n")
        host_conn.sendall(b"queued-host\n")

        snapshot = source.checkpoint(checkpoint_type=CheckpointType.MEMORY)
        result = snapshot.fork(2)
        forks = list(result)
        assert result.ok, "; ".join(f"child {c.index}: {c.error}" for c in result.errors)

        boxes = {"fork0": forks[0], "fork1": forks[1], "source": source}
        results = {name: run_json(sb, "check", name) for name, sb in boxes.items()}
        for name, res in results.items():
            for conn in loopback:
                r = res[conn]
                assert (r["client_first"], r["server_first"]) == (f"queued-s2c-{conn}\n", f"queued-c2s-{conn}\n"), \
                    f"{name}: the lines queued in the {conn} loopback connection: {r}"
                assert (r["client_send"], r["server_got"]) == ("sent", f"c2s-{name}\n"), f"{name}: {conn}: {r}"
                assert (r["server_send"], r["client_got"]) == ("sent", f"s2c-{name}\n"), f"{name}: {conn}: {r}"
            if name == "source":
                assert res["out"] == {"first": "queued-out\n", "send": "sent"}, f"{name}: {res}"
                assert res["host"] == {"first": "queued-host\n", "send": "sent"}, f"{name}: {res}"
            else:
                assert res["out"] == {"first": "EOF", "send": "EPIPE"}, f"{name}: to the outside listener: {res}"
                assert res["host"] == {"first": "EOF", "send": "EPIPE"}, f"{name}: the host's connection: {res}"
        # The outside ends heard the source only, and still reach it.
        assert read_line(out_conn) == "out-source\n"
        assert read_line(host_conn) == "host-source\n"
        out_conn.sendall(b"after\n")
        assert run_json(source, "check", "again")["out"]["first"] == "after\n"
    finally:
        for c in conns:
            c.close()
        for sb in [*forks, source]:
            sb.terminate()
        if snapshot is not None:
            snapshot.delete()
