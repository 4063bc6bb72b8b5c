#!/usr/bin/env python3
"""A named, long-lived sandbox suspended and resumed with its state.

The sandbox runs a process whose state lives only in memory (a random secret drawn at start
and a tick counter) and keeps a notes file on its disk. Each cycle suspends it (memory
checkpoint, then stop: it uses no CPU or RAM), reconnects to it by name, resumes it and
checks that the same process is still running with the same secret, that its counter went
on from where it stopped instead of restarting, and that the files are intact.

Run with the daemon up: python3 examples/suspend_resume.py [--cycles N] [--image busybox]
"""
import argparse
import contextlib
import os
import sys
import time

from sandfork import Sandbox

# In-memory state: the secret exists nowhere but in this shell's variables.
HOLDER = ('secret=$(head -c 8 /dev/urandom | od -An -tx1 | tr -d " \\n"); n=0; '
          'while :; do n=$((n+1)); echo "tick $n secret $secret"; sleep 0.2; done')


def ticks(proc):
    """The (counter, secret) pairs the process printed so far."""
    stream = proc.output(follow=False)
    with contextlib.closing(stream):
        text = "".join(e.data for e in stream if e.stream == "stdout")
    pairs = [line.split() for line in text.splitlines() if line.startswith("tick ")]
    return [(int(p[1]), p[3]) for p in pairs if len(p) == 4]


def check_continuous(history):
    """One secret throughout, and the counter never restarted or skipped."""
    secrets = {secret for _, secret in history}
    counts = [n for n, _ in history]
    if len(secrets) != 1:
        raise AssertionError(f"the in-memory secret changed: {sorted(secrets)}")
    if counts != list(range(1, len(counts) + 1)):
        raise AssertionError(f"the counter restarted or skipped: {counts}")


def cycle(name, pid, i, pause):
    """Suspends the sandbox, reconnects by name, resumes, checks memory and files."""
    sb = Sandbox.connect(name)
    before = ticks(sb.get_process(pid))[-1]
    t = time.monotonic()
    sb.suspend()
    t_suspend = time.monotonic() - t
    print(f"cycle {i}: suspended at tick {before[0]} in {t_suspend:.2f}s; status {sb.status.value}")
    time.sleep(pause)
    sb = Sandbox.connect(name)                      # a fresh handle, found by name
    t = time.monotonic()
    sb.resume()
    t_resume = time.monotonic() - t
    time.sleep(0.5)
    proc = sb.get_process(pid)
    history = ticks(proc)
    if not proc.is_running():
        raise AssertionError(f"process {pid} did not survive: {proc.status}")
    check_continuous(history)
    if history[-1][0] <= before[0]:
        raise AssertionError(f"the counter did not move on after resume ({history[-1][0]} <= {before[0]})")
    notes = sb.read_file("/data/notes.txt").decode()
    if notes.count("\n") != i:
        raise AssertionError(f"the notes file lost lines: {notes!r}")
    sb.write_file("/data/notes.txt", notes + f"cycle {i + 1}\n")
    print(f"cycle {i}: resumed in {t_resume:.2f}s; status {sb.status.value}; same process {pid}, "
          f"secret {history[-1][1]}, tick {before[0]} -> {history[-1][0]}; notes file has {i} line(s)")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--image", default="busybox")
    ap.add_argument("-c", "--cycles", type=int, default=3)
    ap.add_argument("--pause", type=float, default=1.0, help="seconds to stay suspended per cycle")
    ap.add_argument("--name", default=f"example-suspend-{os.getpid()}")
    args = ap.parse_args()
    sb = Sandbox.create(image=args.image, name=args.name, memory_mb=128)
    try:
        print(f"sandbox {sb.id} named {args.name}")
        sb.mkdir("/data")
        sb.write_file("/data/notes.txt", "cycle 1\n")
        pid = sb.start_process("sh", ["-c", HOLDER]).pid
        time.sleep(1.0)
        for i in range(1, args.cycles + 1):
            cycle(args.name, pid, i, args.pause)
    finally:
        sb.terminate()
    print(f"terminated {args.name}")
    print("suspend_resume ok")


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # noqa: BLE001 - report any failure and exit non-zero
        print(f"suspend_resume failed: {e}", file=sys.stderr)
        sys.exit(1)
