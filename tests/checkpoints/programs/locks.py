"""File locks: a POSIX record lock (fcntl F_SETLK), a flock() and an OFD lock (F_OFD_SETLK),
each on its own file, held by one holder process."""

import errno
import fcntl
import os
import struct
import sys

from stlib import Holder, ask, emit, ready_info

DIR = "/tmp/st/locks"
FILES = {"posix": f"{DIR}/posix.dat", "flock": f"{DIR}/flock.dat", "ofd": f"{DIR}/ofd.dat"}
KIND_IN_PROC = {"posix": "POSIX", "flock": "FLOCK", "ofd": "OFDLCK"}
BUSY = (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK)


def flock_struct(kind):
    # struct flock on x86_64: short l_type, short l_whence, off_t l_start, off_t l_len, pid_t l_pid
    return struct.pack("hhqqi4x", kind, os.SEEK_SET, 0, 0, 0)


def take(kind, fd):
    """Takes the lock of ``kind`` on ``fd`` without waiting (raises OSError when busy)."""
    if kind == "posix":
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 0, 0)
    elif kind == "flock":
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    else:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, flock_struct(fcntl.F_WRLCK))


def release(kind, fd):
    if kind == "posix":
        fcntl.lockf(fd, fcntl.LOCK_UN, 0, 0)
    elif kind == "flock":
        fcntl.flock(fd, fcntl.LOCK_UN)
    else:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, flock_struct(fcntl.F_UNLCK))


def locks_on(inodes):
    """{kind: [pid as /proc/locks shows it, ...]} for the locks on our files. (/proc/locks
    lists the OFD locks of every sandbox on the host: their pid is -1, so no pid namespace
    hides them; the device number tells ours apart.)"""
    dev = os.stat(DIR).st_dev
    ours = (os.major(dev), os.minor(dev))
    found = {}
    with open("/proc/locks") as f:
        for line in f:
            parts = line.split()
            # "1: POSIX  ADVISORY  WRITE 123 00:2e:1234 0 EOF" (blocked waiters have "->")
            if "->" in parts:
                continue
            major, minor, ino = parts[5].split(":")
            if (int(major, 16), int(minor, 16)) != ours:  # "%02x:%02x:%lu"
                continue
            for kind, wanted in inodes.items():
                if int(ino) == wanted and parts[1] == KIND_IN_PROC[kind]:
                    found.setdefault(kind, []).append(int(parts[4]))
    return found


def hold():
    os.makedirs(DIR, exist_ok=True)
    h = Holder("locks")
    fds = {}
    for kind, path in FILES.items():
        fds[kind] = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        os.write(fds[kind], b"locked file\n")
        take(kind, fds[kind])

    def release_all():
        for kind, fd in fds.items():
            release(kind, fd)
        return True

    h.handlers["release"] = release_all
    h.ready(inodes={k: os.stat(p).st_ino for k, p in FILES.items()})
    h.serve()


def check(tag):
    info = ready_info("locks")
    holder = info["pid"]
    out = {"holder": holder, "before": locks_on(info["inodes"]), "contended": {}, "after_release": {}}
    fds = {k: os.open(p, os.O_RDWR) for k, p in FILES.items()}
    for kind, fd in fds.items():
        try:
            take(kind, fd)
            out["contended"][kind] = "taken"  # the holder no longer holds it
        except OSError as e:
            out["contended"][kind] = errno.errorcode.get(e.errno, str(e.errno)) if e.errno in BUSY else f"unexpected {e!r}"
    if not all(v != "taken" for v in out["contended"].values()):
        emit(out)
        return
    out["released"] = ask("locks", "release")
    for kind, fd in fds.items():
        try:
            take(kind, fd)
            out["after_release"][kind] = "taken"
        except OSError as e:
            out["after_release"][kind] = f"busy: {e!r}"
    out["me"] = os.getpid()
    out["held_by_me"] = locks_on(info["inodes"])
    emit(out)


if __name__ == "__main__":
    hold() if sys.argv[1] == "hold" else check(sys.argv[2])
