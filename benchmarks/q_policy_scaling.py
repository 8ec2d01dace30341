"""SAC (or TD3, DDPG) as actors go 1 -> 2 -> 4: learner updates/s, env steps/s and the greedy
evaluation, one launched run per actor count, one after the other.

Each run is ``scripts/launch_local.sh --actors N --learners 1 --config configs/<config>.yaml``
from a clean start for ``--seconds`` of learner time (the config's return threshold kept, so a
run that reaches it stops early; ``--no-stop`` runs the whole time). The figures are read from
the run's ``result.json``: updates/s and env steps/s over the second half of the run (by learner
time), the last greedy evaluation, and the time the threshold was met. The replay ratio is the
config's ``replay.samples_per_insert``, so with a learner that keeps up more actors add env steps
and updates in proportion; once the learner is the bottleneck they add neither and the rate
limiter holds the actors back (no staleness: each transition is still trained on
``samples_per_insert / batch`` times).

    python benchmarks/q_policy_scaling.py [--config sac_pendulum] [--actors 1 2 4]
        [--seconds 120] [--no-stop] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import pong_runs


def run_figures(run_dir: Path) -> dict:
    """Second-half rates, the last evaluation and when the run met its threshold."""
    records = [json.loads(line) for line in (run_dir / "result.json").read_text().splitlines()]
    half, span = pong_runs.second_half(run_dir)
    first, last = half[0], half[-1]
    return {
        "updates_per_s": (last["learner_updates"] - first["learner_updates"]) / span,
        "env_steps_per_s": (last["env_steps"] - first["env_steps"]) / span,
        "env_steps": last["env_steps"],
        "updates": last["learner_updates"],
        "eval": last["eval_return_mean"],
        "time_s": last["time_s"],
        "done": bool(last["done"]),
        "data_wait": sum(r["data_wait_fraction"] for r in half) / len(half),
        "records": len(records),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="sac_pendulum", help="configs/<name>.yaml")
    parser.add_argument("--actors", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--no-stop", action="store_true", help="no return threshold")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="a config override"
    )
    args = parser.parse_args()
    overrides = (*(("run.stop_eval_return=null",) if args.no_stop else ()), *args.set)
    rows = []
    with tempfile.TemporaryDirectory(prefix="q_policy_scaling_") as tmp:
        for actors in args.actors:
            name = f"{args.config}_{actors}"
            code, run_dir, wall = pong_runs.launch(
                args.config, actors, args.seconds, Path(tmp), overrides, name=name
            )
            figures = run_figures(run_dir) if (run_dir / "result.json").exists() else None
            if code != 0 or figures is None:
                print((Path(tmp) / f"{name}.log").read_text()[-3000:])
            rows.append((actors, code, wall, figures))
    print(f"\n{args.config}, 1 learner, up to {args.seconds:.0f} s of learner time per run")
    if overrides:
        print("overrides: " + " ".join(overrides))
    print(
        f"{'actors':>6} {'updates/s':>10} {'env steps/s':>12} {'env steps':>10} {'updates':>8} "
        f"{'wait':>5} {'eval':>8} {'stopped at':>10} {'wall s':>7}"
    )
    base = None
    for actors, code, wall, f in rows:
        if f is None:
            print(f"{actors:>6} no result.json, exit {code}")
            continue
        base = base or f
        evaluation = "n/a" if f["eval"] is None else f"{f['eval']:.0f}"
        stopped = f"{f['time_s']:.0f} s" if f["done"] else "-"
        print(
            f"{actors:>6} {f['updates_per_s']:10.1f} {f['env_steps_per_s']:12.1f} "
            f"{f['env_steps']:10d} {f['updates']:8d} {f['data_wait']:5.2f} {evaluation:>8} "
            f"{stopped:>10} {wall:7.0f}"
        )
    if base is not None:
        ratios = [
            f"{f['env_steps_per_s'] / max(base['env_steps_per_s'], 1e-9):.2f}"
            for _, _, _, f in rows
            if f is not None
        ]
        print(f"env steps/s against {rows[0][0]} actor(s): {' '.join(ratios)}")


if __name__ == "__main__":
    main()
