"""Set up once, checkpoint memory, fork N workers that start warm and diverge.

    python3 fork_pattern.py 8
"""

import sys
import time

from sandfork import CheckpointType, Sandbox


def main(n: int) -> None:
    with Sandbox.create(image="busybox", memory_mb=256) as base:
        base.run("sh", ["-c", "mkdir -p /data && seq 1 100000 > /data/numbers"])  # the expensive setup
        snap = base.checkpoint(checkpoint_type=CheckpointType.MEMORY)
    print("snapshot", snap.id, snap.size_bytes, "bytes")

    start = time.monotonic()
    with snap.fork(n, per_child=[{"env": {"WORKER": str(i)}} for i in range(n)]) as workers:
        workers.raise_for_errors()
        print(f"{len(workers)} workers in {time.monotonic() - start:.2f}s")
        for w in workers:
            r = w.run("sh", ["-c", 'awk -v w="$WORKER" "NR % 8 == w" /data/numbers | wc -l'])
            print(w.id, r.stdout.strip())
    snap.delete()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 4)
