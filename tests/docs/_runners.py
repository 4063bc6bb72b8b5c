"""What runs the blocks of one page: one Python interpreter (one namespace for all the
page's Python blocks), one shell state (variables and working directory carried from one
block to the next), and one TypeScript program (the page's TypeScript blocks in order)."""

from __future__ import annotations

import json
import os
import re
import select
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

from _blocks import Block, console_commands

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
TS_SDK = REPO / "sdk" / "typescript"
# Blocks are written for the daemon at its default place; the suite's daemon is elsewhere.
DEFAULT_SOCKET = "/var/lib/sandfork/sandfork.sock"
BLOCK_TIMEOUT = 300.0


@dataclass
class Outcome:
    ok: bool
    error: str = ""
    output: str = ""
    not_run: str = ""  # why the block was not run (a skip, not a failure)


class Log:
    """A file the runners' output goes to; each block reads back what it added."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.touch()

    def open(self):
        return open(self.path, "ab")

    def since(self, offset: int) -> str:
        with open(self.path, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")

    def size(self) -> int:
        return self.path.stat().st_size


def source_of(block: Block, socket: str) -> str:
    """The block's code with its first line at the page's line number."""
    code = block.code.replace(DEFAULT_SOCKET, socket)
    if block.info == "console":
        code = console_commands(code)
    return "\n" * (block.first_code_line - 1) + code


def kill_group(proc: subprocess.Popen) -> None:
    """Ends the process and what it left running in its process group (a block's
    background jobs): SIGTERM, then SIGKILL to what is still there after 5 s."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and group_alive(proc):
            time.sleep(0.05)
    proc.wait()


def group_alive(proc: subprocess.Popen) -> bool:
    proc.poll()  # reaped first: a zombie would still count as a member
    try:
        os.killpg(proc.pid, 0)
        return True
    except ProcessLookupError:
        return False


class PythonRunner:
    """One interpreter (``_pyblock.py``) that runs a page's Python blocks in one namespace."""

    def __init__(self, env: Dict[str, str], work: Path, log: Log, socket: str) -> None:
        self.env, self.work, self.log, self.socket = env, work, log, socket
        self.proc: Optional[subprocess.Popen] = None

    def _start(self) -> None:
        req_r, self.req_w = os.pipe()
        self.ans_r, ans_w = os.pipe()
        with self.log.open() as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-u", str(HERE / "_pyblock.py"), str(req_r), str(ans_w)],
                cwd=self.work, env=self.env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                pass_fds=(req_r, ans_w), start_new_session=True,
            )  # fmt: skip
        os.close(req_r)
        os.close(ans_w)
        self.answers = os.fdopen(self.ans_r, "r")

    def run(self, block: Block, timeout: float = BLOCK_TIMEOUT) -> Outcome:
        if self.proc is None:
            self._start()
        start = self.log.size()
        file = self.work / f".block-{block.line}.py"
        file.write_text(source_of(block, self.socket))
        os.write(self.req_w, (json.dumps({"file": str(file), "name": f"{block.page}:{block.line}"}) + "\n").encode())
        ready, _, _ = select.select([self.answers], [], [], timeout)
        line = self.answers.readline() if ready else ""
        if not line:
            why = f"did not finish within {timeout:g}s" if not ready else "its interpreter died"
            self.close()
            return Outcome(False, f"the block {why}", self.log.since(start))
        answer = json.loads(line)
        return Outcome(answer["ok"], answer.get("error", ""), self.log.since(start))

    def close(self) -> None:
        if self.proc is not None:
            try:
                os.close(self.req_w)
            except OSError:
                pass
            kill_group(self.proc)
            self.answers.close()
            self.proc = None


PREAMBLE = r"""
__docs_test_known=" $(compgen -v | tr '\n' ' ') __docs_test_known "
__docs_test_save() {
  {
    local v
    for v in $(compgen -v); do
      case "$__docs_test_known" in *" $v "*) ;; *) declare -p "$v" 2>/dev/null || true ;; esac
    done
    printf 'cd %q\n' "$PWD"
  } > "$DOCS_TEST_STATE.new" && mv "$DOCS_TEST_STATE.new" "$DOCS_TEST_STATE"
}
trap __docs_test_save EXIT
trap 'echo "docs-test: exit status $? at line $LINENO: $BASH_COMMAND" >&2' ERR
if [ -f "$DOCS_TEST_STATE" ]; then source "$DOCS_TEST_STATE"; fi
set -euo pipefail
"""


class ShellRunner:
    """Runs each shell block in a bash of its own, with ``set -euo pipefail``; the
    variables a block sets and the directory it ends in carry over to the next block of
    the page. Background jobs a block starts end with it."""

    def __init__(self, env: Dict[str, str], work: Path, log: Log, socket: str) -> None:
        self.env, self.work, self.log, self.socket = env, work, log, socket
        self.state = work / ".shell-state"
        self.preamble = work / ".shell-preamble"
        self.preamble.write_text(PREAMBLE)

    def run(self, block: Block, timeout: float = BLOCK_TIMEOUT) -> Outcome:
        start = self.log.size()
        script = self.work / f".block-{block.line}.sh"
        source = source_of(block, self.socket)
        script.write_text(f"source {shlex.quote(str(self.preamble))}" + source)
        env = dict(self.env, DOCS_TEST_STATE=str(self.state))
        with self.log.open() as out:
            out.write(f"----- {block.page}:{block.line}\n".encode())
            out.flush()
            proc = subprocess.Popen(
                ["bash", str(script)], cwd=self.work, env=env, stdin=subprocess.DEVNULL,
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        try:
            code = proc.wait(timeout)
            error = "" if code == 0 else f"bash exited with {code}"
        except subprocess.TimeoutExpired:
            error = f"the block did not finish within {timeout:g}s"
        finally:
            kill_group(proc)
        return Outcome(not error, error, self.log.since(start))

    def close(self) -> None:
        pass


class TypeScriptSdk:
    """The TypeScript SDK compiled from sdk/typescript/src into a project directory of the
    suite's own, where the pages' blocks are type-checked and run."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.tsc = TS_SDK / "node_modules" / ".bin" / "tsc"

    def missing(self) -> Optional[str]:
        if shutil.which("node") is None:
            return "needs Node.js 20 or newer"
        if not self.tsc.exists() or not (TS_SDK / "node_modules" / "ws").exists():
            # What `make test-typescript` installs, from the lockfile (it may run later).
            subprocess.run(
                ["npm", "ci", "--prefer-offline", "--no-audit", "--no-fund", "--loglevel=error"],
                cwd=TS_SDK, capture_output=True, timeout=600,
            )  # fmt: skip
        if not self.tsc.exists() or not (TS_SDK / "node_modules" / "ws").exists():
            return "needs the TypeScript SDK's dependencies (cd sdk/typescript && npm ci), and installing them failed"
        return None

    def build(self) -> Optional[str]:
        """Compiles the SDK; returns why it could not, or None."""
        package = self.root / "node_modules" / "sandfork"
        package.mkdir(parents=True)
        built = subprocess.run([str(self.tsc), "-p", str(TS_SDK / "tsconfig.json"), "--outDir", str(package / "dist")], capture_output=True, text=True)
        if built.returncode != 0:
            return f"the TypeScript SDK does not compile:\n{built.stdout}{built.stderr}"
        shutil.copy(TS_SDK / "package.json", package / "package.json")
        for dep in ("ws", "@types"):
            (self.root / "node_modules" / dep).symlink_to(TS_SDK / "node_modules" / dep)
        (self.root / "package.json").write_text(json.dumps({"name": "docs-blocks", "private": True, "type": "module"}))
        return None


class TypeScriptRunner:
    """Runs a page's TypeScript blocks as one program: each block at its own line of the
    page (so the compiler's and node's line numbers are the page's), one after the other,
    as if the reader had typed them into one file. The program is type-checked (strict)
    and run once, at the first of its blocks; each block then reads its own outcome."""

    DONE = "@@docs-test: done with the block at line "

    def __init__(self, sdk: TypeScriptSdk, env: Dict[str, str], log: Log, socket: str, blocks: List[Block]) -> None:
        self.sdk, self.env, self.log, self.socket, self.blocks = sdk, env, log, socket, blocks
        self.outcomes: Optional[Dict[int, Outcome]] = None

    def run(self, block: Block, timeout: float = BLOCK_TIMEOUT) -> Outcome:
        if self.outcomes is None:
            self.outcomes = self._run_program(timeout * len(self.blocks))
        return self.outcomes[block.line]

    def _program(self) -> str:
        lines: List[str] = []
        for b in self.blocks:
            code = b.code.replace(DEFAULT_SOCKET, self.socket).splitlines()
            lines += [""] * (b.first_code_line - 1 - len(lines)) + code
            lines.append(f"console.log({json.dumps(self.DONE + str(b.line))});")  # on the closing fence's line
        return "\n".join(lines) + "\n"

    def _run_program(self, timeout: float) -> Dict[int, Outcome]:
        name = "page-" + Path(self.blocks[0].page).stem
        (self.sdk.root / f"{name}.ts").write_text(self._program())
        config = self.sdk.root / f"tsconfig.{name}.json"
        config.write_text(json.dumps({
            "compilerOptions": {"target": "ES2022", "module": "NodeNext", "moduleResolution": "NodeNext", "strict": True, "types": ["node"], "outDir": "out", "skipLibCheck": True},
            "files": [f"{name}.ts"],
        }))  # fmt: skip
        built = subprocess.run([str(self.sdk.tsc), "-p", str(config), "--pretty", "false"], cwd=self.sdk.root, capture_output=True, text=True)
        if built.returncode != 0:
            return self._compile_errors(built.stdout + built.stderr)
        start = self.log.size()
        with self.log.open() as out:
            proc = subprocess.Popen(
                ["node", f"out/{name}.js"], cwd=self.sdk.root, env=self.env, stdin=subprocess.DEVNULL,
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        try:
            code = proc.wait(timeout)
            error = "" if code == 0 else f"node exited with {code}"
        except subprocess.TimeoutExpired:
            error = f"the page's TypeScript did not finish within {timeout:g}s"
        finally:
            kill_group(proc)
        return self._split(self.log.since(start), error)

    def _split(self, output: str, error: str) -> Dict[int, Outcome]:
        """Each block's outcome from the program's output: done once its marker is out."""
        outcomes, rest, failed = {}, output, False
        for b in self.blocks:
            marker = f"{self.DONE}{b.line}\n"
            if not failed and marker in rest:
                own, _, rest = rest.partition(marker)
                outcomes[b.line] = Outcome(True, "", own)
            elif not failed:
                failed = True
                outcomes[b.line] = Outcome(False, error or "the program ended before this block did", rest)
            else:
                outcomes[b.line] = Outcome(False, not_run="not run: a TypeScript block before it on this page failed")
        return outcomes

    def _compile_errors(self, text: str) -> Dict[int, Outcome]:
        errors: Dict[int, List[str]] = {}
        for line in text.splitlines():
            m = re.match(r"^[^(]*\((\d+),\d+\): (.*)$", line)
            if m:
                at = int(m[1])
                owner = max((b for b in self.blocks if b.line <= at), key=lambda b: b.line, default=self.blocks[0])
                errors.setdefault(owner.line, []).append(f"line {at}: {m[2]}")
        outcomes = {}
        for b in self.blocks:
            if b.line in errors:
                outcomes[b.line] = Outcome(False, "it does not compile against the TypeScript SDK", "\n".join(errors[b.line]))
            else:
                if not errors:
                    outcomes[b.line] = Outcome(False, "the page's TypeScript does not compile", text)
                else:
                    lines = ", ".join(map(str, sorted(errors)))
                    outcomes[b.line] = Outcome(False, not_run=f"not run: the page's TypeScript does not compile (the blocks at lines {lines})")
        return outcomes

    def close(self) -> None:
        pass
