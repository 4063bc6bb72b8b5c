#!/usr/bin/env python3
"""Real workloads on the disk path, side by side in one run.

Three workloads, each on four filesystems, interleaved run by run, medians:
  - pip:    a virtual environment and `pip install` of ~50 wheels from a local cache
            (flask, django, boto3, numpy, pandas and their dependencies; 330 MB installed);
  - build:  `git clone` of a mid-size C project (CRIU 4.2.1, ~80k lines) and `make -j2 criu`;
  - sqlite: bench/sqlite_workload.py (100 transactions of 1000 inserts, an index, 2000
            queries).
The filesystems:
  - sandfork: ext4 over FUSE + loop on a block-store disk (the sandbox's root disk: the
    disk server, writeback flushes and the mount options a sandbox gets);
  - overlayfs: an overlay mount with upper and work directories on the host's filesystem,
    as podman's overlay storage driver mounts a container's root (the container's I/O path;
    the processes here run on the host, so only the filesystem differs);
  - loop: ext4 on a plain loop device with direct I/O over a sparse file;
  - host: a directory on the host's own filesystem.
The processes are the host's in every case, so what differs is the disk path alone.

Prints one JSON line per workload and filesystem (value = seconds, baseline = the host's
or overlayfs's), for bench/report.py. Run as root: `make bench-workloads`.
  env: RUNS (default 3), ONLY (regex on workload names)
"""
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = "/var/cache/sandfork/bench-workloads"
WHEELS = ["flask", "django", "requests", "boto3", "sqlalchemy", "pytest", "black", "rich",
          "httpx", "pydantic", "numpy", "pandas", "jupyter-core", "pyyaml"]
CRIU_TARBALL = "criu_4.2.1.orig.tar.xz"
DISK_SIZE = 8 << 30


def run(*args, **kw):
    return subprocess.run(args, check=True, **kw)


def disk_bin():
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    run("cargo", "build", "-q", "--release", "-p", "sandfork-disk", cwd=ROOT)
    return os.path.join(target, "release", "sandfork-disk")


def prepare_inputs():
    """The wheel cache and a git repository of the C project, kept across runs."""
    wheels = os.path.join(CACHE, "wheels")
    if not os.path.isdir(wheels) or len(os.listdir(wheels)) < 40:
        run(sys.executable, "-m", "pip", "download", "-q", "-d", wheels,
            "--only-binary", ":all:", *WHEELS)
    repo = os.path.join(CACHE, "criu.git")
    if not os.path.isdir(repo):
        tarball = next((p for p in (os.path.join(ROOT, "..", "shared", "vendor", CRIU_TARBALL),
                                    os.path.join(ROOT, "vendor", CRIU_TARBALL))
                        if os.path.exists(p)), None)
        if tarball is None:
            sys.exit(f"bench/workloads.py: {CRIU_TARBALL} not found (scripts/setup keeps it)")
        tmp = repo + ".tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        run("tar", "-xJf", tarball, "-C", tmp, "--strip-components=1")
        git = ["git", "-c", "user.name=bench", "-c", "user.email=bench@localhost"]
        run(*git, "init", "-q", cwd=tmp)
        run(*git, "add", "-A", cwd=tmp)
        run(*git, "commit", "-qm", "criu 4.2.1", cwd=tmp)
        os.rename(tmp, repo)
    return wheels, repo


class Filesystems:
    """The four mounts, set up in a temporary directory and torn down whatever happens."""

    def __init__(self, bin_path):
        self.bin = bin_path
        self.work = tempfile.mkdtemp(prefix="sandfork-bench-workloads.", dir="/var/tmp")
        self.loop = None
        self.mounted = []

    def __enter__(self):
        w = self.work
        for d in ("empty", "host", "lower", "upper", "ovl-work", "mnt-overlay", "mnt-loop",
                  "mnt-sandfork"):
            os.makedirs(os.path.join(w, d))
        run("mount", "-t", "overlay", "overlay", "-o",
            f"lowerdir={w}/lower,upperdir={w}/upper,workdir={w}/ovl-work", f"{w}/mnt-overlay")
        self.mounted.append(f"{w}/mnt-overlay")
        with open(f"{w}/plain.img", "wb") as f:
            f.truncate(DISK_SIZE)
        run("mkfs.ext4", "-F", "-q", "-b", "4096", f"{w}/plain.img")
        self.loop = run("losetup", "--direct-io=on", "-b", "4096", "-f", "--show",
                        f"{w}/plain.img", capture_output=True, text=True).stdout.strip()
        run("mount", self.loop, f"{w}/mnt-loop")
        self.mounted.append(f"{w}/mnt-loop")
        with open(f"{w}/image.img", "wb") as f:
            f.truncate(DISK_SIZE)
        run("mkfs.ext4", "-F", "-q", "-b", "4096", "-d", f"{w}/empty", f"{w}/image.img")
        run(self.bin, "create", "--store", f"{w}/store", "--disk", "bench",
            "--image", f"{w}/image.img", capture_output=True)
        os.remove(f"{w}/image.img")
        run(self.bin, "mount", "--store", f"{w}/store", "--disk", "bench", "--dir",
            f"{w}/run", "--mountpoint", f"{w}/mnt-sandfork", capture_output=True)
        return {"sandfork": f"{w}/mnt-sandfork", "overlayfs": f"{w}/mnt-overlay",
                "loop": f"{w}/mnt-loop", "host": f"{w}/host"}

    def __exit__(self, *exc):
        w = self.work
        subprocess.run([self.bin, "teardown", "--store", f"{w}/store", "--disk", "bench",
                        "--dir", f"{w}/run", "--mountpoint", f"{w}/mnt-sandfork"],
                       capture_output=True)
        for m in reversed(self.mounted):
            subprocess.run(["umount", m], capture_output=True)
        if self.loop:
            subprocess.run(["losetup", "-d", self.loop], capture_output=True)
        subprocess.run([self.bin, "cleanup", w], capture_output=True)
        shutil.rmtree(w, ignore_errors=True)


def timed(args, cwd=None):
    t = time.perf_counter()
    run(*args, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t


def pip_workload(wheels):
    def go(dir):
        venv = os.path.join(dir, "venv")
        t = timed([sys.executable, "-m", "venv", "--without-pip", venv])
        t += timed([sys.executable, "-m", "pip", "--python", os.path.join(venv, "bin", "python"),
                    "install", "-q", "--no-index", "--find-links", wheels, *WHEELS])
        return t
    return go


def build_workload(repo):
    def go(dir):
        src = os.path.join(dir, "criu")
        t = timed(["git", "clone", "-q", "--no-hardlinks", repo, src])
        t += timed(["make", "-j2", "criu"], cwd=src)
        return t
    return go


def sqlite_workload(dir):
    out = run(sys.executable, os.path.join(ROOT, "bench", "sqlite_workload.py"), dir,
              capture_output=True, text=True).stdout
    return float(out.strip())


def clear(dir):
    """Empties a workload's directory between runs (not timed), then syncs the host."""
    for name in os.listdir(dir):
        p = os.path.join(dir, name)
        shutil.rmtree(p) if os.path.isdir(p) and not os.path.islink(p) else os.remove(p)
    os.sync()


def main():
    runs = int(os.environ.get("RUNS", "3"))
    only = re.compile(os.environ.get("ONLY", ""))
    bin_path = disk_bin()
    wheels, repo = prepare_inputs()
    workloads = [("pip install of 49 wheels into a venv", pip_workload(wheels)),
                 ("git clone + make -j2 of a C project (CRIU)", build_workload(repo)),
                 ("SQLite workload", sqlite_workload)]
    with Filesystems(bin_path) as mounts:
        for name, go in workloads:
            if not only.search(name):
                continue
            times = {fs: [] for fs in mounts}
            for _ in range(runs):
                for fs, dir in mounts.items():
                    d = os.path.join(dir, "w")
                    os.makedirs(d)
                    times[fs].append(go(d))
                    clear(dir)
            med = {fs: statistics.median(v) for fs, v in times.items()}
            for fs in ("sandfork", "overlayfs", "loop"):
                for base in ("host", "overlayfs") if fs == "sandfork" else ("host",):
                    print(json.dumps({
                        "suite": "workloads", "name": f"{name}: {fs} vs {base}",
                        "value": round(med[fs], 2), "unit": "s",
                        "baseline": round(med[base], 2), "baseline_name": base,
                        "ratio": round(med[fs] / med[base], 3),
                        "target": ("<= 1.1" if base == "host" else "<= 1.05")
                        if fs == "sandfork" else "", "runs": runs}), flush=True)


if __name__ == "__main__":
    main()
