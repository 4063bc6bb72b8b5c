#!/usr/bin/env python3
"""The overhead of the compatibility layers, in one run against one daemon: the same work
done through sandfork's own Python SDK (the baseline), the real Tensorlake Python SDK
(0.5.161) and the real E2B Python SDK (2.63.0), each unmodified:

  - create → first exec: a sandbox of the same image (python, no internet access) until
    its first command (``true``) has answered; the sandbox is terminated untimed;
  - a 1 MB file round trip: 1 MiB of fresh random bytes written into a running sandbox
    and read back (the bytes compared), over one sandbox per SDK.

The file round trip is also made with one minimal HTTP client of the bench's own, sending
the requests each SDK sends (sandfork's ``PUT``/``GET /v1/sandboxes/{id}/files``; E2B's
multipart ``POST``/``GET /files`` to envd) to one sandbox, in turn, from one process: the
same client, interpreter and sandbox on both sides, so the ratio is the layer's own cost,
apart from what each SDK spends building and parsing them (10 such round trips per round).

Each is repeated ``--runs`` times in rounds (every SDK once per round, in turn, after one
warm-up round that is not counted); the medians and each layer's ratio to the native
median are printed as a table, as JSON lines for bench/report.py, and as JSON (``--json``).

Isolation. The Tensorlake SDK calls its vendor's cloud for any API host but localhost, so
no SDK process runs in the machine's own network namespace: a holder process
(``unshare -n``) owns a namespace whose only interface is loopback, the daemon is started
inside it listening on 127.0.0.1 there, and the three SDK clients (long-lived worker
processes, one per SDK, driven over their stdin) join it. The bench process itself stays
outside and reaches the daemon over its Unix socket only to check health and clean up.

The SDKs are found in the compat venvs of tests/compat (``$SANDFORK_COMPAT_DIR``, default
/var/cache/sandfork/compat; ``make test-python`` installs them). The daemon is the release
build at ``$CARGO_TARGET_DIR/release/sandfork`` when there is one, else the debug build
(``$SANDFORK_BIN`` overrides). Run as root: ``make bench-compat``.

    python3 bench/compat.py [--runs N] [--json PATH] [--dir DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

HERE = Path(__file__).resolve()
REPO = HERE.parent.parent
COMPAT_DIR = Path(os.environ.get("SANDFORK_COMPAT_DIR", "/var/cache/sandfork/compat"))
TARGET = Path(os.environ.get("CARGO_TARGET_DIR") or "/var/cache/sandfork/ci-target")
PORT = 7070  # in the bench's own network namespace, so never taken
IMAGE = "python"  # E2B's SDK runs every command with /bin/bash -l -c: busybox has no bash
PYTHON_OCI = Path(os.environ.get("SANDFORK_CACHE") or "/var/cache/sandfork") / "images" / "python-oci"
FILE_BYTES = 1 << 20
FILE_PATH = "/tmp/compat-roundtrip.bin"

LAYERS = {
    # name: (python, package whose version is checked, version)
    "sandfork": (sys.executable, None, None),
    "tensorlake": (str(COMPAT_DIR / "tensorlake-py" / "bin" / "python"), "tensorlake", "0.5.161"),
    "e2b": (str(COMPAT_DIR / "e2b-py" / "bin" / "python"), "e2b", "2.63.0"),
}
# The layers whose requests the bench's own client also sends (the file round trip).
WIRE_LAYERS = ("sandfork", "e2b")
WIRE_PER_ROUND = 10
LABELS = {
    "sandfork": "sandfork Python SDK",
    "tensorlake": "Tensorlake Python SDK 0.5.161",
    "e2b": "E2B Python SDK 2.63.0",
}


# --- the workers: one per SDK, inside the namespace, driven over stdin -----------------


class Wire:
    """The bench's own minimal HTTP client: one keep-alive connection, one sandbox (made
    through E2B's control API, so both APIs may address it), and each API's file requests
    as its SDK sends them. Both APIs are driven from this one process and interpreter."""

    def __init__(self) -> None:
        import http.client

        self.conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=60)
        self.token = os.environ["SANDFORK_TOKEN"]
        made = json.loads(self.send("POST", "/v2/sandboxes", json.dumps({"templateID": IMAGE, "timeout": 600}).encode(),
                                    {"X-API-Key": self.token, "Content-Type": "application/json"}))
        self.id = made["sandboxID"]
        self.envd = {"E2b-Sandbox-Id": self.id, "X-Access-Token": made["envdAccessToken"]}
        self.auth = {"Authorization": f"Bearer {self.token}"}

    def send(self, method: str, target: str, body=b"", headers: Optional[Dict[str, str]] = None) -> bytes:
        self.conn.request(method, target, body=body or None, headers=headers or {})
        r = self.conn.getresponse()
        data = r.read()
        if r.status >= 300:
            raise RuntimeError(f"{method} {target}: {r.status} {data[:200]!r}")
        return data

    def write(self, api: str, data: bytes) -> None:
        if api == "sandfork":
            headers = {**self.auth, "Content-Type": "application/octet-stream"}
            self.send("PUT", f"/v1/sandboxes/{self.id}/files?path={FILE_PATH}", data, headers)
            return
        # What E2B's SDK sends for one file of bytes: a multipart form with one part, here
        # sent piece by piece as sandfork's body is (the data is not copied into a form).
        boundary = secrets.token_hex(16)
        head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{FILE_PATH}\"\r\n"
                "Content-Type: application/octet-stream\r\n\r\n").encode()
        tail = f"\r\n--{boundary}--\r\n".encode()
        headers = {**self.envd, "Content-Type": f"multipart/form-data; boundary={boundary}",
                   "Content-Length": str(len(head) + len(data) + len(tail))}
        self.send("POST", f"/files?path={FILE_PATH}", [head, data, tail], headers)

    def read(self, api: str) -> bytes:
        if api == "sandfork":
            return self.send("GET", f"/v1/sandboxes/{self.id}/files?path={FILE_PATH}", headers=self.auth)
        return self.send("GET", f"/files?path={FILE_PATH}", headers=self.envd)

    def close(self) -> None:
        self.send("DELETE", f"/sandboxes/{self.id}", headers={"X-API-Key": self.token})


class Native:
    def __init__(self) -> None:
        sys.path.insert(0, str(REPO / "sdk" / "python" / "src"))
        from sandfork import Sandbox

        self.Sandbox = Sandbox

    def create(self):
        return self.Sandbox.create(image=IMAGE, allow_internet_access=False)

    def exec_true(self, sb) -> None:
        r = sb.run("true")
        assert r.exit_code == 0, r

    def exec_login(self, sb) -> None:
        r = sb.run("/bin/bash", ["-l", "-c", "true"])
        assert r.exit_code == 0, r

    def write(self, sb, data: bytes) -> None:
        sb.write_file(FILE_PATH, data)

    def read(self, sb) -> bytes:
        return bytes(sb.read_file(FILE_PATH))

    def kill(self, sb) -> None:
        sb.terminate()


class Tensorlake:
    def __init__(self) -> None:
        import warnings

        warnings.simplefilter("ignore", DeprecationWarning)
        from tensorlake.sandbox import Sandbox

        self.Sandbox = Sandbox

    def create(self):
        return self.Sandbox.create(image=IMAGE, allow_internet_access=False)

    def exec_true(self, sb) -> None:
        r = sb.run("true")
        r = getattr(r, "value", r)
        assert r.exit_code == 0, r

    def write(self, sb, data: bytes) -> None:
        sb.write_file(FILE_PATH, data)

    def read(self, sb) -> bytes:
        got = sb.read_file(FILE_PATH)
        return bytes(getattr(got, "value", got))

    def kill(self, sb) -> None:
        sb.terminate()


class E2b:
    def __init__(self) -> None:
        from e2b import Sandbox

        self.Sandbox = Sandbox

    def create(self):
        return self.Sandbox.create(IMAGE, timeout=600, allow_internet_access=False)

    def exec_true(self, sb) -> None:
        r = sb.commands.run("true")
        assert r.exit_code == 0, r

    def write(self, sb, data: bytes) -> None:
        sb.files.write(FILE_PATH, data)

    def read(self, sb) -> bytes:
        return bytes(sb.files.read(FILE_PATH, format="bytes"))

    def kill(self, sb) -> None:
        sb.kill()


def daemon_cpu_ms() -> float:
    """CPU time the daemon's threads have had so far (their schedstat), in ms."""
    total = 0
    for task in Path(f"/proc/{os.environ['COMPAT_DAEMON_PID']}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total / 1e6


def worker(layer: str) -> None:
    """Answers ``create``, ``create_login`` (native only), ``file``, ``file_wire API``
    (native only: the bench's own client sending API's requests) and ``quit`` lines with
    one JSON line each."""
    sdk = {"sandfork": Native, "tensorlake": Tensorlake, "e2b": E2b}[layer]()
    reply = lambda **kv: print(json.dumps(kv), flush=True)  # noqa: E731
    held = None  # the sandbox of the file round trips
    wire = None  # the bench's own client (the native worker only)
    reply(ready=True)
    for line in sys.stdin:
        cmd = line.strip()
        try:
            if cmd in ("create", "create_login"):
                c0, d0, t0 = time.process_time(), daemon_cpu_ms(), time.monotonic()
                sb = sdk.create()
                t1 = time.monotonic()
                (sdk.exec_login if cmd == "create_login" else sdk.exec_true)(sb)
                t2, c2, d2 = time.monotonic(), time.process_time(), daemon_cpu_ms()
                sdk.kill(sb)
                reply(ms=(t2 - t0) * 1000, create_ms=(t1 - t0) * 1000, exec_ms=(t2 - t1) * 1000,
                      client_cpu_ms=(c2 - c0) * 1000, daemon_cpu_ms=d2 - d0)
            elif cmd == "file" or cmd.startswith("file_wire "):
                wire_api = cmd.split()[1] if cmd != "file" else None
                if wire_api is None and held is None:
                    held = sdk.create()
                if wire_api is not None and wire is None:
                    wire = Wire()
                data = os.urandom(FILE_BYTES)
                if wire_api is None:
                    write, read = (lambda: sdk.write(held, data)), (lambda: sdk.read(held))
                else:
                    write, read = (lambda: wire.write(wire_api, data)), (lambda: wire.read(wire_api))
                c0, d0, t0 = time.process_time(), daemon_cpu_ms(), time.monotonic()
                write()
                t1 = time.monotonic()
                back = read()
                t2, c2, d2 = time.monotonic(), time.process_time(), daemon_cpu_ms()
                if back != data:
                    raise RuntimeError(f"read back {len(back)} bytes that differ from the {len(data)} written")
                reply(ms=(t2 - t0) * 1000, write_ms=(t1 - t0) * 1000, read_ms=(t2 - t1) * 1000,
                      client_cpu_ms=(c2 - c0) * 1000, daemon_cpu_ms=d2 - d0)
            elif cmd == "quit":
                break
        except Exception as e:  # noqa: BLE001
            reply(error=f"{type(e).__name__}: {e}")
    if held is not None:
        sdk.kill(held)
    if wire is not None:
        wire.close()
    reply(done=True)


# --- the bench: namespace, daemon, workers ---------------------------------------------


def daemon_binary() -> Path:
    if os.environ.get("SANDFORK_BIN"):
        return Path(os.environ["SANDFORK_BIN"])
    for profile in ("release", "debug"):
        p = TARGET / profile / "sandfork"
        if p.is_file() and os.access(p, os.X_OK):
            return p
    sys.exit(f"compat.py: no daemon at {TARGET}/release/sandfork or {TARGET}/debug/sandfork (make build-release)")


def check_sdks() -> None:
    for layer, (python, package, version) in LAYERS.items():
        if package is None:
            continue
        probe = [python, "-c", f"import importlib.metadata as m; print(m.version({package!r}))"]
        try:
            got = subprocess.run(probe, capture_output=True, text=True, timeout=60).stdout.strip()
        except OSError:
            got = ""
        if got != version:
            sys.exit(f"compat.py: the {package} Python SDK {version} is not in {python} "
                     f"(found {got or 'nothing'}); `make test-python` installs the compat SDKs")


class Namespace:
    """A network namespace with loopback alone, held open by a sleeping process."""

    def __init__(self) -> None:
        self.holder = subprocess.Popen(
            ["unshare", "-n", "--", "sh", "-c", "ip link set lo up && echo up && exec sleep 86400"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        )  # fmt: skip
        line = self.holder.stdout.readline().strip() if self.holder.stdout else ""
        if line != "up":
            self.close()
            sys.exit(f"compat.py: could not make a loopback-only network namespace (root is needed): {line}")
        out = subprocess.run([*self.enter(), "ip", "-o", "link", "show"], capture_output=True, text=True).stdout
        links = [l.split(":")[1].strip() for l in out.splitlines() if ":" in l]
        if links != ["lo"]:
            self.close()
            sys.exit(f"compat.py: the namespace has more than loopback: {links}")

    def enter(self) -> List[str]:
        return ["nsenter", f"--net=/proc/{self.holder.pid}/ns/net", "--"]

    def close(self) -> None:
        if self.holder.poll() is None:
            self.holder.send_signal(signal.SIGKILL)
        self.holder.wait()


def closed_proxy_env() -> Dict[str, str]:
    # Nothing can leave the namespace anyway; a closed local proxy makes any call fail at once.
    closed = "http://127.0.0.1:9"
    env = {k: closed for k in ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy", "ALL_PROXY", "all_proxy")}
    env.update(NO_PROXY="", no_proxy="")
    return env


def start_daemon(ns: Namespace, binary: Path, root: Path, token: str):
    sys.path[:0] = [str(REPO / "sdk" / "python" / "src"), str(REPO / "sdk" / "python" / "tests")]
    from _daemon import Daemon

    data_dir, sock, log = root / "data", root / "s.sock", root / "daemon.log"
    data_dir.mkdir(exist_ok=True)
    (root / "token").write_text(token)
    (root / "token").chmod(0o600)
    (root / "config.toml").write_text('dns_upstreams = ["127.0.0.1:9"]\n')
    args = [
        "serve", "--config", str(root / "config.toml"), "--data-dir", str(data_dir), "--socket", str(sock),
        "--listen", f"127.0.0.1:{PORT}", "--token-file", str(root / "token"),
        "--default-image", IMAGE, "--max-sandboxes", "16",
    ]  # fmt: skip
    env = dict(os.environ)
    env.setdefault("RUST_LOG", "info")
    env.update(closed_proxy_env())
    with open(log, "ab") as out:
        process = subprocess.Popen([*ns.enter(), str(binary), *args], stdout=out, stderr=subprocess.STDOUT,
                                   env=env, start_new_session=True)
    return Daemon(f"unix://{sock}", root, data_dir, sock, log, process, token=None)


def import_image(d) -> None:
    """The python image, from the OCI layout the image tests cache (built offline there)."""
    from sandfork import Client, Image

    if not (PYTHON_OCI / "index.json").is_file():
        sys.exit(f"compat.py: no python image at {PYTHON_OCI} (the E2B suite, `make test-python`, caches it)")
    Image.import_(PYTHON_OCI, IMAGE, client=Client(url=d.url))


class Worker:
    def __init__(self, ns: Namespace, layer: str, token: str, log: Path, daemon_pid: int) -> None:
        self.layer = layer
        api = f"http://localhost:{PORT}"
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": os.environ.get("HOME", "/root"),
            "LANG": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1",
            "SANDFORK_URL": f"http://127.0.0.1:{PORT}",
            "SANDFORK_TOKEN": token,
            "TENSORLAKE_API_URL": api,
            "TENSORLAKE_API_KEY": token,
            "E2B_API_URL": f"http://127.0.0.1:{PORT}",
            "E2B_SANDBOX_URL": f"http://127.0.0.1:{PORT}",
            "E2B_API_KEY": token,
            "COMPAT_DAEMON_PID": str(daemon_pid),
        }
        self.stderr = open(log, "ab")
        self.p = subprocess.Popen([*ns.enter(), LAYERS[layer][0], str(HERE), "--worker", layer], env=env,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, text=True, cwd="/")
        self.ask(None)

    def ask(self, cmd: Optional[str]) -> dict:
        if cmd is not None:
            self.p.stdin.write(cmd + "\n")
            self.p.stdin.flush()
        line = self.p.stdout.readline()
        if not line:
            raise RuntimeError(f"the {self.layer} worker exited ({self.p.poll()}); see its log")
        got = json.loads(line)
        if "error" in got:
            raise RuntimeError(f"{self.layer} {cmd}: {got['error']}")
        return got

    def close(self) -> None:
        if self.p.poll() is None:
            try:
                self.ask("quit")
            except (RuntimeError, OSError, ValueError):
                pass
            try:
                self.p.wait(60)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self.stderr.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--json", type=Path, help="write the results here as JSON")
    ap.add_argument("--dir", help="where the daemon's directory is made (default: the system's temporary directory)")
    ap.add_argument("--keep", action="store_true", help="keep the daemon's directory (log) afterwards")
    ap.add_argument("--worker", choices=list(LAYERS), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        worker(a.worker)
        return
    if os.geteuid() != 0:
        sys.exit("compat.py: run as root (the SDKs run in a network namespace of their own)")
    for tool in ("unshare", "nsenter", "ip"):
        if shutil.which(tool) is None:
            sys.exit(f"compat.py: needs {tool} (util-linux, iproute2)")
    check_sdks()
    binary = daemon_binary()
    root = Path(tempfile.mkdtemp(prefix="sfcompat-", dir=a.dir))
    token = secrets.token_hex(16)
    ns = Namespace()
    d = None
    workers: Dict[str, Worker] = {}
    results: Dict[str, Dict[str, List[dict]]] = {k: {"create": [], "file": [], "create_login": [], "file_wire": []} for k in LAYERS}
    problems: List[str] = []
    try:
        from_ = time.monotonic()
        d = start_daemon(ns, binary, root, token)
        from _daemon import wait_healthy

        wait_healthy(d)
        import_image(d)
        for layer in LAYERS:
            workers[layer] = Worker(ns, layer, token, root / f"worker-{layer}.log", d.process.pid)
        # Warm-up round: imports, connections, the image's first use; not counted.
        for w in workers.values():
            w.ask("create")
            w.ask("file")
        for layer in WIRE_LAYERS:
            workers["sandfork"].ask(f"file_wire {layer}")
        for i in range(a.runs):
            order = list(workers.values())
            order = order[i % len(order):] + order[:i % len(order)]  # who goes first rotates
            for what in ("create", "file"):
                for w in order:
                    results[w.layer][what].append(w.ask(what))
            # E2B's SDK runs every command as `/bin/bash -l -c CMD`: the same through sandfork's.
            results["sandfork"]["create_login"].append(workers["sandfork"].ask("create_login"))
            # The layer alone is cheap to measure and its spread is the write's (≈ 1 ms):
            # several round trips a round, in alternating order.
            for j in range(WIRE_PER_ROUND):
                for layer in WIRE_LAYERS if (i + j) % 2 else WIRE_LAYERS[::-1]:
                    results[layer]["file_wire"].append(workers["sandfork"].ask(f"file_wire {layer}"))
        print(f"compat.py: {a.runs} rounds in {time.monotonic() - from_:.0f} s with {binary}", file=sys.stderr)
    finally:
        for w in workers.values():
            w.close()
        if d is not None:
            from _daemon import tear_down

            if a.keep:
                os.environ["SANDFORK_TEST_KEEP"] = "1"
            problems = tear_down(d)
        ns.close()
        if d is None or not a.keep and not problems:
            shutil.rmtree(root, ignore_errors=True)
    if problems:
        sys.exit("compat.py: the daemon left behind:\n" + "\n".join(problems))
    report(results, a, binary)


PARTS = {"create": ("create_ms", "exec_ms", "client_cpu_ms", "daemon_cpu_ms"),
         "file": ("write_ms", "read_ms", "client_cpu_ms", "daemon_cpu_ms")}


def row_of(name: str, rs: List[dict], base: float, base_name: str, layer: str, op: str, kind: str) -> dict:
    """One result line: the median of ``rs`` against ``base``, with its parts' medians."""
    med = statistics.median
    value = med(r["ms"] for r in rs)
    return {"suite": "compat", "name": name, "value": round(value, 2), "unit": "ms",
            "baseline": round(base, 2), "baseline_name": base_name,
            "ratio": round(value / base, 3), "target": "≤ 1.1 ×" if layer != "sandfork" else "",
            "runs": len(rs), "layer": layer, "op": op,
            **{p: round(med(r[p] for r in rs), 2) for p in PARTS[kind]}}


def report(results: Dict[str, Dict[str, List[dict]]], a: argparse.Namespace, binary: Path) -> None:
    med = statistics.median
    names = {"create": "create → first exec (`true`)", "file": "1 MB file round trip (write, read back, compared)"}
    out = {"runs": a.runs, "daemon": str(binary), "image": IMAGE, "file_bytes": FILE_BYTES, "results": []}
    rows = out["results"]
    for what in ("create", "file"):
        base = med(r["ms"] for r in results["sandfork"][what])
        for layer in LAYERS:
            rows.append(row_of(f"{names[what]}, {LABELS[layer]}", results[layer][what], base,
                               "sandfork Python SDK, same run", layer, what, what))
        if what == "create":
            # The login shell's share: sandfork's SDK running E2B's command, and E2B against it.
            login = results["sandfork"]["create_login"]
            lbase = med(r["ms"] for r in login)
            for layer, rs in (("sandfork", login), ("e2b", results["e2b"]["create"])):
                rows.append(row_of(f"create → first exec (`/bin/bash -l -c true`, E2B's form of `true`), {LABELS[layer]}",
                                   rs, lbase, "sandfork Python SDK running `/bin/bash -l -c true`, same run",
                                   layer, "create_login", "create"))
    wbase = med(r["ms"] for r in results["sandfork"]["file_wire"])
    for layer in WIRE_LAYERS:
        api = {"sandfork": "sandfork's API", "e2b": "E2B's envd API"}[layer]
        rows.append(row_of(f"{names['file']}, {api} from one minimal HTTP client (the layer alone)",
                           results[layer]["file_wire"], wbase, "sandfork's API from the same client, same run",
                           layer, "file_wire", "file"))
    for row in rows:
        print(json.dumps(row), flush=True)
    if a.json:
        a.json.write_text(json.dumps(out, indent=2) + "\n")
    print(file=sys.stderr)
    print(f"{'':100} {'median':>9} {'ratio':>6}   parts (medians)", file=sys.stderr)
    for row in out["results"]:
        op = {"create_login": "create", "file_wire": "file"}.get(row["op"], row["op"])
        ps = ", ".join(f"{p[:-3]} {row[p]:.1f}" for p in PARTS[op])
        print(f"{row['name']:100} {row['value']:7.1f} ms {row['ratio']:5.2f}×   {ps}", file=sys.stderr)


if __name__ == "__main__":
    main()
