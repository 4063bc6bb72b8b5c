"""epoll, eventfd, timerfd, signalfd and inotify in one process (holder "fds").

An epoll set watches the control socket, a 20 ms periodic timerfd ("timer"), a signalfd
for SIGUSR1 and an inotify watch (IN_CREATE) on /tmp/st/watch; a second epoll set watches
an eventfd whose counter is 5 at the checkpoint. A one-shot timerfd ("oneshot") is armed
to expire 120 s after it was set."""

import ctypes
import os
import select
import signal
import struct
import sys
import time

from stlib import Holder, ask, check_call, emit, libc, ready_info

WATCH = "/tmp/st/watch"
CLOCK_MONOTONIC = 1
IN_CREATE = 0x100
FAST_NS = 20_000_000  # shorter than any checkpoint's pause
ONESHOT_S = 120


class Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", Timespec), ("it_value", Timespec)]


def timerfd(value, interval):
    fd = check_call(libc.timerfd_create(CLOCK_MONOTONIC, os.O_CLOEXEC), "timerfd_create")
    spec = Itimerspec(interval, value)
    check_call(libc.timerfd_settime(fd, 0, ctypes.byref(spec), None), "timerfd_settime")
    return fd


def signalfd(signum):
    signal.pthread_sigmask(signal.SIG_BLOCK, [signum])
    mask = (ctypes.c_ulong * 16)()
    mask[0] = 1 << (signum - 1)
    return check_call(libc.signalfd(-1, ctypes.byref(mask), os.O_CLOEXEC), "signalfd")


def inotify(path):
    fd = check_call(libc.inotify_init1(os.O_CLOEXEC), "inotify_init1")
    check_call(libc.inotify_add_watch(fd, path.encode(), IN_CREATE), "inotify_add_watch")
    return fd


def hold():
    os.makedirs(WATCH, exist_ok=True)
    h = Holder("fds")
    tfd, sfd, ifd = timerfd(Timespec(0, FAST_NS), Timespec(0, FAST_NS)), signalfd(signal.SIGUSR1), inotify(WATCH)
    oneshot = timerfd(Timespec(ONESHOT_S, 0), Timespec(0, 0))
    oneshot_deadline = time.clock_gettime(time.CLOCK_MONOTONIC) + ONESHOT_S
    efd = os.eventfd(5, os.EFD_CLOEXEC)
    ep = select.epoll()
    for fd in (h.sock.fileno(), tfd, sfd, ifd):
        ep.register(fd, select.EPOLLIN)
    ep_e = select.epoll()
    ep_e.register(efd, select.EPOLLIN)
    state = {"ticks": 0, "signals": [], "created": []}

    def on_ready(fd):
        if fd == tfd:
            state["ticks"] += struct.unpack("Q", os.read(tfd, 8))[0]
        elif fd == sfd:
            info = os.read(sfd, 128)  # struct signalfd_siginfo: ssi_signo first
            state["signals"].append(struct.unpack("I", info[:4])[0])
        elif fd == ifd:
            buf = os.read(ifd, 4096)
            off = 0
            while off < len(buf):
                _wd, _mask, _cookie, length = struct.unpack_from("iIII", buf, off)
                state["created"].append(buf[off + 16 : off + 16 + length].rstrip(b"\0").decode())
                off += 16 + length

    def eventfd(new_value):
        ready = [fd for fd, _ in ep_e.poll(0)]
        value = os.eventfd_read(efd)
        os.eventfd_write(efd, new_value)
        return {"ready_before": ready == [efd], "value": value, "ready_after": [fd for fd, _ in ep_e.poll(0)] == [efd]}

    h.handlers.update(state=lambda: dict(state, now=time.monotonic()), eventfd=eventfd)
    h.ready(oneshot_deadline=oneshot_deadline, fds={"timer": tfd, "oneshot": oneshot, "signal": sfd, "inotify": ifd, "eventfd": efd, "epoll": ep.fileno()})
    while True:
        for fd, _ in ep.poll():
            if fd == h.sock.fileno():
                h.answer()
            else:
                on_ready(fd)


def check(tag):
    info = ready_info("fds")
    kinds = {}
    for name, fd in info["fds"].items():
        kinds[name] = os.readlink(f"/proc/{info['pid']}/fd/{fd}")
    fdinfo = {}
    for name in ("timer", "oneshot"):
        with open(f"/proc/{info['pid']}/fdinfo/{info['fds'][name]}") as f:
            fdinfo[name] = {k.strip(): v.strip() for k, v in (line.split(":", 1) for line in f.read().splitlines())}
    now = time.clock_gettime(time.CLOCK_MONOTONIC)
    value = [int(x) for x in fdinfo["oneshot"]["it_value"].strip("()").split(",")]
    oneshot_deadline_now = now + value[0] + value[1] / 1e9
    first = ask("fds", "state")
    time.sleep(0.6)
    second = ask("fds", "state")
    os.kill(info["pid"], signal.SIGUSR1)
    open(f"{WATCH}/new-{tag}", "w").close()
    deadline = time.monotonic() + 5
    while True:
        third = ask("fds", "state")
        if (len(third["signals"]) > len(second["signals"]) and f"new-{tag}" in third["created"]) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    emit({
        "kinds": kinds,
        "fdinfo": fdinfo,
        "oneshot_deadline": [info["oneshot_deadline"], oneshot_deadline_now],
        "ticks": [first["ticks"], second["ticks"]],
        "elapsed": second["now"] - first["now"],
        "signals_before": first["signals"], "signals_after": third["signals"],
        "created_before": first["created"], "created_after": third["created"],
        "eventfd": ask("fds", "eventfd", 1000 + len(tag)),
    })  # fmt: skip


if __name__ == "__main__":
    hold() if sys.argv[1] == "hold" else check(sys.argv[2])
