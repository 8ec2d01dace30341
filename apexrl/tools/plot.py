"""``apexrl plot RUN_DIR``: PNGs of a run's learning curve and throughput from its result.json.

- ``return_vs_env_steps.png``: training return (``episode_return_mean``) and evaluation return
  (``eval_return_mean``) against env steps;
- ``return_vs_time.png``: the same against wall time (``time_s``);
- ``throughput.png``: env steps, learner updates and samples per second against wall time.

They go to ``<run dir>/plots/`` (or ``--out DIR``); the launcher writes them at the end of every
run. The functions that build the figures are pure (records in, a matplotlib ``Figure`` out), so
a test can read back the plotted data. matplotlib draws off screen (the Agg backend).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

from apexrl.runtime import rundir

TRAIN_LABEL = "training return (episode_return_mean)"
EVAL_LABEL = "evaluation return (eval_return_mean)"
RETURN_FIGURES = (  # file name, x key, x axis label
    (rundir.RETURN_PLOTS["env_steps"], "env_steps", "env steps"),
    (rundir.RETURN_PLOTS["time_s"], "time_s", "wall time (s)"),
)
THROUGHPUT_NAME = rundir.THROUGHPUT_PLOT
THROUGHPUT_SERIES = (  # y key, axis label
    ("env_steps_per_s", "env steps / s"),
    ("updates_per_s", "learner updates / s"),
    ("samples_per_s", "samples / s"),
)

log = logging.getLogger("apexrl.tools.plot")


class PlotError(Exception):
    """Nothing to plot (no result.json, or no record in it): one line, exit status 2."""


def read_results(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of ``path``, one a line; blank, garbled and non-object lines are skipped
    (a run killed mid-write leaves a partial last line)."""
    try:
        text = Path(path).read_text(errors="replace")
    except FileNotFoundError as exc:
        raise PlotError(f"no {path.name} at {path}") from exc
    except OSError as exc:
        raise PlotError(f"cannot read {path}: {exc}") from exc
    records = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    if not records:
        raise PlotError(f"{path} holds no results yet")
    return records


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def series(records: list[dict[str, Any]], x_key: str, y_key: str) -> tuple[np.ndarray, np.ndarray]:
    """``(x, y)`` of the records where both keys hold finite numbers, in file order."""
    points = [(_number(r.get(x_key)), _number(r.get(y_key))) for r in records]
    kept = [(x, y) for x, y in points if x is not None and y is not None]
    x = np.array([p[0] for p in kept], dtype=np.float64)
    y = np.array([p[1] for p in kept], dtype=np.float64)
    return x, y


def _figure(nrows: int = 1):
    from matplotlib.figure import Figure  # no pyplot: no global state, no display

    fig = Figure(figsize=(8, 3 + 2.5 * (nrows - 1)), layout="constrained")
    axes = fig.subplots(nrows, 1, sharex=True, squeeze=False)[:, 0]
    return fig, axes


def return_figure(records: list[dict[str, Any]], x_key: str, x_label: str, title: str = ""):
    """Training and evaluation return against ``x_key``: a Figure with one axes whose lines are
    labelled ``TRAIN_LABEL`` and ``EVAL_LABEL`` (a line only where the run has points)."""
    fig, (ax,) = _figure()
    for y_key, label, marker in (
        ("episode_return_mean", TRAIN_LABEL, None),
        ("eval_return_mean", EVAL_LABEL, "o"),
    ):
        x, y = series(records, x_key, y_key)
        if len(x):
            ax.plot(x, y, label=label, marker=marker, markersize=3)
    ax.set_xlabel(x_label)
    ax.set_ylabel("return")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if ax.get_lines():
        ax.legend(loc="best")
    return fig


def throughput_figure(records: list[dict[str, Any]], title: str = ""):
    """One axes per ``THROUGHPUT_SERIES`` entry against wall time, in that order."""
    fig, axes = _figure(len(THROUGHPUT_SERIES))
    for ax, (y_key, label) in zip(axes, THROUGHPUT_SERIES, strict=True):
        x, y = series(records, "time_s", y_key)
        ax.plot(x, y, label=y_key)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("wall time (s)")
    axes[0].set_title(title)
    return fig


def write_plots(run_dir: Path, out_dir: Path | None = None) -> list[Path]:
    """Write the run's PNGs; returns their paths. ``PlotError`` when there is nothing to plot."""
    run_dir = Path(run_dir)
    records = read_results(rundir.result_path(run_dir))
    out_dir = Path(out_dir) if out_dir is not None else rundir.plots_dir(run_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    title = run_dir.resolve().name
    figures = [
        (name, return_figure(records, key, label, title)) for name, key, label in RETURN_FIGURES
    ]
    figures.append((THROUGHPUT_NAME, throughput_figure(records, title)))
    written = []
    for name, fig in figures:
        fig.savefig(out_dir / name, dpi=100)
        written.append(out_dir / name)
    return written


def plot_after_run(run_dir: Path) -> None:
    """The launcher's last step: write the run's plots; any failure is only a warning."""
    try:
        written = write_plots(run_dir)
    except Exception as exc:  # a plot must never change how a run ends
        log.warning("no plots of the run: %s", exc)
        return
    log.info("plots of the run in %s", written[0].parent)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``plot`` subcommand's arguments (``apexrl.cli`` builds the parser)."""
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run directory with a result.json")
    parser.add_argument(
        "--out", metavar="DIR", help=f"where to write (default RUN_DIR/{rundir.PLOTS})"
    )


def main(args: argparse.Namespace) -> int:
    """``apexrl plot``: 0, or 2 with one line on stderr."""
    run_dir = Path(args.run_dir)
    try:
        if not run_dir.is_dir():
            raise PlotError(f"no run directory at {run_dir}")
        written = write_plots(run_dir, args.out)
    except PlotError as exc:
        print(f"apexrl plot: error: {exc}", file=sys.stderr)
        return 2
    except ImportError as exc:
        print(f"apexrl plot: error: {exc} (pip install matplotlib)", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    return 0
