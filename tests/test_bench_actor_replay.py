"""Smoke tests of the actor and replay throughput benchmarks: each runs for a few seconds with
small sizes, prints a table whose rows are numbers, and leaves no process behind.

Throughput itself is not asserted (wall-clock figures on a shared machine mean little); the
figures and their targets are in ``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from bench_smoke import run_tagged


def run_benchmark(script: str, *args: str) -> list[list[float]]:
    """Run a benchmark; return its table's numeric rows, checking that nothing outlives it."""
    stdout = run_tagged(script, *args)
    rows = []
    for line in stdout.splitlines():
        cells = line.split()
        if not cells:
            continue
        try:
            rows.append([float(cell) for cell in cells])
        except ValueError:
            continue
    assert rows, f"no numeric rows in:\n{stdout}"
    for row in rows:
        assert all(math.isfinite(x) and x >= 0 for x in row), row
    return rows


@pytest.mark.slow  # a benchmark's smoke: CI runs it with the slow tests
@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc")
def test_actor_throughput_prints_a_row_per_env_count() -> None:
    rows = run_benchmark("actor_throughput.py", "--seconds", "2", "--envs", "4")
    assert [row[0] for row in rows] == [4]
    for _envs, vector, sync, actor_env, actor, per_vector, per_actor_env, actor_cpu in rows:
        assert vector > 0 and sync > 0 and actor_env > 0 and actor > 0 and actor_cpu > 0
        assert per_vector == pytest.approx(actor / vector, abs=0.001)
        assert per_actor_env == pytest.approx(actor / actor_env, abs=0.001)


@pytest.mark.slow  # a benchmark's smoke: CI runs it with the slow tests
@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc")
def test_replay_throughput_prints_a_row_per_chunk_size() -> None:
    rows = run_benchmark(
        "replay_throughput.py",
        *("--seconds", "2", "--chunks", "64", "--clients", "2", "--capacity", "100000"),
    )
    assert len(rows) == 1
    chunk, item_bytes, push_pull, _, inserts, _, ratio, cpu, per_cpu_s = rows[0][:9]
    inserts_sampling, batches, sampling_cpu = rows[0][9:]
    assert chunk == 64 and item_bytes > 0
    assert push_pull > 0 and inserts > 0 and inserts_sampling > 0 and batches > 0
    assert cpu > 0 and sampling_cpu > 0
    assert per_cpu_s == pytest.approx(inserts / cpu, rel=0.01)
    assert ratio == pytest.approx(inserts / push_pull, abs=0.01)
