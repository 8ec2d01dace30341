"""Smoke test of ``benchmarks/scaling_footprint.py``: 1 and 2 forked actors and 1 exec'd actor,
five seconds each, so the benchmark cannot rot. It must exit 0, print one row of numbers per point,
and leave no process of its runs behind."""

from __future__ import annotations

import subprocess
import sys

import pytest
from bench_smoke import scratch_env
from conftest import REPO
from test_launch_local import run_processes

BENCH = REPO / "benchmarks" / "scaling_footprint.py"


@pytest.mark.slow  # about 30 s: whole runs with the launcher
def test_scaling_benchmark_prints_a_row_of_numbers_per_point() -> None:
    with scratch_env() as env:
        proc = subprocess.run(
            [sys.executable, str(BENCH), "--actors", "1", "2", "--window-s", "5"]
            + ["--baseline-actors", "1"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=600,  # a hang bound, not a speed check
            env=env,
        )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    lines = proc.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["actors", "start"])
    rows = [line.split() for line in lines[header + 1 :] if line.split()[:1] != ["(logs"]]
    assert [(r[0], r[1]) for r in rows] == [("1", "fork"), ("2", "fork"), ("1", "exec")], output
    for row in rows:
        start_s, cpu_s, env_steps, vs_best, updates, uss, uss_max, pss, run_pss = map(
            float, row[3:12]
        )
        assert 0 < start_s and cpu_s > 0 and env_steps > 0 and 0 < vs_best and updates > 0, row
        assert 0 < uss <= uss_max and pss > 0 and run_pss > pss, row
        assert row[12] == "0", f"processes left behind: {row}"
    workdir = lines[-1].removeprefix("(logs in ").removesuffix(")")
    assert workdir.startswith("/") and not run_processes(workdir), output
