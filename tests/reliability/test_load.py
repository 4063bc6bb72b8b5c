"""Load: waves of 100 sandboxes created, exec'd and destroyed by 32 client threads, for a
bounded time, while the daemon's memory is sampled.

Each wave creates 100 sandboxes (one in five with a network of its own), runs a command in each that echoes a token unique to it
and writes and reads back a file, uploads and downloads a file of its own through the file
API, and destroys them all. Waves alternate between all 100 alive at once (created, then
checked, then destroyed) and each thread taking one sandbox through its whole life, so
that creates, execs and destroys interleave. Admission refusals (429) are
back-pressure and retried; any other error, or a wrong answer, fails the test.

The daemon's VmRSS is sampled throughout: after the first wave (warm-up), the maximum of
the second half of the run may exceed the maximum of the first half by at most
``RSS_SLACK_MIB``. Its open file descriptors after the run may not exceed those after the
warm-up by more than a few. Nothing may be left on the host afterwards.

``SANDFORK_LOAD_SECS`` bounds the time spent starting waves (default 60; at least three
waves run).
"""

from __future__ import annotations

import os
import secrets
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional, Tuple

import pytest
from _daemon import Daemon
from conftest import Faults, finish, leaks_except, new_daemon
from sandfork import CapacityError, Client, Sandbox, SandforkError

LOAD_SECS = float(os.environ.get("SANDFORK_LOAD_SECS", "60"))
WAVE = 100
THREADS = 32
MEMORY_MB = 128
RSS_SLACK_MIB = 64
FD_SLACK = 16
# The warm-up wave and two to compare, however short SANDFORK_LOAD_SECS is.
MIN_WAVES = 3
# One sandbox in NET_EVERY gets a network of its own (veth, nftables rules, address lease).
NET_EVERY = 5
# Every live sandbox's summed memory_mb fits; the sandbox count is the default cap.
CONFIG = f"max_memory_mb = {WAVE * MEMORY_MB * 2}\n"


@dataclass
class Tally:
    created: int = 0
    checked: int = 0
    destroyed: int = 0
    refused: int = 0
    errors: List[str] = field(default_factory=list)
    create_ms: List[float] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, what: str, n: int = 1) -> None:
        with self.lock:
            setattr(self, what, getattr(self, what) + n)

    def created_in(self, secs: float) -> None:
        with self.lock:
            self.create_ms.append(secs * 1000)

    def create_percentiles(self) -> str:
        ms = sorted(self.create_ms) or [0.0]
        return f"create p50 {ms[len(ms) // 2]:.0f} ms, p99 {ms[min(len(ms) - 1, len(ms) * 99 // 100)]:.0f} ms"

    def error(self, text: str) -> None:
        with self.lock:
            self.errors.append(text)


class Sampler(threading.Thread):
    """Samples a process's VmRSS (KiB) and open descriptors every ``period`` seconds."""

    def __init__(self, pid: int, period: float = 0.25):
        super().__init__(daemon=True)
        self.pid, self.period = pid, period
        self.samples: List[Tuple[float, int]] = []
        self.stop = threading.Event()

    def rss_kib(self) -> Optional[int]:
        try:
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        except OSError:
            return None
        return None

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def run(self) -> None:
        while not self.stop.is_set():
            rss = self.rss_kib()
            if rss is not None:
                self.samples.append((time.monotonic(), rss))
            self.stop.wait(self.period)


def create(c: Client, tally: Tally, net: bool) -> Optional[Sandbox]:
    """Creates a sandbox (``net``: with a network of its own), treating 429 as back-pressure."""
    delay = 0.05
    while True:
        try:
            t = time.monotonic()
            sb = Sandbox.create(client=c, memory_mb=MEMORY_MB, labels={"load": "1"}, allow_internet_access=net)
            tally.created_in(time.monotonic() - t)
            tally.add("created")
            return sb
        except CapacityError:
            tally.add("refused")
            time.sleep(delay)
            delay = min(delay * 2, 1.0)
        except SandforkError as e:
            tally.error(f"create: {e}")
            return None


def check(sb: Sandbox, tally: Tally) -> None:
    """Exec with a token, a file written and read in the sandbox, and through the file API."""
    token = secrets.token_hex(8)
    try:
        r = sb.run("sh", ["-c", f"echo {token}; echo {token}-{sb.id} > /root/t; cat /root/t"], timeout=60)
        want = f"{token}\n{token}-{sb.id}\n"
        if r.exit_code != 0 or r.stdout_bytes.decode() != want:
            tally.error(f"{sb.id}: exec answered {r.exit_code} {r.stdout!r} {r.stderr!r}, expected {want!r}")
            return
        blob = secrets.token_bytes(4096) + sb.id.encode()
        sb.write_file("/root/blob", blob)
        if sb.read_file("/root/blob") != blob:
            tally.error(f"{sb.id}: the file read back differs from the one written")
            return
        tally.add("checked")
    except SandforkError as e:
        tally.error(f"{sb.id}: {e}")


def destroy(sb: Sandbox, tally: Tally) -> None:
    try:
        sb.terminate()
        tally.add("destroyed")
    except SandforkError as e:
        tally.error(f"terminate {sb.id}: {e}")


def wave(pool: ThreadPoolExecutor, c: Client, tally: Tally, together: bool) -> None:
    """100 sandboxes: all alive at once (``together``), or each created, checked and
    destroyed by one thread, so that creates, execs and destroys interleave."""
    if together:
        boxes = [sb for sb in pool.map(lambda i: create(c, tally, i % NET_EVERY == 0), range(WAVE)) if sb is not None]
        list(pool.map(lambda sb: check(sb, tally), boxes))
        list(pool.map(lambda sb: destroy(sb, tally), boxes))
    else:
        list(pool.map(lambda i: lifecycle(c, tally, i % NET_EVERY == 0), range(WAVE)))


def lifecycle(c: Client, tally: Tally, net: bool) -> None:
    sb = create(c, tally, net)
    if sb is not None:
        check(sb, tally)
        destroy(sb, tally)


def rss_verdict(samples: List[Tuple[float, int]], warm_until: float) -> Tuple[bool, str]:
    """Flat: the second half's max within RSS_SLACK_MIB of the first half's (after warm-up)."""
    after = [(t, r) for t, r in samples if t >= warm_until]
    if len(after) < 4:
        return False, f"too few RSS samples after the warm-up ({len(after)})"
    mid = (after[0][0] + after[-1][0]) / 2
    first = max(r for t, r in after if t < mid) // 1024
    second = max(r for t, r in after if t >= mid) // 1024
    warm = max(r for t, r in samples if t < warm_until) // 1024
    t0, t1 = samples[0][0], samples[-1][0] + 1e-9
    tenths = [max((r for t, r in samples if int((t - t0) * 10 / (t1 - t0)) == k), default=0) // 1024 for k in range(10)]
    text = (f"daemon RSS max: warm-up {warm} MiB, first half {first} MiB, second half {second} MiB (slack {RSS_SLACK_MIB});"
            f" by tenths of the run: {' '.join(map(str, tenths))} MiB")  # fmt: skip
    return second <= first + RSS_SLACK_MIB, text


@pytest.mark.fault("load")
def test_waves_of_sandboxes_from_many_threads(faults: Faults) -> None:
    """Waves of 100 sandboxes created, exec'd (token echo, file write/read) and destroyed by 32 client threads, all at once or interleaved; daemon memory flat."""
    d: Daemon = new_daemon(config=CONFIG)
    try:
        c = Client(url=d.url)
        tally = Tally()
        sampler = Sampler(d.process.pid)
        sampler.start()
        started = time.monotonic()
        waves = 0
        with ThreadPoolExecutor(THREADS) as pool:
            wave(pool, c, tally, together=True)
            waves += 1
            warm_until, fds_warm = time.monotonic(), sampler.fds()
            while (time.monotonic() - started < LOAD_SECS or waves < MIN_WAVES) and not tally.errors:
                wave(pool, c, tally, together=waves % 2 == 0)
                waves += 1
        elapsed = time.monotonic() - started
        sampler.stop.set()
        sampler.join()
        fds_end = sampler.fds()
        flat, rss_text = rss_verdict(sampler.samples, warm_until)
        left = [s.id for s in Sandbox.list(client=c)]
        ok = (not tally.errors and flat and not left and tally.created == tally.checked == tally.destroyed
              and fds_end <= fds_warm + FD_SLACK and d.process.poll() is None)  # fmt: skip
        detail = (f"{tally.created} created, {tally.checked} checked, {tally.destroyed} destroyed in {waves} waves of {WAVE}"
                  f" over {elapsed:.0f} s ({tally.created / elapsed:.1f}/s, {tally.create_percentiles()}); {tally.refused} admission refusals retried;"
                  f" {rss_text}; open fds {fds_warm} after warm-up, {fds_end} after; sandboxes left {len(left)};"
                  f" errors {len(tally.errors)}: {'; '.join(tally.errors[:5])}")  # fmt: skip
        print(f"\nload: {detail}")
        faults.injected(f"load: {tally.created} sandboxes from {THREADS} threads", ok, detail)
        faults.leaks(leaks_except(d, []))  # the census, and address leases
    finally:
        finish(d)
