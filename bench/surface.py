#!/usr/bin/env python3
"""What agents use every day, each next to its baseline in the same run (medians):
  - the port gateway: a small GET through the daemon (path route, Unix socket, a new
    connection per request) against the same GET made directly inside the sandbox's
    network namespace (the same client on the host, entered with nsenter); latency and
    throughput with 8 clients at once;
  - resume on access: the first exec in a suspended sandbox (resumed by that request)
    against a warm restore (a sandbox started from a fresh memory snapshot of the same
    state, so no ready fork of the pool serves it, then its first exec);
  - a terminal keystroke's echo: a byte typed into a terminal session over its WebSocket
    until its echo comes back, against the same on a local pseudo-terminal on the host.
Prints JSON lines for bench/report.py. Run as root with a daemon up
(``scripts/with-daemon python3 bench/surface.py``; ``make bench-surface`` does it).
env: RUNS (default 5), REQUESTS (default 300)
"""
from __future__ import annotations

import json
import os
import pty
import select
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, List

from sandfork import CheckpointType, Client, Sandbox

ROOT = Path(__file__).resolve().parent.parent
APP = ROOT / "sdk" / "python" / "tests" / "apps" / "portapp.py"
RUNS = int(os.environ.get("RUNS", "5"))
REQUESTS = int(os.environ.get("REQUESTS", "300"))
PORT = 8080


def emit(name: str, value: float, unit: str, baseline: float, baseline_name: str, higher_better: bool = False, p99: float = None) -> None:
    ratio = (value / baseline) if baseline else None
    row = {"suite": "surface", "name": name, "value": value, "unit": unit, "baseline": baseline, "baseline_name": baseline_name, "ratio": ratio}
    if p99 is not None:
        row["p99"] = p99
    print(json.dumps(row), flush=True)


def p99(xs: List[float]) -> float:
    return sorted(xs)[int(len(xs) * 0.99) - 1]


# --- clients: one HTTP GET on a new connection ---------------------------------------

def get_over_unix(sock: str, path: str, token: str) -> None:
    s = socket.socket(socket.AF_UNIX)
    s.connect(sock)
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: localhost\r\nX-Sandfork-Access-Token: {token}\r\nConnection: close\r\n\r\n".encode())
    read_all(s)


def read_all(s: socket.socket) -> None:
    data = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    s.close()
    if not data.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(data[:200])


DIRECT_CLIENT = r"""
import socket, sys, time, json, threading
port, n, workers = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
def one():
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"GET /bench HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
    data = b""
    while True:
        c = s.recv(65536)
        if not c: break
        data += c
    s.close()
    assert data.startswith(b"HTTP/1.1 200"), data[:100]
lat = []
for _ in range(n):
    t = time.perf_counter(); one(); lat.append(time.perf_counter() - t)
def worker():
    for _ in range(n // workers): one()
t = time.perf_counter()
ts = [threading.Thread(target=worker) for _ in range(workers)]
[x.start() for x in ts]; [x.join() for x in ts]
print(json.dumps({"lat": lat, "rps": (n // workers) * workers / (time.perf_counter() - t)}))
"""


def sandbox_pid(sb: Sandbox) -> int:
    for base in ("/sys/fs/cgroup/freezer", "/sys/fs/cgroup/pids", "/sys/fs/cgroup"):
        procs = Path(base) / "sandfork" / sb.id / "cgroup.procs"
        if procs.exists():
            pids = procs.read_text().split()
            if pids:
                return int(pids[0])
    raise RuntimeError(f"no cgroup for {sb.id}")


def gateway(client: Client) -> None:
    sock = client.endpoint.socket_path
    with Sandbox.create(image="python", memory_mb=512, client=client) as sb:
        sb.write_file("/srv/portapp.py", APP.read_bytes())
        sb.start_process("python3", ["/srv/portapp.py", str(PORT)])
        time.sleep(1.5)
        token = sb.port_token()
        path = f"/v1/sandboxes/{sb.id}/ports/{PORT}/bench"
        for _ in range(20):
            get_over_unix(sock, path, token)
        lat = []
        for _ in range(REQUESTS):
            t = time.perf_counter()
            get_over_unix(sock, path, token)
            lat.append(time.perf_counter() - t)
        workers = 8

        def worker() -> None:
            for _ in range(REQUESTS // workers):
                get_over_unix(sock, path, token)

        t = time.perf_counter()
        threads = [threading.Thread(target=worker) for _ in range(workers)]
        [x.start() for x in threads]
        [x.join() for x in threads]
        rps = (REQUESTS // workers) * workers / (time.perf_counter() - t)
        pid = sandbox_pid(sb)
        out = subprocess.run(["nsenter", f"--net=/proc/{pid}/ns/net", sys.executable, "-c", DIRECT_CLIENT, str(PORT), str(REQUESTS), str(workers)],
                             check=True, capture_output=True, text=True)  # fmt: skip
        direct = json.loads(out.stdout)
    med, dmed = statistics.median(lat) * 1000, statistics.median(direct["lat"]) * 1000
    emit("gateway GET latency (new connection each)", med, "ms", dmed, "direct in the sandbox's netns", p99=p99(lat) * 1000)
    emit("gateway GET throughput, 8 clients", rps, "req/s", direct["rps"], "direct in the sandbox's netns", higher_better=True)


def timed(f: Callable[[], None]) -> float:
    t = time.perf_counter()
    f()
    return (time.perf_counter() - t) * 1000


def resume(client: Client) -> None:
    resumed, restored = [], []
    with Sandbox.create(image="python", memory_mb=512, name="bench-resume", client=client) as sb:
        sb.run("python3", ["-c", "open('/tmp/state','w').write('x'*1000)"])
        for _ in range(RUNS):
            # A fresh snapshot each round: its first restore has no ready fork waiting
            # (the pool serves a snapshot once it is hot), like a resume.
            snap = sb.checkpoint(checkpoint_type=CheckpointType.MEMORY)
            sb.suspend()
            resumed.append(timed(lambda: sb.run("true")))
            children: List[Sandbox] = []
            restored.append(timed(lambda: children.append(Sandbox.create(snapshot_id=snap.id, client=client)) or children[0].run("true")))
            children[0].terminate()
            snap.delete()
    emit("resume on access → first exec", statistics.median(resumed), "ms", statistics.median(restored), "warm restore → first exec (no ready fork)")


def keystrokes(client: Client) -> None:
    rtt, local = [], []
    with Sandbox.create(memory_mb=256, client=client) as sb:
        term = sb.pty.create("cat")
        it = iter(term)
        time.sleep(0.5)
        for i in range(REQUESTS):
            ch = bytes([97 + i % 26])
            t = time.perf_counter()
            term.send(ch)
            got = b""
            while ch not in got:
                got += next(it)
            rtt.append((time.perf_counter() - t) * 1000)
        term.kill()
    master, slave = pty.openpty()
    proc = subprocess.Popen(["cat"], stdin=slave, stdout=slave, stderr=slave, start_new_session=True)
    os.close(slave)
    time.sleep(0.2)
    for i in range(REQUESTS):
        ch = bytes([97 + i % 26])
        t = time.perf_counter()
        os.write(master, ch)
        got = b""
        while ch not in got:
            select.select([master], [], [], 5)
            got += os.read(master, 1024)
        local.append((time.perf_counter() - t) * 1000)
    proc.kill()
    os.close(master)
    emit("terminal keystroke echo", statistics.median(rtt), "ms", statistics.median(local), "a local pty on the host", p99=p99(rtt))


def main() -> None:
    client = Client.from_env()
    gateway(client)
    resume(client)
    keystrokes(client)


if __name__ == "__main__":
    main()
