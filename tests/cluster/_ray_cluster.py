"""A whole cluster on one machine: a gateway with the Ray head in one network namespace,
``n`` sandfork nodes each in its own (each a Ray node with its sandbox slots), and a
SeaweedFS S3 server on the host end of their bridge. All addresses are the test's own
(198.19.<n>.0/24); nothing is routed anywhere else.

The cluster is set up as docs/scale-out.md says: ``sandfork cluster init`` makes its
authority and tokens, each node serves its API over TLS with a certificate issued for its
name and address, the gateway checks them against the authority (``--node-ca``), and every
Ray process holds Ray's token."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Dict, List, Optional

from _daemon import Daemon, stop_daemon, tear_down, wait_healthy
from _net import TestNet
from _weed import ACCESS_KEY, BUCKET, SECRET_KEY, Weed

GATEWAY_PORT = 7080
NODE_PORT = 7070


def ray_dir(state: Path) -> Path:
    """The Ray directory of the node whose state is in ``state`` (crates/ray's temp_dir_for)."""
    h = 0xCBF29CE484222325
    for b in str(state).encode():
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return Path(f"/tmp/sfray-{h & 0xFFFFFFFFFFFF:012x}")


class RayCluster:
    def __init__(self, root: Path, binary: Path, nodes: int = 4, slots: int = 10, node_timeout: int = 4) -> None:
        self.root, self.binary, self.slots, self.count = root, binary, slots, nodes
        # A spare host past the nodes: for a node the tests add (one the cluster must not trust).
        self.net = TestNet(nodes + 2)
        self.nodes: Dict[int, Daemon] = {}
        self.gateway: Optional[subprocess.Popen] = None
        self.weed: Optional[Weed] = None
        try:
            self._start(nodes, node_timeout)
        except BaseException:
            self.close()
            raise

    @property
    def gateway_url(self) -> str:
        return f"http://{self.net.ip_of(0)}:{GATEWAY_PORT}"

    def _start(self, nodes: int, node_timeout: int) -> None:
        self.weed = Weed(self.root / "s3", host=self.net.host_ip)
        self.token = secrets.token_hex(16)
        self.key = secrets.token_hex(32)
        self.trust = self.root / "cluster"
        subprocess.run([str(self.binary), "cluster", "init", str(self.trust)], check=True, capture_output=True)
        self.node_token = (self.trust / "node.token").read_text().strip()
        (self.root / "gw").mkdir(parents=True)
        (self.root / "gw.token").write_text(self.token)
        self.ray_address = f"{self.net.ip_of(0)}:6379"
        log = open(self.root / "gateway.log", "wb")
        argv = [
            str(self.binary), "gateway", "--listen", f"{self.net.ip_of(0)}:{GATEWAY_PORT}",
            "--token-file", str(self.root / "gw.token"), "--node-token-file", str(self.trust / "node.token"),
            "--node-ca", str(self.trust / "ca.pem"), "--ray-token-file", str(self.trust / "ray.token"),
            "--allow-insecure-remote", "--ray-ip", self.net.ip_of(0), "--ray-port", "6379",
            "--node-timeout-secs", str(node_timeout), "--place-timeout-secs", "5",
            "--state-dir", str(self.root / "gw"), "--domain", "cluster.test",
        ]  # fmt: skip
        self.gateway = subprocess.Popen(self.net.enter(0, argv), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        for i in range(1, nodes + 1):
            self.start_node(i)
        self.wait_nodes(nodes)

    def node_args(self, i: int, name: Optional[str] = None, trust: Optional[Path] = None) -> List[str]:
        """Node ``i``'s daemon: named ``name`` (node<i>), its certificate issued by the
        authority in ``trust`` (the cluster's; a test's rogue node brings its own)."""
        name = name or f"node{i}"
        trust = trust or self.trust
        root = self.root / f"node{i}"
        cert, key = trust / f"{name}.pem", trust / f"{name}.key"
        if not cert.exists():
            subprocess.run(
                [str(self.binary), "cluster", "issue", str(trust), name, "--ip", self.net.ip_of(i)],
                check=True, capture_output=True,
            )  # fmt: skip
        config = root / "config.toml"
        config.write_text(
            f'tls_cert = "{cert}"\ntls_key = "{key}"\n'
            f'cluster_ca = "{trust / "ca.pem"}"\ncluster_revoked = "{root / "revoked"}"\n'
            'gateway_domain = "cluster.test"\n'
            "[object_store]\n"
            f'url = "s3://{BUCKET}/cluster"\nendpoint = "{self.weed.endpoint}"\nallow_http = true\n'
            f'access_key_id = "{ACCESS_KEY}"\nsecret_access_key = "{SECRET_KEY}"\nretry_secs = 10\n'
        )
        return [
            "serve", "--data-dir", str(root / "data"), "--socket", str(root / "s.sock"), "--config", str(config),
            "--listen", f"{self.net.ip_of(i)}:{NODE_PORT}", "--allow-remote", "--token-file", str(self.trust / "node.token"),
            "--ray-token-file", str(self.trust / "ray.token"),
            "--ray-address", self.ray_address, "--node-name", name, "--max-sandboxes", str(self.slots),
            "--pool-size", "0", "--default-image", "busybox",
        ]  # fmt: skip

    def start_node(self, i: int, name: Optional[str] = None, trust: Optional[Path] = None) -> Daemon:
        root = self.root / f"node{i}"
        (root / "data").mkdir(parents=True, exist_ok=True)
        key = root / "data" / "snapshot.key"
        key.write_text(self.key + "\n")
        key.chmod(0o600)
        log_path = root / "daemon.log"
        with open(log_path, "ab") as log:
            p = subprocess.Popen(
                self.net.enter(i, [str(self.binary), *self.node_args(i, name, trust)]),
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                env={**os.environ, "RUST_LOG": "info"},
            )  # fmt: skip
        d = Daemon(f"unix://{root / 's.sock'}", root, root / "data", root / "s.sock", log_path, p)
        self.nodes[i] = d
        wait_healthy(d)
        return d

    def metrics(self) -> str:
        req = urllib.request.Request(f"{self.gateway_url}/metrics", headers={"Authorization": f"Bearer {self.token}"})
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.read().decode()

    def alive_nodes(self) -> int:
        for line in self.metrics().splitlines():
            if line.startswith('sandfork_gateway_nodes{state="alive"}'):
                return int(line.split()[1])
        return 0

    def wait_nodes(self, n: int, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            if self.gateway is not None and self.gateway.poll() is not None:
                raise RuntimeError(f"the gateway exited: {self.log_tail(self.root / 'gateway.log')}")
            try:
                if self.alive_nodes() == n:
                    return
            except OSError as e:
                last = str(e)
            time.sleep(0.5)
        raise RuntimeError(f"{n} nodes not alive within {timeout}s ({last}): {self.log_tail(self.root / 'gateway.log')}")

    @staticmethod
    def log_tail(path: Path, lines: int = 30) -> str:
        try:
            return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def client(self):
        from sandfork import Client

        return Client(url=self.gateway_url, token=self.token)

    def node_client(self, i: int):
        from sandfork import Client

        return Client(url=self.nodes[i].url)

    def node_of(self, sandbox_id: str) -> Optional[int]:
        """The node whose daemon runs ``sandbox_id`` (asked directly, not through the gateway)."""
        for i, d in self.nodes.items():
            if d.process.poll() is not None:
                continue
            ids = [s["id"] for s in self.node_client(i).request_json("GET", "/v1/sandboxes")["sandboxes"]]
            if sandbox_id in ids:
                return i
        return None

    def stop_node(self, i: int) -> None:
        """Node ``i`` stopped as an operator would (SIGTERM: it leaves Ray) and checked clean."""
        problems = tear_down(self.nodes.pop(i))
        shutil.rmtree(ray_dir(self.root / f"node{i}" / "data"), ignore_errors=True)
        assert not problems, problems

    def kill_node(self, i: int) -> None:
        """Every process of node ``i`` (its daemon, disk servers and Ray) killed at once."""
        for pid in self.net.pids_in(i):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.nodes[i].process.wait(30)

    def clean_killed(self, i: int) -> List[str]:
        """A killed node's leftovers removed: its daemon started again on its data dir (outside
        the cluster), which adopts and ends what it left, then stopped."""
        d = self.nodes.pop(i)
        root = d.root
        argv = [str(self.binary), "serve", "--data-dir", str(d.data_dir), "--socket", str(d.socket), "--pool-size", "0"]
        with open(d.log, "ab") as log:
            p = subprocess.Popen(self.net.enter(i, argv), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        again = Daemon(d.url, root, d.data_dir, d.socket, d.log, p)
        wait_healthy(again)
        problems = tear_down(again)
        # Its Ray node was killed too: nothing stopped it.
        shutil.rmtree(ray_dir(d.data_dir), ignore_errors=True)
        return problems

    def close(self) -> List[str]:
        problems: List[str] = []
        for i in list(self.nodes):
            d = self.nodes.pop(i)
            if d.process.poll() is not None:
                continue
            try:
                problems += tear_down(d)
            except Exception as e:  # one node's trouble does not keep the rest up
                problems.append(f"node {i}: {e}")
        if self.gateway is not None and self.gateway.poll() is None:
            os.killpg(self.gateway.pid, signal.SIGTERM)
            try:
                self.gateway.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.gateway.pid, signal.SIGKILL)
                self.gateway.wait()
                problems.append("the gateway did not stop within 30 s of SIGTERM")
        for i in range(len(self.net.namespaces)):
            for pid in self.net.pids_in(i):
                try:
                    os.kill(pid, signal.SIGKILL)
                    problems.append(f"process {pid} was left in namespace {i}")
                except ProcessLookupError:
                    pass
        if self.weed is not None:
            self.weed.stop()
        self.net.close()
        for state in [self.root / "gw", *(self.root / f"node{i}" / "data" for i in range(1, self.count + 1))]:
            if ray_dir(state).exists():
                shutil.rmtree(ray_dir(state), ignore_errors=True)
                problems.append(f"Ray's directory for {state} was left")
        return problems
