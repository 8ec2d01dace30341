"""Smoke test of ``benchmarks/end_to_end.py``: its ``--smoke`` mode runs each system once for a few
seconds under a cap, so the harness cannot rot. It checks that the table has a row per system and
criterion with real numbers in it, and that no process the benchmark started is left behind. The
table's verdicts (solved rule, medians, the apexrl / PPO ratio) are checked on hand-made runs.

The stable-baselines3 rows need ``pip install -e .[bench]``; without it they are skipped and the
apexrl row is still checked.
"""

from __future__ import annotations

import importlib.util
import math
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BENCHMARK = REPO / "benchmarks" / "end_to_end.py"
HAS_SB3 = importlib.util.find_spec("stable_baselines3") is not None

# system, criterion, met "k/n", median ("unsolved" if not met), run time, env steps ('>': not met)
ROW = re.compile(
    r"^(apexrl|ppo|dqn)\s+(train100|eval5|eval100)\s+(\d+)/(\d+)\s+(unsolved|\d+\.\d)\s+"
    r"(>?)(\d+\.\d)\s+>?(\d+)\s*$"
)


def load_benchmark():
    spec = importlib.util.spec_from_file_location("end_to_end", BENCHMARK)
    module = importlib.util.module_from_spec(spec)
    sys.modules["end_to_end"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def processes_mentioning(text: str) -> list[str]:
    """Command lines of live processes (other than ps itself) that contain ``text``."""
    out = subprocess.run(["ps", "-ww", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines()[1:] if text in line and " ps -ww -eo" not in line]


def run_smoke(systems: list[str], workdir: Path) -> tuple[dict[tuple[str, str], re.Match], str]:
    proc = subprocess.run(
        [
            sys.executable,
            str(BENCHMARK),
            "--smoke",
            "--systems",
            *systems,
            "--workdir",
            str(workdir),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {}
    for line in proc.stdout.splitlines():
        match = ROW.match(line)
        if match:
            rows[match.group(1, 2)] = match
    # Every process the benchmark started had the work directory in its command line.
    leftover = []
    for _ in range(20):  # a killed process may take a moment to leave the table
        leftover = processes_mentioning(str(workdir))
        if not leftover:
            break
        time.sleep(0.5)
    assert leftover == [], leftover
    return rows, proc.stdout


def check_row(row: re.Match) -> None:
    met, num_runs, median_s, unmet_mark, run_s, env_steps = row.group(3, 4, 5, 6, 7, 8)
    assert int(num_runs) == 1 and int(met) in (0, 1)
    assert float(run_s) > 0
    assert (unmet_mark == ">") == (met == "0")
    assert median_s == ("unsolved" if met == "0" else run_s)
    assert int(env_steps) > 0  # it trained: steps came from its result, not a placeholder


def test_smoke_apexrl(tmp_path: Path) -> None:
    rows, out = run_smoke(["apexrl"], tmp_path)
    assert sorted(rows) == [("apexrl", "eval100")], out
    check_row(rows["apexrl", "eval100"])
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert (run_dir / "result.json").is_file()
    assert re.search(r"^  apexrl\s+\d+\.\d$", out, re.MULTILINE), out  # its load at the start


def test_smoke_stable_baselines3(tmp_path: Path) -> None:
    if not HAS_SB3:
        pytest.skip("stable-baselines3 is not installed (pip install -e .[bench])")
    rows, out = run_smoke(["ppo", "dqn"], tmp_path)
    criteria = ["eval100", "eval5", "train100"]
    assert sorted(rows) == [(s, c) for s in ("dqn", "ppo") for c in criteria], out
    for row in rows.values():
        check_row(row)
    assert "apexrl median" not in out  # no ratio without apexrl


def test_solved_rule_and_ratio(capsys: pytest.CaptureFixture[str]) -> None:
    bench = load_benchmark()
    done = {
        "done": True,
        "eval_return_mean": 480.0,
        "env_steps": 1000,
        "eval_episodes_in_window": 100,
        "eval_weights_version": 12,
    }
    assert bench.apexrl_solved(0, done)
    assert not bench.apexrl_solved(0, {**done, "eval_episodes_in_window": 99})
    assert not bench.apexrl_solved(0, {**done, "eval_weights_version": -1})  # mixed versions
    assert not bench.apexrl_solved(None, done)  # stopped at the cap
    assert not bench.apexrl_solved(1, done)
    assert not bench.apexrl_solved(0, {**done, "done": False})
    assert not bench.apexrl_solved(0, {**done, "eval_return_mean": 474.9})
    assert not bench.apexrl_solved(0, {**done, "eval_return_mean": None})
    assert bench.mean_at_least([475.0] * 100, 100, 475.0)
    assert not bench.mean_at_least([500.0] * 99, 100, 475.0)  # the window is not full

    def run(system: str, index: int, met: dict[str, float]) -> object:
        milestones = {c: bench.Milestone(s, 100) for c, s in met.items()}
        all_met = set(met) == set(bench.SYSTEM_CRITERIA[system])
        return bench.Run(
            system=system,
            index=index,
            wall_s=99.0,
            met=milestones,
            env_steps=100,
            eval_return_mean=None,
            train_return_mean=None,
            exit_code=0 if all_met else None,
            ending="done" if all_met else "cap",
            load_1m=1.5,
            log="",
        )

    runs = [
        run("apexrl", 0, {"eval100": 30.0}),
        run("ppo", 0, {"train100": 10.0, "eval5": 5.0, "eval100": 8.0}),
        run("apexrl", 1, {}),  # never solved: counts as infinite
        run("ppo", 1, {"train100": 20.0, "eval5": 6.0}),
        run("apexrl", 2, {"eval100": 60.0}),
        run("ppo", 2, {"train100": 30.0, "eval5": 7.0, "eval100": 9.0}),
    ]
    assert bench.median_s(runs[0::2], "eval100") == 60.0
    assert bench.median_s(runs[1::2], "eval100") == 9.0
    assert math.isinf(bench.median_s(runs[2:3], "eval100"))
    bench.print_table(runs, ["apexrl", "ppo"])
    out = capsys.readouterr().out
    # median of 30, 60, inf = 60; PPO train100 median of 10, 20, 30 = 20; 60 / 20 = 3.00
    assert "apexrl median / PPO rolling-100 (train100) median: 60.0 s / 20.0 s = 3.00" in out
    assert "ppo run 1: stopped at the wall-time cap, not met: eval100" in out
