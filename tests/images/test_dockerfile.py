"""Dockerfile builds in real build sandboxes: every instruction kind, the step cache (a
rebuild with a changed late step reuses every earlier one), live output, and bad input."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from sandfork import Image, Sandbox

pytestmark = pytest.mark.root

DOCKERFILE = """\
FROM busybox
ARG GREETING=hi
ENV APP=/app
WORKDIR /app
COPY files/ ./
COPY top.txt /etc/top.txt
RUN echo "$GREETING from run in $(pwd)" > /app/run.txt && cat /etc/top.txt
LABEL team=rl
EXPOSE 8080
USER 1000:1000
CMD ["sh"]
"""


def cli(daemon, *args: str, cwd=None) -> subprocess.CompletedProcess:
    from _daemon import daemon_binary

    return subprocess.run(
        [str(daemon_binary()), "--url", daemon.url, *args], capture_output=True, text=True, timeout=600, cwd=cwd
    )


def context(root: Path, dockerfile: str) -> Path:
    (root / "files" / "sub").mkdir(parents=True, exist_ok=True)
    (root / "files" / "a.txt").write_text("alpha\n")
    (root / "files" / "sub" / "b.txt").write_text("beta\n")
    (root / "files" / "secret.txt").write_text("do not send\n")
    (root / "top.txt").write_text("top file\n")
    (root / ".dockerignore").write_text("files/secret.txt\n*.log\n")
    (root / "noise.log").write_text("ignored\n")
    (root / "Dockerfile").write_text(dockerfile)
    return root


def steps(stderr: str) -> list:
    return [l for l in stderr.splitlines() if l.startswith("step ")]


def test_build_run_and_rebuild_from_the_cache(daemon, workdir: Path) -> None:
    ctx = context(workdir / "ctx-main", DOCKERFILE)
    out = cli(daemon, "image", "build", "-t", "dfapp", "--build-arg", "GREETING=hello", str(ctx))
    assert out.returncode == 0, out.stderr
    assert "top file" in out.stderr, "a RUN step's output streams live"
    first = steps(out.stderr)
    assert len({l.split(':')[0] for l in first}) == 9 and not any("(cached)" in l for l in first), first

    image = Image.get("dfapp")
    assert image.builder == "dockerfile"
    assert image.working_dir == "/app" and image.user == "1000:1000" and image.cmd == ["sh"]
    assert image.env["APP"] == "/app" and image.labels == {"team": "rl"} and image.exposed_ports == ["8080/tcp"]
    with Sandbox.create(image="dfapp") as sb:
        r = sb.run("sh", ["-c", "cat a.txt sub/b.txt run.txt; ls; id -u"])
        assert r.exit_code == 0, r.stderr
        assert r.stdout.split("\n")[:3] == ["alpha", "beta", "hello from run in /app"], r.stdout
        assert "secret.txt" not in r.stdout and "noise.log" not in r.stdout
        assert r.stdout.strip().endswith("1000")

    # Unchanged: every layer step comes from the cache.
    again = cli(daemon, "image", "build", "-t", "dfapp", "--build-arg", "GREETING=hello", str(ctx))
    assert again.returncode == 0, again.stderr
    layered = [l for l in steps(again.stderr) if l.split(": ", 1)[1].startswith(("COPY", "RUN"))]
    assert layered and all("(cached)" in l for l in layered), layered
    assert Image.get("dfapp").digest is None

    # A changed late step: everything before it is cached, it runs.
    (ctx / "Dockerfile").write_text(DOCKERFILE + "RUN echo v2 > /tmp/v2\n")
    late = cli(daemon, "image", "build", "-t", "dfapp", "--build-arg", "GREETING=hello", str(ctx))
    assert late.returncode == 0, late.stderr
    s = steps(late.stderr)
    assert all("(cached)" in l for l in s if l.split(": ", 1)[1].startswith(("COPY", "RUN echo \"$GREETING"))), s
    assert "(cached)" not in s[-1] and "RUN echo v2" in s[-1], s
    # A changed build input (the ARG) misses from the RUN that sees it.
    other = cli(daemon, "image", "build", "-t", "dfapp2", "--build-arg", "GREETING=bye", str(ctx))
    assert other.returncode == 0, other.stderr
    run_line = [l for l in steps(other.stderr) if "RUN echo \"$GREETING" in l]
    assert run_line and "(cached)" not in run_line[0], run_line
    for name in ("dfapp", "dfapp2"):
        Image.get(name).delete()


@pytest.mark.parametrize(
    "dockerfile, message",
    [
        ("FROM busybox\nFROBNICATE x\n", "line 2: unknown instruction FROBNICATE"),
        ("FROM busybox\nRUN echo failing-step; exit 3\n", "failing-step"),
        ("FROM busybox\nCOPY ../outside /x\n", "leaves the build context"),
        ("FROM busybox\nCOPY missing.txt /x\n", "not in the build context"),
        ("FROM no-such-image-here\n", "not found"),
    ],
)
def test_bad_dockerfiles_fail_clearly_and_leave_no_image(daemon, workdir: Path, dockerfile: str, message: str) -> None:
    ctx = workdir / f"bad-{abs(hash(dockerfile))}"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text(dockerfile)
    before = json.loads(cli(daemon, "--json", "image", "ls").stdout)["images"]
    out = cli(daemon, "image", "build", "-t", "badimage", str(ctx))
    assert out.returncode != 0
    assert message in out.stderr, out.stderr
    after = json.loads(cli(daemon, "--json", "image", "ls").stdout)["images"]
    assert [i["name"] for i in after] == [i["name"] for i in before]


def test_a_snapshot_becomes_an_image_that_outlives_it(daemon) -> None:
    from sandfork import Snapshot

    with Sandbox.create(image="busybox", env={"FROM_SNAPSHOT": "yes"}) as sb:
        sb.run("sh", ["-c", "mkdir -p /opt/state && echo warm > /opt/state/ready && sync"])
        snap = sb.checkpoint()
    image = Image.from_snapshot(snap.snapshot_id, "from-snap")
    assert image.builder == "snapshot" and image.env.get("FROM_SNAPSHOT") == "yes"
    Snapshot.get(snap.snapshot_id).delete()
    with Sandbox.create(image="from-snap") as sb:
        r = sb.run("sh", ["-c", "cat /opt/state/ready; echo $FROM_SNAPSHOT"])
        assert r.stdout.split() == ["warm", "yes"], r.stdout
    image.delete()


def test_the_sdk_builds_exports_imports_and_pushes(daemon, registry, workdir: Path) -> None:
    ctx = workdir / "sdk-ctx"
    ctx.mkdir()
    (ctx / "app.txt").write_text("from the sdk\n")
    (ctx / "skip.tmp").write_text("left out\n")
    (ctx / ".dockerignore").write_text("*.tmp\n")
    (ctx / "Dockerfile").write_text("FROM busybox\nARG WHO\nCOPY . /ctx/\nRUN echo $WHO > /ctx/who\n")
    lines: list = []
    image = Image.build(ctx, "sdk-built", build_args={"WHO": "sdk"}, on_progress=lines.append)
    assert image.builder == "dockerfile" and any(l.startswith("step 2/2: RUN") for l in lines), lines
    again: list = []
    Image.build(ctx, "sdk-built", build_args={"WHO": "sdk"}, on_progress=again.append)
    assert all("(cached)" in l for l in again if l.startswith("step")), again

    archive = workdir / "sdk.oci.tar"
    assert image.export(archive) == archive.stat().st_size > 0
    copy = Image.import_(archive, "sdk-copy")
    pushed = image.push(f"{registry.host}/sdk/built:1")
    assert pushed == f"{registry.host}/sdk/built:1"
    for name in ("sdk-built", "sdk-copy"):
        with Sandbox.create(image=name) as sb:
            r = sb.run("sh", ["-c", "cat /ctx/app.txt /ctx/who; ls /ctx"])
            assert r.stdout.split("\n")[:2] == ["from the sdk", "sdk"], r.stdout
            assert "skip.tmp" not in r.stdout
    copy.delete()
    image.delete()


def test_run_without_a_command_starts_the_images_entrypoint_and_cmd(daemon, workdir: Path) -> None:
    ctx = workdir / "entry"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text('FROM busybox\nENTRYPOINT ["echo", "entry"]\nCMD ["and", "cmd"]\n')
    assert cli(daemon, "image", "build", "-t", "entry", str(ctx)).returncode == 0
    out = cli(daemon, "run", "--image", "entry")
    assert out.returncode == 0 and out.stdout.strip() == "entry and cmd", (out.stdout, out.stderr)
    out = cli(daemon, "run", "--image", "busybox")
    assert out.returncode != 0 and "has no entrypoint or command" in out.stderr, out.stderr
    Image.get("entry").delete()
