"""Faults inside one sandbox: its user processes, its agent (PID 1 of the container) or its
FUSE disk server killed from the host. The daemon notices on its own (no request has to
fail first), reports the sandbox ``failed`` with a reason naming what died, and tears
down everything it held; a neighbour sandbox carries on untouched.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Dict, List, Sequence

import pytest
from conftest import census, finish, new_daemon, processes_under

from sandfork import Client, Sandbox, Snapshot

FAULT = "sandbox parts killed"
DETECT_WITHIN = 10.0
CLEAN_WITHIN = 60.0


def client_of(d) -> Client:
    return Client(url=d.url, token=d.token or "")


def info(d, sid: str) -> Dict:
    return client_of(d).request_json("GET", f"/v1/sandboxes/{sid}")


def init_pid(d, sid: str) -> int:
    """Host pid of the container's init (the agent), from runc's state."""
    out = subprocess.run(["runc", "--root", str(d.data_dir / "runc"), "state", sid], capture_output=True, text=True, check=True)
    return int(json.loads(out.stdout)["pid"])


def disk_server_pid(d, sid: str) -> int:
    """Host pid of the process serving the sandbox's disk, from its pid file."""
    return int((d.data_dir / "sandboxes" / sid / "disk" / "server.pid").read_text().strip())


def cgroup_pids(sid: str) -> List[int]:
    """Host pids in the sandbox's cgroup (v2, or v1's pids/memory hierarchy)."""
    for base in [Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup/memory")]:
        procs = base / "sandfork" / sid / "cgroup.procs"
        if procs.exists():
            return [int(x) for x in procs.read_text().split()]
    raise AssertionError(f"no cgroup found for sandbox {sid}")


def wait_failed(d, sid: str, timeout: float = DETECT_WITHIN) -> tuple:
    """Polls the sandbox's info (no exec) until it is failed; returns (info, seconds)."""
    start = time.monotonic()
    while True:
        doc = info(d, sid)
        if doc["state"] == "failed":
            return doc, time.monotonic() - start
        if time.monotonic() - start > timeout:
            return doc, time.monotonic() - start
        time.sleep(0.1)


def leftovers_of(d, sid: str, live: Sequence[str]) -> List[str]:
    """What sandbox ``sid`` still holds on the host (the census, less the live sandboxes')."""
    try:
        everything = census(d, live=live)
    except OSError as e:  # e.g. EIO walking a dead FUSE-backed mount not yet removed
        return [f"census failed: {e}"]
    found = [x for x in everything if not any(lid in x for lid in live)]
    found += [f"process {pid}: {cmd}" for pid, cmd in processes_under(d.data_dir / "sandboxes" / sid)]
    return found


def wait_clean(d, sid: str, live: Sequence[str], timeout: float = CLEAN_WITHIN) -> tuple:
    start = time.monotonic()
    while True:
        left = leftovers_of(d, sid, live)
        if not left or time.monotonic() - start > timeout:
            return left, time.monotonic() - start
        time.sleep(0.2)


def state_of(status) -> str:
    return str(getattr(status, "value", status))


def neighbour_fine(nb: Sandbox, marker: str, bg_pid: int) -> List[str]:
    """Problems of the neighbour sandbox: exec, its file, its background process."""
    problems = []
    r = nb.run("sh", ["-c", "echo alive; cat /root/marker"])
    if r.exit_code != 0 or r.stdout != f"alive\n{marker}":
        problems.append(f"neighbour exec gave {r.exit_code} {r.stdout!r} {r.stderr!r}")
    if state_of(nb.get_process(bg_pid).status) != "running":
        problems.append("neighbour background process is not running")
    if state_of(nb.status) != "running":
        problems.append(f"neighbour is {nb.status}")
    return problems


def make_neighbour(d) -> tuple:
    nb = Sandbox.create(client=client_of(d), allow_internet_access=False)
    marker = f"neighbour-{os.getpid()}-{time.time_ns()}"
    nb.write_file("/root/marker", marker + "\n")
    bg = nb.start_process("sleep", ["3600"])
    return nb, marker, bg.pid


@pytest.mark.fault(FAULT)
def test_user_processes_killed_leave_the_sandbox_usable(daemon, faults) -> None:
    """All of a sandbox's user processes killed (from inside, then from the host): the agent, PID 1, survives and the sandbox stays usable."""
    sb = Sandbox.create(client=client_of(daemon), allow_internet_access=False)
    sb.write_file("/root/data", "kept\n")
    victims = [sb.start_process("sleep", ["3600"]).pid for _ in range(3)]
    r = sb.run("sh", ["-c", "kill -9 -1; echo survived-own-kill"])
    for pid in victims:
        sb.get_process(pid).wait(timeout=10)
    r2 = sb.run("cat", ["/root/data"])
    ok = r.stdout == "survived-own-kill" and r2.stdout == "kept" and info(daemon, sb.id)["state"] == "running"
    ok = ok and all(sb.get_process(p).info().signal == 9 for p in victims)
    faults.injected("kill -9 -1 inside the sandbox", ok, f"run: {r.stdout!r} {r.stderr!r}; after: {r2.stdout!r}")

    # From the host: SIGKILL to every process of the container's cgroup but its init.
    for _ in range(3):
        sb.start_process("sleep", ["3600"])
    agent = init_pid(daemon, sb.id)
    killed = [p for p in cgroup_pids(sb.id) if p != agent]
    for pid in killed:
        os.kill(pid, signal.SIGKILL)
    time.sleep(2.5)  # more than one liveness period: the daemon must not call it failed
    doc = info(daemon, sb.id)
    r3 = sb.run("sh", ["-c", "cat /root/data; echo ok > /root/new; cat /root/new"])
    ok = doc["state"] == "running" and r3.stdout == "kept\nok" and init_pid(daemon, sb.id) == agent
    faults.injected("host-side SIGKILL of every non-agent process", ok, f"killed {len(killed)}; state {doc['state']}; exec {r3.stdout!r}")
    sb.terminate()
    left, _ = wait_clean(daemon, sb.id, live=[])
    faults.leaks(left)


def kill_part_and_check(d, faults, what: str, find_pid, reason_word: str, io_load: bool = False) -> None:
    nb, marker, bg = make_neighbour(d)
    sb = Sandbox.create(client=client_of(d), allow_internet_access=False)
    sb.write_file("/root/data", "x" * 4096)
    if io_load:
        # Processes busy on the disk when its server dies (they may block in D state).
        sb.start_process("sh", ["-c", "while true; do cat /root/data > /root/copy; sync; done"])
        sb.start_process("sh", ["-c", "while true; do ls -R / > /dev/null; done"])
        time.sleep(0.5)
    pid = find_pid(d, sb.id)
    os.kill(pid, signal.SIGKILL)
    doc, took = wait_failed(d, sb.id)
    reason = doc.get("error") or ""
    detected = doc["state"] == "failed" and reason_word in reason.lower()
    faults.injected(f"{what} killed with SIGKILL: reported failed with the reason", detected,
                    f"state {doc['state']} after {took:.1f}s, reason {reason!r}")  # fmt: skip
    left, clean_took = wait_clean(d, sb.id, live=[nb.id])
    faults.injected(f"{what} killed: its host resources removed", not left,
                    f"after {clean_took:.1f}s left: {left}")  # fmt: skip
    problems = neighbour_fine(nb, marker, bg)
    faults.injected(f"{what} killed: the neighbour carries on", not problems, "; ".join(problems))
    listed = {s.id: s.status for s in Sandbox.list(client=client_of(d))}
    faults.injected(f"{what} killed: listed failed", state_of(listed.get(sb.id)) == "failed", f"{listed}")
    sb.terminate()  # a failed sandbox can still be terminated (idempotent cleanup)
    faults.injected(f"{what} killed: terminate after failure", info(d, sb.id)["state"] == "terminated", "")
    print(f"{what}: failed after {took:.2f}s, cleaned after {clean_took:.2f}s more; reason: {reason}")
    nb.terminate()


@pytest.mark.fault(FAULT)
def test_agent_killed(daemon, faults) -> None:
    """The agent (PID 1 of the container) killed from the host: failed with the reason, cleaned up, neighbour fine."""
    kill_part_and_check(daemon, faults, "agent", init_pid, "agent")


@pytest.mark.fault(FAULT)
def test_disk_server_killed(daemon, faults) -> None:
    """The sandbox's FUSE disk server killed from the host under disk I/O: failed with the reason, cleaned up (dead FUSE mount included), neighbour fine."""
    kill_part_and_check(daemon, faults, "disk server", disk_server_pid, "disk server", io_load=True)


@pytest.mark.fault(FAULT)
def test_parts_killed_while_the_daemon_is_down(faults) -> None:
    """An agent and a disk server killed while the daemon is down: the restarted daemon reports both sandboxes failed with the reason and removes them; a third is re-adopted."""
    d = new_daemon()
    try:
        c = client_of(d)
        a, b, nb = (Sandbox.create(client=c, allow_internet_access=False) for _ in range(3))
        nb.write_file("/root/marker", "still here\n")
        pids = {a.id: init_pid(d, a.id), b.id: disk_server_pid(d, b.id)}
        d.process.send_signal(signal.SIGTERM)
        d.process.wait(60)
        for pid in pids.values():
            os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)
        d = new_daemon(root=d.root)
        for sid, word in [(a.id, "agent"), (b.id, "disk server")]:
            doc = info(d, sid)
            reason = doc.get("error") or ""
            ok = doc["state"] == "failed" and word in reason.lower() and "daemon was down" in reason
            faults.injected(f"{word} killed while the daemon was down: failed at restart", ok, f"{doc['state']}: {reason!r}")
            left, took = wait_clean(d, sid, live=[nb.id])
            faults.injected(f"{word} killed while the daemon was down: cleaned up", not left, f"after {took:.1f}s: {left}")
        nb = Sandbox.connect(nb.id, client=client_of(d))
        r = nb.run("cat", ["/root/marker"])
        faults.injected("neighbour re-adopted after the restart", r.stdout == "still here", r.stdout + r.stderr)
        nb.terminate()
    finally:
        finish(d)


@pytest.mark.fault(FAULT)
def test_no_false_alarm_on_deliberate_pauses(daemon, faults) -> None:
    """Checkpoints (runc pause + CRIU), suspend/resume and restores are never taken for a death by the liveness watch."""
    c = client_of(daemon)
    sb = Sandbox.create(client=c, name=f"watched-{os.getpid()}", allow_internet_access=False)
    sb.start_process("sleep", ["3600"])
    snaps = [sb.checkpoint(checkpoint_type="memory"), sb.checkpoint()]
    sb.suspend()
    time.sleep(2.5)
    suspended = info(daemon, sb.id)["state"]
    sb.resume()
    restored = Sandbox.create(client=c, snapshot_id=snaps[0].id)
    time.sleep(2.5)
    states = {s: info(daemon, s)["state"] for s in (sb.id, restored.id)}
    runs = [x.run("echo", ["ok"]).stdout for x in (sb, restored)]
    ok = suspended == "suspended" and set(states.values()) == {"running"} and runs == ["ok", "ok"]
    faults.injected("2 checkpoints, suspend, resume and a restore: no false alarm", ok, f"suspended: {suspended}, then {states}, runs {runs}")
    for s in (sb, restored):
        s.terminate()
    for snap in snaps:
        snap.delete()


@pytest.mark.fault(FAULT)
def test_agent_killed_under_an_exec_and_a_checkpoint(daemon, faults) -> None:
    """The agent killed while a command streams and while a checkpoint is under way: the command ends with an error at once, the checkpoint fails cleanly, the sandbox is failed with the reason and removed."""
    c = client_of(daemon)
    for during in ("exec", "checkpoint"):
        sb = Sandbox.create(client=c, allow_internet_access=False)
        outcome: dict = {}

        def work() -> None:
            started = time.monotonic()
            try:
                if during == "exec":
                    outcome["result"] = sb.run("sh", ["-c", "echo started; sleep 60"])
                else:
                    outcome["result"] = sb.checkpoint(checkpoint_type="memory")
            except Exception as e:  # noqa: BLE001 - any error is the expected outcome here
                outcome["error"] = f"{type(e).__name__}: {e}"
            outcome["took"] = time.monotonic() - started

        pid = init_pid(daemon, sb.id)
        worker = threading.Thread(target=work)
        worker.start()
        time.sleep(0.3 if during == "exec" else 0.05)
        os.kill(pid, signal.SIGKILL)
        worker.join(30)
        ended = not worker.is_alive() and ("error" in outcome or getattr(outcome.get("result"), "exit_code", 0) != 0)
        faults.injected(f"agent killed during {during}: the request ends", ended, str(outcome)[:300])
        doc, took = wait_failed(daemon, sb.id)
        ok = doc["state"] == "failed" and "agent" in (doc.get("error") or "")
        faults.injected(f"agent killed during {during}: failed with the reason", ok, f"{doc['state']} after {took:.1f}s: {doc.get('error')}")
        left, _ = wait_clean(daemon, sb.id, live=[])
        faults.injected(f"agent killed during {during}: cleaned up", not left, f"{left}")
        snaps = [x.id for x in Snapshot.list(client=c)]
        faults.injected(f"agent killed during {during}: no snapshot", not snaps, f"{snaps}")
        sb.terminate()
