"""Methods callable on an instance or on the class with a name or id first."""

from __future__ import annotations

import functools
from typing import Any, Callable


class hybridmethod:  # noqa: N801 (used as a decorator, like classmethod)
    """A method callable on an instance (``snap.delete()``) or on the class with an id or
    name as first argument (``Snapshot.delete(snapshot_id)``, ``Image.delete("app")``)."""

    def __init__(self, func: Callable[..., Any]):
        self.func = func
        functools.update_wrapper(self, func)  # type: ignore[arg-type]

    def __get__(self, obj: Any, owner: type) -> Callable[..., Any]:
        return functools.partial(self.func, obj if obj is not None else owner)
