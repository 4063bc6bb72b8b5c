"""Every fenced code block of README.md and docs/*.md runs as written, or says why not.

Each block is a test, in page order (``README.md:90:python``). How a block is classified
is in ``_blocks.py``: ``python``, ``bash``/``sh``/``shell``, ``console`` and
``ts``/``typescript`` blocks run; ``text``, ``toml``, ``json``, ``yaml``, ``ini`` and
``output`` blocks are not code and are not tests; any other block needs
``<!-- docs-test: skip (reason) -->`` or ``<!-- docs-test: xfail (bug: ...) -->`` on the
line before it, or its test fails, so that no new block escapes unseen.

The blocks run against one daemon for the session (see conftest.py), as a reader would
run them after `sandfork serve`:

- **Python** blocks with the SDK from sdk/python/src and ``SANDFORK_URL`` pointing at the
  daemon. A page's Python blocks run in order in one interpreter and one namespace, so a
  later block uses what an earlier one made (``sb`` from the first block of a page).
- **Shell** blocks with bash, ``set -euo pipefail`` (a failing command or an unset
  variable fails the block), the ``sandfork`` binary first on ``PATH`` and
  ``SANDFORK_URL`` set. A page's shell blocks run in order; the variables a block sets
  and the directory it ends in carry over to the next one. Jobs a block starts in the
  background end when the block does. A ``console`` block runs its ``$ `` lines.
- **TypeScript** blocks each as a program of its own: type-checked (strict) against the
  SDK compiled from sdk/typescript/src, then run with node.
- The daemon's default socket, ``/var/lib/sandfork/sandfork.sock``, in a block is
  replaced by the test daemon's socket; nothing else in a block is changed.
- Each page starts in a new, empty working directory, on a daemon with no sandboxes,
  snapshots or volumes, and only the ``python`` image; what a page leaves is removed
  after it.
- When a block fails, the later blocks of the same kind on its page are skipped (they
  would fail for want of its state). Selecting one block with ``-k`` first runs the
  blocks before it on its page.

Run: ``python3 -m pytest -q tests/docs`` (as root, like the other suites).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from _blocks import all_blocks

REPO = Path(__file__).resolve().parents[2]
BLOCKS = all_blocks(REPO)
TESTED = [b for b in BLOCKS if not b.is_data]


def test_the_pages_have_blocks() -> None:
    """The extraction finds the blocks (a broken parser would leave nothing to test)."""
    pages = {b.page for b in BLOCKS}
    assert "README.md" in pages and "docs/sdk-python.md" in pages, sorted(pages)
    assert any(b.runner == "python" for b in BLOCKS) and any(b.runner == "shell" for b in BLOCKS)


@pytest.mark.parametrize("block", TESTED, ids=[b.id for b in TESTED])
def test_block(block, request) -> None:
    problem = block.problem()  # checked first: a block's classification needs no daemon
    if problem:
        pytest.fail(problem, pytrace=False)
    if block.directive == "skip":
        pytest.skip(block.reason)
    if block.runner is None:
        pytest.fail(f"{block.page}:{block.line}: a ```{block.info} block cannot run", pytrace=False)
    outcome = request.getfixturevalue("docs").run(block)
    print(outcome.output)  # shown with -rP
    where = f"{block.page}:{block.line} ({block.info})"
    if block.directive == "xfail":
        if outcome.ok:
            pytest.fail(f"{where} is marked xfail ({block.reason}) but ran: remove the mark", pytrace=False)
        pytest.xfail(f"{block.reason}; it failed with: {tail(outcome.error or outcome.output)}")
    if not outcome.ok:
        pytest.fail(f"{where} failed: {outcome.error}\n--- its output:\n{outcome.output}", pytrace=False)


def tail(text: str, lines: int = 3) -> str:
    return " | ".join(text.strip().splitlines()[-lines:])
