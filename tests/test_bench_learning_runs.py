"""Smoke test of ``benchmarks/learning_runs.py``: one short PPO run capped at a few thousand env
steps, so the benchmark cannot rot. It must exit 0, print the run's row from its own
``result.json`` (the run stops on the step cap, so it is not counted as solved) and the median
line."""

from __future__ import annotations

import subprocess
import sys

from bench_smoke import scratch_env
from conftest import REPO

BENCH = REPO / "benchmarks" / "learning_runs.py"


def test_learning_runs_prints_a_row_per_run_from_the_runs_results() -> None:
    with scratch_env() as env:
        proc = subprocess.run(
            [sys.executable, str(BENCH), "--runs", "1", "--configs", "ppo_cartpole"]
            + ["--actors", "1", "--set", "run.stop_env_steps=2000", "--set", "algo.epochs=2"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=300,  # a hang bound, not a speed check
            env=env,
        )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    rows = [line.split() for line in proc.stdout.splitlines() if line.startswith("ppo_cartpole ")]
    (row,) = [r for r in rows if r[1].isdigit()]  # not the median line
    config, run, code, wall_s, env_steps, _eval_mean, _window, solved = row
    assert (config, run, code, solved) == ("ppo_cartpole", "1", "0", "False"), output
    assert float(wall_s) > 0 and int(env_steps) >= 2000, output
    assert "ppo_cartpole         solved 0/1" in proc.stdout, output
