"""What a sandbox leaves on the host side: its disk's mount, the data directory, core
dumps, the API socket. Root inside a sandbox can plant setuid binaries and device nodes
on its own disk; no host user may ever run them with privileges."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from conftest import out_of, sh

pytestmark = pytest.mark.promise("host side")

NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"]


def sandbox_mounts(daemon, sandbox_id: str) -> list:
    """The host's mounts of a sandbox (its disk's ext4 and FUSE mounts) as mountinfo fields."""
    with open("/proc/self/mountinfo") as f:
        lines = [ln.split() for ln in f]
    return [ln for ln in lines if sandbox_id in ln[4] and str(daemon.data_dir) in ln[4]]


def test_planted_setuid_binaries_and_devices_are_inert_on_the_host(attempts, sandbox, daemon) -> None:
    """A setuid-root copy of a shell and a device node planted on the disk: the host mounts
    the disk nosuid,nodev (and the FUSE file noexec)."""
    r = sh(sandbox, "cp /bin/busybox /suid-shell && chmod 4755 /suid-shell && mknod /planted-mem c 1 1; ls -l /suid-shell")
    attempts.refused("plant a setuid-root binary (allowed inside, must be inert outside)", True, out_of(r))
    mounts = sandbox_mounts(daemon, sandbox.id)
    attempts.refused("find the sandbox's disk mounted on the host", bool(mounts), repr(mounts))
    for m in mounts:
        opts = set(m[5].split(","))
        attempts.refused(f"{m[4]} honours setuid bits or devices", {"nosuid", "nodev"} <= opts, m[5])
        if m[m.index("-") + 1] == "fuse":
            attempts.refused(f"{m[4]} (the disk file) is executable", "noexec" in opts, m[5])


def test_an_unprivileged_host_user_cannot_reach_sandbox_files(attempts, sandbox, daemon) -> None:
    """The data directory is 0700 (root only): a host user cannot list it, traverse it to a
    sandbox's root filesystem, or run what a sandbox planted there."""
    sh(sandbox, "cp /bin/busybox /suid-shell && chmod 4755 /suid-shell")
    mode = os.stat(daemon.data_dir).st_mode & 0o777
    attempts.refused("data directory open to other users", mode == 0o700, oct(mode))
    db = Path(daemon.data_dir) / "state.db"
    db_mode = db.stat().st_mode & 0o777
    attempts.refused("state database readable by other users", db_mode & 0o077 == 0, oct(db_mode))
    r = subprocess.run([*NOBODY, "ls", str(daemon.data_dir)], capture_output=True, text=True)
    attempts.refused("list the data directory as nobody", r.returncode != 0, r.stdout + r.stderr)
    roots = [m[4] for m in sandbox_mounts(daemon, sandbox.id) if m[m.index("-") + 1] == "ext4"]
    for root in roots:
        r = subprocess.run([*NOBODY, f"{root}/suid-shell", "id", "-u"], capture_output=True, text=True)
        attempts.refused(f"run {root}/suid-shell as nobody", r.stdout.strip() != "0", r.stdout + r.stderr)


def test_a_crash_inside_dumps_no_core(attempts, sandbox) -> None:
    """RLIMIT_CORE is 0, hard: a crashing process dumps nothing (so a host core_pattern
    helper never runs for it), and the limit cannot be raised."""
    r = sh(sandbox, "ulimit -c; ulimit -H -c")
    attempts.refused("core dumps enabled", r.stdout.split() == ["0", "0"], out_of(r))
    r = sh(sandbox, "ulimit -c unlimited && echo raised")
    attempts.refused("raise RLIMIT_CORE", "raised" not in r.stdout, out_of(r))
    r = sh(sandbox, "cd /tmp && sh -c 'kill -SEGV $$'; ls /tmp")
    attempts.refused("dump a core file", "core" not in r.stdout.split(), out_of(r))


def test_the_api_socket_is_not_world_accessible(attempts, daemon) -> None:
    """The API socket is 0660 root-owned (created with that mode: no window at start)."""
    mode = os.stat(daemon.socket).st_mode & 0o777
    attempts.refused("API socket open to other users", mode & 0o007 == 0, oct(mode))
    probe = ("import socket,sys; s=socket.socket(socket.AF_UNIX); s.settimeout(2); s.connect(sys.argv[1]); "
             "s.sendall(b'GET /v1/health HTTP/1.0\\r\\n\\r\\n'); print(s.recv(100))")
    r = subprocess.run([*NOBODY, "/usr/bin/python3", "-c", probe, str(daemon.socket)], capture_output=True, text=True)
    attempts.refused("call the API as nobody", "200 OK" not in r.stdout, r.stdout + r.stderr)
