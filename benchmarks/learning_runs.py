"""Learning runs: each config started with the launcher a user runs, from a clean start, until it
stops by itself; prints wall time, env steps and the final evaluation window for every run and the
median per config.

    python benchmarks/learning_runs.py --runs 3 --configs impala_cartpole ppo_cartpole

A run counts as solved when its last ``result.json`` line says ``done`` with a full evaluation
window whose mean reaches the config's ``run.stop_eval_return``; a run stopped by its
``run.stop_wall_s`` safety net is shown with its last evaluation mean and not counted.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
LAUNCHER = REPO / "scripts" / "launch_local.sh"


def one_run(config: str, actors: int, workdir: Path, extra: list[str]) -> dict:
    logdir = workdir / f"{config}-{time.strftime('%H%M%S')}"
    started = time.monotonic()
    with open(workdir / f"{logdir.name}.log", "wb") as log:
        proc = subprocess.Popen(
            [
                "bash",
                str(LAUNCHER),
                "--actors",
                str(actors),
                "--learners",
                "1",
                "--config",
                str(REPO / "configs" / f"{config}.yaml"),
                "--logdir",
                str(logdir),
                *extra,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "PYTHON": sys.executable},
        )
        try:
            code = proc.wait()
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait()
    wall_s = time.monotonic() - started
    (run_dir,) = [p for p in logdir.iterdir() if p.is_dir()]
    last = json.loads((run_dir / "result.json").read_text().splitlines()[-1])
    cfg_text = (run_dir / "config.yaml").read_text()
    return {"config": config, "code": code, "wall_s": wall_s, "last": last, "cfg": cfg_text}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--configs", nargs="+", default=["apex_dqn_cartpole", "impala_cartpole", "ppo_cartpole"]
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--actors", type=int, default=4)
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args()
    extra = [a for o in args.overrides for a in ("--set", o)]
    workdir = Path(tempfile.mkdtemp(prefix="apexrl-learning-"))
    print(f"logs in {workdir}; load average before: {os.getloadavg()[0]:.1f}")
    print(
        f"{'config':<20} {'run':>3} {'exit':>4} {'wall_s':>7} {'env_steps':>10} "
        f"{'eval_mean':>9} {'window':>6} {'solved':>6}"
    )
    by_config: dict[str, list[dict]] = {}
    for config in args.configs:
        for i in range(args.runs):
            r = one_run(config, args.actors, workdir, extra)
            last = r["last"]
            threshold = yaml.safe_load(r["cfg"])["run"]["stop_eval_return"]
            solved = r["code"] == 0 and last["done"] and last["eval_episodes_in_window"] >= 100
            solved = solved and threshold is not None and last["eval_return_mean"] >= threshold
            r["solved"] = solved
            by_config.setdefault(config, []).append(r)
            print(
                f"{config:<20} {i + 1:>3} {r['code']:>4} {r['wall_s']:>7.1f} "
                f"{last['env_steps']:>10} {last['eval_return_mean']!s:>9} "
                f"{last['eval_episodes_in_window']:>6} {solved!s:>6}",
                flush=True,
            )
    print("\nmedians over solved runs:")
    for config, runs in by_config.items():
        solved = [r for r in runs if r["solved"]]
        if solved:
            wall = statistics.median(r["wall_s"] for r in solved)
            steps = statistics.median(r["last"]["env_steps"] for r in solved)
            print(
                f"{config:<20} solved {len(solved)}/{len(runs)}, wall {wall:.0f} s, "
                f"env steps {steps:.0f}"
            )
        else:
            print(f"{config:<20} solved 0/{len(runs)}")
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
