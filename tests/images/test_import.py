"""Image archives in: an OCI layout directory, an oci-archive on stdin, `docker save`
output (a docker-archive made by skopeo); tampered archives refused."""

from __future__ import annotations

import json
import platform
import subprocess
import tarfile
from pathlib import Path

import pytest

from conftest import oci_layout, tar_layer
from sandfork import Image, Sandbox

pytestmark = pytest.mark.root

ARCH = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())


def cli(daemon, *args: str, stdin: bytes = b"") -> subprocess.CompletedProcess:
    from _daemon import daemon_binary

    return subprocess.run([str(daemon_binary()), "--url", daemon.url, *args], input=stdin, capture_output=True, timeout=300)


def names(daemon) -> list:
    return [i["name"] for i in json.loads(cli(daemon, "--json", "image", "ls").stdout)["images"]]


def test_oci_layout_oci_archive_and_docker_archive(daemon, base_layer: bytes, workdir: Path) -> None:
    layout, _ = oci_layout(workdir / "imp", [base_layer, tar_layer({"imported": b"yes\n"})], {"Env": ["PATH=/bin", "IMPORTED=1"]}, ARCH)

    out = cli(daemon, "image", "import", "-t", "from-layout", str(layout))
    assert out.returncode == 0, out.stderr

    archive = workdir / "imp.tar"
    with tarfile.open(archive, "w") as t:
        t.add(layout, arcname=".")
    out = cli(daemon, "image", "import", "-t", "from-stdin", "-", stdin=archive.read_bytes())
    assert out.returncode == 0, out.stderr

    docker = workdir / "imp-docker.tar"
    subprocess.run(["skopeo", "copy", "--quiet", f"oci:{layout}", f"docker-archive:{docker}:team/saved:v3"], check=True, capture_output=True)
    out = cli(daemon, "image", "import", str(docker))
    assert out.returncode == 0, out.stderr
    assert "docker.io/team/saved:v3" in names(daemon)

    for name in ("from-layout", "from-stdin", "docker.io/team/saved:v3"):
        with Sandbox.create(image=name) as sb:
            r = sb.run("sh", ["-c", "cat /imported; echo $IMPORTED"])
            assert r.stdout.split() == ["yes", "1"], (name, r.stdout, r.stderr)
        Image.get(name).delete()


def test_tampered_archives_are_refused(daemon, base_layer: bytes, workdir: Path) -> None:
    layout, _ = oci_layout(workdir / "tamper", [base_layer, tar_layer({"x": b"original"})], {}, ARCH)
    layer = tar_layer({"x": b"original"})
    import hashlib

    blob = layout / "blobs" / "sha256" / hashlib.sha256(layer).hexdigest()
    blob.write_bytes(tar_layer({"x": b"forged!!"}))
    before = names(daemon)
    out = cli(daemon, "image", "import", "-t", "tampered", str(layout))
    assert out.returncode != 0 and b"does not match its digest" in out.stderr, out.stderr

    out = cli(daemon, "image", "import", "-", stdin=b"not a tar at all")
    assert out.returncode != 0
    empty = workdir / "empty-archive"
    empty.mkdir()
    (empty / "readme").write_text("nothing here")
    out = cli(daemon, "image", "import", "-t", "empty", str(empty))
    assert out.returncode != 0 and b"neither an OCI layout" in out.stderr, out.stderr
    assert names(daemon) == before


def test_export_then_import_and_push_then_pull(daemon, registry, workdir: Path) -> None:
    with Sandbox.create(image="busybox") as sb:
        sb.run("sh", ["-c", "mkdir -p /srv && echo exported > /srv/mark && ln -s /srv/mark /srv/link && sync"])
        snap = sb.checkpoint()
    Image.from_snapshot(snap.snapshot_id, "to-export")
    from sandfork import Snapshot

    Snapshot.get(snap.snapshot_id).delete()

    archive = workdir / "exported.oci.tar"
    out = cli(daemon, "image", "export", "to-export", "-o", str(archive))
    assert out.returncode == 0, out.stderr
    # Readable by other tools: skopeo sees an image in it.
    seen = subprocess.run(["skopeo", "inspect", f"oci-archive:{archive}"], capture_output=True, text=True)
    assert seen.returncode == 0 and '"Architecture"' in seen.stdout, seen.stderr
    out = cli(daemon, "image", "import", "-t", "round-trip", str(archive))
    assert out.returncode == 0, out.stderr
    # What `docker load` reads, and an OCI layout directory.
    saved = workdir / "exported.docker.tar"
    out = cli(daemon, "image", "export", "to-export", "--format", "docker-archive", "-o", str(saved))
    assert out.returncode == 0, out.stderr
    seen = subprocess.run(["skopeo", "inspect", f"docker-archive:{saved}"], capture_output=True, text=True)
    assert seen.returncode == 0 and '"Layers"' in seen.stdout, seen.stderr
    with tarfile.open(saved) as t:
        manifest = json.load(t.extractfile("manifest.json"))
    assert manifest[0]["RepoTags"] == ["to-export:latest"], manifest
    out = cli(daemon, "image", "import", "-t", "from-docker", str(saved))
    assert out.returncode == 0, out.stderr
    layout = workdir / "exported-layout"
    out = cli(daemon, "image", "export", "to-export", "--format", "oci", "-o", str(layout))
    assert out.returncode == 0, out.stderr
    assert (layout / "index.json").is_file() and (layout / "oci-layout").is_file()
    out = cli(daemon, "image", "import", "-t", "from-dir", str(layout))
    assert out.returncode == 0, out.stderr
    out = cli(daemon, "image", "export", "to-export", "--format", "oci", "-o", str(layout))
    assert out.returncode != 0 and b"not empty" in out.stderr, out.stderr

    ref = f"{registry.host}/pushed/app:1"
    out = cli(daemon, "image", "push", "to-export", ref)
    assert out.returncode == 0, out.stderr
    out = cli(daemon, "image", "pull", ref)
    assert out.returncode == 0, out.stderr

    for name in ("round-trip", "from-docker", "from-dir", ref):
        with Sandbox.create(image=name) as sb:
            r = sb.run("sh", ["-c", "cat /srv/mark; readlink /srv/link"])
            assert r.stdout.split() == ["exported", "/srv/mark"], (name, r.stdout, r.stderr)
        Image.get(name).delete()
    Image.get("to-export").delete()
    assert cli(daemon, "image", "export", "no-such", "-o", str(workdir / "x.tar")).returncode != 0
    assert not (workdir / "x.tar").exists()


def test_async_images_export_and_import(daemon, workdir: Path) -> None:
    import asyncio

    from sandfork.aio import AsyncImage

    async def go() -> None:
        with Sandbox.create(image="busybox") as sb:
            sb.run("sh", ["-c", "echo async > /mark && sync"])
            snap = sb.checkpoint()
        image = await AsyncImage.from_snapshot(snap.snapshot_id, "async-src")
        size = await image.export(workdir / "a.docker.tar", format="docker-archive")
        assert size == (workdir / "a.docker.tar").stat().st_size > 0
        again = await AsyncImage.import_(workdir / "a.docker.tar", "async-copy")
        with Sandbox.create(image=again.name) as sb:
            assert sb.run("cat", ["/mark"]).stdout.strip() == "async"
        with pytest.raises(ValueError, match="unknown export format"):
            await image.export(workdir / "b.tar", format="zip")
        for i in (image, again):
            await i.delete()
        from sandfork import Snapshot

        Snapshot.get(snap.snapshot_id).delete()

    asyncio.run(go())


def test_an_exported_image_imports_back_under_its_own_name(daemon, workdir: Path) -> None:
    """Both archive formats round-trip without naming the image again, and an image is
    removed by name from the class (``Image.delete("app")``)."""
    with Sandbox.create(image="busybox") as sb:
        sb.run("sh", ["-c", "echo named > /mark && sync"])
        snap = sb.checkpoint()
    image = Image.from_snapshot(snap.snapshot_id, "named-app")
    from sandfork import Snapshot

    Snapshot.delete(snap.snapshot_id)
    for fmt in ("oci-archive", "docker-archive"):
        path = workdir / f"named.{fmt}.tar"
        image.export(path, format=fmt)
        Image.delete("named-app")
        assert "named-app" not in [i.name for i in Image.list()]
        back = Image.import_(path)
        # An oci-archive keeps the name as it was; a docker-archive's RepoTags are a
        # tagged reference (named-app:latest), imported under its canonical form.
        want = "named-app" if fmt == "oci-archive" else "docker.io/library/named-app:latest"
        assert back.name == want, (fmt, back.name)
        with Sandbox.create(image=back.name) as sb:
            assert sb.run("cat", ["/mark"]).stdout.strip() == "named"
        if back.name != "named-app":
            Image.delete(back.name)
            image = Image.import_(path, "named-app")
        else:
            image = back
    Image.delete("named-app")
