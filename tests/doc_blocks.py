"""The code blocks of the README and of ``docs/*.md``, and how the doc test runs each one.

A fenced block tagged ``python`` or ``bash`` is shown to the reader as runnable: the doc test
(``tests/test_docs.py``) runs it as written, from the repository root. An HTML comment on the line
before the fence says how, when it needs saying (several directives separated by ``;``)::

    <!-- doctest: skip: REASON -->                 not run (placeholders, other hosts, hours);
                                                   the reason is the rest of the comment
    <!-- doctest: file mypkg/cb.py -->             written to that path, importable by the
                                                   page's other blocks (PYTHONPATH), not run
    <!-- doctest: bounded 60 -->                   each command (bash) or the script (python)
                                                   that still runs after 60 s is stopped with
                                                   Ctrl-C (SIGINT) and must exit cleanly
    <!-- doctest: skip-command TEXT: REASON -->    a bash block's commands that contain TEXT
                                                   are not run

A bash block runs command by command (a line, with its ``\\`` continuations; comments and blank
lines dropped); a python block runs whole, as ``python3 -`` would run a file of it. Blocks of
another language (``yaml``, output, synopses with placeholders) are left as they are.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

RUNNABLE = ("python", "bash")
DIRECTIVE = re.compile(r"^<!--\s*doctest:\s*(.*?)\s*-->$")


class DirectiveError(ValueError):
    """A ``doctest:`` comment that says nothing this module knows."""


@dataclass
class Block:
    """One fenced block of a page, where it starts, and what its directive says."""

    page: Path
    line: int  # the fence's line number (1-based)
    language: str
    text: str
    skip: str | None = None  # the reason it is not run
    file: str | None = None  # where it is written instead of run
    bounded_s: float | None = None  # stopped with SIGINT after this many seconds
    skip_commands: dict[str, str] = field(default_factory=dict)  # TEXT -> reason

    @property
    def name(self) -> str:
        return f"{self.page.name}:{self.line}"

    @property
    def runs(self) -> bool:
        return self.language in RUNNABLE and self.skip is None and self.file is None

    def commands(self) -> list[str]:
        """A bash block's commands, in order, less those a ``skip-command`` names."""
        found, pending = [], ""
        for raw in self.text.splitlines():
            line = raw.rstrip()
            if not pending and (not line.strip() or line.lstrip().startswith("#")):
                continue
            if line.endswith("\\"):
                pending += line[:-1] + " "
                continue
            found.append(pending + line)
            pending = ""
        if pending:
            found.append(pending)
        return [c for c in found if not any(t in c for t in self.skip_commands)]


def parse_directive(text: str, block: Block) -> None:
    """Set ``block``'s fields from a directive's text; ``DirectiveError`` for an unknown one. A
    ``skip:`` takes the rest of the text as its reason (``;`` included)."""
    head, _, tail = text.partition("skip:")
    parts = [p.strip() for p in head.split(";") if p.strip()]
    if _ or text.startswith("skip:"):
        parts.append("skip:" + tail)
    for part in parts:
        if part.startswith("skip-command "):
            target, _, reason = part[len("skip-command ") :].partition(": ")
            if not target or not reason:
                raise DirectiveError(f"{block.name}: skip-command needs 'TEXT: REASON': {part!r}")
            block.skip_commands[target] = reason
        elif part.startswith("skip:"):
            block.skip = part[len("skip:") :].strip()
            if not block.skip:
                raise DirectiveError(f"{block.name}: skip needs a reason")
        elif part.startswith("file "):
            block.file = part[len("file ") :].strip()
        elif part.startswith("bounded "):
            try:
                block.bounded_s = float(part[len("bounded ") :])
            except ValueError as exc:
                raise DirectiveError(f"{block.name}: bounded needs seconds: {part!r}") from exc
        else:
            raise DirectiveError(f"{block.name}: unknown doctest directive {part!r}")


def page_blocks(page: Path) -> list[Block]:
    """Every fenced block of ``page`` with the directive on the line before its fence."""
    lines = page.read_text().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        fence = lines[i].strip()
        if not fence.startswith("```"):
            i += 1
            continue
        start = i
        i += 1
        body = []
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i])
            i += 1
        block = Block(page, start + 1, fence[3:].strip(), "\n".join(body) + "\n")
        before = lines[start - 1].strip() if start > 0 else ""
        match = DIRECTIVE.match(before)
        if match:
            parse_directive(match.group(1), block)
        blocks.append(block)
        i += 1
    return blocks


def doc_pages(repo: Path) -> list[Path]:
    """The README and every page under ``docs/``."""
    return [repo / "README.md", *sorted((repo / "docs").rglob("*.md"))]
