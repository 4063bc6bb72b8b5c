"""Runs in_root/ (the environment's calls one by one, with the real Harbor classes) with
the root's Python and pytest, against this session's daemon."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import HERE, in_root

pytestmark = pytest.mark.usefixtures("daemon", "python_image", "root", "no_leaks")


def test_the_environment_api_in_the_root(tmp_path: Path) -> None:
    done = in_root(
        ["python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "--basetemp", str(tmp_path / "t"), str(HERE / "in_root")],
        binds=[tmp_path],
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
    assert " passed" in done.stdout and "failed" not in done.stdout, done.stdout[-3000:]
