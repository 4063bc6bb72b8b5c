"""A process tree (holder "tree" is its root): a zombie child (exited with 7, not reaped),
a child that leads its own process group, and a child that leads its own session with a
grandchild in it."""

import os
import signal
import sys
import time

from stlib import Holder, ask, emit, proc_stat, ready_info


def forever():
    while True:
        signal.pause()


def hold():
    h = Holder("tree")
    zombie = os.fork()
    if zombie == 0:
        os._exit(7)
    group = os.fork()
    if group == 0:
        os.setpgid(0, 0)
        forever()
    session = os.fork()
    if session == 0:
        os.setsid()
        if os.fork() == 0:
            forever()
        forever()
    deadline = time.monotonic() + 10
    while True:
        kids = [int(p) for p in open(f"/proc/{session}/task/{session}/children").read().split()]
        st = {p: proc_stat(p) for p in (zombie, group, session, *kids)}
        if kids and st[zombie]["state"] == "Z" and st[group]["pgrp"] == group and st[kids[0]]["session"] == session:
            break
        assert time.monotonic() < deadline, st
        time.sleep(0.01)

    def reap():
        pid, status = os.waitpid(zombie, os.WNOHANG)
        return {"pid": pid, "exit": os.waitstatus_to_exitcode(status) if pid else None}

    h.handlers["reap"] = reap
    pids = {"root": os.getpid(), "zombie": zombie, "group": group, "session": session, "grandchild": kids[0]}
    h.ready(pids=pids, stats={k: proc_stat(p) for k, p in pids.items()})
    h.serve()


def check(tag):
    info = ready_info("tree")
    pids = info["pids"]
    out = {"expected": info["stats"], "stats": {k: proc_stat(p) for k, p in pids.items()}}
    try:
        os.killpg(pids["group"], 0)
        out["group_signalable"] = True
    except OSError as e:
        out["group_signalable"] = repr(e)
    out["reap"] = ask("tree", "reap")
    out["zombie_after_reap"] = proc_stat(pids["zombie"])
    emit(out)


if __name__ == "__main__":
    hold() if sys.argv[1] == "hold" else check(sys.argv[2])
