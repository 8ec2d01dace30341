"""Smoke test of benchmarks/gpu_check.sh, the script a lent GPU machine runs: here, without a
CUDA device, it must exit 0, say that each GPU part is skipped, and still print its table with
the CPU figures measured (a few tenths of a second each, one family)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device: the whole check runs there")
def test_the_gpu_check_runs_without_a_gpu_and_says_what_it_skipped(tmp_path: Path) -> None:
    proc = subprocess.run(
        ["bash", str(REPO / "benchmarks" / "gpu_check.sh"), "--seconds", "0.2"]
        + ["--families", "sac", "--envs", "2"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable},
    )
    out = proc.stdout
    print(out[-3000:])
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
    assert out.count("skipped: no CUDA device") == 2  # the CUDA tests and the Pong run
    row = next(line for line in out.splitlines() if line.startswith("sac |"))
    cells = [cell.strip() for cell in row.split("|")[1:]]
    assert cells[2:] == ["no GPU", "no GPU"]
    assert all(re.fullmatch(r"[\d,]+ \([\d,]+\)", cell) for cell in cells[:2]), cells
    assert re.search(r"cpu, 1 actor: [\d,]+\n", out) and "cuda, 32 actors: no GPU" in out
    assert (tmp_path / "gpu_check.json").is_file()
