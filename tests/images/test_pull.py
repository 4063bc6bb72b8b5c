"""Pulls from a real registry into real sandboxes: image config honoured, digests
verified, clear errors that leave nothing half-visible."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import tarfile
from pathlib import Path
from typing import Dict, List

import pytest

from _daemon import daemon_binary, implements_serve, start_daemon, tear_down, wait_healthy
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


def test_pull_with_basic_auth_over_tls(daemon, private_registry: Registry, base_layer: bytes, workdir: Path) -> None:
    from sandfork import Image

    layout, _ = oci_layout(workdir / "private", [base_layer, tar_layer({"secret.txt": b"private\n"})], {}, ARCH)
    private_registry.push(layout, "team/private:1", creds="tester:s3cret")
    ref = f"{private_registry.host}/team/private:1"
    before = image_names(daemon)

    with pytest.raises(SandforkError) as e:
        Image.pull(ref)
    assert e.value.code == "registry_error" and "refused the credentials" in str(e.value), str(e.value)
    with pytest.raises(SandforkError) as e:
        Image.pull(ref, username="tester", password="wrong")
    assert "refused the credentials" in str(e.value), str(e.value)
    assert image_names(daemon) == before

    lines = []
    image = Image.pull(ref, username="tester", password="s3cret", on_progress=lines.append)
    assert image.name == ref and image.builder == "pull"
    assert image.digest and image.digest.startswith("sha256:") and image.source == ref
    assert any("layer 2/2" in l for l in lines), lines
    with Sandbox.create(image=ref) as sb:
        assert sb.run("cat", ["/secret.txt"]).stdout.strip() == "private"
    image.delete()


def test_an_index_gives_the_hosts_platform(daemon, registry: Registry, base_layer: bytes, workdir: Path) -> None:
    from conftest import oci_index_layout
    from sandfork import Image

    other = "arm64" if ARCH != "arm64" else "amd64"
    layout = oci_index_layout(workdir / "multi", {
        ARCH: ([base_layer, tar_layer({"arch": ARCH.encode()})], {"Labels": {"arch": ARCH}}),
        other: ([tar_layer({"arch": other.encode()})], {"Labels": {"arch": other}}),
    })  # fmt: skip
    registry.push(layout, "multi/arch:1", all_platforms=True)
    image = Image.pull(f"{registry.host}/multi/arch:1")
    assert image.labels == {"arch": ARCH}
    with Sandbox.create(image=image.name) as sb:
        assert sb.run("cat", ["/arch"]).stdout == ARCH
    image.delete()


def test_images_sharing_a_base_fetch_it_once_and_concurrent_pulls_share_the_work(
    daemon, registry: Registry, base_layer: bytes, workdir: Path
) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from sandfork import Image

    for name in ("one", "two"):
        layout, _ = oci_layout(workdir / f"pair-{name}", [base_layer, tar_layer({f"{name}.txt": name.encode()})], {}, ARCH)
        registry.push(layout, f"pair/{name}:1")
    first = f"{registry.host}/pair/one:1"
    logs: Dict[int, List[str]] = {0: [], 1: [], 2: []}
    with ThreadPoolExecutor(3) as pool:
        pulled = list(pool.map(lambda i: Image.pull(first, on_progress=logs[i].append), range(3)))
    assert {p.name for p in pulled} == {first}
    # The blob was fetched once: a pull either joined the one in flight (and saw all of
    # its progress, the same lines) or came after it and found the blobs here.
    fetching = [l for l in logs[0] + logs[1] + logs[2] if "layer 2/2" in l and "fetching" in l]
    assert fetching, logs
    for i in logs:
        joined = logs[i] == logs[0] or any("fetching" in l for l in logs[i])
        later = any("layer 2/2" in l and "already here" in l for l in logs[i])
        assert joined or later, logs
    runs = sum(1 for i in logs if not any("already here" in l and "layer 2/2" in l for l in logs[i]))
    distinct_runs = {tuple(logs[i]) for i in logs if any("layer 2/2" in l and "fetching" in l for l in logs[i])}
    assert len(distinct_runs) == 1 and runs >= 1, logs

    lines: List[str] = []
    Image.pull(f"{registry.host}/pair/two:1", on_progress=lines.append)
    assert any("layer 1/2" in l and "already here" in l for l in lines), lines
    assert any("layer 2/2" in l and "fetching" in l for l in lines), lines
    # The base's blocks are shared too: its block-store layer is found, only layer 2 is
    # unpacked.
    assert any("1/2 layers already here" in l for l in lines), lines
    assert not any("1/2 unpacking" in l for l in lines), lines
    for name in ("one", "two"):
        Image.get(f"{registry.host}/pair/{name}:1").delete()


def test_a_truncated_layer_is_refused(daemon, registry: Registry, base_layer: bytes, workdir: Path) -> None:
    import hashlib

    layer = tar_layer({"data/big": bytes(range(256)) * 4096})
    layout, _ = oci_layout(workdir / "truncated", [base_layer, layer], {}, ARCH)
    registry.push(layout, "bad/truncated:1")
    blob = registry.blob_path("sha256:" + hashlib.sha256(layer).hexdigest())
    blob.write_bytes(blob.read_bytes()[: len(layer) // 2])
    before = image_names(daemon)
    out = cli(daemon, "image", "pull", f"{registry.host}/bad/truncated:1")
    assert out.returncode != 0
    assert "bytes" in out.stderr or "digest" in out.stderr, out.stderr
    assert image_names(daemon) == before
    assert list((daemon.data_dir / "blobs" / "tmp").iterdir()) == []


def blob_files(daemon) -> set:
    d = daemon.data_dir / "blobs" / "sha256"
    return {p.name for p in d.iterdir()} if d.exists() else set()


def test_blobs_go_with_the_images_that_name_them(daemon, registry: Registry, base_layer: bytes, workdir: Path) -> None:
    """Compressed blobs are kept while an image names them (another image on the same base
    fetches it once) and removed with the image; a failed pull leaves none."""
    import hashlib

    from sandfork import Image

    before = blob_files(daemon)
    layer = tar_layer({"kept.txt": b"kept"})
    layout, _ = oci_layout(workdir / "blobs-kept", [base_layer, layer], {}, ARCH)
    registry.push(layout, "blobs/kept:1")
    image = Image.pull(f"{registry.host}/blobs/kept:1")
    held = blob_files(daemon) - before
    assert hashlib.sha256(layer).hexdigest() in held, held
    image.delete()
    assert blob_files(daemon) - before == set(), "image rm leaves no blob of its own"

    broken = tar_layer({"data/big": bytes(range(256)) * 4096})
    layout, _ = oci_layout(workdir / "blobs-broken", [base_layer, broken], {}, ARCH)
    registry.push(layout, "blobs/broken:1")
    blob = registry.blob_path("sha256:" + hashlib.sha256(broken).hexdigest())
    blob.write_bytes(blob.read_bytes()[: len(broken) // 2])
    with pytest.raises(SandforkError):
        Image.pull(f"{registry.host}/blobs/broken:1")
    assert blob_files(daemon) - before == set(), "a failed pull leaves no blob"


def test_a_pull_out_of_host_space_while_unpacking_is_insufficient_storage(registry: Registry, base_layer: bytes, workdir: Path) -> None:
    """A pull whose blobs fit but whose unpacked layer does not: 507 insufficient_storage,
    logged, no image, and the daemon's disk back to what it was."""
    from _smallfs import MIB, small_fs

    from sandfork import Image

    big = tar_layer({"data/big": os.urandom(40 * MIB)})
    layout, _ = oci_layout(workdir / "big", [base_layer, big], {}, ARCH)
    registry.push(layout, "space/big:1")
    binary = daemon_binary()
    if binary is None or not implements_serve(binary):
        pytest.skip("the sandfork daemon is not built")
    with small_fs(512) as fs:
        d = start_daemon(binary, ["--insecure-registry", registry.host, "--pool-size", "0"], root=fs.mnt.parent)
        try:
            wait_healthy(d)
            c = Client(url=d.url, token=d.token or "")
            # Room for the compressed blob and the base, not for the unpacked big layer.
            fs.fill(leave=70 * MIB)
            with pytest.raises(SandforkError) as e:
                Image.pull(f"{registry.host}/space/big:1", client=c)
            # The answer streams progress, so the error comes in the stream, not as a status.
            assert e.value.code == "insufficient_storage", e.value
            assert "space" in str(e.value).lower(), e.value
            assert "host disk" in d.log.read_text(errors="replace"), d.log_tail()  # logged
            assert f"{registry.host}/space/big:1" not in [i.name for i in Image.list(client=c)]
            # Once more, with what the first attempt left: never an image that lost writes.
            with pytest.raises(SandforkError) as e:
                Image.pull(f"{registry.host}/space/big:1", client=c)
            assert e.value.code == "insufficient_storage", e.value
        finally:
            fs.unfill()
            problems = [p for p in tear_down(d) if p != str(fs.mnt)]
        assert not problems, "\n".join(problems)


def test_a_loopback_registry_needs_no_insecure_flag(registry: Registry, base_layer: bytes, workdir: Path) -> None:
    """As Docker does, a daemon pulls from a plain-HTTP registry on 127.0.0.0/8 without
    being told it is insecure (a TLS one on loopback stays verified: the private registry's
    tests)."""
    from sandfork import Image

    layout, _ = oci_layout(workdir / "loop", [base_layer], {}, ARCH)
    registry.push(layout, "loop/app:1")
    binary = daemon_binary()
    if binary is None or not implements_serve(binary):
        pytest.skip("the sandfork daemon is not built")
    d = start_daemon(binary, ["--pool-size", "0"])
    try:
        wait_healthy(d)
        c = Client(url=d.url, token=d.token or "")
        image = Image.pull(f"{registry.host}/loop/app:1", client=c)
        assert image.name == f"{registry.host}/loop/app:1"
        image.delete()
    finally:
        problems = tear_down(d)
    assert not problems, "\n".join(problems)
