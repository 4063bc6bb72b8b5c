"""Fixtures of the docs suite: one real daemon for the session, with its own data dir, the
``python`` image it serves by default, and the state of the page whose blocks run.

The daemon reaches nothing beyond this machine: its registry client goes through a proxy
on a closed local port and its sandboxes' DNS questions go to a closed local port, so a
pull, a build step or a lookup fails at once instead of leaving the machine; the blocks'
own processes get the same proxy.

The ``python`` image (the daemon's default) is built from Debian's package mirror, which
the blocks' daemon never asks. It comes from an OCI layout of the daemon's own build,
cached at ``${SANDFORK_CACHE:-/var/cache/sandfork}/images/python-oci``
(``SANDFORK_DOCS_PYTHON_OCI`` names another), and is imported into the test daemon. When
the cache is empty, a daemon of its own (as the SDK suite's: its image builds reach
Debian's mirror, nothing else) builds the image once and exports it there.

Between pages the daemon is brought back to where it started: every sandbox terminated,
every snapshot, volume and image but ``python`` deleted, the page's work directory
removed. At the end the daemon gets SIGTERM and the session fails if it left a
container, mount or loop device behind, or if cleaning up after a page failed.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Set

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path[:0] = [str(REPO / "sdk" / "python" / "src"), str(REPO / "sdk" / "python" / "tests"), str(HERE)]

from _blocks import Block, all_blocks  # noqa: E402
from _daemon import Daemon, daemon_binary, implements_serve, start_daemon, tear_down, terminate_leftovers, wait_healthy  # noqa: E402
from _runners import Log, Outcome, PythonRunner, ShellRunner, TypeScriptRunner, TypeScriptSdk  # noqa: E402

CACHE = Path(os.environ.get("SANDFORK_CACHE") or "/var/cache/sandfork")
PYTHON_OCI = Path(os.environ.get("SANDFORK_DOCS_PYTHON_OCI") or CACHE / "images" / "python-oci")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def closed_proxy_env(no_proxy: str) -> Dict[str, str]:
    closed = f"http://127.0.0.1:{free_port()}"
    env = {k: closed for k in ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy", "ALL_PROXY", "all_proxy")}
    env.update(NO_PROXY=no_proxy, no_proxy=no_proxy)
    return env


@dataclass
class DocsDaemon:
    daemon: Daemon
    bin_dir: Path  # holds `sandfork`, first on the blocks' PATH
    python_missing: Optional[str]  # why the python image is not there, or None
    problems: List[str] = field(default_factory=list)


@pytest.fixture(scope="session")
def docs_daemon() -> Iterator[DocsDaemon]:
    if os.geteuid() != 0:
        pytest.skip("needs root (runc, loop devices, CRIU), as the blocks' daemon does")
    binary = daemon_binary()
    if binary is None or not implements_serve(binary, "--config", "--default-image"):
        pytest.skip("the sandfork daemon is not built (make build, or set SANDFORK_BIN)")
    root = Path(tempfile.mkdtemp(prefix="sfdocs-"))
    (root / "config.toml").write_text(f'dns_upstreams = ["127.0.0.1:{free_port()}"]\n')
    bin_dir = root / "bin"
    bin_dir.mkdir()
    (bin_dir / "sandfork").symlink_to(binary)
    d = start_daemon(binary, ["--config", str(root / "config.toml")], root=root, default_image=None, env=closed_proxy_env(""))
    docs = DocsDaemon(d, bin_dir, None)
    try:
        wait_healthy(d)
        docs.python_missing = import_python_image(d, binary)
        yield docs
    finally:
        problems = docs.problems + [f"sandbox left running: {i}" for i in terminate_leftovers(d)]
        problems += tear_down(d)
        assert not problems, "after the docs blocks:\n" + "\n".join(problems)


def cache_python_image(binary: Path) -> None:
    """Builds the python image in a daemon of its own and exports it to ``PYTHON_OCI``."""
    from sandfork import Client, Image, Sandbox

    root = Path(tempfile.mkdtemp(prefix="sfdocs-build-"))
    d = start_daemon(binary, [], root=root)
    try:
        wait_healthy(d)
        client = Client(url=d.url)
        Sandbox.create(image="python", memory_mb=128, client=client).terminate()
        partial = PYTHON_OCI.with_name(PYTHON_OCI.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.parent.mkdir(parents=True, exist_ok=True)
        tarball = root / "python.oci.tar"
        Image.get("python", client=client).export(tarball, format="oci-archive")
        partial.mkdir()
        subprocess.run(["tar", "-xf", str(tarball), "-C", str(partial)], check=True)
        partial.rename(PYTHON_OCI)
    finally:
        problems = tear_down(d)
        assert not problems, "building the python image left behind:\n" + "\n".join(problems)


def import_python_image(d: Daemon, binary: Path) -> Optional[str]:
    """Imports the cached python image (made first if missing); returns why it could not,
    or None."""
    from sandfork import Client, Image

    if not (PYTHON_OCI / "index.json").is_file():
        try:
            cache_python_image(binary)
        except Exception as e:  # the reason goes to every block's skip
            return f"the blocks run on the daemon's default image, python, and building it for {PYTHON_OCI} failed: {e}"
    Image.import_(PYTHON_OCI, "python", client=Client(url=d.url))
    return None


class Pages:
    """Runs blocks page by page, each page's blocks in order with the page's state."""

    def __init__(self, docs: DocsDaemon, blocks: List[Block], root: Path) -> None:
        self.docs, self.blocks, self.root = docs, blocks, root
        self.page: Optional[str] = None
        self.runners: Dict[str, object] = {}
        self.outcomes: Dict[str, Outcome] = {}
        self.failed: Dict[str, Block] = {}  # runner kind → its block that failed
        self.ts_sdk: Optional[TypeScriptSdk] = None
        self.ts_missing: Optional[str] = None  # why TypeScript blocks cannot run here (a skip)
        self.ts_broken: Optional[str] = None  # why the SDK would not compile (a failure)

    def env(self) -> Dict[str, str]:
        d = self.docs.daemon
        env = {k: v for k, v in os.environ.items() if not k.startswith("SANDFORK_") and k not in ("PYTHONPATH",)}
        env.update(closed_proxy_env("localhost,127.0.0.1,::1"))
        env.update(
            SANDFORK_URL=d.url,
            PYTHONPATH=str(REPO / "sdk" / "python" / "src"),
            PATH=f"{self.docs.bin_dir}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
        )
        return env

    def _open(self, page: str) -> None:
        self.page = page
        self.work = Path(tempfile.mkdtemp(prefix=Path(page).stem + "-", dir=self.root))
        self.log = Log(self.work / ".output.log")
        self.failed = {}
        sock = str(self.docs.daemon.socket)
        self.runners = {
            "python": PythonRunner(self.env(), self.work, self.log, sock),
            "shell": ShellRunner(self.env(), self.work, self.log, sock),
        }

    def close_page(self) -> None:
        if self.page is None:
            return
        for runner in self.runners.values():
            runner.close()
        self.docs.problems += [f"after {self.page}: {p}" for p in reset_daemon(self.docs.daemon)]
        shutil.rmtree(self.work, ignore_errors=True)
        self.page = None

    def typescript(self) -> object:
        if "ts" not in self.runners:
            if self.ts_sdk is None:
                self.ts_sdk = TypeScriptSdk(Path(tempfile.mkdtemp(prefix="ts-", dir=self.root)))
                self.ts_missing = self.ts_sdk.missing()
                if self.ts_missing is None:
                    self.ts_broken = self.ts_sdk.build()
            blocks = [b for b in self.blocks if b.page == self.page and b.runner == "ts" and b.directive != "skip"]
            self.runners["ts"] = TypeScriptRunner(self.ts_sdk, self.env(), self.log, str(self.docs.daemon.socket), blocks)
        return self.runners["ts"]

    def run(self, block: Block) -> Outcome:
        if self.docs.python_missing:
            pytest.skip(self.docs.python_missing)
        if block.page != self.page:
            self.close_page()
            self._open(block.page)
        kind = block.runner
        runner = self.typescript() if kind == "ts" else self.runners[kind]
        if kind == "ts" and self.ts_missing:
            pytest.skip(self.ts_missing)
        if kind == "ts" and self.ts_broken:
            pytest.fail(self.ts_broken, pytrace=False)
        # The page's earlier blocks of this kind first, when they were not selected.
        for earlier in self.blocks:
            if earlier.page == block.page and earlier.line < block.line and earlier.runner == kind:
                if earlier.directive is None and earlier.id not in self.outcomes:
                    self._record(earlier, runner.run(earlier))
        if kind in self.failed and kind != "ts":  # the TypeScript runner knows what it ran
            pytest.skip(f"not run: the block at line {self.failed[kind].line} of this page, before it, failed")
        outcome = self._record(block, runner.run(block))
        if outcome.not_run:
            pytest.skip(outcome.not_run)
        return outcome

    def _record(self, block: Block, outcome: Outcome) -> Outcome:
        self.outcomes[block.id] = outcome
        if not outcome.ok and not outcome.not_run and block.directive != "xfail" and block.runner not in self.failed:
            self.failed[block.runner] = block
        return outcome


def reset_daemon(d: Daemon) -> List[str]:
    """Terminates every sandbox and deletes every snapshot, volume and image but python;
    returns what could not be removed."""
    from sandfork import Client, Image, Sandbox, SandforkError, Snapshot, Volume

    client = Client(url=d.url)
    problems = []
    terminate_leftovers(d)
    for kind, items, delete in (
        ("snapshot", lambda: Snapshot.list(client=client), lambda s: Snapshot.delete_by_id(s.id, client=client)),
        ("volume", lambda: Volume.list(client=client), lambda v: v.delete()),
        ("image", lambda: [i for i in Image.list(client=client) if i.name != "python"], lambda i: i.delete()),
    ):
        try:
            for item in items():
                try:
                    delete(item)
                except SandforkError as e:
                    problems.append(f"could not delete {kind} {item}: {e}")
        except SandforkError as e:
            problems.append(f"could not list the {kind}s: {e}")
    live: Set[str] = {s.id for s in Sandbox.list(client=client) if s.status not in ("terminated", "failed")}
    problems += [f"sandbox still live: {i}" for i in sorted(live)]
    return problems


@pytest.fixture(scope="session")
def docs(docs_daemon: DocsDaemon) -> Iterator[Pages]:
    pages = Pages(docs_daemon, all_blocks(REPO), docs_daemon.daemon.root)
    try:
        yield pages
    finally:
        pages.close_page()
        if pages.ts_sdk is not None:
            shutil.rmtree(pages.ts_sdk.root, ignore_errors=True)
