"""Shared memory.

    python3 shm.py hold   # holder "shm", with a child "shmchild" that shares its memory:
                          # POSIX shared memory (multiprocessing.shared_memory,
                          # /dev/shm/st_posix), a shared anonymous mapping inherited by the
                          # child, a memfd with contents, and a plain file in /dev/shm
    python3 shm.py sysv   # holder "sysv": a System V segment (key 0x5f5f0001) attached
"""

import ctypes
import mmap
import os
import sys
from multiprocessing import shared_memory

from stlib import Holder, ask, check_call, emit, libc, ready_info

SIZE = 4096
SYSV_KEY = 0x5F5F0001
IPC_CREAT = 0o1000
DEVSHM_FILE = "/dev/shm/st-file"
libc.shmat.restype = ctypes.c_void_p
libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]


def sysv_attach(create):
    shmid = check_call(libc.shmget(SYSV_KEY, SIZE, (IPC_CREAT | 0o600) if create else 0), "shmget")
    addr = libc.shmat(shmid, None, 0)
    if addr in (None, ctypes.c_void_p(-1).value):
        raise OSError(ctypes.get_errno(), "shmat")
    return shmid, addr


def put(buf_or_addr, text):
    data = text.encode().ljust(32, b"\0")
    if isinstance(buf_or_addr, int):
        ctypes.memmove(buf_or_addr, data, len(data))
    else:
        buf_or_addr[:32] = data


def get(buf_or_addr):
    raw = ctypes.string_at(buf_or_addr, 32) if isinstance(buf_or_addr, int) else bytes(buf_or_addr[:32])
    return raw.rstrip(b"\0").decode()


def hold_sysv():
    h = Holder("sysv")
    shmid, addr = sysv_attach(create=True)
    put(addr, "sysv-orig")
    h.handlers["read"] = lambda: get(addr)
    h.handlers["write"] = lambda tag: put(addr, tag)
    h.ready(shmid=shmid)
    h.serve()


def hold():
    posix = shared_memory.SharedMemory(name="st_posix", create=True, size=SIZE)
    anon = mmap.mmap(-1, SIZE, flags=mmap.MAP_SHARED)
    memfd = os.memfd_create("st-memfd", 0)
    with open(DEVSHM_FILE, "w") as f:
        f.write("devshm-orig")

    def read():
        return {"posix": get(posix.buf), "anon": get(anon), "memfd": os.pread(memfd, 32, 0).decode()}

    def write(tag):
        for where in (posix.buf, anon):
            put(where, tag)
        os.pwrite(memfd, tag.encode().ljust(32, b"\0"), 0)
        os.ftruncate(memfd, len(tag))
        return True

    for where in (posix.buf, anon):
        put(where, "orig")
    os.write(memfd, b"orig")
    child = os.fork()
    if child == 0:
        h = Holder("shmchild")
        h.handlers["read"] = read
        h.ready()
        try:
            h.serve()
        finally:
            os._exit(1)
    h = Holder("shm")
    h.handlers.update(read=read, write=write)
    h.ready(memfd=memfd, child=child)
    h.serve()


def check(tag):
    info = ready_info("shm")
    out = {"holder_before": ask("shm", "read"), "child_before": ask("shmchild", "read")}
    with open(DEVSHM_FILE) as f:
        out["devshm_file_before"] = f.read()
    with open(DEVSHM_FILE, "w") as f:
        f.write(f"devshm-{tag}")
    ask("shm", "write", tag)
    out["child_after"] = ask("shmchild", "read")
    # From this new process, through the names the segments have.
    # (Not SharedMemory(name=...): on Python 3.11 its resource tracker would unlink the
    # segment when this process ends.)
    fd = os.open("/dev/shm/st_posix", os.O_RDWR)
    mine = mmap.mmap(fd, SIZE)
    out["new_process_after"] = {"posix": get(mine)}
    with open(f"/proc/{info['pid']}/fd/{info['memfd']}", "rb") as f:
        out["new_process_after"]["memfd"] = f.read().decode()
    out["memfd_link"] = os.readlink(f"/proc/{info['pid']}/fd/{info['memfd']}")
    mine.close()
    emit(out)


if __name__ == "__main__":
    {"hold": hold, "sysv": hold_sysv}.get(sys.argv[1], lambda: check(sys.argv[2]))()
