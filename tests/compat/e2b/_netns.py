"""A network namespace holding only loopback, for running the E2B SDKs against a daemon
that listens on the host's loopback.

The SDK processes run inside the namespace (``nsenter -n``), where no interface but
``lo`` exists, so nothing they do can leave the machine. The daemon stays outside (it
builds and imports images, and runs sandboxes, as usual). A listening socket is made
*inside* the namespace by a thread that joins it with ``setns(2)`` just for that; every
connection accepted there is passed on, from the host's namespace, to the daemon's
loopback port. Needs root.
"""

from __future__ import annotations

import ctypes
import os
import socket
import subprocess
import threading
import time
from typing import List, Optional

CLONE_NEWNET = 0x40000000


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


class LoopbackNetns:
    """A namespace (held by a sleeping ``unshare -n``) whose ``127.0.0.1:<port>`` leads to
    the host's ``127.0.0.1:<target_port>``."""

    def __init__(self, target_port: int, ports: List[int]) -> None:
        self.target_port = target_port
        self.holder = subprocess.Popen(["unshare", "-n", "--", "sleep", "infinity"], start_new_session=True)
        self.listeners: List[socket.socket] = []
        self.closed = threading.Event()
        try:
            self._wait_for_namespace()
            self._run(["ip", "link", "set", "lo", "up"])
            links = self._run(["ip", "-o", "link", "show"], capture=True)
            extra = [line for line in links.splitlines() if ": lo:" not in line]
            if extra:
                raise RuntimeError(f"the namespace has more than loopback: {extra}")
            for port in ports:
                self.listeners.append(self._listen_inside(port))
            for listener in self.listeners:
                threading.Thread(target=self._accept, args=(listener,), daemon=True).start()
        except BaseException:
            self.close()
            raise

    def _wait_for_namespace(self) -> None:
        """Until the holder has left the host's namespace (``unshare`` runs after the
        process starts: entering it earlier would enter the host's)."""
        deadline = time.monotonic() + 10
        host = os.readlink("/proc/self/ns/net")
        while time.monotonic() < deadline:
            if self.holder.poll() is not None:
                raise RuntimeError("unshare -n failed (root is needed)")
            try:
                if os.readlink(f"/proc/{self.holder.pid}/ns/net") != host:
                    return
            except OSError:
                pass
            time.sleep(0.01)
        raise RuntimeError("the network namespace was not made in time")

    def _run(self, argv: List[str], capture: bool = False) -> str:
        out = subprocess.run(["nsenter", "-t", str(self.holder.pid), "-n", "--", *argv], check=True, capture_output=capture, text=True, timeout=30)
        return out.stdout or ""

    def _listen_inside(self, port: int) -> socket.socket:
        made: dict = {}

        def make() -> None:
            try:
                with open(f"/proc/{self.holder.pid}/ns/net") as ns:
                    _setns(ns.fileno())
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind(("127.0.0.1", port))
                s.listen(128)
                made["socket"] = s
            except BaseException as e:  # noqa: BLE001
                made["error"] = e

        # The thread that joined the namespace ends with it: no other thread changes.
        t = threading.Thread(target=make)
        t.start()
        t.join()
        if "error" in made:
            raise made["error"]
        return made["socket"]

    def _accept(self, listener: socket.socket) -> None:
        while not self.closed.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=self._bridge, args=(conn,), daemon=True).start()

    def _bridge(self, inner: socket.socket) -> None:
        try:
            outer = socket.create_connection(("127.0.0.1", self.target_port), timeout=10)
            outer.settimeout(None)
        except OSError:
            inner.close()
            return
        for a, b in ((inner, outer), (outer, inner)):
            threading.Thread(target=_pump, args=(a, b), daemon=True).start()

    def command(self, argv: List[str]) -> List[str]:
        """``argv`` to run inside the namespace."""
        return ["nsenter", "-t", str(self.holder.pid), "-n", "--", *argv]

    def close(self) -> None:
        self.closed.set()
        for listener in self.listeners:
            try:
                listener.close()
            except OSError:
                pass
        if self.holder.poll() is None:
            self.holder.kill()
            self.holder.wait()


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def free_port(netns: Optional[LoopbackNetns] = None) -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
