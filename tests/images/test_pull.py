"""Pulls from a real registry into real sandboxes: image config honoured, digests
verified, clear errors that leave nothing half-visible."""

from __future__ import annotations

import json
import platform
import subprocess
import tarfile
from pathlib import Path

import pytest

from conftest import Registry, oci_layout, tar_layer
from sandfork import Client, Sandbox, SandforkError

pytestmark = pytest.mark.root

ARCH = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())


def cli(daemon, *args: str, stdin: str = "") -> subprocess.CompletedProcess:
    from _daemon import daemon_binary

    return subprocess.run(
        [str(daemon_binary()), "--url", daemon.url, *args], input=stdin, capture_output=True, text=True, timeout=300
    )


def image_names(daemon) -> list:
    out = cli(daemon, "--json", "image", "ls")
    assert out.returncode == 0, out.stderr
    return [i["name"] for i in json.loads(out.stdout)["images"]]


def test_pull_and_run_with_the_image_config(daemon, registry: Registry, base_layer: bytes, workdir: Path) -> None:
    app = tar_layer({"app/hello.txt": b"hello from the registry\n"})
    config = {
        "Env": ["GREETING=hi", "PATH=/bin"],
        "WorkingDir": "/srv/work",
        "User": "1000:1000",
        "Cmd": ["sh"],
        "ExposedPorts": {"8080/tcp": {}},
        "Labels": {"team": "rl"},
    }
    layout, _ = oci_layout(workdir / "app", [base_layer, app], config, ARCH)
    registry.push(layout, "team/app:v1")
    ref = f"{registry.host}/team/app:v1"

    out = cli(daemon, "image", "pull", ref)
    assert out.returncode == 0, out.stderr
    assert ref in image_names(daemon)

    with Sandbox.create(image=ref) as sb:
        r = sb.run("sh", ["-c", "cat /app/hello.txt; echo $GREETING; pwd; id -u"])
        assert r.exit_code == 0, r.stderr
        assert r.stdout.split("\n")[:4] == ["hello from the registry", "hi", "/srv/work", "1000"]
        # A request naming a user and directory still wins over the image's defaults.
        r = sb.run("sh", ["-c", "id -u; pwd"], user="root", working_dir="/")
        assert r.stdout.split() == ["0", "/"]

    out = cli(daemon, "image", "rm", ref)
    assert out.returncode == 0, out.stderr
    assert ref not in image_names(daemon)


def test_create_pulls_a_reference_it_does_not_have(daemon, registry: Registry, base_layer: bytes, workdir: Path) -> None:
    layout, digest = oci_layout(workdir / "auto", [base_layer], {"Env": ["PATH=/bin"]}, ARCH)
    registry.push(layout, "auto/base:1")
    ref = f"{registry.host}/auto/base@{digest}"
    with Sandbox.create(image=ref) as sb:
        assert sb.run("sh", ["-c", "echo ok"]).stdout.strip() == "ok"
    assert cli(daemon, "image", "rm", ref).returncode == 0


def test_unknown_tag_and_bad_reference(daemon, registry: Registry) -> None:
    before = image_names(daemon)
    out = cli(daemon, "image", "pull", f"{registry.host}/nothing/here:v9")
    assert out.returncode != 0
    assert "not found" in out.stderr, out.stderr
    out = cli(daemon, "image", "pull", "Bad Reference")
    assert out.returncode != 0 and "invalid image reference" in out.stderr, out.stderr
    assert image_names(daemon) == before


def test_a_blob_that_does_not_match_its_digest_is_refused(daemon, registry: Registry, base_layer: bytes, workdir: Path) -> None:
    layer = tar_layer({"data/x": b"original content"})
    layout, _ = oci_layout(workdir / "tampered", [base_layer, layer], {}, ARCH)
    registry.push(layout, "bad/blob:1")
    import gzip, hashlib

    digest = "sha256:" + hashlib.sha256(layer).hexdigest()
    blob = registry.blob_path(digest)
    assert blob.exists()
    forged = tar_layer({"data/x": b"forged content!!"})
    assert len(forged) == len(layer) or True
    blob.write_bytes(forged)
    before = image_names(daemon)
    out = cli(daemon, "image", "pull", f"{registry.host}/bad/blob:1")
    assert out.returncode != 0
    assert "digest" in out.stderr or "bytes" in out.stderr, out.stderr
    assert image_names(daemon) == before
    # Nothing unverified was kept in the blob store.
    assert not (daemon.data_dir / "blobs" / "sha256" / digest.split(":")[1]).exists()
    assert list((daemon.data_dir / "blobs" / "tmp").iterdir()) == []


def test_a_layer_escaping_the_root_is_refused(daemon, registry: Registry, base_layer: bytes, workdir: Path) -> None:
    evil = tarfile.TarInfo("../../escaped")
    evil.size = 0
    layer = tar_layer({}, [evil])
    layout, _ = oci_layout(workdir / "evil", [base_layer, layer], {}, ARCH)
    registry.push(layout, "evil/layer:1")
    before = image_names(daemon)
    out = cli(daemon, "image", "pull", f"{registry.host}/evil/layer:1")
    assert out.returncode != 0
    assert "unsafe path" in out.stderr, out.stderr
    assert image_names(daemon) == before
    assert not (daemon.data_dir / "escaped").exists()
