"""Sleeping processes and clocks.

    python3 sleeper.py hold       # holder "sleeper": its main thread prints "tick I MONO" and
                                  # then sleeps PERIOD s with time.sleep (an absolute
                                  # CLOCK_MONOTONIC deadline: clock_nanosleep TIMER_ABSTIME);
                                  # a second thread answers the control socket
    python3 sleeper.py nanosleep  # a relative nanosleep(2) of 30 s, printing how each ended,
                                  # then sleeping again for what was left
    python3 sleeper.py check TAG  # the clocks of the holder and of this process, and the time
                                  # namespace they are in with its offsets
"""

import ctypes
import os
import sys
import threading
import time

from stlib import Holder, ask, emit, libc, ready_info

PERIOD = 5.0
NANOSLEEP_S = 30


def clocks():
    return {"mono": time.clock_gettime(time.CLOCK_MONOTONIC), "boot": time.clock_gettime(time.CLOCK_BOOTTIME),
            "real": time.clock_gettime(time.CLOCK_REALTIME)}  # fmt: skip


def hold():
    h = Holder("sleeper")
    h.handlers["clocks"] = clocks
    h.ready(period=PERIOD)
    threading.Thread(target=h.serve, daemon=True).start()
    i = 0
    while True:
        print(f"tick {i} {time.clock_gettime(time.CLOCK_MONOTONIC):.6f}", flush=True)
        i += 1
        time.sleep(PERIOD)


class Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def nanosleep():
    h = Holder("nanosleep")
    h.ready(seconds=NANOSLEEP_S)
    threading.Thread(target=h.serve, daemon=True).start()
    req = Timespec(NANOSLEEP_S, 0)
    while True:
        print(f"sleep {req.tv_sec + req.tv_nsec / 1e9:.6f} {time.clock_gettime(time.CLOCK_MONOTONIC):.6f}", flush=True)
        rem = Timespec(0, 0)
        ret = libc.nanosleep(ctypes.byref(req), ctypes.byref(rem))
        err = ctypes.get_errno() if ret else 0
        left = rem.tv_sec + rem.tv_nsec / 1e9
        print(f"ended {ret} {err} {left:.6f} {time.clock_gettime(time.CLOCK_MONOTONIC):.6f}", flush=True)
        req = rem if ret else Timespec(NANOSLEEP_S, 0)


def check(tag):
    holder = ask("sleeper", "clocks")
    mine = clocks()
    with open("/proc/self/timens_offsets") as f:
        offsets = {name: int(sec) + int(nsec) / 1e9 for name, sec, nsec in (line.split() for line in f)}
    pid = ready_info("sleeper")["pid"]
    same_ns = os.readlink(f"/proc/{pid}/ns/time") == os.readlink("/proc/self/ns/time")
    emit({"holder": holder, "new_process": mine, "timens_offsets": offsets, "holder_in_my_time_ns": same_ns})


if __name__ == "__main__":
    {"hold": hold, "nanosleep": nanosleep}.get(sys.argv[1], lambda: check(sys.argv[2]))()
