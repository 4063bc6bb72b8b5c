"""A process with four threads, each counting on its own every 10 ms (holder "threads")."""

import os
import sys
import threading
import time

from stlib import Holder, ask, emit, ready_info

N = 4


def hold():
    h = Holder("threads")
    counts = [0] * N
    tids = [0] * N
    started = threading.Barrier(N + 1)

    def work(i):
        tids[i] = threading.get_native_id()
        started.wait()
        while True:
            counts[i] += 1
            time.sleep(0.01)

    for i in range(N):
        threading.Thread(target=work, args=(i,), daemon=True).start()
    started.wait()

    def set_all(base):
        before = list(counts)
        for i in range(N):
            counts[i] = base
        return before

    h.handlers.update(counts=lambda: list(counts), set=set_all)
    h.ready(tids=tids)
    h.serve()


def check(tag):
    info = ready_info("threads")
    tasks = sorted(int(t) for t in os.listdir(f"/proc/{info['pid']}/task"))
    first = ask("threads", "counts")
    time.sleep(0.5)
    second = ask("threads", "counts")
    before_set = ask("threads", "set", 10**9)
    emit({"tasks": tasks, "tids": info["tids"], "pid": info["pid"], "first": first, "second": second, "before_set": before_set})


if __name__ == "__main__":
    hold() if sys.argv[1] == "hold" else check(sys.argv[2])
