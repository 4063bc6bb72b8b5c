"""``python -m harbor_sandfork cleanup``: terminates the sandboxes and deletes the snapshots
this environment labelled (``harbor-sandfork``) that a killed Harbor process left behind."""

from __future__ import annotations

import argparse
import sys
from typing import List

from sandfork import Client, Sandbox, Snapshot
from sandfork import errors as sf_errors

from ._environment import LABEL


def cleanup(client: Client) -> List[str]:
    removed = []
    for info in Sandbox.list(client=client):
        if LABEL in (info.labels or {}):
            try:
                Sandbox.connect(info.id, client=client).terminate()
                removed.append(f"sandbox {info.id}")
            except sf_errors.SandboxError as e:
                print(f"could not terminate {info.id}: {e}", file=sys.stderr)
    for snap in Snapshot.list(client=client):
        if LABEL in (getattr(snap, "labels", None) or {}):
            try:
                snap.delete()
                removed.append(f"snapshot {snap.snapshot_id}")
            except sf_errors.SandboxError as e:
                print(f"could not delete {snap.snapshot_id}: {e}", file=sys.stderr)
    return removed


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m harbor_sandfork", description=__doc__)
    parser.add_argument("command", choices=["cleanup"])
    parser.add_argument("--url", help="the daemon (default: $SANDFORK_URL, else the default socket)")
    args = parser.parse_args(argv)
    for line in cleanup(Client(url=args.url) if args.url else Client()):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
