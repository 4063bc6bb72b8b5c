"""Tensorlake compatibility against the real daemon: commands and background processes.

Each test is written the way Tensorlake's documentation uses the call (the comment under
its name quotes it); only the import line differs.
"""

from __future__ import annotations

import signal
import time
from datetime import datetime

import pytest

from sandfork import (
    CommandResult,
    OutputEvent,
    OutputResponse,
    ProcessInfo,
    ProcessStatus,
    ProcessUserSpec,
    RemoteAPIError,
    Sandbox,
    SandboxError,
    SendSignalResponse,
    StdinMode,
)

pytestmark = pytest.mark.daemon


@pytest.fixture(scope="module")
def sandbox(daemon):
    # sandbox = Sandbox.create()
    with Sandbox.create(memory_mb=256) as sb:
        yield sb


def _wait_exit(sandbox: Sandbox, pid: int, timeout: float = 10.0) -> ProcessInfo:
    deadline = time.monotonic() + timeout
    while True:
        info = sandbox.get_process(pid)
        if info.status != ProcessStatus.RUNNING:
            return info
        assert time.monotonic() < deadline, f"process {pid} still running"
        time.sleep(0.05)


def test_run_result(sandbox: Sandbox) -> None:
    # result = sandbox.run("sh", ["-lc", "printf 'Hello from the sandbox!\\n'"]); print(result.stdout)   (README)
    result = sandbox.run("sh", ["-lc", "printf 'Hello from the sandbox!\\n'"])
    assert isinstance(result, CommandResult)
    assert (result.exit_code, result.stdout, result.stderr) == (0, "Hello from the sandbox!", "")


def test_run_stdout_is_lines_joined(sandbox: Sandbox) -> None:
    # run().stdout: the output lines joined with "\n" ("a\nb\nc\n" -> "a\nb\nc"); a non-zero exit does not raise
    r = sandbox.run("sh", ["-c", "printf 'a\\nb\\nc\\n'; echo oops >&2; exit 3"])
    assert (r.stdout, r.stderr, r.exit_code) == ("a\nb\nc", "oops", 3)
    assert sandbox.run("printf", ["x\\n\\n"]).stdout == "x\n", "only one trailing newline goes"
    assert sandbox.run("printf", ["no-newline"]).stdout == "no-newline"


def test_run_positional_parameters(sandbox: Sandbox) -> None:
    # run(command, args, env, working_dir, timeout, user)
    r = sandbox.run("sh", ["-c", 'echo "$GREETING $(pwd) $(id -u)"'], {"GREETING": "hi"}, "/tmp", 30, "root")
    assert r.stdout == "hi /tmp 0"


def test_run_as_user_spec(sandbox: Sandbox) -> None:
    # user accepts a username, "uid:gid", ProcessUserSpec or a dict
    assert sandbox.run("id", ["-u"], user=ProcessUserSpec(uid=1000, gid=1000)).stdout == "1000"
    assert sandbox.run("id", ["-g"], user={"uid": 1000, "gid": 1001}).stdout == "1001"
    assert sandbox.run("id", ["-u"], user="1000:1000").stdout == "1000"
    with pytest.raises(SandboxError, match="exactly one of name and uid"):
        sandbox.run("id", user=ProcessUserSpec(name="root", uid=0))


def test_run_timeout(sandbox: Sandbox) -> None:
    # sandbox.run("sleep", ["30"], timeout=1)   (timeout enforced server-side)
    start = time.monotonic()
    r = sandbox.run("sleep", ["30"], timeout=1)
    assert r.exit_code != 0 and time.monotonic() - start < 15


def test_run_killed_by_signal(sandbox: Sandbox) -> None:
    # "If the exit event carries a signal, exit_code = -signal"
    assert sandbox.run("sh", ["-c", "kill -KILL $$"]).exit_code == -9


def test_start_process_returns_process_info(sandbox: Sandbox) -> None:
    # proc = sandbox.start_process("sleep", ["300"]); print(proc.pid)   (README)
    proc = sandbox.start_process("sleep", ["300"])
    try:
        assert isinstance(proc, ProcessInfo) and proc.pid > 0
        assert proc.status == ProcessStatus.RUNNING and (proc.command, proc.args) == ("sleep", ["300"])
        assert isinstance(proc.started_at, datetime) and proc.exit_code is None and proc.managed is None
        assert proc.value is proc and len(proc.trace_id) == 32
    finally:
        sandbox.kill_process(proc.pid)


def test_list_processes(sandbox: Sandbox) -> None:
    # for p in sandbox.list_processes(): print(p.pid, p.status)
    proc = sandbox.start_process("sleep", ["300"])
    try:
        listed = sandbox.list_processes()
        assert proc.pid in [p.pid for p in listed] and all(isinstance(p, ProcessInfo) for p in listed)
        assert list(listed)[0].pid == listed[0].pid, "iterable and indexable"
    finally:
        sandbox.kill_process(proc.pid)


def test_get_process(sandbox: Sandbox) -> None:
    # sandbox.get_process(proc.pid)
    proc = sandbox.start_process("sh", ["-c", "exit 4"])
    info = _wait_exit(sandbox, proc.pid)
    assert (info.pid, info.status, info.exit_code) == (proc.pid, ProcessStatus.EXITED, 4)


def test_get_process_with_deprecated_pid_keyword(sandbox: Sandbox) -> None:
    # sandbox.get_process(pid=proc.pid)   -> DeprecationWarning, still works
    proc = sandbox.start_process("true")
    with pytest.warns(DeprecationWarning, match="`pid` is deprecated"):
        assert sandbox.get_process(pid=proc.pid).pid == proc.pid
    with pytest.raises(TypeError, match="missing required argument: `process`"):
        sandbox.get_process()


def test_unknown_process(sandbox: Sandbox) -> None:
    # Process operations raise RemoteAPIError(404, ...) for a missing process
    for call in (lambda: sandbox.get_process(424242), lambda: sandbox.send_signal(424242, signal.SIGTERM), lambda: sandbox.get_stdout(424242)):
        with pytest.raises(RemoteAPIError) as info:
            call()
        assert info.value.status_code == 404 and "424242" in info.value.message


def test_send_signal(sandbox: Sandbox) -> None:
    # sandbox.send_signal(proc.pid, signal.SIGTERM)  -> SendSignalResponse(success=True)
    proc = sandbox.start_process("sleep", ["300"])
    resp = sandbox.send_signal(proc.pid, signal.SIGTERM)
    assert isinstance(resp, SendSignalResponse) and resp.success
    info = _wait_exit(sandbox, proc.pid)
    assert (info.status, info.signal) == (ProcessStatus.SIGNALED, signal.SIGTERM)
    with pytest.raises(TypeError, match="signal"):
        sandbox.send_signal(proc.pid)


def test_kill_process(sandbox: Sandbox) -> None:
    # sandbox.kill_process(proc.pid)
    proc = sandbox.start_process("sleep", ["300"])
    sandbox.kill_process(proc.pid)
    info = _wait_exit(sandbox, proc.pid)
    assert info.status == ProcessStatus.SIGNALED and info.signal in (signal.SIGTERM, signal.SIGKILL)


def test_stdin_pipe(sandbox: Sandbox) -> None:
    # proc = sandbox.start_process("python", ["-i"], stdin_mode="pipe"); sandbox.write_stdin(proc.pid, b"...\n"); sandbox.close_stdin(proc.pid)
    proc = sandbox.start_process("sh", ["-c", "read line; echo got:$line; cat"], stdin_mode="pipe")
    assert proc.stdin_writable
    sandbox.write_stdin(proc.pid, b"print('hello')\n")
    sandbox.write_stdin(proc.pid, b"rest")
    sandbox.close_stdin(proc.pid)
    _wait_exit(sandbox, proc.pid)
    assert sandbox.get_stdout(proc.pid).lines == ["got:print('hello')", "rest"]


def test_stdin_closed_by_default(sandbox: Sandbox) -> None:
    # stdin_mode defaults to StdinMode.CLOSED: the process reads end-of-file at once
    proc = sandbox.start_process("sh", ["-c", "cat; echo eof"])
    assert not proc.stdin_writable
    info = _wait_exit(sandbox, proc.pid)
    assert info.exit_code == 0 and sandbox.get_stdout(proc.pid).lines == ["eof"]
    assert StdinMode.CLOSED.value == "closed"


def test_get_stdout_stderr_output(sandbox: Sandbox) -> None:
    # out = sandbox.get_stdout(pid); out.lines, out.line_count; get_stderr; get_output (combined)
    proc = sandbox.start_process("sh", ["-c", "echo one; echo err1 >&2; sleep 0.1; echo two"])
    _wait_exit(sandbox, proc.pid)
    out = sandbox.get_stdout(proc.pid)
    assert isinstance(out, OutputResponse) and (out.pid, out.lines, out.line_count) == (proc.pid, ["one", "two"], 2)
    assert sandbox.get_stderr(proc.pid).lines == ["err1"]
    combined = sandbox.get_output(proc.pid)
    assert sorted(combined.lines) == ["err1", "one", "two"] and combined.line_count == 3


def test_follow_output(sandbox: Sandbox) -> None:
    # for event in sandbox.follow_output(proc.pid): print(event.line, end="")
    proc = sandbox.start_process("sh", ["-c", "for i in 0 1 2; do echo $i; sleep 0.1; done; echo bad >&2"])
    events = sandbox.follow_output(proc.pid)
    assert all(isinstance(e, OutputEvent) and isinstance(e.timestamp, datetime) for e in events)
    assert [(e.line, e.stream) for e in events if e.stream == "stdout"] == [("0", "stdout"), ("1", "stdout"), ("2", "stdout")]
    assert [e.line for e in events if e.stream == "stderr"] == ["bad"]
    assert len(events.trace_id) == 32


def test_follow_stdout_and_stderr(sandbox: Sandbox) -> None:
    # sandbox.follow_stdout(pid) / sandbox.follow_stderr(pid): blocks until the process exits
    proc = sandbox.start_process("sh", ["-c", "echo a; echo b >&2; sleep 0.2; echo c"])
    assert [e.line for e in sandbox.follow_stdout(proc.pid)] == ["a", "c"]
    assert [e.line for e in sandbox.follow_stderr(proc.pid)] == ["b"]


def test_bad_process_arguments(sandbox: Sandbox) -> None:
    # start_process(..., name="123") -> ValueError (numeric strings address pids); stdin_mode must be closed|pipe
    with pytest.raises(ValueError, match="all digits"):
        sandbox.start_process("sleep", ["1"], name="123")
    with pytest.raises(ValueError, match="stdin_mode must be one of 'closed', 'pipe'"):
        sandbox.start_process("sleep", ["1"], stdin_mode="tty")
    with pytest.raises(SandboxError, match="invalid process restart config"):
        sandbox.start_process("sleep", ["1"], restart={"policy": "sometimes"})
    with pytest.raises(SandboxError) as info:
        sandbox.get_process(1.5)  # type: ignore[arg-type]
    assert isinstance(info.value, TypeError)


def test_exec_failure(sandbox: Sandbox) -> None:
    # a command that cannot start: RemoteAPIError (400) naming it
    with pytest.raises(RemoteAPIError) as info:
        sandbox.run("/bin/definitely-not-here")
    assert info.value.status_code == 400 and "definitely-not-here" in info.value.message
