"""Tensorlake's terminal calls, written the way its documentation uses them (the comment
under each test quotes it); only the import line differs."""

from __future__ import annotations

import asyncio
import time
from typing import List, Optional

from sandfork import AsyncSandbox, Sandbox


def test_create_pty_with_callbacks(sandbox: Sandbox) -> None:
    # pty = sandbox.create_pty(command="/bin/bash", args=["-l"], env={"TERM": "xterm-256color"}, working_dir="/workspace", cols=80, rows=24)
    got: List[bytes] = []
    exits: List[Optional[int]] = []
    pty = sandbox.create_pty(command="/bin/sh", args=["-c", "stty size; echo tl-$((2*21))"], env={"TERM": "xterm-256color"}, working_dir="/", cols=80, rows=24, on_data=got.append, on_exit=exits.append)
    assert pty.wait(timeout=30) == 0
    deadline = time.monotonic() + 10
    while not exits and time.monotonic() < deadline:
        time.sleep(0.05)
    out = b"".join(got)
    assert b"24 80" in out and b"tl-42" in out and exits == [0]


def test_session_then_connect(sandbox: Sandbox) -> None:
    # session = sandbox.create_pty_session("/bin/sh"); pty = sandbox.connect_pty(session["session_id"], session["token"])
    session = sandbox.create_pty_session("/bin/sh", rows=30, cols=100)
    assert session["session_id"].isdigit()
    url = sandbox.pty_ws_url(session["session_id"], session["token"])
    assert url.startswith(("ws://", "wss://", "ws+unix://")) and url.endswith(f"/pty/{session['session_id']}/connect")
    pty = sandbox.connect_pty(session["session_id"], session["token"])
    pty.send_input("stty size; exit 4\r")
    out = b"".join(pty)
    assert b"30 100" in out and pty.exit_code == 4


def test_async_create_pty(sandbox: Sandbox) -> None:
    # async with await AsyncSandbox.create() as sbx: pty = await sbx.create_pty(command="/bin/bash", on_data=...)   (examples/async_pty.py)
    async def main() -> None:
        sbx = await AsyncSandbox.connect(sandbox.sandbox_id)
        got: List[bytes] = []
        pty = await sbx.create_pty(command="/bin/sh", args=["-c", "echo async-$((3*3))"], on_data=got.append)
        assert await pty.wait(timeout=30) == 0
        await asyncio.sleep(0.1)
        assert b"async-9" in b"".join(got)

    asyncio.run(main())
