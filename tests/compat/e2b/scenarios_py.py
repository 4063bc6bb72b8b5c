#!/usr/bin/env python3
"""Scenarios that drive the unmodified E2B Python SDK (e2b 2.63.0).

Usage:  scenarios_py.py [SCENARIO ...]      (none: all of them)
        scenarios_py.py --list

Environment (nothing is hard-wired, so the same file can be pointed at the
recorder or at the real daemon):
  E2B_API_URL       control plane, e.g. http://127.0.0.1:3000
  E2B_SANDBOX_URL   envd / data plane, e.g. http://127.0.0.1:49983
  E2B_API_KEY       the API key
  E2B_TEMPLATE      template to create sandboxes from (default "base")
  SCENARIO_OUT      if set, a directory: each scenario's observations are
                    written there as <scenario>.sdk.json

Each scenario prints one JSON line {scenario, ok, observations, error} and
checks only what any correct server must satisfy (outputs, return values,
exception classes), so the same checks can later run against sandfork.
Exit status: 0 when every scenario passed.
"""

import asyncio
import datetime
import importlib.metadata
import json
import os
import sys
import time
import traceback

import httpx

import e2b
from e2b import AsyncSandbox, Sandbox
from e2b.sandbox.sandbox_api import SandboxQuery, SandboxState

TEMPLATE = os.environ.get("E2B_TEMPLATE", "base")


class CheckFailed(AssertionError):
    pass


def check(cond, what):
    if not cond:
        raise CheckFailed(what)


def exc_info(e):
    return {
        "type": type(e).__name__,
        "module": type(e).__module__,
        "mro": [c.__name__ for c in type(e).__mro__ if c not in (object, BaseException)],
        "message": str(e)[:500],
        "status_code": getattr(e, "status_code", None),
    }


def expect_error(fn, *types):
    try:
        res = fn()
    except Exception as e:  # noqa: BLE001
        if types and not isinstance(e, types):
            raise CheckFailed("expected %s, got %s: %s" % ([t.__name__ for t in types], type(e).__name__, e))
        return exc_info(e)
    raise CheckFailed("expected %s, got a result: %r" % ([t.__name__ for t in types], res))


async def aexpect_error(coro_fn, *types):
    try:
        res = await coro_fn()
    except Exception as e:  # noqa: BLE001
        if types and not isinstance(e, types):
            raise CheckFailed("expected %s, got %s: %s" % ([t.__name__ for t in types], type(e).__name__, e))
        return exc_info(e)
    raise CheckFailed("expected %s, got a result: %r" % ([t.__name__ for t in types], res))


def info_dict(info):
    d = {}
    for k in ("sandbox_id", "template_id", "name", "metadata", "state", "cpu_count", "memory_mb",
              "envd_version", "allow_internet_access", "network", "lifecycle", "sandbox_domain"):
        if hasattr(info, k):
            v = getattr(info, k)
            d[k] = v if isinstance(v, (str, int, float, bool, dict, list, type(None))) else str(v)
    for k in ("started_at", "end_at"):
        if hasattr(info, k):
            d[k] = str(getattr(info, k))
    return d


def entry_dict(e):
    return {
        "name": e.name,
        "type": str(e.type),
        "path": e.path,
        "size": e.size,
        "mode": e.mode,
        "permissions": e.permissions,
        "owner": e.owner,
        "group": e.group,
        "modified_time": str(e.modified_time),
        "symlink_target": e.symlink_target,
    }


def event_dict(ev):
    return {"name": ev.name, "type": str(ev.type)}


# --------------------------------------------------------------------------


def sc_lifecycle():
    obs = {}
    sb = Sandbox.create(TEMPLATE, timeout=120, metadata={"suite": "e2b-compat", "case": "lifecycle"}, envs={"GREETING": "hello"})
    obs["sandbox_id"] = sb.sandbox_id
    obs["envd_api_url"] = sb.envd_api_url
    obs["get_host_8080"] = sb.get_host(8080)
    obs["sandbox_domain"] = sb.sandbox_domain
    try:
        obs["is_running"] = sb.is_running()
        check(obs["is_running"] is True, "is_running after create")
        info = sb.get_info()
        obs["get_info"] = info_dict(info)
        check(info.sandbox_id == sb.sandbox_id, "get_info id")
        check(info.metadata.get("case") == "lifecycle", "metadata round trip")
        check(str(info.state).lower().endswith("running"), "state running")
        r = sb.commands.run("echo $GREETING")
        check(r.stdout == "hello\n", "create envs reach commands: %r" % r.stdout)
        sb.set_timeout(300)
        info2 = Sandbox.get_info(sb.sandbox_id)
        obs["end_at_after_set_timeout"] = str(info2.end_at)
        check(info2.end_at > info.end_at, "set_timeout moved end_at")
        same = Sandbox.connect(sb.sandbox_id)
        obs["connect_running_id"] = same.sandbox_id
        check(same.sandbox_id == sb.sandbox_id, "connect returns the same sandbox")
        check(same.commands.run("echo again").stdout == "again\n", "connected instance runs commands")
        same2 = sb.connect(timeout=200)
        check(same2.sandbox_id == sb.sandbox_id, "instance connect")
        metrics = sb.get_metrics()
        obs["metrics_count"] = len(metrics)
        listed = Sandbox.list(query=SandboxQuery(metadata={"case": "lifecycle"})).next_items()
        obs["list_ids"] = [s.sandbox_id for s in listed]
        check(sb.sandbox_id in obs["list_ids"], "list finds it by metadata")
    finally:
        obs["kill"] = sb.kill()
    check(obs["kill"] is True, "kill returns True")
    obs["kill_again"] = Sandbox.kill(sb.sandbox_id)
    check(obs["kill_again"] is False, "kill of a gone sandbox returns False")
    obs["get_info_after_kill"] = expect_error(lambda: Sandbox.get_info(sb.sandbox_id), e2b.SandboxNotFoundException)
    obs["is_running_after_kill"] = sb.is_running()
    check(obs["is_running_after_kill"] is False, "is_running after kill is False")
    return obs


def sc_create_options():
    obs = {}
    a = Sandbox.create(TEMPLATE, timeout=60, allow_internet_access=False, metadata={"case": "create_options"})
    b = Sandbox.create(
        TEMPLATE,
        timeout=60,
        network={
            "allow_out": ["1.1.1.1", "example.com"],
            "deny_out": ["0.0.0.0/0"],
            "allow_public_traffic": False,
            "mask_request_host": "localhost:${PORT}",
        },
        lifecycle={"on_timeout": "pause", "auto_resume": True},
        secure=True,
    )
    try:
        obs["a_info"] = info_dict(a.get_info())
        obs["b_info"] = info_dict(b.get_info())
        b.update_network({"allow_out": ["8.8.8.8"], "deny_out": ["10.0.0.0/8"]})
        Sandbox.update_network(a.sandbox_id, {"allow_internet_access": True})
        obs["b_info_after_update"] = info_dict(b.get_info())
        obs["b_get_host_3000"] = b.get_host(3000)
        obs["download_url"] = b.download_url("/home/user/x.txt")
        obs["upload_url"] = b.upload_url("/home/user/x.txt", use_signature_expiration=60)
    finally:
        a.kill()
        b.kill()
    return obs


def sc_list_pagination():
    obs = {}
    sbs = [Sandbox.create(TEMPLATE, timeout=60, metadata={"case": "list", "n": str(i), "odd key": "a&b=c"}) for i in range(3)]
    try:
        pager = Sandbox.list(query=SandboxQuery(metadata={"case": "list"}, state=[SandboxState.RUNNING]), limit=2)
        pages = []
        while pager.has_next:
            items = pager.next_items()
            pages.append([s.sandbox_id for s in items])
            obs.setdefault("next_tokens", []).append(pager.next_token)
        obs["pages"] = pages
        seen = [i for p in pages for i in p]
        check(sorted(seen) == sorted(s.sandbox_id for s in sbs), "pagination saw each sandbox once")
        check(len(pages) == 2 and len(pages[0]) == 2, "two pages of limit 2")
        odd = Sandbox.list(query=SandboxQuery(metadata={"odd key": "a&b=c", "n": "1"})).next_items()
        obs["odd_metadata_ids"] = [s.sandbox_id for s in odd]
        check(obs["odd_metadata_ids"] == [sbs[1].sandbox_id], "metadata filter with reserved characters")
        desc = Sandbox.list(query=SandboxQuery(metadata={"case": "list"}), order="desc").next_items()
        obs["desc_ids"] = [s.sandbox_id for s in desc]
        obs["first_listed"] = info_dict(desc[0]) if desc else None
        paused_none = Sandbox.list(query=SandboxQuery(state=[SandboxState.PAUSED], metadata={"case": "list"})).next_items()
        check(paused_none == [], "no paused ones")
        both = Sandbox.list(query=SandboxQuery(
            state=[SandboxState.RUNNING, SandboxState.PAUSED],
            started_after=datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(hours=1),
            template=TEMPLATE,
            metadata={"case": "list"},
        )).next_items()
        obs["both_states_started_after_template"] = sorted(s.sandbox_id for s in both)
        check(len(both) == 3, "state list, started_after and template filters")
    finally:
        for s in sbs:
            s.kill()
    return obs


def sc_pause_resume():
    obs = {}
    sb = Sandbox.create(TEMPLATE, timeout=120, metadata={"case": "pause_resume"})
    try:
        sb.files.write("/home/user/state.txt", "kept across pause")
        h = sb.commands.run("sleep 600", background=True)
        obs["bg_pid"] = h.pid
        obs["pause"] = sb.pause()
        check(obs["pause"] is True, "pause returns True")
        info = Sandbox.get_info(sb.sandbox_id)
        obs["state_after_pause"] = str(info.state)
        check(str(info.state).lower().endswith("paused"), "state paused")
        listed = Sandbox.list(query=SandboxQuery(state=[SandboxState.PAUSED], metadata={"case": "pause_resume"})).next_items()
        obs["listed_paused"] = [s.sandbox_id for s in listed]
        check(sb.sandbox_id in obs["listed_paused"], "listed as paused")
        obs["pause_again"] = Sandbox.pause(sb.sandbox_id)
        check(obs["pause_again"] is False, "pausing a paused sandbox returns False")
        obs["run_while_paused"] = expect_error(lambda: sb.commands.run("true"), e2b.TimeoutException)
        obs["read_while_paused"] = expect_error(lambda: sb.files.read("/home/user/state.txt"), e2b.TimeoutException)
        obs["is_running_while_paused"] = sb.is_running()
        resumed = Sandbox.connect(sb.sandbox_id, timeout=120)
        obs["resumed_id"] = resumed.sandbox_id
        check(resumed.sandbox_id == sb.sandbox_id, "resume keeps the id")
        check(resumed.files.read("/home/user/state.txt") == "kept across pause", "file survives pause")
        obs["beta_pause"] = resumed.beta_pause()
        resumed2 = resumed.connect()
        check(resumed2.commands.run("echo back").stdout == "back\n", "commands after second resume")
        # filesystem-only pause, and a resume that reboots from disk
        obs["pause_filesystem"] = Sandbox.pause(sb.sandbox_id, mode="filesystem")
        resumed3 = Sandbox.connect(sb.sandbox_id, on_resume="reboot")
        check(resumed3.files.read("/home/user/state.txt") == "kept across pause", "file survives a filesystem pause")
    finally:
        sb.kill()
    return obs


def sc_snapshot_fork():
    obs = {}
    sb = Sandbox.create(TEMPLATE, timeout=120, metadata={"case": "snapshot_fork"})
    made = []
    try:
        sb.files.write("/home/user/origin.txt", "from the parent")
        snap = sb.create_snapshot(name="compat-snap")
        obs["snapshot"] = {"snapshot_id": snap.snapshot_id, "names": snap.names}
        snap2 = Sandbox.create_snapshot(sb.sandbox_id, mode="filesystem")
        obs["snapshot_unnamed"] = {"snapshot_id": snap2.snapshot_id, "names": snap2.names}
        check(sb.commands.run("echo still").stdout == "still\n", "source keeps running after snapshot")
        mine = sb.list_snapshots().next_items()
        obs["list_snapshots_of_sandbox"] = [s.snapshot_id for s in mine]
        check(snap.snapshot_id in obs["list_snapshots_of_sandbox"], "snapshot listed for its sandbox")
        allsnaps = Sandbox.list_snapshots(limit=1)
        first = allsnaps.next_items()
        obs["list_snapshots_limit1"] = {"items": [s.snapshot_id for s in first], "has_next": allsnaps.has_next, "next_token": allsnaps.next_token}
        child = Sandbox.create(snap.snapshot_id, timeout=60)
        made.append(child)
        obs["from_snapshot_id"] = child.sandbox_id
        check(child.files.read("/home/user/origin.txt") == "from the parent", "sandbox from snapshot has the file")
        forks = sb.fork(count=2, timeout=60)
        obs["fork_results"] = [f.sandbox_id if isinstance(f, Sandbox) else exc_info(f) for f in forks]
        for f in forks:
            check(isinstance(f, Sandbox), "fork succeeded")
            made.append(f)
            check(f.files.read("/home/user/origin.txt") == "from the parent", "fork has the file")
        f2 = Sandbox.fork(sb.sandbox_id)
        obs["fork_static_default"] = [f.sandbox_id if isinstance(f, Sandbox) else exc_info(f) for f in f2]
        made.extend(f for f in f2 if isinstance(f, Sandbox))
        obs["delete_snapshot"] = Sandbox.delete_snapshot(snap.snapshot_id)
        obs["delete_snapshot_unnamed"] = Sandbox.delete_snapshot(snap2.snapshot_id)
        obs["delete_snapshot_again"] = Sandbox.delete_snapshot(snap.snapshot_id)
        check(obs["delete_snapshot"] is True and obs["delete_snapshot_again"] is False, "delete_snapshot True then False")
    finally:
        for m in made:
            m.kill()
        sb.kill()
    return obs


def sc_commands():
    obs = {}
    sb = Sandbox.create(TEMPLATE, timeout=120)
    try:
        out, err = [], []
        r = sb.commands.run(
            "for i in 1 2 3; do echo out$i; echo err$i >&2; sleep 0.2; done",
            on_stdout=out.append,
            on_stderr=err.append,
        )
        obs["streamed"] = {"stdout_chunks": out, "stderr_chunks": err, "result": vars(r)}
        check(r.stdout == "out1\nout2\nout3\n" and r.stderr == "err1\nerr2\nerr3\n", "stdout/stderr collected")
        check(len(out) == 3, "stdout arrives as it is written (3 chunks)")
        r = sb.commands.run("pwd; echo $A $B; whoami", envs={"A": "1", "B": "two words"}, cwd="/tmp", user="root")
        obs["env_cwd_user"] = vars(r)
        check(r.stdout.splitlines()[:2] == ["/tmp", "1 two words"], "cwd and envs")
        obs["exit_3"] = expect_error(lambda: sb.commands.run("echo partial; exit 3"), e2b.CommandExitException)
        try:
            sb.commands.run("echo partial; exit 3")
        except e2b.CommandExitException as e:
            obs["exit_3_fields"] = {"exit_code": e.exit_code, "stdout": e.stdout, "stderr": e.stderr, "error": e.error}
            check(e.exit_code == 3 and e.stdout == "partial\n", "exit code and output on failure")
        obs["timeout"] = expect_error(lambda: sb.commands.run("sleep 5", timeout=1), e2b.TimeoutException)
        r = sb.commands.run("head -c 100000 /dev/zero | tr '\\0' x")
        obs["large_output_len"] = len(r.stdout)
        check(len(r.stdout) == 100000, "large output complete")
        r = sb.commands.run("printf '\\xff\\xfe text'")
        obs["non_utf8_stdout"] = r.stdout
        obs["bad_cwd"] = expect_error(lambda: sb.commands.run("true", cwd="/nonexistent/dir"), e2b.SandboxException)
    finally:
        sb.kill()
    return obs


def sc_background():
    obs = {}
    sb = Sandbox.create(TEMPLATE, timeout=120)
    try:
        h = sb.commands.run("cat", background=True, stdin=True)
        obs["cat_pid"] = h.pid
        procs = sb.commands.list()
        obs["list"] = [vars(p) for p in procs]
        check(any(p.pid == h.pid for p in procs), "background process listed")
        sb.commands.send_stdin(h.pid, "line one\n")
        h.send_stdin(b"line two\n")
        sb.commands.stream_input(h.pid, ["chunk a\n", b"chunk b\n"])
        sb.commands.close_stdin(h.pid)
        r = h.wait()
        obs["cat_result"] = vars(r)
        check(r.stdout == "line one\nline two\nchunk a\nchunk b\n", "stdin reached the process in order")

        h2 = sb.commands.run("for i in $(seq 1 30); do echo tick$i; sleep 0.1; done", background=True)
        time.sleep(0.35)
        h2.disconnect()
        h3 = sb.commands.connect(h2.pid)
        r3 = h3.wait()
        obs["reconnected_stdout_tail"] = r3.stdout.splitlines()[-1:]
        check(r3.stdout.splitlines()[-1] == "tick30", "reconnected stream reaches the end")

        h4 = sb.commands.run("sleep 300", background=True)
        obs["kill"] = sb.commands.kill(h4.pid)
        check(obs["kill"] is True, "kill running process")
        obs["killed_wait"] = expect_error(lambda: h4.wait(), e2b.CommandExitException)
        obs["kill_missing"] = sb.commands.kill(999999)
        check(obs["kill_missing"] is False, "kill of unknown pid is False")
        obs["send_stdin_missing"] = expect_error(lambda: sb.commands.send_stdin(999999, "x"), e2b.SandboxException)
        obs["connect_missing"] = expect_error(lambda: sb.commands.connect(999999), e2b.SandboxException)
        h5 = sb.commands.run("sleep 300", background=True)
        obs["handle_kill"] = h5.kill()
    finally:
        sb.kill()
    return obs


def sc_files():
    obs = {}
    sb = Sandbox.create(TEMPLATE, timeout=120)
    try:
        w = sb.files.write("/home/user/hello.txt", "Hello, world\n")
        obs["write_text"] = vars(w)
        w = sb.files.write("notes/relative.bin", b"\x00\x01\x02\xff")
        obs["write_bytes_relative"] = vars(w)
        ws = sb.files.write_files([
            {"path": "/home/user/multi/a.txt", "data": "A"},
            {"path": "/home/user/multi/b.txt", "data": b"B"},
        ])
        obs["write_files"] = [vars(x) for x in ws]
        w = sb.files.write("/home/user/octet.txt", "via octet-stream", use_octet_stream=True)
        obs["write_octet"] = vars(w)
        w = sb.files.write("/home/user/gz.txt", "compressed upload", gzip=True)
        obs["write_gzip"] = vars(w)
        w = sb.files.write("/home/user/meta.txt", "with metadata", metadata={"owner": "compat"})
        obs["write_metadata"] = vars(w)
        obs["read_text"] = sb.files.read("/home/user/hello.txt")
        check(obs["read_text"] == "Hello, world\n", "read text")
        obs["read_bytes"] = list(sb.files.read("/home/user/notes/relative.bin", format="bytes"))
        check(obs["read_bytes"] == [0, 1, 2, 255], "read bytes of a relative path")
        obs["read_stream"] = b"".join(sb.files.read("/home/user/octet.txt", format="stream")).decode()
        obs["read_gzip"] = sb.files.read("/home/user/gz.txt", gzip=True)
        check(obs["read_gzip"] == "compressed upload", "gzip upload+download")
        entries = sb.files.list("/home/user")
        obs["list"] = [entry_dict(e) for e in entries]
        deep = sb.files.list("/home/user", depth=2)
        obs["list_depth2_paths"] = [e.path for e in deep]
        check("/home/user/multi/a.txt" in obs["list_depth2_paths"], "depth 2 lists nested files")
        obs["exists_yes"] = sb.files.exists("/home/user/hello.txt")
        obs["exists_no"] = sb.files.exists("/home/user/nope.txt")
        check(obs["exists_yes"] is True and obs["exists_no"] is False, "exists")
        obs["get_info"] = entry_dict(sb.files.get_info("/home/user/hello.txt"))
        obs["get_info_dir"] = entry_dict(sb.files.get_info("/home/user/multi"))
        meta = sb.files.get_info("/home/user/meta.txt").metadata
        obs["get_info_metadata"] = meta
        check(meta == {"owner": "compat"}, "upload metadata comes back on get_info")
        obs["make_dir_new"] = sb.files.make_dir("/home/user/newdir/sub")
        obs["make_dir_existing"] = sb.files.make_dir("/home/user/newdir/sub")
        check(obs["make_dir_new"] is True and obs["make_dir_existing"] is False, "make_dir True then False")
        moved = sb.files.rename("/home/user/hello.txt", "/home/user/newdir/hello2.txt")
        obs["rename"] = entry_dict(moved)
        check(sb.files.read("/home/user/newdir/hello2.txt") == "Hello, world\n", "renamed file readable")
        sb.commands.run("ln -s /home/user/newdir/hello2.txt /home/user/link.txt")
        obs["symlink_info"] = entry_dict(sb.files.get_info("/home/user/link.txt"))
        sb.files.remove("/home/user/newdir")
        check(not sb.files.exists("/home/user/newdir"), "remove dir recursively")
        obs["read_missing"] = expect_error(lambda: sb.files.read("/home/user/missing.txt"), e2b.FileNotFoundException)
        obs["read_dir"] = expect_error(lambda: sb.files.read("/home/user/multi"), e2b.SandboxException)
        obs["list_missing"] = expect_error(lambda: sb.files.list("/home/user/missing"), e2b.FileNotFoundException)
        obs["get_info_missing"] = expect_error(lambda: sb.files.get_info("/home/user/missing"), e2b.FileNotFoundException)
        obs["rename_missing"] = expect_error(lambda: sb.files.rename("/home/user/missing", "/home/user/x"), e2b.FileNotFoundException)
        obs["remove_missing"] = expect_error(lambda: sb.files.remove("/home/user/missing"), e2b.FileNotFoundException)
        # signed URLs: fetched without the access token, as a browser would
        url = sb.download_url("/home/user/multi/a.txt")
        obs["download_url"] = url
        r = httpx.get(url, headers={"E2b-Sandbox-Id": sb.sandbox_id})
        obs["download_url_fetch"] = {"status": r.status_code, "body": r.text}
        check(r.status_code == 200 and r.text == "A", "signed download URL works")
        url = sb.upload_url("/home/user/uploaded.txt")
        obs["upload_url"] = url
        r = httpx.post(url, headers={"E2b-Sandbox-Id": sb.sandbox_id}, files={"file": ("uploaded.txt", b"via signed url")})
        obs["upload_url_post"] = {"status": r.status_code, "body": r.text}
        check(sb.files.read("/home/user/uploaded.txt") == "via signed url", "signed upload URL works")
        r = httpx.get(url.replace("signature=", "signature=x"), headers={"E2b-Sandbox-Id": sb.sandbox_id})
        obs["bad_signature_fetch"] = {"status": r.status_code, "body": r.text}
    finally:
        sb.kill()
    return obs


def sc_watch():
    obs = {}
    sb = Sandbox.create(TEMPLATE, timeout=120)
    try:
        sb.files.make_dir("/home/user/watched")
        wh = sb.files.watch_dir("/home/user/watched")
        sb.files.write("/home/user/watched/f.txt", "1")
        sb.commands.run("echo more >> /home/user/watched/f.txt; chmod 600 /home/user/watched/f.txt")
        sb.files.rename("/home/user/watched/f.txt", "/home/user/watched/g.txt")
        sb.files.remove("/home/user/watched/g.txt")
        time.sleep(0.3)
        evs = wh.get_new_events()
        obs["events"] = [event_dict(e) for e in evs]
        kinds = {str(e.type).split(".")[-1].lower() for e in evs}
        check({"create", "write", "remove", "rename"} <= kinds, "watch saw create/write/rename/remove: %s" % kinds)
        wh.stop()
        wr = sb.files.watch_dir("/home/user/watched", recursive=True, include_entry=True)
        sb.files.write("/home/user/watched/sub/deep.txt", "x")
        time.sleep(0.3)
        evs = wr.get_new_events()
        obs["recursive_events"] = [event_dict(e) for e in evs]
        obs["recursive_first_entry"] = entry_dict(evs[0].entry) if evs and getattr(evs[0], "entry", None) else None
        wr.stop()
        obs["watch_missing"] = expect_error(lambda: sb.files.watch_dir("/home/user/nope"), e2b.SandboxException)
        obs["events_after_stop"] = expect_error(lambda: wh.get_new_events(), e2b.SandboxException)
    finally:
        sb.kill()
    return obs


def sc_pty():
    obs = {}
    sb = Sandbox.create(TEMPLATE, timeout=120)
    try:
        from e2b.sandbox.commands.command_handle import PtySize

        h = sb.pty.create(PtySize(rows=24, cols=80), envs={"PS1": "$ "})
        obs["pid"] = h.pid
        sb.pty.resize(h.pid, PtySize(rows=40, cols=100))
        sb.pty.send_stdin(h.pid, b"stty size; exit 7\n")
        chunks = []
        try:
            h.wait(on_pty=lambda d: chunks.append(bytes(d)))
        except e2b.CommandExitException as e:
            obs["exit_code"] = e.exit_code
        out = b"".join(chunks).decode("utf-8", "replace")
        obs["pty_output"] = out[-400:]
        check("40 100" in out, "resize reached the terminal")
        h2 = sb.pty.create(PtySize(rows=24, cols=80))
        obs["pty_kill"] = sb.pty.kill(h2.pid)
    finally:
        sb.kill()
    return obs


def sc_errors():
    obs = {}
    obs["bad_key_create"] = expect_error(lambda: Sandbox.create(TEMPLATE, api_key="e2b_wrong"), e2b.AuthenticationException)
    obs["bad_key_list"] = expect_error(lambda: Sandbox.list(api_key="e2b_wrong").next_items(), e2b.AuthenticationException)
    obs["connect_unknown"] = expect_error(lambda: Sandbox.connect("doesnotexist0000"), e2b.SandboxNotFoundException)
    obs["get_info_unknown"] = expect_error(lambda: Sandbox.get_info("doesnotexist0000"), e2b.SandboxNotFoundException)
    obs["set_timeout_unknown"] = expect_error(lambda: Sandbox.set_timeout("doesnotexist0000", 30), e2b.SandboxNotFoundException)
    obs["pause_unknown"] = expect_error(lambda: Sandbox.pause("doesnotexist0000"), e2b.SandboxNotFoundException)
    obs["fork_unknown"] = expect_error(lambda: Sandbox.fork("doesnotexist0000"), e2b.SandboxNotFoundException)
    obs["create_unknown_template"] = expect_error(lambda: Sandbox.create("missing-template"), e2b.SandboxException)
    obs["kill_unknown"] = Sandbox.kill("doesnotexist0000")
    sb = Sandbox.create(TEMPLATE, timeout=2)
    keep = sb.commands.run("echo alive").stdout
    obs["alive"] = keep
    time.sleep(3.5)  # the sandbox reaches its timeout
    obs["run_after_timeout"] = expect_error(lambda: sb.commands.run("true"), e2b.SandboxNotRunningException)
    obs["read_after_timeout"] = expect_error(lambda: sb.files.read("/etc/hostname"), e2b.SandboxNotRunningException)
    obs["write_after_timeout"] = expect_error(lambda: sb.files.write("/tmp/x", "x"), e2b.SandboxNotRunningException)
    obs["list_after_timeout"] = expect_error(lambda: sb.files.list("/"), e2b.SandboxNotRunningException)
    obs["is_running_after_timeout"] = sb.is_running()
    sb2 = Sandbox.create(TEMPLATE, timeout=60)
    try:
        h = sb2.commands.run("sleep 30", background=True)
        Sandbox.kill(sb2.sandbox_id)
        obs["wait_when_killed"] = expect_error(lambda: h.wait(), e2b.SandboxException)
    finally:
        sb2.kill()
    return obs


def sc_keepalive():
    """Long quiet streams: envd sends keepalive events (every Keepalive-Ping-Interval
    seconds, 50 by default; the recorder is started with --keepalive 1 for this one)."""
    obs = {}
    sb = Sandbox.create(TEMPLATE, timeout=60)
    try:
        r = sb.commands.run("sleep 2.5; echo done")
        obs["stdout"] = r.stdout
        check(r.stdout == "done\n", "output after a quiet spell")
        h = sb.commands.run("sleep 2.5; echo bg", background=True)
        obs["background"] = h.wait().stdout
    finally:
        sb.kill()
    return obs


async def _async_basics():
    obs = {}
    sb = await AsyncSandbox.create(TEMPLATE, timeout=120, metadata={"case": "async"})
    try:
        out = []
        r = await sb.commands.run("echo a; sleep 0.2; echo b", on_stdout=out.append)
        obs["run"] = {"chunks": out, "stdout": r.stdout}
        check(r.stdout == "a\nb\n", "async run output")
        h = await sb.commands.run("cat", background=True, stdin=True)
        await sb.commands.send_stdin(h.pid, "piped\n")
        await sb.commands.close_stdin(h.pid)
        r = await h.wait()
        obs["cat"] = r.stdout
        check(r.stdout == "piped\n", "async stdin")
        await sb.files.make_dir("/home/user/w")
        events = []
        wh = await sb.files.watch_dir("/home/user/w", on_event=events.append, recursive=True)
        await sb.files.write("/home/user/w/one.txt", "1")
        await sb.files.write("/home/user/w/two.txt", "2")
        await sb.files.remove("/home/user/w/one.txt")
        await asyncio.sleep(0.5)
        await wh.stop()
        obs["stream_watch_events"] = [event_dict(e) for e in events]
        check(any(str(e.type).lower().endswith("create") and e.name == "two.txt" for e in events), "stream watch create")
        obs["read"] = await sb.files.read("/home/user/w/two.txt")
        obs["list"] = [e.name for e in await sb.files.list("/home/user/w")]
        obs["info"] = info_dict(await sb.get_info())
        obs["timeout"] = await aexpect_error(lambda: sb.commands.run("sleep 5", timeout=1), e2b.TimeoutException)
        forks = await sb.fork()
        obs["fork"] = [f.sandbox_id if isinstance(f, AsyncSandbox) else exc_info(f) for f in forks]
        for f in forks:
            if isinstance(f, AsyncSandbox):
                await f.kill()
        obs["pause"] = await sb.pause()
        sb2 = await AsyncSandbox.connect(sb.sandbox_id)
        obs["after_resume"] = (await sb2.commands.run("echo resumed")).stdout
    finally:
        await sb.kill()
    return obs


def sc_async_basics():
    return asyncio.run(_async_basics())


# Templates ------------------------------------------------------------------------------

# Set by record.sh: the recorder fakes builds (it runs no step), so only the wire is
# checked there, not what a step did inside the sandbox.
RECORDING = os.environ.get("SCENARIO_RECORDING") == "1"


def template_context():
    """A directory of local files for COPY: data/hello.txt and data/sub/deep.txt."""
    import tempfile

    ctx = tempfile.mkdtemp(prefix="e2b-tpl-")
    os.makedirs(os.path.join(ctx, "data", "sub"))
    with open(os.path.join(ctx, "data", "hello.txt"), "w") as f:
        f.write("hello from the context\n")
    with open(os.path.join(ctx, "data", "sub", "deep.txt"), "w") as f:
        f.write("deep\n")
    return ctx


def run_out(sb, cmd):
    return sb.commands.run(cmd, user="root").stdout


def sc_templates():
    from e2b import Template, wait_for_file

    obs = {}
    ctx = template_context()
    name = "compat-py-builder"
    builder = (
        Template(file_context_path=ctx)
        .from_template(TEMPLATE)
        .copy("data/hello.txt", "/home/user/hello.txt")
        .copy("data/sub", "/opt/sub/")
        .set_envs({"GREETING": "hi there"})
        .run_cmd("echo built-$GREETING > /opt/built.txt")
        .set_workdir("/opt")
        .set_user("user")
        .set_start_cmd("echo started > /tmp/started; sleep infinity", wait_for_file("/tmp/started"))
    )
    logs = []
    info = Template.build(builder, name, cpu_count=1, memory_mb=1024, on_build_logs=logs.append)
    obs["build"] = {"template_id": info.template_id, "name": info.name, "log_count": len(logs)}
    obs["first_logs"] = [str(e.message) for e in logs][:8]
    check(info.name == name, "the build answers the template's name")
    check(Template.exists(name) is True, "the built template exists")
    check(Template.exists("compat-py-never-built") is False, "an unknown template does not")
    sb = Sandbox.create(template=name, timeout=120)
    try:
        if not RECORDING:
            check(run_out(sb, "cat /home/user/hello.txt") == "hello from the context\n", "the COPY of a file")
            check(run_out(sb, "cat /opt/sub/deep.txt") == "deep\n", "the COPY of a directory")
            check(sb.commands.run("echo $GREETING").stdout == "hi there\n", "the ENV reaches commands")
            check(run_out(sb, "cat /opt/built.txt") == "built-hi there\n", "the RUN's effect, with the ENV")
            check(run_out(sb, "cat /tmp/started") == "started\n", "the start command ran before create answered")
        sinfo = sb.get_info()
        obs["sandbox_template"] = sinfo.template_id
        obs["sandbox_resources"] = [sinfo.cpu_count, sinfo.memory_mb]
        if not RECORDING:
            check(sinfo.memory_mb == 1024, "the template's memory_mb: %r" % sinfo.memory_mb)
    finally:
        sb.kill()
    # The same template again: the files are here already, the steps come from the cache.
    again = []
    Template.build(builder, name, on_build_logs=again.append)
    messages = [str(e.message) for e in again]
    obs["second_build_logs"] = messages[:30]
    check(any("already cached" in m for m in messages), "the second build skips the upload")
    if not RECORDING:
        check(any("(cached)" in m for m in messages), "the second build reuses cached steps")

    dockerfile = (
        "FROM %s\n"
        "COPY data/hello.txt /srv/hello.txt\n"
        "ENV MODE=dockerfile\n"
        "RUN echo $MODE > /srv/mode.txt\n" % TEMPLATE
    )
    df = Template(file_context_path=ctx).from_dockerfile(dockerfile)
    Template.build(df, "compat-py-dockerfile")
    sb = Sandbox.create(template="compat-py-dockerfile", timeout=120)
    try:
        if not RECORDING:
            check(run_out(sb, "cat /srv/hello.txt") == "hello from the context\n", "Dockerfile COPY")
            check(run_out(sb, "cat /srv/mode.txt") == "dockerfile\n", "Dockerfile RUN with its ENV")
            check(sb.commands.run("echo $MODE").stdout == "dockerfile\n", "Dockerfile ENV")
    finally:
        sb.kill()

    failing = Template().from_template(TEMPLATE).run_cmd("echo fine").run_cmd("echo about to fail; exit 3")
    obs["failing"] = expect_error(lambda: Template.build(failing, "compat-py-fails"), e2b.BuildException)
    check("step 2" in obs["failing"]["message"], "the error names the failing step: %s" % obs["failing"]["message"])
    if not RECORDING:
        # sandfork has no template tags: a name:tag build is refused, naming them.
        obs["tags"] = expect_error(lambda: Template.build(failing, "compat-py-fails:v1"), e2b.BuildException)
        check("template tags" in obs["tags"]["message"], "tags are refused by name")
    return obs


async def _templates_async():
    from e2b import AsyncTemplate

    obs = {}
    ctx = template_context()
    t = (
        AsyncTemplate(file_context_path=ctx)
        .from_image(TEMPLATE)
        .copy("data/hello.txt", "/srv/async.txt")
        .run_cmd("wc -c < /srv/async.txt > /srv/size.txt")
    )
    info = await AsyncTemplate.build(t, "compat-py-async")
    obs["build"] = {"template_id": info.template_id, "build_id": bool(info.build_id)}
    sb = await AsyncSandbox.create(template="compat-py-async", timeout=120)
    try:
        if not RECORDING:
            r = await sb.commands.run("cat /srv/size.txt", user="root")
            check(r.stdout.strip() == "23", "the async build's RUN: %r" % r.stdout)
    finally:
        await sb.kill()
    obs["failing"] = await aexpect_error(
        lambda: AsyncTemplate.build(AsyncTemplate().from_image(TEMPLATE).run_cmd("false"), "compat-py-async-fails"),
        e2b.BuildException,
    )
    check("step 1" in obs["failing"]["message"], "the async error names the step")
    return obs


def sc_templates_async():
    return asyncio.run(_templates_async())


SCENARIOS = {
    "lifecycle": sc_lifecycle,
    "create_options": sc_create_options,
    "list_pagination": sc_list_pagination,
    "pause_resume": sc_pause_resume,
    "snapshot_fork": sc_snapshot_fork,
    "commands": sc_commands,
    "background": sc_background,
    "files": sc_files,
    "watch": sc_watch,
    "pty": sc_pty,
    "errors": sc_errors,
    "keepalive": sc_keepalive,
    "async_basics": sc_async_basics,
    "templates": sc_templates,
    "templates_async": sc_templates_async,
}


def jsonable(o):
    if isinstance(o, (bytes, bytearray)):
        return o.decode("utf-8", "replace")
    if isinstance(o, (datetime.datetime, datetime.date)):
        return o.isoformat()
    return str(o)


def main(argv):
    if "--list" in argv:
        print("\n".join(SCENARIOS))
        return 0
    names = [a for a in argv if not a.startswith("-")] or list(SCENARIOS)
    failed = 0
    out_dir = os.environ.get("SCENARIO_OUT")
    for name in names:
        rec = {"scenario": name, "sdk": "python", "sdk_version": importlib.metadata.version("e2b")}
        t0 = time.time()
        try:
            rec["observations"] = SCENARIOS[name]()
            rec["ok"] = True
        except Exception as e:  # noqa: BLE001
            failed += 1
            rec["ok"] = False
            rec["error"] = exc_info(e)
            rec["traceback"] = traceback.format_exc()
        rec["seconds"] = round(time.time() - t0, 2)
        line = json.dumps(rec, default=jsonable)
        print(line, flush=True)
        if out_dir:
            with open(os.path.join(out_dir, name + ".sdk.json"), "w") as f:
                json.dump(json.loads(line), f, indent=1, ensure_ascii=False)
                f.write("\n")
    print("%d passed, %d failed" % (len(names) - failed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
