#!/usr/bin/env python3
"""Recording stand-in for the Tensorlake sandbox API, written for loopback use only.

It serves the two HTTP surfaces the Tensorlake SDKs talk to -- the lifecycle API
(`/v1/namespaces/{ns}/sandboxes`, or `/sandboxes` for non-localhost API URLs) and the
per-sandbox data plane (`/api/v1/...`, including the PTY WebSocket) -- from one port.
Every request is appended as one JSON line to the log file together with the response
that was served, so the SDKs' wire format can be kept as fixtures.

The state is a small in-memory model good enough for the SDKs to walk through whole
scenarios: sandboxes move pending -> running, suspend/resume and snapshots complete
after a poll or two, processes are emulated for a handful of commands (echo, cat,
sleep, true/false, `sh -c` scripts made of `echo`, `>&2` and `exit N`), files live in
a dict, and a PTY session echoes its input.

Standard library only. Usage:
    recorder.py --port 0 --port-file P --log out.jsonl [--slow-start]
                [--sandbox-url-template 'http://localhost:{port}']

Keys: any bearer token is accepted except `sandfork-bad-key` (answered 401) and
`sandfork-forbidden-key` (answered 403). Ids that start with `missing` are unknown (404).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import re
import shlex
import socket
import struct
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl, unquote, urlsplit

BAD_KEY = "sandfork-bad-key"
FORBIDDEN_KEY = "sandfork-forbidden-key"
WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


def now_ms() -> int:
    return int(time.time() * 1000)


class Log:
    def __init__(self, path: str, api_key: str | None):
        self.path = path
        self.api_key = api_key
        self.lock = threading.Lock()
        self.seq = 0
        open(path, "w").close()

    def redact(self, value: str) -> str:
        if self.api_key and self.api_key in value:
            value = value.replace(self.api_key, "<API_KEY>")
        return value

    def write(self, record: dict) -> None:
        with self.lock:
            self.seq += 1
            record = {"seq": self.seq, "t_ms": now_ms(), **record}
            with open(self.path, "a") as f:
                f.write(json.dumps(record, sort_keys=False) + "\n")


def body_for_log(raw: bytes, content_type: str | None):
    if not raw:
        return None
    if content_type and "json" in content_type:
        try:
            return {"json": json.loads(raw)}
        except ValueError:
            pass
    try:
        text = raw.decode("utf-8")
        if content_type and "json" not in content_type or not content_type:
            try:
                return {"json": json.loads(text)} if text.lstrip()[:1] in "{[" else {"text": text}
            except ValueError:
                return {"text": text}
        return {"text": text}
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(raw).decode()}


class Proc:
    def __init__(self, pid: int, payload: dict):
        self.pid = pid
        self.payload = payload
        self.command = payload.get("command", "")
        self.args = list(payload.get("args") or [])
        self.name = payload.get("name")
        self.status = "running"
        self.exit_code: int | None = None
        self.signal: int | None = None
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        self.events: list[dict] = []  # output events in order
        self.stdin_open = payload.get("stdin_mode") == "pipe"
        self.stdin_buf = ""
        self.started_at = now_ms()
        self.ended_at: int | None = None
        self.cond = threading.Condition()

    def emit(self, stream: str, line: str) -> None:
        with self.cond:
            (self.stdout if stream == "stdout" else self.stderr).append(line)
            self.events.append({"line": line, "timestamp": now_ms(), "stream": stream})
            self.cond.notify_all()

    def finish(self, exit_code: int | None = None, signal: int | None = None) -> None:
        with self.cond:
            if self.status != "running":
                return
            self.exit_code = exit_code
            self.signal = signal
            self.status = "exited" if signal is None else "signaled"
            self.ended_at = now_ms()
            self.stdin_open = False
            self.cond.notify_all()

    def info(self) -> dict:
        d = {
            "pid": self.pid,
            "status": self.status,
            "exit_code": self.exit_code,
            "signal": self.signal,
            "stdin_writable": self.stdin_open,
            "command": self.command,
            "args": self.args,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
        }
        return d


def run_script(proc: Proc) -> None:
    """Emulate the few commands the scenarios use; finishes the process unless it
    is one that stays running (cat with a stdin pipe, sleep)."""
    cmd, args = proc.command, proc.args
    if cmd in ("sh", "bash", "/bin/sh", "/bin/bash") and len(args) >= 2 and args[0] == "-c":
        code = 0
        for part in args[1].split(";"):
            part = part.strip()
            if not part:
                continue
            to_err = part.endswith(">&2")
            if to_err:
                part = part[:-3].strip()
            words = shlex.split(part)
            if not words:
                continue
            if words[0] == "echo":
                proc.emit("stderr" if to_err else "stdout", " ".join(words[1:]))
            elif words[0] == "exit":
                code = int(words[1]) if len(words) > 1 else 0
                break
            elif words[0] == "sleep":
                time.sleep(min(float(words[1]), 2.0))
            elif words[0] == "false":
                code = 1
            elif words[0] == "true":
                code = 0
        proc.finish(exit_code=code)
    elif cmd == "echo":
        proc.emit("stdout", " ".join(args))
        proc.finish(exit_code=0)
    elif cmd == "true":
        proc.finish(exit_code=0)
    elif cmd == "false":
        proc.finish(exit_code=1)
    elif cmd == "cat" and proc.stdin_open:
        return  # finishes on stdin close
    elif cmd == "sleep":
        return  # finishes on a signal or kill
    elif cmd == "ls":
        proc.emit("stdout", "bin")
        proc.finish(exit_code=0)
    else:
        proc.emit("stderr", f"{cmd}: command not found")
        proc.finish(exit_code=127)


class State:
    def __init__(self, args):
        self.args = args
        self.lock = threading.RLock()
        self.counter = 0
        self.sandboxes: dict[str, dict] = {}
        self.snapshots: dict[str, dict] = {}
        self.pools: dict[str, dict] = {}
        self.procs: dict[str, dict[int, Proc]] = {}
        self.files: dict[str, dict[str, bytes]] = {}
        self.ptys: dict[str, dict] = {}
        self.next_pid = 100

    def new_id(self, prefix: str) -> str:
        with self.lock:
            self.counter += 1
            return f"{prefix}{self.counter:04d}"

    def sandbox_url(self, sid: str) -> str:
        return self.args.sandbox_url_template.format(id=sid, port=self.args.bound_port)

    def resolve_sandbox(self, ident: str) -> dict | None:
        sb = self.sandboxes.get(ident)
        if sb is None:
            for cand in self.sandboxes.values():
                if cand.get("name") == ident and cand["status"] != "terminated":
                    return cand
        return sb

    def make_sandbox(self, body: dict, *, pool_id: str | None = None,
                     from_snapshot: dict | None = None) -> dict:
        sid = self.new_id("sbx")
        res = dict(body.get("resources") or {})
        if from_snapshot is not None:
            base = self.sandboxes.get(from_snapshot["sandbox_id"], {})
            for k, v in (base.get("resources") or {}).items():
                res.setdefault(k, v)
        cpus = res.get("cpus") or 1.0
        mem = res.get("memory_mb") or 1024
        disk = res.get("disk_mb") or 10240
        slow = self.args.slow_start and body.get("wait") is not False or body.get("wait") is False
        sb = {
            "id": sid,
            "namespace": "default",
            "status": "pending" if slow else "running",
            "pending_reason": "scheduling" if slow else None,
            "image": body.get("image") or (from_snapshot or {}).get("base_image") or "tensorlake/ubuntu-minimal",
            "resources": {"cpus": float(cpus), "memory_mb": int(mem), "disk_mb": int(disk),
                          "ephemeral_disk_mb": int(disk)},
            "timeout_secs": body.get("timeout_secs") or 0,
            "entrypoint": body.get("entrypoint"),
            "network_policy": body.get("network"),
            "pool_id": pool_id,
            "outcome": None,
            "termination_reason": None,
            "error_details": None,
            "created_at": now_ms(),
            "terminated_at": None,
            "name": body.get("name"),
            "allow_unauthenticated_access": bool(body.get("allow_unauthenticated_access") or False),
            "exposed_ports": body.get("exposed_ports") or [],
            "ingress_endpoint": None,
            "sandbox_url": None,
            "routing_hint": None,
            "file_systems": body.get("file_systems") or [],
            "auto_resume": body.get("auto_resume", True) if body.get("auto_resume") is not None else True,
            "_transition": ("running", 2) if slow else None,
        }
        if not slow:
            self.make_routable(sb)
        self.sandboxes[sid] = sb
        self.procs[sid] = {}
        self.files[sid] = {}
        if from_snapshot is not None:
            src_files = from_snapshot.get("_files") or {}
            self.files[sid] = dict(src_files)
        return sb

    def make_routable(self, sb: dict) -> None:
        sb["sandbox_url"] = self.sandbox_url(sb["id"])
        sb["routing_hint"] = "hint-" + sb["id"]
        sb["ingress_endpoint"] = None
        sb["pending_reason"] = None

    def public(self, obj: dict) -> dict:
        return {k: v for k, v in obj.items() if not k.startswith("_")}

    def tick(self, obj: dict, routable: bool = False) -> None:
        tr = obj.get("_transition")
        if not tr:
            return
        target, left = tr
        if left <= 1:
            obj["status"] = target
            obj["_transition"] = None
            if routable and target == "running":
                self.make_routable(obj)
            if routable and target != "running":
                obj["sandbox_url"] = None
                obj["routing_hint"] = None
        else:
            obj["_transition"] = (target, left - 1)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "tl-recorder/1"

    # ---------- plumbing ----------
    def log_message(self, fmt, *args):  # quiet
        if os.environ.get("RECORDER_VERBOSE"):
            sys.stderr.write("recorder: " + fmt % args + "\n")

    @property
    def st(self) -> State:
        return self.server.state  # type: ignore[attr-defined]

    @property
    def lg(self) -> Log:
        return self.server.log  # type: ignore[attr-defined]

    def read_body(self) -> bytes:
        n = int(self.headers.get("Content-Length") or 0)
        if n:
            return self.rfile.read(n)
        if (self.headers.get("Transfer-Encoding") or "").lower() == "chunked":
            out = b""
            while True:
                size = int(self.rfile.readline().strip().split(b";")[0], 16)
                if size == 0:
                    self.rfile.readline()
                    break
                out += self.rfile.read(size)
                self.rfile.readline()
            return out
        return b""

    def req_record(self, raw: bytes) -> dict:
        parts = urlsplit(self.path)
        headers = [[k, self.lg.redact(v)] for k, v in self.headers.items()]
        return {
            "method": self.command,
            "path": parts.path,
            "query": parse_qsl(parts.query, keep_blank_values=True),
            "headers": headers,
            "body": body_for_log(raw, self.headers.get("Content-Type")),
        }

    def send(self, status: int, obj=None, *, raw: bytes | None = None,
             content_type: str = "application/json", rec: dict | None = None) -> None:
        if obj is not None and self.st.args.minimal:
            obj = minimal(obj)
        if raw is None:
            raw = b"" if obj is None else json.dumps(obj).encode()
        self.send_response(status)
        hdrs = []
        if raw or content_type != "application/json":
            self.send_header("Content-Type", content_type)
            hdrs.append(["Content-Type", content_type])
        self.send_header("Content-Length", str(len(raw)))
        hdrs.append(["Content-Length", str(len(raw))])
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(raw)
        if rec is not None:
            rec["response"] = {"status": status, "headers": hdrs,
                               "body": body_for_log(raw, content_type)}
            self.lg.write(rec)

    def error(self, status: int, code: str, message: str, rec: dict) -> None:
        self.send(status, {"code": code, "message": message}, rec=rec)

    def start_sse(self, rec: dict) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        rec["response"] = {"status": 200, "headers": [["Content-Type", "text/event-stream"],
                                                      ["Cache-Control", "no-cache"],
                                                      ["Transfer-Encoding", "chunked"]],
                           "sse": []}

    def sse_event(self, rec: dict, data: dict | str, event: str | None = None) -> None:
        if not isinstance(data, str) and self.st.args.minimal:
            data = minimal(data)
        text = data if isinstance(data, str) else json.dumps(data)
        chunk = ""
        if event:
            chunk += f"event: {event}\n"
        chunk += f"data: {text}\n\n"
        b = chunk.encode()
        self.wfile.write(f"{len(b):x}\r\n".encode() + b + b"\r\n")
        self.wfile.flush()
        rec["response"]["sse"].append(chunk)

    def end_sse(self, rec: dict) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()
        self.lg.write(rec)

    # ---------- dispatch ----------
    def do_GET(self):
        self.dispatch()

    def do_POST(self):
        self.dispatch()

    def do_PUT(self):
        self.dispatch()

    def do_PATCH(self):
        self.dispatch()

    def do_DELETE(self):
        self.dispatch()

    def dispatch(self):
        raw = self.read_body()
        rec = self.req_record(raw)
        auth = self.headers.get("Authorization") or ""
        token = auth[7:] if auth.startswith("Bearer ") else None
        if token == BAD_KEY:
            return self.error(401, "unauthorized", "invalid API key", rec)
        if token == FORBIDDEN_KEY:
            return self.error(403, "forbidden", "this API key may not do that", rec)
        path = urlsplit(self.path).path
        try:
            body = json.loads(raw) if raw and (self.headers.get("Content-Type") or "").startswith("application/json") else None
        except ValueError:
            return self.error(400, "invalid_argument", "malformed JSON", rec)
        if path.startswith("/api/v1/"):
            return self.data_plane(path, raw, body, rec)
        m = re.match(r"^/v1/namespaces/([^/]+)(/.*)$", path)
        sub = m.group(2) if m else path
        return self.lifecycle(sub, body, rec)

    # ---------- lifecycle ----------
    def lifecycle(self, sub: str, body, rec):
        st, meth = self.st, self.command
        q = dict(parse_qsl(urlsplit(self.path).query))
        with st.lock:
            if sub == "/sandboxes" and meth == "POST":
                body = body or {}
                if body.get("name"):
                    for sb in st.sandboxes.values():
                        if sb.get("name") == body["name"] and sb["status"] != "terminated":
                            return self.error(409, "conflict", f"name {body['name']!r} is taken", rec)
                snap = None
                if body.get("snapshot_id"):
                    snap = st.snapshots.get(body["snapshot_id"])
                    if snap is None:
                        return self.error(404, "not_found", "snapshot not found", rec)
                sb = st.make_sandbox(body, from_snapshot=snap)
                resp = self.create_response(sb)
                return self.send(200, resp, rec=rec)
            if sub == "/sandboxes" and meth == "GET":
                for sb in st.sandboxes.values():
                    st.tick(sb, routable=True)
                return self.send(200, {"sandboxes": [st.public(s) for s in st.sandboxes.values()
                                                     if s["status"] != "terminated"]}, rec=rec)
            m = re.match(r"^/sandboxes/([^/]+)(/.*)?$", sub)
            if m:
                ident, rest = unquote(m.group(1)), m.group(2) or ""
                sb = None if ident.startswith("missing") else st.resolve_sandbox(ident)
                if sb is None:
                    return self.error(404, "not_found", f"sandbox {ident} not found", rec)
                sid = sb["id"]
                if rest == "" and meth == "GET":
                    st.tick(sb, routable=True)
                    return self.send(200, st.public(sb), rec=rec)
                if rest == "" and meth == "PATCH":
                    body = body or {}
                    for k in ("name", "allow_unauthenticated_access", "exposed_ports", "auto_resume"):
                        if k in body:
                            sb[k] = body[k]
                    if "network" in body:
                        sb["network_policy"] = body["network"]
                    if body.get("resources"):
                        sb["resources"].update({k: v for k, v in body["resources"].items() if v is not None})
                        if "disk_mb" in body["resources"]:
                            sb["resources"]["ephemeral_disk_mb"] = sb["resources"]["disk_mb"]
                        gen = (sb.get("resource_resize") or {}).get("generation", 0) + 1
                        sb["resource_resize"] = {"generation": gen, "requested": dict(sb["resources"]),
                                                 "status": "succeeded", "error_message": None}
                    return self.send(200, st.public(sb), rec=rec)
                if rest == "" and meth == "DELETE":
                    sb["status"] = "terminated"
                    sb["terminated_at"] = now_ms()
                    sb["termination_reason"] = "user_requested"
                    sb["sandbox_url"] = None
                    return self.send(200, {}, rec=rec)
                if rest == "/suspend" and meth == "POST":
                    if sb["status"] != "running":
                        return self.error(409, "conflict", f"sandbox is {sb['status']}", rec)
                    sb["status"] = "suspending"
                    sb["_transition"] = ("suspended", 2)
                    return self.send(202, {}, rec=rec)
                if rest == "/resume" and meth == "POST":
                    if sb["status"] not in ("suspended", "running"):
                        return self.error(409, "conflict", f"sandbox is {sb['status']}", rec)
                    if sb["status"] == "suspended":
                        sb["status"] = "pending"
                        sb["sandbox_url"] = None
                        sb["_transition"] = ("running", 2)
                    return self.send(202, {}, rec=rec)
                if rest == "/snapshot" and meth == "POST":
                    snap_id = st.new_id("snap")
                    stype = (body or {}).get("snapshot_type") or "memory"
                    st.snapshots[snap_id] = {
                        "id": snap_id, "namespace": "default", "sandbox_id": sid,
                        "base_image": sb["image"], "status": "in_progress",
                        "snapshot_type": stype, "error": None,
                        "snapshot_uri": f"file:///snapshots/{snap_id}",
                        "snapshot_format_version": "1", "size_bytes": None,
                        "rootfs_disk_bytes": None, "created_at": now_ms(),
                        "_transition": ("completed", 2), "_files": dict(st.files[sid]),
                    }
                    return self.send(200, {"snapshot_id": snap_id, "status": "in_progress"}, rec=rec)
                if rest == "/copy" and meth == "POST":
                    times = int(q.get("times", "1"))
                    out = []
                    for _ in range(times):
                        child = st.make_sandbox({"image": sb["image"], "resources": sb["resources"]})
                        child["_transition"] = None
                        child["status"] = "running"
                        st.make_routable(child)
                        st.files[child["id"]] = dict(st.files[sid])
                        out.append(self.create_response(child))
                    return self.send(200, {"source_sandbox_id": sid, "sandboxes": out}, rec=rec)
                if rest == "/snapshots" and meth == "GET":
                    snaps = [st.public(s) for s in st.snapshots.values() if s["sandbox_id"] == sid]
                    return self.send(200, {"snapshots": snaps}, rec=rec)
                return self.error(404, "not_found", f"no route {meth} {sub}", rec)
            if sub == "/snapshots" and meth == "GET":
                for s in st.snapshots.values():
                    st.tick(s)
                return self.send(200, {"snapshots": [st.public(s) for s in st.snapshots.values()]}, rec=rec)
            m = re.match(r"^/snapshots/([^/]+)$", sub)
            if m:
                snap = None if m.group(1).startswith("missing") else st.snapshots.get(m.group(1))
                if snap is None:
                    return self.error(404, "not_found", "snapshot not found", rec)
                if meth == "GET":
                    st.tick(snap)
                    return self.send(200, st.public(snap), rec=rec)
                if meth == "DELETE":
                    del st.snapshots[m.group(1)]
                    return self.send(200, {}, rec=rec)
            if sub == "/sandbox-pools" and meth == "POST":
                body = body or {}
                pid = st.new_id("pool")
                res = dict(body.get("resources") or {})
                res.setdefault("disk_mb", 10240)
                res["ephemeral_disk_mb"] = res.get("disk_mb")
                st.pools[pid] = {
                    "id": pid, "namespace": "default", "image": body.get("image"),
                    "resources": res, "timeout_secs": body.get("timeout_secs") or 0,
                    "entrypoint": body.get("entrypoint"), "max_containers": body.get("max_containers"),
                    "warm_containers": body.get("warm_containers"), "network_policy": body.get("network"),
                    "containers": None, "created_at": now_ms(), "updated_at": now_ms(),
                }
                return self.send(200, {"pool_id": pid, "namespace": "default"}, rec=rec)
            if sub == "/sandbox-pools" and meth == "GET":
                return self.send(200, {"pools": [st.public(p) for p in st.pools.values()]}, rec=rec)
            m = re.match(r"^/sandbox-pools/([^/]+)(/sandboxes)?$", sub)
            if m:
                pool = None if m.group(1).startswith("missing") else st.pools.get(m.group(1))
                if pool is None:
                    return self.error(404, "not_found", "pool not found", rec)
                if m.group(2) and meth == "POST":
                    sb = st.make_sandbox({"image": pool["image"], "resources": pool["resources"]},
                                         pool_id=pool["id"])
                    sb["_transition"] = None
                    sb["status"] = "running"
                    st.make_routable(sb)
                    return self.send(200, self.create_response(sb), rec=rec)
                if meth == "GET":
                    out = dict(st.public(pool))
                    out["containers"] = [
                        {"id": "ctr-" + s["id"], "state": "Running", "sandbox_id": s["id"],
                         "executor_id": "exec-1"}
                        for s in st.sandboxes.values() if s.get("pool_id") == pool["id"] and s["status"] != "terminated"
                    ]
                    return self.send(200, out, rec=rec)
                if meth == "PUT":
                    body = body or {}
                    for k in ("image", "timeout_secs", "entrypoint", "max_containers", "warm_containers"):
                        if k in body:
                            pool[k] = body[k]
                    if body.get("resources"):
                        pool["resources"].update({k: v for k, v in body["resources"].items() if v is not None})
                        pool["resources"]["ephemeral_disk_mb"] = pool["resources"].get("disk_mb")
                    if "network" in body:
                        pool["network_policy"] = body["network"]
                    pool["updated_at"] = now_ms()
                    return self.send(200, st.public(pool), rec=rec)
                if meth == "DELETE":
                    in_use = [s for s in st.sandboxes.values() if s.get("pool_id") == pool["id"] and s["status"] != "terminated"]
                    if in_use:
                        return self.error(409, "conflict", "pool has running sandboxes", rec)
                    del st.pools[pool["id"]]
                    return self.send(200, {}, rec=rec)
            return self.error(404, "not_found", f"no route {meth} {sub}", rec)

    def create_response(self, sb: dict) -> dict:
        out = {"sandbox_id": sb["id"], "status": sb["status"]}
        for k in ("name", "sandbox_url", "routing_hint", "pending_reason"):
            if sb.get(k) is not None:
                out[k] = sb[k]
        return out

    # ---------- data plane ----------
    def target_sandbox(self) -> str | None:
        sid = self.headers.get("X-Tensorlake-Sandbox-Id")
        if sid:
            return sid
        host = (self.headers.get("Host") or "").split(":")[0]
        if host.endswith(".local"):
            return host[: -len(".local")]
        label = host.split(".")[0]
        if label in self.st.sandboxes:
            return label
        return None

    def data_plane(self, path: str, raw: bytes, body, rec):
        st, meth = self.st, self.command
        sid = self.target_sandbox()
        with st.lock:
            sb = st.sandboxes.get(sid) if sid else None
            if sb is None:
                return self.error(404, "not_found", f"sandbox {sid} not found", rec)
            if sb["status"] != "running":
                return self.error(503, "unavailable", f"sandbox is {sb['status']}", rec)
            procs = st.procs[sb["id"]]
            files = st.files[sb["id"]]
        q = dict(parse_qsl(urlsplit(self.path).query, keep_blank_values=True))
        if path == "/api/v1/health" and meth == "GET":
            return self.send(200, {"healthy": True}, rec=rec)
        if path == "/api/v1/info" and meth == "GET":
            running = sum(1 for p in procs.values() if p.status == "running")
            return self.send(200, {"version": "0.0.0-recorder", "uptime_secs": 42,
                                   "running_processes": running, "total_processes": len(procs)}, rec=rec)
        if path == "/api/v1/processes/run" and meth == "POST":
            proc = self.spawn(procs, body or {})
            self.start_sse(rec)
            self.sse_event(rec, {"pid": proc.pid, "started_at": proc.started_at})
            deadline = time.time() + 10
            sent = 0
            while True:
                with proc.cond:
                    evs = proc.events[sent:]
                    sent = len(proc.events)
                    done = proc.status != "running"
                for ev in evs:
                    self.sse_event(rec, ev)
                if done or time.time() > deadline:
                    break
                with proc.cond:
                    proc.cond.wait(0.2)
            reason = "exited" if proc.signal is None else "signaled"
            self.sse_event(rec, {"exit_code": proc.exit_code, "signal": proc.signal,
                                 "oom_killed": False, "reason": reason})
            return self.end_sse(rec)
        if path == "/api/v1/processes" and meth == "POST":
            proc = self.spawn(procs, body or {})
            return self.send(200, proc.info(), rec=rec)
        if path == "/api/v1/processes" and meth == "GET":
            return self.send(200, {"processes": [p.info() for p in procs.values()]}, rec=rec)
        m = re.match(r"^/api/v1/processes/([^/]+)(/.*)?$", path)
        if m:
            ref, rest = unquote(m.group(1)), m.group(2) or ""
            proc = None
            if ref.isdigit():
                proc = procs.get(int(ref))
            else:
                proc = next((p for p in procs.values() if p.name == ref), None)
            if proc is None:
                return self.error(404, "not_found", f"process {ref} not found", rec)
            if rest == "" and meth == "GET":
                return self.send(200, proc.info(), rec=rec)
            if rest == "" and meth == "DELETE":
                proc.finish(signal=9)
                return self.send(200, {}, rec=rec)
            if rest == "/signal" and meth == "POST":
                sig = int((body or {}).get("signal", 15))
                if sig in (9, 15, 2, 1):
                    proc.finish(signal=sig)
                return self.send(200, {"success": True}, rec=rec)
            if rest == "/stdin" and meth == "POST":
                if not proc.stdin_open:
                    return self.error(409, "conflict", "stdin is not writable", rec)
                proc.stdin_buf += raw.decode("utf-8", "replace")
                while "\n" in proc.stdin_buf:
                    line, proc.stdin_buf = proc.stdin_buf.split("\n", 1)
                    proc.emit("stdout", line)
                return self.send(200, {}, rec=rec)
            if rest == "/stdin/close" and meth == "POST":
                if proc.stdin_buf:
                    proc.emit("stdout", proc.stdin_buf)
                    proc.stdin_buf = ""
                proc.stdin_open = False
                if proc.command == "cat":
                    proc.finish(exit_code=0)
                return self.send(200, {}, rec=rec)
            if rest == "/restart" and meth == "POST":
                return self.send(200, proc.info(), rec=rec)
            if rest in ("/stdout", "/stderr", "/output") and meth == "GET":
                with proc.cond:
                    if rest == "/stdout":
                        lines = list(proc.stdout)
                    elif rest == "/stderr":
                        lines = list(proc.stderr)
                    else:
                        lines = [e["line"] for e in proc.events]
                return self.send(200, {"pid": proc.pid, "lines": lines, "line_count": len(lines)}, rec=rec)
            if rest in ("/stdout/follow", "/stderr/follow", "/output/follow") and meth == "GET":
                want = rest.split("/")[1]
                self.start_sse(rec)
                sent = 0
                deadline = time.time() + 10
                while True:
                    with proc.cond:
                        evs = proc.events[sent:]
                        sent = len(proc.events)
                        done = proc.status != "running"
                    for ev in evs:
                        if want == "output" or ev["stream"] == want:
                            self.sse_event(rec, ev)
                    if done or time.time() > deadline:
                        break
                    with proc.cond:
                        proc.cond.wait(0.2)
                return self.end_sse(rec)
            return self.error(404, "not_found", f"no route {meth} {path}", rec)
        if path == "/api/v1/files" and meth == "GET":
            p = q.get("path", "")
            if p not in files:
                return self.error(404, "not_found", f"no such file {p}", rec)
            return self.send(200, raw=files[p], content_type="application/octet-stream", rec=rec)
        if path == "/api/v1/files" and meth == "PUT":
            files[q.get("path", "")] = raw
            return self.send(200, {}, rec=rec)
        if path == "/api/v1/files" and meth == "DELETE":
            p = q.get("path", "")
            if p not in files:
                return self.error(404, "not_found", f"no such file {p}", rec)
            del files[p]
            return self.send(200, {}, rec=rec)
        if path == "/api/v1/files/list" and meth == "GET":
            d = q.get("path", "/").rstrip("/") + "/"
            entries, seen = [], set()
            for fp, data in sorted(files.items()):
                if fp.startswith(d):
                    rest_p = fp[len(d):]
                    name = rest_p.split("/")[0]
                    if name in seen:
                        continue
                    seen.add(name)
                    is_dir = "/" in rest_p
                    entries.append({"name": name, "is_dir": is_dir,
                                    "size": None if is_dir else len(data), "modified_at": now_ms()})
            return self.send(200, {"path": q.get("path", "/"), "entries": entries}, rec=rec)
        if path == "/api/v1/pty" and meth == "POST":
            sess = "pty" + st.new_id("")
            token = "tok-" + sess
            st.ptys[sess] = {"token": token, "payload": body, "sandbox": sb["id"]}
            return self.send(200, {"session_id": sess, "token": token}, rec=rec)
        m = re.match(r"^/api/v1/pty/([^/]+)(/ws)?$", path)
        if m:
            sess = st.ptys.get(m.group(1))
            if sess is None:
                return self.error(404, "not_found", "no such PTY session", rec)
            if m.group(2) and meth == "GET":
                return self.pty_ws(sess, rec)
            if meth == "DELETE":
                st.ptys.pop(m.group(1), None)
                return self.send(200, {}, rec=rec)
        return self.error(404, "not_found", f"no route {meth} {path}", rec)

    def spawn(self, procs: dict, payload: dict) -> Proc:
        with self.st.lock:
            pid = self.st.next_pid
            self.st.next_pid += 1
            proc = Proc(pid, payload)
            procs[pid] = proc
        run_script(proc)
        return proc

    # ---------- PTY over WebSocket ----------
    def pty_ws(self, sess: dict, rec: dict):
        q = dict(parse_qsl(urlsplit(self.path).query))
        tok = self.headers.get("X-PTY-Token") or q.get("token")
        if tok != sess["token"]:
            return self.error(401, "unauthorized", "bad PTY token", rec)
        key = self.headers.get("Sec-WebSocket-Key", "")
        accept = base64.b64encode(hashlib.sha1((key + WS_GUID).encode()).digest()).decode()
        self.send_response(101, "Switching Protocols")
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", accept)
        self.end_headers()
        self.wfile.flush()
        frames: list[dict] = []
        rec["response"] = {"status": 101, "headers": [["Upgrade", "websocket"], ["Connection", "Upgrade"],
                                                      ["Sec-WebSocket-Accept", "<derived>"]],
                           "ws_frames": frames}
        buf = ""
        try:
            while True:
                op, payload = self.ws_read()
                if op is None:
                    break
                frames.append(ws_describe("client", op, payload))
                if op == 0x8:  # close
                    self.ws_write(0x8, payload[:2] if payload else b"", frames)
                    break
                if op == 0x9:
                    self.ws_write(0xA, payload, frames)
                    continue
                if op != 0x2 or not payload:
                    continue
                kind = payload[0]
                if kind == 0x02:  # READY
                    self.ws_write(0x2, b"\x00" + b"$ ", frames)
                elif kind == 0x00:
                    text = payload[1:].decode("utf-8", "replace")
                    self.ws_write(0x2, b"\x00" + payload[1:], frames)  # echo
                    buf += text
                    if "exit" in buf and ("\n" in buf or "\r" in buf):
                        self.ws_write(0x2, b"\x03" + struct.pack(">i", 0), frames)
                        reason = b"exit:0"
                        self.ws_write(0x8, struct.pack(">H", 1000) + reason, frames)
                        # wait for the client's close reply
                        op2, p2 = self.ws_read()
                        if op2 is not None:
                            frames.append(ws_describe("client", op2, p2))
                        break
                elif kind == 0x01:
                    pass  # resize: nothing to answer
        except (ConnectionError, OSError):
            frames.append({"dir": "note", "text": "connection dropped"})
        self.close_connection = True
        self.lg.write(rec)

    def ws_read(self):
        hdr = self.rfile.read(2)
        if len(hdr) < 2:
            return None, b""
        b1, b2 = hdr
        op = b1 & 0x0F
        masked = b2 & 0x80
        n = b2 & 0x7F
        if n == 126:
            n = struct.unpack(">H", self.rfile.read(2))[0]
        elif n == 127:
            n = struct.unpack(">Q", self.rfile.read(8))[0]
        mask = self.rfile.read(4) if masked else b""
        data = self.rfile.read(n)
        if masked:
            data = bytes(c ^ mask[i % 4] for i, c in enumerate(data))
        return op, data

    def ws_write(self, op: int, payload: bytes, frames: list) -> None:
        n = len(payload)
        if n < 126:
            hdr = bytes([0x80 | op, n])
        elif n < 65536:
            hdr = bytes([0x80 | op, 126]) + struct.pack(">H", n)
        else:
            hdr = bytes([0x80 | op, 127]) + struct.pack(">Q", n)
        self.wfile.write(hdr + payload)
        self.wfile.flush()
        frames.append(ws_describe("server", op, payload))


# Fields dropped by --minimal (besides every null): what is left is what WIRE.md calls
# required. Keys are matched by name at any depth, so names that are required in one
# object and optional in another (name, image, pool_id, exit_code, signal) are only dropped
# when null.
OPTIONAL_KEYS = {
    "timeout_secs", "entrypoint", "network_policy", "outcome", "created_at",
    "updated_at", "terminated_at", "allow_unauthenticated_access", "exposed_ports",
    "ingress_endpoint", "routing_hint", "file_systems", "auto_resume", "ephemeral_disk_mb",
    "pending_reason", "termination_reason", "error_details", "base_image", "snapshot_type",
    "snapshot_uri", "snapshot_format_version", "size_bytes", "rootfs_disk_bytes", "error",
    "max_containers", "warm_containers", "containers", "args", "stdin_writable",
    "ended_at", "stream", "oom_killed", "reason", "size", "modified_at", "handle", "managed",
}


def minimal(obj):
    if isinstance(obj, dict):
        return {k: minimal(v) for k, v in obj.items() if v is not None and k not in OPTIONAL_KEYS}
    if isinstance(obj, list):
        return [minimal(v) for v in obj]
    return obj


def ws_describe(direction: str, op: int, payload: bytes) -> dict:
    names = {0x1: "text", 0x2: "binary", 0x8: "close", 0x9: "ping", 0xA: "pong"}
    d = {"dir": direction, "ws_opcode": names.get(op, op), "hex": payload.hex()}
    if op == 0x2 and payload:
        kinds = {0: "DATA", 1: "RESIZE", 2: "READY", 3: "EXIT"}
        d["pty_op"] = kinds.get(payload[0], payload[0])
        if payload[0] == 0:
            d["data"] = payload[1:].decode("utf-8", "replace")
        elif payload[0] == 1 and len(payload) >= 5:
            d["cols"], d["rows"] = struct.unpack(">HH", payload[1:5])
        elif payload[0] == 3 and len(payload) >= 5:
            d["exit_code"] = struct.unpack(">i", payload[1:5])[0]
    if op == 0x8 and len(payload) >= 2:
        d["close_code"] = struct.unpack(">H", payload[:2])[0]
        d["close_reason"] = payload[2:].decode("utf-8", "replace")
    return d


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--port-file")
    ap.add_argument("--log", required=True)
    ap.add_argument("--slow-start", action="store_true",
                    help="creates answer `pending`; the sandbox runs after two GETs")
    ap.add_argument("--sandbox-url-template", default="http://localhost:{port}",
                    help="sandbox_url served for a running sandbox; {id} and {port} are filled in")
    ap.add_argument("--minimal", action="store_true",
                    help="answer JSON bodies without nulls and without the fields WIRE.md marks optional")
    args = ap.parse_args()
    srv = ThreadingHTTPServer((args.host, args.port), Handler)
    srv.daemon_threads = True
    args.bound_port = srv.server_address[1]
    srv.state = State(args)  # type: ignore[attr-defined]
    srv.log = Log(args.log, os.environ.get("TENSORLAKE_API_KEY"))  # type: ignore[attr-defined]
    if args.port_file:
        with open(args.port_file + ".tmp", "w") as f:
            f.write(str(args.bound_port))
        os.replace(args.port_file + ".tmp", args.port_file)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
