"""What a sweep shows: the live status table (in the spirit of Ray Tune's), the final table
sorted by the metric, ``trials.json`` and the PNG of every trial's curve.

Rows come from ``Trial`` objects; ``table_rows``, ``sort_trials`` and ``format_table`` are pure.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

from apexrl.sweep.trials import PENDING, RUNNING, Trial, finite
from apexrl.tools.status import fmt_age, fmt_int, fmt_return

STATE_ORDER = (RUNNING, PENDING, "TERMINATED", "PRUNED", "ERROR", "STOPPED")
RETURN_KEY = "episode_return_mean"
CURVES_PLOT = "curves.png"
TRIALS_FILE = "trials.json"


def column_names(keys: list[str]) -> list[str]:
    """A short header per swept key: its last part (``lr``) unless two keys share it."""
    last = [k.rsplit(".", 1)[-1] for k in keys]
    counts = Counter(last)
    return [short if counts[short] == 1 else key for short, key in zip(last, keys, strict=True)]


def fmt_value(value: Any) -> str:
    """A swept value in a cell: floats with 4 significant digits, others as JSON."""
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, str):
        return value
    return json.dumps(value)


def header(keys: list[str], metric: str) -> list[str]:
    cells = ["trial", "state", *column_names(keys), "iter", "time", "env steps", "return"]
    if metric and metric != RETURN_KEY:
        cells.append(metric)
    return cells


def table_rows(trials: list[Trial], keys: list[str], metric: str, now: float) -> list[list[str]]:
    """One row per trial: name, state, its values, iteration, time, env steps, training return
    (and the metric when it is another key)."""
    rows = []
    for t in trials:
        last = t.last
        row = [t.name, t.state, *(fmt_value(t.values[k]) if k in t.values else "-" for k in keys)]
        row += [
            fmt_int(last.get("training_iteration")),
            fmt_age(t.elapsed_s(now)),
            fmt_int(finite(last.get("env_steps"))),
            fmt_return(finite(last.get(RETURN_KEY))),
        ]
        if metric and metric != RETURN_KEY:
            row.append(fmt_return(t.metric(metric)))
        rows.append(row)
    return rows


def format_table(head: list[str], rows: list[list[str]], numeric_from: int) -> str:
    """A psql-style table (as ``apexrl status``'s); columns from ``numeric_from`` right-aligned."""
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]

    def line(cells: list[str]) -> str:
        padded = [
            c.rjust(w) if i >= numeric_from else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "| " + " | ".join(padded) + " |"

    rule = "+-" + "-+-".join("-" * w for w in widths) + "-+"
    body = [line(r) for r in rows]
    return "\n".join(
        [rule, line(head), "|-" + "-+-".join("-" * w for w in widths) + "-|", *body, rule]
    )


def state_counts(trials: list[Trial]) -> str:
    """``2 RUNNING, 1 PENDING, 1 TERMINATED``, in ``STATE_ORDER``."""
    counts = Counter(t.state for t in trials)
    return ", ".join(f"{counts[s]} {s}" for s in STATE_ORDER if counts[s])


def render(trials: list[Trial], keys: list[str], metric: str, now: float, lines: list[str]) -> str:
    """The status table with its title lines."""
    numeric_from = 2 + len(keys)
    table = format_table(header(keys, metric), table_rows(trials, keys, metric, now), numeric_from)
    return "\n".join([*lines, table])


def sort_trials(trials: list[Trial], metric: str, mode: str) -> list[Trial]:
    """Best first by the last value of ``metric``; trials without one last, by index."""

    def key(t: Trial) -> tuple[int, float, int]:
        value = t.metric(metric)
        if value is None:
            return (1, 0.0, t.index)
        return (0, -value if mode == "max" else value, t.index)

    return sorted(trials, key=key)


def trial_summary(trial: Trial, metric: str) -> dict[str, Any]:
    """A trial as ``trials.json`` keeps it."""
    return {
        "trial": trial.name,
        "state": trial.state,
        "values": trial.values,
        "run_dir": str(trial.run_dir),
        "log": str(trial.log_path),
        "exit_code": trial.exit_code,
        "reason": trial.reason,
        "metric": trial.metric(metric),
        "iterations": len(trial.records),
        "last_result": trial.last,
    }


def write_trials(path: Path, trials: list[Trial], metric: str, mode: str) -> None:
    """``trials.json``: every trial, best first; written whole, then moved into place."""
    data = [trial_summary(t, metric) for t in sort_trials(trials, metric, mode)]
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str) + "\n")
    tmp.replace(path)


def curve(trial: Trial, metric: str) -> tuple[list[float], list[float]]:
    """``(env steps, metric)`` of a trial's records where both are finite numbers."""
    points = [(finite(r.get("env_steps")), finite(r.get(metric))) for r in trial.records]
    kept = [(x, y) for x, y in points if x is not None and y is not None]
    return [p[0] for p in kept], [p[1] for p in kept]


def curves_figure(trials: list[Trial], keys: list[str], metric: str, title: str = ""):
    """One line per trial with points: ``metric`` against env steps, labelled with its values."""
    from matplotlib.figure import Figure  # no pyplot: no global state, no display

    fig = Figure(figsize=(9, 4.5), layout="constrained")
    ax = fig.subplots()
    names = column_names(keys)
    for t in trials:
        x, y = curve(t, metric)
        if not x:
            continue
        values = ", ".join(
            f"{n}={fmt_value(t.values[k])}" for n, k in zip(names, keys, strict=True)
        )
        ax.plot(x, y, marker="o", markersize=2, label=f"{t.name} {values} ({t.state})")
    ax.set_xlabel("env steps")
    ax.set_ylabel(metric)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if ax.get_lines():
        ax.legend(loc="best", fontsize="small")
    return fig


def write_curves(path: Path, trials: list[Trial], keys: list[str], metric: str, title: str) -> Path:
    curves_figure(trials, keys, metric, title).savefig(path, dpi=100)
    return path


def best_line(trials: list[Trial], keys: list[str], metric: str, mode: str) -> str:
    """One line about the best trial, or why there is none."""
    ranked = sort_trials(trials, metric, mode)
    if not ranked or ranked[0].metric(metric) is None:
        return f"no trial reported {metric}"
    best = ranked[0]
    value = best.metric(metric)
    values = ", ".join(f"{k}={fmt_value(best.values[k])}" for k in keys if k in best.values)
    shown = f"{value:.4g}" if math.isfinite(value) else str(value)
    return f"best trial: {best.name} ({values}): {metric} {shown}, run directory {best.run_dir}"
