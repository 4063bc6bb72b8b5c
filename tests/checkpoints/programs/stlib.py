"""Shared by the state programs that run inside the sandbox (python3 of the `python` image).

A *holder* sets up one kind of process state, then serves JSON commands on a Unix socket
(``/tmp/st/<name>.ctl``) so that a *check* — a new process started in the source or in a
fork — can ask it what it still has and make it use that state. A holder writes
``/tmp/st/<name>.ready`` (JSON: its pid and whatever the check needs to compare) once its
state is in place. A check prints one JSON document on stdout.

    python3 /opt/st/stlib.py wait NAME...   # waits for the holders' ready files, prints them
"""

import ctypes
import ctypes.util
import json
import os
import select
import socket
import sys
import time
import traceback

BASE = "/tmp/st"
libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def check_call(ret, what):
    """Raises OSError with errno when a libc call returned -1."""
    if ret == -1:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return ret


class Holder:
    """A control socket answering ``{"cmd": ..., "args": [...]}`` with ``{"ok", "result"|"error"}``."""

    def __init__(self, name):
        self.name = name
        self.handlers = {"ping": lambda: os.getpid()}
        os.makedirs(BASE, exist_ok=True)
        path = f"{BASE}/{name}.ctl"
        if os.path.exists(path):
            os.unlink(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(16)

    def ready(self, **info):
        info.setdefault("pid", os.getpid())
        tmp = f"{BASE}/{self.name}.ready.tmp"
        with open(tmp, "w") as f:
            json.dump(info, f)
        os.rename(tmp, f"{BASE}/{self.name}.ready")

    def answer(self):
        conn, _ = self.sock.accept()
        with conn:
            data = b""
            while not data.endswith(b"\n"):
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
            req = json.loads(data)
            try:
                res = {"ok": True, "result": self.handlers[req["cmd"]](*req.get("args", []))}
            except Exception:  # noqa: BLE001 - reported to the check
                res = {"ok": False, "error": traceback.format_exc()}
            conn.sendall(json.dumps(res).encode() + b"\n")

    def serve(self, fds=(), on_fd=None):
        """Answers commands forever; ``on_fd(fd)`` is called when one of ``fds`` is readable."""
        watched = [self.sock.fileno(), *fds]
        while True:
            for fd in select.select(watched, [], [])[0]:
                if fd == self.sock.fileno():
                    self.answer()
                else:
                    on_fd(fd)


def ask(name, cmd, *args, timeout=10.0):
    """Sends one command to holder ``name``; returns its result or raises with its error."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    with s:
        s.connect(f"{BASE}/{name}.ctl")
        s.sendall(json.dumps({"cmd": cmd, "args": list(args)}).encode() + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    res = json.loads(data)
    if not res["ok"]:
        raise RuntimeError(f"holder {name} failed {cmd}: {res['error']}")
    return res["result"]


def ready_info(name):
    with open(f"{BASE}/{name}.ready") as f:
        return json.load(f)


def proc_stat(pid):
    """(state, ppid, pgrp, session) of /proc/<pid>/stat, or None when the pid is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except FileNotFoundError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return {"state": fields[0], "ppid": int(fields[1]), "pgrp": int(fields[2]), "session": int(fields[3])}


def emit(doc):
    sys.stdout.write(json.dumps(doc) + "\n")
    sys.stdout.flush()


def wait_ready(names, timeout=30.0):
    deadline = time.monotonic() + timeout
    out = {}
    for name in names:
        while not os.path.exists(f"{BASE}/{name}.ready"):
            if time.monotonic() > deadline:
                raise SystemExit(f"holder {name} did not get ready within {timeout:g}s")
            time.sleep(0.02)
        out[name] = ready_info(name)
    return out


if __name__ == "__main__":
    if sys.argv[1] == "wait":
        emit(wait_ready(sys.argv[2:]))
