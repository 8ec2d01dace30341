"""``apexrl docs``: the reference pages ``docs/reference/config.md`` and ``docs/reference/cli.md``,
generated from the code so that they cannot drift from it.

- ``config.md``: every key of every config dataclass (``apexrl.config``, and one hyperparameter
  class per algorithm family in ``apexrl.config.algos``) with its type, its default, what it
  does (the comment on the field's line in the source, the comment block above it, or, failing
  both, the same field's comment in a base class) and which algorithm families read it;
- ``cli.md``: every subcommand of ``apexrl`` (found by walking the argparse parser of
  ``apexrl.cli.build_parser``, nested subcommands too) with its help, its arguments, their
  defaults and their help.

``apexrl docs`` writes both; ``apexrl docs --check`` writes nothing and exits 1 naming the pages
that differ from what the code makes now. The renderers are pure: ``render_pages()`` returns the
pages' text, which ``tests/test_reference.py`` compares with the files.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import io
import sys
import textwrap
import tokenize
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from apexrl.config import Config
from apexrl.config.algos import ALGORITHM_CONFIGS

REPO = Path(__file__).resolve().parents[2]
DEFAULT_DIR = REPO / "docs" / "reference"  # where `apexrl docs` writes without --dir
PAGES = ("config.md", "cli.md")
GENERATED = "<!-- generated from the code by `apexrl docs`: edit the code, then run it -->"

# Keys outside algo.* that only some families read, each checked by hand in the code and by
# tests/test_reference.py: the value says which families and why.
FAMILY_KEYS: dict[str, tuple[tuple[str, ...], str]] = {
    "actor.epsilon": (("apex_dqn", "r2d2"), "apex_dqn.actor_epsilon"),
    "actor.epsilon_alpha": (("apex_dqn", "r2d2"), "apex_dqn.actor_epsilon"),
    "actor.eval_epsilon": (("apex_dqn", "r2d2"), "apex_dqn.actor_epsilon"),
    # IMPALA's and PPO's chunk is one unroll per env (UnrollItems.items_per_chunk)
    "actor.chunk_steps": (("apex_dqn", "r2d2", "sac", "td3", "ddpg", "bc"), "the chunk's steps"),
}


# --- Markdown ---------------------------------------------------------------------------------


def md_cell(text: str) -> str:
    """``text`` safe in a Markdown table cell: ``|`` escaped everywhere, and outside code spans
    ``<``, ``>`` (raw HTML otherwise: ``<run dir>``) and ``*`` (emphasis) too."""
    parts = text.replace("\n", " ").split("`")
    if len(parts) % 2 == 0:  # an unpaired backtick: no code spans at all
        parts = [text.replace("\n", " ").replace("`", "\\`")]
    out = []
    for i, part in enumerate(parts):
        if i % 2 == 0:
            part = part.replace("<", "&lt;").replace(">", "&gt;").replace("*", "\\*")
        out.append(part.replace("|", "\\|"))
    return "`".join(out)


def table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    """A Markdown table (cells already made safe)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def code(text: str) -> str:
    """``text`` as a code span in a table cell (backticks doubled when it holds one)."""
    text = text.replace("|", "\\|")
    return f"`` {text} ``" if "`" in text else f"`{text}`"


# --- config.md: the comments of the dataclasses' fields -------------------------------------


def _comments(source: str) -> tuple[dict[int, str], set[int]]:
    """The comments of ``source`` by line number (1-based), and the lines that hold nothing
    else."""
    comments, alone = {}, set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            line = token.start[0]
            comments[line] = token.string.lstrip("#").strip()
            if not token.line[: token.start[1]].strip():
                alone.add(line)
    return comments, alone


def field_comments(cls: type) -> dict[str, str]:
    """What each field of the dataclass ``cls`` itself declares says, from its comments:

    - the comment on the field's lines (``name: int = 4  # what it is``);
    - the comment lines above it (a block that says more than one line can);
    - comment lines after a field's own comment that go on with it in lowercase (``# of ...``)
      when the next field has a comment of its own.

    Fields without a comment are left out (``describe`` looks in the base classes)."""
    source = textwrap.dedent(inspect.getsource(cls))
    comments, alone = _comments(source)
    body = ast.parse(source).body[0].body
    fields = [
        (node.target.id, node.lineno, node.end_lineno)
        for node in body
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
    ]
    starts = [node.lineno for node in body]  # every statement, ClassVars and methods included
    trailing = {
        name: " ".join(comments[line] for line in range(start, end + 1) if line in comments)
        for name, start, end in fields
    }
    above: dict[str, str] = {}
    for name, start, _end in fields:
        block = []
        line = start - 1
        while line in alone:
            block.insert(0, comments[line])
            line -= 1
        if not block:
            continue
        before = [f for f in fields if f[2] == line]  # the field that ends right above the block
        if (
            before
            and trailing[before[0][0]]
            and trailing[name]
            and block[0][:1].islower()
            and line + 1 not in starts
        ):
            trailing[before[0][0]] += " " + " ".join(block)
        else:
            above[name] = " ".join(block)
    described = {}
    for name, _start, _end in fields:
        pre, own = above.get(name, ""), trailing[name]
        text = f"{pre} ({own})" if pre and own else pre or own
        if text:
            described[name] = text
    return described


def describe(cls: type, name: str) -> str:
    """The comment of field ``name`` of ``cls``, or of the same field in the nearest base class
    that comments it."""
    for base in cls.__mro__:
        if dataclasses.is_dataclass(base) and name in base.__dict__.get("__annotations__", {}):
            text = field_comments(base).get(name)
            if text:
                return text
    return ""


def default_of(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def yaml_value(value: Any) -> str:
    """A default as YAML would write it inline: ``null``, ``true``, ``""``, ``[64, 64]``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '""' if value == "" else value
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(yaml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {yaml_value(v)}" for k, v in value.items()) + "}"
    if dataclasses.is_dataclass(value):
        return yaml_value({f.name: getattr(value, f.name) for f in dataclasses.fields(value)})
    return repr(value)


@dataclasses.dataclass(frozen=True)
class Key:
    """One config key: ``section.key``, its type, default and what it does."""

    key: str
    type: str
    default: Any
    text: str


def section_keys(cls: type, where: str) -> Iterator[tuple[str, type, list[Key]]]:
    """The sections under the dataclass ``cls`` (``where``: its dotted prefix), depth first:
    (prefix, class, its own leaf keys). A tuple of sections (``env.wrappers``) is one key, and
    its items' fields are keys ``env.wrappers[].name``."""
    own: list[Key] = []
    nested = []
    for f in dataclasses.fields(cls):
        key = f"{where}{f.name}"
        kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
        default = default_of(f)
        if dataclasses.is_dataclass(default) and key != "algo":
            nested.append((f"{key}.", type(default)))
            continue
        if key == "algo":
            continue  # one section per family: algo_sections
        own.append(Key(key, kind, default, describe(cls, f.name)))
        item = _tuple_item(cls, f.name)
        if item is not None:
            for sub in dataclasses.fields(item):
                own.append(
                    Key(
                        f"{key}[].{sub.name}",
                        str(sub.type),
                        default_of(sub),
                        describe(item, sub.name),
                    )
                )
    yield where.rstrip("."), cls, own
    for prefix, kind in nested:
        yield from section_keys(kind, prefix)


def _tuple_item(cls: type, name: str) -> type | None:
    """The dataclass of a ``tuple[Section, ...]`` field's items, if it is one."""
    import typing

    hint = typing.get_type_hints(cls)[name]
    if typing.get_origin(hint) is tuple:
        item = typing.get_args(hint)[0]
        if dataclasses.is_dataclass(item):
            return item
    return None


def families_of(key: str) -> str:
    """Which families read a key outside ``algo.*``: ``all``, or those of ``FAMILY_KEYS``."""
    if key in FAMILY_KEYS:
        return ", ".join(FAMILY_KEYS[key][0])
    return "all"


def algo_families() -> dict[str, list[str]]:
    """Every ``algo.*`` key -> the families whose hyperparameter class has it, in
    ``ALGORITHM_CONFIGS`` order."""
    found: dict[str, list[str]] = {}
    for family, cls in ALGORITHM_CONFIGS.items():
        for f in dataclasses.fields(cls):
            found.setdefault(f"algo.{f.name}", []).append(family)
    return found


def _doc(cls: type) -> str:
    """A class's own docstring as one paragraph ("" when it only inherits one)."""
    doc = cls.__dict__.get("__doc__") or ""
    if doc.startswith(f"{cls.__name__}("):  # the dataclass's generated signature
        return ""
    return " ".join(inspect.cleandoc(doc).split()).replace("``", "`")  # reST's code to Markdown's


def config_page() -> str:
    lines = [
        GENERATED,
        "",
        "# Config reference",
        "",
        "Every key of a config, as `section.key` (YAML: `section:` then `key:`; on the command "
        "line `--set section.key=value`), from the typed dataclasses of `apexrl/config/` and, "
        "for `algo.*`, the hyperparameter class of each algorithm family in "
        "`apexrl/config/algos.py`. The type is the field's own (a tuple is a YAML list), "
        "the default is what a config that does not name the key gets, and the text is the "
        "field's comment in the source. *Families* says which algorithm families (`algorithm:`) "
        "read a key: `all`, or the families named. `apexrl config show CONFIG` prints a whole "
        "config with every default filled in.",
        "",
    ]
    for where, cls, keys in section_keys(Config, ""):
        title = where or "top level"
        lines += [f"## {title}", ""]
        if _doc(cls):
            lines += [md_cell(_doc(cls)), ""]
        rows = [
            (
                code(k.key),
                code(k.type),
                code(yaml_value(k.default)),
                families_of(k.key),
                md_cell(k.text),
            )
            for k in keys
        ]
        lines += table(("key", "type", "default", "families", "what it does"), rows) + [""]
    lines += algo_sections()
    return "\n".join(lines).rstrip("\n") + "\n"


def algo_sections() -> list[str]:
    families = algo_families()
    names = list(ALGORITHM_CONFIGS)
    lines = [
        "## algo",
        "",
        "The hyperparameters of the config's algorithm: `algorithm:` picks the class, so each "
        "family reads its own keys with its own defaults (a key of another family is refused by "
        "name). Which families read each key:",
        "",
    ]
    rows = [
        (code(key), "all" if len(found) == len(names) else ", ".join(found))
        for key, found in sorted(families.items())
    ]
    lines += table(("key", "families"), rows) + [""]
    for family, cls in ALGORITHM_CONFIGS.items():
        lines += [f"### algo of {family} ({cls.__name__})", ""]
        if _doc(cls):
            lines += [md_cell(_doc(cls)), ""]
        rows = [
            (
                code(f"algo.{f.name}"),
                code(str(f.type)),
                code(yaml_value(default_of(f))),
                md_cell(describe(cls, f.name)),
            )
            for f in dataclasses.fields(cls)
        ]
        lines += table(("key", "type", "default", "what it does"), rows) + [""]
    return lines


# --- cli.md: the argparse parser ---------------------------------------------------------------


def subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    """A parser's subcommands in the order they were added: (name, help line, parser)."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            found += [(name, helps.get(name, ""), sub) for name, sub in action.choices.items()]
    return found


def walk(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ("apexrl",), help_line: str = ""
) -> Iterator[tuple[tuple[str, ...], str, argparse.ArgumentParser]]:
    """Every command under ``parser``, itself first, depth first: (words, help line, parser)."""
    yield path, help_line, parser
    for name, help_text, sub in subcommands(parser):
        yield from walk(sub, (*path, name), help_text)


def arguments(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The arguments a user gives (no ``--help``, nothing suppressed, no subcommand list)."""
    return [
        a
        for a in parser._actions
        if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))
        and a.help != argparse.SUPPRESS
    ]


def value_name(action: argparse.Action) -> str:
    """The value an argument takes, as argparse's usage shows it (``N``, ``{fork,exec}``)."""
    if action.metavar is not None:
        return action.metavar if isinstance(action.metavar, str) else " ".join(action.metavar)
    if action.choices is not None:
        return "{" + ",".join(map(str, action.choices)) + "}"
    return action.dest if not action.option_strings else action.dest.upper()


def takes_value(action: argparse.Action) -> bool:
    return action.nargs != 0


def with_nargs(action: argparse.Action, name: str) -> str:
    nargs = action.nargs
    if nargs == "?":
        return f"[{name}]"
    if nargs == "*":
        return f"[{name} ...]"
    if nargs == "+":
        return f"{name} [{name} ...]"
    if isinstance(nargs, int) and nargs > 1:
        return " ".join([name] * nargs)
    return name


def usage(path: tuple[str, ...], parser: argparse.ArgumentParser) -> str:
    """One line: ``apexrl sweep [--max-concurrent MAX_CONCURRENT] ... SPEC``."""
    words = list(path)
    for action in arguments(parser):
        if action.option_strings:
            flag = action.option_strings[-1]
            if takes_value(action):
                flag += " " + with_nargs(action, value_name(action))
            if isinstance(action, (argparse._AppendAction, argparse._CountAction)):
                flag += " ..."
            words.append(flag if action.required else f"[{flag}]")
    words += [with_nargs(a, value_name(a)) for a in arguments(parser) if not a.option_strings]
    if subcommands(parser):
        words.append("{" + ",".join(name for name, _, _ in subcommands(parser)) + "} ...")
    return " ".join(words)


def default_text(action: argparse.Action) -> str:
    """An argument's default, where it has one worth showing; this Python's path is named as
    such, not spelled out."""
    value = action.default
    empty = value is None or value is False or value is argparse.SUPPRESS
    if empty or value == [] or value == () or not takes_value(action):
        return ""
    if value == sys.executable:
        return "this Python (`sys.executable`)"
    if isinstance(value, (str, Path)) and str(REPO) in str(value):
        return code(str(value).replace(str(REPO), "<repository>"))
    return code('""' if value == "" else str(value))


def help_text(action: argparse.Action, prog: str) -> str:
    text = action.help or ""
    if "%(" in text:
        params = {**vars(action), "prog": prog, "default": action.default}
        if action.choices is not None:
            params["choices"] = ", ".join(map(str, action.choices))
        text = text % params
    return " ".join(text.split())


def command_section(
    path: tuple[str, ...], help_line: str, parser: argparse.ArgumentParser
) -> list[str]:
    name = " ".join(path)
    lines = [f"## {name}", ""]
    if help_line:
        lines += [md_cell(help_line[:1].upper() + help_line[1:]) + ".", ""]
    lines += ["```text", usage(path, parser), "```", ""]
    if parser.description:
        raw = parser.formatter_class is argparse.RawDescriptionHelpFormatter
        raw = raw and "\n" in parser.description.strip()  # a laid-out text, not one paragraph
        lines += (
            ["```text", parser.description.strip("\n"), "```", ""]
            if raw
            else [md_cell(" ".join(parser.description.split())), ""]
        )
    rows = []
    for action in arguments(parser):
        if action.option_strings:
            shown = ", ".join(action.option_strings)
            if takes_value(action):
                shown += " " + with_nargs(action, value_name(action))
        else:
            shown = with_nargs(action, value_name(action))
        rows.append((code(shown), default_text(action), md_cell(help_text(action, parser.prog))))
    if rows:
        lines += table(("argument", "default", "help"), rows) + [""]
    subs = subcommands(parser)
    if subs:
        rows = [
            (f"[{code(f'{name} {sub}')}](#{slug(f'{name} {sub}')})", md_cell(help_))
            for sub, help_, _ in subs
        ]
        lines += table(("command", "what it does"), rows) + [""]
    if parser.epilog:
        lines += ["```text", parser.epilog.strip("\n"), "```", ""]
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor of a heading made of words, spaces, ``-`` and ``_``."""
    kept = "".join(ch for ch in heading.lower() if ch.isalnum() or ch in "-_ ")
    return kept.replace(" ", "-")


def cli_page(parser: argparse.ArgumentParser) -> str:
    """The CLI reference of ``parser`` (``apexrl.cli.build_parser()``)."""
    lines = [
        GENERATED,
        "",
        "# Command-line reference",
        "",
        "Every `apexrl` command with its arguments, their defaults and their help, from the "
        "argparse parser (`apexrl --help`, `apexrl COMMAND --help`). `--set section.key=value` "
        "takes any key of [the config reference](config.md).",
        "",
    ]
    for path, help_line, sub in walk(parser):
        lines += command_section(path, help_line, sub)
    return "\n".join(lines).rstrip("\n") + "\n"


# --- apexrl docs -------------------------------------------------------------------------------


def render_pages(parser: argparse.ArgumentParser) -> dict[str, str]:
    """Each reference page's name -> its text as the code makes it now; ``parser`` is the
    command line's (``apexrl.cli.build_parser()``, handed over by the CLI: no import circle)."""
    return {"config.md": config_page(), "cli.md": cli_page(parser)}


def stale_pages(directory: Path, pages: dict[str, str]) -> list[Path]:
    """The pages under ``directory`` that are missing or differ from ``pages``."""
    stale = []
    for name, text in pages.items():
        path = Path(directory) / name
        if not path.is_file() or path.read_text() != text:
            stale.append(path)
    return stale


def write_pages(directory: Path, pages: dict[str, str]) -> list[Path]:
    """Write the stale pages; the paths written."""
    stale = stale_pages(directory, pages)
    Path(directory).mkdir(parents=True, exist_ok=True)
    for path in stale:
        path.write_text(pages[path.name])
    return stale


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Write the reference pages config.md (every config key) and cli.md (every command) "
        "from the code; with --check, write nothing and exit 1 naming the pages that are stale."
    )
    parser.add_argument(
        "--check", action="store_true", help="exit 1 naming the stale pages; write nothing"
    )
    parser.add_argument(
        "--dir",
        metavar="DIR",
        help="where the pages are (default: docs/reference of the repository apexrl runs from)",
    )


def main(args: argparse.Namespace) -> int:
    """``apexrl docs``; ``args.build_parser`` is the CLI's parser factory (``apexrl.cli``)."""
    directory = Path(args.dir) if args.dir else DEFAULT_DIR
    pages = render_pages(args.build_parser())
    if args.check:
        stale = stale_pages(directory, pages)
        for path in stale:
            print(f"apexrl docs: {path} is stale; run `apexrl docs`", file=sys.stderr)
        return 1 if stale else 0
    written = write_pages(directory, pages)
    for path in written:
        print(f"wrote {path}")
    if not written:
        print(f"{', '.join(str(directory / name) for name in PAGES)}: up to date")
    return 0
