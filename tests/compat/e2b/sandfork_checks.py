#!/usr/bin/env python3
"""What the recorded scenarios cannot show against sandfork, driven through the
unmodified E2B Python SDK (same environment and output as ``scenarios_py.py``):

* ``create_options_rest`` and ``files_rest``: the steps of ``create_options`` and
  ``files`` that come after the feature sandfork lacks (``network.maskRequestHost``,
  upload metadata), and that lack itself as the error the SDK raises;
* ``fork_pattern``: a sandbox with warm in-memory state (a process holding a random
  value only in memory), a memory snapshot of it, 5 sandboxes restored from the snapshot
  and 5 forks, each proven warm (the same process answers with the same value).

Usage:  sandfork_checks.py [SCENARIO ...]   (none: all)
"""

import json
import os
import sys
import time
import traceback

import httpx

import e2b
from e2b import Sandbox

TEMPLATE = os.environ.get("E2B_TEMPLATE", "base")

# A process whose value lives only in its memory: on SIGUSR1 it writes it to a file.
WARM = (
    "import os, random, signal, time\n"
    "v = '%016x' % random.getrandbits(64)\n"
    "def dump(*_):\n"
    "    open('/tmp/warm.out', 'w').write(v)\n"
    "signal.signal(signal.SIGUSR1, dump)\n"
    "open('/tmp/warm.pid', 'w').write(str(os.getpid()))\n"
    "print(v, flush=True)\n"
    "while True:\n"
    "    time.sleep(0.05)\n"
)


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def exc_info(e):
    return {"type": type(e).__name__, "mro": [c.__name__ for c in type(e).__mro__], "message": str(e)[:500]}


def expect_error(fn, *types):
    try:
        res = fn()
    except Exception as e:  # noqa: BLE001
        if types and not isinstance(e, types):
            raise AssertionError("expected %s, got %s: %s" % ([t.__name__ for t in types], type(e).__name__, e))
        return exc_info(e)
    raise AssertionError("expected %s, got %r" % ([t.__name__ for t in types], res))


def sc_create_options_rest():
    obs = {}
    obs["mask_request_host"] = expect_error(
        lambda: Sandbox.create(TEMPLATE, timeout=60, network={"mask_request_host": "localhost:${PORT}"}), e2b.SandboxException
    )
    check("maskRequestHost" in obs["mask_request_host"]["message"], "the error names the feature")
    a = Sandbox.create(TEMPLATE, timeout=60, allow_internet_access=False, metadata={"case": "create_options"})
    b = Sandbox.create(
        TEMPLATE,
        timeout=60,
        network={"allow_out": ["1.1.1.1", "example.com"], "deny_out": ["0.0.0.0/0"], "allow_public_traffic": False},
        lifecycle={"on_timeout": "pause", "auto_resume": True},
    )
    try:
        ai, bi = a.get_info(), b.get_info()
        obs["a_info"] = {"allow_internet_access": ai.allow_internet_access, "network": str(ai.network)}
        obs["b_info"] = {"network": str(bi.network), "lifecycle": str(bi.lifecycle)}
        check(ai.allow_internet_access is False, "allow_internet_access=False is reported")
        check(bi.lifecycle and bi.lifecycle.get("on_timeout") == "pause", "lifecycle on_timeout pause: %r" % (bi.lifecycle,))
        b.update_network({"allow_out": ["8.8.8.8"], "deny_out": ["10.0.0.0/8"]})
        Sandbox.update_network(a.sandbox_id, {"allow_internet_access": True})
        obs["b_info_after_update"] = str(b.get_info().network)
        check(a.get_info().allow_internet_access is True, "update_network opened a's internet access")
        obs["b_get_host_3000"] = b.get_host(3000)
        obs["download_url"] = b.download_url("/home/user/x.txt")
        obs["upload_url"] = b.upload_url("/home/user/x.txt", use_signature_expiration=60)
        check(b.commands.run("echo ok").stdout == "ok\n", "commands run")
    finally:
        a.kill()
        b.kill()
    return obs


def sc_files_rest():
    obs = {}
    sb = Sandbox.create(TEMPLATE, timeout=120)
    try:
        sb.files.write("/home/user/hello.txt", "Hello, world\n")
        sb.files.write("notes/relative.bin", b"\x00\x01\x02\xff")
        sb.files.write_files([{"path": "/home/user/multi/a.txt", "data": "A"}, {"path": "/home/user/multi/b.txt", "data": b"B"}])
        sb.files.write("/home/user/octet.txt", "via octet-stream", use_octet_stream=True)
        sb.files.write("/home/user/gz.txt", "compressed upload", gzip=True)
        obs["metadata"] = expect_error(lambda: sb.files.write("/home/user/meta.txt", "x", metadata={"owner": "compat"}), e2b.SandboxException)
        check("metadata" in obs["metadata"]["message"], "the error names upload metadata")
        check(sb.files.read("/home/user/hello.txt") == "Hello, world\n", "read text")
        check(list(sb.files.read("/home/user/notes/relative.bin", format="bytes")) == [0, 1, 2, 255], "relative path")
        check(b"".join(sb.files.read("/home/user/octet.txt", format="stream")).decode() == "via octet-stream", "stream read")
        check(sb.files.read("/home/user/gz.txt", gzip=True) == "compressed upload", "gzip")
        info = sb.files.get_info("/home/user/hello.txt")
        obs["owner"] = [info.owner, info.group, info.permissions]
        check(info.owner == "user", "uploads belong to the default user: %r" % info.owner)
        check("/home/user/multi/a.txt" in [e.path for e in sb.files.list("/home/user", depth=2)], "depth 2")
        check(sb.files.exists("/home/user/hello.txt") and not sb.files.exists("/home/user/nope"), "exists")
        check(sb.files.make_dir("/home/user/newdir/sub") is True, "make_dir")
        check(sb.files.make_dir("/home/user/newdir/sub") is False, "make_dir existing")
        moved = sb.files.rename("/home/user/hello.txt", "/home/user/newdir/hello2.txt")
        check(moved.path == "/home/user/newdir/hello2.txt", "rename answers the destination")
        sb.commands.run("ln -s /home/user/newdir/hello2.txt /home/user/link.txt")
        link = sb.files.get_info("/home/user/link.txt")
        obs["symlink"] = [str(link.type), link.symlink_target]
        check(link.symlink_target == "/home/user/newdir/hello2.txt", "symlink target")
        sb.files.remove("/home/user/newdir")
        check(not sb.files.exists("/home/user/newdir"), "recursive remove")
        expect_error(lambda: sb.files.read("/home/user/missing.txt"), e2b.FileNotFoundException)
        expect_error(lambda: sb.files.read("/home/user/multi"), e2b.SandboxException)
        expect_error(lambda: sb.files.list("/home/user/missing"), e2b.FileNotFoundException)
        expect_error(lambda: sb.files.rename("/home/user/missing", "/home/user/x"), e2b.FileNotFoundException)
        expect_error(lambda: sb.files.remove("/home/user/missing"), e2b.FileNotFoundException)
        url = sb.download_url("/home/user/multi/a.txt")
        r = httpx.get(url, headers={"E2b-Sandbox-Id": sb.sandbox_id})
        check(r.status_code == 200 and r.text == "A", "signed download URL (with the sandbox header)")
        url = sb.upload_url("/home/user/uploaded.txt")
        r = httpx.post(url, headers={"E2b-Sandbox-Id": sb.sandbox_id}, files={"file": ("uploaded.txt", b"via signed url")})
        check(r.status_code == 200 and sb.files.read("/home/user/uploaded.txt") == "via signed url", "signed upload URL")
        r = httpx.get(url.replace("signature=", "signature=x"), headers={"E2b-Sandbox-Id": sb.sandbox_id})
        check(r.status_code == 401, "a bad signature is refused")
        r = httpx.get(sb.download_url("/home/user/multi/a.txt"))
        obs["signed_url_without_header"] = r.status_code
        check(r.status_code == 400 and "E2b-Sandbox-Id" in r.text, "a signed URL alone cannot name its sandbox")
    finally:
        sb.kill()
    return obs


def warm_value(sb, pid):
    """The value the warm process holds now, read from its memory (SIGUSR1 → file)."""
    sb.commands.run("rm -f /tmp/warm.out; kill -USR1 $(cat /tmp/warm.pid)")
    for _ in range(100):
        r = sb.commands.run("cat /tmp/warm.out 2>/dev/null || true")
        if r.stdout:
            return r.stdout
        time.sleep(0.05)
    return None


def sc_fork_pattern():
    obs = {}
    sb = Sandbox.create(TEMPLATE, timeout=300)
    made = []
    try:
        sb.files.write("/tmp/warm.py", WARM)
        # The handle keeps its output stream open across the snapshot (the daemon's memory
        # checkpoint needs it out of the way: the router has it step aside).
        h = sb.commands.run("python3 /tmp/warm.py", background=True)
        for _ in range(200):
            if sb.commands.run("cat /tmp/warm.pid 2>/dev/null || true").stdout:
                break
            time.sleep(0.05)
        value = warm_value(sb, h.pid)
        check(value is not None and len(value) == 16, "the warm process started: %r" % value)
        t0 = time.monotonic()
        snap = sb.create_snapshot(name="e2b-fork-pattern")
        obs["snapshot_seconds"] = round(time.monotonic() - t0, 2)
        t0 = time.monotonic()
        restored = [Sandbox.create(snap.snapshot_id, timeout=120) for _ in range(5)]
        made += restored
        obs["restore_seconds"] = round(time.monotonic() - t0, 2)
        t0 = time.monotonic()
        forks = sb.fork(count=5, timeout=120)
        obs["fork_seconds"] = round(time.monotonic() - t0, 2)
        made += [f for f in forks if isinstance(f, Sandbox)]
        check(all(isinstance(f, Sandbox) for f in forks), "5 forks: %r" % [exc_info(f) for f in forks if not isinstance(f, Sandbox)])
        ids = {s.sandbox_id for s in made}
        check(len(ids) == 10 and sb.sandbox_id not in ids, "10 distinct children")
        values = [warm_value(s, h.pid) for s in made]
        obs["warm_values"] = values
        check(values == [value] * 10, "every child holds the parent's in-memory value: %r vs %r" % (values, value))
        listed = [[p.pid for p in s.commands.list()] for s in made]
        check(all(h.pid in pids for pids in listed), "the warm process runs in every child")
        check(warm_value(sb, h.pid) == value, "the parent is still warm")
        obs["delete_snapshot"] = Sandbox.delete_snapshot(snap.snapshot_id)
    finally:
        for m in made:
            m.kill()
        sb.kill()
    return obs


def sc_ports():
    """get_host(port) names the daemon's gateway (`{port}-{id}.<gateway_domain>:<port>`)."""
    obs = {}
    sb = Sandbox.create(TEMPLATE, timeout=60, network={"allow_public_traffic": True})
    try:
        sb.commands.run("cd /tmp && echo served > index.html && python3 -m http.server 8080", background=True)
        host = sb.get_host(8080)
        obs["host"] = host
        check(host.startswith("8080-" + sb.sandbox_id + "."), "get_host names the port and sandbox: %r" % host)
        api = os.environ["E2B_API_URL"]
        body = None
        for _ in range(100):
            try:
                r = httpx.get(api + "/index.html", headers={"Host": host})
                if r.status_code == 200:
                    body = r.text
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        obs["body"] = body
        check(body == "served\n", "the port answers through the gateway: %r" % body)
        check(Sandbox.connect(sb.sandbox_id).get_host(8080) == host, "connect answers the same domain")
    finally:
        sb.kill()
    return obs


def sc_auto_resume():
    """A paused sandbox made with `lifecycle.auto_resume` resumes on its next envd call;
    one made without answers as a stopped sandbox."""
    obs = {}
    auto = Sandbox.create(TEMPLATE, timeout=60, lifecycle={"on_timeout": "pause", "auto_resume": True})
    plain = Sandbox.create(TEMPLATE, timeout=60)
    try:
        auto.commands.run("echo warm > /tmp/w")
        check(auto.pause() is True and plain.pause() is True, "both paused")
        obs["auto_read"] = auto.files.read("/tmp/w")
        check(obs["auto_read"] == "warm\n", "the auto-resuming sandbox answers")
        check(str(auto.get_info().state).lower().endswith("running"), "and runs again")
        obs["plain_read"] = expect_error(lambda: plain.files.read("/etc/hostname"), e2b.SandboxException)
        check(str(plain.get_info().state).lower().endswith("paused"), "the other stays paused")
    finally:
        auto.kill()
        plain.kill()
    return obs


def sc_overhead():
    """The layer's cost against sandfork's own SDK on the same daemon, same transport:
    create → first command, and a 1 MiB file written and read back (medians of 5)."""
    import statistics

    sys.path.insert(0, os.environ["SANDFORK_SDK_PATH"])
    import sandfork

    api, key = os.environ["E2B_API_URL"], os.environ["E2B_API_KEY"]
    blob = os.urandom(1 << 20)

    def native():
        t0 = time.perf_counter()
        sb = sandfork.Sandbox.create(image=TEMPLATE, api_url=api, api_key=key, timeout_secs=60)
        try:
            # the command E2B runs for `commands.run("true")`: a login shell's
            check(sb.run("/bin/bash", ["-l", "-c", "true"]).exit_code == 0, "native run")
            t1 = time.perf_counter()
            sb.write_file("/tmp/blob", blob)
            check(bytes(sb.read_file("/tmp/blob")) == blob, "native round trip")
            return t1 - t0, time.perf_counter() - t1
        finally:
            sb.terminate()

    def e2b_sdk():
        t0 = time.perf_counter()
        sb = Sandbox.create(TEMPLATE, timeout=60)
        try:
            check(sb.commands.run("true").exit_code == 0, "e2b run")
            t1 = time.perf_counter()
            sb.files.write("/tmp/blob", blob)
            check(bytes(sb.files.read("/tmp/blob", format="bytes")) == blob, "e2b round trip")
            return t1 - t0, time.perf_counter() - t1
        finally:
            sb.kill()

    native(), e2b_sdk()  # warm both paths up
    runs = {"native": [], "e2b": []}
    for _ in range(5):
        runs["native"].append(native())
        runs["e2b"].append(e2b_sdk())
    obs = {}
    for i, what in enumerate(("create_to_first_exec", "file_1mib_round_trip")):
        n = statistics.median(r[i] for r in runs["native"])
        e = statistics.median(r[i] for r in runs["e2b"])
        obs[what] = {"native_ms": round(n * 1000, 1), "e2b_ms": round(e * 1000, 1), "ratio": round(e / n, 2)}
    return obs


SCENARIOS = {
    "overhead": sc_overhead,
    "create_options_rest": sc_create_options_rest,
    "files_rest": sc_files_rest,
    "fork_pattern": sc_fork_pattern,
    "ports": sc_ports,
    "auto_resume": sc_auto_resume,
}


def main(argv):
    names = [a for a in argv if not a.startswith("-")] or list(SCENARIOS)
    failed = 0
    for name in names:
        rec = {"scenario": name, "sdk": "python"}
        t0 = time.time()
        try:
            rec["observations"] = SCENARIOS[name]()
            rec["ok"] = True
        except Exception as e:  # noqa: BLE001
            failed += 1
            rec.update(ok=False, error=exc_info(e), traceback=traceback.format_exc())
        rec["seconds"] = round(time.time() - t0, 2)
        print(json.dumps(rec, default=str), flush=True)
    print("%d passed, %d failed" % (len(names) - failed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
