"""Background processes against the real daemon."""

from __future__ import annotations

import signal
import time

import pytest

import sandfork
from sandfork import ProcessStatus, Sandbox

pytestmark = pytest.mark.daemon


def test_start_reconnect_and_read_buffered_output(sandbox: Sandbox) -> None:
    proc = sandbox.start_process("sh", ["-c", "echo started; echo on-err >&2; sleep 600"])
    assert proc.pid is not None and proc.status == ProcessStatus.RUNNING
    assert proc.command == "sh"
    time.sleep(0.5)

    # A brand-new handle, as another program would get it.
    again = Sandbox.connect(sandbox.id).get_process(proc.pid)
    assert again.is_running()
    events = list(again.output(follow=False))
    assert "".join(e.data for e in events if e.stream == "stdout") == "started\n"
    assert "".join(e.data for e in events if e.stream == "stderr") == "on-err\n"
    assert proc.pid in [p.pid for p in sandbox.list_processes()]

    again.send_signal("TERM")
    info = proc.wait(timeout=10)
    assert info.status == ProcessStatus.SIGNALED and info.signal == signal.SIGTERM
    assert proc.status == ProcessStatus.SIGNALED, "wait() updates the handle's fields"


def test_follow_output_until_exit(sandbox: Sandbox) -> None:
    proc = sandbox.start_process("sh", ["-c", "for i in 1 2 3; do echo line$i; sleep 0.2; done; exit 7"])
    stream = proc.output()
    text = "".join(e.data for e in stream)
    assert text == "line1\nline2\nline3\n"
    assert stream.result is not None and stream.result.exit_code == 7
    assert proc.wait().exit_code == 7


def test_output_from_offset(sandbox: Sandbox) -> None:
    proc = sandbox.start_process("sh", ["-c", "printf abcdef"])
    proc.wait(timeout=10)
    events = list(proc.output(offset=2))
    assert "".join(e.data for e in events) == "cdef"
    assert events[0].offset == 2


def test_stdin_write_and_close(sandbox: Sandbox) -> None:
    proc = sandbox.start_process("sh", ["-c", "read a; echo got:$a; cat"], stdin_mode="pipe")
    proc.write_stdin("first\n")
    proc.write_stdin(b"rest of it")
    proc.close_stdin()
    info = proc.wait(timeout=10)
    assert info.exit_code == 0
    assert "".join(e.data for e in proc.output()) == "got:first\nrest of it"


def test_kill_and_wait_timeout(sandbox: Sandbox) -> None:
    proc = sandbox.start_process("sleep", ["600"])
    with pytest.raises(sandfork.SandforkTimeoutError):
        proc.wait(timeout=0.5)
    proc.kill()
    info = proc.wait(timeout=10)
    assert info.signal == signal.SIGKILL and info.exit_code is None


def test_signal_by_number_and_enum(sandbox: Sandbox) -> None:
    for sig in (signal.SIGINT, 15, "SIGTERM"):
        proc = sandbox.start_process("sleep", ["600"])
        proc.send_signal(sig)
        assert proc.wait(timeout=10).status == ProcessStatus.SIGNALED


def test_tensorlake_style_helpers(sandbox: Sandbox) -> None:
    proc = sandbox.start_process("sleep", ["600"])
    sandbox.send_signal(proc.pid, 15)
    assert proc.wait(timeout=10).signal == 15
    proc = sandbox.start_process("sleep", ["600"])
    sandbox.kill_process(proc.pid)
    assert proc.wait(timeout=10).signal in (signal.SIGTERM, signal.SIGKILL)


def test_unknown_process_is_not_found(sandbox: Sandbox) -> None:
    with pytest.raises(sandfork.RemoteAPIError) as info:
        sandbox.get_process(987654)
    assert info.value.status_code == 404 and "987654" in info.value.message
    assert not isinstance(info.value, sandfork.SandboxNotFoundError), "the sandbox exists"
