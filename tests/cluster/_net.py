"""Hosts of the cluster tests: network namespaces of the test's own on a bridge, each with
an address in 198.19.<n>.0/24 (inside the 198.18.0.0/15 test range and outside the
sandboxes' 198.18.0.0/16 pool). The host's end is ``.1``; host ``i`` is ``.(10 + i)``.
Nothing here routes anywhere else.

The bridge lives in a namespace of its own (the switch): bridged frames are then filtered
only by that namespace's rules (none), not by the host's forward policy (a sandfork
daemon on the host drops what it does not forward itself, and the host has
``bridge-nf-call-iptables`` on)."""

from __future__ import annotations

import os
import random
import secrets
import subprocess
from pathlib import Path
from typing import List, Sequence


def sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True)


class TestNet:
    """A bridge and ``count`` namespaces on it."""

    def __init__(self, count: int) -> None:
        self.tag = secrets.token_hex(2)
        self.octet = random.randrange(100, 250)
        self.bridge = f"sfcb{self.tag}"
        self.switch = f"sfcs{self.tag}"
        self.host_ip = self.ip_of(None)
        self.namespaces: List[str] = []
        self._veths: List[str] = []
        try:
            sh("ip", "netns", "add", self.switch)
            sw = ["ip", "netns", "exec", self.switch]
            sh(*sw, "ip", "link", "add", self.bridge, "type", "bridge")
            sh(*sw, "ip", "link", "set", self.bridge, "up")
            host_if, peer = f"sfch{self.tag}", f"sfcp{self.tag}"
            sh("ip", "link", "add", host_if, "type", "veth", "peer", "name", peer)
            self._veths.append(host_if)
            self._plug(peer)
            sh("ip", "addr", "add", f"{self.host_ip}/24", "dev", host_if)
            sh("ip", "link", "set", host_if, "up")
            for i in range(count):
                self._add(i)
        except BaseException:
            self.close()
            raise

    def ip_of(self, i: "int | None") -> str:
        return f"198.19.{self.octet}.{1 if i is None else 10 + i}"

    def ns(self, i: int) -> str:
        return self.namespaces[i]

    def _add(self, i: int) -> None:
        ns, host_if, peer = f"sfcn{self.tag}{i}", f"sfcv{self.tag}{i}", f"sfce{self.tag}{i}"
        sh("ip", "netns", "add", ns)
        self.namespaces.append(ns)
        sh("ip", "link", "add", host_if, "type", "veth", "peer", "name", peer)
        self._veths.append(host_if)
        sh("ip", "link", "set", peer, "netns", ns)
        self._plug(host_if)
        run = ["ip", "netns", "exec", ns]
        sh(*run, "ip", "link", "set", "lo", "up")
        sh(*run, "ip", "link", "set", peer, "name", "eth0")
        sh(*run, "ip", "addr", "add", f"{self.ip_of(i)}/24", "dev", "eth0")
        sh(*run, "ip", "link", "set", "eth0", "up")

    def _plug(self, ifname: str) -> None:
        """Moves ``ifname`` into the switch and onto its bridge."""
        sh("ip", "link", "set", ifname, "netns", self.switch)
        sw = ["ip", "netns", "exec", self.switch]
        sh(*sw, "ip", "link", "set", ifname, "master", self.bridge)
        sh(*sw, "ip", "link", "set", ifname, "up")

    def enter(self, i: int, argv: Sequence[str]) -> List[str]:
        """``argv`` run in namespace ``i``'s network only (the mount namespace stays the host's)."""
        return ["nsenter", f"--net=/run/netns/{self.ns(i)}", "--", *argv]

    def pids_in(self, i: int) -> List[int]:
        """Processes whose network namespace is namespace ``i``'s."""
        target = os.stat(f"/run/netns/{self.ns(i)}")
        out = []
        for p in Path("/proc").iterdir():
            if not p.name.isdigit():
                continue
            try:
                st = os.stat(p / "ns" / "net")
            except OSError:
                continue
            if (st.st_dev, st.st_ino) == (target.st_dev, target.st_ino):
                out.append(int(p.name))
        return out

    def close(self) -> None:
        # A namespace's interfaces go with it (and with them their veth peers).
        for ns in [*self.namespaces, self.switch]:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        for v in self._veths:
            subprocess.run(["ip", "link", "del", v], capture_output=True)
        self.namespaces, self._veths = [], []
