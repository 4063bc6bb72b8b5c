#!/usr/bin/env python3
"""Images side by side with podman, in one run, medians:
  - pull + first sandbox: `sandfork image pull REF` then `sandfork run --image REF -- true`
    on an empty data directory, against `podman pull` then `podman run --rm REF true` on
    empty podman storage, both from one local registry (the distribution `docker-registry`
    on 127.0.0.1, plain HTTP) holding sandfork's python image (Debian, python3, numpy;
    exported once with `sandfork image export` and pushed there by skopeo);
  - rebuild after a changed late step: a Dockerfile FROM that image with a slow RUN, a
    COPY and a last RUN that each round changes, rebuilt with `sandfork image build`
    against `podman build --layers` (both caches warm from a first build).
Prints one JSON line per figure for bench/report.py. Run as root with podman installed
(`scripts/setup --bench`): `make bench-images`.   env: RUNS (default 3)
"""
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
BIN = os.path.join(TARGET, "release", "sandfork")
CACHE = "/var/cache/sandfork/bench-images"
RUNS = int(os.environ.get("RUNS", "3"))


def sh(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), check=True, capture_output=True, text=True, **kw)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Daemon:
    def __init__(self, root: str, registry: str) -> None:
        self.root = root
        self.sock = os.path.join(root, "s.sock")
        os.makedirs(os.path.join(root, "data"), exist_ok=True)
        self.log = open(os.path.join(root, "daemon.log"), "ab")
        self.proc = subprocess.Popen(
            [BIN, "serve", "--data-dir", os.path.join(root, "data"), "--socket", self.sock,
             "--insecure-registry", registry, "--pool-size", "0"],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        for _ in range(300):
            if self.cli("ls", check=False).returncode == 0:
                return
            time.sleep(0.1)
        raise RuntimeError("the daemon did not start")

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run([BIN, "--url", f"unix://{self.sock}", *args], check=check, capture_output=True, text=True)

    def stop(self) -> None:
        listed = json.loads(self.cli("--json", "ls").stdout or "{}")
        rows = listed.get("sandboxes", []) if isinstance(listed, dict) else listed
        for sb in rows:
            self.cli("rm", sb["id"], check=False)
        self.proc.terminate()
        self.proc.wait(60)
        self.log.close()


def registry(root: str):
    port = free_port()
    host = f"127.0.0.1:{port}"
    cfg = os.path.join(root, "registry.yml")
    with open(cfg, "w") as f:
        f.write(f"version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {root}/registry\nhttp:\n  addr: {host}\n")
    proc = subprocess.Popen(["docker-registry", "serve", cfg], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return host, proc
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("the registry did not start")


def base_archive(host: str) -> str:
    """sandfork's python image as an oci-archive (built and exported once, kept in CACHE)."""
    out = os.path.join(CACHE, "python.oci.tar")
    if os.path.exists(out):
        return out
    os.makedirs(CACHE, exist_ok=True)
    d = Daemon(os.path.join(CACHE, "daemon"), host)
    try:
        d.cli("run", "--image", "python", "--", "true")
        d.cli("image", "export", "python", "-o", out + ".tmp")
        os.replace(out + ".tmp", out)
    finally:
        d.stop()
    return out


class Podman:
    def __init__(self, root: str) -> None:
        self.root = root
        os.makedirs(root, exist_ok=True)
        self.conf = os.path.join(root, "containers.conf")
        with open(self.conf, "w") as f:
            # The host's hard limits are what runc may set (as bench/fork-podman).
            f.write('[containers]\ndefault_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]\n'
                    '[engine]\ncgroup_manager = "cgroupfs"\nevents_logger = "file"\nruntime = "runc"\n')

    def run(self, *args: str) -> subprocess.CompletedProcess:
        env = dict(os.environ, CONTAINERS_CONF=self.conf)
        return subprocess.run(
            ["podman", "--root", os.path.join(self.root, "storage"), "--runroot", os.path.join(self.root, "run"),
             "--cgroup-manager", "cgroupfs", *args],
            check=True, capture_output=True, text=True, env=env)  # fmt: skip

    def reset(self) -> None:
        self.run("rmi", "-a", "-f")


def timed(f) -> float:
    t = time.monotonic()
    f()
    return time.monotonic() - t


def pull_round(work: str, host: str, ref: str, pod: Podman, i: int) -> tuple:
    root = os.path.join(work, f"pull-{i}")
    d = Daemon(root, host)
    try:
        ours = timed(lambda: (d.cli("image", "pull", ref), d.cli("run", "--image", ref, "--", "true")))
    finally:
        d.stop()
        shutil.rmtree(root, ignore_errors=True)
    pod.reset()
    theirs = timed(lambda: (pod.run("pull", "--tls-verify=false", ref), pod.run("run", "--rm", "--network", "none", ref, "true")))
    return ours, theirs


def dockerfile(ctx: str, ref: str, n: int) -> None:
    with open(os.path.join(ctx, "Dockerfile"), "w") as f:
        f.write(f'FROM {ref}\nRUN python3 -c "import time; time.sleep(3)" && echo early > /early\n'
                f"COPY data.txt /data.txt\nRUN echo late-{n} > /late\n")


def main() -> None:
    for tool in ("podman", "skopeo", "docker-registry"):
        if shutil.which(tool) is None:
            sys.exit(f"bench/images.py: needs {tool} (scripts/setup --bench)")
    work = tempfile.mkdtemp(prefix="sandfork-bench-images-", dir="/var/tmp")
    host, reg = registry(work)
    pod = Podman(os.path.join(work, "podman"))
    try:
        archive = base_archive(host)
        ref = f"{host}/bench/python:1"
        sh("skopeo", "copy", "--quiet", "--dest-tls-verify=false", f"oci-archive:{archive}", f"docker://{ref}")
        size = os.path.getsize(archive)
        pulls = [pull_round(work, host, ref, pod, i) for i in range(RUNS)]

        ctx = os.path.join(work, "ctx")
        os.makedirs(ctx)
        with open(os.path.join(ctx, "data.txt"), "w") as f:
            f.write("data\n" * 1000)
        d = Daemon(os.path.join(work, "build"), host)
        rebuilds = []
        try:
            dockerfile(ctx, ref, 0)
            d.cli("image", "build", "-t", "bench-app", ctx)
            pod.run("build", "--layers", "--network", "none", "--tls-verify=false", "-t", "bench-app", ctx)
            for i in range(1, RUNS + 1):
                dockerfile(ctx, ref, i)
                ours = timed(lambda: d.cli("image", "build", "-t", "bench-app", ctx))
                theirs = timed(lambda: pod.run("build", "--layers", "--network", "none", "--tls-verify=false", "-t", "bench-app", ctx))
                rebuilds.append((ours, theirs))
        finally:
            d.stop()

        def line(name: str, pairs: list, base_name: str) -> None:
            ours = statistics.median(p[0] for p in pairs)
            theirs = statistics.median(p[1] for p in pairs)
            print(json.dumps({"suite": "images", "name": name, "value": round(ours, 2), "unit": "s",
                              "baseline": round(theirs, 2), "baseline_name": base_name,
                              "ratio": round(ours / theirs, 2), "runs": len(pairs)}))  # fmt: skip

        mb = size / 2**20
        line(f"pull + first sandbox, python image ({mb:.0f} MiB archive, local registry)", pulls, "podman pull + podman run")
        line("rebuild with a changed last RUN (a slow RUN and a COPY before it cached)", rebuilds, "podman build --layers")
    finally:
        try:
            pod.reset()
        except subprocess.CalledProcessError:
            pass
        reg.terminate()
        reg.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
