"""TCP on loopback inside the sandbox: a listening server (echoes one line per new
connection) and an established connection between it and a second process, the client.

    python3 tcp.py hold     # the server (holder "tcp")
    python3 tcp.py client   # the client end of the established connection (holder "tcpclient")
    python3 tcp.py check TAG
"""

import errno
import socket
import sys
import time

from stlib import Holder, ask, emit

PORT = 7101


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


def end_calls(conn):
    """Commands of a holder that keeps one end of the established connection."""

    def recv():
        conn.settimeout(0.5)
        return outcome(lambda: conn.recv(4096))

    def send(text):
        conn.settimeout(1.0)
        return outcome(lambda: conn.sendall(text.encode()) or "sent")

    def info():
        return {"fd": conn.fileno(), "so_error": conn.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)}

    return {"recv": recv, "send": send, "info": info}


def hold():
    h = Holder("tcp")
    lst = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lst.bind(("127.0.0.1", PORT))
    lst.listen(16)
    state = {"established": None, "accepted": 0, "last": "none"}

    def on_fd(fd):
        conn, _ = lst.accept()
        state["accepted"] += 1
        if state["established"] is None:  # the client's connection: kept open
            conn.settimeout(5)
            assert conn.recv(64) == b"hello-from-client\n"
            conn.sendall(b"hello-from-server\n")
            state["established"] = conn
            h.handlers.update({f"e_{k}": v for k, v in end_calls(conn).items()})
            h.ready(port=PORT)
            return
        with conn:  # any later connection: one line echoed back
            conn.settimeout(5)
            line = conn.recv(256).decode().strip()
            conn.sendall(f"echo:{line}:last={state['last']}\n".encode())
            state["last"] = line

    h.handlers["accepted"] = lambda: state["accepted"]
    h.serve(fds=[lst.fileno()], on_fd=on_fd)


def client():
    h = Holder("tcpclient")
    deadline = time.monotonic() + 10
    while True:
        try:
            conn = socket.create_connection(("127.0.0.1", PORT), timeout=5)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    conn.sendall(b"hello-from-client\n")
    assert conn.recv(64) == b"hello-from-server\n"
    h.handlers.update(end_calls(conn))
    h.ready(local=conn.getsockname(), peer=conn.getpeername())
    h.serve()


def check(tag):
    out = {}
    # The established connection, both ends: read first (what is pending), then write.
    out["client_recv"] = ask("tcpclient", "recv")
    out["server_recv"] = ask("tcp", "e_recv")
    out["client_send"] = ask("tcpclient", "send", f"c2s-{tag}\n")
    out["server_got"] = ask("tcp", "e_recv")
    out["server_send"] = ask("tcp", "e_send", f"s2c-{tag}\n")
    out["client_got"] = ask("tcpclient", "recv")
    # The listener: a new connection from this process.
    with socket.create_connection(("127.0.0.1", PORT), timeout=5) as c:
        c.sendall(f"ping-{tag}\n".encode())
        out["echo"] = c.recv(256).decode().strip()
    out["accepted"] = ask("tcp", "accepted")
    emit(out)


if __name__ == "__main__":
    {"hold": hold, "client": client}.get(sys.argv[1], lambda: check(sys.argv[2]))()
