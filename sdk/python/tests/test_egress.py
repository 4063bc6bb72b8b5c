"""Egress rules by name, end to end: a daemon whose sandboxes' DNS is forwarded to a real
resolver the test starts (dnsmasq on loopback), hosts in a network namespace of the
test's own (198.19.0.0/16, trusted for private answers), and a fake cloud metadata server
on 169.254.169.254 routed from the host. From inside sandboxes: allowed and denied names
resolved and connected to, addresses connected to directly, a rebinding answer, a rogue
resolver asked directly, IPv6 answers, and rules changed on a running sandbox. No packet
leaves the machine."""

from __future__ import annotations

import fcntl
import os
import shutil
import socket
import struct
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterator, List, Tuple

import pytest

import sandfork
from sandfork import Client, Sandbox

from _daemon import Daemon, clean_up_after, daemon_binary, implements_serve, leaks_of, start_daemon, wait_healthy

pytestmark = pytest.mark.daemon

# One /29 of 198.19.0.0/16 per test process: .1 the host's end, .2 and .3 web hosts
# (.3 also a rogue resolver).
SLOT = 200 + os.getpid() % 50
NET = f"198.19.{SLOT}"
ALLOWED, OTHER = f"{NET}.2", f"{NET}.3"
METADATA = "169.254.169.254"
# Shared with the Rust tests that stand up a metadata server: the host has one route to it.
METADATA_LOCK = "/run/lock/sandfork-test-metadata.lock"

SERVER = """
import socket, sys, threading
def serve(l):
    while True:
        c, _ = l.accept()
        c.sendall(("hello from %s\\n" % c.getsockname()[0]).encode()); c.close()
for port in sys.argv[1:]:
    l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.bind(("0.0.0.0", int(port))); l.listen(16)
    threading.Thread(target=serve, args=(l,), daemon=True).start()
threading.Event().wait()
"""


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


class Namespace:
    """A network namespace holding ``addrs``, linked to the host (which holds
    ``host_addr``) by a veth with a host route each way."""

    def __init__(self, name: str, host_if: str, host_addr: str, addrs: List[str]) -> None:
        self.name, self.host_if, self.procs = name, host_if, []  # type: ignore[var-annotated]
        _ip("netns", "add", name)
        try:
            _ip("link", "add", host_if, "type", "veth", "peer", "name", "eth0", "netns", name)
            _ip("addr", "add", f"{host_addr}/32", "dev", host_if)
            _ip("link", "set", host_if, "up")
            _ip("-n", name, "link", "set", "lo", "up")
            _ip("-n", name, "link", "set", "eth0", "up")
            for a in addrs:
                _ip("-n", name, "addr", "add", f"{a}/32", "dev", "eth0")
                _ip("route", "add", f"{a}/32", "dev", host_if)
            _ip("-n", name, "route", "add", f"{host_addr}/32", "dev", "eth0")
            _ip("-n", name, "route", "add", "default", "via", host_addr)
        except BaseException:
            self.close()
            raise

    def run(self, *cmd: str) -> None:
        self.procs.append(subprocess.Popen(["ip", "netns", "exec", self.name, *cmd], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

    def close(self) -> None:
        for p in self.procs:
            p.kill()
            p.wait()
        subprocess.run(["ip", "link", "del", self.host_if], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True)


def _query(server: Tuple[str, int], name: str, qtype: int = 1) -> Tuple[int, List[str]]:
    """A DNS question over UDP: (rcode, A-record addresses)."""
    qid = os.getpid() & 0xFFFF
    labels = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0"
    packet = struct.pack(">HHHHHH", qid, 0x0100, 1, 0, 0, 0) + labels + struct.pack(">HH", qtype, 1)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(2)
        s.sendto(packet, server)
        data = s.recv(4096)
    rcode, count = data[3] & 0x0F, struct.unpack(">H", data[6:8])[0]
    at, addrs = 12 + len(labels) + 4, []
    for _ in range(count):
        at += 2 if data[at] & 0xC0 == 0xC0 else len(labels)
        rtype, _cls, _ttl, rdlen = struct.unpack(">HHIH", data[at : at + 10])
        at += 10
        if rtype == 1:
            addrs.append(socket.inet_ntoa(data[at : at + 4]))
        at += rdlen
    return rcode, addrs


def _start_resolver(records: List[str]) -> Tuple[subprocess.Popen, int]:
    """dnsmasq on a free loopback port (UDP and TCP: a port free for one may be taken for
    the other, so a start that exits is tried again on another), once it answers and the
    rogue resolver in the namespace does too."""
    errors = []
    for _ in range(5):
        port = _free_port()
        proc = subprocess.Popen(_dnsmasq(port, "127.0.0.1", records), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 20
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                if _query(("127.0.0.1", port), "allowed.test") == (0, [ALLOWED]) and _query((OTHER, 53), "other.test")[1] == [OTHER]:
                    return proc, port
            except OSError:
                time.sleep(0.1)
        proc.kill()
        _, err = proc.communicate()
        errors.append(f"port {port}: exit {proc.returncode}: {err.decode(errors='replace').strip()}")
    raise AssertionError("the test's resolvers did not come up:\n" + "\n".join(errors))


def _free_port() -> int:
    """A loopback port free for UDP and TCP alike."""
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
            u.bind(("127.0.0.1", 0))
            port = int(u.getsockname()[1])
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as t:
                try:
                    t.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    raise AssertionError("no port free for both UDP and TCP")


def _dnsmasq(port: int, listen: str, records: List[str]) -> List[str]:
    return [
        "dnsmasq", "--keep-in-foreground", "--conf-file=/dev/null", "--no-resolv", "--no-hosts",
        "--bind-interfaces", f"--listen-address={listen}", f"--port={port}", "--user=root",
        "--pid-file=", *[f"--address={r}" for r in records],
    ]  # fmt: skip


@pytest.fixture(scope="module")
def world() -> Iterator[dict]:
    if shutil.which("dnsmasq") is None:
        pytest.skip("dnsmasq is not installed (scripts/setup installs it)")
    lock = open(METADATA_LOCK, "a")
    fcntl.flock(lock, fcntl.LOCK_EX)
    hosts = Namespace(f"sfeg-{SLOT}", f"sfeg{SLOT}", f"{NET}.1", [ALLOWED, OTHER])
    meta = None
    resolver = None
    try:
        hosts.run("python3", "-c", SERVER, "8080")
        # A rogue resolver that knows other.test: a sandbox asking it directly must still
        # meet the rules.
        hosts.run(*_dnsmasq(53, OTHER, [f"/other.test/{OTHER}"]))
        meta = Namespace(f"sfeg-md-{SLOT}", f"sfegm{SLOT}", f"169.254.64.{SLOT}", [METADATA])
        meta.run("python3", "-c", SERVER, "80")
        records = [
            f"/allowed.test/{ALLOWED}", "/allowed.test/2001:db8::2", f"/other.test/{OTHER}",
            f"/wild.test/{ALLOWED}", f"/rebind.test/{METADATA}",
        ]  # fmt: skip
        resolver, port = _start_resolver(records)
        yield {"port": port}
    finally:
        if resolver is not None:
            resolver.kill()
            resolver.wait()
        if meta is not None:
            meta.close()
        hosts.close()
        lock.close()


@pytest.fixture(scope="module")
def client(world: dict) -> Iterator[Client]:
    binary = daemon_binary()
    if binary is None or not implements_serve(binary, "--config"):
        pytest.skip("no daemon binary with `serve --config` is built")
    root = Path(tempfile.mkdtemp(prefix="sfsdk-eg-"))
    config = root / "config.toml"
    config.write_text(f'dns_upstreams = ["127.0.0.1:{world["port"]}"]\ndns_trusted_ranges = ["{NET}.0/29"]\nallow_out_guarded = ["{NET}.0/29"]\n')
    d: Daemon = start_daemon(binary, ["--config", str(config)], root=root)
    try:
        wait_healthy(d)
        yield Client(url=d.url)
    finally:
        problems = clean_up_after(d)
        if not leaks_of(d):
            shutil.rmtree(root, ignore_errors=True)
        assert not problems, "the egress daemon left behind:\n" + "\n".join(problems)


def lookup(sb: Sandbox, name: str, server: str = "", qtype: str = "A") -> Tuple[bool, str]:
    """busybox nslookup in the sandbox: (found, output)."""
    r = sb.run("sh", ["-c", f"nslookup -type={qtype} {name} {server}"])
    # The first paragraph names the server asked; the answers follow.
    answers = r.stdout.split("\n\n", 1)[-1]
    return r.exit_code == 0 and "NXDOMAIN" not in r.stdout, answers + r.stderr


def fetch(sb: Sandbox, addr: str, port: int = 8080) -> str:
    """What the host at ``addr`` says on connect ("" when the connection is blocked)."""
    return sb.run("sh", ["-c", f"nc -w 2 {addr} {port} </dev/null"]).stdout.strip()


def test_allowed_names_resolve_and_connect_nothing_else_does(client: Client) -> None:
    sb = Sandbox.create(allow_out=["allowed.test", "*.wild.test", "rebind.test"], client=client)
    try:
        found, out = lookup(sb, "allowed.test")
        assert found and ALLOWED in out, out
        assert fetch(sb, ALLOWED) == f"hello from {ALLOWED}"
        found, out = lookup(sb, "deep.er.wild.test")
        assert found and ALLOWED in out, out
        # The wildcard is below the name, not the name itself.
        assert not lookup(sb, "wild.test")[0]
        # Not allowed: not resolved, and its address (of a live host: see below) blocked.
        found, out = lookup(sb, "other.test")
        assert not found and OTHER not in out, out
        assert fetch(sb, OTHER) == ""
        # Asking a resolver directly is answered by the rules all the same.
        found, out = lookup(sb, "other.test", OTHER)
        assert not found and OTHER not in out, out
        # A name that points at the metadata service is stripped of that answer, and the
        # address stays unreachable.
        found, out = lookup(sb, "rebind.test")
        assert METADATA not in out, out
        assert fetch(sb, METADATA, 80) == ""
        # IPv6: no AAAA answers (the sandbox has no IPv6 route).
        found, out = lookup(sb, "allowed.test", qtype="AAAA")
        assert "2001:db8::2" not in out, out
    finally:
        sb.terminate()
    # Positive controls from the host: the blocked host and metadata server are up.
    with socket.create_connection((OTHER, 8080), timeout=3) as c:
        assert c.recv(100).decode().strip() == f"hello from {OTHER}"
    with socket.create_connection((METADATA, 80), timeout=3) as c:
        assert c.recv(100).decode().strip() == f"hello from {METADATA}"


def test_rules_change_on_a_running_sandbox(client: Client) -> None:
    sb = Sandbox.create(allow_out=["allowed.test"], client=client)
    try:
        keeper = sb.start_process("sleep", ["1000"])
        assert not lookup(sb, "other.test")[0]
        assert fetch(sb, OTHER) == ""
        info = sb.update_network(allow_out=["allowed.test", "other.test"])
        assert info.network.allow_out == ["allowed.test", "other.test"]
        found, out = lookup(sb, "other.test")
        assert found and OTHER in out, out
        assert fetch(sb, OTHER) == f"hello from {OTHER}"
        sb.update_network(allow_out=["allowed.test"])
        assert not lookup(sb, "other.test")[0]
        assert fetch(sb, OTHER) == "", "the address learned under the old rules is gone"
        assert fetch(sb, ALLOWED) == "", "learned addresses go with the old rules"
        assert lookup(sb, "allowed.test")[0]
        assert fetch(sb, ALLOWED) == f"hello from {ALLOWED}"
        assert keeper.pid in [p.pid for p in sb.list_processes()], "no restart"
    finally:
        sb.terminate()


def test_a_denied_name_is_blocked_by_address_before_it_is_asked(client: Client) -> None:
    sb = Sandbox.create(allow_out=[f"{NET}.0/29"], deny_out=["other.test"], client=client)
    try:
        # Never resolved in the sandbox, yet its address is blocked.
        assert fetch(sb, OTHER) == ""
        assert not lookup(sb, "other.test")[0]
        # The rest of the allowed range works; an allow list of addresses alone resolves
        # no name, so the names asked cannot carry data out past the addresses.
        assert fetch(sb, ALLOWED) == f"hello from {ALLOWED}"
        found, out = lookup(sb, "allowed.test")
        assert not found, out
        sb.update_network(allow_out=[f"{NET}.0/29", "allowed.test"])
        found, out = lookup(sb, "allowed.test")
        assert found and ALLOWED in out, out
        sb.update_network(allow_out=[f"{NET}.0/29"], deny_out=[])
        assert fetch(sb, OTHER) == f"hello from {OTHER}"
    finally:
        sb.terminate()


@pytest.mark.parametrize(
    "entry, reason",
    [
        ("a.*.example.com", "first label"),
        ("*", "every name"),
        ("exa mple.com", "not allowed in a hostname"),
        ("2001:db8::/32", "IPv6"),
        ("10.0.0.0/33", "IPv4 address or CIDR"),
        ("-bad.example.com", "starts or ends with '-'"),
    ],
)
def test_invalid_entries_are_refused_with_the_reason(client: Client, entry: str, reason: str) -> None:
    with pytest.raises(sandfork.SandforkError) as info:
        Sandbox.create(allow_out=["allowed.test", entry], client=client)
    assert info.value.status == 400 and reason in str(info.value) and entry in str(info.value)


def test_a_refused_change_changes_nothing(client: Client) -> None:
    sb = Sandbox.create(allow_out=["allowed.test"], client=client)
    try:
        with pytest.raises(sandfork.SandforkError) as info:
            sb.update_network(allow_out=["other.test", "*.*.test"])
        assert info.value.status == 400 and "first label" in str(info.value)
        assert sb.info().network.allow_out == ["allowed.test"]
        assert lookup(sb, "allowed.test")[0] and not lookup(sb, "other.test")[0]
    finally:
        sb.terminate()


def test_update_network_async(client: Client) -> None:
    import asyncio

    from sandfork.aio import AsyncSandbox

    async def main() -> None:
        async with AsyncSandbox.create(allow_out=["allowed.test"], client=client) as sb:
            info = await sb.update_network(allow_out=["other.test"], deny_out=["allowed.test"])
            assert (info.network.allow_out, info.network.deny_out) == (["other.test"], ["allowed.test"])
            found, out = lookup(sb.sync, "other.test")
            assert found and OTHER in out, out
            assert not lookup(sb.sync, "allowed.test")[0]
            with pytest.raises(sandfork.SandforkError) as info_err:
                await sb.update_network(deny_out=["bad..name"])
            assert "empty label" in str(info_err.value)

    asyncio.run(main())
