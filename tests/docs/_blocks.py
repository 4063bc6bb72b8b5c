"""The fenced code blocks of README.md and docs/*.md, and what each is for.

A block is classified by its info string or by a ``<!-- docs-test: ... -->`` comment on
the nearest non-blank line before its opening fence:

- ``python``/``py``, ``bash``/``sh``/``shell``, ``console`` (its ``$ `` lines) and
  ``ts``/``typescript`` blocks are run;
- ``text``, ``toml``, ``json``, ``yaml``, ``ini`` and ``output`` blocks are data,
  listings or diagrams, never run;
- ``<!-- docs-test: skip (REASON) -->`` keeps a block from running, for the reason given;
- ``<!-- docs-test: xfail (bug: WHAT) -->`` runs it and expects it to fail (strictly: a
  pass is a failure too, so the mark must go once the bug is fixed).

Any other block — no info string, or another language without a comment — is
unclassified, and its test fails.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

# Info strings of blocks that are run, and the runner that runs them.
RUNNERS = {
    "python": "python", "py": "python",
    "bash": "shell", "sh": "shell", "shell": "shell", "console": "shell",
    "ts": "ts", "typescript": "ts",
}  # fmt: skip
# Info strings that say a block is not code to run.
DATA = {"text", "txt", "toml", "json", "yaml", "yml", "ini", "output"}

FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
DIRECTIVE = re.compile(r"^<!--\s*docs-test:\s*(?P<kind>[a-z-]+)\s*(?:\((?P<reason>.*)\))?\s*-->$")


@dataclass(frozen=True)
class Block:
    page: str  # relative to the repository
    line: int  # of the opening fence, 1-based
    info: str  # the info string's first word, lower case ("" when none)
    code: str
    directive: Optional[str]  # "skip" or "xfail" (or an unknown word, refused)
    reason: Optional[str]
    comment: Optional[str]  # the directive's whole line, or the line found instead

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}:{self.info or 'no-info'}"

    @property
    def runner(self) -> Optional[str]:
        return RUNNERS.get(self.info)

    @property
    def is_data(self) -> bool:
        return self.info in DATA and self.directive is None

    @property
    def first_code_line(self) -> int:
        return self.line + 1

    def problem(self) -> Optional[str]:
        """Why the block is not classified properly, or ``None``."""
        where = f"{self.page}:{self.line}"
        if self.directive is not None:
            if self.directive not in ("skip", "xfail"):
                return f"{where}: unknown docs-test directive {self.comment!r} (skip or xfail)"
            if not (self.reason or "").strip():
                return f"{where}: `docs-test: {self.directive}` needs a reason in parentheses"
            if self.directive == "xfail":
                if self.runner is None:
                    return f"{where}: only a block that runs can be xfail (its info string is {self.info!r})"
                if not self.reason.strip().startswith("bug:"):
                    return f"{where}: an xfail names the product bug it waits for: `xfail (bug: ...)`"
            return None
        if self.runner or self.info in DATA:
            return None
        return (
            f"{where}: a ```{self.info} block is neither run nor marked: give it an info string "
            f"({', '.join(sorted(RUNNERS))}, or {', '.join(sorted(DATA))} for what is not code) "
            "or put `<!-- docs-test: skip (why) -->` on the line before it"
        )


def pages(repo: Path) -> List[Path]:
    return [repo / "README.md", *sorted((repo / "docs").glob("*.md"))]


def blocks_of(path: Path, repo: Path) -> List[Block]:
    lines = path.read_text().splitlines()
    found: List[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m or (m["fence"][0] == "`" and "`" in m["info"]):
            i += 1
            continue
        fence, indent, start = m["fence"], len(m["indent"]), i
        body: List[str] = []
        i += 1
        while i < len(lines):
            close = FENCE.match(lines[i])
            if close and close["fence"][0] == fence[0] and len(close["fence"]) >= len(fence) and not close["info"].strip():
                break
            body.append(lines[i][indent:] if lines[i][:indent].strip() == "" else lines[i].lstrip())
            i += 1
        i += 1
        info = (m["info"].split() or [""])[0].lower()
        directive = reason = comment = None
        before = next((lines[j].strip() for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        if before.startswith("<!--") and "docs-test" in before:
            comment = before
            d = DIRECTIVE.match(before)
            directive, reason = (d["kind"], d["reason"]) if d else (before, None)
        found.append(Block(str(path.relative_to(repo)), start + 1, info, "\n".join(body) + "\n", directive, reason, comment))
    return found


def all_blocks(repo: Path) -> List[Block]:
    return [b for page in pages(repo) for b in blocks_of(page, repo)]


def console_commands(code: str) -> str:
    """The commands of a terminal transcript: its ``$ `` lines (continued by a trailing
    backslash), each output line kept as a blank line so line numbers stay those of the page."""
    out, continued = [], False
    for line in code.splitlines():
        if continued or line.startswith("$ "):
            text = line if continued else line[2:]
            out.append(text)
            continued = text.endswith("\\")
        else:
            out.append("")
    return "\n".join(out) + "\n"
