"""The command line as a user reads it: every ``--set`` example that ``--help`` or the README shows
must be a valid override, and ``--help`` works for every role."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from conftest import CONFIG, REPO

from apexrl.config import ConfigError, load_config

ROLES = ("replay", "params", "learner", "actor", "local", "stop")
# "--set algo.lr=1e-4" and "e.g. algo.lr=1e-4" (the --set option's own help line)
EXAMPLE = re.compile(r"(?:--set\s+|e\.g\.\s+)([a-z_]+(?:\.[a-z_]+)+=[^\s,)`;]+)")


def help_text(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "apexrl", *args, "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


FAMILY_CONFIGS = [
    REPO / "configs" / f"{family}_cartpole.yaml" for family in ("r2d2", "impala", "ppo")
]


def test_every_override_example_in_help_and_readme_is_valid() -> None:
    texts = {"apexrl --help": help_text()}
    texts.update({f"apexrl {role} --help": help_text(role) for role in ROLES})
    texts["README.md"] = (REPO / "README.md").read_text()
    examples = {(where, m) for where, text in texts.items() for m in EXAMPLE.findall(text)}
    assert {w for w, _ in examples} >= {"apexrl learner --help", "README.md"}, examples
    for where, example in sorted(examples):
        if example.startswith("section.key="):
            continue  # the syntax itself, not an example
        refusals = []
        for config in (CONFIG, *FAMILY_CONFIGS):  # a family's own key is valid in its config
            try:
                load_config(config, [example])
                break
            except ConfigError as exc:
                refusals.append(str(exc))
        else:
            pytest.fail(f"{where} shows --set {example}, which is refused: {refusals[0]}")


@pytest.mark.parametrize(
    "override, suggestion",
    [
        ("learner.lr=1e-4", "algo.lr"),
        ("actor.gamma=0.9", "algo.gamma"),
        ("lr=1e-4", "algo.lr"),
        ("learner.n_stp=3", "algo.n_step"),
        ("replay.capasity=10", "replay.capacity"),
    ],
)
def test_a_key_in_the_wrong_section_suggests_the_full_right_key(
    override: str, suggestion: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "apexrl", "replay", "--config", str(CONFIG), "--set", override],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    key = override.split("=")[0]
    assert f"unknown config key '{key}'; did you mean '{suggestion}'?" in done.stderr
