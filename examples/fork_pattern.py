#!/usr/bin/env python3
"""The fork pattern: do the expensive setup once, checkpoint memory, fork N warm workers.

Run with the daemon up: python3 examples/fork_pattern.py [--workers N] [--image python]
"""
import argparse
import contextlib
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from sandfork import CheckpointType, Sandbox

# The shared setup: a long-running worker builds its data once, keeps it in memory and
# answers queries (a Python expression over `data`) on a loopback socket.
WORKER = r"""
import socket, sys
data = [(i * 7919) % 10007 for i in range(int(sys.argv[1]))]   # the "expensive" setup
srv = socket.create_server(("127.0.0.1", 7000))
print("ready", flush=True)
while True:
    conn, _ = srv.accept()
    conn.sendall(repr(eval(conn.recv(4096).decode(), {"data": data})).encode())
    conn.close()
"""
# A client run inside each fork: sends one candidate to the warm worker, prints the answer.
ASK = "import socket,sys; s=socket.create_connection(('127.0.0.1',7000)); s.sendall(sys.argv[1].encode()); print(s.recv(4096).decode())"
CANDIDATES = ["sum(data)", "max(data)", "len(set(data))", "sorted(data)[len(data)//2]",
              "sum(x % 2 for x in data)", "min(data)", "data[-1]", "sum(data) // len(data)"]


def wait_ready(proc, timeout=120.0):
    """Blocks until the worker printed "ready" (its output is buffered by the sandbox)."""
    deadline, seen, stream = time.monotonic() + timeout, "", proc.output(follow=True)
    with contextlib.closing(stream):
        for event in stream:
            seen += event.data
            if "ready" in seen or time.monotonic() > deadline:
                break
    if "ready" not in seen:
        raise RuntimeError(f"the worker did not get ready: {seen[-500:]!r}")


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--image", default="python", help="an image with python3")
    ap.add_argument("-n", "--workers", type=int, default=4)
    ap.add_argument("--size", type=int, default=2_000_000, help="items the worker holds in memory")
    args = ap.parse_args()
    t, snap, forks = time.monotonic(), None, []
    base = Sandbox.create(image=args.image, memory_mb=512)              # 1. a base sandbox
    try:
        wait_ready(base.start_process("python3", ["-c", WORKER, str(args.size)]))   # 2. setup once
        t_setup = time.monotonic()
        snap = base.checkpoint(checkpoint_type=CheckpointType.MEMORY)  # 3. disk + memory + processes
        base.terminate()
        t_snap = time.monotonic()
        forks = snap.fork(args.workers)                                 # 4. N independent warm copies
        forks.raise_for_errors()
        t_fork = time.monotonic()
        cands = (CANDIDATES * args.workers)[: args.workers]
        with ThreadPoolExecutor(args.workers) as pool:                  # 5. one candidate per fork
            results = list(pool.map(lambda wc: wc[0].run("python3", ["-c", ASK, wc[1]]), zip(forks, cands)))
        t_run = time.monotonic()
        for cand, r in zip(cands, results):
            if r.exit_code != 0:
                raise RuntimeError(f"{cand} failed: {r.stderr}")
            print(f"result {cand} = {r.stdout.strip()}")
        print(f"timings: setup {t_setup - t:.2f}s, checkpoint {t_snap - t_setup:.2f}s, "
              f"fork {args.workers} {t_fork - t_snap:.2f}s, run {t_run - t_fork:.2f}s")
    finally:                                                            # 6. clean up, even on failure
        for sb in [base, *forks]:
            with contextlib.suppress(Exception):
                sb.terminate()
        if snap is not None:
            snap.delete()
    print("fork_pattern ok")


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # noqa: BLE001 - report any failure and exit non-zero
        print(f"fork_pattern failed: {e}", file=sys.stderr)
        sys.exit(1)
