"""TCP connections of a sandbox across a memory checkpoint (test_loopback_tcp.py).

A server (holder "loopsrv") listens on 127.0.0.1 and, where the sandbox has it, ::1; a
client (holder "loopcli") holds a connection to each, plus one to a listener outside the
sandbox (HOST PORT). The server also keeps a connection a host process makes to it from
inside the sandbox's network namespace ("host"). Each connection is told apart by the
first line its client sends. Before the checkpoint, each end of a loopback connection
sends one line the other end has not read yet.

    python3 looptcp.py serve              # the server
    python3 looptcp.py client HOST PORT   # the client
    python3 looptcp.py prime              # queues one line each way on the loopback ones
    python3 looptcp.py check TAG
"""

import errno
import socket
import sys
import time

from stlib import Holder, ask, emit, ready_info

PORT = 7201


def outcome(fn):
    """What a socket call did: its result, "EOF", or the errno name it failed with."""
    try:
        r = fn()
        if isinstance(r, bytes):
            return r.decode() if r else "EOF"
        return r
    except socket.timeout:
        return "timeout"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e))


def line_calls(conns):
    """Commands on the connections of ``conns`` (name -> socket): recv and send a line."""

    def recv(name):
        c = conns[name]
        c.settimeout(2.0)
        return outcome(lambda: c.recv(4096))

    def send(name, text):
        c = conns[name]
        c.settimeout(2.0)
        return outcome(lambda: c.sendall(text.encode()) or "sent")

    return {"recv": recv, "send": send, "names": lambda: sorted(conns)}


def listeners():
    out = []
    for family, addr in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        try:
            s = socket.socket(family, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((addr, PORT))
            s.listen(16)
            out.append(s)
        except OSError:  # no ::1 in this sandbox
            s.close()
    return out


def serve():
    h = Holder("loopsrv")
    lst = {s.fileno(): s for s in listeners()}
    conns = {}

    def on_fd(fd):
        conn, _ = lst[fd].accept()
        conn.settimeout(5)
        name = b""
        while not name.endswith(b"\n"):
            chunk = conn.recv(1)
            if not chunk:
                conn.close()
                return
            name += chunk
        conns[name.decode().strip()] = conn

    h.handlers.update(line_calls(conns))
    h.ready(port=PORT, families=["v4", "v6"][: len(lst)])
    h.serve(fds=list(lst), on_fd=on_fd)


def connect(addr, timeout=10.0):
    deadline = time.monotonic() + timeout
    while True:
        try:
            return socket.create_connection(addr, timeout=5)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def client(host, port):
    h = Holder("loopcli")
    conns = {}
    for name in ready_info("loopsrv")["families"]:
        c = connect(("127.0.0.1" if name == "v4" else "::1", PORT))
        c.sendall(f"{name}\n".encode())
        conns[name] = c
    out = connect((host, int(port)))
    out.sendall(b"out\n")
    conns["out"] = out
    h.handlers.update(line_calls(conns))
    h.ready(loopback=[n for n in conns if n != "out"])
    h.serve()


def prime():
    for name in ready_info("loopcli")["loopback"]:
        assert ask("loopcli", "send", name, f"queued-c2s-{name}\n") == "sent"
        assert ask("loopsrv", "send", name, f"queued-s2c-{name}\n") == "sent"
    emit(sorted(ask("loopsrv", "names")))


def check(tag):
    """Per connection: what each end reads first (the line queued at the checkpoint, or
    what closed it), then a new line each way. "out" has its far end outside: only this
    end's reads and writes; "host" likewise at the server."""
    res = {}
    for name in ready_info("loopcli")["loopback"]:
        r = {}
        r["client_first"] = ask("loopcli", "recv", name)
        r["server_first"] = ask("loopsrv", "recv", name)
        r["client_send"] = ask("loopcli", "send", name, f"c2s-{tag}\n")
        r["server_got"] = ask("loopsrv", "recv", name)
        r["server_send"] = ask("loopsrv", "send", name, f"s2c-{tag}\n")
        r["client_got"] = ask("loopcli", "recv", name)
        res[name] = r
    for holder, name in (("loopcli", "out"), ("loopsrv", "host")):
        res[name] = {"first": ask(holder, "recv", name), "send": ask(holder, "send", name, f"{name}-{tag}\n")}
    emit(res)


if __name__ == "__main__":
    {"serve": serve, "client": lambda: client(*sys.argv[2:4]), "prime": prime}.get(sys.argv[1], lambda: check(sys.argv[2]))()
