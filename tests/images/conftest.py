"""Fixtures of the image suite: a real OCI registry (the distribution ``docker-registry``
server) on 127.0.0.1 with images pushed by ``skopeo`` from OCI layouts the tests build,
and one real daemon that pulls from it over plain HTTP (``--insecure-registry``).

Needs root (real sandboxes), ``docker-registry`` and ``skopeo`` (scripts/setup installs
both); the tests skip with the reason otherwise. Everything started is stopped and every
directory made is removed on teardown, also when a test fails.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "sdk" / "python" / "src"), str(REPO / "sdk" / "python" / "tests")]

from _daemon import Daemon, daemon_binary, implements_serve, start_daemon, tear_down, url_in_env, wait_healthy  # noqa: E402


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "root: needs root, runc and a registry (real pulls into real sandboxes)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Registry:
    """A distribution registry on 127.0.0.1 with its storage in a temporary directory;
    with ``tls`` (certificate, key) it serves HTTPS, with ``htpasswd`` it wants basic auth."""

    def __init__(self, root: Path, tls: Optional[Tuple[Path, Path]] = None, htpasswd: Optional[Path] = None) -> None:
        self.root = root
        self.port = free_port()
        self.host = f"127.0.0.1:{self.port}"
        self.storage = root / "storage"
        self.tls = tls
        config = root / "config.yml"
        text = (
            "version: 0.1\n"
            "log:\n  level: warn\n"
            f"storage:\n  filesystem:\n    rootdirectory: {self.storage}\n  delete:\n    enabled: true\n"
            f"http:\n  addr: {self.host}\n"
        )
        if tls:
            text += f"  tls:\n    certificate: {tls[0]}\n    key: {tls[1]}\n"
        if htpasswd:
            text += f"auth:\n  htpasswd:\n    realm: test\n    path: {htpasswd}\n"
        config.write_text(text)
        self.log = open(root / "registry.log", "wb")
        self.process = subprocess.Popen(
            ["docker-registry", "serve", str(config)], stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.monotonic() + 20
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    break
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"registry did not start: {(root / 'registry.log').read_text()}")
                time.sleep(0.1)

    def push(self, layout: Path, ref: str, creds: Optional[str] = None, all_platforms: bool = False) -> None:
        """Pushes the OCI layout's image (or index, with ``all_platforms``) to
        ``<registry>/<ref>`` with skopeo."""
        args = ["skopeo", "copy", "--quiet", "--dest-tls-verify=false"]
        if creds:
            args += ["--dest-creds", creds]
        if all_platforms:
            args += ["--all"]
        subprocess.run([*args, f"oci:{layout}", f"docker://{self.host}/{ref}"], check=True, capture_output=True)

    def blob_path(self, digest: str) -> Path:
        hexd = digest.split(":", 1)[1]
        return self.storage / "docker/registry/v2/blobs/sha256" / hexd[:2] / hexd / "data"

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


def tar_layer(files: Dict[str, bytes], extra: Optional[List[tarfile.TarInfo]] = None) -> bytes:
    """A gzip-compressed layer tar holding ``files`` (path → content) and ``extra`` entries."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as t:
        dirs = set()
        for path in files:
            parts = path.split("/")[:-1]
            for i in range(1, len(parts) + 1):
                d = "/".join(parts[:i])
                if d and d not in dirs:
                    dirs.add(d)
                    info = tarfile.TarInfo(d)
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    t.addfile(info)
        for path, content in files.items():
            info = tarfile.TarInfo(path)
            info.size, info.mode = len(content), 0o755
            t.addfile(info, io.BytesIO(content))
        for info in extra or []:
            t.addfile(info)
    return gzip.compress(raw.getvalue(), mtime=0)


def oci_layout(dest: Path, layers: List[bytes], config: Dict, arch: Optional[str] = None) -> Tuple[Path, str]:
    """Writes an OCI image layout with ``layers`` (gzip tars) and ``config`` (the image
    config's ``config`` object); returns the layout and the manifest digest."""
    blobs = dest / "blobs" / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)

    def put(data: bytes) -> str:
        d = hashlib.sha256(data).hexdigest()
        (blobs / d).write_bytes(data)
        return f"sha256:{d}"

    diff_ids = [f"sha256:{hashlib.sha256(gzip.decompress(l)).hexdigest()}" for l in layers]
    cfg = {
        "architecture": arch or "amd64",
        "os": "linux",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    }
    cfg_bytes = json.dumps(cfg).encode()
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": put(cfg_bytes), "size": len(cfg_bytes)},
        "layers": [
            {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": put(l), "size": len(l)} for l in layers
        ],
    }
    m_bytes = json.dumps(manifest).encode()
    m_digest = put(m_bytes)
    index = {
        "schemaVersion": 2,
        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": m_digest, "size": len(m_bytes)}],
    }
    (dest / "index.json").write_text(json.dumps(index))
    (dest / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
    return dest, m_digest


def oci_index_layout(dest: Path, images: Dict[str, Tuple[List[bytes], Dict]]) -> Path:
    """Writes an OCI layout whose one entry is an image index with one image per
    architecture (``arch`` → (layers, config))."""
    entries = []
    for arch, (layers, config) in images.items():
        sub, digest = oci_layout(dest / f".{arch}", layers, config, arch)
        for blob in (sub / "blobs" / "sha256").iterdir():
            target = dest / "blobs" / "sha256" / blob.name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(blob, target)
        size = (dest / "blobs" / "sha256" / digest.split(":")[1]).stat().st_size
        entries.append({
            "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": digest, "size": size,
            "platform": {"architecture": arch, "os": "linux"},
        })  # fmt: skip
        shutil.rmtree(sub)
    index = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": entries}).encode()
    d = hashlib.sha256(index).hexdigest()
    (dest / "blobs" / "sha256" / d).write_bytes(index)
    top = {"schemaVersion": 2, "manifests": [{"mediaType": "application/vnd.oci.image.index.v1+json", "digest": f"sha256:{d}", "size": len(index)}]}
    (dest / "index.json").write_text(json.dumps(top))
    (dest / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
    return dest


def make_tls(root: Path) -> Tuple[Path, Path, Path]:
    """A CA and a certificate for 127.0.0.1 signed by it: (ca.pem, cert.pem, key.pem)."""
    ca_key, ca, key, csr, cert = (root / n for n in ("ca.key", "ca.pem", "key.pem", "req.csr", "cert.pem"))
    ext = root / "ext.cnf"
    ext.write_text("subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n")
    run = lambda *a: subprocess.run(["openssl", *a], check=True, capture_output=True)  # noqa: E731
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(ca_key), "-out", str(ca), "-days", "2", "-subj", "/CN=sandfork test CA")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr), "-subj", "/CN=127.0.0.1")
    run("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial", "-out", str(cert), "-days", "2", "-extfile", str(ext))
    return ca, cert, key


def htpasswd(path: Path, user: str, password: str) -> Path:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import crypt

    hashed = crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH)).replace("$2b$", "$2a$", 1)
    path.write_text(f"{user}:{hashed}\n")
    return path


@pytest.fixture(scope="session")
def workdir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="sfimg-"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session")
def registry(workdir: Path) -> Iterator[Registry]:
    for tool in ("docker-registry", "skopeo"):
        if shutil.which(tool) is None:
            pytest.skip(f"needs {tool} (scripts/setup installs it)")
    root = workdir / "registry"
    root.mkdir()
    r = Registry(root)
    try:
        yield r
    finally:
        r.stop()


@pytest.fixture(scope="session")
def private_registry(workdir: Path, registry: Registry) -> Iterator[Registry]:
    """A registry over TLS with a self-signed CA, wanting basic auth (user ``tester``)."""
    if shutil.which("openssl") is None:
        pytest.skip("needs openssl")
    root = workdir / "private"
    root.mkdir()
    ca, cert, key = make_tls(root)
    r = Registry(root, tls=(cert, key), htpasswd=htpasswd(root / "htpasswd", "tester", "s3cret"))
    r.ca = ca  # type: ignore[attr-defined]
    try:
        yield r
    finally:
        r.stop()


@pytest.fixture(scope="session")
def base_layer(workdir: Path) -> bytes:
    """A busybox root filesystem as one layer: the base every test image builds on."""
    busybox = Path("/bin/busybox")
    if not busybox.exists():
        pytest.skip("needs busybox-static (scripts/setup installs it)")
    files = {"bin/busybox": busybox.read_bytes()}
    links = []
    for tool in ("sh", "cat", "ls", "id", "pwd", "env", "echo", "sleep", "test"):
        info = tarfile.TarInfo(f"bin/{tool}")
        info.type, info.linkname = tarfile.SYMTYPE, "busybox"
        links.append(info)
    etc = {
        "etc/passwd": b"root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000:app:/home/app:/bin/sh\n",
        "etc/group": b"root:x:0:\napp:x:1000:\n",
    }
    return tar_layer({**files, **etc}, links)


@pytest.fixture(scope="session")
def daemon(registry: Registry, private_registry: Registry) -> Iterator[Daemon]:
    if os.geteuid() != 0:
        pytest.skip("needs root (runc, loop devices)")
    binary = daemon_binary()
    if binary is None or not implements_serve(binary):
        pytest.skip("the sandfork daemon is not built (cargo build -p sandfork, or set SANDFORK_BIN)")
    args = ["--insecure-registry", registry.host, "--registry-ca", str(private_registry.ca), "--pool-size", "0"]  # type: ignore[attr-defined]
    d = start_daemon(binary, args)
    try:
        wait_healthy(d)
        with url_in_env(d):
            yield d
    finally:
        problems = tear_down(d)
        assert not problems, "after the image suite:\n" + "\n".join(problems)
