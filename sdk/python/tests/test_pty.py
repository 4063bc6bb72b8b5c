"""Terminal sessions against the real daemon: an independent WebSocket client (the
``websockets`` package) driving bash — resize, Ctrl-C, a full-screen program — then the
SDK's own client (callbacks, iteration, async), and a session that goes on across a
memory checkpoint and into a fork."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any, List

import pytest

from sandfork import Client, Sandbox
from sandfork.aio import AsyncSandbox
from sandfork.errors import InvalidArgumentError, NotFoundError, SandboxError
from sandfork.models import CheckpointType, ProcessStatus

websockets_sync = pytest.importorskip("websockets.sync.client")
import websockets.exceptions  # noqa: E402
# The tests keep connections open across calls rather than in a `with` block.
pytestmark = pytest.mark.filterwarnings("ignore:connect\\(\\) must be used as a context manager:DeprecationWarning")


class Term:
    """A terminal client on the ``websockets`` package: collects output, types input."""

    def __init__(self, daemon: Any, sandbox_id: str, pid: int, offset: int = 0) -> None:
        uri = f"ws://localhost/v1/sandboxes/{sandbox_id}/pty/{pid}/connect?offset={offset}"
        # An unbounded queue: with a full one, this client drops the frames it holds when
        # the server closes (a session's last output and its exit note).
        self.ws = websockets_sync.unix_connect(str(daemon.socket), uri, max_queue=None)
        self.out = b""
        self.controls: List[dict] = []

    def type(self, text: str) -> None:
        self.ws.send(text.encode())

    def control(self, **msg: Any) -> None:
        self.ws.send(json.dumps(msg))

    def expect(self, needle: bytes, timeout: float = 20.0) -> bytes:
        """Reads until ``needle`` has appeared in the output; returns all output so far."""
        deadline = time.monotonic() + timeout
        while needle not in self.out:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{needle!r} not seen; output so far: {self.out[-600:]!r}")
            try:
                msg = self.ws.recv(timeout=left)
            except TimeoutError:
                continue
            except websockets.exceptions.ConnectionClosed as e:
                raise AssertionError(f"{needle!r} not seen before {e}; {len(self.out)} bytes, {self.out.count(b'x')} x, {self.out.count(b'true')} true, controls {self.controls}; output so far: {self.out[-200:]!r}") from e
            if isinstance(msg, bytes):
                self.out += msg
            else:
                self.controls.append(json.loads(msg))
        return self.out

    def close(self) -> None:
        self.ws.close()


def start(sandbox: Sandbox, **body: Any) -> int:
    info = sandbox.client.request_json("POST", f"/v1/sandboxes/{sandbox.id}/pty", json_body=body)
    return int(info["pid"])


@pytest.fixture(scope="module")
def debian(daemon) -> Any:
    """A sandbox with bash."""
    with Sandbox.create(image="debian", memory_mb=256) as sb:
        yield sb


def test_bash_through_a_websocket_client_resize_and_ctrl_c(daemon, debian: Sandbox) -> None:
    pid = start(debian, command="bash", args=["--norc", "-i"], cols=80, rows=24, env={"PS1": "$ "})
    term = Term(daemon, debian.id, pid)
    try:
        term.type("stty size; tty; echo $TERM\r")
        term.expect(b"24 80")
        term.expect(b"/dev/pts/")
        term.expect(b"xterm-256color")
        # A resize reaches the terminal, and the foreground program is told (SIGWINCH).
        term.type("trap 'echo winched' WINCH; sleep 30 & wait\r")
        time.sleep(0.5)
        term.control(type="resize", cols=132, rows=43)
        term.expect(b"winched")
        term.type("stty size\r")
        term.expect(b"43 132")
        # Ctrl-C interrupts the foreground program, and the shell survives it.
        term.type("trap - WINCH; sleep 300\r")
        time.sleep(0.5)
        started = time.monotonic()
        term.type("\x03")
        term.type("echo after-$((40+2))\r")
        term.expect(b"after-42")
        assert time.monotonic() - started < 10
        # The first output is announced with its offset.
        assert term.controls and term.controls[0] == {"type": "offset", "offset": 0}
        term.type("exit 7\r")
        assert debian.get_process(pid).wait(timeout=20).exit_code == 7
    finally:
        term.close()


def test_ctrl_c_straight_after_create_leaves_the_shell(daemon, debian: Sandbox) -> None:
    """Input typed before the shell has shown anything waits for it: a Ctrl-C sent at once
    reaches a shell that handles it, instead of killing it before it set up its signals."""
    pid = start(debian, command="bash", args=["--norc", "-i"], cols=80, rows=24, env={"PS1": "$ "})
    term = Term(daemon, debian.id, pid)
    try:
        term.type("\x03")
        # The shell took it (a fresh prompt after ^C); what is typed next reaches it whole.
        term.expect(b"^C")
        time.sleep(0.5)
        term.type("echo alive-$((6*7))\r")
        term.expect(b"alive-42")
        assert debian.get_process(pid).is_running(), "the shell survived the early Ctrl-C"
        term.type("exit 0\r")
        assert debian.get_process(pid).wait(timeout=20).exit_code == 0
    finally:
        term.close()


def test_a_full_screen_program(daemon, sandbox: Sandbox) -> None:
    pid = start(sandbox, command="sh", cols=100, rows=30, env={"PS1": "# "})
    term = Term(daemon, sandbox.id, pid)
    try:
        # vi draws with cursor addressing, reads raw keys, and restores the terminal.
        term.type("vi /tmp/pty-vi.txt\r")
        term.expect(b"\x1b[")
        time.sleep(1.0)
        term.type("ihello from vi")
        time.sleep(0.3)
        term.type("\x1b")  # alone: vi reads a quick ESC + key as one escape sequence
        time.sleep(0.3)
        term.type(":wq\r")
        term.type("cat /tmp/pty-vi.txt\r")
        term.expect(b"hello from vi\r\n")
    finally:
        term.close()
        sandbox.pty.kill(pid)


def test_output_keeps_flowing_while_typed_input_waits(daemon, sandbox: Sandbox) -> None:
    """A program flooding its terminal while it reads nothing, and far more typed input
    than the terminal's input queue holds (a terminal emulator answering queries found in
    the flood does this): output must not wait on input."""
    script = "sleep 0.5; head -c 4000000 /dev/zero | tr '\\0' x; echo; echo fin-$((1+1)); sleep 60"
    pid = start(sandbox, command="sh", args=["-c", script])
    term = Term(daemon, sandbox.id, pid)
    def type_lines() -> None:
        try:
            for _ in range(40):
                term.type("true\r" * 2000)
        except websockets.exceptions.ConnectionClosed:
            pass

    typing = threading.Thread(target=type_lines, daemon=True)
    try:
        typing.start()
        term.expect(b"fin-2", timeout=60)
        typing.join(timeout=30)
        assert not typing.is_alive(), "typed input is still held up"
        assert sandbox.get_process(pid).info().status == ProcessStatus.RUNNING
    finally:
        term.close()
        sandbox.pty.kill(pid)


def test_reconnect_replays_from_an_offset_and_two_clients_share_a_session(daemon, sandbox: Sandbox) -> None:
    pid = start(sandbox, command="sh", env={"PS1": "# "})
    first = Term(daemon, sandbox.id, pid)
    first.type("echo one-$((0+1))\r")
    seen = first.expect(b"one-1")
    first.close()
    # Detached: the shell keeps running; a second client replays everything, a third
    # picks up from where the first left off.
    replay = Term(daemon, sandbox.id, pid)
    replay.expect(b"one-1")
    later = Term(daemon, sandbox.id, pid, offset=len(seen))
    replay.type("echo two-$((1+1))\r")
    later.expect(b"two-2")
    replay.expect(b"two-2")
    assert b"one-1" not in later.out
    replay.close()
    later.close()
    sandbox.pty.kill(pid)


def test_sdk_session_iteration_callbacks_and_exit_code(sandbox: Sandbox) -> None:
    with sandbox.pty.create("sh", ["-c", "read line; echo got:$line; exit 3"], cols=100, rows=30) as s:
        s.send("hello\r")
        out = b""
        for chunk in s:
            out += chunk
        assert b"got:hello" in out
        assert s.exit_code == 3
    got: List[bytes] = []
    with sandbox.pty.create("sh", ["-c", "stty size; sleep 0.2"], cols=90, rows=20, on_data=got.append) as s:
        assert s.wait(timeout=30) == 0
    assert b"20 90" in b"".join(got)


def test_async_session(sandbox: Sandbox) -> None:
    async def main() -> None:
        sb = AsyncSandbox(sandbox.sync if hasattr(sandbox, "sync") else sandbox)
        session = await sb.pty.create("sh", ["-c", "read x; echo async:$x"])
        await session.send("ok\r")
        out = b""
        async for chunk in session:
            out += chunk
        assert b"async:ok" in out
        assert session.exit_code == 0
        await session.close()

    asyncio.run(main())


def test_session_goes_on_across_a_memory_checkpoint_and_into_a_fork(daemon) -> None:
    with Sandbox.create(memory_mb=256) as base:
        session = base.pty.create("sh", env={"PS1": "$ "})
        out: List[bytes] = []
        lock = threading.Lock()
        session_out = lambda: b"".join(out)  # noqa: E731

        def collect() -> None:
            for chunk in session:
                with lock:
                    out.append(chunk)

        reader = threading.Thread(target=collect, daemon=True)
        reader.start()
        session.send("X=41\r")
        _wait_for(lambda: session_out().count(b"$ ") >= 2)
        # A job in the terminal's foreground is a state CRIU cannot take: a clear refusal.
        session.send("sleep 60\r")
        time.sleep(0.5)
        with pytest.raises(SandboxError, match="running a job in its foreground"):
            base.checkpoint(checkpoint_type=CheckpointType.MEMORY)
        session.send("\x03")
        _wait_for(lambda: session_out().count(b"$ ") >= 3)
        # At the prompt, the attached session does not block the checkpoint: it is interrupted and
        # reconnects by itself, from the last byte it saw.
        snap = base.checkpoint(checkpoint_type=CheckpointType.MEMORY)
        session.send("echo parent-$((X+1))\r")
        _wait_for(lambda: b"parent-42\r\n" in session_out())
        # Nothing replayed twice across the reconnect.
        assert session_out().count(b"echo parent-$((X+1))") == 1
        child = Sandbox.create(snapshot_id=snap.id)
        try:
            forked = child.pty.connect(session.pid)
            forked.send("echo child-$X\r")
            got = b""
            for chunk in forked:
                got += chunk
                if b"child-41\r\n" in got:
                    break
            forked.close()
            assert b"child-41\r\n" in got
        finally:
            child.terminate()
        session.kill()
        reader.join(timeout=20)
        snap.delete()


def test_bad_input(daemon, sandbox: Sandbox) -> None:
    client = Client(url=daemon.url)
    route = f"/v1/sandboxes/{sandbox.id}"
    with pytest.raises(InvalidArgumentError, match="terminal size"):
        client.request_json("POST", f"{route}/pty", json_body={"command": "sh", "cols": 0})
    with pytest.raises(InvalidArgumentError):
        client.request_json("POST", f"{route}/pty", json_body={"args": ["x"]})
    with pytest.raises(InvalidArgumentError, match="WebSocket"):
        client.request_json("GET", f"{route}/pty/1/connect")
    with pytest.raises(NotFoundError):
        sandbox.pty.connect(999999)
    # A process without a terminal cannot be attached as one, nor resized.
    proc = sandbox.start_process("sleep", ["30"])
    with pytest.raises(SandboxError, match="no terminal"):
        sandbox.pty.connect(proc.pid)
    with pytest.raises(SandboxError, match="no terminal"):
        sandbox.pty.resize(proc.pid, 80, 24)
    proc.kill()
    # A bad control message is answered, and the session goes on.
    pid = start(sandbox, command="sh")
    term = Term(daemon, sandbox.id, pid)
    term.control(type="resize", cols=0, rows=10)
    term.type("echo still-$((2+3))\r")
    term.expect(b"still-5")
    assert any(c.get("type") == "error" and "terminal size" in c["message"] for c in term.controls)
    term.close()
    sandbox.pty.kill(pid)


def _wait_for(cond: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)
