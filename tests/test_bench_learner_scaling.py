"""Smoke test of the learner scaling benchmark: one and two real learners for a few seconds each
against a filled replay server; a row per learner count, nothing left behind."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

from test_bench_actor_replay import REPO, TAG, processes_with_tag


def test_learner_scaling_prints_a_row_per_learner_count() -> None:
    tag = uuid.uuid4().hex
    result = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "learner_scaling.py"),
            "--seconds",
            "3",
            "--batch-size",
            "32",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, TAG: tag},
        cwd=REPO,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert processes_with_tag(tag) == []
    rows = {}
    for line in result.stdout.splitlines():
        cells = line.split()
        if len(cells) == 5 and cells[0].isdigit():
            learners, updates, samples, ratio = int(cells[0]), *map(float, cells[1:4])
            rows[learners] = (updates, samples, ratio)
    assert sorted(rows) == [1, 2], result.stdout
    for updates, samples, _ratio in rows.values():
        assert updates > 0 and samples > 0
    assert rows[1][2] == 1.0
