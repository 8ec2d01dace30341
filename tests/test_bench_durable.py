"""Smoke test of the durability benchmark (``benchmarks/durable_inserts.py``): a short run prints
a row per chunk log mode whose figures are numbers, the log writes nothing when off and something
when on, and no process outlives it. The figures themselves are in ``benchmarks/RESULTS.md``."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from bench_smoke import run_tagged


@pytest.mark.slow  # a benchmark's smoke: CI runs it with the slow tests
@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc")
def test_durable_inserts_prints_a_row_per_log_mode() -> None:
    stdout = run_tagged(
        "durable_inserts.py",
        *["--seconds", "1", "--rounds", "1", "--clients", "2", "--capacity", "100000"],
        "--no-pong",
    )
    rows = {}
    for line in stdout.splitlines():
        if line.startswith("CartPole"):
            mode = "on + fsync" if "fsync" in line else line.split()[2]
            rows[mode] = [float(cell) for cell in line.split()[-7:]]
    assert sorted(rows) == ["off", "on", "on + fsync"], stdout
    for mode, (rate, ratio, low, high, cpu, log_mb_s, _load) in rows.items():
        assert all(math.isfinite(x) for x in rows[mode])
        assert rate > 0 and low <= rate <= high and cpu > 0, (mode, rows[mode])
        assert (log_mb_s > 0) == (mode != "off"), (mode, rows[mode])
        assert ratio == pytest.approx(rate / rows["off"][0], abs=0.01)


@pytest.mark.slow  # a launched Pong run: CI runs it with the slow tests
@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc")
def test_a_durable_pong_replay_killed_mid_run_comes_back_with_every_acknowledged_item() -> None:
    """``benchmarks/durable_pong.py`` on the Ape-X Pong CPU config, its durable run only, with a
    snapshot every 10 s: replay's SIGKILL after 30 s of training, the restarted server loads
    the snapshot (its items from the chunk log's segments) and the log after it, and has stored
    at least what it had at the last reading before the kill; none counted lost."""
    stdout = run_tagged(
        "durable_pong.py",
        *["--which", "on", "--seconds", "45", "--kill-at", "30", "--warmup", "5"],
        *["--set", "replay.snapshot_interval_s=10"],
        timeout_s=400,
    )
    kill = next(line for line in stdout.splitlines() if "replay killed at" in line)
    before, after = (
        float(kill.split(f"{which} ")[1].split()[0].rstrip(",;").replace(",", ""))
        for which in ("before", "first")
    )
    assert after >= before > 0 and "items_lost at the end 0" in kill, stdout
    assert "loaded the replay snapshot" in stdout and "read back from the chunk log" in stdout
    assert "PROBLEM" not in stdout, stdout
