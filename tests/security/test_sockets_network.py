"""The daemon's API socket, agent sockets, the host's loopback services, other sandboxes, raw sockets."""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path
from typing import Iterator, List

import pytest
from conftest import out_of, sh


class Listener:
    """A host TCP or Unix listener that records every connection it gets."""

    def __init__(self, family: int, address: object):
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.bind(address)
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.connections: List[object] = []
        self.stop = False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @property
    def port(self) -> int:
        return self.sock.getsockname()[1]

    def _serve(self) -> None:
        while not self.stop:
            try:
                conn, peer = self.sock.accept()
            except (socket.timeout, OSError):
                continue
            self.connections.append(peer)
            conn.close()

    def close(self) -> None:
        self.stop = True
        self.thread.join()
        self.sock.close()


@pytest.fixture
def tcp_listeners() -> Iterator[List[Listener]]:
    ls = [Listener(socket.AF_INET, ("127.0.0.1", 0)), Listener(socket.AF_INET, ("0.0.0.0", 0))]
    yield ls
    for listener in ls:
        listener.close()


def _addr(sb: object) -> tuple:
    r = sh(sb, "ip -4 -o addr show eth0; ip route")
    ip = [w for w in r.stdout.split() if "/" in w and w[0].isdigit()][0].split("/")[0]
    gw = [ln.split()[2] for ln in r.stdout.splitlines() if ln.startswith("default")]
    return ip, (gw[0] if gw else None)


def _host_addresses() -> List[str]:
    import subprocess

    out = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
    return sorted({w.split("/")[0] for w in out.split() if "/" in w and w[0].isdigit()})


@pytest.mark.promise("daemon API and agent sockets")
def test_api_socket_not_reachable(attempts, sandbox, daemon) -> None:
    """The daemon's API socket is not in the sandbox's mount namespace, under its host path or any other."""
    r = sh(sandbox, f"ls -la {daemon.socket} 2>&1; find / -xdev -type s 2>/dev/null; find /run /tmp /var -type s 2>/dev/null")
    sockets = {ln for ln in r.stdout.splitlines() if ln.startswith("/")}
    attempts.refused("find the API socket (or any socket but its agent's)", str(daemon.socket) not in r.stdout.split("\n", 1)[-1] and sockets <= {"/run/sandfork/agent.sock"}, out_of(r))
    r = sh(sandbox, f"ls /proc/1/root{daemon.socket} /proc/*/root{daemon.socket} 2>&1; true")
    attempts.refused("API socket via /proc/*/root", "No such file" in r.stdout and str(daemon.socket) + "\n" not in r.stdout_bytes.decode(), out_of(r))


@pytest.mark.promise("daemon API and agent sockets")
def test_other_sandbox_agent_socket(attempts, sandbox, neighbour) -> None:
    """Only the sandbox's own agent socket exists inside it; the neighbour's id is nowhere in its mounts."""
    r = sh(sandbox, "ls -la /run/sandfork; cat /proc/self/mountinfo")
    attempts.refused("see the neighbour's id in mounts or /run/sandfork", neighbour.id not in r.stdout, out_of(r))


@pytest.mark.promise("daemon API and agent sockets")
@pytest.mark.parametrize("kind", ["symlink-to-bait", "symlink-to-api", "fifo", "directory"])
def test_agent_socket_replaced(attempts, daemon, host, kind) -> None:
    """Replacing /run/sandfork/agent.sock (by a symlink to a host socket, a FIFO, a directory): the daemon
    never connects to the target; the sandbox fails cleanly (a typed error, no 500) and terminates cleanly."""
    from sandfork import Sandbox, SandforkError, ServerError

    bait_path = host.root / f"bait-{kind}.sock"
    bait = Listener(socket.AF_UNIX, str(bait_path))
    target = {"symlink-to-bait": f"ln -s {bait_path}", "symlink-to-api": f"ln -s {daemon.socket}", "fifo": "mkfifo", "directory": "mkdir"}[kind]
    sb = Sandbox.create(memory_mb=64, allow_internet_access=False)
    try:
        r = sh(sb, f"rm -f /run/sandfork/agent.sock && {target} /run/sandfork/agent.sock; echo rc=$?")
        assert "rc=0" in r.stdout, out_of(r)
        outcomes = []
        for _ in range(3):
            try:
                rr = sb.run(["echo", "still-here"], timeout=10)
                outcomes.append(f"exec answered: {rr.stdout!r}")
            except ServerError as e:
                outcomes.append(f"500: {e!r}")
            except SandforkError as e:
                outcomes.append(f"refused: {e.status} {e.code}")
            try:
                sb.read_file("/etc/passwd")
                outcomes.append("files answered")
            except ServerError as e:
                outcomes.append(f"500: {e!r}")
            except SandforkError as e:
                outcomes.append(f"refused: {e.status} {e.code}")
        time.sleep(0.5)
        attempts.refused("make the daemon connect to a host socket", not bait.connections, f"{bait.connections} {outcomes}")
        attempts.refused("make the daemon answer 500", not any(o.startswith("500") for o in outcomes), str(outcomes))
    finally:
        try:
            sb.terminate()
        except SandforkError as e:
            attempts.refused("terminate after the attack", False, repr(e))
        bait.close()
        bait_path.unlink(missing_ok=True)


@pytest.mark.promise("network")
def test_host_loopback_and_addresses(attempts, tcp_listeners, daemon) -> None:
    """A sandbox (internet or none) cannot connect to host listeners: 127.0.0.1, the gateway, any host address."""
    from sandfork import Sandbox

    lo, anyaddr = tcp_listeners
    with Sandbox.create(memory_mb=64, allow_internet_access=True) as net, Sandbox.create(memory_mb=64, allow_internet_access=False) as none:
        ip, gw = _addr(net)
        targets = [("127.0.0.1", lo.port), ("127.0.0.1", anyaddr.port)] + [(a, anyaddr.port) for a in _host_addresses() + [gw] if a]
        for sb, label in ((net, "internet"), (none, "none")):
            for addr, port in targets:
                r = sh(sb, f"echo x | nc -w 2 {addr} {port}; echo rc=$?", timeout=30)
                attempts.refused(f"{label} sandbox -> host {addr}:{port}", "rc=0" not in r.stdout, out_of(r))
        r = sh(none, "ip route; ip -o link")
        attempts.refused("find a route or an interface besides lo in netns none", r.stdout.strip().splitlines() == [ln for ln in r.stdout.strip().splitlines() if ": lo:" in ln], out_of(r))
    time.sleep(0.3)
    attempts.refused("connect to a host listener (checked on the host)", not lo.connections and not anyaddr.connections, f"{lo.connections} {anyaddr.connections}")


@pytest.mark.promise("network")
def test_sandbox_to_sandbox(attempts, neighbour) -> None:
    """Two internet sandboxes cannot reach each other's address (TCP or ICMP)."""
    from sandfork import Sandbox

    with Sandbox.create(memory_mb=64, allow_internet_access=True) as a:
        ip_a, _ = _addr(a)
        ip_n, _ = _addr(neighbour)
        listener = a.start_process(["sh", "-c", "nc -l -p 8080 > /tmp/got; echo done"], stdin_mode="pipe")
        time.sleep(0.5)
        r = sh(neighbour, f"echo hello | nc -w 2 {ip_a} 8080; echo rc=$?", timeout=30)
        got = sh(a, "cat /tmp/got 2>/dev/null; true").stdout
        attempts.refused(f"neighbour -> {ip_a}:8080", "hello" not in got, out_of(r) + f" got={got!r}")
        r = sh(a, f"echo x | nc -w 2 {ip_n} 22; echo rc=$?; wget -T 2 -q -O- http://{ip_n}:80/; echo rc=$?", timeout=30)
        attempts.refused(f"sandbox -> neighbour {ip_n}", "rc=0" not in r.stdout, out_of(r))
        listener.kill()


@pytest.mark.promise("network")
def test_raw_and_packet_sockets(attempts, sandbox) -> None:
    """ping (raw ICMP socket), arping (packet socket) and traceroute are refused: NET_RAW is dropped."""
    r = sh(sandbox, "ping -c 1 -W 1 127.0.0.1; echo rc=$?")
    attempts.refused("ping (raw socket)", "rc=0" not in r.stdout, out_of(r))
    r = sh(sandbox, "arping -c 1 -w 1 -I lo 127.0.0.1; echo rc=$?")
    attempts.refused("arping (packet socket)", "rc=0" not in r.stdout, out_of(r))
    r = sh(sandbox, "traceroute -m 1 -w 1 127.0.0.1; echo rc=$?")
    attempts.refused("traceroute (raw socket)", "rc=0" not in r.stdout, out_of(r))
    r = sh(sandbox, "ip link add dummy0 type dummy; echo rc=$?; ip link set lo down; echo rc=$?; ip link set lo up")
    attempts.refused("ip link add / set (NET_ADMIN)", "rc=0" not in r.stdout, out_of(r))
