#!/usr/bin/env python3
"""Recording stand-in for the E2B control plane and the in-sandbox envd.

It answers the unmodified E2B SDKs (Python `e2b` 2.63.0, JS `e2b` 2.51.0) well
enough for them to run whole scenarios, and logs every exchange as one JSON
line: request (method, path, query, headers with the API key redacted, body
decoded) and the response it served (status, headers, body decoded; Connect
streams as their enveloped frames).  The fixtures under fixtures/ were made
with it; WIRE.md is the spec distilled from them.

Standard library only.  Loopback only: bind it to 127.0.0.1 inside a network
namespace that has nothing but `lo` (see record.sh).

Two listeners, one handler:
  --api-port   (E2B_API_URL)      the REST control plane (X-API-KEY auth)
  --envd-port  (E2B_SANDBOX_URL)  envd: /health, /files, Connect-RPC services,
                                  routed by the `E2b-Sandbox-Id` header
A request is envd traffic when it carries `E2b-Sandbox-Id` or its path is
an envd one, whichever port it came in on.

The sandboxes are fakes: a directory per sandbox stands in for its root
filesystem (paths inside are mapped below it), commands really run on this
host (bash), as the recorder's own user, with HOME and the working
directory inside that directory.  Good for recording wire shapes, nothing
else.
"""

import argparse
import base64
import ctypes
import ctypes.util
import datetime
import email.utils
import gzip
import hashlib
import mimetypes
import grp
import json
import os
import pwd
import queue
import re
import secrets
import select
import shutil
import signal
import socket
import stat as statmod
import string
import struct
import subprocess
import sys
import threading
import time
import traceback
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ENVD_PATH_PREFIXES = ("/process.Process/", "/filesystem.Filesystem/", "/files", "/health", "/envs", "/metrics")

# ---------------------------------------------------------------------------
# configuration (set in main)

CFG = argparse.Namespace(
    api_key="e2b_recorder_test_key",
    envd_version="0.6.4",
    root="/tmp/e2b-recorder",
    domain=None,
    log=None,
    keepalive_override=None,
)

LOG_LOCK = threading.Lock()
SEQ_LOCK = threading.Lock()
SEQ = [0]


def next_seq():
    with SEQ_LOCK:
        SEQ[0] += 1
        return SEQ[0]


def now_utc():
    return datetime.datetime.now(datetime.timezone.utc)


def rfc3339(dt):
    return dt.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def rand_id(n=20):
    alphabet = string.ascii_lowercase + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(n))


def write_log(record):
    if not CFG.log:
        return
    line = json.dumps(record, ensure_ascii=False, sort_keys=False)
    with LOG_LOCK:
        with open(CFG.log, "a", encoding="utf-8") as f:
            f.write(line + "\n")


# ---------------------------------------------------------------------------
# body decoding for the log


def decode_bytes(data):
    if not data:
        return {"kind": "empty"}
    try:
        text = data.decode("utf-8")
        return {"kind": "text", "text": text}
    except UnicodeDecodeError:
        return {"kind": "bytes", "base64": base64.b64encode(data).decode()}


def decode_frames(data):
    frames = []
    i = 0
    while i + 5 <= len(data):
        flags = data[i]
        (n,) = struct.unpack(">I", data[i + 1 : i + 5])
        payload = data[i + 5 : i + 5 + n]
        frames.append(frame_record(flags, payload))
        i += 5 + n
    out = {"kind": "connect-frames", "frames": frames}
    if i != len(data):
        out["trailing_bytes_base64"] = base64.b64encode(data[i:]).decode()
    return out


def frame_record(flags, payload):
    rec = {"flags": flags, "length": len(payload)}
    try:
        rec["json"] = json.loads(payload.decode("utf-8")) if payload else None
    except Exception:
        rec["raw_base64"] = base64.b64encode(payload).decode()
    return rec


def parse_multipart(data, ctype):
    m = re.search(r'boundary="?([^";]+)"?', ctype)
    if not m:
        return None
    boundary = b"--" + m.group(1).encode()
    parts = []
    for chunk in data.split(boundary)[1:]:
        if chunk.startswith(b"--"):
            break
        chunk = chunk[2:] if chunk.startswith(b"\r\n") else chunk
        head, _, body = chunk.partition(b"\r\n\r\n")
        if body.endswith(b"\r\n"):
            body = body[:-2]
        headers = {}
        for line in head.decode("utf-8", "replace").split("\r\n"):
            if ":" in line:
                k, v = line.split(":", 1)
                headers[k.strip()] = v.strip()
        disp = headers.get("Content-Disposition") or headers.get("content-disposition") or ""
        name = re.search(r'(?:^|;)\s*name="([^"]*)"', disp)
        fname = re.search(r'filename="([^"]*)"', disp)
        parts.append(
            {
                "headers": headers,
                "name": name.group(1) if name else None,
                "filename": fname.group(1) if fname else None,
                "data": body,
            }
        )
    return parts


def decode_body(data, ctype):
    ctype = (ctype or "").lower()
    if not data:
        return {"kind": "empty"}
    if ctype.startswith("application/connect+json") or ctype.startswith("application/connect+proto"):
        return decode_frames(data)
    if ctype.startswith("multipart/"):
        parts = parse_multipart(data, ctype) or []
        return {
            "kind": "multipart",
            "content_type": ctype,
            "parts": [
                {
                    "headers": p["headers"],
                    "name": p["name"],
                    "filename": p["filename"],
                    "data": decode_bytes(p["data"]),
                }
                for p in parts
            ],
        }
    if "json" in ctype:
        try:
            return {"kind": "json", "json": json.loads(data.decode("utf-8"))}
        except Exception:
            pass
    return decode_bytes(data)


# ---------------------------------------------------------------------------
# Connect helpers

CONNECT_HTTP_STATUS = {
    "canceled": 499,
    "unknown": 500,
    "invalid_argument": 400,
    "deadline_exceeded": 504,
    "not_found": 404,
    "already_exists": 409,
    "permission_denied": 403,
    "resource_exhausted": 429,
    "failed_precondition": 400,
    "aborted": 409,
    "out_of_range": 400,
    "unimplemented": 501,
    "internal": 500,
    "unavailable": 503,
    "data_loss": 500,
    "unauthenticated": 401,
}


class RpcError(Exception):
    def __init__(self, code, message):
        super().__init__(message)
        self.code = code
        self.message = message


def envelope(obj, flags=0):
    payload = json.dumps(obj, separators=(",", ":")).encode()
    return bytes([flags]) + struct.pack(">I", len(payload)) + payload


def b64(data):
    return base64.b64encode(data).decode()


def accepts_gzip(header):
    """envd's choice: the best-quality supported coding of Accept-Encoding (gzip or identity)."""
    if not header:
        return False
    best = []
    for item in header.split(","):
        name, _, params = item.strip().partition(";")
        q = 1.0
        for prm in params.split(";"):
            prm = prm.strip()
            if prm.lower().startswith("q="):
                try:
                    q = float(prm[2:])
                except ValueError:
                    pass
        best.append((q, name.strip().lower()))
    best.sort(key=lambda x: -x[0])
    for q, name in best:
        if q == 0:
            continue
        if name in ("identity", "*"):
            return False
        if name == "gzip":
            return True
    return False


# ---------------------------------------------------------------------------
# fake sandboxes


class Proc:
    def __init__(self, sandbox, config, tag, stdin, pty_size, timeout_s, first_subscriber=None):
        self.sandbox = sandbox
        self.config = config
        self.tag = tag
        self.lock = threading.Lock()
        # the first subscriber exists before the process does: no early output is lost
        self.subscribers = [first_subscriber] if first_subscriber is not None else []
        self.end = None
        self.pty_master = None
        self.stdin_pipe = None
        # The command sees the sandbox's /home and /tmp (bind mounts in a private
        # mount namespace of its own); the rest of the host is left as it is.
        wrapper = (
            'mount -t tmpfs tmpfs /home && mkdir -p /home/user && '
            'mount --bind "$SBX_ROOT/home/user" /home/user && '
            'mount --bind "$SBX_ROOT/tmp" /tmp && cd "$SBX_CWD" && exec "$@"'
        )
        cmd = ["unshare", "-m", "--propagation", "private", "--", "/bin/sh", "-c", wrapper, "sh",
               config.get("cmd", "")] + list(config.get("args", []))
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": sandbox.host_path("/home/user"),
            "USER": "user",
            "LOGNAME": "user",
        }
        env.update(sandbox.env_vars or {})
        env.update(config.get("envs") or {})
        cwd = config.get("cwd")
        sbx_cwd = os.path.normpath(cwd if cwd and cwd.startswith("/") else "/home/user/" + (cwd or ""))
        host_cwd = sandbox.host_path(sbx_cwd)
        if not os.path.isdir(host_cwd):
            raise RpcError("invalid_argument", "cwd '%s' does not exist" % (sbx_cwd,))
        os.makedirs(sandbox.host_path("/tmp"), exist_ok=True)
        env["SBX_ROOT"] = sandbox.fs_root
        env["SBX_CWD"] = sbx_cwd if sbx_cwd.startswith(("/home/user", "/tmp")) else "/home/user"
        env["HOME"] = "/home/user"
        if pty_size is not None:
            import pty as ptymod
            import fcntl
            import termios

            master, slave = ptymod.openpty()
            cols, rows = pty_size
            fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows or 24, cols or 80, 0, 0))
            env.setdefault("TERM", "xterm-256color")
            self.popen = subprocess.Popen(
                cmd, stdin=slave, stdout=slave, stderr=slave, cwd=host_cwd, env=env,
                start_new_session=True, close_fds=True,
                preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0),
            )
            os.close(slave)
            self.pty_master = master
        else:
            self.popen = subprocess.Popen(
                cmd,
                stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=host_cwd,
                env=env,
                start_new_session=True,
            )
            self.stdin_pipe = self.popen.stdin
        self.pid = self.popen.pid
        self.killed_by_timeout = False
        readers = []
        if self.pty_master is not None:
            readers.append(threading.Thread(target=self._reader, args=(self.pty_master, "pty"), daemon=True))
        else:
            readers.append(threading.Thread(target=self._reader, args=(self.popen.stdout.fileno(), "stdout"), daemon=True))
            readers.append(threading.Thread(target=self._reader, args=(self.popen.stderr.fileno(), "stderr"), daemon=True))
        self.readers = readers
        for r in readers:
            r.start()
        threading.Thread(target=self._waiter, daemon=True).start()
        if timeout_s and timeout_s > 0:
            threading.Thread(target=self._deadline, args=(timeout_s,), daemon=True).start()

    def _deadline(self, timeout_s):
        # envd kills the process when the Start request's Connect-Timeout-Ms passes;
        # a little later than the stream's own deadline so the stream reports it first
        time.sleep(timeout_s + 0.3)
        if self.end is None:
            self.killed_by_timeout = True
            self.signal(signal.SIGKILL)

    def _reader(self, fd, kind):
        while True:
            try:
                data = os.read(fd, 32 * 1024)
            except OSError:
                break
            if not data:
                break
            self._publish({"data": {kind: b64(data)}})

    def _waiter(self):
        rc = self.popen.wait()
        for r in self.readers:
            r.join(timeout=2)
        if rc < 0:
            status = "signal: " + {9: "killed", 15: "terminated", 2: "interrupt", 1: "hangup"}.get(-rc, str(-rc))
            end = {"exitCode": -1, "status": status, "error": status}
        else:
            status = "exit status %d" % rc
            end = {"exited": True, "status": status}
            if rc != 0:
                end["exitCode"] = rc
                end["error"] = status
        self.end = end
        self._publish({"end": end})
        self._publish(None)
        with self.sandbox.lock:
            self.sandbox.processes.pop(self.pid, None)
        if self.pty_master is not None:
            try:
                os.close(self.pty_master)
            except OSError:
                pass

    def _publish(self, event):
        with self.lock:
            subs = list(self.subscribers)
        for q in subs:
            q.put(event)

    def subscribe(self):
        q = queue.Queue()
        with self.lock:
            self.subscribers.append(q)
        return q

    def unsubscribe(self, q):
        with self.lock:
            if q in self.subscribers:
                self.subscribers.remove(q)

    def signal(self, sig):
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            pass

    def write_stdin(self, data):
        if self.stdin_pipe is None:
            raise RpcError("failed_precondition", "stdin not enabled or closed")
        try:
            self.stdin_pipe.write(data)
            self.stdin_pipe.flush()
        except (BrokenPipeError, ValueError) as e:
            raise RpcError("internal", "error writing to stdin of process '%d': %s" % (self.pid, e))

    def write_pty(self, data):
        if self.pty_master is None:
            raise RpcError("failed_precondition", "tty not assigned to process")
        os.write(self.pty_master, data)

    def close_stdin(self):
        if self.pty_master is not None:
            raise RpcError("failed_precondition", "cannot close stdin for PTY process — send Ctrl+D (0x04) instead")
        if self.stdin_pipe is not None:
            try:
                self.stdin_pipe.close()
            except OSError:
                pass
            self.stdin_pipe = None

    def info(self):
        cfg = {"cmd": self.config.get("cmd", "")}
        if self.config.get("args"):
            cfg["args"] = list(self.config["args"])
        if self.config.get("envs"):
            cfg["envs"] = dict(self.config["envs"])
        if self.config.get("cwd") is not None:
            cfg["cwd"] = self.config["cwd"]
        out = {"config": cfg, "pid": self.pid}
        if self.tag is not None:
            out["tag"] = self.tag
        return out


class Sandbox:
    def __init__(self, template_id, timeout, metadata, env_vars, extra, fs_source=None):
        self.id = rand_id()
        self.template_id = template_id
        self.alias = template_id if not template_id.startswith("snap_") else None
        self.metadata = metadata or {}
        self.env_vars = env_vars or {}
        self.timeout = timeout
        self.started_at = now_utc()
        self.end_at = self.started_at + datetime.timedelta(seconds=timeout)
        self.state = "running"
        self.envd_token = "ea_" + secrets.token_hex(16)
        self.extra = extra  # network, allow_internet_access, lifecycle, ...
        self.lock = threading.RLock()
        self.processes = {}
        self.watchers = {}
        self.gone = False  # killed or paused: open streams end with `unavailable`
        self.file_metadata = {}  # sandbox path -> {key: value} (envd keeps these as user.e2b.* xattrs)
        self.fs_root = os.path.join(CFG.root, "sandboxes", self.id, "rootfs")
        if fs_source:
            shutil.copytree(fs_source, self.fs_root, symlinks=True)
        else:
            os.makedirs(os.path.join(self.fs_root, "home", "user"), exist_ok=True)
            os.makedirs(os.path.join(self.fs_root, "tmp"), exist_ok=True)
            with open(os.path.join(self.fs_root, "home", "user", ".bashrc"), "w") as f:
                f.write("# fake sandbox home\n")

    def host_path(self, path):
        if path is None or path == "":
            path = "/home/user"
        if not path.startswith("/"):
            path = "/home/user/" + path
        norm = os.path.normpath(path)
        if norm.startswith("//"):
            norm = norm[1:]
        return self.fs_root + norm if norm != "/" else self.fs_root

    def resolve_links(self, host):
        """Follow symlinks the way the sandbox would see them (absolute targets are inside it)."""
        for _ in range(40):
            if not os.path.islink(host):
                return host
            t = os.readlink(host)
            host = self.host_path(t) if t.startswith("/") else os.path.normpath(os.path.join(os.path.dirname(host), t))
        return host

    def sandbox_path(self, host):
        rel = os.path.relpath(host, self.fs_root)
        return "/" if rel == "." else "/" + rel

    def sandbox_json(self):
        d = {
            "templateID": self.template_id,
            "sandboxID": self.id,
            "clientID": "6532622b",
            "envdVersion": CFG.envd_version,
            "envdAccessToken": self.envd_token,
            "trafficAccessToken": None,
            "domain": CFG.domain,
        }
        if self.alias:
            d["alias"] = self.alias
        return d

    def listed_json(self):
        d = {
            "templateID": self.template_id,
            "sandboxID": self.id,
            "clientID": "6532622b",
            "startedAt": rfc3339(self.started_at),
            "endAt": rfc3339(self.end_at),
            "cpuCount": 2,
            "memoryMB": 512,
            "diskSizeMB": 2048,
            "state": self.state,
            "envdVersion": CFG.envd_version,
            "metadata": self.metadata,
        }
        if self.alias:
            d["alias"] = self.alias
        return d

    def detail_json(self):
        d = self.listed_json()
        d["envdAccessToken"] = self.envd_token
        d["domain"] = CFG.domain
        if "allow_internet_access" in self.extra:
            d["allowInternetAccess"] = self.extra["allow_internet_access"]
        if self.extra.get("network"):
            d["network"] = self.extra["network"]
        d["lifecycle"] = {
            "autoResume": bool((self.extra.get("autoResume") or {}).get("enabled", False)),
            "onTimeout": "pause" if self.extra.get("autoPause") else "kill",
        }
        return d

    def kill_all(self):
        self.gone = True
        with self.lock:
            procs = list(self.processes.values())
            watchers = list(self.watchers.values())
        for p in procs:
            p.signal(signal.SIGKILL)
        for w in watchers:
            w.close()


class Store:
    def __init__(self):
        self.lock = threading.RLock()
        self.sandboxes = {}
        self.snapshots = {}  # id -> dict(names, fs_dir, sandbox_id, created)
        self.template_ids = {}  # template name -> template id
        self.template_files = set()  # uploaded files hashes
        self.builds = {}  # build id -> dict(template, name, status, logs, polls, failed)

    def get(self, sid):
        with self.lock:
            return self.sandboxes.get(sid)

    def reap(self):
        while True:
            time.sleep(0.25)
            expired = []
            with self.lock:
                for s in list(self.sandboxes.values()):
                    if s.state == "running" and now_utc() >= s.end_at:
                        if s.extra.get("autoPause"):
                            s.state = "paused"
                            s.kill_all()
                        else:
                            expired.append(s)
                for s in expired:
                    self.sandboxes.pop(s.id, None)
            for s in expired:
                s.kill_all()


STORE = Store()


# ---------------------------------------------------------------------------
# inotify (ctypes) for WatchDir / CreateWatcher

IN_MODIFY = 0x2
IN_ATTRIB = 0x4
IN_CLOSE_WRITE = 0x8
IN_MOVED_FROM = 0x40
IN_MOVED_TO = 0x80
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_ISDIR = 0x40000000
IN_NONBLOCK = 0o4000
WATCH_MASK = IN_MODIFY | IN_ATTRIB | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE | IN_DELETE_SELF | IN_MOVE_SELF

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


class Watcher:
    """One inotify instance; events mapped the way envd maps fsnotify's."""

    def __init__(self, sandbox, path, recursive, include_entry):
        self.sandbox = sandbox
        self.sandbox_dir = path
        self.root = sandbox.host_path(path)
        self.recursive = recursive
        self.include_entry = include_entry
        self.fd = _libc.inotify_init1(IN_NONBLOCK)
        if self.fd < 0:
            raise RpcError("internal", "error creating watcher")
        self.wds = {}
        self.events = queue.Queue()
        self.buffer = []  # for the polled variant
        self.closed = False
        self._add(self.root)
        if recursive:
            for dirpath, dirnames, _ in os.walk(self.root):
                for d in dirnames:
                    self._add(os.path.join(dirpath, d))
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _add(self, host_dir):
        wd = _libc.inotify_add_watch(self.fd, host_dir.encode(), WATCH_MASK)
        if wd >= 0:
            self.wds[wd] = host_dir

    def _loop(self):
        while not self.closed:
            r, _, _ = select.select([self.fd], [], [], 0.2)
            if not r:
                continue
            try:
                buf = os.read(self.fd, 64 * 1024)
            except OSError:
                continue
            i = 0
            while i + 16 <= len(buf):
                wd, mask, _cookie, ln = struct.unpack("iIII", buf[i : i + 16])
                name = buf[i + 16 : i + 16 + ln].rstrip(b"\0").decode("utf-8", "replace")
                i += 16 + ln
                base = self.wds.get(wd)
                if base is None:
                    continue
                full = os.path.join(base, name) if name else base
                if mask & IN_CREATE and mask & IN_ISDIR and self.recursive:
                    self._add(full)
                ops = []
                if mask & (IN_CREATE | IN_MOVED_TO):
                    ops.append("EVENT_TYPE_CREATE")
                if mask & (IN_MOVED_FROM | IN_MOVE_SELF):
                    ops.append("EVENT_TYPE_RENAME")
                if mask & IN_ATTRIB:
                    ops.append("EVENT_TYPE_CHMOD")
                if mask & IN_MODIFY:
                    ops.append("EVENT_TYPE_WRITE")
                if mask & (IN_DELETE | IN_DELETE_SELF):
                    ops.append("EVENT_TYPE_REMOVE")
                rel = os.path.relpath(full, self.root)
                for op in ops:
                    ev = {"name": rel, "type": op}
                    if self.include_entry:
                        try:
                            ev["entry"] = entry_info(self.sandbox, full)
                        except RpcError:
                            pass
                    self.events.put(ev)
                    self.buffer.append(ev)

    def close(self):
        if not self.closed:
            self.closed = True
            self.events.put(None)
            try:
                os.close(self.fd)
            except OSError:
                pass


# ---------------------------------------------------------------------------
# filesystem helpers


def go_mode_string(st_mode):
    """Go's os.FileMode.String() for an lstat mode."""
    perm = st_mode & 0o777
    kinds = ""
    if statmod.S_ISDIR(st_mode):
        kinds += "d"
    if statmod.S_ISLNK(st_mode):
        kinds += "L"
    if statmod.S_ISBLK(st_mode):
        kinds += "D"
    if statmod.S_ISFIFO(st_mode):
        kinds += "p"
    if statmod.S_ISSOCK(st_mode):
        kinds += "S"
    if st_mode & statmod.S_ISUID:
        kinds += "u"
    if st_mode & statmod.S_ISGID:
        kinds += "g"
    if statmod.S_ISCHR(st_mode):
        kinds += "Dc"
    if st_mode & statmod.S_ISVTX:
        kinds += "t"
    if not kinds:
        kinds = "-"
    rwx = "rwxrwxrwx"
    bits = "".join(rwx[i] if perm & (1 << (8 - i)) else "-" for i in range(9))
    return kinds + bits


def owner_names(st):
    try:
        owner = pwd.getpwuid(st.st_uid).pw_name
    except KeyError:
        owner = str(st.st_uid)
    try:
        group = grp.getgrgid(st.st_gid).gr_name
    except KeyError:
        group = str(st.st_gid)
    # the fake runs as root; present files as the sandbox's default user
    if owner == "root":
        owner = "user"
    if group == "root":
        group = "user"
    return owner, group


def entry_info(sandbox, host):
    try:
        st = os.lstat(host)
    except FileNotFoundError:
        raise RpcError("not_found", "file not found: lstat %s: no such file or directory" % sandbox.sandbox_path(host))
    mode_for_type = st.st_mode
    target = None
    if statmod.S_ISLNK(st.st_mode):
        target_host = sandbox.resolve_links(host)
        target = sandbox.sandbox_path(target_host)
        try:
            mode_for_type = os.stat(target_host).st_mode
        except OSError:
            mode_for_type = 0
    if statmod.S_ISREG(mode_for_type):
        ftype = "FILE_TYPE_FILE"
    elif statmod.S_ISDIR(mode_for_type):
        ftype = "FILE_TYPE_DIRECTORY"
    else:
        ftype = "FILE_TYPE_UNSPECIFIED"
    owner, group = owner_names(st)
    mtime = datetime.datetime.fromtimestamp(st.st_mtime_ns / 1e9, datetime.timezone.utc)
    e = {
        "name": os.path.basename(host) if host != sandbox.fs_root else "/",
        "type": ftype,
        "path": sandbox.sandbox_path(host),
        "size": str(st.st_size),
        "mode": mode_for_type & 0o777,
        "permissions": go_mode_string(st.st_mode),
        "owner": owner,
        "group": group,
        "modifiedTime": mtime.strftime("%Y-%m-%dT%H:%M:%S.") + "%09dZ" % (st.st_mtime_ns % 1_000_000_000),
    }
    if target is not None:
        e["symlinkTarget"] = target
    md = sandbox.file_metadata.get(sandbox.sandbox_path(host))
    if md:
        e["metadata"] = dict(md)
    return e


# ---------------------------------------------------------------------------
# HTTP handler


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "e2b-recorder"
    sys_version = ""

    def log_message(self, fmt, *args):  # quiet
        if os.environ.get("RECORDER_VERBOSE"):
            sys.stderr.write("recorder: " + (fmt % args) + "\n")

    # -- plumbing --------------------------------------------------------

    def do_GET(self):
        self.dispatch()

    do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = do_GET

    def dispatch(self):
        self.t0 = time.time()
        self.seq = next_seq()
        u = urllib.parse.urlsplit(self.path)
        self.req_path = u.path
        self.query = urllib.parse.parse_qs(u.query, keep_blank_values=True)
        self.raw_query = u.query
        self.resp = None
        self.req_body = b""
        self.req_body_log = None
        self.stream_frames = []
        self.stream_ctype = None
        self.note = None
        sid = self.headers.get("E2b-Sandbox-Id")
        self.plane = "envd" if sid or u.path.startswith(ENVD_PATH_PREFIXES[:3]) else "api"
        if u.path == "/health" and self.server.role == "envd":
            self.plane = "envd"
        try:
            if self.plane == "api":
                self.handle_api()
            else:
                self.handle_envd(sid)
        except (BrokenPipeError, ConnectionResetError):
            self.note = (self.note or "") + " client went away"
        except Exception as e:  # answer something the SDKs can read
            traceback.print_exc()
            if self.resp is None:
                try:
                    self.send_json(500, {"code": 500, "message": "recorder error: %s" % e})
                except Exception:
                    pass
        finally:
            self.finish_log()

    def finish_log(self):
        hdrs = {}
        for k, v in self.headers.items():
            if k.lower() == "x-api-key":
                v = "<redacted:%s>" % ("valid" if v == CFG.api_key else "invalid")
            hdrs[k] = v
        req_body = self.req_body_log
        if req_body is None:
            req_body = decode_body(self.req_body, self.headers.get("Content-Type"))
        rec = {
            "seq": self.seq,
            "plane": self.plane,
            "port_role": self.server.role,
            "method": self.command,
            "path": self.req_path,
            "raw_query": self.raw_query,
            "query": self.query,
            "headers": hdrs,
            "body": req_body,
            "response": self.resp,
            "t_start": round(self.t0, 3),
            "duration_ms": int((time.time() - self.t0) * 1000),
        }
        if self.note:
            rec["note"] = self.note.strip()
        write_log(rec)

    def read_body(self):
        te = (self.headers.get("Transfer-Encoding") or "").lower()
        if "chunked" in te:
            self.req_body = b"".join(self.iter_chunked())
        else:
            n = int(self.headers.get("Content-Length") or 0)
            self.req_body = self.rfile.read(n) if n else b""
        return self.req_body

    def iter_chunked(self):
        while True:
            line = self.rfile.readline()
            if not line:
                return
            size = int(line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while True:
                    t = self.rfile.readline()
                    if t in (b"\r\n", b"\n", b""):
                        break
                return
            data = self.rfile.read(size)
            self.rfile.readline()
            yield data

    def iter_body(self):
        """The request body as it arrives (for client streams)."""
        te = (self.headers.get("Transfer-Encoding") or "").lower()
        if "chunked" in te:
            for chunk in self.iter_chunked():
                yield chunk
        else:
            n = int(self.headers.get("Content-Length") or 0)
            while n > 0:
                data = self.rfile.read1(min(n, 65536)) if hasattr(self.rfile, "read1") else self.rfile.read(min(n, 65536))
                if not data:
                    return
                n -= len(data)
                yield data

    def send_raw(self, status, body, ctype, extra_headers=None, log_body=None):
        self.send_response(status)
        if ctype:
            self.send_header("Content-Type", ctype)
        hdrs = {"Content-Type": ctype} if ctype else {}
        for k, v in (extra_headers or {}).items():
            self.send_header(k, v)
            hdrs[k] = v
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD" and body:
            self.wfile.write(body)
        self.resp = {
            "status": status,
            "headers": hdrs,
            "body": log_body if log_body is not None else decode_body(body, ctype),
        }

    def send_json(self, status, obj, extra_headers=None, ctype="application/json"):
        body = json.dumps(obj).encode()
        self.send_raw(status, body, ctype, extra_headers)

    def send_empty(self, status, extra_headers=None):
        self.send_response(status)
        hdrs = {}
        for k, v in (extra_headers or {}).items():
            self.send_header(k, v)
            hdrs[k] = v
        if status not in (204, 304):
            self.send_header("Content-Length", "0")
        self.end_headers()
        self.resp = {"status": status, "headers": hdrs, "body": {"kind": "empty"}}

    # -- streaming responses (Connect server streams) ---------------------

    def stream_begin(self, ctype="application/connect+json"):
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.stream_ctype = ctype
        self.resp = {
            "status": 200,
            "headers": {"Content-Type": ctype, "Transfer-Encoding": "chunked"},
            "body": {"kind": "connect-frames", "frames": self.stream_frames},
        }

    def stream_send(self, obj, flags=0):
        data = envelope(obj, flags)
        rec = {"flags": flags, "length": len(data) - 5, "json": obj, "t_ms": int((time.time() - self.t0) * 1000)}
        self.wfile.write(("%x\r\n" % len(data)).encode() + data + b"\r\n")
        self.wfile.flush()
        self.stream_frames.append(rec)

    def stream_end(self, error=None, metadata=None):
        end = {}
        if error is not None:
            end["error"] = {"code": error.code, "message": error.message}
        if metadata:
            end["metadata"] = metadata
        try:
            self.stream_send(end, flags=2)
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            self.note = (self.note or "") + " client went away before end-of-stream"

    def client_gone(self):
        try:
            r, _, _ = select.select([self.connection], [], [], 0)
            if r:
                data = self.connection.recv(1, socket.MSG_PEEK)
                return data == b""
        except OSError:
            return True
        return False

    # -- control plane ----------------------------------------------------

    def api_error(self, status, message, extra=None):
        body = {"code": status, "message": message}
        if extra:
            body.update(extra)
        self.send_json(status, body)

    def handle_api(self):
        body = self.read_body()
        key = self.headers.get("X-API-KEY")
        up = re.match(r"^/templates/([^/]+)/files/([0-9a-f]{64})$", self.req_path)
        if self.command == "PUT" and up and self.query.get("signature"):
            return self.api_template_upload(up.group(1), up.group(2), self.query["signature"][0])
        if key != CFG.api_key:
            return self.api_error(401, "Invalid API key, please visit https://e2b.dev/docs/api-key for more information.")
        data = None
        if body:
            try:
                data = json.loads(body)
            except ValueError:
                return self.api_error(400, "request body is not JSON")
        p = self.req_path
        m = self.command
        routes = [
            ("POST", r"^/(v2/)?sandboxes$", self.api_create),
            ("GET", r"^/v2/sandboxes$", self.api_list),
            ("GET", r"^/sandboxes$", self.api_list_v1),
            ("GET", r"^/sandboxes/([^/]+)$", self.api_get),
            ("DELETE", r"^/sandboxes/([^/]+)$", self.api_kill),
            ("POST", r"^/sandboxes/([^/]+)/timeout$", self.api_timeout),
            ("POST", r"^/sandboxes/([^/]+)/refreshes$", self.api_refresh),
            ("POST", r"^/sandboxes/([^/]+)/pause$", self.api_pause),
            ("POST", r"^/sandboxes/([^/]+)/resume$", self.api_resume),
            ("POST", r"^/(v2/)?sandboxes/([^/]+)/connect$", self.api_connect),
            ("POST", r"^/sandboxes/([^/]+)/fork$", self.api_fork),
            ("POST", r"^/sandboxes/([^/]+)/snapshots$", self.api_snapshot),
            ("GET", r"^/snapshots$", self.api_list_snapshots),
            ("POST", r"^/v3/templates$", self.api_template_request),
            ("GET", r"^/templates/aliases/([^/]+)$", self.api_template_alias),
            ("GET", r"^/templates/([^/]+)/files/([^/]+)$", self.api_template_files),
            ("POST", r"^/v2/templates/([^/]+)/builds/([^/]+)$", self.api_template_build),
            ("GET", r"^/templates/([^/]+)/builds/([^/]+)/status$", self.api_template_status),
            ("DELETE", r"^/templates/(.+)$", self.api_delete_template),
            ("PUT", r"^/sandboxes/([^/]+)/network$", self.api_network),
            ("GET", r"^/sandboxes/([^/]+)/metrics$", self.api_metrics),
            ("GET", r"^/health$", lambda d: self.send_json(200, {"message": "Health check successful"})),
        ]
        for meth, rx, fn in routes:
            mm = re.match(rx, p)
            if mm and meth == m:
                groups = [g for g in mm.groups() if g and not g.startswith("v2")]
                return fn(data, *[urllib.parse.unquote(g) for g in groups])
        return self.api_error(404, "no route for %s %s" % (m, p))

    # Templates: builds are faked (no step runs); a RUN that says `exit 3` or is `false`
    # fails at its step. Files are "present" once uploaded.

    def api_template_request(self, data):
        data = data or {}
        name = data.get("name") or data.get("alias")
        if not name:
            return self.api_error(400, "name is required")
        base, _, tag = name.partition(":")
        bid = "%s-%s-%s-%s-%s" % tuple(secrets.token_hex(n) for n in (4, 2, 2, 2, 6))
        with STORE.lock:
            tid = STORE.template_ids.setdefault(base, rand_id())
            STORE.builds[bid] = {"template": tid, "name": base, "status": "waiting", "logs": [], "polls": 0}
        tags = [tag or "default", *(data.get("tags") or [])]
        self.send_json(202, {"templateID": tid, "buildID": bid, "public": False, "names": [base],
                             "tags": tags, "aliases": [base]})

    def api_template_alias(self, data, alias):
        with STORE.lock:
            tid = STORE.template_ids.get(alias)
        if tid is None:
            return self.api_error(404, "template '%s' not found" % alias)
        self.send_json(200, {"templateID": tid, "public": False})

    def api_template_files(self, data, tid, files_hash):
        with STORE.lock:
            present = files_hash in STORE.template_files
        if present:
            return self.send_json(201, {"present": True})
        sig = hashlib.sha256(("%s/%s" % (tid, files_hash)).encode()).hexdigest()
        host = self.headers.get("Host", "127.0.0.1:3000")
        self.send_json(201, {"present": False, "url": "http://%s/templates/%s/files/%s?signature=%s" % (host, tid, files_hash, sig)})

    def api_template_upload(self, tid, files_hash, sig):
        if sig != hashlib.sha256(("%s/%s" % (tid, files_hash)).encode()).hexdigest():
            return self.api_error(403, "bad signature")
        with STORE.lock:
            STORE.template_files.add(files_hash)
        self.send_empty(200)

    def api_template_build(self, data, tid, bid):
        with STORE.lock:
            b = STORE.builds.get(bid)
        if b is None or b["template"] != tid:
            return self.api_error(404, "build '%s' not found" % bid)
        steps = (data or {}).get("steps") or []
        t = lambda: rfc3339(now_utc())
        logs = [{"timestamp": t(), "level": "info", "message": "Building template %s/%s" % (tid, bid)}]
        failed = None
        for i, st in enumerate(steps, 1):
            logs.append({"timestamp": t(), "level": "info", "message": "[builder %d/%d] %s %s" % (i, len(steps), st.get("type"), " ".join(st.get("args") or [])), "step": str(i)})
            cmd = (st.get("args") or [""])[0]
            if st.get("type") == "RUN" and ("exit 3" in cmd or cmd == "false"):
                failed = i
                break
        with STORE.lock:
            b.update(status="building", logs=logs, failed=failed)
        self.send_empty(202)

    def api_template_status(self, data, tid, bid):
        with STORE.lock:
            b = STORE.builds.get(bid)
            if b is None or b["template"] != tid:
                return self.api_error(404, "build '%s' not found" % bid)
            b["polls"] += 1
            status = b["status"] if b["polls"] < 2 else ("error" if b.get("failed") else "ready")
            logs = b["logs"] if status != "building" else b["logs"][:1]
        offset = int(self.query.get("logsOffset", ["0"])[0] or 0)
        out = {"templateID": tid, "buildID": bid, "status": status, "logEntries": logs[offset:offset + 100], "logs": []}
        if status == "error":
            n = b["failed"]
            msg = "failed to run command: step %d exited with code 3" % n
            out["reason"] = {"message": msg, "step": str(n), "logEntries": logs[-2:]}
        self.send_json(200, out)

    def _not_found(self, sid):
        return self.api_error(404, "sandbox \"%s\" doesn't exist or you don't have access to it" % sid)

    def api_create(self, data):
        data = data or {}
        tmpl = data.get("templateID")
        if not tmpl:
            return self.api_error(400, "templateID is required")
        if tmpl == "missing-template":
            return self.api_error(404, "template 'missing-template' not found")
        timeout = int(data.get("timeout", 300))
        extra = {}
        for k in ("allow_internet_access", "network", "autoPause", "autoPauseMemory", "autoResume", "mcp", "volumeMounts", "secure", "iam"):
            if k in data:
                extra[k] = data[k]
        fs_source = None
        snap = STORE.snapshots.get(tmpl) or next((s for s in STORE.snapshots.values() if tmpl in s["names"]), None)
        if snap:
            fs_source = snap["fs_dir"]
        sb = Sandbox(tmpl, timeout, data.get("metadata"), data.get("envVars"), extra, fs_source=fs_source)
        with STORE.lock:
            STORE.sandboxes[sb.id] = sb
        self.send_json(201, sb.sandbox_json())

    def _list_filtered(self, states):
        md_filter = {}
        for raw in self.query.get("metadata", []):
            for k, v in urllib.parse.parse_qsl(raw, keep_blank_values=True):
                md_filter[urllib.parse.unquote(k)] = urllib.parse.unquote(v)
        with STORE.lock:
            items = sorted(STORE.sandboxes.values(), key=lambda s: s.started_at)
        out = []
        for s in items:
            if states and s.state not in states:
                continue
            if any(s.metadata.get(k) != v for k, v in md_filter.items()):
                continue
            tmpl = (self.query.get("template") or [None])[0]
            if tmpl and s.template_id != tmpl and s.alias != tmpl:
                continue
            out.append(s)
        order = (self.query.get("order") or ["asc"])[0]
        if order == "desc":
            out.reverse()
        return out

    def api_list(self, data):
        states = []
        for v in self.query.get("state", []):
            states.extend(x for x in v.split(",") if x)
        items = self._list_filtered(states or ["running", "paused"])
        start = int((self.query.get("nextToken") or ["0"])[0] or 0)
        limit = int((self.query.get("limit") or ["100"])[0] or 100)
        page = items[start : start + limit]
        headers = {"X-Total-Running": str(sum(1 for s in items if s.state == "running"))}
        if start + limit < len(items):
            headers["X-Next-Token"] = str(start + limit)
        self.send_json(200, [s.listed_json() for s in page], headers)

    def api_list_v1(self, data):
        items = self._list_filtered(["running"])
        self.send_json(200, [s.listed_json() for s in items])

    def api_get(self, data, sid):
        sb = STORE.get(sid)
        if not sb:
            return self._not_found(sid)
        self.send_json(200, sb.detail_json())

    def api_kill(self, data, sid):
        with STORE.lock:
            sb = STORE.sandboxes.pop(sid, None)
        if not sb:
            return self._not_found(sid)
        sb.kill_all()
        self.send_empty(204)

    def api_timeout(self, data, sid):
        sb = STORE.get(sid)
        if not sb:
            return self._not_found(sid)
        t = int((data or {}).get("timeout", 0))
        sb.end_at = now_utc() + datetime.timedelta(seconds=t)
        sb.timeout = t
        self.send_empty(204)

    def api_refresh(self, data, sid):
        sb = STORE.get(sid)
        if not sb:
            return self._not_found(sid)
        d = int((data or {}).get("duration", 60))
        sb.end_at = max(sb.end_at, now_utc() + datetime.timedelta(seconds=d))
        self.send_empty(204)

    def api_pause(self, data, sid):
        sb = STORE.get(sid)
        if not sb:
            return self._not_found(sid)
        if sb.state == "paused":
            return self.api_error(409, "Sandbox %s is already paused" % sid)
        sb.kill_all()
        sb.state = "paused"
        sb.extra["pauseMemory"] = (data or {}).get("memory", True)
        self.send_empty(204)

    def _resume(self, sb, timeout):
        if timeout is None:
            timeout = 300
        sb.gone = False
        sb.state = "running"
        sb.end_at = now_utc() + datetime.timedelta(seconds=timeout)

    def api_resume(self, data, sid):
        sb = STORE.get(sid)
        if not sb:
            return self._not_found(sid)
        if sb.state == "running":
            return self.api_error(409, "Sandbox %s is already running" % sid)
        self._resume(sb, (data or {}).get("timeout", 15))
        self.send_json(201, sb.sandbox_json())

    def api_connect(self, data, sid):
        sb = STORE.get(sid)
        if not sb:
            return self._not_found(sid)
        data = data or {}
        timeout = data.get("timeout")
        if sb.state == "paused":
            self._resume(sb, timeout)
            return self.send_json(201, sb.sandbox_json())
        if timeout is not None:
            new_end = now_utc() + datetime.timedelta(seconds=int(timeout))
            if new_end > sb.end_at:
                sb.end_at = new_end
        self.send_json(200, sb.sandbox_json())

    def api_fork(self, data, sid):
        sb = STORE.get(sid)
        if not sb:
            return self._not_found(sid)
        if sb.state != "running":
            return self.api_error(409, "Sandbox %s is not running" % sid)
        data = data or {}
        count = int(data.get("count", 1))
        timeout = int(data.get("timeout", 15))
        results = []
        for _ in range(count):
            child = Sandbox(sb.template_id, timeout, dict(sb.metadata), dict(sb.env_vars), dict(sb.extra), fs_source=sb.fs_root)
            with STORE.lock:
                STORE.sandboxes[child.id] = child
            results.append({"sandbox": child.sandbox_json()})
        self.send_json(201, results)

    def api_snapshot(self, data, sid):
        sb = STORE.get(sid)
        if not sb:
            return self._not_found(sid)
        data = data or {}
        name = data.get("name")
        raw_id = "snap_" + rand_id(12)
        snap_id = ("team-recorder/%s:default" % name) if name else raw_id + ":default"
        names = ["team-recorder/%s:default" % name] if name else []
        fs_dir = os.path.join(CFG.root, "snapshots", raw_id)
        shutil.copytree(sb.fs_root, fs_dir, symlinks=True)
        with STORE.lock:
            STORE.snapshots[snap_id] = {
                "snapshotID": snap_id,
                "names": names,
                "fs_dir": fs_dir,
                "sandbox_id": sid,
                "raw_id": raw_id,
                "memory": data.get("memory", True),
            }
        self.send_json(201, {"snapshotID": snap_id, "names": names})

    def api_list_snapshots(self, data):
        sid = (self.query.get("sandboxID") or [None])[0]
        name = (self.query.get("name") or [None])[0]
        with STORE.lock:
            snaps = list(STORE.snapshots.values())
        out = [
            {"snapshotID": s["snapshotID"], "names": s["names"]}
            for s in snaps
            if (not sid or s["sandbox_id"] == sid) and (not name or name in s["names"] or name == s["snapshotID"])
        ]
        start = int((self.query.get("nextToken") or ["0"])[0] or 0)
        limit = int((self.query.get("limit") or ["100"])[0] or 100)
        headers = {}
        if start + limit < len(out):
            headers["X-Next-Token"] = str(start + limit)
        self.send_json(200, out[start : start + limit], headers)

    def api_delete_template(self, data, tid):
        with STORE.lock:
            key = tid if tid in STORE.snapshots else next(
                (k for k, s in STORE.snapshots.items() if s["raw_id"] == tid or tid in s["names"]), None
            )
            snap = STORE.snapshots.pop(key, None) if key else None
        if not snap:
            return self.api_error(404, "template '%s' not found" % tid)
        shutil.rmtree(snap["fs_dir"], ignore_errors=True)
        self.send_empty(204)

    def api_network(self, data, sid):
        sb = STORE.get(sid)
        if not sb:
            return self._not_found(sid)
        sb.extra["network"] = {k: v for k, v in (data or {}).items() if k != "allow_internet_access"}
        if "allow_internet_access" in (data or {}):
            sb.extra["allow_internet_access"] = data["allow_internet_access"]
        self.send_empty(204)

    def api_metrics(self, data, sid):
        sb = STORE.get(sid)
        if not sb:
            return self._not_found(sid)
        t = now_utc()
        self.send_json(
            200,
            [
                {
                    "cpuCount": 2,
                    "cpuUsedPct": 1.5,
                    "diskTotal": 2147483648,
                    "diskUsed": 104857600,
                    "memCache": 1048576,
                    "memTotal": 536870912,
                    "memUsed": 67108864,
                    "timestamp": rfc3339(t),
                    "timestampUnix": int(t.timestamp()),
                }
            ],
        )

    # -- envd -------------------------------------------------------------

    def proxy_not_found(self, sid):
        # what the sandbox proxy in front of envd answers for an unknown/stopped sandbox
        self.send_json(502, {"sandboxId": sid or "", "message": "The sandbox was not found"}, ctype="application/json; charset=utf-8")

    def handle_envd(self, sid):
        sb = STORE.get(sid) if sid else None
        p = self.req_path
        if sb is None or sb.state != "running":
            self.read_body()
            return self.proxy_not_found(sid)
        self.sandbox = sb
        public = (self.command, p) in (("GET", "/health"), ("GET", "/files"), ("POST", "/files"))
        token = self.headers.get("X-Access-Token")
        if token != sb.envd_token and not public:
            self.read_body()
            return self.send_json(401, {"code": 401, "message": "unauthorized access, please provide a valid access token or method signing if supported"})
        if p == "/health":
            self.read_body()
            return self.send_empty(204)
        if p == "/files":
            return self.envd_files()
        if p == "/envs":
            self.read_body()
            return self.send_json(200, sb.env_vars)
        if p == "/metrics":
            self.read_body()
            return self.send_json(200, {"ts": int(time.time()), "cpu_count": 2, "cpu_used_pct": 1.0, "mem_total": 536870912, "mem_used": 67108864, "disk_used": 104857600, "disk_total": 2147483648})
        if p.startswith("/process.Process/") or p.startswith("/filesystem.Filesystem/"):
            return self.envd_rpc(p.split("/", 2)[2] if p.count("/") >= 2 else "", p)
        self.read_body()
        self.send_json(404, {"code": 404, "message": "not found"})

    def resolve_user(self):
        auth = self.headers.get("Authorization")
        if auth and auth.startswith("Basic "):
            try:
                return base64.b64decode(auth[6:]).decode().split(":", 1)[0]
            except Exception:
                return None
        return None

    def check_signature(self, op):
        """Signed URLs (download_url/upload_url) when no X-Access-Token is sent."""
        if self.headers.get("X-Access-Token"):
            if self.headers.get("X-Access-Token") != self.sandbox.envd_token:
                return "access token present in header but does not match"
            return None
        sig = (self.query.get("signature") or [None])[0]
        if sig is None:
            return "missing signature query parameter"
        path = (self.query.get("path") or [""])[0]
        user = (self.query.get("username") or [""])[0]
        exp = (self.query.get("signature_expiration") or [None])[0]
        raw = "%s:%s:%s:%s" % (path, op, user, self.sandbox.envd_token)
        if exp is not None:
            raw += ":" + exp
        want = "v1_" + base64.b64encode(hashlib.sha256(raw.encode()).digest()).rstrip(b"=").decode()
        if want != sig:
            return "invalid signature"
        if exp is not None and int(exp) < time.time():
            return "signature is already expired"
        return None

    def envd_files(self):
        sb = self.sandbox
        path = (self.query.get("path") or [None])[0]
        if self.command == "GET":
            self.read_body()
            err = self.check_signature("read")
            if err:
                return self.send_json(401, {"code": 401, "message": err})
            host = sb.host_path(path)
            if not os.path.exists(host):
                return self.send_json(404, {"code": 404, "message": "path '%s' does not exist" % sb.sandbox_path(host)})
            if os.path.isdir(host):
                return self.send_json(400, {"code": 400, "message": "path '%s' is a directory" % sb.sandbox_path(host)})
            with open(host, "rb") as f:
                data = f.read()
            ctype = mimetypes.guess_type(host)[0] or "application/octet-stream"
            extra = {"Vary": "Accept-Encoding", "Last-Modified": email.utils.formatdate(os.path.getmtime(host), usegmt=True)}
            if accepts_gzip(self.headers.get("Accept-Encoding")):
                gz = gzip.compress(data)
                extra["Content-Encoding"] = "gzip"
                return self.send_raw(200, gz, ctype, extra, log_body={"kind": "gzip", "compressed_length": len(gz), "decompressed": decode_bytes(data)})
            return self.send_raw(200, data, ctype, extra)
        if self.command == "POST":
            body = self.read_body()
            err = self.check_signature("write")
            if err:
                return self.send_json(401, {"code": 401, "message": err})
            if (self.headers.get("Content-Encoding") or "").lower() == "gzip":
                raw_body = body
                body = gzip.decompress(body)
                self.req_body_log = {"kind": "gzip", "compressed_length": len(raw_body), "decompressed": decode_body(body, self.headers.get("Content-Type"))}
            ctype = (self.headers.get("Content-Type") or "").lower()
            written = []
            if ctype.startswith("application/octet-stream"):
                if not path:
                    return self.send_json(400, {"code": 400, "message": "path query parameter is required for raw body upload"})
                items = [(path, body)]
            elif ctype.startswith("multipart/"):
                parts = parse_multipart(body, self.headers.get("Content-Type")) or []
                items = []
                for part in parts:
                    if part["name"] != "file":
                        continue
                    items.append((path if path else part["filename"], part["data"]))
            else:
                return self.send_json(400, {"code": 400, "message": "unsupported content type: %s, expected multipart/form-data or application/octet-stream" % ctype})
            metadata = {}
            for k, v in self.headers.items():
                if k.lower().startswith("x-metadata-") and k[len("x-metadata-"):].lower() not in metadata:
                    metadata[k[len("x-metadata-"):].lower()] = v
            for pth, data in items:
                host = sb.host_path(pth)
                if os.path.isdir(host):
                    return self.send_json(400, {"code": 400, "message": "path is a directory: %s" % sb.sandbox_path(host)})
                os.makedirs(os.path.dirname(host), exist_ok=True)
                with open(host, "wb") as f:
                    f.write(data)
                # each upload replaces the file's metadata (none sent: cleared)
                if metadata:
                    sb.file_metadata[sb.sandbox_path(host)] = dict(metadata)
                else:
                    sb.file_metadata.pop(sb.sandbox_path(host), None)
                written.append({"path": sb.sandbox_path(host), "name": os.path.basename(host), "type": "file"})
            return self.send_json(200, written)
        self.read_body()
        self.send_json(405, {"code": 405, "message": "method not allowed"})

    # -- Connect RPC ------------------------------------------------------

    def envd_rpc(self, method, full_path):
        ctype = (self.headers.get("Content-Type") or "").lower()
        streaming = ctype.startswith("application/connect+")
        service, _, name = full_path.strip("/").partition("/")
        key = service + "/" + name
        if key == "process.Process/StreamInput":
            return self.rpc_stream_input()
        body = self.read_body()
        if streaming:
            frames = decode_frames(body)["frames"]
            req = frames[0].get("json") if frames else {}
        else:
            try:
                req = json.loads(body) if body else {}
            except ValueError:
                return self.send_json(400, {"code": "invalid_argument", "message": "bad json"})
        unary = {
            "process.Process/List": self.rpc_list,
            "process.Process/SendInput": self.rpc_send_input,
            "process.Process/SendSignal": self.rpc_send_signal,
            "process.Process/CloseStdin": self.rpc_close_stdin,
            "process.Process/Update": self.rpc_update,
            "filesystem.Filesystem/Stat": self.rpc_stat,
            "filesystem.Filesystem/MakeDir": self.rpc_make_dir,
            "filesystem.Filesystem/Move": self.rpc_move,
            "filesystem.Filesystem/ListDir": self.rpc_list_dir,
            "filesystem.Filesystem/Remove": self.rpc_remove,
            "filesystem.Filesystem/CreateWatcher": self.rpc_create_watcher,
            "filesystem.Filesystem/GetWatcherEvents": self.rpc_get_watcher_events,
            "filesystem.Filesystem/RemoveWatcher": self.rpc_remove_watcher,
        }
        streams = {
            "process.Process/Start": self.rpc_start,
            "process.Process/Connect": self.rpc_connect,
            "filesystem.Filesystem/WatchDir": self.rpc_watch_dir,
        }
        if key in streams:
            return streams[key](req or {})
        if key in unary:
            try:
                res = unary[key](req or {})
            except RpcError as e:
                return self.send_json(CONNECT_HTTP_STATUS.get(e.code, 500), {"code": e.code, "message": e.message})
            return self.send_json(200, res)
        return self.send_json(501, {"code": "unimplemented", "message": "%s is not implemented" % full_path})

    def _timeout_s(self):
        v = self.headers.get("Connect-Timeout-Ms")
        return int(v) / 1000.0 if v else None

    def _keepalive_s(self):
        if CFG.keepalive_override:
            return CFG.keepalive_override
        v = self.headers.get("Keepalive-Ping-Interval")
        return int(v) if v else None

    def _get_proc(self, selector):
        selector = selector or {}
        with self.sandbox.lock:
            if "pid" in selector:
                p = self.sandbox.processes.get(int(selector["pid"]))
                if p is None:
                    raise RpcError("not_found", "process with pid %s not found" % selector["pid"])
                return p
            if "tag" in selector:
                for p in self.sandbox.processes.values():
                    if p.tag == selector["tag"]:
                        return p
                raise RpcError("not_found", "process with tag %s not found" % selector["tag"])
        raise RpcError("unimplemented", "invalid input type <nil>")

    def _pump_process(self, proc, q, deadline):
        """Relay a process's events; the stream ends with its end event."""
        keepalive = self._keepalive_s()
        last = time.time()
        while True:
            if deadline and time.time() >= deadline:
                self.unsub(proc, q)
                return self.stream_end(RpcError("deadline_exceeded", "context deadline exceeded"))
            try:
                ev = q.get(timeout=0.1)
            except queue.Empty:
                if self.client_gone():
                    self.unsub(proc, q)
                    self.note = (self.note or "") + " client closed the stream (process keeps running)"
                    return
                if keepalive and time.time() - last >= keepalive:
                    self.stream_send({"event": {"keepalive": {}}})
                    last = time.time()
                continue
            if self.sandbox.gone:
                self.unsub(proc, q)
                if self.client_gone():
                    self.note = (self.note or "") + " client closed the stream"
                    return
                # what a sandbox that is killed or paused under an open stream answers
                return self.stream_end(RpcError("unavailable", "The sandbox was not found"))
            if ev is None:
                self.unsub(proc, q)
                if proc.killed_by_timeout:
                    return self.stream_end(RpcError("deadline_exceeded", "context deadline exceeded"))
                return self.stream_end()
            try:
                self.stream_send({"event": ev})
            except (BrokenPipeError, ConnectionResetError):
                self.unsub(proc, q)
                self.note = (self.note or "") + " client closed the stream (process keeps running)"
                return
            last = time.time()

    def unsub(self, proc, q):
        proc.unsubscribe(q)

    def rpc_start(self, req):
        cfg = req.get("process") or {}
        pty = req.get("pty")
        pty_size = None
        if pty is not None:
            size = pty.get("size") or {}
            pty_size = (int(size.get("cols", 80)), int(size.get("rows", 24)))
        timeout = self._timeout_s()
        self.stream_begin()
        q = queue.Queue()
        try:
            proc = Proc(self.sandbox, cfg, req.get("tag"), req.get("stdin", True), pty_size, timeout, first_subscriber=q)
        except RpcError as e:
            return self.stream_end(e)
        except OSError as e:
            return self.stream_end(RpcError("invalid_argument", "error starting process '%s': %s" % (cfg.get("cmd"), e)))
        with self.sandbox.lock:
            self.sandbox.processes[proc.pid] = proc
        self.stream_send({"event": {"start": {"pid": proc.pid}}})
        deadline = time.time() + timeout if timeout else None
        self._pump_process(proc, q, deadline)

    def rpc_connect(self, req):
        timeout = self._timeout_s()
        self.stream_begin()
        try:
            proc = self._get_proc(req.get("process"))
        except RpcError as e:
            return self.stream_end(e)
        q = proc.subscribe()
        self.stream_send({"event": {"start": {"pid": proc.pid}}})
        deadline = time.time() + timeout if timeout else None
        self._pump_process(proc, q, deadline)

    def rpc_list(self, req):
        with self.sandbox.lock:
            procs = [p.info() for p in self.sandbox.processes.values() if p.end is None]
        return {"processes": procs} if procs else {}

    def rpc_send_input(self, req):
        proc = self._get_proc(req.get("process"))
        inp = req.get("input") or {}
        if "pty" in inp:
            proc.write_pty(base64.b64decode(inp["pty"]))
        elif "stdin" in inp:
            proc.write_stdin(base64.b64decode(inp["stdin"]))
        return {}

    def rpc_stream_input(self):
        """Client stream: frames arrive as the body does; answer once at its end."""
        frames = []
        self.req_body_log = {"kind": "connect-frames", "frames": frames}
        buf = b""
        proc = None
        error = None
        for chunk in self.iter_body():
            buf += chunk
            while len(buf) >= 5:
                flags = buf[0]
                (n,) = struct.unpack(">I", buf[1:5])
                if len(buf) < 5 + n:
                    break
                payload, buf = buf[5 : 5 + n], buf[5 + n :]
                rec = frame_record(flags, payload)
                rec["t_ms"] = int((time.time() - self.t0) * 1000)
                frames.append(rec)
                msg = rec.get("json") or {}
                if error:
                    continue
                try:
                    if "start" in msg:
                        proc = self._get_proc((msg["start"] or {}).get("process"))
                    elif "data" in msg:
                        if proc is None:
                            raise RpcError("failed_precondition", "first message must be a start event")
                        inp = (msg["data"] or {}).get("input") or {}
                        if "pty" in inp:
                            proc.write_pty(base64.b64decode(inp["pty"]))
                        elif "stdin" in inp:
                            proc.write_stdin(base64.b64decode(inp["stdin"]))
                except RpcError as e:
                    error = e
        self.stream_begin()
        if error:
            return self.stream_end(error)
        self.stream_send({})
        self.stream_end()

    def rpc_send_signal(self, req):
        proc = self._get_proc(req.get("process"))
        sig = req.get("signal")
        signum = {"SIGNAL_SIGKILL": signal.SIGKILL, "SIGNAL_SIGTERM": signal.SIGTERM, 9: signal.SIGKILL, 15: signal.SIGTERM}.get(sig)
        if signum is None:
            raise RpcError("invalid_argument", "invalid signal: %s" % sig)
        proc.signal(signum)
        return {}

    def rpc_close_stdin(self, req):
        proc = self._get_proc(req.get("process"))
        proc.close_stdin()
        return {}

    def rpc_update(self, req):
        proc = self._get_proc(req.get("process"))
        pty = req.get("pty")
        if pty is not None:
            if proc.pty_master is None:
                raise RpcError("internal", "tty not assigned to process")
            import fcntl
            import termios

            size = pty.get("size") or {}
            fcntl.ioctl(proc.pty_master, termios.TIOCSWINSZ, struct.pack("HHHH", int(size.get("rows", 24)), int(size.get("cols", 80)), 0, 0))
        return {}

    def rpc_stat(self, req):
        host = self.sandbox.host_path(req.get("path"))
        return {"entry": entry_info(self.sandbox, host)}

    def rpc_make_dir(self, req):
        host = self.sandbox.host_path(req.get("path"))
        if os.path.exists(host):
            if os.path.isdir(host):
                raise RpcError("already_exists", "directory already exists: %s" % self.sandbox.sandbox_path(host))
            raise RpcError("invalid_argument", "path already exists but it is not a directory: %s" % self.sandbox.sandbox_path(host))
        os.makedirs(host)
        return {"entry": entry_info(self.sandbox, host)}

    def rpc_move(self, req):
        src = self.sandbox.host_path(req.get("source"))
        dst = self.sandbox.host_path(req.get("destination"))
        if not os.path.lexists(src):
            raise RpcError("not_found", "source file not found: %s" % self.sandbox.sandbox_path(src))
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        os.rename(src, dst)
        return {"entry": entry_info(self.sandbox, dst)}

    def rpc_list_dir(self, req):
        host = self.sandbox.host_path(req.get("path"))
        depth = int(req.get("depth") or 1)
        if not os.path.exists(host):
            raise RpcError("not_found", "directory not found: %s" % self.sandbox.sandbox_path(host))
        if not os.path.isdir(host):
            raise RpcError("invalid_argument", "path is not a directory: %s" % self.sandbox.sandbox_path(host))
        entries = []

        def walk(d, level):
            for name in sorted(os.listdir(d)):
                full = os.path.join(d, name)
                entries.append(entry_info(self.sandbox, full))
                if level < depth and os.path.isdir(full) and not os.path.islink(full):
                    walk(full, level + 1)

        walk(host, 1)
        return {"entries": entries} if entries else {}

    def rpc_remove(self, req):
        host = self.sandbox.host_path(req.get("path"))
        if not os.path.lexists(host):
            raise RpcError("not_found", "file not found: %s" % self.sandbox.sandbox_path(host))
        if os.path.isdir(host) and not os.path.islink(host):
            shutil.rmtree(host)
        else:
            os.remove(host)
        return {}

    def _new_watcher(self, req):
        path = req.get("path")
        host = self.sandbox.host_path(path)
        if not os.path.exists(host):
            raise RpcError("not_found", "path %s not found: stat %s: no such file or directory" % (self.sandbox.sandbox_path(host), self.sandbox.sandbox_path(host)))
        if not os.path.isdir(host):
            raise RpcError("invalid_argument", "path %s not a directory: <nil>" % self.sandbox.sandbox_path(host))
        return Watcher(self.sandbox, self.sandbox.sandbox_path(host), bool(req.get("recursive")), bool(req.get("includeEntry")))

    def rpc_watch_dir(self, req):
        timeout = self._timeout_s()
        self.stream_begin()
        try:
            w = self._new_watcher(req)
        except RpcError as e:
            return self.stream_end(e)
        wid = "stream-" + rand_id(8)
        with self.sandbox.lock:
            self.sandbox.watchers[wid] = w
        self.stream_send({"start": {}})
        deadline = time.time() + timeout if timeout else None
        keepalive = self._keepalive_s()
        last = time.time()
        try:
            while True:
                if deadline and time.time() >= deadline:
                    return self.stream_end(RpcError("deadline_exceeded", "context deadline exceeded"))
                try:
                    ev = w.events.get(timeout=0.1)
                except queue.Empty:
                    if self.client_gone():
                        self.note = (self.note or "") + " client closed the watch stream"
                        return
                    if keepalive and time.time() - last >= keepalive:
                        self.stream_send({"keepalive": {}})
                        last = time.time()
                    continue
                if ev is None:
                    if self.client_gone():
                        self.note = (self.note or "") + " client closed the watch stream"
                        return
                    return self.stream_end(RpcError("unavailable", "The sandbox was not found"))
                self.stream_send({"filesystem": ev})
                last = time.time()
        finally:
            w.close()
            with self.sandbox.lock:
                self.sandbox.watchers.pop(wid, None)

    def rpc_create_watcher(self, req):
        w = self._new_watcher(req)
        wid = rand_id(12)
        with self.sandbox.lock:
            self.sandbox.watchers[wid] = w
        return {"watcherId": wid}

    def rpc_get_watcher_events(self, req):
        wid = req.get("watcherId")
        with self.sandbox.lock:
            w = self.sandbox.watchers.get(wid)
        if w is None:
            raise RpcError("not_found", "watcher with id %s not found" % wid)
        time.sleep(0.05)
        evs, w.buffer = w.buffer, []
        return {"events": evs} if evs else {}

    def rpc_remove_watcher(self, req):
        wid = req.get("watcherId")
        with self.sandbox.lock:
            w = self.sandbox.watchers.pop(wid, None)
        if w is None:
            raise RpcError("not_found", "watcher with id %s not found" % wid)
        w.close()
        return {}


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request, client_address):
        if isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
            return  # a client dropping a kept-alive connection
        super().handle_error(request, client_address)

    def __init__(self, addr, role):
        self.role = role
        super().__init__(addr, Handler)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--api-port", type=int, default=3000)
    ap.add_argument("--envd-port", type=int, default=49983)
    ap.add_argument("--log", help="JSON-lines file the exchanges are appended to")
    ap.add_argument("--api-key", default=os.environ.get("E2B_API_KEY", "e2b_recorder_test_key"))
    ap.add_argument("--envd-version", default="0.6.4")
    ap.add_argument("--domain", default=None, help="`domain` reported for sandboxes (null when unset)")
    ap.add_argument("--root", default="/tmp/e2b-recorder", help="where the fake sandboxes' files live")
    ap.add_argument("--keepalive", type=float, default=None, help="send keepalive events this often (s), whatever the client asked")
    ap.add_argument("--ready-file", help="touch this file once listening")
    a = ap.parse_args()
    if a.host not in ("127.0.0.1", "::1", "localhost"):
        ap.error("the recorder listens on loopback only")
    CFG.api_key = a.api_key
    CFG.envd_version = a.envd_version
    CFG.root = a.root
    CFG.domain = a.domain
    CFG.log = a.log
    CFG.keepalive_override = a.keepalive
    os.makedirs(CFG.root, exist_ok=True)
    servers = [Server((a.host, a.api_port), "api")]
    if a.envd_port != a.api_port:
        servers.append(Server((a.host, a.envd_port), "envd"))
    for s in servers:
        threading.Thread(target=s.serve_forever, daemon=True).start()
    threading.Thread(target=STORE.reap, daemon=True).start()
    if a.ready_file:
        open(a.ready_file, "w").close()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    with STORE.lock:
        sbs = list(STORE.sandboxes.values())
    for sb in sbs:
        sb.kill_all()
    for s in servers:
        s.shutdown()


if __name__ == "__main__":
    main()
