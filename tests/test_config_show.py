"""``apexrl config show CONFIG [--set ...]`` prints the whole resolved config, every key with its
default filled in, as YAML that ``load_config`` reads back to the same ``Config``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO

from apexrl.config import config_keys, load_config
from apexrl.config.algos import PPOConfig
from apexrl.tools.config_show import show

CONFIGS = sorted((REPO / "configs").glob("*.yaml"))


def flat_keys(tree: dict, where: str = "") -> set[str]:
    """The dotted keys of a YAML mapping, down to the leaves (lists are leaves)."""
    keys = set()
    for key, value in tree.items():
        if isinstance(value, dict) and key not in ("kwargs",):
            keys |= flat_keys(value, f"{where}{key}.")
        else:
            keys.add(f"{where}{key}")
    return keys


@pytest.mark.parametrize("config", [None, *CONFIGS], ids=lambda p: p.name if p else "defaults")
def test_the_shown_config_reads_back_to_the_same_config(
    config: Path | None, tmp_path: Path
) -> None:
    cfg = load_config(config)
    path = tmp_path / "shown.yaml"
    path.write_text(show(str(config) if config else None, []))
    assert load_config(path) == cfg
    assert flat_keys(yaml.safe_load(path.read_text())) == set(config_keys(type(cfg.algo)))


def run_show(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "apexrl", "config", "show", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_config_show_with_overrides_from_the_command_line(tmp_path: Path) -> None:
    overrides = ["algo.lr=0.002", "env.num_envs=3", "run.stop_eval_return=null"]
    done = run_show("configs/ppo_cartpole.yaml", *(f"--set={o}" for o in overrides))
    assert done.returncode == 0, done.stderr
    shown = yaml.safe_load(done.stdout)
    assert shown["algorithm"] == "ppo"
    assert shown["algo"]["lr"] == 0.002 and shown["env"]["num_envs"] == 3
    assert shown["run"]["stop_eval_return"] is None
    assert shown["algo"]["gamma"] == 0.98  # the file's value
    assert shown["algo"]["lstm_size"] == 0  # a default the file does not name
    assert flat_keys(shown) == set(config_keys(PPOConfig))
    (tmp_path / "shown.yaml").write_text(done.stdout)
    expected = load_config(REPO / "configs" / "ppo_cartpole.yaml", overrides)
    assert load_config(tmp_path / "shown.yaml") == expected


def test_config_show_refuses_a_bad_key_in_one_line() -> None:
    done = run_show("configs/ppo_cartpole.yaml", "--set", "replay.capasity=10")
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        "apexrl config show: config error: unknown config key 'replay.capasity'; "
        "did you mean 'replay.capacity'?"
    ]
