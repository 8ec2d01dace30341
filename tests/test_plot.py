"""``apexrl plot`` for real: PNGs written from a result.json (the launcher's own plots at the end
of a run are checked in test_rollout.py), the plotted data read back from the figures, and the
one-line errors of a run with nothing to plot."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import run_apexrl

from apexrl.tools.plot import (
    EVAL_LABEL,
    THROUGHPUT_SERIES,
    TRAIN_LABEL,
    read_results,
    return_figure,
    throughput_figure,
    write_plots,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

# What the launcher writes: one object a line; no episode has ended in the first, the first
# evaluation round ends in the third.
RECORDS = [
    {
        "time_s": 1.0,
        "env_steps": 128,
        "learner_updates": 1,
        "episode_return_mean": None,
        "eval_return_mean": None,
        "env_steps_per_s": 127.6,
        "updates_per_s": 96.7,
        "samples_per_s": 386.9,
        "done": False,
    },
    {
        "time_s": 2.0,
        "env_steps": 384,
        "learner_updates": 2,
        "episode_return_mean": 18.5,
        "eval_return_mean": None,
        "env_steps_per_s": 292.8,
        "updates_per_s": 101.8,
        "samples_per_s": 407.1,
        "done": False,
    },
    {
        "time_s": 3.5,
        "env_steps": 1024,
        "learner_updates": 6,
        "episode_return_mean": 40.25,
        "eval_return_mean": 120.0,
        "env_steps_per_s": 426.7,
        "updates_per_s": 2.7,
        "samples_per_s": 10.7,
        "done": False,
    },
    {
        "time_s": 5.0,
        "env_steps": 2048,
        "learner_updates": 10,
        "episode_return_mean": 99.0,
        "eval_return_mean": 500.0,
        "env_steps_per_s": 682.7,
        "updates_per_s": 2.7,
        "samples_per_s": 10.7,
        "done": True,
    },
]


def write_result(run_dir: Path, garbage: bool = True) -> Path:
    """``RECORDS`` as result.json, with a blank line, a garbled line and a partial last line (a
    run killed mid-write) in between when ``garbage``."""
    run_dir.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(r) for r in RECORDS]
    if garbage:
        lines = [lines[0], "", lines[1], "{not json", "[1, 2]", lines[2], lines[3], '{"time_s": 6']
    path = run_dir / "result.json"
    path.write_text("\n".join(lines))
    return path


def column(key: str, where: str | None = None) -> list[float]:
    return [r[key] for r in RECORDS if r[where or key] is not None]


def test_read_results_skips_blank_and_garbled_lines(tmp_path: Path) -> None:
    assert read_results(write_result(tmp_path)) == RECORDS


def test_return_figure_plots_the_result_columns() -> None:
    fig = return_figure(RECORDS, "env_steps", "env steps")
    (ax,) = fig.axes
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert set(lines) == {TRAIN_LABEL, EVAL_LABEL}
    train, evaluation = lines[TRAIN_LABEL], lines[EVAL_LABEL]
    # Records whose return is null (no episode ended yet) have no point.
    np.testing.assert_array_equal(
        train.get_xdata(), column("env_steps", where="episode_return_mean")
    )
    np.testing.assert_array_equal(train.get_ydata(), [18.5, 40.25, 99.0])
    np.testing.assert_array_equal(evaluation.get_xdata(), [1024, 2048])
    np.testing.assert_array_equal(evaluation.get_ydata(), [120.0, 500.0])
    assert ax.get_xlabel() == "env steps" and ax.get_ylabel() == "return"

    by_time = return_figure(RECORDS, "time_s", "wall time (s)").axes[0]
    np.testing.assert_array_equal(by_time.get_lines()[0].get_xdata(), [2.0, 3.5, 5.0])
    assert by_time.get_xlabel() == "wall time (s)"


def test_throughput_figure_has_one_axes_per_rate() -> None:
    fig = throughput_figure(RECORDS)
    assert len(fig.axes) == len(THROUGHPUT_SERIES) == 3
    for ax, (key, label) in zip(fig.axes, THROUGHPUT_SERIES, strict=True):
        (line,) = ax.get_lines()
        np.testing.assert_array_equal(line.get_xdata(), column("time_s"))
        np.testing.assert_array_equal(line.get_ydata(), column(key))
        assert ax.get_ylabel() == label
    assert fig.axes[-1].get_xlabel() == "wall time (s)"


def assert_png(path: Path) -> None:
    """A valid, non-empty PNG with something drawn on it."""
    from matplotlib.image import imread

    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE), path
    image = imread(path)
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100, image.shape
    assert image[..., :3].std() > 0.01, f"{path} is blank"


def test_write_plots_writes_three_pngs(tmp_path: Path) -> None:
    write_result(tmp_path / "run")
    written = write_plots(tmp_path / "run")
    assert [p.name for p in written] == [
        "return_vs_env_steps.png",
        "return_vs_time.png",
        "throughput.png",
    ]
    for path in written:
        assert path.parent == tmp_path / "run" / "plots"
        assert_png(path)


def plot(*args: str) -> subprocess.CompletedProcess:
    return run_apexrl("plot", *args)


def test_plot_command_writes_to_out_and_prints_the_files(tmp_path: Path) -> None:
    write_result(tmp_path / "run")
    done = plot(str(tmp_path / "run"), "--out", str(tmp_path / "pngs"))
    assert done.returncode == 0, done.stderr
    printed = [Path(line) for line in done.stdout.splitlines()]
    assert sorted(printed) == sorted((tmp_path / "pngs").glob("*.png")) and len(printed) == 3
    for path in printed:
        assert_png(path)


@pytest.mark.parametrize(
    ("content", "message"),
    [(None, "no result.json at"), ("", "holds no results yet"), ("\n{garbled\n", "no results")],
)
def test_nothing_to_plot_is_one_line(tmp_path: Path, content: str | None, message: str) -> None:
    if content is not None:
        (tmp_path / "result.json").write_text(content)
    done = plot(str(tmp_path))
    assert done.returncode == 2, (done.stdout, done.stderr)
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("apexrl plot: error: ") and message in line, line
    assert not (tmp_path / "plots").exists()


def test_a_missing_run_directory_is_one_line(tmp_path: Path) -> None:
    done = plot(str(tmp_path / "nope"))
    assert done.returncode == 2
    assert done.stderr.strip() == f"apexrl plot: error: no run directory at {tmp_path / 'nope'}"
