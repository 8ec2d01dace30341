"""Smoke test of ``benchmarks/multiagent_vs_sb3.py``: each system trains on simple_spread for a
few seconds and plays 4 greedy episodes, so the benchmark cannot rot. It must exit 0, leave no
process behind, print the system's row and write its numbers (env steps counted as steps of the
parallel env, every episode's team return). The table's arithmetic is checked on hand-made rows.

The stable-baselines3 side needs ``pip install -e .[bench]`` (stable-baselines3, SuperSuit); the
apexrl sides need their configs. Without them those smoke tests are skipped.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from bench_smoke import run_tagged
from conftest import REPO

BENCHMARK = REPO / "benchmarks" / "multiagent_vs_sb3.py"
HAS_SB3 = all(importlib.util.find_spec(m) is not None for m in ("stable_baselines3", "supersuit"))
CONFIGS = {
    "apexrl_ppo": REPO / "configs" / "ppo_simple_spread.yaml",
    "apexrl_impala": REPO / "configs" / "impala_simple_spread.yaml",
}


def load_benchmark():
    spec = importlib.util.spec_from_file_location("multiagent_vs_sb3", BENCHMARK)
    module = importlib.util.module_from_spec(spec)
    sys.modules["multiagent_vs_sb3"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow  # a benchmark's smoke (about 10 s a system): CI runs it with the slow tests
@pytest.mark.parametrize("system", ["sb3", "apexrl_ppo"])  # IMPALA's side: the same code
def test_a_short_run_prints_its_row_and_writes_its_returns(system: str, tmp_path: Path) -> None:
    if system == "sb3" and not HAS_SB3:
        pytest.skip("stable-baselines3 or SuperSuit is not installed (pip install -e .[bench])")
    if system in CONFIGS and not CONFIGS[system].is_file():
        pytest.skip(f"no {CONFIGS[system].relative_to(REPO)}")
    args = ["--wall-s", "4", "--episodes", "4", "--which", system, "--workdir", str(tmp_path)]
    stdout = run_tagged("multiagent_vs_sb3.py", *args, timeout_s=300)
    row = json.loads((tmp_path / f"{system}.json").read_text())
    assert len(row["team_returns"]) == 4, row
    # simple_spread's rewards are negative distances and collisions: every team return is < 0
    assert all(-1000 < r < 0 for r in row["team_returns"]), row
    assert row["env_steps"] > 0 and row["wall_s"] >= 4, row
    if system == "sb3":
        # whole model.learn calls of 4 rollouts of 128 steps of 24 rows (8 envs x 3 agents)
        assert (row["env_steps"] * 3) % (4 * 128 * 24) == 0, row
        assert row["torch_threads"] == 1, row
    names = load_benchmark().NAMES
    (line,) = [line for line in stdout.splitlines() if line.startswith(names[system] + " ")]
    assert f" {row['env_steps']} " in line, stdout


def test_the_table_shows_team_and_per_agent_returns(capsys: pytest.CaptureFixture[str]) -> None:
    bench = load_benchmark()
    sb3 = {
        "wall_s": 900.2,
        "env_steps": 2_100_000,
        "team_returns": [-50.0, -60.0],
        "torch_threads": 1,
        "settings": {"n_steps": 128},
    }
    ppo = {
        "wall_s": 900.0,
        "launcher_s": 910.0,
        "env_steps": 3_000_000,
        "team_returns": [-30.0, -33.0],
        "run_eval_return": -31.4,
        "run_eval_episodes": 20,
        "run_eval_weights_version": 7,
        "config": "configs/ppo_simple_spread.yaml",
        "run_dir": "/tmp/run",
    }
    bench.report({"sb3": sb3, "apexrl_ppo": ppo})
    out = capsys.readouterr().out
    rows = {line[:36].strip(): line[36:].split() for line in out.splitlines()}
    # mean of -50 and -60 = -55, std 5, per agent -55 / 3 = -18.3
    sb3_row = ["900", "2100000", "-55.0", "±", "5.0", "-18.3"]
    assert rows["stable-baselines3 PPO + SuperSuit"] == sb3_row, out
    assert "6300000 agent steps" in out  # 3 x 2.1 M env steps
    assert rows["apexrl PPO"] == ["900", "3000000", "-31.5", "±", "1.5", "-10.5", "-31.4"]
    assert rows["random actions"] == ["-82.2", f"{-82.2 / 3:.1f}"]
    assert rows["scripted landmark assignment"] == ["-23.7", "-7.9"]
