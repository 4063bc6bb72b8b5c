"""Checks of argument types and values, raising the SDK's typed errors."""

from __future__ import annotations

import warnings
from typing import Any, Dict, List, Mapping, Optional, Type, Union

from . import errors

UNSET: Any = object()
"""Marks an argument that was not given."""


def _kind(value: Any) -> str:
    return type(value).__name__


def check_str(name: str, value: Any, *, none_ok: bool = True) -> Optional[str]:
    if value is None and none_ok:
        return None
    if not isinstance(value, str):
        raise errors.ArgumentTypeError(f"{name} must be a string, got {_kind(value)} {value!r}")
    return value


def check_int(name: str, value: Any, *, none_ok: bool = True, minimum: Optional[int] = None) -> Optional[int]:
    if value is None and none_ok:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise errors.ArgumentTypeError(f"{name} must be an integer, got {_kind(value)} {value!r}")
    if minimum is not None and value < minimum:
        raise errors.ArgumentValueError(f"{name} must be at least {minimum}, got {value}")
    return int(value)


def check_number(name: str, value: Any, *, none_ok: bool = True) -> Optional[float]:
    if value is None and none_ok:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise errors.ArgumentTypeError(f"{name} must be a number, got {_kind(value)} {value!r}")
    return float(value)


def check_bool(name: str, value: Any, *, none_ok: bool = True) -> Optional[bool]:
    if value is None and none_ok:
        return None
    if not isinstance(value, bool):
        raise errors.ArgumentTypeError(f"{name} must be True or False, got {_kind(value)} {value!r}")
    return value


def check_str_list(name: str, value: Any, *, none_ok: bool = True) -> Optional[List[str]]:
    if value is None and none_ok:
        return None
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise errors.ArgumentTypeError(f"{name} must be a list of strings, got {_kind(value)} {value!r}")
    for item in value:
        if not isinstance(item, str):
            raise errors.ArgumentTypeError(f"{name} must be a list of strings; it holds {_kind(item)} {item!r}")
    return list(value)


def check_str_map(name: str, value: Any, *, none_ok: bool = True) -> Optional[Dict[str, str]]:
    if value is None and none_ok:
        return None
    if not isinstance(value, Mapping):
        raise errors.ArgumentTypeError(f"{name} must be a dict of strings, got {_kind(value)} {value!r}")
    for k, v in value.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise errors.ArgumentTypeError(f"{name} must map strings to strings; it holds {k!r}: {v!r}")
    return dict(value)


def check_bytes(name: str, value: Any) -> bytes:
    """Bytes, bytearray, memoryview, or text (encoded as UTF-8)."""
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise errors.ArgumentTypeError(f"{name} must be bytes (or str), got {_kind(value)}")


def check_enum(name: str, enum: Type[Any], value: Any) -> Any:
    """The member of ``enum`` for ``value`` (a member or its string value)."""
    try:
        return enum(getattr(value, "value", value))
    except ValueError:
        choices = ", ".join(repr(m.value) for m in enum)
        raise errors.ArgumentValueError(f"{name} must be one of {choices}, got {value!r}") from None


def egress_rules(name: str, value: Any) -> Optional[List[str]]:
    """An ``allow_out``/``deny_out`` list: IPv4 addresses, CIDRs, hostnames and wildcards
    (``*.example.com``). The daemon checks each entry and names what is wrong with it."""
    rules = check_str_list(name, value)
    if rules is None:
        return None
    for rule in rules:
        if not rule.strip():
            raise errors.ArgumentValueError(f"{name} entries must not be empty")
    return rules


def network_fields(allow_internet_access: Any, allow_out: Any, deny_out: Any) -> Dict[str, Any]:
    """The create/update request fields for Tensorlake's egress settings.

    ``allow_internet_access=False`` with a non-empty ``allow_out`` keeps only those
    destinations (as in Tensorlake, where ``allow_out`` means default-deny); with an
    empty ``allow_out`` there is no network at all (``deny_out`` then has nothing to do).
    """
    allow = check_bool("allow_internet_access", allow_internet_access, none_ok=False)
    allowed = egress_rules("allow_out", allow_out)
    denied = egress_rules("deny_out", deny_out)
    if allow or allowed:
        fields: Dict[str, Any] = {"allow_internet_access": True}
        if allowed is not None:
            fields["allow_out"] = allowed
        if denied is not None:
            fields["deny_out"] = denied
        return fields
    return {"allow_internet_access": False}


def process_selector(process: Any, pid: Any, *, stacklevel: int = 3) -> Union[int, str]:
    """Tensorlake's ``process`` argument (a pid or a managed-process name), with the
    deprecated ``pid=`` keyword."""
    if pid is not UNSET:
        if process is not UNSET:
            raise TypeError("give `process` or the deprecated `pid`, not both")
        warnings.warn("`pid` is deprecated; use `process` (accepts a PID or a managed-process name)", DeprecationWarning, stacklevel=stacklevel)
        process = pid
    if process is UNSET:
        raise TypeError("missing required argument: `process`")
    pid_attr = getattr(process, "pid", None)
    if pid_attr is not None and not isinstance(process, (int, str)):
        return int(pid_attr)
    if isinstance(process, bool) or not isinstance(process, (int, str)):
        raise errors.ArgumentTypeError(f"process must be a pid (int) or a managed-process name (str), got {_kind(process)} {process!r}")
    if isinstance(process, str) and not process:
        raise errors.ArgumentValueError("process must not be empty")
    return process


def process_name(name: Any) -> Optional[str]:
    """A managed process name: non-empty, no ``/``, not all digits (those address pids)."""
    if name is None:
        return None
    check_str("name", name)
    if not name:
        raise errors.ArgumentValueError("managed process name must not be empty")
    if "/" in name:
        raise errors.ArgumentValueError(f"managed process name must not contain '/': {name!r}")
    if name.isdigit():
        raise errors.ArgumentValueError(f"managed process name must not be all digits; numeric strings are reserved for PID addressing: {name!r}")
    return name


def user_string(user: Any) -> Optional[str]:
    """A process user as the daemon takes it: ``name``, ``uid`` or ``uid:gid``."""
    from .models import ProcessUserSpec

    if user is None or isinstance(user, str):
        return user
    if isinstance(user, Mapping):
        try:
            user = ProcessUserSpec(**dict(user))
        except TypeError as e:
            raise errors.ArgumentValueError(f"invalid process user config: {e}") from None
    if not isinstance(user, ProcessUserSpec):
        raise errors.ArgumentTypeError(f"user must be a name, 'uid:gid', a ProcessUserSpec or a dict, got {_kind(user)}")
    if (user.name is None) == (user.uid is None):
        raise errors.ArgumentValueError("invalid process user config: give exactly one of name and uid")
    if user.name is not None:
        if user.gid is not None:
            raise errors.ArgumentValueError("invalid process user config: a gid goes with a uid in sandfork, not with a name")
        return user.name
    uid = int(user.uid or 0)
    return f"{uid}:{int(user.gid)}" if user.gid is not None else str(uid)


def drop_none(**fields: Any) -> Dict[str, Any]:
    return {k: v for k, v in fields.items() if v is not None}


def identifier_of(identifier: Any, sandbox_id: Any, who: str) -> str:
    """Resolves Tensorlake's ``identifier`` / deprecated ``sandbox_id`` pair."""
    if identifier is not None and sandbox_id is not None and identifier != sandbox_id:
        raise errors.SandboxError("Provide only one of `identifier` or `sandbox_id`, not both.")
    chosen = identifier if identifier is not None else sandbox_id
    if chosen is None:
        raise errors.SandboxError(f"`identifier` is required{who}. `sandbox_id` is accepted as a deprecated alias.")
    check_str("sandbox id", chosen, none_ok=False)
    if not chosen:
        raise errors.ArgumentValueError("the sandbox id or name must not be empty")
    return chosen
