"""Reading a daemon's /metrics over its Unix socket."""

from __future__ import annotations

import http.client
import socket

from _daemon import Daemon


def metric(d: Daemon, name: str) -> float:
    """One value of the daemon's /metrics."""
    for line in _metrics(d).splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def _metrics(d: Daemon) -> str:
    class Unix(http.client.HTTPConnection):
        def connect(self) -> None:
            self.sock = socket.socket(socket.AF_UNIX)
            self.sock.connect(str(d.socket))

    c = Unix("localhost")
    c.request("GET", "/metrics")
    return c.getresponse().read().decode()
