"""Smoke tests of ``benchmarks/chaos_run.py`` and ``benchmarks/soak_run.py``: each runs the launcher
briefly (45 s of kills every 7-9 s; 45 s of samples every 15 s), so the benchmarks cannot rot. Each
must exit 0, print its tables and leave no process of its run behind (whatever happens, the test
SIGKILLs what is left of the run afterwards, found by its run directory on the command line)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from bench_smoke import scratch_env
from conftest import REPO
from test_launch_local import run_processes

CHAOS = REPO / "benchmarks" / "chaos_run.py"
SOAK = REPO / "benchmarks" / "soak_run.py"
HANG_BOUND_S = 300  # a hang bound, not a speed check


def run_benchmark(argv: list[str], run_dir: Path) -> subprocess.CompletedProcess:
    """Run a benchmark to its end; afterwards nothing of its run may be there (and is killed)."""
    try:
        with scratch_env() as env:
            proc = subprocess.run(
                [sys.executable, *argv, "--run-dir", str(run_dir)],
                cwd=REPO,
                capture_output=True,
                text=True,
                timeout=HANG_BOUND_S,
                env=env,
            )
    finally:
        left = run_processes(str(run_dir))
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert not left, f"processes of the run left: {left}"
    return proc


def lines_after(lines: list[str], starts: str) -> list[str]:
    """The lines after the first one that starts with ``starts``, up to the next empty one."""
    first = next(i for i, line in enumerate(lines) if line.startswith(starts))
    rows = []
    for line in lines[first + 1 :]:
        if not line.strip():
            break
        rows.append(line)
    return rows


@pytest.mark.slow  # about 70 s: a launched run, roles killed and restarted
def test_chaos_run_prints_every_kill_and_leaves_nothing(tmp_path: Path) -> None:
    argv = [str(CHAOS), "--chaos-minutes", "0.75", "--kill-every", "7", "9"]
    argv += ["--after-minutes", "1", "--target", "30", "--actors", "1"]
    proc = run_benchmark(argv, tmp_path / "run")
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    lines = proc.stdout.splitlines()
    kills = lines_after(lines, "Kills (")[1:]  # below the column names
    assert len(kills) >= 3, output
    for row in kills:
        at_s, role, pid, back_s = row.split()[:4]
        assert float(at_s) >= 0 and int(pid) > 0, row
        assert role in ("replay", "params", "learner", "actor_0", "eval"), row
        assert back_s != "not", f"a killed role never came back: {row}\n{output}"
    per_role = lines_after(lines, "Per role")[1:]
    assert [row.split()[0] for row in per_role] == ["replay", "params", "learner", "actor", "eval"]
    assert sum(int(row.split()[1]) for row in per_role) == len(kills), output
    assert any(line.startswith("  after the chaos: ") for line in lines), output
    assert any("lost (the more of the two)" in line for line in lines), output
    assert "launcher exit status after `apexrl stop`: 0" in lines, output
    assert any(line.endswith("left after the stop: none") for line in lines), output
    assert lines[-1] == "RESULT: ok", output


@pytest.mark.slow  # about 70 s: a launched run sampled every 15 s
def test_soak_run_prints_its_samples_and_summary_and_leaves_nothing(tmp_path: Path) -> None:
    argv = [str(SOAK), "--minutes", "0.75", "--interval", "15", "--actors", "2"]
    argv += ["--baseline-minutes", "0.25"]
    proc = run_benchmark(argv, tmp_path / "run")
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    lines = proc.stdout.splitlines()
    memory = lines_after(lines, "Memory (")
    header, rows = memory[0].split(), [row.split() for row in memory[1:]]
    assert header[:4] == ["min", "procs", "RSS", "PSS"], output
    assert {"replay", "params", "learner", "actors", "eval"} <= set(header), output
    assert len(rows) >= 3, output
    for row in rows:
        minute, procs, rss, pss = map(float, row[:4])
        assert procs >= 6 and rss > pss > 0, row  # 2 actors, eval, learner, 2 servers at least
    disk = lines_after(lines, "Descriptors (")
    parts = disk[0].split()[3:]
    assert {"logs", "tb", "checkpoints", "keys", "replay_chunk_log"} <= set(parts), output
    assert len(disk) == len(memory), output
    assert any(line.startswith("  run RSS: ") for line in lines), output
    assert any(line.startswith("  run PSS: ") for line in lines), output
    assert any(line.startswith("  descriptors: ") for line in lines), output
    assert any(line.strip().startswith("logs ") and "MB/h" in line for line in lines), output
    assert "launcher exit status after `apexrl stop`: 0" in lines, output
    assert "processes of the run left: none" in lines, output
    assert lines[-1] == "RESULT: ok", output
