#!/usr/bin/env python3
"""A Debian 13 tool root to run Harbor in, on a host whose Python is older than Harbor's.

Harbor needs Python >= 3.12. This script makes (once, cached) a ``debootstrap trixie``
root under ``$HARBOR_SANDFORK_ROOT`` (default /var/cache/sandfork/harbor/root) with
python3 and a venv at /opt/harbor-venv holding the pins of requirements.txt (next to
this file), this repository's SDK and the ``harbor_sandfork`` package (both editable,
from the repository bind-mounted at its own path). Then it runs commands in that root:

    python3 integrations/harbor_sandfork/harbor_root.py ensure
    python3 integrations/harbor_sandfork/harbor_root.py run [--bind DIR]... -- harbor run ...

Every command runs in a mount namespace of its own (``unshare --mount``, private
propagation) where /proc, /dev, the repository, the binds and the daemon's Unix socket
are mounted, then chroot: the mounts exist only in that namespace and vanish with its
last process, however it ends; the host's mount table never holds them. The root shares
the host's network namespace, so a daemon on loopback TCP is reached as it is.

Only ``ensure`` needs the network (Debian's mirror, as configured in the host's apt
sources, and the Python package index, as pip is configured); ``run`` needs neither.
Standard library only; runs on the host's Python (3.9+), as root.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Dict, Iterator, List, Mapping, Optional, Sequence

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
CACHE = Path(os.environ.get("SANDFORK_CACHE") or "/var/cache/sandfork")
ROOT = Path(os.environ.get("HARBOR_SANDFORK_ROOT") or CACHE / "harbor" / "root")
# Downloaded .debs, kept so that rebuilding the root fetches nothing again.
DEB_CACHE = CACHE / "debootstrap" / "trixie-debs"
SUITE = "trixie"
PACKAGES = ["python3", "python3-venv", "ca-certificates", "tar", "gzip"]
VENV = "/opt/harbor-venv"
REQUIREMENTS = HERE / "requirements.txt"
EDITABLE = [REPO / "sdk" / "python", HERE]
# What the venv's install depends on: a change to any of these reinstalls it.
STAMPED = [REQUIREMENTS, REPO / "sdk" / "python" / "pyproject.toml", HERE / "pyproject.toml"]
STAMP = "opt/harbor-venv/.sandfork-stamp"
HOST_CA = "/etc/ssl/certs/host-ca-bundle.crt"
INSTALL_TIMEOUT = 1800
# The environment a command in the root starts from (plus what the caller passes).
BASE_ENV = {
    "PATH": f"{VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/root",
    "LANG": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
    # Harbor sends usage events and LiteLLM fetches a price list at import: neither here.
    "HARBOR_TELEMETRY": "0",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
}
# Variables passed through from the caller when set.
PASSED_ENV = ("SANDFORK_URL", "SANDFORK_TOKEN", "SANDFORK_CA", "TERM", "HARBOR_SANDFORK_BASE_IMAGES")


class RootError(RuntimeError):
    """The tool root could not be made or a command could not be started in it."""


def log(message: str) -> None:
    print(f"== harbor root: {message}", file=sys.stderr, flush=True)


# --- making the root --------------------------------------------------------------------


def debian_mirror() -> str:
    """The Debian mirror the host's apt uses (its first ``.../debian`` URI)."""
    sources = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for path in sources:
        try:
            text = path.read_text()
        except OSError:
            continue
        for word in text.split():
            if word.startswith("http") and word.rstrip("/").endswith("/debian"):
                return word
    raise RootError("no Debian mirror is configured in /etc/apt/sources.list or sources.list.d")


def _run(cmd: Sequence[str], what: str, timeout: float = INSTALL_TIMEOUT) -> None:
    log(f"{what}: {' '.join(cmd)}")
    done = subprocess.run(list(cmd), timeout=timeout)
    if done.returncode != 0:
        raise RootError(f"{what} failed (exit {done.returncode}): {' '.join(cmd)}")


@contextmanager
def _locked() -> Iterator[None]:
    """Serializes makers of the root (two test sessions, a test and the bench)."""
    ROOT.parent.mkdir(parents=True, exist_ok=True)
    with open(ROOT.parent / ".root.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _bootstrap() -> None:
    """debootstrap trixie into a fresh directory, renamed to ROOT once complete."""
    partial = ROOT.with_name(ROOT.name + ".partial")
    if partial.exists():
        shutil.rmtree(partial)
    DEB_CACHE.mkdir(parents=True, exist_ok=True)
    _run(
        ["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", f"--cache-dir={DEB_CACHE}", SUITE, str(partial), debian_mirror()],
        "debootstrap",
    )
    partial.rename(ROOT)


def _stamp() -> str:
    """What the venv was made from: the pinned files, and the checkout its editable
    packages point at (a root made for another checkout installs them again)."""
    digest = hashlib.sha256(str(REPO.resolve()).encode() + b"\0")
    for path in STAMPED:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _install_venv() -> None:
    # Name resolution and the trusted certificate authorities for pip: the host's (a host
    # behind a TLS-inspecting proxy trusts its CA, the fresh root does not).
    shutil.copyfile("/etc/resolv.conf", ROOT / "etc" / "resolv.conf")
    pip_env = {k: v for k, v in os.environ.items() if k in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_DEFAULT_TIMEOUT", "PIP_NO_CACHE_DIR")}
    host_ca = Path(os.environ.get("PIP_CERT") or "/etc/ssl/certs/ca-certificates.crt")
    if host_ca.is_file():
        shutil.copyfile(host_ca, ROOT / HOST_CA.lstrip("/"))
        pip_env["PIP_CERT"] = HOST_CA
    venv_python = f"{VENV}/bin/python"
    if not (ROOT / VENV.lstrip("/") / "bin" / "python").exists():
        _run(run_command(["python3", "-m", "venv", VENV]), "a venv")
    pip = [venv_python, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    _run(run_command(pip + ["-r", str(REQUIREMENTS)], env=pip_env), "Harbor")
    editables: List[str] = []
    for path in EDITABLE:
        editables += ["-e", str(path)]
    _run(run_command(pip + editables, env=pip_env), "the SDK and harbor_sandfork")
    (ROOT / STAMP).write_text(_stamp())


def ready() -> bool:
    stamp = ROOT / STAMP
    return stamp.is_file() and stamp.read_text() == _stamp()


def ensure() -> Dict[str, float]:
    """Makes the root and its venv when missing or stale; returns the seconds each step
    took (empty when everything was there)."""
    took: Dict[str, float] = {}
    if ready():
        return took
    with _locked():
        if not (ROOT / "usr" / "bin" / "python3").exists():
            started = time.monotonic()
            _bootstrap()
            took["debootstrap"] = time.monotonic() - started
        if not ready():
            started = time.monotonic()
            _install_venv()
            took["pip"] = time.monotonic() - started
    return took


# --- running in the root ----------------------------------------------------------------


def _socket_of(url: Optional[str]) -> Optional[Path]:
    """The Unix socket a ``SANDFORK_URL`` names (``unix:///path`` or a bare path)."""
    if not url:
        return Path("/var/lib/sandfork/sandfork.sock") if Path("/var/lib/sandfork/sandfork.sock").exists() else None
    if url.startswith("unix://"):
        return Path(url[len("unix://") :])
    if url.startswith("/"):
        return Path(url)
    return None


def run_command(
    argv: Sequence[str],
    *,
    binds: Sequence[Path] = (),
    env: Optional[Mapping[str, str]] = None,
    cwd: Optional[Path] = None,
    offline: bool = False,
) -> List[str]:
    """The command line that runs ``argv`` in the root (see the module's docstring).
    ``offline``: also in a network namespace of its own with loopback alone, so nothing it
    runs reaches beyond this machine (the daemon then through its Unix socket)."""
    full_env = dict(BASE_ENV)
    for name in PASSED_ENV:
        if os.environ.get(name):
            full_env[name] = os.environ[name]
    full_env.update(env or {})
    sock = _socket_of(full_env.get("SANDFORK_URL"))
    spec = {
        "root": str(ROOT),
        "argv": list(argv),
        "env": full_env,
        "cwd": str(cwd or REPO),
        "binds": [str(Path(b).resolve()) for b in [REPO, *binds]],
        "socket": str(sock) if sock is not None and sock.exists() else None,
        "offline": offline,
        # The inner side checks that it is in another mount namespace before mounting.
        "outer_namespace": os.readlink("/proc/self/ns/mnt"),
    }
    if offline and spec["socket"] is None:
        raise RootError(f"offline runs reach the daemon through its Unix socket, and SANDFORK_URL={full_env.get('SANDFORK_URL')!r} names none that exists")
    namespaces = ["--mount", "--net"] if offline else ["--mount"]
    return ["unshare", *namespaces, "--propagation", "private", "--", sys.executable, str(Path(__file__).resolve()), "_inner", json.dumps(spec)]


def run(
    argv: Sequence[str],
    *,
    binds: Sequence[Path] = (),
    env: Optional[Mapping[str, str]] = None,
    cwd: Optional[Path] = None,
    offline: bool = False,
    **kwargs: object,
) -> "subprocess.CompletedProcess[str]":
    """Runs ``argv`` in the root (``ensure`` first); ``kwargs`` go to ``subprocess.run``."""
    ensure()
    return subprocess.run(run_command(argv, binds=binds, env=env, cwd=cwd, offline=offline), **kwargs)  # type: ignore[call-overload,no-any-return]


def _mount(*args: str) -> None:
    done = subprocess.run(["mount", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RootError(f"mount {' '.join(args)} failed: {done.stderr.strip()}")


def _mountpoint(path: Path, like: Path) -> None:
    if like.is_dir():
        path.mkdir(parents=True, exist_ok=True)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            path.touch()


def _inner(spec: Dict[str, object]) -> None:
    """In the new mount namespace: mount, chroot, exec (never returns)."""
    root = Path(str(spec["root"]))
    if os.readlink("/proc/self/ns/mnt") == spec["outer_namespace"]:
        raise RootError("refusing to mount outside a private mount namespace")
    if spec.get("offline"):
        # A new network namespace starts with its loopback down.
        done = subprocess.run(["ip", "link", "set", "lo", "up"], capture_output=True, text=True)
        if done.returncode != 0:
            raise RootError(f"cannot bring up loopback in the new network namespace: {done.stderr.strip()}")
    _mount("-t", "proc", "proc", str(root / "proc"))
    _mount("--rbind", "/dev", str(root / "dev"))
    for bind in spec["binds"]:  # type: ignore[attr-defined]
        source = Path(bind)
        target = root / source.relative_to("/")
        _mountpoint(target, source)
        _mount("--bind", str(source), str(target))
    if spec.get("socket"):
        source = Path(str(spec["socket"]))
        target = root / source.relative_to("/")
        _mountpoint(target, source)
        _mount("--bind", str(source), str(target))
    os.chroot(root)
    os.chdir(str(spec["cwd"]))
    argv = [str(a) for a in spec["argv"]]  # type: ignore[attr-defined]
    env = {str(k): str(v) for k, v in spec["env"].items()}  # type: ignore[attr-defined]
    try:
        os.execvpe(argv[0], argv, env)
    except OSError as e:
        raise RootError(f"cannot run {argv[0]} in the root: {e}") from e


def main(argv: List[str]) -> int:
    if argv[:1] == ["_inner"]:
        try:
            _inner(json.loads(argv[1]))
        except RootError as e:
            print(f"harbor root: {e}", file=sys.stderr)
            return 125
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("ensure", help="make the root and its venv (cached)")
    sub.add_parser("path", help="print the root's path")
    runner = sub.add_parser("run", help="run a command in the root")
    runner.add_argument("--bind", action="append", default=[], type=Path, help="a host directory mounted at its own path (repeatable)")
    runner.add_argument("--cwd", type=Path, default=None)
    runner.add_argument("--offline", action="store_true", help="in a network namespace with loopback alone (the daemon through its Unix socket)")
    runner.add_argument("argv", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    try:
        if args.command == "ensure":
            took = ensure()
            log(", ".join(f"{k} {v:.1f}s" for k, v in took.items()) or "ready (cached)")
            return 0
        if args.command == "path":
            print(ROOT)
            return 0
        command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
        if not command:
            parser.error("run needs a command")
        return run(command, binds=args.bind, cwd=args.cwd, offline=args.offline).returncode
    except RootError as e:
        print(f"harbor root: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
