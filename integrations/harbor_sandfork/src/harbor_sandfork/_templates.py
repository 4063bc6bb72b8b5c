"""What the ``fork`` option shares between the trials of one Harbor process: per task (its
image, resources, network, startup env), an ``asyncio`` lock and the memory snapshot the
first trial took. Snapshots live until the process exits (``atexit``), or until
:func:`delete_snapshots` is called; a process killed before that leaves them labelled
``harbor-sandfork=template`` (``python -m harbor_sandfork cleanup`` deletes them)."""

from __future__ import annotations

import asyncio
import atexit
import logging
import threading
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from sandfork import Client, Snapshot
from sandfork import errors as sf_errors

log = logging.getLogger(__name__)


@dataclass
class Template:
    """One task's warm checkpoint (``snapshot_id`` is None until the first trial took it)."""

    key: str
    client: Client
    snapshot_id: Optional[str] = None
    forks: int = 0
    _locks: Dict[int, asyncio.Lock] = field(default_factory=dict)

    def lock(self) -> asyncio.Lock:
        """The lock of this template in the running event loop (a process may run
        several jobs one after another, each in a loop of its own)."""
        loop = asyncio.get_running_loop()
        with _guard:
            lock = self._locks.get(id(loop))
            if lock is None:
                lock = self._locks[id(loop)] = asyncio.Lock()
            return lock


_guard = threading.Lock()
_templates: Dict[str, Template] = {}
_locks: Dict[Tuple[int, str], asyncio.Lock] = {}


def template(key: str, client: Client) -> Template:
    with _guard:
        found = _templates.get(key)
        if found is None:
            found = _templates[key] = Template(key, client)
        return found


def named_lock(name: str) -> asyncio.Lock:
    """A lock for ``name`` in the running loop (image builds: one build per image)."""
    loop = asyncio.get_running_loop()
    with _guard:
        lock = _locks.get((id(loop), name))
        if lock is None:
            lock = _locks[(id(loop), name)] = asyncio.Lock()
        return lock


def snapshots() -> List[str]:
    """The snapshots the templates of this process hold."""
    with _guard:
        return [t.snapshot_id for t in _templates.values() if t.snapshot_id]


def delete_snapshots() -> List[str]:
    """Deletes every template snapshot of this process (trials started afterwards take a
    new one); returns their ids. Sandboxes restored from them keep running."""
    with _guard:
        held = [(t.client, t.snapshot_id) for t in _templates.values() if t.snapshot_id]
        for t in _templates.values():
            t.snapshot_id = None
    # One after another: this runs at exit too, when no thread may be started.
    done = [_delete(client, snapshot_id) for client, snapshot_id in held]
    return [snapshot_id for snapshot_id in done if snapshot_id]


def _delete(client: Client, snapshot_id: Optional[str]) -> Optional[str]:
    assert snapshot_id is not None
    try:
        Snapshot.get(snapshot_id, client=client).delete()
        return snapshot_id
    except sf_errors.NotFoundError:
        return None
    except sf_errors.SandboxError as e:
        log.warning("could not delete the sandfork snapshot %s: %s (`sandfork snapshot rm %s`)", snapshot_id, e, snapshot_id)
        return None


atexit.register(delete_snapshots)
