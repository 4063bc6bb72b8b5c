"""Holds MB megabytes of random bytes (no two pages alike) and answers one command per
connection on /tmp/mem.sock: ``sum`` (the data's SHA-256), ``write`` (flips a byte in
every page, then ``sum``) and ``merged`` (how many of this process's pages the kernel has
merged with equal pages elsewhere, from /proc/self/ksm_stat).

    python3 memholder.py MB     # serves; /tmp/mem.ready once the data is in place
    python3 memholder.py ask CMD
"""

import hashlib
import os
import socket
import sys

SOCK = "/tmp/mem.sock"


def merged():
    for line in open("/proc/self/ksm_stat"):
        key, _, value = line.partition(" ")
        if key == "ksm_merging_pages":
            return int(value)
    return 0


def serve(mb):
    data = bytearray(os.urandom(mb << 20))
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(SOCK)
    srv.listen(8)
    open("/tmp/mem.ready", "w").close()
    while True:
        conn, _ = srv.accept()
        cmd = conn.recv(64).decode()
        if cmd == "write":
            for i in range(0, len(data), 4096):
                data[i] ^= 0xFF
        answer = str(merged()) if cmd == "merged" else hashlib.sha256(data).hexdigest()
        conn.sendall(answer.encode())
        conn.close()


def ask(cmd):
    s = socket.socket(socket.AF_UNIX)
    s.connect(SOCK)
    s.sendall(cmd.encode())
    print(s.recv(128).decode())


if __name__ == "__main__":
    if sys.argv[1] == "ask":
        ask(sys.argv[2])
    else:
        serve(int(sys.argv[1]))
