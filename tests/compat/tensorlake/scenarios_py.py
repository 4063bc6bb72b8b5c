#!/usr/bin/env python3
"""Scenarios that drive the unmodified Tensorlake Python SDK (0.5.161).

Only the environment configures the SDK: TENSORLAKE_API_URL and TENSORLAKE_API_KEY
(and INDEXIFY_NAMESPACE, default "default"). Point TENSORLAKE_API_URL at the recorder
(recorder.py) to record fixtures, or at a sandfork daemon to check compatibility.

    python scenarios_py.py list
    python scenarios_py.py SCENARIO [SCENARIO ...]

Each scenario prints one JSON line per step: {"step": ..., "ok": bool, ...} (a call that
succeeded, then the values it returned under the same step name). It exits 1
when a step that must succeed failed. Error scenarios record the exception class and
message the SDK raised instead of failing.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import traceback
import warnings

warnings.simplefilter("ignore", DeprecationWarning)

from tensorlake.sandbox import (  # noqa: E402
    AsyncSandbox,
    CheckpointType,
    OutputMode,
    Sandbox,
    SandboxClient,
    StdinMode,
)

FAILED = False
IMAGE = os.environ.get("SCENARIO_IMAGE", "tensorlake/ubuntu-minimal")
RUN_ID = os.environ.get("SCENARIO_RUN_ID", "")  # suffix for names, to keep reruns apart


def name(base: str) -> str:
    return f"{base}{RUN_ID}"


def out(step: str, ok: bool = True, **fields) -> None:
    print(json.dumps({"step": step, "ok": ok, **fields}, default=str), flush=True)


def must(step: str, fn, *args, **kwargs):
    global FAILED
    try:
        value = fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001
        FAILED = True
        out(step, False, error=type(e).__name__, message=str(e),
            trace=traceback.format_exc(limit=3))
        raise
    out(step)
    return value


def may(step: str, fn, *args, **kwargs):
    """Like must, for a call a server may refuse (a feature it lacks): the refusal is
    recorded (ok false, "soft": true) and the scenario goes on; returns None then."""
    try:
        return fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001
        fields = {"error": type(e).__name__, "message": str(e), "soft": True}
        for attr in ("status_code", "code"):
            v = getattr(e, attr, None)
            if v is not None and not callable(v):
                fields[attr] = v
        out(step, False, **fields)
        return None


def expect_error(step: str, fn, *args, **kwargs) -> None:
    try:
        value = fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001
        fields = {"error": type(e).__name__, "mro": [c.__name__ for c in type(e).__mro__][:5],
                  "message": str(e)}
        for attr in ("status_code", "code", "sandbox_id", "reason"):
            v = getattr(e, attr, None)
            if v is not None and not callable(v):
                fields[attr] = v
        out(step, True, **fields)
        return
    out(step, False, unexpected_success=repr(value)[:200])


async def expect_error_async(step: str, coro) -> None:
    try:
        value = await coro
    except Exception as e:  # noqa: BLE001
        fields = {"error": type(e).__name__, "mro": [c.__name__ for c in type(e).__mro__][:5],
                  "message": str(e)}
        for attr in ("status_code", "code", "sandbox_id", "reason"):
            v = getattr(e, attr, None)
            if v is not None and not callable(v):
                fields[attr] = v
        out(step, True, **fields)
        return
    out(step, False, unexpected_success=repr(value)[:200])


# ---------------------------------------------------------------- sync scenarios

def s_lifecycle():
    sb = must("create", Sandbox.create, image=IMAGE, cpus=1.0, memory_mb=512, timeout_secs=600,
              name=name("compat-life"))
    out("create", sandbox_id=sb.sandbox_id, name=sb.name, trace_id=sb.trace_id)
    info = must("info", sb.info)
    out("info", status=info.status.value, sandbox_url=info.sandbox_url, resources=info.resources.model_dump())
    out("status", status=must("status", lambda: sb.status).value)
    again = must("connect_by_name", Sandbox.connect, name("compat-life"))
    out("connect_by_name", sandbox_id=again.sandbox_id)
    listed = list(must("list", Sandbox.list))
    out("list", ids=[s.sandbox_id for s in listed], statuses=[s.status.value for s in listed])
    must("update", sb.update, name=name("compat-life-renamed"), exposed_ports=[8080],
         allow_unauthenticated_access=False, auto_resume=True)
    info = must("info_after_update", sb.info)
    out("update", name=info.name, exposed_ports=info.exposed_ports)
    client = SandboxClient(_internal=True)
    got = must("client_get", client.get, sb.sandbox_id)
    out("client_get", status=got.value.status.value, trace_id=got.trace_id)
    from tensorlake.sandbox import NetworkConfig
    must("update_network", client.update_sandbox, sb.sandbox_id,
         network=NetworkConfig(allow_internet_access=True, deny_out=["10.0.0.0/8"]))
    if may("resize", sb.update, cpus=2.0, memory_mb=1024, poll_interval=0.5) is not None:
        out("resize", resources=sb.info().resources.model_dump())
    must("terminate", sb.terminate)
    out("terminate")


def s_create_wait():
    """Recorded against --slow-start: the create answers pending and the SDK polls."""
    sb = must("create_blocking", Sandbox.create, image=IMAGE)
    out("create_blocking", sandbox_id=sb.sandbox_id, status=sb.status.value)
    pending = must("create_nowait", Sandbox.create, image=IMAGE, wait=False, name=name("compat-pending"))
    out("create_nowait", sandbox_id=pending.sandbox_id, state=pending.state.value)
    ready = must("ready", pending.ready, poll_interval=0.5)
    out("ready", sandbox_id=ready.sandbox_id)
    ready.run("true")
    must("terminate", sb.terminate)
    must("terminate2", ready.terminate)
    out("terminate")


def s_suspend_resume():
    sb = must("create", Sandbox.create, image=IMAGE, name=name("compat-suspend"))
    must("suspend", sb.suspend, poll_interval=0.5)
    out("suspend", status=sb.status.value)
    must("resume", sb.resume, poll_interval=0.5)
    out("resume", status=sb.status.value)
    r = must("run_after_resume", sb.run, "echo", ["back"])
    out("run_after_resume", stdout=r.stdout)
    must("suspend_nowait", sb.suspend, wait=False)
    out("suspend_nowait", status=_await_status(sb, "suspended").value)
    must("resume_nowait", sb.resume, wait=False)
    out("resume_nowait", status=_await_status(sb, "running").value)
    must("terminate", sb.terminate)
    out("terminate")


def _await_status(sb, want: str, timeout: float = 60.0):
    deadline = time.time() + timeout
    while True:
        st = sb.status
        if st.value == want or time.time() > deadline:
            return st
        time.sleep(0.5)


def s_snapshot():
    sb = must("create", Sandbox.create, image=IMAGE)
    must("write", sb.write_file, "/tmp/marker", b"before-snapshot\n")
    fs_snap = must("checkpoint_fs", sb.checkpoint, checkpoint_type=CheckpointType.FILESYSTEM,
                   poll_interval=0.5)
    out("checkpoint_fs", snapshot_id=fs_snap.snapshot_id, status=fs_snap.status.value,
        snapshot_type=getattr(fs_snap.snapshot_type, "value", None))
    mem_snap = must("checkpoint_mem", sb.checkpoint, checkpoint_type=CheckpointType.MEMORY,
                    poll_interval=0.5, wait_until="completed")
    out("checkpoint_mem", snapshot_id=mem_snap.snapshot_id, status=mem_snap.status.value)
    none = must("checkpoint_nowait", sb.checkpoint, wait=False)
    out("checkpoint_nowait", returned=repr(none))
    got = must("get_snapshot", Sandbox.get_snapshot, mem_snap.snapshot_id)
    out("get_snapshot", status=got.status.value, sandbox_id=got.sandbox_id)
    snaps = list(must("list_snapshots", sb.list_snapshots))
    out("list_snapshots", ids=[s.snapshot_id for s in snaps])
    allsnaps = list(must("list_all_snapshots", SandboxClient(_internal=True).list_snapshots))
    out("list_all_snapshots", count=len(allsnaps))
    restored = must("restore", Sandbox.create, snapshot_id=mem_snap.snapshot_id)
    data = must("read_restored", restored.read_file, "/tmp/marker")
    out("restore", sandbox_id=restored.sandbox_id, marker=bytes(data.value if hasattr(data, "value") else data).decode())
    must("terminate_restored", restored.terminate)
    must("delete_snapshot", Sandbox.delete_snapshot, fs_snap.snapshot_id)
    must("terminate", sb.terminate)
    out("terminate")


def s_copy():
    sb = must("create", Sandbox.create, image=IMAGE)
    must("write", sb.write_file, "/tmp/marker", b"parent\n")
    res = must("copy", sb.copy, times=2)
    value = res.value if hasattr(res, "value") else res
    out("copy", trace_id=getattr(res, "trace_id", None), source=value.source_sandbox_id,
        sandboxes=[{"sandbox_id": c.sandbox_id, "status": c.status, "sandbox_url": c.sandbox_url}
                   for c in value.sandboxes])
    for c in value.sandboxes:
        child = must("connect_copy", Sandbox.connect, c.sandbox_id)
        data = must("read_copy", child.read_file, "/tmp/marker")
        out("read_copy", sandbox_id=c.sandbox_id, marker=bytes(data.value if hasattr(data, "value") else data).decode())
        must("terminate_copy", child.terminate)
    must("terminate", sb.terminate)
    out("terminate")


COUNTER = ("n=0; while :; do n=$((n+1)); echo $n > /tmp/count.tmp && mv /tmp/count.tmp /tmp/count; "
           "sleep 0.1; done")


def _count(sb) -> int:
    data = sb.read_file("/tmp/count")
    return int(bytes(data.value if hasattr(data, "value") else data).decode().strip() or 0)


def s_fork_warm():
    """The fork pattern: a process whose state lives in its memory (a shell counter), a
    memory checkpoint, then 5 restores: in each the same process runs on, counting on from
    where the checkpoint caught it (a cold start would have no process, or count from 1),
    and each restore is its own sandbox (a file written in one is not in another)."""
    sb = must("create", Sandbox.create, image=IMAGE)
    p = must("start_counter", sb.start_process, "sh", ["-c", COUNTER])
    pid = (p.value if hasattr(p, "value") else p).pid
    time.sleep(1.0)
    at_checkpoint = must("count_before_checkpoint", _count, sb)
    snap = must("checkpoint_mem", sb.checkpoint, checkpoint_type=CheckpointType.MEMORY,
                poll_interval=0.5)
    out("checkpoint_mem", snapshot_id=snap.snapshot_id, count=at_checkpoint)
    restores = []
    started = time.monotonic()
    for i in range(5):
        restores.append(must("restore", Sandbox.create, snapshot_id=snap.snapshot_id))
    out("restore", count=len(restores), seconds=round(time.monotonic() - started, 3),
        sandbox_ids=[r.sandbox_id for r in restores])
    time.sleep(0.5)
    for i, r in enumerate(restores):
        g = must("get_counter", r.get_process, pid)
        status = (g.value if hasattr(g, "value") else g).status.value
        first = must("read_count", _count, r)
        time.sleep(0.4)
        later = must("read_count", _count, r)
        must("write_own", r.write_file, "/tmp/own", f"restore-{i}\n".encode())
        out("warm_state", index=i, sandbox_id=r.sandbox_id, status=status,
            at_checkpoint=at_checkpoint, first=first, later=later)
    own = []
    for r in restores:
        data = must("read_own", r.read_file, "/tmp/own")
        own.append(bytes(data.value if hasattr(data, "value") else data).decode())
    out("independent", own=own)
    for r in restores:
        must("terminate_restore", r.terminate)
    must("delete_snapshot", Sandbox.delete_snapshot, snap.snapshot_id)
    must("terminate", sb.terminate)
    out("terminate")


def s_quiet():
    """A run and a follow that stay quiet for seconds before their output: the server may
    keep such streams alive (sandfork sends a comment line every second)."""
    sb = must("create", Sandbox.create, image=IMAGE)
    r = must("run_quiet", sb.run, "sh", ["-c", "sleep 2.5; echo done"])
    out("run_quiet", exit_code=r.exit_code, stdout=r.stdout)
    p = must("start_quiet", sb.start_process, "sh", ["-c", "sleep 2.5; echo late; echo later >&2"])
    pid = (p.value if hasattr(p, "value") else p).pid
    ev = list(must("follow_quiet", sb.follow_output, pid))
    out("follow_quiet", events=[{"line": e.line, "stream": e.stream} for e in ev])
    must("terminate", sb.terminate)
    out("terminate")


def s_pools():
    client = SandboxClient(_internal=True)
    created = may("create_pool", client.create_pool, image=IMAGE, cpus=1.0, memory_mb=512,
                  timeout_secs=0, max_containers=3, warm_containers=1)
    if created is None:
        # A server without pools: every pool call is refused the same way.
        may("list_pools", lambda: list(client.list_pools()))
        may("get_pool", client.get_pool, "no-such-pool")
        may("claim", Sandbox.create, pool_id="no-such-pool")
        may("update_pool", client.update_pool, "no-such-pool", image=IMAGE, cpus=1.0,
            memory_mb=512, max_containers=4, warm_containers=0)
        may("delete_pool", client.delete_pool, "no-such-pool")
        return
    pool_id = created.value.pool_id if hasattr(created, "value") else created.pool_id
    out("create_pool", pool_id=pool_id)
    pools = list(must("list_pools", client.list_pools))
    out("list_pools", ids=[p.pool_id for p in pools])
    pool = must("get_pool", client.get_pool, pool_id)
    out("get_pool", image=(pool.value if hasattr(pool, "value") else pool).image)
    claimed = must("claim", Sandbox.create, pool_id=pool_id)
    out("claim", sandbox_id=claimed.sandbox_id)
    r = must("run_in_claimed", claimed.run, "echo", ["pooled"])
    out("run_in_claimed", stdout=r.stdout)
    expect_error("delete_pool_in_use", client.delete_pool, pool_id)
    must("update_pool", client.update_pool, pool_id, image=IMAGE, cpus=1.0, memory_mb=512,
         max_containers=4, warm_containers=0)
    must("terminate_claimed", claimed.terminate)
    must("delete_pool", client.delete_pool, pool_id)
    out("delete_pool")


def s_processes():
    sb = must("create", Sandbox.create, image=IMAGE)
    r = must("run_echo", sb.run, "echo", ["hello", "world"])
    out("run_echo", exit_code=r.exit_code, stdout=r.stdout, stderr=r.stderr, reason=getattr(r.reason, "value", None))
    r = must("run_sh", sb.run, "sh", ["-c", "echo out; echo err >&2; exit 3"], env={"A": "1"},
             working_dir="/tmp", timeout=30)
    out("run_sh", exit_code=r.exit_code, stdout=r.stdout, stderr=r.stderr)
    p = must("start_sleep", sb.start_process, "sleep", ["300"])
    pinfo = p.value if hasattr(p, "value") else p
    out("start_sleep", pid=pinfo.pid, status=pinfo.status.value)
    procs = list(must("list_processes", sb.list_processes))
    out("list_processes", pids=[x.pid for x in procs])
    g = must("get_process", sb.get_process, pinfo.pid)
    out("get_process", status=(g.value if hasattr(g, "value") else g).status.value)
    s = must("send_signal", sb.send_signal, pinfo.pid, 15)
    out("send_signal", success=(s.value if hasattr(s, "value") else s).success)
    time.sleep(0.5)
    g = must("get_after_signal", sb.get_process, pinfo.pid)
    gv = g.value if hasattr(g, "value") else g
    out("get_after_signal", status=gv.status.value, signal=gv.signal, exit_code=gv.exit_code)
    c = must("start_cat", sb.start_process, "cat", stdin_mode=StdinMode.PIPE,
             stdout_mode=OutputMode.CAPTURE, stderr_mode=OutputMode.CAPTURE)
    cpid = (c.value if hasattr(c, "value") else c).pid
    must("write_stdin", sb.write_stdin, cpid, b"line one\nline two\n")
    must("close_stdin", sb.close_stdin, cpid)
    time.sleep(0.5)
    so = must("get_stdout", sb.get_stdout, cpid)
    so = so.value if hasattr(so, "value") else so
    out("get_stdout", lines=so.lines, line_count=so.line_count)
    se = must("get_stderr", sb.get_stderr, cpid)
    out("get_stderr", lines=(se.value if hasattr(se, "value") else se).lines)
    oo = must("get_output", sb.get_output, cpid)
    out("get_output", lines=(oo.value if hasattr(oo, "value") else oo).lines)
    ev = list(must("follow_output", sb.follow_output, cpid))
    out("follow_output", events=[{"line": e.line, "stream": e.stream} for e in ev])
    ev = list(must("follow_stdout", sb.follow_stdout, cpid))
    out("follow_stdout", lines=[e.line for e in ev])
    k = must("start_sleep2", sb.start_process, "sleep", ["300"])
    kpid = (k.value if hasattr(k, "value") else k).pid
    must("kill_process", sb.kill_process, kpid)
    time.sleep(0.5)
    g = must("get_after_kill", sb.get_process, kpid)
    gv = g.value if hasattr(g, "value") else g
    out("get_after_kill", status=gv.status.value, signal=gv.signal)
    expect_error("get_missing_process", sb.get_process, 999999)
    must("terminate", sb.terminate)
    out("terminate")


def s_files():
    sb = must("create", Sandbox.create, image=IMAGE)
    must("mkdir", sb.run, "mkdir", ["-p", "/tmp/compat"])
    must("write_file", sb.write_file, "/tmp/compat/a.txt", b"alpha\n")
    must("write_file_bin", sb.write_file, "/tmp/compat/b.bin", bytes(range(256)))
    data = must("read_file", sb.read_file, "/tmp/compat/a.txt")
    raw = data.value if hasattr(data, "value") else data
    out("read_file", content=bytes(raw).decode())
    data = must("read_file_bin", sb.read_file, "/tmp/compat/b.bin")
    raw = data.value if hasattr(data, "value") else data
    out("read_file_bin", same=bytes(raw) == bytes(range(256)))
    ls = must("list_directory", sb.list_directory, "/tmp/compat")
    ls = ls.value if hasattr(ls, "value") else ls
    out("list_directory", path=ls.path, entries=[(e.name, e.is_dir, e.size) for e in ls.entries])
    must("delete_file", sb.delete_file, "/tmp/compat/a.txt")
    expect_error("read_deleted", sb.read_file, "/tmp/compat/a.txt")
    expect_error("delete_missing", sb.delete_file, "/tmp/compat/nope.txt")
    must("terminate", sb.terminate)
    out("terminate")


def s_pty():
    sb = must("create", Sandbox.create, image=IMAGE)
    chunks: list[bytes] = []
    exits: list[int] = []
    pty = must("create_pty", sb.create_pty, "/bin/sh", rows=24, cols=80,
               on_data=lambda b: chunks.append(bytes(b)), on_exit=lambda c: exits.append(c))
    out("create_pty", session_id=pty.session_id)
    must("resize", pty.resize, 100, 30)
    must("send_input", pty.send_input, "echo hi-from-pty\n")
    time.sleep(0.5)
    must("send_exit", pty.send_input, "exit\n")
    code = must("wait", pty.wait, 10)
    out("pty_exit", exit_code=code, output="".join(c.decode("utf-8", "replace") for c in chunks), exits=exits)
    sess = must("create_pty_session", sb.create_pty_session, "/bin/sh", ["-i"], env={"TERM": "xterm"},
                working_dir="/", rows=10, cols=40)
    sv = sess.value if hasattr(sess, "value") else sess
    out("create_pty_session", keys=sorted(sv.keys()))
    out("pty_ws_url", url=sb.pty_ws_url(sv["session_id"], sv["token"]))
    p2 = must("connect_pty", sb.connect_pty, sv["session_id"], sv["token"])
    must("kill_pty", p2.kill)
    must("disconnect", p2.disconnect)
    must("terminate", sb.terminate)
    out("terminate")


def s_health():
    sb = must("create", Sandbox.create, image=IMAGE)
    h = must("health", sb.health)
    out("health", healthy=(h.value if hasattr(h, "value") else h).healthy)
    i = must("daemon_info", sb.daemon_info)
    iv = i.value if hasattr(i, "value") else i
    out("daemon_info", version=iv.version, uptime_secs=iv.uptime_secs)
    must("terminate", sb.terminate)
    out("terminate")


def s_errors():
    expect_error("connect_missing", Sandbox.connect, "missing-sandbox")
    client = SandboxClient(_internal=True)
    expect_error("get_missing", client.get, "missing-sandbox")
    expect_error("delete_missing", client.delete, "missing-sandbox")
    expect_error("get_snapshot_missing", Sandbox.get_snapshot, "missing-snapshot")
    expect_error("get_pool_missing", client.get_pool, "missing-pool")
    bad = SandboxClient(api_key="sandfork-bad-key", _internal=True)
    expect_error("list_bad_key_401", bad.list)
    forbidden = SandboxClient(api_key="sandfork-forbidden-key", _internal=True)
    expect_error("list_forbidden_403", forbidden.list)
    expect_error("create_bad_key_401", Sandbox.create, image=IMAGE, api_key="sandfork-bad-key")
    sb = must("create_named", Sandbox.create, image=IMAGE, name=name("compat-dup"))
    expect_error("create_duplicate_409", Sandbox.create, image=IMAGE, name=name("compat-dup"))
    expect_error("connect_bad_key_401", Sandbox.connect, sb.sandbox_id, api_key="sandfork-bad-key")
    h = Sandbox(sb.sandbox_id, proxy_url=sb.info().sandbox_url, api_key="sandfork-bad-key")
    expect_error("dataplane_bad_key_401", h.health)
    expect_error("dataplane_missing_file_404", sb.read_file, "/definitely/missing")
    must("terminate", sb.terminate)
    out("terminate")


def s_hosts_basic():
    """Recorded with TENSORLAKE_API_URL=http://api.sandfork.test:PORT (names from a private
    hosts file) to show the non-localhost URL derivation: flat lifecycle paths on the
    sandbox.* host, and the X-Tensorlake-Sandbox-Id header on the data plane."""
    sb = must("create", Sandbox.create, image=IMAGE)
    out("create", sandbox_id=sb.sandbox_id)
    r = must("run", sb.run, "echo", ["hosts"])
    out("run", stdout=r.stdout)
    must("write_file", sb.write_file, "/tmp/h.txt", b"h\n")
    out("read_file", content=bytes(must("read_file", sb.read_file, "/tmp/h.txt").value).decode())
    out("list", ids=[s.sandbox_id for s in must("list", Sandbox.list)])
    must("terminate", sb.terminate)
    out("terminate")


# ---------------------------------------------------------------- async scenarios

async def a_lifecycle():
    sb = await AsyncSandbox.create(image=IMAGE, name=name("compat-async"))
    out("create", sandbox_id=sb.sandbox_id)
    info = await sb.info()
    out("info", status=info.status.value)
    r = await sb.run("sh", ["-c", "echo out; echo err >&2; exit 3"])
    out("run_sh", exit_code=r.exit_code, stdout=r.stdout, stderr=r.stderr)
    p = await sb.start_process("cat", stdin_mode=StdinMode.PIPE)
    pid = (p.value if hasattr(p, "value") else p).pid
    await sb.write_stdin(pid, b"async line\n")
    await sb.close_stdin(pid)
    ev = await sb.follow_output(pid)
    out("follow_output", lines=[e.line for e in ev])
    await sb.write_file("/tmp/async.txt", b"async\n")
    data = await sb.read_file("/tmp/async.txt")
    out("read_file", content=bytes(data.value if hasattr(data, "value") else data).decode())
    ls = await sb.list_directory("/tmp")
    out("list_directory", names=[e.name for e in (ls.value if hasattr(ls, "value") else ls).entries])
    await sb.delete_file("/tmp/async.txt")
    h = await sb.health()
    out("health", healthy=(h.value if hasattr(h, "value") else h).healthy)
    await sb.suspend(poll_interval=0.5)
    out("suspend", status=(await sb.status()).value)
    await sb.resume(poll_interval=0.5)
    out("resume", status=(await sb.status()).value)
    snap = await sb.checkpoint(checkpoint_type=CheckpointType.MEMORY, poll_interval=0.5)
    out("checkpoint", snapshot_id=snap.snapshot_id, status=snap.status.value)
    res = await sb.copy(times=1)
    value = res.value if hasattr(res, "value") else res
    out("copy", sandboxes=[c.sandbox_id for c in value.sandboxes])
    for c in value.sandboxes:
        child = await AsyncSandbox.connect(c.sandbox_id)
        await child.terminate()
    chunks: list[bytes] = []
    pty = await sb.create_pty("/bin/sh", on_data=lambda b: chunks.append(bytes(b)))
    await pty.send_input("echo hi\n")
    await asyncio.sleep(0.3)
    await pty.send_input("exit\n")
    code = await pty.wait(10)
    out("pty", exit_code=code)
    await expect_error_async("connect_missing", AsyncSandbox.connect("missing-sandbox"))
    await sb.terminate()
    out("terminate")


SYNC = {
    "lifecycle": s_lifecycle,
    "create_wait": s_create_wait,
    "suspend_resume": s_suspend_resume,
    "snapshot": s_snapshot,
    "copy": s_copy,
    "pools": s_pools,
    "fork_warm": s_fork_warm,
    "quiet": s_quiet,
    "processes": s_processes,
    "files": s_files,
    "pty": s_pty,
    "health": s_health,
    "errors": s_errors,
    "hosts_basic": s_hosts_basic,
}
ASYNC = {
    "async_all": a_lifecycle,
}


def main(argv: list[str]) -> int:
    if not argv or argv[0] == "list":
        print("\n".join(list(SYNC) + list(ASYNC)))
        return 0
    for sc in argv:
        out("scenario", name=sc, api_url=os.environ.get("TENSORLAKE_API_URL"))
        try:
            if sc in SYNC:
                SYNC[sc]()
            elif sc in ASYNC:
                asyncio.run(ASYNC[sc]())
            else:
                raise SystemExit(f"unknown scenario {sc}")
        except Exception as e:  # noqa: BLE001
            global FAILED
            FAILED = True
            out("scenario_failed", False, name=sc, error=type(e).__name__, message=str(e),
                trace=traceback.format_exc(limit=6))
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
