"""Smoke test of ``benchmarks/end_to_end.py``: its ``--smoke`` mode runs each system once for a few
seconds under a cap, so the harness cannot rot. It checks that the table has a row per system with
real numbers in it, and that no process the benchmark started is left behind.

The stable-baselines3 rows need ``pip install -e .[bench]``; without it they are skipped and the
apexrl row is still checked.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BENCHMARK = REPO / "benchmarks" / "end_to_end.py"
HAS_SB3 = importlib.util.find_spec("stable_baselines3") is not None

# system, solved "k/n", median (">" if unsolved), run times, env steps per run
ROW = re.compile(r"^(apexrl|ppo|dqn)\s+(\d+)/(\d+)\s+(unsolved|\d+\.\d)\s+>?(\d+\.\d)\s+(\d+)\s*$")


def processes_mentioning(text: str) -> list[str]:
    """Command lines of live processes (other than ps itself) that contain ``text``."""
    out = subprocess.run(["ps", "-ww", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines()[1:] if text in line and " ps -ww -eo" not in line]


def run_smoke(systems: list[str], workdir: Path) -> dict[str, re.Match]:
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
            rows[match.group(1)] = match
    assert sorted(rows) == sorted(systems), proc.stdout
    # Every process the benchmark started had the work directory in its command line.
    leftover = []
    for _ in range(20):  # a killed process may take a moment to leave the table
        leftover = processes_mentioning(str(workdir))
        if not leftover:
            break
        time.sleep(0.5)
    assert leftover == [], leftover
    return rows


def check_row(row: re.Match) -> None:
    solved, num_runs, median_s, run_s, env_steps = row.group(2, 3, 4, 5, 6)
    assert int(num_runs) == 1 and int(solved) in (0, 1)
    assert float(run_s) > 0
    assert median_s == ("unsolved" if solved == "0" else run_s)
    assert int(env_steps) > 0  # it trained: steps came from its result, not a placeholder


def test_smoke_apexrl(tmp_path: Path) -> None:
    rows = run_smoke(["apexrl"], tmp_path)
    check_row(rows["apexrl"])
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert (run_dir / "result.json").is_file()


def test_smoke_stable_baselines3(tmp_path: Path) -> None:
    if not HAS_SB3:
        pytest.skip("stable-baselines3 is not installed (pip install -e .[bench])")
    rows = run_smoke(["ppo", "dqn"], tmp_path)
    check_row(rows["ppo"])
    check_row(rows["dqn"])
