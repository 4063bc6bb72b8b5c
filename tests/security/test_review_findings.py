"""Probes of the security review's findings, each tried against the fix that answers it.

- image builds: a build step (what a package's install script would run) gets a real
  sandbox: runc, seccomp, a sandbox's capabilities, its own network policy;
- egress: link-local (the cloud metadata server), private ranges and the host's networks
  are refused in every network mode unless the owner allows them;
- snapshot files: imports are refused unless signed (or, for a filesystem, explicitly
  trusted), whatever kind they declare; a damaged disk is refused before any mount;
- secrets: they reach the processes but no snapshot, export, record or readable file;
- agent impostor: a sandbox answering the daemon in its agent's place gets an error, in
  bounded time and memory;
- host disk: imports are capped, creates keep a free-space floor;
- API listener: bounded connections, slow clients cut off, a non-loopback one needs TLS;
- host-wide effects: the runc version check, the forward policy, cleanup beside `ip netns`.

Most probes run against daemons of their own (own data directory, own configuration),
started and removed here. Network probes go only to loopback or to addresses this file
puts into network namespaces of its own (FakeNet): nothing is sent anywhere else.
Everything made on the host (netns, veth, routes, daemons, temp dirs) carries the prefix
``sfsec`` and is removed even when a test fails.
"""

from __future__ import annotations

import fcntl
import hashlib
import http.client
import ipaddress
import json
import os
import random
import re
import secrets
import select
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import pytest
from conftest import out_of, sh

from _daemon import Daemon, daemon_binary, leaks_of, leftover_containers, stop_daemon, tear_down, wait_healthy

MIB = 1 << 20
TIME_BOUND = 35.0  # what "answered in bounded time" allows: the agent client's 30 s reply timeout, and slack


# ------------------------------------------------------------------------ plumbing


def run(*cmd: str, check: bool = True, timeout: float = 60, **kw: Any) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, check=check, **kw)


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return run("ip", *args, check=check)


class Api:
    """Raw HTTP to a daemon's Unix socket: statuses and bodies exactly as sent."""

    def __init__(self, d: Daemon):
        self.socket = str(d.socket)

    def call(self, method: str, path: str, *, json_body: Any = None, body: Any = None, headers: Optional[Dict[str, str]] = None, timeout: float = 120) -> Tuple[int, bytes]:
        from sandfork._transport import UnixHTTPConnection

        hdrs = dict(headers or {})
        if json_body is not None:
            body, hdrs["Content-Type"] = json.dumps(json_body).encode(), "application/json"
        conn = UnixHTTPConnection(self.socket, timeout=timeout)
        try:
            try:
                conn.request(method, path, body=body, headers=hdrs, encode_chunked=hdrs.get("Transfer-Encoding") == "chunked")
            except (BrokenPipeError, ConnectionResetError):
                pass  # the daemon refused the body early; its answer may still be there
            r = conn.getresponse()
            return r.status, r.read()
        finally:
            conn.close()

    def json(self, method: str, path: str, **kw: Any) -> Tuple[int, Any]:
        status, data = self.call(method, path, **kw)
        try:
            return status, json.loads(data) if data else None
        except ValueError:
            return status, data.decode(errors="replace")


def client_of(d: Daemon) -> "object":
    from sandfork import Client

    return Client(url=d.url, token=d.token or "")


def spawn_daemon(root: Path, args: Sequence[str] = (), env: Optional[Dict[str, str]] = None, prefix: Sequence[str] = ()) -> Daemon:
    """Starts ``sandfork serve`` on ``root/data`` (as tests/_daemon.start_daemon, plus an
    environment and a command prefix such as nsenter)."""
    binary = daemon_binary()
    if binary is None:
        pytest.skip("the sandfork daemon is not built (make build)")
    data, sock, log = root / "data", root / "s.sock", root / "daemon.log"
    data.mkdir(exist_ok=True)
    full_env = {**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "info"), **(env or {})}
    with open(log, "ab") as out:
        process = subprocess.Popen(
            [*prefix, str(binary), "serve", "--data-dir", str(data), "--socket", str(sock), *args, "--default-image", "busybox"],
            stdout=out, stderr=subprocess.STDOUT, env=full_env, start_new_session=True,
        )  # fmt: skip
    return Daemon(f"unix://{sock}", root, data, sock, log, process)


@contextmanager
def own_daemon(config: str = "", env: Optional[Dict[str, str]] = None, prefix: Sequence[str] = ()) -> Iterator[Daemon]:
    """A daemon of the test's own on a fresh data dir; stopped, checked for leaks and
    removed afterwards whatever happens."""
    if daemon_binary() is None:
        pytest.skip("the sandfork daemon is not built (make build)")
    root = Path(tempfile.mkdtemp(prefix="sfsec-own-"))
    args: List[str] = []
    try:
        if config:
            (root / "config.toml").write_text(config)
            args = ["--config", str(root / "config.toml")]
        d = spawn_daemon(root, args, env, prefix)
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    try:
        wait_healthy(d)
        yield d
    finally:
        problems = tear_down(d) if d.process.poll() is None else leaks_of(d)
        # Sandboxes a failed test left are terminated by tear_down; only real leaks count.
        leaks = [p for p in problems if not p.startswith("sandbox left running by the tests")]
        if d.process.poll() is None:
            stop_daemon(d)
        if not leaks:
            shutil.rmtree(root, ignore_errors=True)
        assert not leaks, f"a daemon of this test left behind ({root}):\n" + "\n".join(leaks)


def failed_start(args: Sequence[str] = (), config: str = "", env: Optional[Dict[str, str]] = None, wait: float = 30, watch: Any = None) -> Tuple[Optional[int], str]:
    """Starts a daemon that should refuse to start; returns its exit code (None if it was
    still running after ``wait`` s: then it is stopped) and its log. ``watch`` is called
    every few milliseconds until the daemon exits."""
    if daemon_binary() is None:
        pytest.skip("the sandfork daemon is not built (make build)")
    root = Path(tempfile.mkdtemp(prefix="sfsec-start-"))
    try:
        all_args = list(args)
        if config:
            (root / "config.toml").write_text(config)
            all_args += ["--config", str(root / "config.toml")]
        d = spawn_daemon(root, all_args, env)
        deadline, code = time.monotonic() + wait, None
        while time.monotonic() < deadline:
            if watch is not None:
                watch()
            code = d.process.poll()
            if code is not None:
                break
            time.sleep(0.002)
        if code is None:
            tear_down(d)
        return code, d.log.read_text(errors="replace") if d.log.exists() else ""
    finally:
        shutil.rmtree(root, ignore_errors=True)


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def sandbox_mount_points(sandbox_id: str) -> List[str]:
    with open("/proc/self/mountinfo") as f:
        return [ln.split()[4] for ln in f if sandbox_id in ln]


def loop_devices_of(text: str) -> List[str]:
    found = []
    for backing in Path("/sys/block").glob("loop*/loop/backing_file"):
        try:
            if text in backing.read_text():
                found.append(backing.parts[3])
        except OSError:
            pass
    return found


def primary_address() -> Optional[str]:
    """The host's address on the interface of its default route (no packet is sent)."""
    dev = ip("-4", "route", "show", "default").stdout.split(" dev ")[-1].split()[:1]
    if not dev:
        return None
    words = ip("-4", "-o", "addr", "show", "dev", dev[0]).stdout.split()
    return next((w.split("/")[0] for w in words if "/" in w and w[0].isdigit()), None)


def host_addresses() -> List[str]:
    out = ip("-4", "-o", "addr").stdout
    return sorted({w.split("/")[0] for w in out.split() if "/" in w and w[0].isdigit() and not w.startswith("127.")})


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="sfsec-review-"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


# ------------------------------------------------------------- static test programs

IMPOSTOR_C = r"""
/* An impostor agent for the daemon's connections to /run/sandfork/agent.sock.
 *   impostor steal MODE SECONDS: takes the agent's own listening socket (pidfd_getfd) and
 *       stops the agent (ptrace), so the daemon's peer check sees the agent's pid;
 *   impostor path MODE SECONDS: its own listener at agent.sock (the real one set aside). */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SOCK "/run/sandfork/agent.sock"
#define REAL "/run/sandfork/agent.sock.real"
static const char *mode;
static time_t deadline;
static const unsigned char PREAMBLE[6] = {'S', 'F', 'A', 'G', 2, 0};

static int put(int c, const void *b, size_t n) {
    const char *p = b;
    while (n) {
        ssize_t w = send(c, p, n, MSG_NOSIGNAL);
        if (w <= 0) return -1;
        p += w; n -= w;
    }
    return 0;
}
static size_t varint(unsigned char *out, uint64_t v) {
    size_t n = 0;
    do { unsigned char b = v & 0x7f; v >>= 7; out[n++] = b | (v ? 0x80 : 0); } while (v);
    return n;
}
static int frame(int c, const unsigned char *payload, uint32_t len) {
    unsigned char h[4] = {len, len >> 8, len >> 16, len >> 24};
    return put(c, h, 4) || put(c, payload, len);
}
static void hold(void) { while (time(NULL) < deadline) sleep(1); }
static int started(int c) { unsigned char p[8]; size_t n = 0; p[n++] = 6; n += varint(p + n, 1); return frame(c, p, n); }

static void *handle(void *arg) {
    int c = (int)(intptr_t)arg;
    struct timeval tv = {5, 0};
    setsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (!strcmp(mode, "close")) { close(c); return NULL; }
    if (!strcmp(mode, "silent")) { hold(); close(c); return NULL; }
    if (!strcmp(mode, "version")) { unsigned char v[6] = {'S', 'F', 'A', 'G', 0x63, 0}; put(c, v, 6); hold(); close(c); return NULL; }
    put(c, PREAMBLE, 6);
    if (!strcmp(mode, "preamble")) hold();
    else if (!strcmp(mode, "huge")) { unsigned char h[4] = {0xff, 0xff, 0xff, 0xff}; put(c, h, 4); hold(); }
    else if (!strcmp(mode, "junk")) {
        static unsigned char junk[65536];
        for (size_t i = 0; i < sizeof junk; i++) junk[i] = (unsigned char)(i * 131 + 7);
        while (time(NULL) < deadline && put(c, junk, sizeof junk) == 0) {}
    } else if (!strcmp(mode, "drip")) {
        unsigned char h[4] = {0, 0, 0x40, 0}; /* a 4 MiB frame, then its payload a byte a second */
        put(c, h, 4);
        while (time(NULL) < deadline && put(c, "x", 1) == 0) sleep(1);
    } else if (!strcmp(mode, "started")) { started(c); hold(); }
    else if (!strcmp(mode, "flood")) {
        /* Started, then valid stdout frames of almost 4 MiB without end */
        started(c);
        size_t data = (4 << 20) - 32, n;
        unsigned char *buf = malloc(data + 32);
        uint64_t off = 0;
        while (buf && time(NULL) < deadline) {
            n = 0; buf[n++] = 7; buf[n++] = 0; n += varint(buf + n, off); n += varint(buf + n, data);
            memset(buf + n, 'A', data);
            if (frame(c, buf, n + data)) break;
            off += data;
        }
    }
    close(c);
    return NULL;
}

static int steal(void) {
    int pidfd = syscall(SYS_pidfd_open, 1, 0);
    if (pidfd < 0) { perror("pidfd_open"); return -1; }
    DIR *d = opendir("/proc/1/fd");
    if (!d) { perror("opendir /proc/1/fd"); return -1; }
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        int s = syscall(SYS_pidfd_getfd, pidfd, atoi(e->d_name), 0);
        if (s < 0) continue;
        int acc = 0; socklen_t l = sizeof acc;
        struct sockaddr_un a; socklen_t al = sizeof a;
        if (getsockopt(s, SOL_SOCKET, SO_ACCEPTCONN, &acc, &l) == 0 && acc &&
            getsockname(s, (struct sockaddr *)&a, &al) == 0 && a.sun_family == AF_UNIX && !strcmp(a.sun_path, SOCK)) {
            closedir(d);
            return s;
        }
        close(s);
    }
    closedir(d);
    fprintf(stderr, "no listening agent socket among pid 1's descriptors\n");
    return -1;
}

int main(int argc, char **argv) {
    if (argc != 4) { fprintf(stderr, "usage: impostor steal|path MODE SECONDS\n"); return 2; }
    mode = argv[2];
    deadline = time(NULL) + atoi(argv[3]);
    signal(SIGPIPE, SIG_IGN);
    int steal_mode = !strcmp(argv[1], "steal"), l;
    sleep(1); /* let the agent answer the request that started this process */
    if (steal_mode) {
        l = steal();
        if (l < 0) return 3;
        if (ptrace(PTRACE_SEIZE, 1, 0, 0) || ptrace(PTRACE_INTERRUPT, 1, 0, 0)) { perror("ptrace"); return 4; }
        int st; waitpid(1, &st, __WALL);
        FILE *f = fopen("/tmp/impostor.ready", "w"); if (f) fclose(f);
    } else {
        if (rename(SOCK, REAL)) { perror("rename"); return 5; }
        l = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_un a = {.sun_family = AF_UNIX};
        strcpy(a.sun_path, SOCK);
        if (bind(l, (struct sockaddr *)&a, sizeof a) || listen(l, !strcmp(mode, "backlog") ? 0 : 64)) { perror("bind"); rename(REAL, SOCK); return 6; }
        if (!strcmp(mode, "backlog"))
            for (int i = 0; i < 64; i++) { /* fill the backlog with connections of its own, never accepted */
                int c = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0);
                if (connect(c, (struct sockaddr *)&a, sizeof a)) { close(c); break; }
            }
    }
    while (time(NULL) < deadline) {
        struct pollfd p = {l, POLLIN, 0};
        if (strcmp(mode, "backlog") && poll(&p, 1, 200) == 1) {
            int c = accept4(l, NULL, NULL, SOCK_CLOEXEC);
            if (c >= 0) { pthread_t t; pthread_create(&t, NULL, handle, (void *)(intptr_t)c); pthread_detach(t); }
        } else usleep(200000);
    }
    if (steal_mode) ptrace(PTRACE_DETACH, 1, 0, 0);
    else { close(l); unlink(SOCK); rename(REAL, SOCK); }
    return 0;
}
"""

CHROOT_ESCAPE_C = r"""
/* The classic chroot escape: chroot into a subdirectory, climb out with "..", chroot to
 * where that leads, and read argv[1] from there. In a host chroot it reaches the host. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>
int main(int argc, char **argv) {
    mkdir("/tmp/escape", 0755);
    if (chroot("/tmp/escape")) { perror("chroot"); return 1; }
    for (int i = 0; i < 64; i++) chdir("..");
    if (chroot(".")) { perror("chroot ."); return 1; }
    int fd = open(argv[1], O_RDONLY);
    if (fd < 0) { perror(argv[1]); return 2; }
    char buf[256];
    ssize_t n = read(fd, buf, sizeof buf);
    if (n > 0) write(1, buf, n);
    return 0;
}
"""


@pytest.fixture(scope="module")
def programs(workdir: Path) -> Dict[str, Path]:
    """Static test programs, built once: the impostor agent and the chroot escape."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc is needed to build the static test programs")
    out = {}
    for name, src in (("impostor", IMPOSTOR_C), ("escape", CHROOT_ESCAPE_C)):
        c, exe = workdir / f"{name}.c", workdir / name
        c.write_text(src)
        run("gcc", "-static", "-O1", "-pthread", "-o", str(exe), str(c), timeout=120)
        out[name] = exe
    return out


# ------------------------------------------------------------------------- FakeNet

# Guarded ranges with an address of each that FakeNet holds (``{}``: a random octet).
FAKE_TARGETS = [
    ("169.254.0.0/16 (the cloud metadata server)", "169.254.169.254"),
    ("10.0.0.0/8", "10.213.77.{}"),
    ("100.64.0.0/10", "100.127.77.{}"),
    ("172.16.0.0/12", "172.29.77.{}"),
    ("192.0.0.0/24", "192.0.0.{}"),
    ("192.168.0.0/16", "192.168.213.{}"),
    ("198.18.0.0/15 (outside the sandbox pool)", "198.19.213.{}"),
]
METADATA = "169.254.169.254"
METADATA_LOCK = "/run/lock/sandfork-test-metadata.lock"
ROUTE_METRIC = 4242
# An address outside every guarded range (TEST-NET-3, routed nowhere), also held by FakeNet:
# an `internet` sandbox must reach it, which shows the probes can succeed.
PUBLIC = ("203.0.113.0/24 (not guarded)", "203.0.113.{}")

FAKE_SERVER = r"""
import socket, sys, threading
log = open(sys.argv[1], "a", buffering=1)
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 80))
s.listen(256)
print("ready", flush=True)
def serve(c, peer):
    try:
        c.settimeout(5)
        data = b""
        while b"\n" not in data and len(data) < 4096:
            b = c.recv(4096)
            if not b:
                break
            data += b
        local = c.getsockname()[0]
        first = data.split(bytes([10]))[0].decode(errors="replace").strip()
        log.write(f"{local} {peer[0]} {first}" + chr(10))
        body = f"fake-{local}\n".encode()
        c.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    except OSError:
        pass
    finally:
        c.close()
while True:
    c, peer = s.accept()
    threading.Thread(target=serve, args=(c, peer), daemon=True).start()
"""


class FakeNet:
    """A network namespace of the test's own, linked to the host by a veth pair, holding
    an address in each guarded range (the metadata address among them) with a /32 host
    route to each, and an HTTP listener on port 80 that logs every connection."""

    def __init__(self, work: Path):
        tag = secrets.token_hex(3)
        self.ns, self.host_if = f"sfsec-{tag}", f"sfq{tag}"
        self.host_addr = f"169.254.213.{random.randint(2, 250)}"
        self.log = work / f"fakenet-{tag}.log"
        self.routes: List[str] = []
        self.addrs: Dict[str, str] = {}
        self.public = ""
        self.server: Optional[subprocess.Popen] = None
        self.lock: Optional[Any] = None

    def up(self) -> None:
        # The host has one route to the metadata address: every fake metadata server (the
        # runtime's network tests too) holds this lock for as long as its route lives.
        self.lock = open(METADATA_LOCK, "w")
        fcntl.flock(self.lock, fcntl.LOCK_EX)
        ip("netns", "add", self.ns)
        ip("link", "add", self.host_if, "type", "veth", "peer", "name", "eth0", "netns", self.ns)
        ip("addr", "add", f"{self.host_addr}/32", "dev", self.host_if)
        ip("link", "set", self.host_if, "up")
        for args in (["link", "set", "lo", "up"], ["link", "set", "eth0", "up"],
                     ["route", "add", f"{self.host_addr}/32", "dev", "eth0"],
                     ["route", "add", "default", "via", self.host_addr, "dev", "eth0"]):  # fmt: skip
            ip("-n", self.ns, *args)
        for what, pattern in FAKE_TARGETS:
            addr = self._claim(pattern)
            ip("-n", self.ns, "addr", "add", f"{addr}/32", "dev", "eth0")
            self.addrs[what] = addr
        # The public address goes through a gateway (the namespace's end of the veth): the
        # daemon takes routes without one for networks the host is attached to, and guards them.
        gateway = self._claim("169.254.214.{}")
        ip("-n", self.ns, "addr", "add", f"{gateway}/32", "dev", "eth0")
        self.public = self._claim(PUBLIC[1], via=gateway)
        ip("-n", self.ns, "addr", "add", f"{self.public}/32", "dev", "eth0")
        self.log.touch()
        self.server = subprocess.Popen(["ip", "netns", "exec", self.ns, sys.executable, "-u", "-c", FAKE_SERVER, str(self.log)],
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        ready, _, _ = select.select([self.server.stdout], [], [], 20)
        line = self.server.stdout.readline() if ready else b""
        assert line.strip() == b"ready", f"the fake network's listener did not start: {line!r}"

    def _claim(self, pattern: str, via: str = "") -> str:
        """A /32 route for an address of ``pattern`` through the veth. An address someone
        else routes is left alone: another octet, or for the fixed metadata address a wait
        (crates/runtime/tests/network.rs routes it for a few seconds). Routes get a metric of
        their own, so that one added meanwhile by another test is never refused for ours."""
        deadline = time.monotonic() + 90
        while True:
            addr = pattern.format(random.randint(100, 250))
            taken = ip("route", "show", f"{addr}/32").stdout.strip()
            r = ip("route", "add", f"{addr}/32", *(["via", via] if via else []), "dev", self.host_if, "src", self.host_addr,
                   "metric", str(ROUTE_METRIC), check=False) if not taken else None  # fmt: skip
            if r is not None and r.returncode == 0:
                self.routes.append(addr)
                return addr
            if time.monotonic() > deadline:
                raise RuntimeError(f"no route for {pattern} could be added: {taken or r.stderr}")
            time.sleep(0.5 if "{}" not in pattern else 0)

    def down(self) -> None:
        if self.server is not None and self.server.poll() is None:
            os.killpg(self.server.pid, signal.SIGKILL)
            self.server.wait()
        for addr in self.routes:
            ip("route", "del", f"{addr}/32", "dev", self.host_if, "metric", str(ROUTE_METRIC), check=False)
        ip("link", "del", self.host_if, check=False)
        ip("netns", "del", self.ns, check=False)
        if self.lock is not None:
            self.lock.close()
            self.lock = None

    def seen(self, token: str) -> List[str]:
        """Connections whose first line carries ``token``."""
        return [ln for ln in self.log.read_text(errors="replace").splitlines() if token in ln]


@pytest.fixture
def fake_net(workdir: Path) -> Iterator[FakeNet]:
    """A FakeNet for one test only: the metadata route stays on the host for seconds."""
    net = FakeNet(workdir)
    try:
        net.up()
        yield net
    finally:
        net.down()


def http_from_host(addr: str, path: str, port: int = 80, timeout: float = 3.0) -> str:
    try:
        with socket.create_connection((addr, port), timeout=timeout) as s:
            s.sendall(f"GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n".encode())
            data = b""
            while True:
                b = s.recv(4096)
                if not b:
                    break
                data += b
            return data.decode(errors="replace")
    except OSError as e:
        return f"error: {e!r}"


def fetch_all(sb: "object", urls: Sequence[str], timeout: int = 3) -> List[str]:
    """GETs every ``http://addr/path`` at once from inside ``sb`` (busybox nc: its wget is
    a static build that crashes on connect); returns each answer followed by its exit status."""
    jobs = []
    for i, u in enumerate(urls):
        addr, path = u.split("//", 1)[1].split("/", 1)
        jobs.append(f"( printf 'GET /{path} HTTP/1.0\\r\\n\\r\\n' | timeout {timeout + 3} nc -w {timeout} {addr} 80 2>&1; echo \"rc=$?\" ) > /tmp/fetch{i} 2>&1 &")
    show = "".join(f"echo '=== {i}'; cat /tmp/fetch{i}; " for i in range(len(urls)))
    r = sh(sb, "\n".join(jobs) + f"\nwait\n{show}", timeout=60)
    parts = re.split(r"^=== (\d+)\n", r.stdout, flags=re.M)
    found = {int(parts[i]): parts[i + 1].strip() for i in range(1, len(parts) - 1, 2)}
    return [found.get(i, f"no output: {out_of(r)}") for i in range(len(urls))]


def reached(output: str) -> bool:
    return "fake-" in output and "rc=0" in output


# --------------------------------------------------------------------- image builds

BUILD_PROBE = r"""#!/bin/sh
# Runs as Debian's second stage would, inside the build; records what it could reach.
. /probe/params
P=/probe/out
mkdir -p $P
t() { timeout 10 "$@"; }
t cat "/proc/1/root$MARKER" > $P/proc1root 2>&1
t cat "$MARKER" > $P/direct 2>&1
t ls "/proc/1/root$DATA" "$DATA" > $P/datadir 2>&1
( echo pwned > "/proc/1/root$MARKER"; echo pwned > "$MARKER" ) > $P/write 2>&1
ls /dev > $P/dev 2>&1
for n in "sda b 8 0" "vda b 253 0" "loop0 b 7 0" "mem c 1 1" "kmsg c 1 11"; do
  set -- $n; mknod /tmp/$1 $2 $3 $4 2>&1; echo "mknod $1 rc=$?"
done > $P/mknod
mkdir -p /mnt/h
for m in "-t tmpfs t" "-t proc p" "-t sysfs s" "/dev/vda" "/dev/loop0"; do
  mount $m /mnt/h 2>&1; echo "mount $m rc=$?"
done > $P/mount
for p in /proc/[0-9]*; do echo "${p#/proc/} $(tr '\0' ' ' < $p/cmdline 2>/dev/null)"; done > $P/procs
grep -E '^(CapEff|CapBnd|NoNewPrivs|Seccomp):' /proc/self/status > $P/status
hostname > $P/hostname
cat /proc/self/mountinfo > $P/mountinfo
( echo 1 > /proc/sys/kernel/sysrq ) > $P/procsys 2>&1; echo "rc=$?" >> $P/procsys
t head -c 16 /proc/kcore > /tmp/kcore 2> $P/kcore-error; wc -c < /tmp/kcore > $P/kcore
/probe/escape "$MARKER" > $P/chroot 2>&1; echo "rc=$?" >> $P/chroot
gw=$(ip route | awk '/^default/ {print $3}')
i=0
for target in $TCP_TARGETS ${gw:+$gw:$ANY_PORT}; do
  ( echo "$TOKEN tcp $target" | t nc -w 3 ${target%:*} ${target#*:} 2>&1; echo "tcp $target rc=$?" ) > $P/net-tcp-$i 2>&1 &
  i=$((i+1))
done
for target in $HTTP_TARGETS; do
  ( printf "GET /$TOKEN HTTP/1.0\r\n\r\n" | t nc -w 3 $target 80 2>&1; echo "http $target rc=$?" ) > $P/net-http-$i 2>&1 &
  i=$((i+1))
done
wait
ip -o link > $P/links 2>&1
exit 0
"""

FAKE_APT = "#!/bin/sh\n# Stands in for apt-get: the step that runs it gets the build sandbox network access.\nexit 0\n"

# Capabilities no sandbox (and so no build step) may hold.
FORBIDDEN_CAPS = {"DAC_READ_SEARCH": 2, "NET_ADMIN": 12, "NET_RAW": 13, "SYS_MODULE": 16, "SYS_RAWIO": 17, "SYS_PTRACE": 19,
                  "SYS_ADMIN": 21, "SYS_BOOT": 22, "SYS_TIME": 25, "MKNOD": 27, "BPF": 39}  # fmt: skip


@pytest.fixture(scope="module")
def build_daemon(workdir: Path, programs: Dict[str, Path]) -> Iterator[Tuple[Daemon, Path]]:
    """A daemon whose Debian base (the debootstrap cache, ``SANDFORK_CACHE``) is made by
    the test (see ``debian_base``)."""
    cache = Path(tempfile.mkdtemp(prefix="sfsec-cache-"))
    try:
        (cache / "debootstrap").mkdir()
        with own_daemon(env={"SANDFORK_CACHE": str(cache)}) as d:
            yield d, cache
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def debian_base(cache: Path, programs: Dict[str, Path], params: Dict[str, str]) -> None:
    """Writes the Debian base the next build unpacks: busybox, the probe as
    ``/debootstrap/debootstrap`` (Debian's second stage, run as the first build step), a
    stand-in ``apt-get`` (an ``apt`` step gives the build sandbox network access), and the
    probe's parameters."""
    tree = cache / f"tree-{secrets.token_hex(4)}"
    try:
        for d in ("bin", "etc", "tmp", "root", "proc", "sys", "dev", "run", "mnt", "usr/bin", "debootstrap", "probe"):
            (tree / d).mkdir(parents=True, exist_ok=True)
        shutil.copy("/bin/busybox", tree / "bin/busybox")
        for applet in run("/bin/busybox", "--list").stdout.split():
            if applet != "busybox":
                (tree / "bin" / applet).symlink_to("busybox")
        (tree / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
        (tree / "etc/group").write_text("root:x:0:\n")
        shutil.copy(programs["escape"], tree / "probe/escape")
        for path, text in (("debootstrap/debootstrap", BUILD_PROBE), ("usr/bin/apt-get", FAKE_APT)):
            (tree / path).write_text(text)
            (tree / path).chmod(0o755)
        (tree / "probe/params").write_text("".join(f"{k}='{v}'\n" for k, v in params.items()))
        run("tar", "-cpf", str(cache / "debootstrap" / "bookworm-minbase-foreign.tar"), "--numeric-owner", "-C", str(tree), ".")
    finally:
        shutil.rmtree(tree, ignore_errors=True)


def build_image(d: Daemon, body: dict, timeout: float = 300) -> Tuple[Optional[dict], List[str]]:
    """Builds an image through the API; returns the final event and the progress lines."""
    events: List[dict] = []
    conn_api = Api(d)
    status, data = conn_api.call("POST", "/v1/images", json_body=body, timeout=timeout)
    for line in data.splitlines():
        if line.strip():
            events.append(json.loads(line))
    progress = [e.get("message", "") for e in events if e.get("type") == "progress"]
    ends = [e for e in events if e.get("type") in ("done", "error")]
    last = ends[-1] if ends else {"type": "error", "message": f"HTTP {status}: {data[-300:]!r}"}
    return last, progress


def sections(text: str) -> Dict[str, str]:
    parts = re.split(r"^=== (\S+)\n", text, flags=re.M)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts) - 1, 2)}


@pytest.mark.promise("image builds")
@pytest.mark.parametrize("network", ["none", "internet"])
def test_build_steps_run_confined_in_a_sandbox(attempts, host, build_daemon, programs, fake_net, network) -> None:
    """A build step (the image's Debian second stage here, a package's install script in
    general) runs as root in a build sandbox: host files, the data directory, devices,
    mounts, host processes, kernel knobs and the host's network are out of its reach, and
    it holds no capability a sandbox lacks. What it saw is baked into the image it built."""
    from test_sockets_network import Listener

    d, cache = build_daemon
    name = f"sfsec-probe-{network}"
    lo, anyaddr = Listener(socket.AF_INET, ("127.0.0.1", 0)), Listener(socket.AF_INET, ("0.0.0.0", 0))
    try:
        token = f"build-{secrets.token_hex(6)}"
        tcp = [f"127.0.0.1:{lo.port}"] + [f"{a}:{anyaddr.port}" for a in host_addresses()]
        http = [fake_net.addrs[w] for w, _ in FAKE_TARGETS] + [fake_net.public]
        debian_base(cache, programs, {"MARKER": str(host.marker), "DATA": str(d.data_dir), "TOKEN": token, "TCP_TARGETS": " ".join(tcp),
                                      "HTTP_TARGETS": " ".join(http), "ANY_PORT": str(anyaddr.port)})  # fmt: skip
        probe_build(attempts, host, d, fake_net, network, name, token, lo, anyaddr)
    finally:
        lo.close()
        anyaddr.close()
        Api(d).call("DELETE", f"/v1/images/{name}")


def probe_build(attempts: "object", host: "object", d: Daemon, fake_net: FakeNet, network: str, name: str, token: str, lo: "object", anyaddr: "object") -> None:
    """Builds image ``name`` through the API and judges what its build step recorded."""
    from sandfork import Sandbox

    last, progress = build_image(d, {"name": name, "builder": "debian", "apt": ["probe"] if network == "internet" else []})
    assert last.get("type") == "done", f"the build failed: {last} {progress[-5:]}"
    build_ids = sorted({w for p in progress for w in p.split() if w.startswith("build-")})
    attempts.refused("[control] the build ran its steps in a build sandbox", bool(build_ids) and any(p.startswith("step:") for p in progress), str(progress[-8:]))
    c = client_of(d)
    with Sandbox.create(client=c, image=name, memory_mb=64, allow_internet_access=False) as sb, Sandbox.create(client=c, memory_mb=64, allow_internet_access=False) as plain:
        r = sh(sb, "cd /probe/out && for f in *; do echo \"=== $f\"; cat $f; done")
        seen = sections(r.stdout)
        plain_caps = sh(plain, "grep CapEff /proc/self/status").stdout.split()[-1]
    assert "status" in seen, f"the probe did not run: {out_of(r)}"
    secret = host.marker_text.decode().strip()
    attempts.refused("read a host file through /proc/1/root", secret not in seen.get("proc1root", ""), seen.get("proc1root", ""))
    attempts.refused("read a host file by its path", secret not in seen.get("direct", ""), seen.get("direct", ""))
    attempts.refused("escape the build's root with the chroot-and-climb trick", secret not in seen.get("chroot", "") and "rc=0" not in seen.get("chroot", ""), seen.get("chroot", ""))
    attempts.refused("list the daemon's data directory (layers, state)", not re.search(r"\b(store|state\.db|snapshots)\b", seen.get("datadir", "")), seen.get("datadir", ""))
    attempts.refused("write a host file from the build", host.marker.read_bytes() == host.marker_text, seen.get("write", ""))
    devs = seen.get("dev", "").split()
    attempts.refused("see the host's block devices in /dev", not any(x.startswith(("sd", "vd", "nvme", "loop", "xvd", "dm-")) for x in devs), " ".join(devs))
    for line in seen.get("mknod", "").splitlines():
        if line.startswith("mknod "):
            attempts.refused(f"build step: {line.rsplit(' ', 1)[0]} (a device node)", "rc=0" not in line, seen["mknod"])
    for line in seen.get("mount", "").splitlines():
        if line.startswith("mount "):
            attempts.refused(f"build step: {line.rsplit(' ', 1)[0]}", "rc=0" not in line, seen["mount"])
    procs = seen.get("procs", "")
    host_cmds = [ln for ln in procs.splitlines() if re.search(r"sandfork serve|pytest|sandfork-disk|runc ", ln)]
    attempts.refused("see host processes (the daemon, its disk servers, runc, the test)", not host_cmds and len(procs.splitlines()) < 30, procs[-400:])
    status = dict(ln.split(":", 1) for ln in seen.get("status", "").splitlines() if ":" in ln)
    attempts.refused("run without seccomp", status.get("Seccomp", "").strip() == "2", seen.get("status", ""))
    attempts.refused("run without no_new_privileges", status.get("NoNewPrivs", "").strip() == "1", seen.get("status", ""))
    eff = int(status.get("CapEff", "0").strip() or "0", 16)
    for cap, bit in FORBIDDEN_CAPS.items():
        attempts.refused(f"hold CAP_{cap} in a build step", not eff & (1 << bit), hex(eff))
    attempts.refused("hold more capabilities than a sandbox", eff & ~int(plain_caps, 16) == 0, f"build {eff:x}, sandbox {plain_caps}")
    attempts.refused("share the host's hostname (UTS namespace)", seen.get("hostname", "").strip() not in ("", socket.gethostname()), seen.get("hostname", ""))
    mountinfo = seen.get("mountinfo", "")
    root_line = next((ln for ln in mountinfo.splitlines() if ln.split()[4:5] == ["/"]), "")
    attempts.refused("run in a host chroot of the build directory", " - ext4 /dev/loop" in root_line and ".build-" not in mountinfo, root_line)
    attempts.refused("write /proc/sys", "rc=0" not in seen.get("procsys", ""), seen.get("procsys", ""))
    attempts.refused("read /proc/kcore", seen.get("kcore", "").strip() == "0", seen.get("kcore", "") + seen.get("kcore-error", ""))
    links = seen.get("links", "")
    if network == "none":
        attempts.refused("an interface besides lo in a build without network", all(": lo:" in ln for ln in links.splitlines()), links)
    time.sleep(0.5)
    nets = {k: v for k, v in seen.items() if k.startswith("net-")}
    assert nets, f"no network probe ran: {sorted(seen)}"
    for out in nets.values():
        what = out.strip().splitlines()[-1].rsplit(" ", 1)[0] if out.strip() else "?"
        if what == f"http {fake_net.public}":
            if network == "internet":
                attempts.refused(f"[control] a build step with network reaches {PUBLIC[0]} at {fake_net.public}", "rc=0" in out and "fake-" in out, out)
            else:
                attempts.refused(f"build step without network reaches {PUBLIC[0]}", "rc=0" not in out and "fake-" not in out, out)
            continue
        attempts.refused(f"build step ({network}) reaches {what}", "rc=0" not in out and "fake-" not in out, out)
    attempts.refused("reach a host listener from a build step (checked on the host)", not lo.connections and not anyaddr.connections, f"{lo.connections} {anyaddr.connections}")
    guarded_seen = [ln for ln in fake_net.seen(token) if ln.split()[0] != fake_net.public]
    attempts.refused("reach the fake metadata server or private ranges from a build step (checked by the listener)", not guarded_seen, str(guarded_seen))
    for bid in build_ids:
        left = [c for c in leftover_containers(d.data_dir) if bid in c] + sandbox_mount_points(bid) + loop_devices_of(bid)
        left += [p for p in ("/run/sandfork/netns/sf-" + bid,) if os.path.exists(p)]
        left += [f"lease {p.name}" for p in Path("/run/sandfork/leases").glob("*") if bid in p.read_text(errors="replace")]
        attempts.refused(f"the build sandbox {bid} outlives its build (container, mounts, loop device, netns, address lease)", not left, str(left))


# --------------------------------------------------------------------------- egress

# The ranges no sandbox reaches unless an allow rule names them (the promise; the host's
# own networks are added at runtime).
GUARDED = ["0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12",
           "192.0.0.0/24", "192.168.0.0/16", "198.18.0.0/15", "224.0.0.0/4", "240.0.0.0/4"]  # fmt: skip


def view_of(api: Api, sandbox_id: str) -> dict:
    status, v = api.json("GET", f"/v1/sandboxes/{sandbox_id}")
    assert status == 200, v
    return v


def egress_chain(view: dict) -> str:
    """The nftables rules of a sandbox's egress chain (``sb_sfh<index>``)."""
    addr = ipaddress.ip_address(view["network"]["address"])
    index = (int(addr) - int(ipaddress.ip_address("198.18.0.0"))) // 4
    return run("nft", "list", "chain", "inet", "sandfork", f"sb_sfh{index:x}").stdout


def connected_networks() -> List[ipaddress.IPv4Network]:
    """The host's directly connected IPv4 networks (as sandfork reads them), but its own."""
    nets = []
    for line in Path("/proc/net/route").read_text().splitlines()[1:]:
        f = line.split()
        dest, gateway, mask = (int.from_bytes(bytes.fromhex(x), "little") for x in (f[1], f[2], f[7]))
        if f[0].startswith("sfh") or gateway != 0 or mask == 0:
            continue
        nets.append(ipaddress.IPv4Network((dest, bin(mask).count("1")), strict=False))
    return nets


def rule_sets(chain: str) -> List[Tuple[str, List[ipaddress.IPv4Network], str]]:
    """(rule text, destination networks, verdict) for each ``ip daddr`` rule, in order."""
    out = []
    for line in chain.splitlines():
        line = line.strip()
        m = re.match(r"ip daddr (\{ (?P<set>[^}]*) \}|(?P<one>\S+))(?P<rest>.*)", line)
        if not m:
            continue
        one = m.group("one") or ""
        if one.startswith("@"):
            # A named set (addresses the sandbox's resolver learned): what it holds now.
            items = learned_set(one[1:])
        else:
            items = (m.group("set") or one).split(",")
        nets = [ipaddress.ip_network(i.strip(), strict=False) for i in items if i.strip()]
        out.append((line, nets, line.split()[-1]))
    return out


def learned_set(name: str) -> List[str]:
    """The addresses in nftables set ``name`` of the sandfork table."""
    listing = run("nft", "-j", "list", "set", "inet", "sandfork", name).stdout
    elems = json.loads(listing)["nftables"][1]["set"].get("elem", [])
    return [e if isinstance(e, str) else e["elem"]["val"] for e in elems]


@pytest.mark.promise("egress")
def test_metadata_and_private_ranges_refused_unless_allowed(attempts, daemon, fake_net) -> None:
    """A fake cloud metadata server (169.254.169.254) and listeners in each private range,
    in a network namespace of the test's own: the host reaches them; a sandbox with
    internet access or with none does not; an explicit `allow_out` (at create, or by PATCH
    on a running sandbox) lets it, and clearing it refuses them again."""
    from sandfork import Sandbox

    api = Api(daemon)
    targets = list(fake_net.addrs.items())
    all_32 = [f"{a}/32" for _, a in targets]
    for what, addr in targets:
        got = http_from_host(addr, f"/host-control-{secrets.token_hex(4)}")
        attempts.refused(f"[control] the host reaches {what} at {addr} (the fake listener works)", f"fake-{addr}" in got, got[-200:])

    def probe(sb: "object", label: str, expect_reach: bool) -> None:
        token = f"{label}-{secrets.token_hex(5)}"
        outs = fetch_all(sb, [f"http://{a}/{token}" for _, a in targets])
        time.sleep(0.3)
        for (what, addr), out in zip(targets, outs):
            seen = [ln for ln in fake_net.seen(token) if ln.split()[0] == addr]
            if expect_reach:
                attempts.refused(f"[control] {label}: the explicit allow is honoured for {what}", reached(out) and bool(seen), out)
            else:
                attempts.refused(f"{label} sandbox reaches {what} at {addr}", not reached(out) and not seen, f"{out} {seen}")

    with Sandbox.create(memory_mb=64, allow_internet_access=True) as net, Sandbox.create(memory_mb=64, allow_internet_access=False) as none, \
            Sandbox.create(memory_mb=64, allow_internet_access=True, allow_out=all_32) as allowed:  # fmt: skip
        outs = fetch_all(net, [f"http://{fake_net.public}/public-{secrets.token_hex(4)}"]) + fetch_all(none, [f"http://{fake_net.public}/public-none"])
        attempts.refused(f"[control] an internet sandbox reaches {PUBLIC[0]} (the probe can succeed)", reached(outs[0]), outs[0])
        attempts.refused(f"a sandbox without network reaches {PUBLIC[0]}", not reached(outs[1]), outs[1])
        probe(net, "internet", False)
        probe(none, "no-network", False)
        probe(allowed, "allow_out-at-create", True)
        status, v = api.json("PATCH", f"/v1/sandboxes/{net.id}", json_body={"allow_out": [f"{METADATA}/32"]})
        attempts.refused("[control] PATCH allow_out on a running sandbox", status == 200, str(v))
        token = f"patched-{secrets.token_hex(5)}"
        outs = fetch_all(net, [f"http://{a}/{token}" for _, a in targets])
        for (what, addr), out in zip(targets, outs):
            if addr == METADATA:
                attempts.refused("[control] allow_out patched to the metadata address reaches it", reached(out), out)
            else:
                attempts.refused(f"an allow list of the metadata address alone lets {what} through", not reached(out), out)
        status, v = api.json("PATCH", f"/v1/sandboxes/{net.id}", json_body={"allow_out": []})
        assert status == 200, v
        probe(net, "allow_out-cleared", False)
        status, v = api.json("PATCH", f"/v1/sandboxes/{none.id}", json_body={"allow_out": all_32})
        attempts.refused("open egress by PATCH on a sandbox without network", status == 422, f"{status} {v}")
        probe(none, "no-network-after-patch", False)


@pytest.mark.promise("egress")
def test_an_allow_out_opens_a_guarded_range_only_where_the_operator_allowed(attempts, daemon) -> None:
    """A caller's `allow_out` never opens the metadata service, a private network or the
    host's networks on its own say-so: an entry reaching into a guarded range is refused
    (403 naming `allow_out_guarded`) at create, restore and PATCH, unless it lies inside what
    the operator allowed (this suite's daemon allows the fake hosts' /24s and the metadata
    /32 only)."""
    from sandfork import Sandbox

    api = Api(daemon)
    outside = ["169.254.0.0/16", "169.254.169.253/32", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "127.0.0.1/32", "0.0.0.0/0", "100.64.0.0/10", "224.0.0.1/32"]
    for entry in outside:
        status, v = api.json("POST", "/v1/sandboxes", json_body={"memory_mb": 64, "allow_out": [entry]})
        refused = status == 403 and "allow_out_guarded" in str(v)
        attempts.refused(f"create with allow_out {entry}", refused, f"{status} {v}")
        if status == 201:
            api.json("DELETE", f"/v1/sandboxes/{v['id']}")
    with Sandbox.create(memory_mb=64, allow_internet_access=True) as sb:
        for entry in outside:
            status, v = api.json("PATCH", f"/v1/sandboxes/{sb.id}", json_body={"allow_out": [entry]})
            attempts.refused(f"PATCH allow_out {entry}", status == 403 and "allow_out_guarded" in str(v), f"{status} {v}")
        snap = sb.checkpoint()
        try:
            status, v = api.json("POST", "/v1/sandboxes", json_body={"snapshot_id": snap.id, "allow_out": ["10.0.0.0/8"]})
            attempts.refused("restore with allow_out 10.0.0.0/8", status == 403, f"{status} {v}")
            if status == 201:
                api.json("DELETE", f"/v1/sandboxes/{v['id']}")
        finally:
            snap.delete()
        status, v = api.json("PATCH", f"/v1/sandboxes/{sb.id}", json_body={"allow_out": [f"{METADATA}/32", "10.213.77.9/32", "203.0.113.0/24"]})
        attempts.refused("[control] allow_out inside what the operator allowed, and outside every guarded range", status == 200, f"{status} {v}")


@pytest.mark.promise("egress")
def test_guarded_ranges_are_dropped_in_the_ruleset(attempts, daemon) -> None:
    """The egress chain of an `internet` sandbox drops every guarded range (and the host's
    networks) before its final accept, with nothing accepting them earlier but DNS to the
    sandbox's resolvers; with an allow list the final verdict is drop; the base chains
    drop new connections into and out of sandbox interfaces."""
    from sandfork import Sandbox

    api = Api(daemon)
    with Sandbox.create(memory_mb=64, allow_internet_access=True) as sb, Sandbox.create(memory_mb=64, allow_internet_access=True, allow_out=["203.0.113.7/32"]) as allow:
        chain = egress_chain(view_of(api, sb.id))
        allow_chain = egress_chain(view_of(api, allow.id))
        rules = rule_sets(chain)  # learned-address sets are read while they exist
    lines = [ln.strip() for ln in chain.splitlines() if ln.strip() and not ln.strip().startswith(("table", "chain", "}"))]
    drops = [(i, nets) for i, (line, nets, verdict) in enumerate(rules) if verdict == "drop"]
    accepts = [(line, nets) for line, nets, verdict in rules if verdict == "accept"]
    last = lines[-1] if lines else ""
    attempts.refused("[control] the chain ends with its default verdict (accept without an allow list)", last == "accept", chain)
    guarded = [ipaddress.ip_network(g) for g in GUARDED]
    host_nets = [str(n) for n in connected_networks() if not any(n.subnet_of(g) for g in guarded)]
    for rng in GUARDED + host_nets:
        net = ipaddress.ip_network(rng)
        dropped = any(net.subnet_of(n) for _, nets in drops for n in nets if n.version == 4)
        opened = [line for line, nets in accepts if any(n.overlaps(net) for n in nets) and "dport 53" not in line]
        attempts.refused(f"{rng} reachable past the egress chain", dropped and not opened, chain)
    resolvers = {ipaddress.ip_network(w) for ln in Path("/etc/resolv.conf").read_text().splitlines() if ln.startswith("nameserver")
                 for w in ln.split()[1:2] if re.fullmatch(r"[\d.]+", w) and not w.startswith("127.")}  # fmt: skip
    for line, nets in accepts:
        if "dport 53" in line:
            attempts.refused(f"DNS accepted to more than the sandbox's resolvers: {line}", set(nets) <= resolvers, f"resolvers {sorted(map(str, resolvers))}")
    attempts.refused("spoofed source addresses leave the sandbox", re.search(r"ip saddr != \S+ drop", chain) is not None, chain)
    attempts.refused("IPv6 leaves the sandbox unfiltered", "meta nfproto != ipv4 drop" in chain, chain)
    allow_last = [ln.strip() for ln in allow_chain.splitlines() if ln.strip() and not ln.strip().startswith(("table", "chain", "}"))][-1:]
    attempts.refused("with an allow list, what it does not name goes through", allow_last == ["drop"], allow_chain)
    table = run("nft", "list", "table", "inet", "sandfork").stdout
    forward = chain_body(table, "forward")
    attempts.refused("new connections into a sandbox interface (forward)", re.search(r'oifname "sfh\*" drop', forward) is not None, forward)
    inp = chain_body(table, "input")
    attempts.refused("new connections from a sandbox to the host (input)", re.search(r'iifname "sfh\*" drop', inp) is not None, inp)
    # Before that drop, only replies and DNS to the sandbox's own resolver (its host end).
    before = inp.split('iifname "sfh*" drop', 1)[0]
    accepts_in = [ln.strip() for ln in before.splitlines() if ln.strip().endswith("accept")]
    attempts.refused(
        "a sandbox reaches host services other than its resolver",
        all("ct state established,related" in ln or ("th dport 53" in ln and "@dns_in" in ln) for ln in accepts_in),
        inp,
    )


def chain_body(table: str, name: str) -> str:
    """The rules of chain ``name`` in an ``nft list table`` listing."""
    lines = table.split(f"chain {name} {{", 1)[-1].splitlines()
    body = []
    for ln in lines[1:]:
        if ln.strip() == "}":
            break
        body.append(ln)
    return "\n".join(body)


# ------------------------------------------------------------------- snapshot files

SNAP2, SNAP1, HASHED, SIGNED = b"SFSNAP2\n", b"SFSNAP1\n", b"SFSNAPZ\n", b"SFSNAPS\n"
# Holds a value only in memory (its file is deleted) and writes it to /tmp/answer whenever
# /tmp/ask appears.
HOLDER = "v=$(cat /tmp/value); rm /tmp/value; while :; do if [ -e /tmp/ask ]; then rm /tmp/ask; echo $v > /tmp/answer; fi; sleep 0.05; done"
ASK = "rm -f /tmp/answer; touch /tmp/ask; for i in $(seq 200); do [ -s /tmp/answer ] && break; sleep 0.05; done; cat /tmp/answer"


def snap_entries(f: bytes) -> List[Tuple[str, bytes]]:
    """The entries of a signed (version 2) snapshot file."""
    assert f[:8] == SNAP2 and f[-40:-32] == SIGNED, "not a signed snapshot file"
    body, at, out = f[8:-80], 0, []
    while at < len(body):
        n = int.from_bytes(body[at:at + 2], "little")
        name = body[at + 2:at + 2 + n].decode()
        at += 2 + n
        size = int.from_bytes(body[at:at + 8], "little")
        out.append((name, body[at + 8:at + 8 + size]))
        at += 8 + size
    return out


def entry_spans(f: bytes) -> Dict[str, Tuple[int, int]]:
    """Where each entry's data lies in the file: (offset, length)."""
    spans, at = {}, 8
    for name, data in snap_entries(f):
        at += 2 + len(name.encode()) + 8
        spans[name] = (at, len(data))
        at += len(data)
    return spans


def forge_v1(entries: Sequence[Tuple[str, bytes]]) -> bytes:
    """An unsigned (version 1) file of ``entries``, with a correct hash: what anyone can
    make without the key."""
    out = bytearray(SNAP1)
    for name, data in entries:
        raw = name.encode()
        out += len(raw).to_bytes(2, "little") + raw + len(data).to_bytes(8, "little") + data
    return bytes(out) + HASHED + hashlib.sha256(out).digest()


def with_manifest(entries: Sequence[Tuple[str, bytes]], change: Any) -> List[Tuple[str, bytes]]:
    out = []
    for name, data in entries:
        if name == "manifest.json":
            m = json.loads(data)
            change(m)
            data = json.dumps(m).encode()
        out.append((name, data))
    return out


def flip(f: bytes, at: int) -> bytes:
    b = bytearray(f)
    b[at] ^= 0xFF
    return bytes(b)


def inventory(d: Daemon) -> set:
    """What a snapshot import can leave in a data directory: listed snapshots, snapshot
    directories, layers, pins, and scratch files."""
    data = d.data_dir
    # A layer the store is deleting passes through store/tmp/gc-<id> for a moment (another
    # sandbox's disk going away): wait for those removals to finish, a stuck one is listed.
    deadline = time.monotonic() + 10
    while any((data / "store" / "tmp").glob("gc-*")) and time.monotonic() < deadline:
        time.sleep(0.1)
    status, listed = Api(d).json("GET", "/v1/snapshots")
    found = {f"snapshot {s['id']}" for s in (listed or {}).get("snapshots", [])} if status == 200 else {"(snapshot list failed)"}
    for kind, sub in (("snapshot dir", "snapshots"), ("layer", "store/layers"), ("pin", "store/refs")):
        found |= {f"{kind} {p.name}" for p in (data / sub).glob("*")}
    for sub in ("tmp", "store/tmp"):
        found |= {f"scratch {p.relative_to(data)}" for p in (data / sub).rglob("*") if not p.is_dir()}
    return found


class MountWatch:
    """Records every ext4 mount under ``root`` that appears while the block runs (polled
    every few milliseconds from /proc/self/mountinfo)."""

    def __init__(self, root: Path):
        self.root, self.ext4, self.stop = str(root), [], threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)

    def _mounts(self) -> set:
        with open("/proc/self/mountinfo") as f:
            return {ln.strip() for ln in f if self.root in ln and " - ext4 " in ln}

    def _watch(self) -> None:
        while not self.stop.is_set():
            for m in self._mounts() - self.before:
                if m not in self.ext4:
                    self.ext4.append(m)
            time.sleep(0.003)

    def __enter__(self) -> "MountWatch":
        self.before = self._mounts()
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


class SnapPair:
    """Daemons A (the exporter, with a sandbox and its two snapshots) and B (another host)."""

    def __init__(self, a: Daemon, b: Daemon):
        self.a, self.b = a, b
        self.keep = f"keep-{secrets.token_hex(4)}"
        self.value = f"in-memory-{secrets.token_hex(4)}"
        self.fs_id = self.mem_id = ""
        self.fs = self.mem = b""
        self.digests: Dict[str, Dict[str, str]] = {}

    def digest_of(self, snapshot_id: str) -> Dict[str, str]:
        root = self.a.data_dir / "snapshots" / snapshot_id
        return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


def import_file(d: Daemon, data: bytes, trust: bool = False) -> Tuple[int, Any]:
    return Api(d).json("POST", "/v1/snapshots/import" + ("?trust_unsigned=true" if trust else ""), body=data, headers={"Content-Type": "application/octet-stream"}, timeout=300)


def delete_snapshot(d: Daemon, snapshot_id: str) -> None:
    Api(d).call("DELETE", f"/v1/snapshots/{snapshot_id}")


@pytest.fixture(scope="module")
def snaps() -> Iterator[SnapPair]:
    from sandfork import Sandbox

    with own_daemon() as a, own_daemon() as b:
        pair = SnapPair(a, b)
        api = Api(a)
        with Sandbox.create(client=client_of(a), memory_mb=64, allow_internet_access=False) as src:
            sh(src, f"echo {pair.keep} > /root/keep.txt; echo {pair.value} > /tmp/value")
            src.start_process(["sh", "-c", HOLDER])
            sh(src, "for i in $(seq 100); do [ -e /tmp/value ] || break; sleep 0.05; done")
            for kind in ("filesystem", "memory"):
                status, snap = api.json("POST", f"/v1/sandboxes/{src.id}/checkpoint", json_body={"type": kind})
                assert status == 201, snap
                status, data = api.call("POST", f"/v1/snapshots/{snap['id']}/export")
                assert status == 200, data[:300]
                if kind == "filesystem":
                    pair.fs_id, pair.fs = snap["id"], data
                else:
                    pair.mem_id, pair.mem = snap["id"], data
        pair.digests = {sid: pair.digest_of(sid) for sid in (pair.fs_id, pair.mem_id)}
        yield pair


def check_import(attempts: "object", d: Daemon, what: str, data: bytes, trust: bool = False) -> Tuple[int, Any]:
    """Imports a file that must be refused (400) and leave nothing behind."""
    before = inventory(d)
    status, v = import_file(d, data, trust)
    left = inventory(d) - before
    attempts.refused(f"import {what}", status == 400 and (isinstance(v, dict) and v.get("code") == "invalid_argument"), f"{status} {v}")
    attempts.refused(f"a refused import of {what} leaves a snapshot, layer, pin or file behind", not left, str(sorted(left)))
    if status == 201 and isinstance(v, dict):
        delete_snapshot(d, v["id"])
    return status, v


@pytest.mark.promise("snapshot files")
def test_exports_import_only_with_the_key_or_explicit_trust(attempts, snaps) -> None:
    """Unchanged exports import and restore on the exporting daemon (filesystem and
    memory); on another daemon a filesystem snapshot needs `trust_unsigned=true` and a
    memory snapshot is refused whatever the caller says, signed or stripped or re-made
    unsigned."""
    from sandfork import Sandbox

    a, b = snaps.a, snaps.b
    for kind, data in (("filesystem", snaps.fs), ("memory", snaps.mem)):
        status, v = import_file(a, data)
        ok = status == 201 and v.get("type") == kind
        detail = f"{status} {v}"
        if ok:
            with Sandbox.create(client=client_of(a), snapshot_id=v["id"], memory_mb=64) as child:
                got = sh(child, "cat /root/keep.txt").stdout.strip()
                value = sh(child, ASK).stdout.strip() if kind == "memory" else snaps.value
            ok = got == snaps.keep and value == snaps.value
            detail += f" keep={got!r} value={value!r}"
            delete_snapshot(a, v["id"])
        attempts.refused(f"[control] an unchanged {kind} export imports and restores on its own daemon", ok, detail)
    entries = snap_entries(snaps.mem)
    check_import(attempts, b, "a filesystem export signed by another daemon, without trust_unsigned", snaps.fs)
    check_import(attempts, b, "a memory export signed by another daemon", snaps.mem)
    check_import(attempts, b, "a memory export signed by another daemon, with trust_unsigned", snaps.mem, trust=True)
    check_import(attempts, b, "a memory export stripped of its signature, with trust_unsigned", snaps.mem[:-40], trust=True)
    check_import(attempts, b, "a memory export re-made unsigned (version 1), with trust_unsigned", forge_v1(entries), trust=True)
    check_import(attempts, a, "its own memory export re-made unsigned (version 1), with trust_unsigned", forge_v1(entries), trust=True)
    check_import(attempts, a, "its own memory export with a flipped signature", flip(snaps.mem, len(snaps.mem) - 1))
    check_import(attempts, a, "its own memory export carrying the filesystem export's signature", snaps.mem[:-32] + snaps.fs[-32:])
    check_import(attempts, a, "its own filesystem export re-made unsigned (version 1), without trust_unsigned", forge_v1(snap_entries(snaps.fs)))
    status, v = import_file(b, snaps.fs, trust=True)
    attempts.refused("[control] another daemon's filesystem export imports with trust_unsigned", status == 201 and v.get("type") == "filesystem", f"{status} {v}")
    if status == 201:
        delete_snapshot(b, v["id"])
    status, v = import_file(a, forge_v1(snap_entries(snaps.fs)), trust=True)
    attempts.refused("[control] an unsigned (version 1) filesystem file imports with trust_unsigned", status == 201, f"{status} {v}")
    if status == 201:
        delete_snapshot(a, v["id"])


@pytest.mark.promise("snapshot files")
def test_an_unsigned_file_carries_data_never_policy(attempts, snaps) -> None:
    """An unsigned filesystem file (trusted with `trust_unsigned`) whose record asks for
    egress to the metadata address and a private range, a named volume of the importing
    host mounted read-write, and more CPUs and memory: its filesystem is imported, its
    policy is not — the restored sandbox gets the defaults, no egress list and no volume."""
    from sandfork import Sandbox, Volume

    b = snaps.b
    vol = f"host-vol-{secrets.token_hex(3)}"
    Volume.create(vol, client=client_of(b))

    def hostile(m: Dict[str, Any]) -> None:
        m["boot"]["network"] = {"internet": True, "allow_out": ["169.254.169.254", "10.0.0.0/8"], "deny_out": []}
        m["boot"]["volumes"] = [{"name": vol, "path": "/mnt/host", "read_only": False}]
        m["boot"]["cpus"], m["boot"]["memory_mb"] = 2.0, 4096
        m["view"]["cpus"], m["view"]["memory_mb"] = 2.0, 4096

    status, v = import_file(b, forge_v1(with_manifest(snap_entries(snaps.fs), hostile)), trust=True)
    attempts.refused("[control] the unsigned file's filesystem imports with trust_unsigned", status == 201, f"{status} {v}")
    if status != 201:
        return
    try:
        attempts.refused("an unsigned file's cpus and memory", (v.get("cpus"), v.get("memory_mb")) == (1.0, 512), str(v))
        with Sandbox.create(client=client_of(b), snapshot_id=v["id"]) as child:
            info = Api(b).json("GET", f"/v1/sandboxes/{child.id}")[1]
            attempts.refused("an unsigned file's egress list", info["network"]["allow_out"] == [], str(info["network"]))
            mounted = sh(child, "grep -c ' /mnt/host ' /proc/mounts || true").stdout.strip()
            attempts.refused("an unsigned file's volume mount", mounted == "0", f"/mnt/host mounts: {mounted}")
            kept = sh(child, "cat /root/keep.txt").stdout.strip()
            attempts.refused("[control] its data came along", kept == snaps.keep, kept)
    finally:
        delete_snapshot(b, v["id"])
        Api(b).call("DELETE", f"/v1/volumes/{vol}")


TAMPERS = {
    "a flipped magic byte": lambda f, s: flip(f, 0),
    "a flipped entry-name byte": lambda f, s: flip(f, 10),
    "a flipped manifest byte": lambda f, s: flip(f, s["manifest.json"][0] + s["manifest.json"][1] // 2),
    "the artifact's first byte flipped": lambda f, s: flip(f, s["layers.artifact"][0]),
    "a byte in the middle of the artifact flipped": lambda f, s: flip(f, s["layers.artifact"][0] + s["layers.artifact"][1] // 2),
    "the artifact's last byte flipped": lambda f, s: flip(f, sum(s["layers.artifact"]) - 1),
    "a flipped hash trailer": lambda f, s: flip(f, len(f) - 60),
    "one byte cut off": lambda f, s: f[:-1],
    "half of it cut off": lambda f, s: f[: len(f) // 2],
    "its signature stripped": lambda f, s: f[:-40],
    "junk appended": lambda f, s: f + b"junk" * 64,
    "its body swapped for the other kind's": lambda f, s: None,
    "nothing at all": lambda f, s: b"",
    "random bytes": lambda f, s: os.urandom(len(f)),
    "the version-1 magic on a signed file": lambda f, s: SNAP1 + f[8:],
}


@pytest.mark.promise("snapshot files")
@pytest.mark.parametrize("kind,tamper", [(k, t) for k in ("filesystem", "memory") for t in [*TAMPERS, "a flipped signature"]] + [("memory", "a flipped memory-image byte")])
def test_tampered_snapshot_files_are_refused(attempts, snaps, kind, tamper) -> None:
    """A snapshot file changed anywhere (magic, names, manifest, layers, memory images,
    trailers, length) is refused, on the daemon that signed it and, for a filesystem,
    even with `trust_unsigned=true`; nothing of it stays in the data directory."""
    good, other = (snaps.fs, snaps.mem) if kind == "filesystem" else (snaps.mem, snaps.fs)
    spans = entry_spans(good)
    if tamper == "a flipped memory-image byte":
        name = max((n for n in spans if n.startswith("memory/pages-")), key=lambda n: spans[n][1])
        bad = flip(good, spans[name][0] + spans[name][1] // 2)
    elif tamper == "a flipped signature":
        bad = flip(good, len(good) - 1)
    elif tamper == "its body swapped for the other kind's":
        bad = other[:-40] + good[-40:]
    else:
        bad = TAMPERS[tamper](good, spans)
    # Trusting unsigned files is the most a caller can concede (filesystem only); a flipped
    # signature is the one change that trust covers, so that one is tried without it.
    trust = kind == "filesystem" and tamper != "a flipped signature"
    check_import(attempts, snaps.a, f"its own {kind} export with {tamper}{' (trust_unsigned)' if trust else ''}", bad, trust)


def _renamed_memory(entries: Sequence[Tuple[str, bytes]]) -> List[Tuple[str, bytes]]:
    return [(n.replace("memory/", "mem-", 1), d) for n, d in entries]


KIND_CONFUSION = {
    "a filesystem file declaring a memory snapshot": lambda fs, mem: with_manifest(fs, lambda m: m["view"].update(type="memory")),
    "a filesystem file with an entry named memory": lambda fs, mem: list(fs) + [("memory", b"not a CRIU image")],
    "a filesystem file carrying memory images": lambda fs, mem: list(fs) + [e for e in mem if e[0].startswith("memory/")],
    "a memory file declaring a filesystem snapshot": lambda fs, mem: with_manifest(mem, lambda m: m["view"].update(type="filesystem")),
    "a memory file with its images renamed, still declaring memory": lambda fs, mem: _renamed_memory(mem),
    "a memory file declaring memory with a host memory_dir and no images": lambda fs, mem: with_manifest([e for e in mem if not e[0].startswith("memory/")], lambda m: m.update(memory_dir="/etc")),
    "an entry that climbs out of the scratch directory": lambda fs, mem: list(fs) + [("memory/../../../../../../tmp/sfsec-pwn-climb", b"x")],
    "an entry with an absolute name": lambda fs, mem: list(fs) + [("/tmp/sfsec-pwn-absolute", b"x")],
    "an entry name with a dot-dot": lambda fs, mem: list(fs) + [("../sfsec-pwn-dotdot", b"x")],
    "the manifest twice": lambda fs, mem: list(fs) + [fs[0]],
    "a manifest whose layers are not the artifact's": lambda fs, mem: with_manifest(fs, lambda m: m.update(layer_id="0" * 32)),
    "a manifest asking for 2048 cpus": lambda fs, mem: with_manifest(fs, lambda m: m["boot"].update(cpus=2048.0)),
    "a manifest asking for 8 MiB of memory": lambda fs, mem: with_manifest(fs, lambda m: m["boot"].update(memory_mb=8)),
    "a manifest with an environment variable named A=B": lambda fs, mem: with_manifest(fs, lambda m: m["boot"].update(env={"A=B": "x"})),
    "a manifest asking for a disk past 1 TiB": lambda fs, mem: with_manifest(fs, lambda m: m["boot"].update(disk_mb=1 << 50)),
    "a manifest that is not JSON": lambda fs, mem: [("manifest.json", b"{not json")] + list(fs[1:]),
    "no manifest": lambda fs, mem: list(fs[1:]),
    "no artifact": lambda fs, mem: list(fs[:1]),
}




@pytest.mark.promise("snapshot files")
@pytest.mark.parametrize("variant", list(KIND_CONFUSION))
def test_forged_manifests_and_entries_are_refused(attempts, snaps, variant) -> None:
    """Unsigned files made from real exports (what anyone can forge without the key),
    imported with `trust_unsigned=true`: whatever kind the manifest declares, memory images
    under any name, entries that climb out of the scratch directory, bad resources or
    layers are refused and leave nothing behind (nor anything outside the data dir)."""
    fs, mem = snap_entries(snaps.fs), snap_entries(snaps.mem)
    forged = forge_v1(KIND_CONFUSION[variant](fs, mem))
    strays = [Path("/tmp/sfsec-pwn-climb"), Path("/tmp/sfsec-pwn-absolute")]
    check_import(attempts, snaps.a, f"{variant} (unsigned, trust_unsigned)", forged, trust=True)
    outside = [str(p) for p in strays if p.exists()] + [str(p) for p in snaps.a.data_dir.parent.rglob("sfsec-pwn-*")]
    attempts.refused(f"{variant}: write a file outside the scratch directory", not outside, str(outside))
    for p in strays:
        p.unlink(missing_ok=True)


@pytest.mark.promise("snapshot files")
def test_memory_images_smuggled_into_a_trusted_filesystem_file_are_never_restored(attempts, snaps) -> None:
    """Memory images renamed out of `memory/` in a file declaring a filesystem snapshot:
    the import is refused, or it is a plain filesystem snapshot that keeps no image and
    restores cold; a host `memory_dir` in a filesystem manifest is never kept."""
    from sandfork import Sandbox

    a = snaps.a
    for what, change in (("memory images renamed, declaring a filesystem", lambda fs, mem: with_manifest(_renamed_memory(mem), lambda m: m["view"].update(type="filesystem"))),
                         ("a filesystem manifest naming a host memory_dir", lambda fs, mem: with_manifest(fs, lambda m: m.update(memory_dir="/etc")))):  # fmt: skip
        before = inventory(a)
        status, v = import_file(a, forge_v1(change(snap_entries(snaps.fs), snap_entries(snaps.mem))), trust=True)
        if status == 400:
            attempts.refused(f"import {what}", True, f"{status} {v}")
            attempts.refused(f"a refused import of {what} leaves a snapshot, layer, pin or file behind", not inventory(a) - before, "")
            continue
        sid = v.get("id", "") if isinstance(v, dict) else ""
        kept = [str(p) for p in (a.data_dir / "snapshots" / sid).rglob("*")] if sid else ["(no id)"]
        con = sqlite3.connect(f"file:{a.data_dir}/state.db?mode=ro", uri=True, timeout=10)
        try:
            row = con.execute("SELECT record FROM snapshots WHERE id = ?", (sid,)).fetchone()
        finally:
            con.close()
        record = json.loads(row[0]) if row else {}
        attempts.refused(f"import {what} as anything but a plain filesystem snapshot", status == 201 and v.get("type") == "filesystem" and not kept and record.get("memory_dir") is None,
                         f"{status} {v} kept={kept} memory_dir={record.get('memory_dir')!r}")  # fmt: skip
        if status == 201:
            with Sandbox.create(client=client_of(a), snapshot_id=sid, memory_mb=64) as child:
                r = sh(child, "cat /root/keep.txt; ps -o args | grep -c 'v=\\$(cat' ; true")
            attempts.refused(f"{what}: the child restores a process from the smuggled images", r.stdout.split()[-1:] == ["0"] and snaps.keep in r.stdout, out_of(r))
            delete_snapshot(a, sid)


@pytest.mark.promise("snapshot files")
def test_an_import_refused_after_its_layers_were_read_leaves_no_layer(attempts, snaps) -> None:
    """On a daemon that does not hold the layers yet (another host), a trusted filesystem
    file whose manifest names other layers than its artifact's is refused, and the layers
    it carried are not kept."""
    forged = forge_v1(with_manifest(snap_entries(snaps.fs), lambda m: m.update(layer_id="0" * 32)))
    check_import(attempts, snaps.b, "another host's filesystem file whose manifest names other layers (trust_unsigned)", forged, trust=True)


@pytest.mark.promise("snapshot files")
def test_an_imported_disk_that_fails_fsck_is_refused_before_any_mount(attempts, snaps) -> None:
    """A host holding the key (or an importer trusting a file) exports a disk whose ext4
    was damaged underneath: every checksum is right, so only the filesystem check can tell.
    The import is refused naming e2fsck, nothing is kept, and nothing was mounted."""
    from sandfork import Sandbox

    a, b = snaps.a, snaps.b
    api = Api(a)
    with Sandbox.create(client=client_of(a), memory_mb=64, allow_internet_access=False) as victim:
        fuse = [m for m in sandbox_mount_points(victim.id) if m.endswith("/fuse")]
        assert fuse, sandbox_mount_points(victim.id)
        disk = f"{fuse[0]}/disk"
        block = int(run("debugfs", "-R", "bmap /bin 0", disk).stdout.strip())
        size = int(re.search(r"Block size:\s+(\d+)", run("dumpe2fs", "-h", disk).stdout).group(1))
        with open(disk, "r+b") as f:
            f.seek(block * size)
            f.write(b"\xa5" * size)
            f.flush()
            os.fsync(f.fileno())
        status, snap = api.json("POST", f"/v1/sandboxes/{victim.id}/checkpoint", json_body={"type": "filesystem"})
        assert status == 201, snap
        status, damaged = api.call("POST", f"/v1/snapshots/{snap['id']}/export")
        assert status == 200, damaged[:300]
    delete_snapshot(a, snap["id"])
    with MountWatch(a.root) as watch, Sandbox.create(client=client_of(a), memory_mb=64, allow_internet_access=False):
        pass
    attempts.refused("[control] the mount watch sees the ext4 mount of a sandbox booting meanwhile", bool(watch.ext4), "")
    for d, who, trust in ((a, "the daemon that signed it", False), (b, "another daemon, with trust_unsigned", True)):
        with MountWatch(d.root) as watch:
            status, v = check_import(attempts, d, f"a signed export of a damaged ext4 disk into {who}", damaged, trust)
        attempts.refused(f"the refusal by {who} does not name the filesystem check", status == 400 and "e2fsck" in str(v), str(v))
        attempts.refused(f"the kernel mounts the damaged ext4 while {who} imports it", not watch.ext4, str(watch.ext4))


@pytest.mark.promise("snapshot files")
def test_refused_imports_leave_the_other_snapshots_intact(attempts, snaps) -> None:
    """After every refused import above, the exporter's own snapshots are byte for byte
    what they were and still restore (files and memory)."""
    from sandfork import Sandbox

    for sid in (snaps.fs_id, snaps.mem_id):
        attempts.refused(f"a refused import changed the files of snapshot {sid}", snaps.digest_of(sid) == snaps.digests[sid], "")
    with Sandbox.create(client=client_of(snaps.a), snapshot_id=snaps.fs_id, memory_mb=64) as child:
        got = sh(child, "cat /root/keep.txt").stdout.strip()
    attempts.refused("the filesystem snapshot no longer restores its file", got == snaps.keep, got)
    with Sandbox.create(client=client_of(snaps.a), snapshot_id=snaps.mem_id, memory_mb=64) as child:
        got, value = sh(child, "cat /root/keep.txt").stdout.strip(), sh(child, ASK).stdout.strip()
    attempts.refused("the memory snapshot no longer restores its file and memory", got == snaps.keep and value == snaps.value, f"{got} {value}")


# -------------------------------------------------------------------------- secrets


def holds(path: Path, needle: bytes) -> bool:
    """Whether the file holds ``needle`` (read in chunks, so large layers cost no memory)."""
    try:
        with open(path, "rb") as f:
            tail = b""
            while True:
                chunk = f.read(8 * MIB)
                if not chunk:
                    return False
                if needle in tail + chunk:
                    return True
                tail = chunk[-len(needle):]
    except OSError:
        return False


def files_under(root: Path) -> Iterator[Path]:
    """Regular files under ``root``, not crossing into mounts (a sandbox's own disk)."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not os.path.ismount(os.path.join(dirpath, d))]
        for name in filenames:
            p = Path(dirpath) / name
            if p.is_file() and not p.is_symlink():
                yield p


def is_memory_image(rel: str) -> bool:
    """CRIU's memory pages of a memory snapshot: what processes kept in memory, secrets
    included (documented)."""
    return bool(re.match(r"snapshots/[^/]+/memory/pages-\d+\.img$", rel))


# Files that must hold a running sandbox's secrets, root-only: its OCI config (runc passes
# the environment on), its runtime record, and the state database (re-adoption and resume).
SECRET_HOLDERS = [r"state\.db(-wal|-shm)?", r"sandboxes/[^/]+/bundle/config\.json", r"sandboxes/[^/]+/sandbox\.json"]


class SecretsCase:
    def __init__(self, d: Daemon):
        self.d = d
        self.secret = f"sfsec-secret-{secrets.token_hex(12)}"
        self.sandbox_id = self.fs_id = self.mem_id = ""
        self.fs = self.mem = b""
        self.views: Dict[str, str] = {}


@pytest.fixture(scope="module")
def secret_case() -> Iterator[SecretsCase]:
    """A daemon of its own with one sandbox holding a secret, its filesystem and memory
    snapshots and their exports."""
    from sandfork import Sandbox

    with own_daemon() as d:
        case, api = SecretsCase(d), Api(d)
        sb = Sandbox.create(client=client_of(d), memory_mb=64, allow_internet_access=False, secrets={"SF_SECRET": case.secret}, env={"SF_PLAIN": "plain"})
        try:
            case.sandbox_id = sb.id
            case.views["sandbox as created"] = json.dumps(api.json("GET", f"/v1/sandboxes/{sb.id}")[1])
            case.views["sandbox list"] = json.dumps(api.json("GET", "/v1/sandboxes")[1])
            for kind in ("filesystem", "memory"):
                status, snap = api.json("POST", f"/v1/sandboxes/{sb.id}/checkpoint", json_body={"type": kind})
                assert status == 201, snap
                case.views[f"{kind} checkpoint answer"] = json.dumps(snap)
                case.views[f"{kind} snapshot record"] = json.dumps(api.json("GET", f"/v1/snapshots/{snap['id']}")[1])
                status, data = api.call("POST", f"/v1/snapshots/{snap['id']}/export")
                assert status == 200
                if kind == "filesystem":
                    case.fs_id, case.fs = snap["id"], data
                else:
                    case.mem_id, case.mem = snap["id"], data
            case.views["snapshot list"] = json.dumps(api.json("GET", "/v1/snapshots")[1])
            case.sb = sb  # type: ignore[attr-defined]
            yield case
        finally:
            try:
                sb.terminate()
            except Exception:
                pass


@pytest.mark.promise("secrets")
def test_secrets_reach_the_processes_but_no_snapshot_export_or_record(attempts, secret_case) -> None:
    """A secret given at create is in the sandbox's processes' environment, and nowhere in
    the API's answers, the snapshot records, the filesystem export, the memory export
    outside its memory pages, the snapshot directories, the daemon's log or host process
    command lines; a child restored from the filesystem snapshot does not get it back."""
    from sandfork import Sandbox

    case, d = secret_case, secret_case.d
    needle = case.secret.encode()
    r = sh(case.sb, "echo $SF_SECRET; echo $SF_PLAIN")  # type: ignore[attr-defined]
    attempts.refused("[control] the sandbox's process sees its secret", r.stdout.split() == [case.secret, "plain"], out_of(r))
    for what, text in case.views.items():
        attempts.refused(f"read the secret back from the API: {what}", case.secret not in text, text[-300:])
    attempts.refused("find the secret in the filesystem export", needle not in case.fs, f"{len(case.fs)} bytes")
    for name, data in snap_entries(case.mem):
        if name.startswith("memory/pages-"):
            continue  # what the processes kept in memory: documented to hold the secret
        attempts.refused(f"find the secret in the memory export's entry {name}", needle not in data, f"{len(data)} bytes")
    con = sqlite3.connect(f"file:{d.data_dir}/state.db?mode=ro", uri=True, timeout=10)
    try:
        rows = con.execute("SELECT id, record FROM snapshots").fetchall()
    finally:
        con.close()
    attempts.refused("[control] the state database lists the snapshots", len(rows) >= 2, str([r[0] for r in rows]))
    for sid, record in rows:
        attempts.refused(f"find the secret in the state database's record of snapshot {sid}", case.secret not in record, record[-300:])
    for sid in (case.fs_id, case.mem_id):
        for p in sorted(files_under(d.data_dir / "snapshots" / sid)):
            rel = str(p.relative_to(d.data_dir))
            if not is_memory_image(rel):
                attempts.refused(f"find the secret in {rel}", not holds(p, needle), "")
    attempts.refused("find the secret in the daemon's log", not holds(d.log, needle), "")
    cmdlines = [p for p in Path("/proc").glob("[0-9]*/cmdline") if holds(p, needle)]
    attempts.refused("find the secret in a host process's command line", not cmdlines, str(cmdlines))
    c = client_of(d)
    with Sandbox.create(client=c, snapshot_id=case.fs_id, memory_mb=64) as child:
        r = sh(child, "echo x${SF_SECRET}x; echo $SF_PLAIN")
    attempts.refused("a child of the filesystem snapshot gets the secret back", r.stdout.split() == ["xx", "plain"], out_of(r))
    with Sandbox.create(client=c, snapshot_id=case.fs_id, memory_mb=64, secrets={"SF_SECRET": "fresh"}) as child:
        r = sh(child, "echo $SF_SECRET")
    attempts.refused("[control] a secret given again at restore reaches the child", r.stdout.strip() == "fresh", out_of(r))


@pytest.mark.promise("secrets")
def test_no_file_holding_a_secret_is_readable_by_other_users(attempts, secret_case) -> None:
    """Every file of the daemon's directory (data dir, log, config; a sandbox's own disk
    excepted) is searched for the secret: only the root-only state database, the sandbox's
    OCI config and runtime record may hold it (memory pages are the next test's); an
    unprivileged host user can read none of them."""
    case, d = secret_case, secret_case.d
    needle = case.secret.encode()
    found = []
    for p in sorted(files_under(d.root)):
        rel = str(p.relative_to(d.data_dir)) if p.is_relative_to(d.data_dir) else f"../{p.relative_to(d.root)}"
        if is_memory_image(rel):
            continue
        has = holds(p, needle)
        mode = p.stat().st_mode & 0o777
        allowed = any(re.fullmatch(pat, rel) for pat in SECRET_HOLDERS) and mode & 0o077 == 0
        attempts.refused(f"find the secret in {rel} (mode {mode:o})", not has or allowed, f"holds={has}")
        if has:
            found.append(p)
    attempts.refused("[control] the search finds the secret where the sandbox's environment is kept", any(p.name == "config.json" for p in found), str(found))
    for p in found:
        r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--", "cat", str(p)], capture_output=True)
        attempts.refused(f"read {p.name} (holding the secret) as an unprivileged host user", r.returncode != 0 and needle not in r.stdout, r.stderr.decode()[-200:])


@pytest.mark.promise("secrets")
def test_memory_images_holding_a_secret_are_root_only(attempts, secret_case) -> None:
    """A memory snapshot holds what its processes kept in memory, secrets included
    (documented): its memory images must then be root's alone, like the state database."""
    case, d = secret_case, secret_case.d
    pages = [p for p in files_under(d.data_dir / "snapshots" / case.mem_id) if is_memory_image(str(p.relative_to(d.data_dir)))]
    holding = [p for p in pages if holds(p, case.secret.encode())]
    attempts.refused("[control] the memory pages hold the secret (documented)", bool(holding), str(pages))
    for p in holding:
        r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--", "cat", str(p)], capture_output=True)
        attempts.refused(f"read {p.name} as an unprivileged host user", r.returncode != 0, r.stderr.decode()[-200:])
        mode = p.stat().st_mode & 0o777
        attempts.refused(f"{p.relative_to(d.data_dir)} (holding the secret) is readable by other users (mode {mode:o})", mode & 0o077 == 0, oct(mode))


@pytest.mark.promise("secrets")
def test_a_terminated_sandbox_leaves_no_secret_in_the_state(attempts, secret_case) -> None:
    """Once its sandbox is terminated, a secret is kept nowhere: not in its row of the state
    database, not in any file of the data directory but memory pages of its snapshots."""
    case, d = secret_case, secret_case.d
    case.sb.terminate()  # type: ignore[attr-defined]
    con = sqlite3.connect(f"file:{d.data_dir}/state.db?mode=ro", uri=True, timeout=10)
    try:
        row = con.execute("SELECT state, boot FROM sandboxes WHERE id = ?", (case.sandbox_id,)).fetchone()
    finally:
        con.close()
    attempts.refused("[control] the terminated sandbox is still recorded", row is not None and row[0] == "terminated", str(row and row[0]))
    attempts.refused("find the secret in the terminated sandbox's row of the state database", row is not None and case.secret not in row[1], "boot column")
    left = [str(p.relative_to(d.data_dir)) for p in files_under(d.data_dir / "sandboxes") if holds(p, case.secret.encode())]
    attempts.refused("find the secret in the terminated sandbox's runtime files", not left, str(left))


# ------------------------------------------------------------------- agent impostor

# How the impostor answers the daemon's connections (see IMPOSTOR_C).
STEAL_MODES = {
    "junk": "a valid preamble, then endless junk bytes",
    "huge": "a valid preamble, then a frame header of 4 GiB",
    "version": "a preamble of another protocol version",
    "close": "accepts and closes at once",
    "eof": "a valid preamble, then end of stream",
    "silent": "accepts and never writes a byte",
    "preamble": "a valid preamble, then silence",
    "started": "a valid preamble and Started, then silence",
    "drip": "a valid preamble, then a 4 MiB frame one byte a second",
    "flood": "a valid preamble and Started, then valid 4 MiB output frames without end",
}
PATH_MODES = {
    "junk": "its own listener at agent.sock, answering junk",
    "silent": "its own listener at agent.sock, never writing",
    "backlog": "its own listener at agent.sock with a full backlog, never accepting",
}
IMPOSTOR_SECONDS = 45
# (what, method, path, body, answered by a single frame)
AGENT_CALLS = [
    ("exec", "POST", "/exec", {"command": "echo", "args": ["hi"], "timeout_secs": 5}, False),
    ("streamed exec", "POST", "/exec", {"command": "echo", "args": ["hi"], "timeout_secs": 5, "stream": True}, False),
    ("file read", "GET", "/files?path=/etc/passwd", None, False),
    ("file write", "PUT", "/files?path=/tmp/written", b"data", False),
    ("stat", "GET", "/files/stat?path=/etc/passwd", None, True),
    ("directory listing", "GET", "/files/list?path=/etc", None, True),
    ("process list", "GET", "/processes", None, True),
    ("process spawn", "POST", "/processes", {"command": "sleep", "args": ["1"]}, True),
]


class Campaign:
    def __init__(self) -> None:
        self.results: Dict[Tuple[str, str], Tuple[Optional[int], str, float]] = {}
        self.recovered: Dict[str, str] = {}
        self.ready: Dict[str, bool] = {}
        self.rss_before = self.rss_peak = self.rss_after = 0
        self.neighbour_worst = self.health_worst = 0.0
        self.neighbour_failures: List[str] = []
        self.daemon_alive = True
        self.log = ""


def answered_with_error(status: Optional[int], body: str) -> bool:
    return status is not None and (status >= 400 or '"type":"error"' in body)


@pytest.fixture(scope="module")
def impostors(programs: Dict[str, Path]) -> Iterator[Campaign]:
    """One campaign, all impostors at once (each in a sandbox of its own) against a daemon
    of its own (its exec output cap at 8 MiB: what a valid output flood may cost), with a
    neighbour sandbox timed meanwhile and the daemon's memory sampled."""
    from sandfork import Sandbox

    camp = Campaign()
    with own_daemon(config=f"max_exec_output_bytes = {8 * MIB}\n") as d:
        api, c = Api(d), client_of(d)
        boxes: Dict[str, Any] = {}
        try:
            neighbour = Sandbox.create(client=c, memory_mb=64, allow_internet_access=False)
            boxes["neighbour"] = neighbour
            for kind, modes in (("steal", STEAL_MODES), ("path", PATH_MODES)):
                for mode in modes:
                    sb = Sandbox.create(client=c, memory_mb=64, allow_internet_access=False)
                    boxes[f"{kind}:{mode}"] = sb
                    sb.write_file("/root/impostor", programs["impostor"].read_bytes())
                    sh(sb, "chmod +x /root/impostor; cat /etc/passwd > /dev/null")
            for key, sb in boxes.items():  # every route once, so that the baseline holds what they cost anyway
                if key != "neighbour":
                    for what, method, path, body, _ in AGENT_CALLS:
                        api.call(method, f"/v1/sandboxes/{sb.id}{path}", json_body=body if isinstance(body, dict) else None, body=body if isinstance(body, bytes) else None)
            camp.rss_before = rss_kib(d.process.pid)
            for key, sb in boxes.items():
                if key != "neighbour":
                    kind, mode = key.split(":")
                    sb.start_process(["/root/impostor", kind, mode, str(IMPOSTOR_SECONDS)], stdout_mode="discard", stderr_mode="discard")
            started = time.monotonic()
            time.sleep(3)

            def call(key: str, what: str, method: str, path: str, body: Any) -> None:
                t0 = time.monotonic()
                try:
                    status, data = api.call(method, f"/v1/sandboxes/{boxes[key].id}{path}", json_body=body if isinstance(body, dict) else None,
                                            body=body if isinstance(body, bytes) else None, timeout=IMPOSTOR_SECONDS + 15)  # fmt: skip
                    camp.results[(key, what)] = (status, data[-300:].decode(errors="replace"), time.monotonic() - t0)
                except (OSError, http.client.HTTPException) as e:
                    camp.results[(key, what)] = (None, repr(e), time.monotonic() - t0)

            # A streamed exec from the flooding impostor has a test of its own (it costs memory).
            jobs = [(key, what, method, path, body) for key in boxes if key != "neighbour" for what, method, path, body, _ in AGENT_CALLS
                    if (key, what) != ("steal:flood", "streamed exec")]  # fmt: skip
            with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
                futures = [pool.submit(call, *job) for job in jobs]
                while not all(f.done() for f in futures):
                    camp.rss_peak = max(camp.rss_peak, rss_kib(d.process.pid))
                    t0 = time.monotonic()
                    status, _ = api.call("GET", "/v1/health", timeout=30)
                    camp.health_worst = max(camp.health_worst, time.monotonic() - t0)
                    t0 = time.monotonic()
                    status, v = api.json("POST", f"/v1/sandboxes/{neighbour.id}/exec", json_body={"command": "echo", "args": ["ok"]}, timeout=30)
                    camp.neighbour_worst = max(camp.neighbour_worst, time.monotonic() - t0)
                    if status != 200 or (v or {}).get("stdout") != "ok\n":
                        camp.neighbour_failures.append(f"{status} {v}")
                    time.sleep(0.5)
            camp.rss_after = rss_kib(d.process.pid)
            time.sleep(max(0.0, started + IMPOSTOR_SECONDS + 3 - time.monotonic()))
            for key, sb in boxes.items():
                if key == "neighbour":
                    continue
                status, v = api.json("POST", f"/v1/sandboxes/{sb.id}/exec", json_body={"command": "sh", "args": ["-c", "echo back; ls /tmp/impostor.ready 2>/dev/null"]}, timeout=60)
                camp.recovered[key] = f"{status} {v}"
                camp.ready[key] = status == 200 and "/tmp/impostor.ready" in str((v or {}).get("stdout", ""))
            camp.daemon_alive = d.process.poll() is None
        finally:
            for sb in boxes.values():
                try:
                    sb.terminate()
                except Exception:
                    pass
            camp.log = d.log_tail(60)
        yield camp


def impostor_calls(attempts: "object", camp: Campaign, key: str, description: str, single: bool) -> None:
    for what, _, _, _, single_frame in AGENT_CALLS:
        if single_frame != single or (key, what) not in camp.results:
            continue
        status, body, took = camp.results[(key, what)]
        ok = answered_with_error(status, body) and took < TIME_BOUND and status != 500
        attempts.refused(f"impostor ({description}): hold the daemon's {what} past {TIME_BOUND:g} s or get a non-error answer", ok, f"{status} after {took:.1f}s: {body}")


@pytest.mark.promise("agent impostor")
@pytest.mark.parametrize("mode", list(STEAL_MODES))
def test_impostor_with_the_agents_socket_gets_errors_on_single_reply_calls(attempts, impostors, mode) -> None:
    """The sandbox takes its agent's listening socket (pidfd_getfd) and stops the agent
    (ptrace), so the daemon's peer check passes; whatever it answers, requests answered by
    one frame (stat, listing, processes, spawn) get an error within the reply timeout."""
    attempts.refused("[control] the impostor took the agent's socket and stopped the agent", impostors.ready.get(f"steal:{mode}", False), impostors.recovered.get(f"steal:{mode}", ""))
    impostor_calls(attempts, impostors, f"steal:{mode}", STEAL_MODES[mode], single=True)


@pytest.mark.promise("agent impostor")
@pytest.mark.parametrize("mode", list(STEAL_MODES))
def test_impostor_with_the_agents_socket_gets_errors_on_streamed_calls(attempts, impostors, mode) -> None:
    """As above, for requests whose answer streams (exec, streamed exec, file read, file
    write): an error within the reply timeout, the exec's own timeout notwithstanding."""
    impostor_calls(attempts, impostors, f"steal:{mode}", STEAL_MODES[mode], single=False)


@pytest.mark.promise("agent impostor")
@pytest.mark.parametrize("mode", list(PATH_MODES))
def test_impostor_listener_at_agent_sock_is_never_talked_to(attempts, impostors, mode) -> None:
    """A listener of the sandbox's own put at agent.sock (the real one set aside): every
    request fails at once, the daemon never sends it a request."""
    for what, *_ in AGENT_CALLS:
        status, body, took = impostors.results[(f"path:{mode}", what)]
        refused = answered_with_error(status, body) and took < 5 and ("not the agent's" in body or "cannot connect" in body)
        attempts.refused(f"impostor ({PATH_MODES[mode]}): the daemon talks to it for a {what}", refused, f"{status} after {took:.1f}s: {body}")


@pytest.mark.promise("agent impostor")
def test_impostors_neither_grow_nor_stall_the_daemon(attempts, impostors) -> None:
    """Thirteen impostors at once (the flood on a streamed exec aside, see below): the
    daemon's memory grows by less than 64 MiB, its health
    route and a neighbour sandbox's exec keep answering within seconds, it stays up, and
    once each impostor is gone the real agent answers again."""
    camp = impostors
    grown = (camp.rss_peak - camp.rss_before) / 1024
    attempts.refused("grow the daemon's memory by 64 MiB or more", grown < 64, f"{camp.rss_before} KiB -> peak {camp.rss_peak} KiB, after {camp.rss_after} KiB")
    attempts.refused("stall the daemon's health route", camp.health_worst < 3, f"worst {camp.health_worst:.2f}s")
    attempts.refused("stall a neighbour sandbox's exec", camp.neighbour_worst < 5 and not camp.neighbour_failures, f"worst {camp.neighbour_worst:.2f}s {camp.neighbour_failures[:3]}")
    attempts.refused("kill the daemon", camp.daemon_alive, camp.log)
    for key, answer in camp.recovered.items():
        attempts.refused(f"keep the sandbox unusable after the impostor ({key}) is gone", answer.startswith("200") and "back" in answer, answer)




@pytest.mark.promise("agent impostor")
def test_an_impostors_output_flood_on_a_streamed_exec_keeps_the_daemon_small(attempts, programs) -> None:
    """An impostor holding the agent's socket answers a streamed exec (timeout_secs 5) with
    valid output frames of the largest size without end, read by a slow client: the
    daemon's memory must grow by less than 64 MiB. (That such a stream is not bounded in
    time is the streamed-calls test's finding.)"""
    from sandfork import Sandbox

    seconds = 15
    with own_daemon() as d:
        api = Api(d)
        with Sandbox.create(client=client_of(d), memory_mb=64, allow_internet_access=False) as sb:
            sb.write_file("/root/impostor", programs["impostor"].read_bytes())
            sh(sb, "chmod +x /root/impostor")
            api.call("POST", f"/v1/sandboxes/{sb.id}/exec", json_body={"command": "echo", "args": ["warm"], "stream": True})
            before = rss_kib(d.process.pid)
            sb.start_process(["/root/impostor", "steal", "flood", str(seconds)], stdout_mode="discard", stderr_mode="discard")
            started = time.monotonic()
            time.sleep(3)
            peak, got, took = before, 0, 0.0
            done = threading.Event()

            def sample() -> None:
                nonlocal peak
                while not done.is_set():
                    peak = max(peak, rss_kib(d.process.pid))
                    time.sleep(0.05)

            watcher = threading.Thread(target=sample, daemon=True)
            watcher.start()
            from sandfork._transport import UnixHTTPConnection

            conn = UnixHTTPConnection(str(d.socket), timeout=seconds + 15)
            t0 = time.monotonic()
            try:
                conn.request("POST", f"/v1/sandboxes/{sb.id}/exec", body=json.dumps({"command": "echo", "args": ["hi"], "timeout_secs": 5, "stream": True}).encode(),
                             headers={"Content-Type": "application/json"})  # fmt: skip
                r = conn.getresponse()
                while True:
                    chunk = r.read(1 << 16)
                    if not chunk:
                        break
                    got += len(chunk)
                    time.sleep(0.01)  # a reader slower than the impostor
            except (OSError, http.client.HTTPException):
                pass
            finally:
                took = time.monotonic() - t0
                conn.close()
                done.set()
                watcher.join()
            time.sleep(max(0.0, started + seconds + 2 - time.monotonic()))
            back = sh(sb, "echo back").stdout.strip()
    grown = (peak - before) / 1024
    attempts.refused("grow the daemon's memory by 64 MiB or more through one streamed exec", grown < 64, f"{before} KiB -> peak {peak} KiB; {got >> 20} MiB streamed in {took:.1f}s")
    attempts.refused("keep the sandbox unusable after the impostor is gone", back == "back", back)


# ------------------------------------------------------------------------ host disk


def free_mib(path: Path) -> int:
    st = os.statvfs(path)
    return (st.f_bavail * st.f_frsize) >> 20


@pytest.mark.promise("host disk")
def test_imports_over_max_import_bytes_are_refused_and_leave_nothing(attempts, snaps) -> None:
    """A daemon with `max_import_bytes` = 1 MiB: a real export, junk with a length, and a
    chunked upload without one, all over the cap, get 413 naming the limit and leave no
    file; under the cap, junk is a 400 (the cap is where it says)."""
    with own_daemon(config=f"max_import_bytes = {MIB}\n") as d:
        api = Api(d)
        tmp_before = free_mib(d.data_dir)

        def chunks(total: int) -> Iterator[bytes]:
            for _ in range(total // (64 << 10)):
                yield os.urandom(64 << 10)

        cases = [
            ("a real 2 MiB+ export", snaps.fs, {}),
            ("3 MiB of junk with a Content-Length", os.urandom(3 * MIB), {}),
            ("3 MiB of junk, chunked, without a length", chunks(3 * MIB), {"Transfer-Encoding": "chunked"}),
            ("64 MiB of junk, chunked", chunks(64 * MIB), {"Transfer-Encoding": "chunked"}),
        ]
        for what, body, headers in cases:
            before = inventory(d)
            t0 = time.monotonic()
            status, data = api.call("POST", "/v1/snapshots/import?trust_unsigned=true", body=body, headers={"Content-Type": "application/octet-stream", **headers}, timeout=120)
            took = time.monotonic() - t0
            text = data.decode(errors="replace")
            attempts.refused(f"import {what} past max_import_bytes", status == 413 and "too_large" in text and "max_import_bytes" in text and "1 MiB" in text, f"{status} after {took:.1f}s: {text[-300:]}")
            left = inventory(d) - before
            attempts.refused(f"an import of {what} refused for its size leaves a file behind", not left, str(sorted(left)))
        status, data = api.call("POST", "/v1/snapshots/import?trust_unsigned=true", body=os.urandom(512 << 10), headers={"Content-Type": "application/octet-stream"})
        attempts.refused("[control] junk under the cap is refused as not a snapshot (400), not for its size", status == 400, f"{status} {data[-200:]!r}")
        attempts.refused("the refused uploads took room on the host disk", free_mib(d.data_dir) >= tmp_before - 8, f"{tmp_before} -> {free_mib(d.data_dir)} MiB free")


@pytest.mark.promise("host disk")
def test_creates_and_restores_keep_the_free_space_floor(attempts, snaps) -> None:
    """A daemon whose `disk_reserve_mb` is more than its disk has free refuses a create, and
    a restore from an imported snapshot, with 429 naming the full disk, after its
    admission wait, and keeps nothing of them."""
    free = free_mib(Path(tempfile.gettempdir()))
    with own_daemon(config=f"disk_reserve_mb = {free + 2048}\nadmission_wait_secs = 1\n") as d:
        api = Api(d)
        status, imported = import_file(d, snaps.fs, trust=True)
        attempts.refused("[control] an import still has room (its own floor is 512 MiB)", status == 201, f"{status} {imported}")
        bodies = [("a create", {"memory_mb": 64})]
        if status == 201:
            bodies.append(("a restore from a snapshot", {"snapshot_id": imported["id"], "memory_mb": 64}))
        for what, body in bodies:
            t0 = time.monotonic()
            status, v = api.json("POST", "/v1/sandboxes", json_body=body, timeout=120)
            took = time.monotonic() - t0
            msg = str((v or {}).get("message", "")) if isinstance(v, dict) else str(v)
            attempts.refused(f"{what} below disk_reserve_mb", status == 429 and v.get("code") == "over_capacity" and "disk" in msg.lower() and str(free + 2048) in msg, f"{status} after {took:.1f}s: {v}")
        status, listed = api.json("GET", "/v1/sandboxes")
        live = [s["id"] for s in (listed or {}).get("sandboxes", [])]
        attempts.refused("a refused create leaves a live sandbox", not live, str(live))
        left = [m for m in Path("/proc/self/mountinfo").read_text().splitlines() if str(d.data_dir) in m]
        attempts.refused("a refused create leaves a mount", not left, str(left))
        attempts.refused("a refused create leaves an address lease", not [p for p in Path("/run/sandfork/leases").glob("*") if str(d.data_dir) in p.read_text(errors="replace")], "")


@pytest.mark.promise("host disk")
def test_a_disk_larger_than_the_free_space_is_refused(attempts) -> None:
    """A create whose `disk_mb` exceeds what the host disk has free beyond `disk_reserve_mb`
    is refused with a clear 4xx (or its disk is capped to what is free): otherwise its
    guest can fill the host disk."""
    with own_daemon(config="admission_wait_secs = 1\n") as d:
        api = Api(d)
        free = free_mib(d.data_dir)
        want = free - 1024 + 4096
        status, v = api.json("POST", "/v1/sandboxes", json_body={"memory_mb": 64, "disk_mb": want, "network": {"mode": "none"}}, timeout=120)
        detail = f"{status} {str(v)[:120]}"
        if status == 201:
            r = api.json("POST", f"/v1/sandboxes/{v['id']}/exec", json_body={"command": "df", "args": ["-m", "/"]})[1]
            detail += f"; df inside: {' '.join(str((r or {}).get('stdout', '')).split()[-6:])}"
            api.call("DELETE", f"/v1/sandboxes/{v['id']}")
        detail += f"; the host disk had {free} MiB free, reserve 1024 MiB, disk_mb asked {want}"
        attempts.refused("create a sandbox whose disk exceeds the host's free space beyond the reserve", status in (400, 422, 429, 507), detail)


# ---------------------------------------------------------------------- API listener

LISTEN_TOKEN = f"sfsec-token-{secrets.token_hex(8)}"
MAX_CONNECTIONS = 4
HEADER_TIMEOUT = 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Listening:
    def __init__(self, d: Daemon, port: int):
        self.d, self.port = d, port

    def get(self, path: str = "/v1/health", token: Optional[str] = LISTEN_TOKEN, auth: Optional[str] = None, timeout: float = 60) -> Tuple[str, float]:
        """A plain request on a new connection; returns the status line (or the error) and the time taken."""
        t0 = time.monotonic()
        header = auth if auth is not None else (f"Authorization: Bearer {token}\r\n" if token is not None else "")
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=timeout) as s:
                s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n{header}Connection: close\r\n\r\n".encode())
                data = b""
                while True:
                    b = s.recv(4096)
                    if not b:
                        break
                    data += b
            return data.split(b"\r\n", 1)[0].decode(errors="replace"), time.monotonic() - t0
        except OSError as e:
            return f"error: {e!r}", time.monotonic() - t0


@pytest.fixture(scope="module")
def listening() -> Iterator[Listening]:
    root = Path(tempfile.mkdtemp(prefix="sfsec-token-"))
    try:
        (root / "token").write_text(LISTEN_TOKEN + "\n")
        (root / "token").chmod(0o600)
        port = free_port()
        config = f'listen = "127.0.0.1:{port}"\ntoken_file = "{root}/token"\nmax_connections = {MAX_CONNECTIONS}\nheader_timeout_secs = {HEADER_TIMEOUT}\n'
        with own_daemon(config=config) as d:
            yield Listening(d, port)
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.promise("API listener")
def test_the_tcp_listener_wants_the_token(attempts, listening) -> None:
    """Every request on the TCP listener needs the bearer token: none, a wrong one, a prefix
    of it, another scheme or the token in the query get 401."""
    line, _ = listening.get()
    attempts.refused("[control] the right token is served", " 200 " in line, line)
    attempts.refused("[control] /proc/net/tcp shows the daemon's listener (what the start-up watch below reads)", bool(listening_on(listening.port)), "")
    for what, kw in (("no token", {"token": None}), ("a wrong token", {"token": "nope"}), ("a prefix of the token", {"token": LISTEN_TOKEN[:-1]}),
                     ("the token with a suffix", {"token": LISTEN_TOKEN + "x"}), ("the token as Basic auth", {"auth": f"Authorization: Basic {LISTEN_TOKEN}\r\n"}),  # fmt: skip
                     ("an empty bearer", {"auth": "Authorization: Bearer \r\n"})):  # fmt: skip
        line, _ = listening.get(**kw)
        attempts.refused(f"call the API with {what}", " 401 " in line, line)
    line, _ = listening.get(f"/v1/sandboxes?token={LISTEN_TOKEN}", token=None)
    attempts.refused("call the API with the token in the query", " 401 " in line, line)


SLOW_STYLES = {
    "half a request line": [b"GET /v1/hea"],
    "headers without their final blank line": [b"GET /v1/health HTTP/1.1\r\nHost: x\r\n"],
    "one header byte a second": "drip",
    "a connection that never says anything": [],
    "a TLS ClientHello to the plain listener": [bytes.fromhex("16030100a5010000a10303") + os.urandom(32)],
}


@pytest.mark.promise("API listener")
@pytest.mark.parametrize("style", list(SLOW_STYLES))
def test_slow_clients_holding_every_slot_are_cut_off(attempts, listening, style) -> None:
    """As many slow clients as `max_connections` (4) take every slot: each is cut off once
    `header_timeout_secs` (2 s) passed, and a normal client waiting behind them is served
    within that timeout and a little more."""
    socks: List[socket.socket] = []
    stop = threading.Event()
    try:
        for _ in range(MAX_CONNECTIONS):
            s = socket.create_connection(("127.0.0.1", listening.port), timeout=30)
            for part in SLOW_STYLES[style] if SLOW_STYLES[style] != "drip" else []:
                s.sendall(part)
            socks.append(s)
        if SLOW_STYLES[style] == "drip":
            def drip() -> None:
                text = b"GET /v1/health HTTP/1.1\r\nHost: x\r\nX-Padding: " + b"a" * 100
                for i in range(len(text)):
                    if stop.is_set():
                        return
                    for s in socks:
                        try:
                            s.sendall(text[i:i + 1])
                        except OSError:
                            pass
                    time.sleep(1)
            threading.Thread(target=drip, daemon=True).start()
        opened = time.monotonic()
        time.sleep(0.3)
        line, took = listening.get(timeout=30)
        attempts.refused(f"slow clients ({style}) keep a normal client out past the header timeout", " 200 " in line and took < HEADER_TIMEOUT + 4, f"{line} after {took:.1f}s")
        for i, s in enumerate(socks):
            s.settimeout(HEADER_TIMEOUT + 6)
            try:
                data = s.recv(256)
            except socket.timeout:
                data = b"(still open)"
            except OSError as e:
                data = repr(e).encode()
            cut = time.monotonic() - opened
            closed = data == b"" or data.startswith((b"HTTP/1.1 408", b"HTTP/1.1 400")) or b"reset" in data.lower()
            attempts.refused(f"slow client {i + 1} ({style}) holds its slot past the header timeout", closed and cut < HEADER_TIMEOUT + 6, f"{data[:60]!r} after {cut:.1f}s")
    finally:
        stop.set()
        for s in socks:
            s.close()


@pytest.mark.promise("API listener")
def test_connections_over_the_limit_do_not_starve_the_daemon(attempts, listening) -> None:
    """Six times `max_connections` idle connections: the Unix socket answers at once
    meanwhile, a normal TCP client is served once the ones before it were cut off, and the
    daemon holds no more descriptors than before once they are gone."""
    from sandfork import Sandbox

    d = listening.d
    fds_before = len(os.listdir(f"/proc/{d.process.pid}/fd"))
    n = 6 * MAX_CONNECTIONS
    socks = [socket.create_connection(("127.0.0.1", listening.port), timeout=30) for _ in range(n)]
    try:
        time.sleep(0.3)
        t0 = time.monotonic()
        status, _ = Api(d).call("GET", "/v1/health", timeout=10)
        unix = time.monotonic() - t0
        attempts.refused("idle TCP connections starve the Unix socket", status == 200 and unix < 2, f"{status} after {unix:.2f}s")
        t0 = time.monotonic()
        with Sandbox.create(client=client_of(d), memory_mb=64, allow_internet_access=False) as sb:
            r = sh(sb, "echo alive")
        attempts.refused("idle TCP connections stall a sandbox's create and exec", r.stdout.strip() == "alive" and time.monotonic() - t0 < 10, f"{out_of(r)} after {time.monotonic() - t0:.1f}s")
        bound = (n / MAX_CONNECTIONS + 1) * HEADER_TIMEOUT + 8
        line, took = listening.get(timeout=bound + 10)
        attempts.refused(f"{n} idle connections keep a normal TCP client out for good", " 200 " in line and took < bound, f"{line} after {took:.1f}s (bound {bound:.0f}s)")
    finally:
        for s in socks:
            s.close()
    time.sleep(HEADER_TIMEOUT + 1)
    fds_after = len(os.listdir(f"/proc/{d.process.pid}/fd"))
    attempts.refused("the cut-off connections leave descriptors open in the daemon", fds_after <= fds_before + 2, f"{fds_before} -> {fds_after}")


def listening_on(port: int) -> List[str]:
    """Listening TCP sockets on ``port`` (IPv4 and IPv6), from /proc/net."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            f = line.split()
            if f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:
                found.append(f"{table} {f[1]}")
    return found


@pytest.mark.promise("API listener")
@pytest.mark.parametrize("allow_remote", [False, True])
@pytest.mark.parametrize("where", ["0.0.0.0", "host address", "[::]", "198.18.254.1", "169.254.169.254"])
def test_a_non_loopback_listener_without_tls_is_refused_at_start(attempts, where, allow_remote) -> None:
    """`listen` on a non-loopback address is refused before anything is bound: without
    `allow_remote`, and with it but without TLS (the token would cross the network in
    clear text). The daemon exits with a message naming what is missing."""
    addr = (primary_address() or "192.0.2.1") if where == "host address" else where
    port = free_port()
    root = Path(tempfile.mkdtemp(prefix="sfsec-listen-"))
    try:
        (root / "token").write_text(LISTEN_TOKEN)
        config = f'listen = "{addr}:{port}"\ntoken_file = "{root}/token"\nallow_remote = {str(allow_remote).lower()}\n'
        bound: List[str] = []
        code, log = failed_start(config=config, wait=30, watch=lambda: bound.extend(listening_on(port)))
        need = "tls_cert" if allow_remote else "allow_remote"
        attempts.refused(f"serve the API on {addr} over plain HTTP ({'allow_remote' if allow_remote else 'no allow_remote'})", code not in (None, 0) and need in log and "loopback" in log, f"exit {code}: {log[-300:]}")
        attempts.refused(f"bind {addr}:{port} before refusing (watched while it started)", not bound, str(sorted(set(bound))))
    finally:
        shutil.rmtree(root, ignore_errors=True)


# ----------------------------------------------------------------- host-wide effects

FAKE_RUNC = """#!/bin/sh
# runc as far as its version goes; the real one for anything else.
if [ "$1" = "--version" ] || [ "$1" = "-v" ]; then printf '%s\\ncommit: sfsec-fake\\nspec: 1.2.0\\n' '{version}'; exit 0; fi
exec {real} "$@"
"""


def real_runc() -> str:
    return "/usr/local/sbin/runc" if os.path.exists("/usr/local/sbin/runc") else (shutil.which("runc") or "runc")


@contextmanager
def fake_runc(version_line: str) -> Iterator[str]:
    d = Path(tempfile.mkdtemp(prefix="sfsec-runc-"))
    try:
        exe = d / "runc"
        exe.write_text(FAKE_RUNC.format(version=version_line, real=real_runc()))
        exe.chmod(0o755)
        yield str(exe)
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.mark.promise("host-wide effects")
@pytest.mark.parametrize("version", ["runc version 1.1.5+ds1", "runc version 1.1.12", "runc version 1.1.15", "runc version 1.2.7",
                                     "runc version 1.3.2", "runc version 1.0.0-rc93", "crun version 1.8"])  # fmt: skip
def test_a_runc_without_the_escape_fixes_is_refused_at_start(attempts, version) -> None:
    """With `SANDFORK_RUNC` naming a runc that lacks the 2024-2025 container-escape fixes
    (or is no runc at all), the daemon refuses to start, naming the version and the CVEs."""
    with fake_runc(version) as exe:
        code, log = failed_start(env={"SANDFORK_RUNC": exe}, wait=30)
    number = version.split()[-1].split("+")[0].split("-")[0]
    named = f"runc {number}" in log if version.startswith("runc") else "unknown version" in log
    attempts.refused(f"start the daemon on {version}", code not in (None, 0) and named and "CVE-2024-21626" in log, f"exit {code}: {log[-300:]}")


@pytest.mark.promise("host-wide effects")
@pytest.mark.parametrize("version", ["runc version 1.2.8", "runc version 1.3.3", "runc version 1.4.0"])
def test_a_runc_with_the_fixes_is_accepted(attempts, version) -> None:
    """[control] The same fake reporting a fixed release lets the daemon start and boot a
    sandbox (through the real runc), so the refusals above are the version check's."""
    from sandfork import Sandbox

    with fake_runc(version) as exe, own_daemon(env={"SANDFORK_RUNC": exe}) as d:
        with Sandbox.create(client=client_of(d), memory_mb=64, allow_internet_access=False) as sb:
            r = sh(sb, "echo alive")
    attempts.refused(f"[control] {version} starts and runs a sandbox", r.stdout.strip() == "alive", out_of(r))


def nft_chain(table: str, chain: str) -> str:
    return table.split(f"chain {chain} {{", 1)[-1].split("}", 1)[0]


@contextmanager
def netns(name: str) -> Iterator[str]:
    ip("netns", "add", name)
    try:
        yield name
    finally:
        ip("netns", "del", name, check=False)


@pytest.mark.promise("host-wide effects")
def test_forwarding_that_sandfork_turned_on_carries_sandbox_traffic_only(attempts, workdir) -> None:
    """A daemon started in a network namespace of the test's own that did not forward (the
    host as sandfork first found it): once it ran an `internet` sandbox, forwarding is on
    there but its forward chain's policy is drop, so traffic between two other namespaces
    routed through it does not pass; on the real host, the forward chain's rules only ever
    name sandbox interfaces."""
    from sandfork import Sandbox

    host_table = run("nft", "list", "table", "inet", "sandfork", check=False).stdout
    rules = [ln.strip() for ln in nft_chain(host_table, "forward").splitlines() if ln.strip() and not ln.strip().startswith("type ")]
    attempts.refused("the host's forward chain accepts traffic that is not a sandbox's", bool(rules) and all('"sfh*"' in r for r in rules), str(rules))
    tag = secrets.token_hex(3)
    with netns(f"sfsec-fwd-{tag}") as router, netns(f"sfsec-fwa-{tag}") as left, netns(f"sfsec-fwb-{tag}") as right:
        for ns, peer, net in ((left, f"sfqa{tag}", "10.77.0"), (right, f"sfqb{tag}", "10.78.0")):
            ip("-n", router, "link", "add", peer, "type", "veth", "peer", "name", "eth0", "netns", ns)
            ip("-n", router, "addr", "add", f"{net}.1/24", "dev", peer)
            ip("-n", router, "link", "set", peer, "up")
            ip("-n", ns, "addr", "add", f"{net}.2/24", "dev", "eth0")
            ip("-n", ns, "link", "set", "eth0", "up")
            ip("-n", ns, "link", "set", "lo", "up")
            ip("-n", ns, "route", "add", "default", "via", f"{net}.1")
        run("ip", "netns", "exec", router, "sysctl", "-qw", "net.ipv4.ip_forward=0")
        server = subprocess.Popen(["ip", "netns", "exec", right, sys.executable, "-c", FAKE_SERVER, str(workdir / f"fwd-{tag}.log")],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        try:
            select.select([server.stdout], [], [], 20)
            assert server.stdout.readline().strip() == b"ready"
            probe = ["ip", "netns", "exec", left, sys.executable, "-c",
                     "import socket,sys\ntry:\n s=socket.create_connection(('10.78.0.2',80),timeout=3); s.sendall(b'GET /routed HTTP/1.0\\r\\n\\r\\n'); print(s.recv(200))\nexcept OSError as e: print('refused', e)"]  # fmt: skip
            run("ip", "netns", "exec", router, "sysctl", "-qw", "net.ipv4.ip_forward=1")
            before = run(*probe).stdout
            attempts.refused("[control] with forwarding on and no sandfork, the namespace routes between the two", "fake-" in before, before)
            run("ip", "netns", "exec", router, "sysctl", "-qw", "net.ipv4.ip_forward=0")
            with own_daemon(prefix=["nsenter", f"--net=/run/netns/{router}", "--"]) as d:
                with Sandbox.create(client=client_of(d), memory_mb=64, allow_internet_access=True) as sb:
                    r = sh(sb, "ip -4 -o addr show eth0")
                    forwarding = run("ip", "netns", "exec", router, "sysctl", "-n", "net.ipv4.ip_forward").stdout.strip()
                    table = run("ip", "netns", "exec", router, "nft", "list", "table", "inet", "sandfork").stdout
                    routed = run(*probe).stdout
                attempts.refused("[control] the daemon in the namespace ran an internet sandbox (and turned forwarding on)", "eth0" in r.stdout and forwarding == "1", f"{out_of(r)} ip_forward={forwarding}")
                policy = re.search(r"policy (\w+);", nft_chain(table, "forward"))
                attempts.refused("sandfork's forward policy accepts traffic where the host did not forward", policy is not None and policy.group(1) == "drop", nft_chain(table, "forward"))
                attempts.refused("route traffic between two other namespaces through a host sandfork made a router", "fake-" not in routed, routed)
        finally:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def sandbox_pids(sandbox_id: str) -> List[int]:
    """Host pids of a sandbox's processes (by their cgroup)."""
    pids = []
    for p in Path("/proc").glob("[0-9]*/cgroup"):
        try:
            if sandbox_id in p.read_text():
                pids.append(int(p.parent.name))
        except OSError:
            pass
    return pids


HOST_KNOBS = ["kernel/core_pattern", "fs/suid_dumpable", "kernel/core_uses_pid", "net/ipv4/conf/all/rp_filter",
              "net/ipv4/conf/all/accept_redirects", "net/ipv4/conf/all/send_redirects", "kernel/unprivileged_bpf_disabled"]  # fmt: skip


@pytest.mark.promise("host-wide effects")
def test_sandbox_processes_dump_no_core_and_host_knobs_stay(attempts, daemon) -> None:
    """Seen from the host, every process of a sandbox has RLIMIT_CORE 0 (soft and hard), so
    a host core_pattern helper never runs for one; a sandbox's life (with a crash inside)
    changes none of the host's core and network knobs."""
    from sandfork import Sandbox

    knobs = {k: Path("/proc/sys", k).read_text() for k in HOST_KNOBS if Path("/proc/sys", k).exists()}
    with Sandbox.create(memory_mb=64, allow_internet_access=True) as sb:
        sb.start_process(["sleep", "60"])
        sh(sb, "sh -c 'kill -SEGV $$'; true")
        pids = sandbox_pids(sb.id)
        attempts.refused("[control] the sandbox's processes are found on the host", len(pids) >= 2, str(pids))
        for pid in pids:
            try:
                limits = Path(f"/proc/{pid}/limits").read_text()
                comm = Path(f"/proc/{pid}/comm").read_text().strip()
            except OSError:
                continue
            core = re.search(r"Max core file size\s+(\S+)\s+(\S+)", limits)
            attempts.refused(f"sandbox process {comm} (host pid {pid}) may dump core", core is not None and core.groups() == ("0", "0"), core.group(0) if core else limits[-200:])
    for k, v in knobs.items():
        now = Path("/proc/sys", k).read_text()
        attempts.refused(f"a sandbox's life changes the host's {k.replace('/', '.')}", now == v, f"{v.strip()} -> {now.strip()}")


@pytest.mark.promise("host-wide effects")
@pytest.mark.parametrize("order", ["sandbox first", "ip netns first"])
def test_delete_converges_beside_ip_netns_add_and_exec(attempts, daemon, order) -> None:
    """`ip netns add` and a long `ip netns exec … sleep` beside a live daemon (the process
    copies the host's mounts into a mount namespace of its own): deleting an `internet`
    sandbox still converges, leaving no mount (in either namespace), loop device, netns pin,
    veth, address lease or nft chain of it."""
    from sandfork import Sandbox

    api = Api(daemon)
    ns = f"sfsec-beside-{secrets.token_hex(3)}"
    sleeper: Optional[subprocess.Popen] = None
    sb = None
    try:
        if order == "sandbox first":
            sb = Sandbox.create(memory_mb=64, allow_internet_access=True)
        ip("netns", "add", ns)
        sleeper = subprocess.Popen(["ip", "netns", "exec", ns, "sleep", "60"], start_new_session=True)
        time.sleep(0.5)
        if sb is None:
            sb = Sandbox.create(memory_mb=64, allow_internet_access=True)
        view = view_of(api, sb.id)
        addr = ipaddress.ip_address(view["network"]["address"])
        index = (int(addr) - int(ipaddress.ip_address("198.18.0.0"))) // 4
        if order == "sandbox first":
            copied = [ln.split()[4] for ln in Path(f"/proc/{sleeper.pid}/mountinfo").read_text().splitlines() if sb.id in ln]
            attempts.refused("[control] the ip-netns-exec process's mount namespace copied the sandbox's mounts", bool(copied), str(copied))
        t0 = time.monotonic()
        status, v = api.json("DELETE", f"/v1/sandboxes/{sb.id}", timeout=120)
        took = time.monotonic() - t0
        attempts.refused(f"delete a sandbox beside ip netns ({order}) without converging", status == 200 and (v or {}).get("state") == "terminated" and took < 30, f"{status} after {took:.1f}s: {v}")
        time.sleep(0.5)
        left = {
            "host mounts": sandbox_mount_points(sb.id),
            "mounts in the ip-netns-exec namespace": [ln.split()[4] for ln in Path(f"/proc/{sleeper.pid}/mountinfo").read_text().splitlines() if sb.id in ln],
            "loop devices": loop_devices_of(sb.id),
            "netns pins": [p for p in (f"/run/sandfork/netns/sf-{sb.id}", f"/run/netns/sf-{sb.id}") if os.path.exists(p)],
            "veths": [i for i in (f"sfh{index:x}",) if os.path.exists(f"/sys/class/net/{i}")],
            "address leases": [p.name for p in Path("/run/sandfork/leases").glob("*") if sb.id in p.read_text(errors="replace")],
            "nft chains": [c for c in (f"sb_sfh{index:x}",) if run("nft", "list", "chain", "inet", "sandfork", c, check=False).returncode == 0],
        }
        for what, found in left.items():
            attempts.refused(f"a deleted sandbox ({order}) leaves {what}", not found, str(found))
    finally:
        if sb is not None:
            try:
                sb.terminate()
            except Exception:
                pass
        if sleeper is not None:
            os.killpg(sleeper.pid, signal.SIGKILL)
            sleeper.wait()
        ip("netns", "del", ns, check=False)
