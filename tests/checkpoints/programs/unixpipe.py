"""Unix stream sockets and pipes between two processes: a parent (holder "unixpipe") and
its child share a socketpair, a pipe each way, and a connection to a named listening
socket. The child left one message unread in each channel towards the parent (data in
flight at the checkpoint); afterwards it echoes every line it gets on the channel it came from."""

import os
import select
import socket
import sys
import time

from stlib import Holder, ask, emit

PATH = "/tmp/st/unixpipe.sock"
QUEUED = {"socketpair": b"queued-socketpair\n", "pipe": b"queued-pipe\n", "named": b"queued-named\n"}


def read_line(fd, timeout=5.0):
    data = b""
    deadline = time.monotonic() + timeout
    while not data.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return data.decode() + "<timeout>"
        chunk = os.read(fd, 1)
        if not chunk:
            return data.decode() + "<EOF>"
        data += chunk
    return data.decode().strip()


def child(sp, p2c_r, c2p_w, ctl_fd):
    os.close(ctl_fd)
    os.write(sp.fileno(), QUEUED["socketpair"])
    os.write(c2p_w, QUEUED["pipe"])
    named = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    named.connect(PATH)
    named.sendall(QUEUED["named"])
    out_of = {sp.fileno(): sp.fileno(), p2c_r: c2p_w, named.fileno(): named.fileno()}
    while True:
        for fd in select.select(list(out_of), [], [])[0]:
            line = read_line(fd)
            os.write(out_of[fd], f"echo:{line}:pid={os.getpid()}\n".encode())


def hold():
    h = Holder("unixpipe")
    if os.path.exists(PATH):
        os.unlink(PATH)
    lst = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    lst.bind(PATH)
    lst.listen(1)
    sp_parent, sp_child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    p2c_r, p2c_w = os.pipe()
    c2p_r, c2p_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        sp_parent.close()
        os.close(p2c_w)
        os.close(c2p_r)
        lst.close()
        try:
            child(sp_child, p2c_r, c2p_w, h.sock.fileno())
        finally:
            os._exit(1)
    sp_child.close()
    os.close(p2c_r)
    os.close(c2p_w)
    named, _ = lst.accept()
    # Ready once every queued message has arrived (still unread).
    deadline = time.monotonic() + 10
    while len(named.recv(64, socket.MSG_PEEK)) < len(QUEUED["named"]) and time.monotonic() < deadline:
        time.sleep(0.01)
    channels = {"socketpair": (sp_parent.fileno(), sp_parent.fileno()), "pipe": (c2p_r, p2c_w), "named": (named.fileno(), named.fileno())}
    state = {"last": "none"}

    def drain():
        return {name: read_line(rfd, timeout=2) for name, (rfd, _) in channels.items()}

    def roundtrip(tag):
        before = state["last"]
        got = {}
        for name, (rfd, wfd) in channels.items():
            os.write(wfd, f"{name}-{tag}\n".encode())
            got[name] = read_line(rfd)
        state["last"] = tag
        return {"got": got, "last_before": before}

    h.handlers.update(drain=drain, roundtrip=roundtrip)
    h.ready(child=pid)
    h.serve()


def check(tag):
    out = {"drained": ask("unixpipe", "drain"), **ask("unixpipe", "roundtrip", tag)}
    emit(out)


if __name__ == "__main__":
    hold() if sys.argv[1] == "hold" else check(sys.argv[2])
