"""Every relative link of the project's Markdown pages resolves: README.md, CONTRIBUTING.md,
CHANGELOG.md and docs/**/*.md. A link's file (or directory) must exist, relative to the page;
a ``#anchor`` into a Markdown page (the same page when the link is only ``#anchor``) must be one
of its headings' anchors, by GitHub's rules (``slug``), or an ``id``/``name`` of its HTML.

Links inside fenced code blocks and code spans are not links. Absolute URLs (``https:``,
``mailto:``, ...) are not checked: nothing here reaches the network.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest
from conftest import REPO

TOP_PAGES = ("README.md", "CONTRIBUTING.md", "CHANGELOG.md")
FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.DOTALL)
# [text](target "title") and ![alt](target): the text may hold one level of brackets.
INLINE = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+[\"'(][^)]*)?\)")
REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)", re.MULTILINE)
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
HTML_ANCHOR = re.compile(r"<[a-zA-Z][^>]*\s(?:id|name)=[\"']([^\"']+)[\"']")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def pages() -> list[Path]:
    found = [REPO / name for name in TOP_PAGES if (REPO / name).is_file()]
    return found + sorted((REPO / "docs").rglob("*.md"))


def prose_lines(text: str) -> list[str]:
    """The page's lines outside fenced code blocks (those inside are blanked)."""
    lines, fence = [], None
    for line in text.splitlines():
        match = FENCE.match(line)
        if fence is None and match:
            fence = match.group(1)
            lines.append("")
        elif fence is not None:
            if line.strip().startswith(fence[0] * len(fence)) and not line.strip(fence[0]).strip():
                fence = None
            lines.append("")
        else:
            lines.append(line)
    return lines


def strip_code_spans(text: str) -> str:
    return CODE_SPAN.sub("", text)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading's text: its Markdown reduced to the text shown, lowercased,
    every character but letters, digits, marks, ``_``, ``-`` and spaces dropped, each space a
    ``-`` (github-slugger)."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links: their text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.replace("`", "").replace("*", "")
    kept = "".join(ch for ch in text.lower() if ch.isalnum() or ch in "-_ " or _is_mark(ch))
    return kept.replace(" ", "-")


def _is_mark(ch: str) -> bool:
    import unicodedata

    return unicodedata.category(ch).startswith("M")


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a page: one per heading (the second of a name gets ``-1``, ...)
    and the ``id`` and ``name`` attributes of its HTML."""
    seen: dict[str, int] = {}
    found = set()
    lines = prose_lines(page.read_text())
    for line in lines:
        match = HEADING.match(line)
        if match:
            base = slug(match.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    found |= set(HTML_ANCHOR.findall("\n".join(lines)))
    return found


def links(page: Path) -> list[tuple[int, str]]:
    """(line number, target) of every link of the page outside code."""
    found = []
    for number, line in enumerate(prose_lines(page.read_text()), start=1):
        line = strip_code_spans(line)
        for match in INLINE.finditer(line):
            found.append((number, match.group(1)))
        for match in REFERENCE.finditer(line):
            found.append((number, match.group(1)))
    return [(n, t.strip("<>")) for n, t in found]


def broken(page: Path, target: str) -> str | None:
    """Why a link of ``page`` to ``target`` does not resolve, or None."""
    if SCHEME.match(target) or target.startswith("//"):
        return None  # an absolute URL
    path_part, _, anchor = target.partition("#")
    path_part = unquote(path_part.split("?", 1)[0])
    if path_part.startswith("/"):
        dest = REPO / path_part.lstrip("/")  # GitHub: relative to the repository root
    else:
        dest = (page.parent / path_part) if path_part else page
    shown = dest.resolve().relative_to(REPO) if dest.resolve().is_relative_to(REPO) else dest
    if not dest.exists():
        return f"{shown} does not exist"
    if anchor and dest.suffix == ".md" and dest.is_file():
        if unquote(anchor).lower() not in anchors(dest):
            return f"{shown} has no heading with the anchor #{anchor}"
    return None


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page: Path) -> None:
    problems = [
        f"{page.relative_to(REPO)}:{number}: ({target}) {why}"
        for number, target in links(page)
        if (why := broken(page, target)) is not None
    ]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    "heading, anchor",
    [
        ("Clusters: SLURM and Kubernetes", "clusters-slurm-and-kubernetes"),
        ("Watching a run: apexrl status", "watching-a-run-apexrl-status"),
        ("Set-up: two commands", "set-up-two-commands"),
        ("`apexrl config show`", "apexrl-config-show"),
        (
            "Replay durability: no acknowledged chunk lost, none stored twice",
            "replay-durability-no-acknowledged-chunk-lost-none-stored-twice",
        ),
        ("[0.1.0] - 2026-12-01", "010---2026-12-01"),
        (
            "Nested spaces: Dict observations, MultiDiscrete and Tuple actions",
            "nested-spaces-dict-observations-multidiscrete-and-tuple-actions",
        ),
        ("env_task ≥ 4 **bold**", "env_task--4-bold"),
    ],
)
def test_slug_follows_github(heading: str, anchor: str) -> None:
    assert slug(heading) == anchor


def test_the_checker_finds_broken_links(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    (tmp_path / "other.md").write_text("# Other page\n\n## A part\n\n## A part\n")
    page.write_text(
        "# Title\n\n"
        "[ok](other.md#a-part) [ok too](other.md#a-part-1) [self](#title) [web](https://x.invalid/)\n"
        "[gone](missing.md) [no heading](other.md#nothing) [no self](#nope)\n"
        "`[in code](missing2.md)`\n\n```\n[in a block](missing3.md)\n```\n"
    )
    targets = [target for _, target in links(page)]
    assert "missing2.md" not in targets and "missing3.md" not in targets
    found = {target: broken(page, target) for target in targets}
    assert [t for t, why in found.items() if why is not None] == [
        "missing.md",
        "other.md#nothing",
        "#nope",
    ], found
