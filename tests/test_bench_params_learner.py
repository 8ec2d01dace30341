"""Smoke tests of benchmarks/param_latency.py and benchmarks/learner_throughput.py.

Each benchmark runs for a few seconds with tiny sizes, exactly as a user runs it (its own
process), so neither can rot: it must exit 0, print its table with a numeric row for every model
and variant, and leave none of the processes it started behind.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from bench_smoke import scratch_env

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
NUMBER = r"-?\d+(?:\.\d+)?%?"


def run_benchmark(script: str, *args: str) -> str:
    with scratch_env() as env:
        proc = subprocess.run(
            [sys.executable, str(BENCHMARKS / script), *args],
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
        )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def table_rows(output: str, first_column: str) -> list[list[str]]:
    """The rows after the header line that starts with ``first_column``."""
    lines = output.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:1] == [first_column])
    return [line.split() for line in lines[header + 1 :] if line.strip()]


def assert_no_leftovers(output: str) -> None:
    """Every process the benchmark started has its work directory on its command line."""
    workdir = re.search(r"logs in (\S+?)\)", output).group(1)
    ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    assert [line for line in ps.splitlines() if workdir in line] == []


@pytest.mark.slow  # about 65 s: 32 clients, two models, two transports
def test_param_latency_smoke() -> None:
    out = run_benchmark(
        "param_latency.py", "--publishes", "3", "--publish-interval-s", "0.1",
        "--clients", "3", "--procs", "2",
    )  # fmt: skip
    rows = [
        r
        for r in table_rows(out, "model")
        if r[:1] in (["mlp"], ["cnn"]) and re.fullmatch(NUMBER, r[2])
    ]  # the table's rows, not the summary lines under it
    assert [tuple(r[:4]) for r in rows] == [
        (model, variant, clients, transport)
        for model in ("mlp", "cnn")
        for variant, clients, transport in (
            ("fast", "1", "tcp"),
            ("fast", "3", "tcp"),
            ("fast", "3", "shm"),
            ("actor", "3", "tcp"),
            ("actor", "3", "shm"),
            ("block", "3", "tcp"),
            ("block", "3", "shm"),
        )
    ]
    # model variant clients transport | poll ms, read ms, p50 last, p99 last, p50 each,
    # vs fast x1, shm %, fallbk, missed, load, srv usr, srv sys
    for row in rows:
        assert len(row) == 16 and all(re.fullmatch(NUMBER, cell) for cell in row[4:]), row
        p50_last, p99_last = float(row[6]), float(row[7])
        assert 0 < p50_last <= p99_last, row
        assert row[12] == "0", f"a client never held a published version: {row}"
        # The Nature CNN (6.4 MiB) goes through shared memory when asked; the MLP stays on TCP.
        # Most loads, not every one: the server keeps the files of its last shm.KEEP_FILES
        # versions, and here it publishes every 0.1 s, so a client that reads an answer later
        # than that (a block-end client on a loaded machine) finds its file gone and asks again
        # over TCP (a fallback; that load counts against shm %, and "missed" stays 0).
        shm_share, fallbacks = float(row[10]), row[11]
        if row[0] == "cnn" and row[3] == "shm":
            assert shm_share >= 80.0, row
        else:
            assert shm_share == 0.0 and fallbacks == "0", row
    assert_no_leftovers(out)


@pytest.mark.slow  # about 50 s: two models and the start-up floors
def test_learner_throughput_smoke() -> None:
    out = run_benchmark(
        "learner_throughput.py", "--seconds", "4", "--report-interval-s", "1",
        "--batch-size", "32", "--items", "2000", "500",
    )  # fmt: skip
    rows = table_rows(out, "model")[:2]
    assert [r[0] for r in rows] == ["mlp", "cnn"]
    for row in rows:
        assert len(row) == 7 and all(re.fullmatch(NUMBER, cell) for cell in row[1:]), row
        updates_per_s, samples_per_s = float(row[1]), float(row[2])
        assert updates_per_s > 0 and samples_per_s > 0, row
        assert 0.0 <= float(row[3].rstrip("%")) <= 100.0, row
    assert_no_leftovers(out)
