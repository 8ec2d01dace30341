"""Smoke test of the learner scaling benchmark: one and two real learners for a few seconds each
against a filled replay server; a row per learner count, nothing left behind."""

from __future__ import annotations

import pytest
from bench_smoke import run_tagged


@pytest.mark.slow  # a benchmark's smoke (about 20 s): CI runs it with the slow tests
def test_learner_scaling_prints_a_row_per_learner_count() -> None:
    stdout = run_tagged("learner_scaling.py", "--seconds", "3", "--batch-size", "32", timeout_s=300)
    rows = {}
    for line in stdout.splitlines():
        cells = line.split()
        if len(cells) == 5 and cells[0].isdigit():
            learners, updates, samples, ratio = int(cells[0]), *map(float, cells[1:4])
            rows[learners] = (updates, samples, ratio)
    assert sorted(rows) == [1, 2], stdout
    for updates, samples, _ratio in rows.values():
        assert updates > 0 and samples > 0
    assert rows[1][2] == 1.0
