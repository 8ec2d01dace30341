"""A config run with each learner and actor precision, one run after another, started with the
launcher a user runs; prints the learner's samples/s, env steps/s and updates/s of each, and their
ratio to the fp32 run measured in the same invocation.

Each run is ``scripts/launch_local.sh --actors N --learners 1 --config CONFIG`` with
``learner.precision`` and ``actor.precision`` set to one of ``--precisions`` and
``run.stop_wall_s`` to ``--seconds``; it must end by itself. Rates are taken over the run's last
half (after start-up, the precision probe and the replay's warm-up) from its ``result.json``
(``samples_per_s``: samples the learner trained on a second). The learner's log line says what
``auto`` chose and the probe's numbers.

    python benchmarks/precision_runs.py [--config impala_pong] [--seconds 150] [--actors 2]
        [--precisions fp32 bf16 auto] [--set key=value ...]
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from pong_runs import launch, second_half  # noqa: E402


def last_half(run_dir: Path) -> dict:
    """Mean rates over the records of the run's second half, and its last counts."""
    half, span = second_half(run_dir)
    first, last = half[0], half[-1]
    return {
        "samples_per_s": float(np.mean([r["samples_per_s"] for r in half])),
        "env_steps_per_s": (last["env_steps"] - first["env_steps"]) / span,
        "updates_per_s": (last["learner_updates"] - first["learner_updates"]) / span,
        "data_wait": float(np.mean([r["data_wait_fraction"] for r in half])),
        "updates": last["learner_updates"],
        "env_steps": last["env_steps"],
        "done": last["done"],
    }


def chosen(run_dir: Path, role: str) -> str:
    """What the role's log says it computes in (``<role> precision: ...``)."""
    for name in (role, f"{role}_0"):
        path = run_dir / "logs" / f"{name}.log"
        if path.is_file():
            found = re.search(rf"{role.split('_')[0]} precision: ([^(]+)", path.read_text())
            if found:
                return found.group(1).strip()
    return "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="impala_pong")
    parser.add_argument("--seconds", type=float, default=150.0)
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--precisions", nargs="+", default=["fp32", "bf16", "auto"])
    parser.add_argument("--set", action="append", default=[], dest="overrides")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="precision_runs_") as tmp:
        for name in args.precisions:
            overrides = (f"learner.precision={name}", f"actor.precision={name}", *args.overrides)
            code, run_dir, _ = launch(
                args.config, args.actors, args.seconds, Path(tmp), overrides, name=name
            )
            result = last_half(run_dir) if (run_dir / "result.json").exists() else None
            if code != 0 or result is None or not result["done"]:
                print((Path(tmp) / f"{name}.log").read_text()[-3000:])
            rows.append((name, code, result, chosen(run_dir, "learner"), chosen(run_dir, "actor")))
    base = next((r for n, _, r, _, _ in rows if n == "fp32" and r), None)
    print(
        f"\n{args.config}: {args.actors} actors, 1 learner, {args.seconds:.0f} s a run, rates over "
        f"each run's last half; {' '.join(args.overrides) or 'no overrides'}"
    )
    print(
        f"{'precision':<9} {'learner':<22} {'actor':<22} {'samples/s':>9} {'x fp32':>6} "
        f"{'env steps/s':>11} {'updates/s':>9} {'wait':>5} {'exit':>4}"
    )
    for name, code, r, learner, actor in rows:
        if r is None:
            print(f"{name:<9} no result.json, exit {code}")
            continue
        ratio = r["samples_per_s"] / base["samples_per_s"] if base else float("nan")
        print(
            f"{name:<9} {learner:<22} {actor:<22} {r['samples_per_s']:9.0f} {ratio:6.2f} "
            f"{r['env_steps_per_s']:11.0f} {r['updates_per_s']:9.2f} {r['data_wait']:5.2f} "
            f"{code:4d}"
        )


if __name__ == "__main__":
    main()
