"""One long learning run on Pong with the launcher a user runs, from a clean start: its return
against frames, as a table and a plot.

    python benchmarks/pong_learning_run.py [--config impala_pong] [--seconds 3600] [--actors 2]
        [--plot benchmarks/impala_pong_hour.png]

Runs ``scripts/launch_local.sh --actors N --learners 1 --config configs/<config>.yaml`` with
``run.stop_wall_s`` set to ``--seconds`` (the run ends by itself), then reads its
``result.json``: every ``--every`` seconds of the run, the frames (4 per env step), the training
return (``episode_return_mean``: the mean raw score of the last whole games the actors finished)
and the evaluation return (``eval_return_mean``: the evaluation actor's last round of games),
and the best of each. The plot (return against frames) goes to ``--plot``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import pong_runs

from apexrl.tools.plot import read_results, return_figure


def table(records: list[dict], every_s: float) -> list[dict]:
    """The first record at or after each multiple of ``every_s`` seconds, and the last."""
    rows, next_t = [], 0.0
    for record in records:
        if record["time_s"] >= next_t:
            rows.append(record)
            next_t = record["time_s"] - record["time_s"] % every_s + every_s
    if rows[-1] is not records[-1]:
        rows.append(records[-1])
    return rows


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="impala_pong")
    parser.add_argument("--seconds", type=float, default=3600.0)
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--every", type=float, default=300.0, help="table rows, seconds apart")
    parser.add_argument("--plot", type=Path, default=None)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f} at start", flush=True)
    with tempfile.TemporaryDirectory(prefix="pong_learning_run_") as tmp:
        code, run_dir, wall = pong_runs.launch(args.config, args.actors, args.seconds, Path(tmp))
        if code != 0 or not (run_dir / "result.json").exists():
            print((Path(tmp) / f"{args.config}.log").read_text()[-3000:])
            return 1
        records = read_results(run_dir / "result.json")
        if args.plot is not None:
            figure = return_figure(records, "frames", "frames", f"{args.config}, {wall:.0f} s")
            figure.savefig(args.plot, dpi=80)
    print(
        f"{args.config}: --actors {args.actors} --learners 1, {wall:.0f} s wall, "
        f"load average {os.getloadavg()[0]:.1f} at the end"
    )
    print(f"{'time s':>7} {'frames':>10} {'updates':>8} {'train return':>12} {'eval return':>11}")
    for r in table(records, args.every):
        print(
            f"{r['time_s']:7.0f} {r['frames']:10d} {r['learner_updates']:8d} "
            f"{_fmt(r['episode_return_mean']):>12} {_fmt(r['eval_return_mean']):>11}"
        )
    train = [r["episode_return_mean"] for r in records if r["episode_return_mean"] is not None]
    evals = [r["eval_return_mean"] for r in records if r["eval_return_mean"] is not None]
    print(
        f"best training return {_fmt(max(train, default=None))}, "
        f"best evaluation return {_fmt(max(evals, default=None))}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
