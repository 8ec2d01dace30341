"""The reference pages docs/reference/config.md and cli.md are what ``apexrl docs`` makes from
the code now (regenerated in memory and compared), and they hold every config key and every
subcommand with its flags; ``apexrl docs --check`` names the stale ones."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import REPO

from apexrl.cli import build_parser
from apexrl.config import config_keys
from apexrl.config.algos import ALGORITHM_CONFIGS, ImpalaConfig, PPOConfig
from apexrl.tools import reference

PAGES_DIR = REPO / "docs" / "reference"


@pytest.fixture(scope="module")
def pages() -> dict[str, str]:
    return reference.render_pages(build_parser())


def test_the_reference_pages_are_up_to_date(pages: dict[str, str]) -> None:
    stale = reference.stale_pages(PAGES_DIR, pages)
    assert not stale, (
        f"stale reference pages: {', '.join(str(p.relative_to(REPO)) for p in stale)}; "
        "run `apexrl docs` and commit them"
    )


def family_section(page: str, family: str) -> str:
    """The part of config.md about ``family``'s algo section."""
    start = page.index(f"### algo of {family} (")
    end = page.find("\n### ", start + 1)
    return page[start : end if end >= 0 else len(page)]


def test_every_config_key_of_every_family_is_on_the_config_page(pages: dict[str, str]) -> None:
    page = pages["config.md"]
    for family, cls in ALGORITHM_CONFIGS.items():
        for key in config_keys(cls):
            assert f"| `{key}` |" in page, f"{key} ({family}) is not on config.md"
        section = family_section(page, family)
        for f in dataclasses.fields(cls):
            assert f"| `algo.{f.name}` |" in section, f"algo.{f.name} not under {family}"


def algo_index(page: str) -> dict[str, str]:
    """config.md's table of which families read each algo key."""
    start = page.index("| key | families |")
    rows = {}
    for line in page[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        key, families = (cell.strip() for cell in line.strip("|").split("|"))
        rows[key.strip("`")] = families
    return rows


def test_the_families_of_algo_keys(pages: dict[str, str]) -> None:
    index = algo_index(pages["config.md"])
    assert index["algo.gamma"] == "apex_dqn, r2d2, impala, ppo, sac, td3, ddpg"  # not bc
    assert index["algo.hidden_sizes"] == "all"
    assert index["algo.clip_ratio"] == "impala"
    assert index["algo.policy_delay"] == "sac, td3, ddpg"
    assert index["algo.lstm_size"] == "r2d2, impala, ppo"
    assert index["algo.lr"] == "apex_dqn, r2d2, impala, ppo, bc"
    every = {
        f"algo.{f.name}" for cls in ALGORITHM_CONFIGS.values() for f in dataclasses.fields(cls)
    }
    assert set(index) == every


def test_a_family_key_shows_that_familys_default(pages: dict[str, str]) -> None:
    page = pages["config.md"]
    assert "| `algo.gamma` | `float` | `0.997` |" in family_section(page, "r2d2")
    assert "| `algo.gamma` | `float` | `0.99` |" in family_section(page, "ppo")
    assert "| `algo.policy_delay` | `int` | `1` |" in family_section(page, "ddpg")
    assert "| `algo.policy_delay` | `int` | `2` |" in family_section(page, "td3")


def readers_of(attribute: str) -> set[str]:
    """The modules of apexrl that read ``<x>.actor.<attribute>``."""
    found = set()
    for path in (REPO / "apexrl").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and node.attr == attribute
                and isinstance(node.value, ast.Attribute)
                and node.value.attr == "actor"
            ):
                found.add(path.relative_to(REPO).as_posix())
    return found


def test_the_family_specific_keys_outside_algo() -> None:
    """actor.epsilon and its kin are read by apex_dqn.actor_epsilon alone, which only the two
    Q-learners call; IMPALA's and PPO's chunk is an unroll, whatever actor.chunk_steps says."""
    for key in ("epsilon", "epsilon_alpha", "eval_epsilon"):
        assert readers_of(key) == {"apexrl/algos/apex_dqn.py"}, key
        assert reference.FAMILY_KEYS[f"actor.{key}"][0] == ("apex_dqn", "r2d2")
    callers = {
        path.name
        for path in (REPO / "apexrl").rglob("*.py")
        if re.search(r"\bactor_epsilon\(", path.read_text())
    }
    assert callers == {"apex_dqn.py", "r2d2.py"}
    for cls in (ImpalaConfig, PPOConfig):
        algo = cls()
        assert algo.items_per_chunk(1, 8) == algo.items_per_chunk(64, 8)
        assert algo.max_env_steps_per_chunk(1, 8) == algo.max_env_steps_per_chunk(64, 8)
    assert "impala" not in reference.FAMILY_KEYS["actor.chunk_steps"][0]
    assert "ppo" not in reference.FAMILY_KEYS["actor.chunk_steps"][0]
    for family in reference.FAMILY_KEYS["actor.chunk_steps"][0]:
        algo = ALGORITHM_CONFIGS[family]()
        assert algo.items_per_chunk(1, 8) != algo.items_per_chunk(64, 8), family


def test_every_subcommand_and_flag_is_on_the_cli_page(pages: dict[str, str]) -> None:
    page = pages["cli.md"]
    commands = list(reference.walk(build_parser()))
    names = {" ".join(path) for path, _, _ in commands}
    assert {"apexrl local", "apexrl actor", "apexrl docs", "apexrl config show"} <= names
    for path, _help, parser in commands:
        name = " ".join(path)
        start = page.index(f"\n## {name}\n")
        end = page.find("\n## ", start + 1)
        section = page[start : end if end >= 0 else len(page)]
        for action in reference.arguments(parser):
            for flag in action.option_strings:
                assert f"`{flag}" in section or f", {flag}" in section, f"{name} {flag}"
            if not action.option_strings:
                assert reference.value_name(action) in section, f"{name} {action.dest}"


def test_a_subcommand_added_to_the_parser_is_on_the_page() -> None:
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    new = commands.add_parser("gateway", help="an env stepped outside apexrl")
    new.add_argument("--gateway", default="tcp://0.0.0.0:7000", help="where envs connect")
    page = reference.cli_page(parser)
    assert "\n## apexrl gateway\n" in page
    assert "[`apexrl gateway`](#apexrl-gateway)" in page
    assert "| `--gateway GATEWAY` | `tcp://0.0.0.0:7000` | where envs connect |" in page


def test_docs_check_names_the_stale_pages(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    args = argparse.Namespace(check=True, dir=str(tmp_path), build_parser=build_parser)
    assert reference.main(args) == 1
    err = capsys.readouterr().err
    assert "config.md is stale" in err and "cli.md is stale" in err
    assert not list(tmp_path.iterdir())  # --check writes nothing
    assert (
        reference.main(
            argparse.Namespace(check=False, dir=str(tmp_path), build_parser=build_parser)
        )
        == 0
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cli.md", "config.md"]
    assert reference.main(args) == 0
    (tmp_path / "cli.md").write_text((tmp_path / "cli.md").read_text() + "an edit by hand\n")
    capsys.readouterr()
    assert reference.main(args) == 1
    err = capsys.readouterr().err
    assert "cli.md is stale" in err and "config.md" not in err


def test_apexrl_docs_check_from_the_command_line(tmp_path: Path) -> None:
    (tmp_path / "config.md").write_text("old\n")
    done = subprocess.run(
        [sys.executable, "-m", "apexrl", "docs", "--check", "--dir", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr
    assert f"{tmp_path / 'config.md'} is stale" in done.stderr
    assert f"{tmp_path / 'cli.md'} is stale" in done.stderr


@dataclass(frozen=True)
class Commented:
    """A dataclass with each kind of comment ``field_comments`` reads."""

    plain: int = 1  # its own line's comment
    # A block above a field
    # that goes on.
    blocked: int = 2
    wrapped: str = "x"  # a comment inside the value's parentheses
    followed: bool = False  # a comment that
    # goes on below it in lowercase
    next_one: float = 0.5  # the next field's own
    # An upper-case block is the next field's
    after: int = 3  # its own
    bare: int = 4


@dataclass(frozen=True)
class Derived(Commented):
    bare: int = 5
    plain: int = 6


def test_field_comments() -> None:
    assert reference.field_comments(Commented) == {
        "plain": "its own line's comment",
        "blocked": "A block above a field that goes on.",
        "wrapped": "a comment inside the value's parentheses",
        "followed": "a comment that goes on below it in lowercase",
        "next_one": "the next field's own",
        "after": "An upper-case block is the next field's (its own)",
    }
    assert reference.describe(Derived, "plain") == "its own line's comment"  # from the base
    assert reference.describe(Derived, "bare") == ""


def test_markdown_cells() -> None:
    assert reference.md_cell("a|b <run dir> `x|<y>` 2*3") == r"a\|b &lt;run dir&gt; `x\|<y>` 2\*3"
    assert reference.yaml_value((64, 64)) == "[64, 64]"
    assert reference.yaml_value(None) == "null"
    assert reference.yaml_value("") == '""'
    assert reference.yaml_value({"size": 7}) == "{size: 7}"
