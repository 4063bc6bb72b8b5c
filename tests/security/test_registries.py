"""Probes of what a hostile registry can make a pulling daemon do (issue findings 7 and 8).

- host disk: manifests, indexes and configs are read up to a cap; a registry's declared
  blob sizes and its gzip streams are held to the import cap and the free-space floor,
  and a layer's unpack (the bottom one into a host directory too) is capped;
- registry trust: a registry chooses its token realm and its redirects, but the daemon
  sends credentials only to the registry's own host, follows nothing to a guarded
  address (loopback, link-local, private, special-purpose) unless the registry itself is
  at one of that class, and never from TLS down to plain HTTP.

The hostile registry is a small HTTP server of this file's own (REGISTRY below), answering
what each test scripts and logging every request with its Authorization header. It runs on
loopback, or for the trust probes at an address of a network namespace this file makes
(198.18.0.0/15, linked to the host by a veth pair), so that the daemon sees a registry that
is not on loopback; the "victim" listeners it points the daemon at are this file's too.
Nothing is sent anywhere else. Everything made on the host carries the prefix ``sfsec``
and is removed even when a test fails.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import random
import secrets
import signal
import subprocess
import sys
import tarfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import pytest
from test_review_findings import ip, own_daemon

MIB = 1 << 20

# The hostile registry: `python3 -c REGISTRY <addr> <port> <routes.json> <log>`. Routes map a
# path (query ignored) to {"status", "headers", "body" (hex) | "repeat": [hex, count]}; every
# request is logged as one JSON line {path, authorization, host}.
REGISTRY = r"""
import json, sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
addr, port, routes_path, log_path = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
lock = threading.Lock()
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def handle_one(self):
        path = self.path.split("?", 1)[0]
        with lock, open(log_path, "a") as log:
            log.write(json.dumps({"path": self.path, "authorization": self.headers.get("Authorization"), "host": self.headers.get("Host")}) + "\n")
        routes = json.load(open(routes_path))
        r = routes.get(path, {"status": 404, "body": b'{"errors":[{"code":"NOT_FOUND"}]}'.hex()})
        body = bytes.fromhex(r.get("body", ""))
        repeat = r.get("repeat")
        length = len(body) if repeat is None else len(bytes.fromhex(repeat[0])) * repeat[1]
        self.send_response(r.get("status", 200))
        for k, v in r.get("headers", {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(r.get("declare", length)))
        self.end_headers()
        if self.command == "HEAD":
            return
        try:
            if repeat is None:
                self.wfile.write(body)
            else:
                chunk = bytes.fromhex(repeat[0])
                for _ in range(repeat[1]):
                    self.wfile.write(chunk)
        except OSError:
            pass
    do_GET = do_HEAD = do_POST = do_PUT = handle_one
ThreadingHTTPServer.daemon_threads = True
s = ThreadingHTTPServer((addr, port), H)
print("ready", flush=True)
s.serve_forever()
"""


class Hostile:
    """One hostile registry (or victim listener): scripted routes, a request log."""

    def __init__(self, work: Path, addr: str, netns: str = "") -> None:
        self.addr, self.netns = addr, netns
        self.port = random.randint(20000, 40000)
        tag = secrets.token_hex(3)
        self.routes_path, self.log = work / f"routes-{tag}.json", work / f"requests-{tag}.log"
        self.routes: Dict[str, Dict[str, Any]] = {}
        self.save()
        self.log.touch()
        prefix = ["ip", "netns", "exec", netns] if netns else []
        self.proc = subprocess.Popen([*prefix, sys.executable, "-u", "-c", REGISTRY, addr, str(self.port), str(self.routes_path), str(self.log)],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        line = self.proc.stdout.readline() if self.proc.stdout else b""
        if line.strip() != b"ready":
            self.stop()
            raise RuntimeError(f"the test registry did not start: {line!r}")

    @property
    def host(self) -> str:
        return f"{self.addr}:{self.port}"

    def route(self, path: str, status: int = 200, body: bytes = b"", headers: Optional[Dict[str, str]] = None, **kw: Any) -> None:
        self.routes[path] = {"status": status, "body": body.hex(), "headers": headers or {}, **kw}
        self.save()

    def save(self) -> None:
        self.routes_path.write_text(json.dumps(self.routes))

    def requests(self) -> List[Dict[str, Any]]:
        return [json.loads(ln) for ln in self.log.read_text().splitlines() if ln.strip()]

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def arch() -> str:
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine, os.uname().machine)


def tar_of(files: Dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def gzip_bomb(unpacked: int) -> bytes:
    """A layer of one file of ``unpacked`` zero bytes, a fraction of that compressed, made
    without holding it in memory."""
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", compresslevel=9) as gz:
        info = tarfile.TarInfo("bomb")
        info.size, info.mode = unpacked, 0o644
        gz.write(info.tobuf(format=tarfile.GNU_FORMAT))
        zeros = bytes(MIB)
        for _ in range(unpacked // MIB):
            gz.write(zeros)
        gz.write(bytes(2 * 512 + (-unpacked) % 512))
    return out.getvalue()


def image(reg: Hostile, repo: str, layers: List[bytes], *, config: Optional[bytes] = None, manifest_pad: int = 0,
          declare: Optional[Dict[str, int]] = None) -> str:  # fmt: skip
    """Scripts an image at ``reg``'s ``repo:1``; returns its reference. ``declare`` overrides
    descriptor sizes by role ("config", "layer0", …); ``manifest_pad`` pads the manifest."""
    declare = declare or {}
    config = config if config is not None else json.dumps({"os": "linux", "architecture": arch(), "rootfs": {"type": "layers", "diff_ids": []}}).encode()
    descs = []
    for i, layer in enumerate(layers):
        reg.route(f"/v2/{repo}/blobs/{digest_of(layer)}", body=layer)
        descs.append({"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": digest_of(layer), "size": declare.get(f"layer{i}", len(layer))})
    reg.route(f"/v2/{repo}/blobs/{digest_of(config)}", body=config)
    manifest: Dict[str, Any] = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                                "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": digest_of(config), "size": declare.get("config", len(config))},
                                "layers": descs}  # fmt: skip
    if manifest_pad:
        manifest["annotations"] = {"pad": "x" * manifest_pad}
    body = json.dumps(manifest).encode()
    reg.route(f"/v2/{repo}/manifests/1", body=body, headers={"Content-Type": "application/vnd.oci.image.manifest.v1+json"})
    return f"{reg.host}/{repo}:1"


def pull(d: Any, reference: str, username: Optional[str] = None, password: Optional[str] = None) -> Tuple[bool, str, str]:
    """Pulls through the API; returns (succeeded, error code, message)."""
    from sandfork import Client, Image, SandforkError

    c = Client(url=d.url, token=d.token or "")
    try:
        Image.pull(reference, username=username, password=password, client=c, on_progress=lambda _: None)
        return True, "", ""
    except SandforkError as e:
        return False, str(getattr(e, "code", "")), str(e)


@pytest.fixture
def work(tmp_path: Path) -> Path:
    return tmp_path


# ---------------------------------------------------------------------- host disk

BOUNDED = f"max_import_bytes = {64 * MIB}\n"


@pytest.fixture
def bounded_daemon() -> Iterator[Any]:
    with own_daemon(BOUNDED) as d:
        yield d


@pytest.fixture
def loop_registry(work: Path) -> Iterator[Hostile]:
    reg = Hostile(work, "127.0.0.1")
    reg.route("/v2/", body=b"{}")
    try:
        yield reg
    finally:
        reg.stop()


def blob_requests(reg: Hostile) -> List[str]:
    return [r["path"] for r in reg.requests() if "/blobs/" in r["path"]]


@pytest.mark.promise("host disk")
def test_registry_bodies_are_read_bounded(attempts, bounded_daemon, loop_registry) -> None:
    """A registry's manifest past 4 MiB, an image config declared past 8 MiB, and a config
    body longer than its descriptor are refused with an error naming what was too large;
    no image is made."""
    reg = loop_registry
    big_manifest = image(reg, "big/manifest", [gzip.compress(tar_of({"a": b"a"}))], manifest_pad=5 * MIB)
    ok, code, msg = pull(bounded_daemon, big_manifest)
    attempts.refused("a 5 MiB manifest is not read whole", not ok and code == "too_large" and "manifest" in msg, f"{code}: {msg}")
    big_config = image(reg, "big/config", [gzip.compress(tar_of({"a": b"a"}))], declare={"config": 64 * MIB})
    ok, code, msg = pull(bounded_daemon, big_config)
    attempts.refused("a config declared 64 MiB is not fetched", not ok and code == "too_large" and "config" in msg, f"{code}: {msg}")
    config = json.dumps({"os": "linux", "architecture": arch(), "rootfs": {"type": "layers", "diff_ids": []}}).encode()
    long_config = image(reg, "long/config", [gzip.compress(tar_of({"a": b"a"}))], config=config)
    reg.route(f"/v2/long/config/blobs/{digest_of(config)}", repeat=[config.hex(), 4096], declare=len(config) * 4096)
    ok, code, msg = pull(bounded_daemon, long_config)
    attempts.refused("a config body longer than its descriptor is cut off", not ok and ("config" in msg or "larger" in msg), f"{code}: {msg}")
    reg.route("/v2/big/index/manifests/1", body=b" " * (5 * MIB) + b"{}", headers={"Content-Type": "application/vnd.oci.image.index.v1+json"})
    ok, code, msg = pull(bounded_daemon, f"{reg.host}/big/index:1")
    attempts.refused("a 5 MiB index is not read whole", not ok and code == "too_large" and "manifest" in msg, f"{code}: {msg}")


@pytest.mark.promise("host disk")
def test_declared_layer_sizes_past_the_import_cap_are_refused_unfetched(attempts, bounded_daemon, loop_registry) -> None:
    """Layers declared past max_import_bytes (one, or all together) are refused before a
    byte of them is fetched: 413 naming the cap."""
    reg = loop_registry
    layer = gzip.compress(tar_of({"a": b"a"}))
    ref = image(reg, "declared/huge", [layer], declare={"layer0": 200 * MIB})
    ok, code, msg = pull(bounded_daemon, ref)
    attempts.refused("a layer declared 200 MiB over a 64 MiB cap", not ok and code == "too_large", f"{code}: {msg}")
    attempts.refused("nothing of it fetched", not [p for p in blob_requests(reg) if "declared/huge" in p and digest_of(layer) in p], str(reg.requests()))
    layers = [gzip.compress(tar_of({f"f{i}": bytes([i])})) for i in range(3)]
    ref = image(reg, "declared/many", layers, declare={f"layer{i}": 30 * MIB for i in range(3)})
    ok, code, msg = pull(bounded_daemon, ref)
    attempts.refused("three layers of 30 MiB each over a 64 MiB cap", not ok and code == "too_large", f"{code}: {msg}")


@pytest.mark.promise("host disk")
@pytest.mark.parametrize("position", ["bottom", "upper"])
def test_a_gzip_bomb_layer_stops_at_the_import_cap(attempts, bounded_daemon, loop_registry, position) -> None:
    """A layer of a few hundred KiB that inflates to 256 MiB (past the 64 MiB cap), as the
    bottom layer (unpacked into a host directory) or above it (into a layer disk): refused
    413 with a clear error, no image, nothing left in the daemon's image work directory."""
    reg = loop_registry
    bomb = gzip_bomb(256 * MIB)
    layers = [bomb] if position == "bottom" else [gzip.compress(tar_of({"etc/os-release": b"ID=test\n"})), bomb]
    ref = image(reg, f"bomb/{position}", layers)
    ok, code, msg = pull(bounded_daemon, ref)
    attempts.refused(f"a {len(bomb) >> 10} KiB gzip bomb ({position} layer) inflating to 256 MiB", not ok and code in ("too_large", "insufficient_storage") and "unpack" in msg, f"{code}: {msg}")
    work = bounded_daemon.data_dir / "images"
    left = sum(f.stat().st_size for f in work.rglob("*") if f.is_file() and not f.name.endswith(".json")) if work.exists() else 0
    attempts.refused("no unpacked data left behind", left < 16 * MIB, f"{left} bytes under {work}")


@pytest.mark.promise("host disk")
@pytest.mark.parametrize("route", ["/v1/images/build?name=bomb", "/v1/images/import?name=bomb"])
def test_a_gzip_bomb_archive_stops_at_the_import_cap(attempts, bounded_daemon, route) -> None:
    """A build context or an image archive of a few hundred KiB that inflates to 256 MiB
    (past the 64 MiB cap): refused 413 naming the cap, with nothing of it left in the
    daemon's temporary directory (it was unpacked whole before)."""
    from sandfork import Client, SandforkError

    bomb = gzip_bomb(256 * MIB)
    c = Client(url=bounded_daemon.url, token=bounded_daemon.token or "")
    try:
        with c.open("POST", route, body=bomb, headers={"Content-Type": "application/x-tar"}, unbounded=True) as stream:
            last = list(stream.iter_json_lines())[-1:] or [{}]
        code, msg = str(last[0].get("code", "")), str(last[0].get("message", last[0]))
    except SandforkError as e:
        code, msg = str(getattr(e, "code", "")), str(e)
    attempts.refused(f"a {len(bomb) >> 10} KiB gzip bomb inflating to 256 MiB at {route}", code == "too_large" and "max_import_bytes" in msg, f"{code}: {msg}")
    tmp = bounded_daemon.data_dir / "tmp"
    left = sum(f.stat().st_size for f in tmp.rglob("*") if f.is_file()) if tmp.exists() else 0
    attempts.refused("nothing of it left in the temporary directory", left < MIB, f"{left} bytes under {tmp}")


# ----------------------------------------------------------------- registry trust


class RegistryNet:
    """A network namespace holding two addresses of 198.18.0.0/15 (a hostile registry's
    and another host's), linked to the host by a veth pair with a /29 route."""

    def __init__(self) -> None:
        tag = secrets.token_hex(3)
        self.ns, self.host_if = f"sfsec-reg-{tag}", f"sfr{tag}"
        third = random.randint(1, 250)
        self.net = f"198.19.{third}.0/29"
        self.host_addr, self.registry, self.other = f"198.19.{third}.1", f"198.19.{third}.2", f"198.19.{third}.3"

    def up(self) -> None:
        ip("netns", "add", self.ns)
        ip("link", "add", self.host_if, "type", "veth", "peer", "name", "eth0", "netns", self.ns)
        ip("addr", "add", f"{self.host_addr}/29", "dev", self.host_if)
        ip("link", "set", self.host_if, "up")
        for args in (["link", "set", "lo", "up"], ["addr", "add", f"{self.registry}/29", "dev", "eth0"],
                     ["addr", "add", f"{self.other}/29", "dev", "eth0"], ["link", "set", "eth0", "up"]):  # fmt: skip
            ip("-n", self.ns, *args)

    def down(self) -> None:
        ip("link", "del", self.host_if, check=False)
        ip("netns", "del", self.ns, check=False)


@contextmanager
def hostile_world(work: Path) -> Iterator[Tuple[RegistryNet, Hostile, Hostile, Hostile]]:
    """(net, the registry in the namespace, another host in it, a victim on host loopback)."""
    net = RegistryNet()
    servers: List[Hostile] = []
    try:
        net.up()
        for addr, ns in ((net.registry, net.ns), (net.other, net.ns), ("127.0.0.1", "")):
            servers.append(Hostile(work, addr, ns))
            servers[-1].route("/token", body=b'{"token":"t0k3n"}')
        yield net, servers[0], servers[1], servers[2]
    finally:
        for s in servers:
            s.stop()
        net.down()


@pytest.fixture
def trust(work: Path) -> Iterator[Tuple[Any, RegistryNet, Hostile, Hostile, Hostile]]:
    with hostile_world(work) as (net, reg, other, victim):
        with own_daemon(f'insecure_registries = ["{reg.host}"]\n') as d:
            yield d, net, reg, other, victim


def challenge(reg: Hostile, realm: str) -> None:
    reg.route("/v2/", status=401, headers={"WWW-Authenticate": f'Bearer realm="{realm}",service="hostile"'})


USER, PASSWORD = "tester", "s3cret-" + secrets.token_hex(4)


def basic_sent(reqs: List[Dict[str, Any]]) -> List[str]:
    return [r["path"] for r in reqs if (r.get("authorization") or "").lower().startswith("basic")]


@pytest.mark.promise("registry trust")
def test_a_realm_on_the_registrys_own_host_gets_the_credentials(attempts, trust) -> None:
    """The control: a realm on the registry's own host is asked for a token with the
    credentials, and the token then reaches the registry."""
    d, net, reg, other, victim = trust
    challenge(reg, f"http://{reg.host}/token")
    ok, code, msg = pull(d, f"{reg.host}/app/x:1", USER, PASSWORD)
    reqs = reg.requests()
    attempts.refused("credentials reach the registry's own token service", [p.split("?")[0] for p in basic_sent(reqs)] == ["/token"], json.dumps(reqs))
    attempts.refused("its token reaches the manifest request", any(r["authorization"] == "Bearer t0k3n" and "/manifests/" in r["path"] for r in reqs), json.dumps(reqs))
    attempts.refused("the pull fails only for want of an image", not ok and code == "not_found", f"{code}: {msg}")


@pytest.mark.promise("registry trust")
def test_credentials_never_go_to_a_realm_on_another_host(attempts, trust) -> None:
    """A registry whose realm names another host (at an address of the registry's own
    class, so it may be asked): the token request goes there without the credentials,
    and no credential reaches it afterwards."""
    d, net, reg, other, victim = trust
    challenge(reg, f"http://{other.host}/token")
    pull(d, f"{reg.host}/app/x:1", USER, PASSWORD)
    got = other.requests()
    attempts.refused("the other host's token service was asked without credentials", got and not basic_sent(got), json.dumps(got))
    attempts.refused("the password appears nowhere in what it received", PASSWORD not in json.dumps(got), json.dumps(got))


@pytest.mark.promise("registry trust")
@pytest.mark.parametrize("via", ["realm", "manifest redirect", "blob redirect"])
def test_a_public_registry_cannot_send_the_daemon_to_loopback(attempts, trust, via) -> None:
    """A registry not on loopback pointing the daemon (its token realm, a redirect of a
    manifest or of a blob) at a listener on the host's loopback: refused with an error
    naming why; the listener gets nothing."""
    d, net, reg, other, victim = trust
    target = f"http://{victim.host}/{via.replace(' ', '-')}"
    layer = gzip.compress(tar_of({"a": b"a"}))
    if via == "realm":
        challenge(reg, target)
    else:
        reg.route("/v2/", body=b"{}")
        ref = image(reg, "app/x", [layer])
        if via == "manifest redirect":
            reg.route("/v2/app/x/manifests/1", status=307, headers={"Location": target})
        else:
            reg.route(f"/v2/app/x/blobs/{digest_of(layer)}", status=302, headers={"Location": target})
    ok, code, msg = pull(d, f"{reg.host}/app/x:1", USER, PASSWORD)
    attempts.refused(f"the {via} to loopback is refused, saying why", not ok and "loopback" in msg, f"{code}: {msg}")
    attempts.refused("the loopback listener received nothing", not victim.requests(), json.dumps(victim.requests()))


def push(d: Any, image: str, reference: str, username: Optional[str] = None, password: Optional[str] = None) -> Tuple[bool, str, str]:
    """Pushes ``image`` (a built-in one, made first) through the API; returns (succeeded,
    error code, message)."""
    from sandfork import Client, Image, SandforkError

    c = Client(url=d.url, token=d.token or "")
    with c.open("POST", f"/v1/images/{image}/ensure", unbounded=True) as stream:
        list(stream.iter_json_lines())
    try:
        Image.get(image, client=c).push(reference, username=username, password=password)
        return True, "", ""
    except SandforkError as e:
        return False, str(getattr(e, "code", "")), str(e)


@pytest.mark.promise("registry trust")
@pytest.mark.parametrize("via", ["realm", "upload location"])
def test_a_push_cannot_send_the_daemon_or_credentials_to_loopback(attempts, trust, via) -> None:
    """A push to a registry not on loopback whose token realm or upload location names a
    listener on the host's loopback: refused saying why, at every request of the push (the
    push runs on the pull's guarded session, not on a preflight); the listener gets
    nothing, credentials included."""
    d, net, reg, other, victim = trust
    target = f"http://{victim.host}/{via.replace(' ', '-')}"
    if via == "realm":
        challenge(reg, target)
    else:
        reg.route("/v2/", body=b"{}")
        reg.route("/v2/app/x/blobs/uploads/", status=202, headers={"Location": target})
    ok, code, msg = push(d, "busybox", f"{reg.host}/app/x:1", USER, PASSWORD)
    attempts.refused(f"a push's {via} to loopback is refused, saying why", not ok and "loopback" in msg, f"{code}: {msg}")
    attempts.refused("the loopback listener received nothing", not victim.requests(), json.dumps(victim.requests()))


@pytest.mark.promise("registry trust")
def test_a_redirect_to_another_host_carries_no_credentials(attempts, trust) -> None:
    """A manifest redirected to another host (of the registry's class): followed, but the
    registry's credentials stay behind."""
    d, net, reg, other, victim = trust
    reg.route("/v2/", status=401, headers={"WWW-Authenticate": 'Basic realm="hostile"'})
    reg.route("/v2/app/x/manifests/1", status=307, headers={"Location": f"http://{other.host}/v2/app/x/manifests/1"})
    pull(d, f"{reg.host}/app/x:1", USER, PASSWORD)
    attempts.refused("the registry itself got the credentials", basic_sent(reg.requests()), json.dumps(reg.requests()))
    got = other.requests()
    attempts.refused("the redirect target got none", got and not basic_sent(got) and PASSWORD not in json.dumps(got), json.dumps(got))


@pytest.mark.promise("registry trust")
def test_a_loopback_registry_may_use_a_loopback_realm(attempts, work) -> None:
    """A registry on loopback with its token service on another loopback port (as a local
    registry with a token server runs): allowed, the credentials go to it (same host)."""
    reg, realm = Hostile(work, "127.0.0.1"), Hostile(work, "127.0.0.1")
    try:
        realm.route("/token", body=b'{"token":"t0k3n"}')
        challenge(reg, f"http://{realm.host}/token")
        with own_daemon() as d:
            ok, code, msg = pull(d, f"{reg.host}/app/x:1", USER, PASSWORD)
        attempts.refused("the loopback realm was asked with the credentials", basic_sent(realm.requests()), f"{code}: {msg} {realm.requests()}")
    finally:
        reg.stop()
        realm.stop()
