#!/usr/bin/env python3
"""Warm states (the examples' seed use cases) checkpointed and restored, sandfork next to
podman + CRIU in the same run: a logged-in Chromium, PostgreSQL with open connections, a
Python process holding a pandas DataFrame and numba-compiled code.

Each state is one shell script (``STATES``) started in a sandbox of its image and, for the
baseline, as the command of a podman container whose root filesystem is a copy of the same
sandbox's (tar → ``podman import``): the same files and programs on both sides. Measured:
the memory checkpoint (the source keeps running: sandfork's memory checkpoint,
``podman container checkpoint --leave-running --export --compress none``), its size, and
restore → first exec (``Snapshot.fork(1)`` and a first ``run``; ``podman container restore
--import`` and a first ``podman exec``), median of RUNS. Each restored copy is checked (the
state's CHECK must print its expected word) before it counts. Prints JSON lines for
bench/report.py.

Run as root with a daemon up (``scripts/with-daemon python3 bench/warm.py``; ``make
bench-warm`` does it). Images are built through the daemon on first use.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional

from sandfork import CheckpointType, Client, Sandbox

ROOT = Path(__file__).resolve().parent.parent


def example(name: str):
    """An example script as a module: its programs are what the states run."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def build_image(name: str, body: dict) -> None:
    client = Client()
    if any(i.get("name") == name for i in (client.request_json("GET", "/v1/images") or {}).get("images", [])):
        return
    print(f"building the {name} image (first use; once) …", file=sys.stderr, flush=True)
    last: dict = {}
    with client.open("POST", "/v1/images", json_body=dict(body, name=name), unbounded=True) as stream:
        for last in stream.iter_json_lines():
            pass
    if last.get("type") != "done":
        raise RuntimeError(f"the {name} image build failed: {last.get('message', last)}")


@dataclass
class State:
    name: str
    image: str
    image_body: Optional[dict]  # how to build the image when missing (None: built-in)
    files: Dict[str, str]       # written to /opt/warm before the script starts
    script: str                 # starts the state, touches /tmp/warm-ready, stays
    check: str                  # run in a restored copy: prints `expect` when the state is intact
    expect: str
    memory_mb: int


def states() -> List[State]:
    browser, ml = example("browser_pool"), example("ml_worker")
    pg = "/usr/lib/postgresql/15/bin"
    pg_holder = (
        "import os, socket, psycopg2\n"
        "c = psycopg2.connect(dbname='postgres', user='postgres', host='/var/run/postgresql')\n"
        "c.autocommit = True\n"
        "cur = c.cursor()\n"
        "cur.execute('CREATE TABLE IF NOT EXISTS t AS SELECT g AS v FROM generate_series(1, 200000) g')\n"
        "srv = socket.socket(socket.AF_UNIX); srv.bind('/tmp/holder.sock'); srv.listen(8)\n"
        "print('ready', flush=True)\n"
        "while True:\n"
        "    s, _ = srv.accept()\n"
        "    cur.execute('SELECT count(*) FROM t'); s.sendall(str(cur.fetchone()[0]).encode()); s.close()\n"
    )
    return [
        State(
            name="browser (Chromium logged in, Playwright)",
            image="browser", image_body=None,
            files={"app.py": browser.APP, "browser.py": browser.BROWSER, "ask.py": browser.ASK},
            script="python3 /opt/warm/app.py & python3 /opt/warm/browser.py alice >/tmp/warm.log 2>&1 & "
                   "until grep -q ready /tmp/warm.log; do sleep 0.2; done; touch /tmp/warm-ready; exec sleep infinity",
            check="python3 /opt/warm/ask.py /orders/1", expect="logged in as alice", memory_mb=2048,
        ),
        State(
            name="PostgreSQL (200 k rows, a connection open)",
            image="sandfork-test-postgres",
            image_body={"builder": "python", "apt": ["postgresql", "python3-psycopg2"]},
            files={"holder.py": pg_holder},
            script="mkdir -p /var/run/postgresql && chown postgres /var/run/postgresql && "
                   f"su postgres -c '{pg}/pg_ctl -D /var/lib/postgresql/15/main "
                   "-o \"-c config_file=/etc/postgresql/15/main/postgresql.conf\" -l /tmp/pg.log -w start' && "
                   "(su postgres -c 'python3 /opt/warm/holder.py' >/tmp/warm.log 2>&1 &) && "
                   "until grep -q ready /tmp/warm.log; do sleep 0.2; done; touch /tmp/warm-ready; exec sleep infinity",
            check="python3 -c \"import socket; s=socket.socket(socket.AF_UNIX); s.connect('/tmp/holder.sock'); "
                  "print('rows', s.recv(64).decode())\"",
            expect="rows 200000", memory_mb=1024,
        ),
        State(
            name="ML worker (488 MiB DataFrame, numba)",
            image="ml-worker", image_body={"builder": "python", "pip": ["numba", "pandas"]},
            files={"worker.py": ml.WORKER, "ask.py": ml.ASK},
            script="python3 /opt/warm/worker.py 32000000 >/tmp/warm.log 2>&1 & "
                   "until grep -q ready /tmp/warm.log; do sleep 0.2; done; touch /tmp/warm-ready; exec sleep infinity",
            check="python3 /opt/warm/ask.py 0.5", expect='"signatures": 1', memory_mb=2048,
        ),
    ]


def wait(ready: Callable[[], bool], what: str, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not get ready in {timeout:.0f} s")
        time.sleep(0.2)


def ms(t: float) -> float:
    return round((time.monotonic() - t) * 1000, 1)


class Podman:
    """A podman with its own storage and configuration in a scratch directory."""

    def __init__(self, work: Path):
        self.work = work
        conf = work / "containers.conf"
        conf.write_text('[containers]\ndefault_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]\n'
                        '[engine]\ncgroup_manager = "cgroupfs"\nevents_logger = "file"\nruntime = "runc"\n')
        self.env = dict(os.environ, CONTAINERS_CONF=str(conf))

    def __call__(self, *args: str, check: bool = True, stdin=None) -> subprocess.CompletedProcess:
        cmd = ["podman", "--root", str(self.work / "storage"), "--runroot", str(self.work / "run"),
               "--cgroup-manager", "cgroupfs", *args]
        r = subprocess.run(cmd, env=self.env, stdin=stdin, capture_output=True, text=True)
        if check and r.returncode != 0:
            errors = [ln for ln in r.stderr.splitlines() if "Error" in ln] or r.stderr.splitlines()[-1:]
            raise RuntimeError(f"podman {' '.join(args[:2])}: {' / '.join(errors)[-600:]}")
        return r

    def close(self) -> None:
        self("rm", "-a", "-f", "-t", "0", check=False)
        self("system", "reset", "--force", check=False)
        shutil.rmtree(self.work, ignore_errors=True)


def criu_errors(work: Path) -> str:
    """The error lines of the last CRIU dump log under podman's storage."""
    logs = sorted(work.glob("storage/overlay-containers/*/userdata/dump.log"), key=lambda p: p.stat().st_mtime)
    if not logs:
        return "no dump log"
    # CRIU's complaint about RLIMIT_NOFILE is a warning it logs as an error on every dump.
    lines = [" ".join(ln.split(": ", 1)[-1].split()) for ln in logs[-1].read_text(errors="replace").splitlines()
             if "Error" in ln and "RLIMIT_NOFILE" not in ln]
    return " / ".join(lines[:2])[-300:] or "no error in the dump log"


def prepare(state: State) -> Sandbox:
    """A sandbox of the state's image with its programs written (not started yet)."""
    if state.image_body is not None:
        build_image(state.image, state.image_body)
    sb = Sandbox.create(image=state.image, memory_mb=state.memory_mb, disk_mb=8192, allow_internet_access=False)
    for name, text in state.files.items():
        sb.write_file(f"/opt/warm/{name}", text.encode())
    sb.write_file("/opt/warm/start.sh", state.script.encode())
    return sb


def checked(run: Callable[[str], str], state: State, who: str) -> None:
    out = run(state.check)
    if state.expect not in out:
        raise RuntimeError(f"{who}: the state did not survive: {out[-300:]!r}")


def bench_sandfork(state: State, runs: int) -> dict:
    src = prepare(state)
    snap = None
    try:
        t = time.monotonic()
        src.start_process("sh", ["/opt/warm/start.sh"])
        wait(lambda: src.run("test", ["-e", "/tmp/warm-ready"]).exit_code == 0, state.name)
        setup = ms(t)
        cps = []
        for _ in range(runs):
            if snap is not None:
                snap.delete()
            t = time.monotonic()
            snap = src.checkpoint(checkpoint_type=CheckpointType.MEMORY)
            cps.append(ms(t))
        restores = []
        for i in range(runs):
            t = time.monotonic()
            kids = snap.fork(1)
            kids.raise_for_errors()
            try:
                kids[0].run("true")
                restores.append(ms(t))
                checked(lambda c: (lambda r: r.stdout + r.stderr)(kids[0].run("sh", ["-c", c], timeout=120)), state, f"sandfork copy {i}")
            finally:
                kids[0].terminate()
        return {"setup": setup, "checkpoint": cps, "size": snap.size_bytes, "restore": restores}
    finally:
        if snap is not None:
            snap.delete()
        src.terminate()


def bench_podman(state: State, runs: int) -> dict:
    if shutil.which("podman") is None:
        raise RuntimeError("podman is not installed")
    pod = Podman(Path(tempfile.mkdtemp(prefix="sandfork-bench-warm.", dir="/var/tmp")))
    try:
        sb = prepare(state)  # the same root filesystem, programs included, as a podman image
        try:
            # In parts: one download is capped (1 GiB by default), the browser's is larger.
            tar = "tar -C / --one-file-system --exclude=./var/tmp/root -cf - . | split -b 512M - /var/tmp/root/part."
            r = sb.run("sh", ["-c", f"mkdir -p /var/tmp/root && {tar} && ls /var/tmp/root"], timeout=900)
            if r.exit_code != 0:
                raise RuntimeError(f"tar of the image failed: {r.stderr[-300:]}")
            with open(pod.work / "root.tar", "wb") as whole:
                for part in r.stdout.split():
                    sb.download_file(f"/var/tmp/root/{part}", pod.work / "part")
                    with open(pod.work / "part", "rb") as f:
                        shutil.copyfileobj(f, whole, 1 << 20)
                    (pod.work / "part").unlink()
        finally:
            sb.terminate()
        with open(pod.work / "root.tar", "rb") as f:
            pod("import", "-", "warm", stdin=f)
        (pod.work / "root.tar").unlink()
        # Established loopback connections are dumped with their state. podman 4 refuses to
        # restore them under another name and has no option to close them instead, so each
        # copy is restored as the source itself, once the source is gone.
        opts = ["--file-locks", "--tcp-established"]
        t = time.monotonic()
        pod("run", "-d", "--name", "src", "--network", "none", "-m", f"{state.memory_mb}m", "warm", "sh", "/opt/warm/start.sh")
        wait(lambda: pod("exec", "src", "test", "-e", "/tmp/warm-ready", check=False).returncode == 0, state.name)
        setup = ms(t)
        export = pod.work / "cp.tar"
        cps = []
        for _ in range(runs):
            t = time.monotonic()
            r = pod("container", "checkpoint", "--leave-running", "--export", str(export), "--compress", "none", *opts, "src", check=False)
            if r.returncode != 0:
                raise RuntimeError(f"podman container checkpoint: CRIU: {criu_errors(pod.work)}")
            cps.append(ms(t))
        pod("rm", "-f", "-t", "0", "src")
        restores = []
        for i in range(runs):
            t = time.monotonic()
            pod("container", "restore", "--import", str(export), *opts)
            pod("exec", "src", "true")
            restores.append(ms(t))
            # podman 4's restore with `--network none` leaves the copy's loopback down.
            pid = pod("inspect", "-f", "{{.State.Pid}}", "src").stdout.strip()
            subprocess.run(["nsenter", "-t", pid, "-n", "ip", "link", "set", "lo", "up"], check=True)
            checked(lambda c: (lambda r: r.stdout + r.stderr)(pod("exec", "src", "sh", "-c", c, check=False)), state, f"podman copy {i}")
            pod("rm", "-f", "-t", "0", "src")
        return {"setup": setup, "checkpoint": cps, "size": export.stat().st_size, "restore": restores}
    finally:
        pod.close()


def rows(state: State, ours: dict, base: Optional[dict], why: str) -> List[dict]:
    out = []
    for key, label, unit, scale in (("checkpoint", "memory checkpoint", "ms", 1), ("size", "snapshot size", "MiB", 2**-20),
                                    ("restore", "restore → first exec", "ms", 1)):
        value = ours[key] if key == "size" else statistics.median(ours[key])
        row = {"suite": "warm", "name": f"{state.name}: {label}", "value": round(value * scale, 1), "unit": unit}
        if base is not None:
            b = base[key] if key == "size" else statistics.median(base[key])
            row.update(baseline=round(b * scale, 1), baseline_name="podman + CRIU", ratio=round(value / b, 2))
        elif why:
            row.update(baseline_name=f"podman + CRIU: {why}")
        out.append(row)
    out.append({"suite": "warm", "name": f"{state.name}: setup (not compared)", "value": round(ours["setup"] / 1000, 2), "unit": "s"})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--only", help="a state whose name starts with this")
    ap.add_argument("--no-podman", action="store_true")
    args = ap.parse_args()
    for state in states():
        if args.only and not state.name.lower().startswith(args.only.lower()):
            continue
        ours = bench_sandfork(state, args.runs)
        base, why = None, "not run"
        if not args.no_podman:
            try:
                base = bench_podman(state, args.runs)
            except Exception as e:  # noqa: BLE001 - the baseline's failure is a result
                why = f"failed ({str(e).splitlines()[-1][:160]})"
                print(f"podman + CRIU, {state.name}: {e}", file=sys.stderr)
        for row in rows(state, ours, base, why):
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
