"""`sandfork mcp` driven by the reference MCP client library over both transports: every
tool and both resources, the fork pattern (a memory checkpoint, three forks, each with the
warm state and none seeing another's writes), bounded outputs, errors, and the HTTP
transport's bearer token."""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import time
import urllib.request

import pytest
from conftest import McpEnv, connect, raw_post

TRANSPORTS = ["stdio", "http"]
TOOLS = {
    "create_sandbox", "list_sandboxes", "run_command", "read_file", "write_file", "list_files",
    "checkpoint", "fork", "suspend", "resume", "terminate", "get_port_url",
}  # fmt: skip


async def call(client, tool: str, **args) -> dict:
    """A tool's structured answer; fails the test on a tool error."""
    r = await client.call_tool(tool, args)
    assert not r.is_error, f"{tool} failed: {r.content}"
    assert r.content and r.content[0].type == "text"
    # The text block carries the same JSON as the structured content.
    assert json.loads(r.content[0].text) == r.structured_content
    return r.structured_content


async def call_error(client, tool: str, **args) -> dict:
    """A tool's error (the result must have is_error)."""
    r = await client.call_tool(tool, args)
    assert r.is_error, f"{tool} should have failed: {r.structured_content}"
    assert r.content and r.content[0].type == "text"
    return r.structured_content["error"]


async def sh(client, sandbox: str, script: str, **kw) -> dict:
    return await call(client, "run_command", sandbox=sandbox, shell=script, **kw)


async def eventually(client, sandbox: str, script: str, expect: str, timeout: float = 20.0) -> str:
    """Runs `script` until its stdout holds `expect`."""
    deadline = time.monotonic() + timeout
    while True:
        out = (await sh(client, sandbox, script))["stdout"]
        if expect in out or time.monotonic() > deadline:
            assert expect in out, f"{script!r} never printed {expect!r} (last: {out!r})"
            return out
        await asyncio.sleep(0.2)


def run(coro):
    return asyncio.run(coro)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_tools_and_resources_are_listed(env: McpEnv, transport: str) -> None:
    async def go():
        async with connect(env, transport) as client:
            tools = await client.list_tools()
            names = {t.name for t in tools.tools}
            assert names == TOOLS
            for t in tools.tools:
                assert t.description and t.input_schema["type"] == "object", t.name
            run_command = next(t for t in tools.tools if t.name == "run_command")
            assert {"sandbox", "command", "shell", "timeout_secs"} <= set(run_command.input_schema["properties"])
            templates = {t.uri_template for t in (await client.list_resource_templates()).resource_templates}
            assert templates == {"sandfork://sandboxes/{id}/files/{path}", "sandfork://sandboxes/{id}/logs"}

    run(go())


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_sandbox_end_to_end(env: McpEnv, transport: str) -> None:
    """create, run (argv, shell, timeout, bounded output, background), files, resources,
    filesystem checkpoint, suspend/resume, port URL, terminate."""

    async def go():
        async with connect(env, transport) as client:
            sb = await call(client, "create_sandbox", image="busybox", cpus=0.5, memory_mb=256,
                            env={"GREETING": "hello-mcp"}, network="none", name=f"mcp-{transport}")  # fmt: skip
            sid = sb["id"]
            try:
                assert sb["state"] == "running" and sb["cpus"] == 0.5 and sb["memory_mb"] == 256
                assert sb["network"]["mode"] == "none"
                listed = await call(client, "list_sandboxes")
                assert sid in {s["id"] for s in listed["sandboxes"]}

                # Commands: argv, exit code, stderr; a shell script; the sandbox's env.
                r = await call(client, "run_command", sandbox=sid, command=["sh", "-c", "echo $GREETING; echo oops >&2; exit 3"])
                assert (r["exit_code"], r["stdout"], r["stderr"], r["timed_out"]) == (3, "hello-mcp\n", "oops\n", False)
                r = await sh(client, f"mcp-{transport}", "echo $((6*7)) | tr 4 X", env={"EXTRA": "1"})
                assert r["stdout"] == "X2\n" and r["exit_code"] == 0
                r = await sh(client, sid, "sleep 30", timeout_secs=1)
                assert r["timed_out"] is True and r["exit_code"] is None
                # Output is bounded, and says so.
                r = await sh(client, sid, "head -c 300000 /dev/zero | tr '\\0' a", max_output_bytes=1000)
                assert r["stdout_truncated"] is True and r["stdout_bytes"] == 300000
                assert r["stdout"].startswith("a" * 1000) and "truncated" in r["stdout"][1000:]
                r = await sh(client, sid, "printf '\\377\\376'")
                assert base64.b64decode(r["stdout_b64"]) == b"\xff\xfe"

                # Files: write text and bytes, read them back, list the directory.
                w = await call(client, "write_file", sandbox=sid, path="/work/notes/a.txt", content="line one\nline two\n")
                assert w["bytes_written"] == 18
                await call(client, "write_file", sandbox=sid, path="/work/bin.dat", encoding="base64",
                           content=base64.b64encode(bytes(range(256))).decode(), mode="0600")  # fmt: skip
                f = await call(client, "read_file", sandbox=sid, path="/work/notes/a.txt")
                assert (f["content"], f["encoding"], f["truncated"]) == ("line one\nline two\n", "utf8", False)
                f = await call(client, "read_file", sandbox=sid, path="/work/bin.dat")
                assert f["encoding"] == "base64" and base64.b64decode(f["content"]) == bytes(range(256))
                await sh(client, sid, "head -c 50000 /dev/zero | tr '\\0' z > /work/big.txt")
                f = await call(client, "read_file", sandbox=sid, path="/work/big.txt", max_bytes=100)
                assert f["truncated"] is True and f["content"] == "z" * 100 and f["size"] == 50000
                assert "100 of 50000 bytes" in f["note"]
                ls = await call(client, "list_files", sandbox=sid, path="/work")
                kinds = {e["name"]: e["type"] for e in ls["entries"]}
                assert kinds == {"notes": "dir", "bin.dat": "file", "big.txt": "file"}
                assert (await sh(client, sid, "stat -c %a /work/bin.dat"))["stdout"] == "600\n"

                # The files resource: a file, a directory, bytes.
                res = await client.read_resource(f"sandfork://sandboxes/{sid}/files/work/notes/a.txt")
                assert res.contents[0].text == "line one\nline two\n"
                res = await client.read_resource(f"sandfork://sandboxes/{sid}/files/work")
                listing = json.loads(res.contents[0].text)
                assert {e["name"] for e in listing["entries"]} == {"notes", "bin.dat", "big.txt"}
                res = await client.read_resource(f"sandfork://sandboxes/{sid}/files/work/bin.dat")
                assert base64.b64decode(res.contents[0].blob) == bytes(range(256))

                # A background process: its lines reach the logs resource.
                bg = await call(client, "run_command", sandbox=sid, background=True,
                                shell="echo started-$GREETING; while :; do sleep 1; done")  # fmt: skip
                assert bg["pid"] and bg["logs"] == f"sandfork://sandboxes/{sid}/logs"
                deadline = time.monotonic() + 20
                while True:
                    log = (await client.read_resource(bg["logs"])).contents[0].text
                    if "started-hello-mcp" in log or time.monotonic() > deadline:
                        break
                    await asyncio.sleep(0.2)
                assert "started-hello-mcp" in log
                listed = await client.list_resources()
                assert bg["logs"] in {str(r.uri) for r in listed.resources}

                # A filesystem checkpoint, and a sandbox made from it.
                snap = await call(client, "checkpoint", sandbox=sid, type="filesystem")
                assert snap["type"] == "filesystem" and snap["id"]
                again = await call(client, "create_sandbox", snapshot_id=snap["id"])
                try:
                    assert (await sh(client, again["id"], "cat /work/notes/a.txt"))["stdout"] == "line one\nline two\n"
                finally:
                    await call(client, "terminate", sandbox=again["id"])

                # Suspend and resume: the background process goes on where it was.
                s = await call(client, "suspend", sandbox=sid)
                assert s["state"] == "suspended"
                s = await call(client, "resume", sandbox=sid)
                assert s["state"] == "running"
                ps = (await sh(client, sid, "ps -o pid,args"))["stdout"]
                assert "sleep 1" in ps or "while" in ps

                # A port URL that opens what the sandbox serves.
                await call(client, "write_file", sandbox=sid, path="/www/index.html", content="served-by-sandbox\n")
                await call(client, "run_command", sandbox=sid, background=True, command=["httpd", "-f", "-p", "127.0.0.1:8080", "-h", "/www"])
                url = await call(client, "get_port_url", sandbox=sid, port=8080, expires_in_secs=600)
                assert url["url"].startswith(env.daemon_http + "/v1/sandboxes/") and url["access_token"]
                deadline = time.monotonic() + 20
                while True:
                    try:
                        with urllib.request.urlopen(url["url"], timeout=5) as resp:
                            body = resp.read().decode()
                            break
                    except OSError:
                        if time.monotonic() > deadline:
                            raise
                        await asyncio.sleep(0.3)
                assert body == "served-by-sandbox\n"
            finally:
                t = await call(client, "terminate", sandbox=sid)
                assert t["state"] == "terminated"

    run(go())


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_fork_pattern_each_child_is_warm_and_isolated(env: McpEnv, transport: str) -> None:
    """Set up once, memory checkpoint, fork 3: every child has the value that lived only in
    a process's memory, and a child's writes stay its own."""

    async def go():
        async with connect(env, transport) as client:
            sid = (await call(client, "create_sandbox", image="busybox", network="none"))["id"]
            children = []
            try:
                # The warm state: a value drawn once and kept in a shell variable; the
                # process writes it to /tmp/warm every 0.2 s.
                await call(client, "run_command", sandbox=sid, background=True,
                           shell="v=$(cat /proc/sys/kernel/random/uuid); echo warm-$v; "
                                 "while :; do echo $v > /tmp/warm; sleep 0.2; done")  # fmt: skip
                warm = (await eventually(client, sid, "cat /tmp/warm 2>/dev/null", "-")).strip()
                snap = await call(client, "checkpoint", sandbox=sid, type="memory", name=f"warm-{transport}")
                assert snap["type"] == "memory"
                forked = await call(client, "fork", snapshot_id=snap["id"], count=3, name_prefix=f"child-{transport}")
                assert forked["failed"] == 0 and len(forked["children"]) == 3
                children = [c["id"] for c in forked["children"]]
                assert [c["name"] for c in forked["children"]] == [f"child-{transport}-{i}" for i in range(3)]
                for i, child in enumerate(children):
                    # The file comes back from the process's memory, not from the disk.
                    await sh(client, child, "rm -f /tmp/warm")
                    assert (await eventually(client, child, "cat /tmp/warm 2>/dev/null", "-")).strip() == warm
                    await call(client, "write_file", sandbox=child, path="/tmp/mine", content=f"child {i}")
                for i, child in enumerate(children):
                    ls = await call(client, "run_command", sandbox=child, command=["cat", "/tmp/mine"])
                    assert ls["stdout"] == f"child {i}"
                    log = (await client.read_resource(f"sandfork://sandboxes/{child}/logs")).contents[0].text
                    assert f"warm-{warm}" in log
                # A fork of the live sandbox, too.
                live = await call(client, "fork", sandbox=sid, count=1)
                assert live["failed"] == 0
                children.append(live["children"][0]["id"])
                assert (await eventually(client, children[-1], "cat /tmp/warm", "-")).strip() == warm
            finally:
                for child in children:
                    await call(client, "terminate", sandbox=child)
                await call(client, "terminate", sandbox=sid)

    run(go())


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_errors_name_what_is_wrong(env: McpEnv, transport: str) -> None:
    from mcp import MCPError

    async def go():
        async with connect(env, transport) as client:
            e = await call_error(client, "create_sandbox", image="busybox", gpus=1)
            assert e["code"] == "unsupported" and e["feature"] == "GPUs" and "GPU" in e["message"]
            e = await call_error(client, "run_command", sandbox="sb-0000000000000000", command=["true"])
            assert e["code"] == "not_found" and e["status"] == 404
            e = await call_error(client, "run_command", sandbox="x", command=["true"], shell="true")
            assert e["code"] == "invalid_argument"
            e = await call_error(client, "fork", count=2)
            assert "snapshot_id or sandbox" in e["message"]
            e = await call_error(client, "read_file", sandbox="x", path="relative")
            assert "absolute" in e["message"]
            # Arguments that do not fit the schema: a tool error naming the field.
            r = await client.call_tool("run_command", {"sandbox": "x", "shell": "true", "bogus": 1})
            assert r.is_error and "bogus" in r.content[0].text
            with pytest.raises(MCPError):
                await client.call_tool("no_such_tool", {})
            with pytest.raises(MCPError) as err:
                await client.read_resource("sandfork://sandboxes/sb-0000000000000000/logs")
            # Resource not found: -32002 before the 2026-07-28 protocol, -32602 since.
            assert err.value.code in (-32002, -32602)
            assert err.value.error.data["code"] == "not_found"
            with pytest.raises(MCPError):
                await client.read_resource("sandfork://elsewhere/x")

    run(go())


def test_http_refuses_requests_without_the_daemons_token(env: McpEnv) -> None:
    assert raw_post(env.mcp_url, {}) == 401
    assert raw_post(env.mcp_url, {"Authorization": "Bearer wrong"}) == 401
    assert raw_post(env.mcp_url, {"Authorization": f"Bearer {env.token}x"}) == 401
    assert raw_post(env.mcp_url.replace("/mcp", "/other"), {"Authorization": f"Bearer {env.token}"}) == 404
    assert raw_post(env.mcp_url, {"Authorization": f"Bearer {env.token}"}) not in (401, 403, 404)

    async def with_token(token):
        async with connect(env, "http", token=token) as client:
            await client.list_tools()

    # The client library cannot even start a session without the token (it reports the
    # 401 as a failed request).
    for token in (None, "wrong"):
        with pytest.raises(BaseException) as err:
            run(with_token(token))
        assert "MCPError" in repr(err.value) or "401" in repr(err.value), repr(err.value)
    run(with_token(""))  # the right one


def test_http_needs_a_token_to_start(env: McpEnv, tmp_path) -> None:
    out = subprocess.run(
        [str(env.binary), "mcp", "--http", "127.0.0.1:0", "--url", f"unix://{tmp_path}/none.sock"],
        capture_output=True, text=True, timeout=30, env={"PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert out.returncode != 0 and "token" in out.stderr
    # Nor on a non-loopback address (its clients would send the token in the clear)
    # unless told to.
    out = subprocess.run(
        [str(env.binary), "mcp", "--http", "0.0.0.0:0", "--token", "t", "--url", f"unix://{tmp_path}/none.sock"],
        capture_output=True, text=True, timeout=30, env={"PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert out.returncode != 0 and "--allow-remote" in out.stderr
