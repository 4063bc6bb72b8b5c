"""Process state across a memory checkpoint and fork: what survives, what changes.

One source sandbox (image `python`) runs a *holder* program per kind of state (the
programs are in ``programs/``; each holder answers JSON commands on a Unix socket). The
module takes one memory checkpoint of it and forks two children at once. Each test then
runs its state's check program (a new process that inspects the holders through /proc
and their sockets, uses the state, then changes it) first in fork 0, then in fork 1 and
in the source at the same time: everything fork 1 and the source report must be what the
checkpoint held, so a change made by fork 0 that leaked would fail them. The expected
results are the rules of docs/checkpoints.md ("What survives a memory checkpoint").

Two states have a source of their own because they break the checkpoint of the whole
sandbox: System V shared memory attached by a process (every restore fails) and a file
over 1 MiB deleted while open (the checkpoint is refused).
"""

from __future__ import annotations

import errno
import json
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List

import pytest

from sandfork import CheckpointType, RemoteAPIError, Sandbox, Snapshot

pytestmark = [pytest.mark.root, pytest.mark.checkpoint]

PROGRAMS = Path(__file__).parent / "programs"
# Holder name -> (program, mode). Started in this order (the TCP client retries until the
# server listens).
HOLDERS = {
    "locks": ("locks.py", "hold"),
    "tcp": ("tcp.py", "hold"),
    "tcpclient": ("tcp.py", "client"),
    "unixpipe": ("unixpipe.py", "hold"),
    "fds": ("fds.py", "hold"),
    "threads": ("threads.py", "hold"),
    "tree": ("tree.py", "hold"),
    "pty": ("ptyshell.py", "hold"),
    "shm": ("shm.py", "hold"),
    "files": ("files.py", "hold"),
    "attrs": ("procattrs.py", "hold"),
    "sleeper": ("sleeper.py", "hold"),
    "nanosleep": ("sleeper.py", "nanosleep"),
}
# Holders of the tests that need a source of their own.
OWN_SOURCE = {"sysv": ("shm.py", "sysv"), "bigghost": ("files.py", "bigghost"), "hugeghost": ("files.py", "bigghost", "65", "hugeghost")}
HOLDER_ENV = {"attrs": {"ST_ENV": "env-at-start"}}
SLEEP_PERIOD = 5.0  # sleeper.py PERIOD
# Tolerance of a wake-up time. Times printed in a sandbox are on its own clocks: the
# source shares the host's, a fork's CLOCK_MONOTONIC lags behind by the time between dump
# and restore (see the last test), so a fork's times are never later than the host's.
SLACK = 0.5


def mono() -> float:
    return time.clock_gettime(time.CLOCK_MONOTONIC)


def host_clocks() -> Dict[str, float]:
    return {"mono": mono(), "boot": time.clock_gettime(time.CLOCK_BOOTTIME), "real": time.clock_gettime(time.CLOCK_REALTIME)}


@dataclass
class World:
    """The source, its memory snapshot and two forks of it; times are host CLOCK_MONOTONIC."""

    source: Sandbox
    snapshot: Snapshot
    forks: List[Sandbox]
    pids: Dict[str, int]  # holder -> pid, as the agent knows it
    ready: Dict[str, dict]  # holder -> its ready file
    checkpoint_started: float
    checkpoint_done: float
    forks_done: float

    def sandboxes(self) -> Dict[str, Sandbox]:
        return {"fork0": self.forks[0], "fork1": self.forks[1], "source": self.source}


def start_holders(sb: Sandbox, names: List[str]) -> Dict[str, int]:
    for prog in PROGRAMS.glob("*.py"):
        sb.write_file(f"/opt/st/{prog.name}", prog.read_bytes())
    pids = {}
    for name in names:
        prog, *mode = HOLDERS.get(name) or OWN_SOURCE[name]
        pids[name] = sb.start_process("python3", [f"/opt/st/{prog}", *mode], env=HOLDER_ENV.get(name), working_dir="/opt/st").pid
    return pids


def wait_ready(sb: Sandbox, pids: Dict[str, int]) -> Dict[str, dict]:
    r = sb.run("python3", ["/opt/st/stlib.py", "wait", *pids], working_dir="/opt/st", timeout=90)
    if r.exit_code != 0:
        outputs = {name: sb.get_output(pid).lines[-15:] for name, pid in pids.items()}
        raise AssertionError(f"the holders did not get ready: {r.stdout} {r.stderr}\n{json.dumps(outputs, indent=1)}")
    return json.loads(r.stdout)


def criu_errors(daemon, sb: Sandbox, log: str) -> str:
    """The error and warning lines of a CRIU log the daemon kept for ``sb``."""
    path = daemon.data_dir / "sandboxes" / sb.id / "logs" / log
    try:
        return "\n".join(line for line in path.read_text(errors="replace").splitlines() if "Error" in line or "Warn" in line)
    except OSError as e:
        return f"(no {log}: {e})"


@pytest.fixture(scope="module")
def world(daemon) -> Iterator[World]:
    source = Sandbox.create(image="python", memory_mb=512)
    snapshot = None
    forks: List[Sandbox] = []
    try:
        pids = start_holders(source, list(HOLDERS))
        ready = wait_ready(source, pids)
        started = mono()
        try:
            snapshot = source.checkpoint(checkpoint_type=CheckpointType.MEMORY)
        except Exception as e:
            raise AssertionError(f"memory checkpoint failed: {e}\nCRIU dump.log:\n{criu_errors(daemon, source, 'dump.log')}") from e
        done = mono()
        result = snapshot.fork(2)
        forks = list(result)
        forks_done = mono()
        assert result.ok, "fork failed: " + "; ".join(f"child {c.index}: {c.error}" for c in result.errors)
        yield World(source, snapshot, forks, pids, ready, started, done, forks_done)
    finally:
        for sb in [*forks, source]:
            try:
                sb.terminate()
            except Exception as e:  # noqa: BLE001 - the session fixture reports leftovers
                print(f"terminating {sb.id}: {e!r}")
        if snapshot is not None:
            snapshot.delete()


def check(world: World, state: str) -> Dict[str, dict]:
    """Runs ``programs/<state>.py check TAG`` in fork 0, then in fork 1 and the source at
    once; returns {sandbox: its JSON answer} (with "_host" = the host's clocks before and after)."""
    prog = {"pty": "ptyshell.py", "attrs": "procattrs.py"}.get(state, f"{state}.py")

    def one(item):
        name, sb = item
        before = host_clocks()
        r = sb.run("python3", [f"/opt/st/{prog}", "check", name], working_dir="/opt/st", timeout=60)
        after = host_clocks()
        assert r.exit_code == 0, f"{state} check failed in {name} ({sb.id}): {r.stdout}\n{r.stderr}"
        return name, dict(json.loads(r.stdout), _host=[before, after])

    boxes = world.sandboxes()
    out = dict([one(("fork0", boxes.pop("fork0")))])
    with ThreadPoolExecutor(2) as pool:
        out.update(pool.map(one, boxes.items()))
    return out


# 1 -------------------------------------------------------------------------------------


def test_file_locks_are_held_again(world: World) -> None:
    """POSIX (fcntl), flock and OFD locks are held again by the same process in every fork
    (CRIU `file-locks`): /proc/locks lists them, another process is refused (EAGAIN) until
    the holder releases, then gets them. Fork 0 releasing does not release them elsewhere."""
    holder = world.ready["locks"]["pid"]
    for name, r in check(world, "locks").items():
        assert r["before"] == {"posix": [holder], "flock": [holder], "ofd": [-1]}, f"{name}: /proc/locks: {r}"
        assert r["contended"] == {"posix": "EAGAIN", "flock": "EAGAIN", "ofd": "EAGAIN"}, f"{name}: {r}"
        assert r["after_release"] == {"posix": "taken", "flock": "taken", "ofd": "taken"}, f"{name}: {r}"
        assert r["held_by_me"] == {"posix": [r["me"]], "flock": [r["me"]], "ofd": [-1]}, f"{name}: {r}"


# 2 -------------------------------------------------------------------------------------


def test_tcp_listener_accepts_and_loopback_connections_carry_on(world: World) -> None:
    """A listening socket keeps accepting in every fork. An established connection over
    loopback carries on at both ends in every fork, as in the source (CRIU `tcp-close`
    with scripts/criu-patches/0003: both of its ends are in the sandbox; connections
    leaving the sandbox close, see test_loopback_tcp.py)."""
    results = check(world, "tcp")
    for name, r in results.items():
        assert r["echo"] == f"echo:ping-{name}:last=none", f"{name}: the listener: {r}"
        assert r["accepted"] == 2, f"{name}: connections seen by this sandbox's listener: {r}"
        assert (r["client_recv"], r["server_recv"]) == ("timeout", "timeout"), f"{name}: {r}"
        assert (r["client_send"], r["server_got"]) == ("sent", f"c2s-{name}\n"), f"{name}: {r}"
        assert (r["server_send"], r["client_got"]) == ("sent", f"s2c-{name}\n"), f"{name}: {r}"


# 3 -------------------------------------------------------------------------------------


def test_unix_sockets_and_pipes_carry_data_both_ways(world: World) -> None:
    """A socketpair, a pipe each way and a connection to a named Unix socket between two
    processes: the data queued in them at the checkpoint is delivered in every fork, and
    new data flows both ways."""
    child = world.ready["unixpipe"]["child"]
    queued = {"socketpair": "queued-socketpair", "pipe": "queued-pipe", "named": "queued-named"}
    for name, r in check(world, "unixpipe").items():
        assert r["drained"] == queued, f"{name}: {r}"
        assert r["got"] == {ch: f"echo:{ch}-{name}:pid={child}" for ch in queued}, f"{name}: {r}"
        assert r["last_before"] == "none", f"{name} saw another sandbox's traffic: {r}"


# 4 -------------------------------------------------------------------------------------


def test_epoll_eventfd_signalfd_inotify_work_and_timerfds_follow_the_rule(world: World) -> None:
    """epoll keeps its registrations; the eventfd keeps its counter (5); the signalfd gets
    a new SIGUSR1; inotify reports a new file. Timerfds: one still counting down at the
    dump comes back armed with the time it had left when the dump read it (on the fork's
    clock, which skips the time between checkpoint and restore, its expiry moves later by
    about what the dump and the restore themselves took); one that had expired unread —
    any periodic timer shorter than the checkpoint's pause — comes back disarmed and never
    fires again."""
    results = check(world, "fds")
    window = world.forks_done - world.checkpoint_started
    for name, r in results.items():
        assert r["kinds"] == {
            "timer": "anon_inode:[timerfd]", "oneshot": "anon_inode:[timerfd]", "signal": "anon_inode:[signalfd]",
            "inotify": "anon_inode:inotify", "eventfd": "anon_inode:[eventfd]", "epoll": "anon_inode:[eventpoll]",
        }, f"{name}: {r}"  # fmt: skip
        assert r["eventfd"] == {"ready_before": True, "value": 5, "ready_after": True}, f"{name}: {r}"
        assert r["signals_before"] == [] and r["signals_after"] == [10], f"{name}: signalfd: {r}"
        assert r["created_before"] == [] and r["created_after"] == [f"new-{name}"], f"{name}: inotify: {r}"
        timer, oneshot = r["fdinfo"]["timer"], r["fdinfo"]["oneshot"]
        assert timer["it_interval"] == "(0, 20000000)", f"{name}: {timer}"
        set_deadline, deadline_now = r["oneshot_deadline"]
        assert oneshot["it_value"] != "(0, 0)", f"{name}: the one-shot timer was disarmed: {oneshot}"
        if name == "source":
            assert r["ticks"][1] - r["ticks"][0] >= 5, f"the source's 20 ms timer stopped: {r['ticks']}"
            assert abs(deadline_now - set_deadline) < 0.05, f"source one-shot deadline moved: {r['oneshot_deadline']}"
        else:
            assert timer["it_value"] == "(0, 0)" and r["ticks"][1] == r["ticks"][0], (
                f"{name}: the periodic timerfd that expired during the pause was expected to come back "
                f"disarmed (docs/checkpoints.md); it is {timer}, ticks {r['ticks']}"
            )
            shift = deadline_now - set_deadline
            assert 0 < shift < window + 0.2, f"{name}: one-shot expiry moved by {shift:.3f}s (checkpoint to forks: {window:.3f}s)"


# 5 -------------------------------------------------------------------------------------


def test_threads_all_keep_counting(world: World) -> None:
    """A process with four counting threads: the same thread ids come back, and every
    thread keeps counting; fork 0 resetting its counters changes no other sandbox's."""
    info = world.ready["threads"]
    for name, r in check(world, "threads").items():
        assert r["tasks"] == sorted([info["pid"], *info["tids"]]), f"{name}: {r}"
        assert all(b >= a + 5 for a, b in zip(r["first"], r["second"])), f"{name}: a thread stopped: {r}"
        assert max(r["before_set"]) < 10**9, f"{name} sees fork 0's counters: {r}"


# 6 -------------------------------------------------------------------------------------


def test_process_tree_zombie_groups_and_sessions(world: World) -> None:
    """pids, parents, process groups and sessions are as at the checkpoint; the zombie is
    still a zombie and its parent reaps it (exit status 7); fork 0 reaping it leaves the
    zombie of the others."""
    info = world.ready["tree"]
    for name, r in check(world, "tree").items():
        for who, want in info["stats"].items():
            got = r["stats"][who]
            assert got is not None, f"{name}: {who} ({info['pids'][who]}) is gone"
            assert {k: got[k] for k in ("ppid", "pgrp", "session")} == {k: want[k] for k in ("ppid", "pgrp", "session")}, f"{name}: {who}: {got} != {want}"
        assert r["stats"]["zombie"]["state"] == "Z", f"{name}: {r['stats']['zombie']}"
        assert r["group_signalable"] is True, f"{name}: {r}"
        assert r["reap"] == {"pid": info["pids"]["zombie"], "exit": 7}, f"{name}: {r}"
        assert r["zombie_after_reap"] is None, f"{name}: {r}"


# 7 -------------------------------------------------------------------------------------


def test_pty_shell_answers_and_keeps_its_job(world: World) -> None:
    """An interactive bash on a pty: it answers on the pty (same pid, same tty), its
    background job is still listed as Running under job control, and shell variables are
    per sandbox."""
    info = world.ready["pty"]
    shell, job = info["shell"], info["job"]
    for name, r in check(world, "pty").items():
        assert r["shell_stat"] == {"state": "S", "ppid": info["pid"], "pgrp": shell, "session": shell}, f"{name}: {r}"
        assert r["job_stat"] == {"state": "S", "ppid": shell, "pgrp": job, "session": shell}, f"{name}: {r}"
        assert r["shell_tpgid"] == shell, f"{name}: the shell is not in the foreground: {r}"
        assert f"PID={shell} V= TTY={info['tty']}" in r["answer"], f"{name}: {r['answer']!r}"
        assert re.search(rf"\[1\]\+\s+{job} Running\s+sleep 100007 &", r["answer"]), f"{name}: jobs: {r['answer']!r}"
        assert f"V={name}" in r["answer_after"], f"{name}: {r['answer_after']!r}"


# 8 -------------------------------------------------------------------------------------


def test_shared_memory_posix_anonymous_memfd_and_dev_shm(world: World) -> None:
    """POSIX shared memory, a shared anonymous mapping and a memfd keep their contents and
    stay shared between the two processes that map them; a file in /dev/shm keeps its
    contents; each sandbox has its own copy."""
    orig = {"posix": "orig", "anon": "orig", "memfd": "orig"}
    for name, r in check(world, "shm").items():
        assert r["holder_before"] == orig and r["child_before"] == orig, f"{name}: {r}"
        assert r["devshm_file_before"] == "devshm-orig", f"{name}: {r}"
        assert r["child_after"] == {k: name for k in orig}, f"{name}: the holder's write did not reach its child: {r}"
        assert r["new_process_after"] == {"posix": name, "memfd": name}, f"{name}: {r}"
        assert r["memfd_link"] == "/memfd:st-memfd (deleted)", f"{name}: {r}"


def ask_in(sb: Sandbox, holder: str, cmd: str, *args: str) -> str:
    code = f"import sys, json; sys.path[:0] = ['/opt/st']; import stlib; print(json.dumps(stlib.ask({holder!r}, {cmd!r}, *sys.argv[1:])))"
    r = sb.run("python3", ["-c", code, *args], timeout=30)
    assert r.exit_code == 0, f"{sb.id}: {holder} {cmd}: {r.stderr[-500:]}"
    return json.loads(r.stdout)


def test_sysv_shared_memory_is_restored_and_still_goes_with_its_process(daemon) -> None:
    """A System V segment attached by a process keeps its contents in every fork, and each
    fork has its own. The sandbox's IPC namespace has kernel.shm_rmid_forced=1 (a segment
    goes with its last process); the daemon turns it off for the dump (CRIU restores it
    before the segments, and with it on a restored segment would be removed before its
    process re-attaches it) and on again in the source and in every fork."""
    with Sandbox.create(image="python", memory_mb=256) as source:
        pids = start_holders(source, ["sysv"])
        wait_ready(source, pids)
        r = source.run("sh", ["-c", "cat /proc/sys/kernel/shm_rmid_forced; ipcmk -M 4096 >/dev/null && ipcs -m | grep -c '^0x' || true"])
        assert r.stdout.split() == ["1", "1"], f"shm_rmid_forced, and only the attached segment exists: {r.stdout!r} {r.stderr!r}"
        snap = source.checkpoint(checkpoint_type=CheckpointType.MEMORY)
        try:
            with snap.fork(2) as kids:
                assert not kids.errors and len(kids) == 2, f"restores failed: {[str(c.error) for c in kids.errors]}"
                for kid in kids:
                    assert ask_in(kid, "sysv", "read") == "sysv-orig", kid.id
                ask_in(kids[0], "sysv", "write", "fork0")
                assert ask_in(kids[0], "sysv", "read") == "fork0"
                assert ask_in(kids[1], "sysv", "read") == "sysv-orig", "a fork's write reached another fork"
                for kid in [*kids, source]:
                    r = kid.run("sh", ["-c", "cat /proc/sys/kernel/shm_rmid_forced; ipcmk -M 4096 >/dev/null && ipcs -m | grep -c '^0x' || true"])
                    assert r.stdout.split() == ["1", "1"], f"{kid.id}: shm_rmid_forced is not on again: {r.stdout!r} {r.stderr!r}"
        finally:
            snap.delete()
        assert ask_in(source, "sysv", "read") == "sysv-orig", "the source lost its segment"


# 9 -------------------------------------------------------------------------------------


def test_open_files_deleted_and_at_offsets(world: World) -> None:
    """A file deleted while open is still readable (and writable) through its descriptor;
    a file read up to an offset continues there, a file written up to an offset continues
    writing there; offsets are per sandbox."""
    for name, r in check(world, "files").items():
        assert r["first"] == "line 009", r
        assert (r["reader_offset"], r["next_line"]) == (90, "line 010"), f"{name}: {r}"
        assert r["deleted_link"] == "/tmp/st/files/deleted.txt (deleted)", f"{name}: {r}"
        assert r["deleted_content_ok"] is True and r["deleted_size"] == 1088, f"{name}: {r}"
        assert r["deleted_via_proc"] == name, f"{name}: {r}"
        assert (r["writer_offset"], r["written"]) == (4, f"AAAA{name}"), f"{name}: {r}"


def test_deleted_open_files_up_to_64_mib_are_carried_and_larger_ones_refused(daemon) -> None:
    """A file deleted while open is carried in the memory snapshot up to 64 MiB (the
    daemon's ghost limit; CRIU's own is 1 MiB): a 2 MiB one is whole in every fork. A larger
    one refuses the checkpoint with 409 naming the process, the file and the limit; the
    source runs on with its file, and no snapshot is left."""
    with Sandbox.create(image="python", memory_mb=256) as source:
        wait_ready(source, start_holders(source, ["bigghost"]))
        snap = source.checkpoint(checkpoint_type=CheckpointType.MEMORY)
        try:
            with snap.fork(1) as kids:
                assert not kids.errors, [str(c.error) for c in kids.errors]
                assert (ask_in(kids[0], "bigghost", "size"), ask_in(kids[0], "bigghost", "tail")) == (2 << 20, "BBBB")
        finally:
            snap.delete()
    with Sandbox.create(image="python", memory_mb=256) as source:
        info = wait_ready(source, start_holders(source, ["hugeghost"]))["hugeghost"]
        with pytest.raises(RemoteAPIError) as refused:
            source.checkpoint(checkpoint_type=CheckpointType.MEMORY)
        message = str(refused.value)
        assert refused.value.status_code == 409, message
        assert re.search(r"process python3 \(pid \d+ in the sandbox\): it holds a deleted file open \(/tmp/st/files/big\.bin of \d+ size", message), message
        assert "64 MiB" in message, message
        assert Snapshot.list(source=source.id) == [], "a refused checkpoint left a snapshot"
        r = source.run("sh", ["-c", f"stat -L -c %s /proc/{info['pid']}/fd/{info['fd']}"])
        assert r.stdout.strip() == str(65 << 20), f"the source lost its file: {r.stdout!r} {r.stderr!r}"


def test_a_stopped_process_refuses_the_checkpoint_until_it_is_continued(daemon) -> None:
    """A process stopped by SIGSTOP cannot be seized by CRIU while the sandbox is frozen
    (the dump would wait for it forever): the checkpoint is refused at once with 409 naming
    the process and what to do; once it is continued, the checkpoint is taken."""
    with Sandbox.create(image="python", memory_mb=256) as source:
        pid = str(source.start_process("sleep", ["1000"]).os_pid)
        assert source.run("sh", ["-c", f"kill -STOP {pid}"]).exit_code == 0
        started = time.monotonic()
        with pytest.raises(RemoteAPIError) as refused:
            source.checkpoint(checkpoint_type=CheckpointType.MEMORY)
        assert time.monotonic() - started < 30, "the refusal took the dump's time"
        message = str(refused.value)
        assert refused.value.status_code == 409, message
        assert f"process sleep (pid {pid} in the sandbox) is stopped by a signal" in message, message
        assert Snapshot.list(source=source.id) == [], "a refused checkpoint left a snapshot"
        source.run("sh", ["-c", f"kill -CONT {pid}"])
        snap = source.checkpoint(checkpoint_type=CheckpointType.MEMORY)
        snap.delete()
        assert source.run("echo", ["alive"]).stdout.strip() == "alive"


MAPPED_LOCKS = r"""
import fcntl, mmap, os, time
fds = {}
for name in ("plain", "mapped"):
    fds[name] = os.open(f"/tmp/{name}.db", os.O_RDWR | os.O_CREAT)
    os.write(fds[name], b"x" * 8192)
    fcntl.lockf(fds[name], fcntl.LOCK_EX | fcntl.LOCK_NB, 512, 4096)
m = mmap.mmap(fds["mapped"], 8192)
print("ready", flush=True)
time.sleep(1e6)
"""
HELD = "for f in /proc/[0-9]*/fdinfo/*; do grep -q '^lock:' $f 2>/dev/null && readlink ${f%/fdinfo/*}/fd/${f##*/}; done | sort -u"


# A new process's view of the locks: which files cannot be locked where the holder locked them.
TAKEN = r"""
import fcntl, os
for name in ("plain", "mapped"):
    fd = os.open(f"/tmp/{name}.db", os.O_RDWR)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 512, 4096)
        print(name, "free")
    except OSError:
        print(name, "taken")
"""


def test_a_posix_lock_on_a_file_its_process_maps_is_held_in_children(daemon) -> None:
    """A POSIX record lock on a file its process also maps (SQLite's WAL index, LevelDB)
    is held in every child like one on a file not mapped: CRIU restores the mapping by
    opening and closing the file after the locks, a close drops the process's POSIX locks
    on that file, and the CRIU setup builds takes them again once the memory is mapped
    (scripts/criu-patches/0002). A new process in a child finds both ranges taken."""
    with Sandbox.create(image="python", memory_mb=256) as source:
        source.start_process("python3", ["-c", MAPPED_LOCKS])
        deadline = time.monotonic() + 30
        while source.run("sh", ["-c", HELD]).stdout.split() != ["/tmp/mapped.db", "/tmp/plain.db"]:
            assert time.monotonic() < deadline, source.run("sh", ["-c", HELD]).stdout
            time.sleep(0.2)
        snap = source.checkpoint(checkpoint_type=CheckpointType.MEMORY)
        try:
            with snap.fork(2) as kids:
                assert not kids.errors, [str(c.error) for c in kids.errors]
                for kid in kids:
                    assert kid.run("sh", ["-c", HELD]).stdout.split() == ["/tmp/mapped.db", "/tmp/plain.db"]
                    assert kid.run("python3", ["-c", TAKEN]).stdout.split() == ["plain", "taken", "mapped", "taken"]
        finally:
            snap.delete()
        assert source.run("sh", ["-c", HELD]).stdout.split() == ["/tmp/mapped.db", "/tmp/plain.db"]
        assert source.run("python3", ["-c", TAKEN]).stdout.split() == ["plain", "taken", "mapped", "taken"]


# 10 ------------------------------------------------------------------------------------


def test_cwd_umask_rlimits_nice_and_environment(world: World) -> None:
    """A process keeps its working directory, umask, resource limits, nice value and the
    environment it was started with; the fork's SANDFORK_FORK_* variables reach only new
    processes."""
    for name, r in check(world, "attrs").items():
        want = r["expected"]
        proc = r["proc"]
        assert {k: proc[k] for k in want} == want, f"{name}: /proc says {proc}, expected {want}"
        assert proc["ST_ENV"] == "env-at-start" and proc["fork_vars"] == [], f"{name}: environ: {proc}"
        assert r["own"] == {"cwd": want["cwd"], "umask": want["umask"], "nofile": want["limits"]["NOFILE"], "env": "env-at-start", "nice": want["nice"]}, f"{name}: {r['own']}"
        fork_vars = [] if name == "source" else ["SANDFORK_FORK_INDEX", "SANDFORK_FORK_SEED"]
        assert r["my_fork_vars"] == fork_vars, f"{name}: a new process's environment: {r['my_fork_vars']}"


# 11 ------------------------------------------------------------------------------------


def output_lines(sb: Sandbox, pid: int, want, timeout: float) -> List[str]:
    deadline = time.monotonic() + timeout
    while True:
        lines = sb.get_stdout(pid).lines
        if want(lines) or time.monotonic() > deadline:
            return lines
        time.sleep(0.2)


def test_sleeping_processes_and_clocks(world: World) -> None:
    """Clocks: CRIU restores every fork into a time namespace of its own whose
    CLOCK_MONOTONIC and CLOCK_BOOTTIME continue from their values at the end of the dump,
    so for a fork the time between checkpoint and restore does not pass: no jump, and its
    clocks stay behind the host's and the source's by that much. CLOCK_REALTIME is the
    host's everywhere. Sleeps: a sleep to an absolute CLOCK_MONOTONIC deadline (Python's
    time.sleep) ends at that deadline on the sandbox's clock, or as soon as the sandbox
    runs again if it has passed; a relative nanosleep(2) returns EINTR with the time left
    at the dump, in the source as soon as it resumes and in a fork as soon as it is
    restored. Counters printed by the sleeping process continue without a gap."""
    started, done, forks_done = world.checkpoint_started, world.checkpoint_done, world.forks_done
    window = forks_done - started
    for name, r in check(world, "sleeper").items():
        host_before, host_after = r["_host"]
        offsets = r["timens_offsets"]
        assert r["holder_in_my_time_ns"] is True, f"{name}: {r}"
        if name == "source":
            assert offsets == {"monotonic": 0.0, "boottime": 0.0}, f"the source left the host's time namespace: {offsets}"
        else:
            assert 0 < -offsets["monotonic"] < window, f"{name}: monotonic offset {offsets}, checkpoint to forks {window:.3f}s"
            assert abs(offsets["boottime"] - offsets["monotonic"]) < 0.01, f"{name}: {offsets}"
        for who in ("holder", "new_process"):
            c = r[who]
            for clock, offset in (("mono", offsets["monotonic"]), ("boot", offsets["boottime"]), ("real", 0.0)):
                seen_from_host = c[clock] - offset
                assert host_before[clock] - 0.01 <= seen_from_host <= host_after[clock] + 0.01, (
                    f"{name} {who}: {clock} {c[clock]:.6f} (offset {offset:.6f}) not within the host's "
                    f"[{host_before[clock]:.6f}, {host_after[clock]:.6f}]"
                )

    nano_left = {}
    for name, sb in world.sandboxes().items():
        # On a sandbox's own clock, the source resumes when the checkpoint is done, and a
        # fork when its restore (which ended before the fork call returned) is.
        resumed_by = done if name == "source" else forks_done

        def two_ticks_after(lines: List[str]) -> bool:
            return sum(1 for line in lines if float(line.split()[2]) >= started) >= 2

        lines = output_lines(sb, world.pids["sleeper"], two_ticks_after, timeout=2 * SLEEP_PERIOD + 10)
        ticks = [(int(line.split()[1]), float(line.split()[2])) for line in lines]
        assert [i for i, _ in ticks] == list(range(len(ticks))), f"{name}: the counter did not continue: {lines}"
        j = next((k for k, (_, m) in enumerate(ticks) if m >= started), None)
        assert j is not None and j >= 1 and len(ticks) >= j + 2, f"{name}: no two ticks after the checkpoint: {lines}"
        deadline = ticks[j - 1][1] + SLEEP_PERIOD
        woke = ticks[j][1]
        assert deadline - 0.01 <= woke <= max(deadline, resumed_by) + SLACK, (
            f"{name}: the sleep in progress at the checkpoint (deadline {deadline:.3f}) ended at {woke:.3f}; "
            f"checkpoint {started:.3f}-{done:.3f}, forks restored by {forks_done:.3f}"
        )
        assert abs(ticks[j + 1][1] - woke - SLEEP_PERIOD) < SLACK, f"{name}: the next sleep: {lines}"

        lines = output_lines(sb, world.pids["nanosleep"], lambda ls: any(x.startswith("ended") for x in ls), timeout=10)
        ended = [line.split() for line in lines if line.startswith("ended")]
        assert ended, f"{name}: the relative nanosleep was not interrupted: {lines}"
        _, ret, err, left, at = ended[0]
        assert (int(ret), int(err)) == (-1, errno.EINTR), f"{name}: {lines}"
        assert 0 < float(left) < 30, f"{name}: {lines}"
        assert started <= float(at) <= resumed_by + SLACK, f"{name}: EINTR at {at}, checkpoint {started:.3f}-{done:.3f}, forks by {forks_done:.3f}"
        nano_left[name] = left
    assert len(set(nano_left.values())) == 1, f"every sandbox got the time left at the dump: {nano_left}"
